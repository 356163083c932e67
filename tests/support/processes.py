"""Processes as /proc shows them (Linux): the TCP sockets they listen on (for the tests that a single-node run opens
nothing beyond loopback), their descendants and command lines (for the tests that a killed run leaves none)."""

from __future__ import annotations

import ipaddress
import os
import threading
from typing import NamedTuple

LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket


class Listener(NamedTuple):
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback


def _address(hex_address: str) -> str:
    """/proc/net/tcp{,6}'s hex address (host byte order, 32-bit words) as text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return str(address)


def _listening_inodes(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of every listening TCP socket in `pid`'s network namespace."""
    out: dict[int, tuple[str, int]] = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[3] == LISTEN:
                        host, port = cols[1].split(":")
                        out[int(cols[9])] = (_address(host), int(port, 16))
        except FileNotFoundError:
            pass
    return out


def listeners(pids: list[int]) -> set[Listener]:
    """The TCP sockets each of `pids` holds open in the listening state (processes gone meanwhile are skipped)."""
    found: set[Listener] = set()
    for pid in pids:
        try:
            inodes = _listening_inodes(pid)
            fds = os.listdir(f"/proc/{pid}/fd")
        except (FileNotFoundError, PermissionError):
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[len("socket:[") : -1])
                if inode in inodes:
                    found.add(Listener(pid, *inodes[inode]))
    return found


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def env_values(name: str) -> dict[int, str]:
    """pid -> the value of environment variable `name`, for every process (this one excluded) that sets it: e.g. the
    run tag a run's Ray processes inherit from its driver."""
    found, key = {}, name.encode() + b"="
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    for var in f.read().split(b"\0"):
                        if var.startswith(key):
                            found[int(entry)] = var[len(key) :].decode(errors="replace")
            except OSError:
                continue
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ListenerSampler:
    """Every listener seen in the process tree under `root` while the block runs (sampled every `period_s`)."""

    def __init__(self, root: int, period_s: float = 0.2) -> None:
        self.root, self.period_s = root, period_s
        self.seen: set[Listener] = set()
        self.commands: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        for listener in listeners(descendants(self.root)):
            self.seen.add(listener)
            command = cmdline(listener.pid)  # the latest: a Ray worker process is renamed when an actor takes it
            if command:
                self.commands[listener.pid] = command

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> "ListenerSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

"""Where torch.distributed listens: on loopback only when the run's ranks share one machine.

A default `init_process_group("env://")` makes rank 0's TCPStore listen on every interface, and gloo's pairs
listen on the address the host name resolves to. A run whose ranks all sit on one machine (MASTER_ADDR a loopback
address: local mode, or a one-node Ray cluster) needs neither to be reachable from elsewhere, so here the store
listens on a socket bound to the loopback address and gloo's pairs on the loopback interface. A run across
machines rendezvouses on a routable MASTER_ADDR as before (README: the ports a multi-node run opens).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket

import torch.distributed as dist

__all__ = ["is_loopback", "pin_gloo_to_loopback", "tcp_store"]


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") names this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_interface() -> str:
    """The loopback interface's name (lo on Linux, lo0 on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    raise RuntimeError(f"no loopback interface (lo or lo0) among {names}; set GLOO_SOCKET_IFNAME to one")


def pin_gloo_to_loopback() -> None:
    """Make the gloo groups this process creates from now on listen on loopback (unless GLOO_SOCKET_IFNAME is set)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())


def tcp_store(host: str, port: int, world_size: int, is_master: bool, timeout: datetime.timedelta) -> dist.TCPStore:
    """A TCPStore at host:port; on a loopback host, the master's listening socket is bound to that address only."""
    if not (is_master and is_loopback(host)):
        return dist.TCPStore(host, port, world_size, is_master, timeout)
    address = "127.0.0.1" if host == "localhost" else host
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as err:
        sock.close()
        raise RuntimeError(f"cannot listen on {address}:{port} for the process group's rendezvous: {err}") from err
    # The store takes the socket over (and closes it when it is destroyed).
    return dist.TCPStore(address, port, world_size, True, timeout, master_listen_fd=sock.detach())

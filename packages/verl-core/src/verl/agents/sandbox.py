"""A code-execution tool whose programs cannot reach the network or the run's files, within CPU, memory, disk,
output and wall-time limits.

Each call runs in fresh Linux namespaces (`unshare`: user, network, mount, pid): the network namespace has no
interface up, so every connection fails; the program's root is an empty tmpfs holding read-only binds of the
system's /usr, /lib, /bin and the Python installation, a writable /work and /tmp (the tmpfs, bounded in size) and
/dev/null|zero|urandom; nothing else of the host (the run's data, checkpoints, home) is there. Resource limits
(`prlimit`: CPU seconds, address space, file size, open files) bound the program, the pid namespace ends every
process it started when the call ends, and the environment is empty. User namespaces are required: where the
kernel or a container refuses them, constructing the tool says so rather than running code unconfined.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from verl.agents.tools import ToolTimeout, register_tool

# The mounts, run by the namespace's root (the caller's own uid outside): $1 root dir, $2 tmpfs MiB, $3 python,
# then the read-only paths; the program comes on stdin. A system path that does not exist is skipped.
_SETUP = r"""
set -e
R="$1"; MB="$2"; PY="$3"; shift 3
mount -t tmpfs -o "size=${MB}m,mode=755" verl-sandbox "$R"
for d in "$@"; do
  [ -e "$d" ] || continue
  mkdir -p "$R$d"; mount --rbind "$d" "$R$d"; mount -o remount,bind,ro "$R$d"
done
mkdir -p "$R/dev" "$R/tmp" "$R/work"
for f in null zero urandom; do touch "$R/dev/$f"; mount --bind "/dev/$f" "$R/dev/$f"; done
cd /
set +e
prlimit --cpu="$CPU_S:$((CPU_S + 1))" --as="$AS_BYTES" --fsize="$FSIZE_BYTES" --nofile=64 -- \
  chroot "$R" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/work TMPDIR=/tmp LANG=C.UTF-8 \
  sh -c 'cd /work && exec "$0" -I -' "$PY"
exit $?
"""  # (not exec'd: this shell reports a signal's death as 128 + signal; the program's siblings die with it)

_SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin")


@dataclass
class SandboxLimits:
    cpu_s: int = 5  # CPU seconds (the program is killed past them)
    wall_s: float = 10.0  # wall-clock seconds
    memory_mb: int = 512  # address space: a bigger allocation raises MemoryError in the program
    disk_mb: int = 16  # what /work and /tmp may hold together; also the largest file
    output_bytes: int = 8192  # stdout and stderr each keep this much; the rest is read and dropped


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: Optional[int]  # None: killed at the wall-time limit
    status: str  # ok | error (nonzero exit) | timeout (wall or CPU limit)
    seconds: float


def python_install() -> Tuple[str, str]:
    """The interpreter running this process and the prefix it needs (a venv's python resolves to its base)."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


@functools.lru_cache(maxsize=None)
def sandbox_problem() -> Optional[str]:
    """Why programs cannot be sandboxed on this machine, or None when they can (probed once, with a real run)."""
    for tool in ("unshare", "prlimit", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux/coreutils) is not installed"
    try:
        result = run_sandboxed_blocking("print(6*7)", SandboxLimits(wall_s=20))
    except OSError as e:
        return f"starting the sandbox failed: {e}"
    if result.status != "ok" or result.stdout.strip() != "42":
        why = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
        return f"unshare -rnmpf could not set up the sandbox ({why[0]}); user namespaces may be disabled"
    return None


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    kept = bytearray()
    while chunk := await stream.read(65536):
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]
    return bytes(kept)


async def run_sandboxed(
    code: str,
    limits: Optional[SandboxLimits] = None,
    *,
    python: Optional[str] = None,
    readonly_paths: Sequence[str] = (),
) -> SandboxResult:
    """Run a Python program (its source) in the sandbox; what it printed and how it ended."""
    limits = limits or SandboxLimits()
    exe, prefix = python_install() if python is None else (os.path.realpath(python), "")
    paths: List[str] = list(_SYSTEM_PATHS)  # as named: /lib may be a link to /usr/lib, and ld.so is looked up by it
    for p in (prefix, os.path.dirname(exe), *readonly_paths):
        p = os.path.realpath(p) if p else ""
        if p and p != "/" and not any(p == q or p.startswith(q.rstrip("/") + "/") for q in paths):
            paths.append(p)
    root = tempfile.mkdtemp(prefix="verl-sandbox-")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "CPU_S": str(limits.cpu_s),
        "AS_BYTES": str(limits.memory_mb << 20),
        "FSIZE_BYTES": str(limits.disk_mb << 20),
    }
    cmd = ["unshare", "-rnmpf", "--kill-child", "sh", "-c", _SETUP, "sh", root, str(limits.disk_mb), exe, *paths]
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    reads = [
        asyncio.ensure_future(_read_capped(proc.stdout, limits.output_bytes)),
        asyncio.ensure_future(_read_capped(proc.stderr, limits.output_bytes)),
    ]
    try:
        try:
            proc.stdin.write(code.encode())
            await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it died before reading its program (a setup failure): its stderr says why
        _, pending = await asyncio.wait(reads, timeout=limits.wall_s)  # (the streams close when it exits)
        if pending:
            return SandboxResult("", "", None, "timeout", time.perf_counter() - start)
        out, err = reads[0].result(), reads[1].result()
        code_ = await proc.wait()
    finally:
        if proc.returncode is None:  # the wall limit, or the caller gave up (cancelled): end it and its children
            proc.kill()
            await proc.wait()
        for r in reads:
            r.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        os.rmdir(root)  # the tmpfs lived in the namespace; the mount point is empty again
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    status = "ok" if code_ == 0 else "timeout" if code_ == 128 + 24 else "error"  # SIGXCPU: the CPU limit
    return SandboxResult(stdout, stderr, code_, status, time.perf_counter() - start)


def run_sandboxed_blocking(code: str, limits: Optional[SandboxLimits] = None, **kw: Any) -> SandboxResult:
    """`run_sandboxed` from synchronous code (a reward function, a probe); from inside a running event loop its own
    loop runs on a thread of its own."""
    run = functools.partial(asyncio.run, run_sandboxed(code, limits, **kw))
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # (the usual case: no event loop in this thread)
        return run()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


class SandboxError(RuntimeError):
    """The program exited with an error: the message is the end of what it wrote to stderr."""


@register_tool("python")
class PythonSandbox:
    """Runs a Python program in the sandbox; the result is what it printed (stdout)."""

    def __init__(
        self,
        name: str = "python",
        cpu_s: int = 5,
        wall_s: float = 10.0,
        memory_mb: int = 512,
        disk_mb: int = 16,
        output_bytes: int = 8192,
        readonly_paths: Sequence[str] = (),
    ):
        problem = sandbox_problem()
        if problem:
            raise RuntimeError(
                f"the {name!r} tool needs a sandbox and this machine cannot make one: {problem}. Run where user "
                "namespaces are allowed (sysctl kernel.unprivileged_userns_clone=1; in Docker, a seccomp profile "
                "that permits unshare), or drop the tool from rollout.agent.tools"
            )
        self.name = name
        self.description = "Run a Python program and return what it prints (no network, no files but its own)"
        self.parameters = {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the result"}},
            "required": ["code"],
        }
        self.limits = SandboxLimits(cpu_s, wall_s, memory_mb, disk_mb, output_bytes)
        self.readonly_paths = tuple(readonly_paths)

    async def __call__(self, code: str) -> str:
        r = await run_sandboxed(str(code), self.limits, readonly_paths=self.readonly_paths)
        if r.status == "timeout":
            limit = f"{self.limits.wall_s:g} s" if r.exit_code is None else f"{self.limits.cpu_s} CPU seconds"
            raise ToolTimeout(f"the program ran past {limit}")
        if r.status == "error":
            tail = "\n".join(r.stderr.strip().splitlines()[-3:]) or f"exit code {r.exit_code}"
            raise SandboxError(tail)
        return r.stdout

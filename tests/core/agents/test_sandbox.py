"""The code-execution tool's sandbox: no network, none of the host's files, its limits enforced, nothing left over."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time

import pytest

from verl.agents.sandbox import SandboxLimits, run_sandboxed, sandbox_problem
from verl.agents.tools import ToolCall, make_tools, run_tool

pytestmark = pytest.mark.skipif(
    sandbox_problem() is not None, reason=f"no sandbox on this machine: {sandbox_problem()}"
)


def sandboxed(code: str, **limits) -> "SandboxResult":  # noqa: F821
    return asyncio.run(run_sandboxed(code, SandboxLimits(**limits)))


def test_a_program_runs_and_its_output_comes_back():
    r = sandboxed("import json, math\nprint(json.dumps({'sqrt': math.isqrt(1665 ** 2)}))")
    assert (r.status, r.exit_code, r.stdout.strip()) == ("ok", 0, '{"sqrt": 1665}')


def test_no_network_even_to_a_server_the_host_reaches():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the host gets through
    time.sleep(0.1)
    assert len(accepted) == 1
    r = sandboxed(
        "import socket\n"
        "for host in ('127.0.0.1', '8.8.8.8'):\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2); print('connected', host)\n"
        "    except OSError as e:\n"
        "        print('refused', host, e.errno)\n"
    )
    server.close()
    assert r.stdout.count("refused") == 2 and "connected" not in r.stdout, r
    assert len(accepted) == 1  # nothing from the sandbox arrived


def test_none_of_the_hosts_files(tmp_path, monkeypatch):
    secret = tmp_path / "checkpoint.pt"
    secret.write_text("weights")
    monkeypatch.setenv("VERL_SECRET_TOKEN", "hunter2")
    r = sandboxed(
        "import os\n"
        f"for path in ({str(secret)!r}, {os.getcwd()!r}, '/etc/passwd', '/root', '/proc/1/environ'):\n"
        "    print(path, os.path.exists(path) and os.listdir(path) if os.path.isdir(path) else os.path.exists(path))\n"
        "print(sorted(os.listdir('/')), os.getcwd())\n"
        "print('env', sorted(os.environ))\n"
        "open('/work/mine.txt', 'w').write('ok'); print(open('/work/mine.txt').read())\n"
        "try:\n"
        "    open('/usr/planted', 'w')\n"
        "except OSError as e:\n"
        "    print('read-only', e.errno)\n"
    )
    lines = r.stdout.splitlines()
    assert lines[0] == f"{secret} False" and lines[2] == "/etc/passwd False" and lines[4] == "/proc/1/environ False"
    assert lines[1].endswith("False") or lines[1].endswith("[]")  # the run's directory is not there
    assert "'work'" in lines[5] and "'etc'" not in lines[5] and lines[5].endswith("/work")
    assert "VERL_SECRET_TOKEN" not in r.stdout and "hunter2" not in r.stdout
    assert "ok" in lines and "read-only 30" in lines, r
    assert not any(p.name.startswith("planted") for p in __import__("pathlib").Path("/usr").iterdir())


def test_cpu_memory_disk_and_output_limits():
    cpu = sandboxed("while True: pass", cpu_s=1, wall_s=20)
    assert cpu.status == "timeout" and cpu.exit_code == 128 + 24 and cpu.seconds < 10
    memory = sandboxed("x = bytearray(1 << 30)", memory_mb=256)
    assert memory.status == "error" and "MemoryError" in memory.stderr
    disk = sandboxed("open('/work/big', 'wb').write(b'x' * (32 << 20))", disk_mb=4)
    assert disk.status == "error" and ("File too large" in disk.stderr or "No space" in disk.stderr)
    out = sandboxed("print('x' * (1 << 22))", output_bytes=1000)
    assert out.status == "ok" and len(out.stdout) == 1000


def test_wall_time_ends_the_program_and_its_children():
    start = time.perf_counter()
    r = sandboxed("import subprocess, time\nsubprocess.Popen(['sleep', '97'])\ntime.sleep(60)", wall_s=0.5)
    assert r.status == "timeout" and r.exit_code is None and time.perf_counter() - start < 5
    time.sleep(0.3)
    assert subprocess.run(["pgrep", "-f", "sleep 97"], capture_output=True).returncode == 1  # none left


def test_the_tool_reports_each_ending_as_an_observation():
    tools = make_tools([{"name": "python", "cpu_s": 1, "wall_s": 5}])

    def call(code: str, timeout_s: float = 10.0):
        return asyncio.run(run_tool(tools, ToolCall("python", {"code": code}), timeout_s))

    ok = call("print(37 * 45)")
    assert (ok.status, ok.text) == ("ok", "1665\n")
    raised = call("1 / 0")
    assert raised.status == "error" and raised.text.endswith("ZeroDivisionError: division by zero")
    spun = call("while True: pass")
    assert spun.status == "timeout" and "1 CPU seconds" in spun.text
    start = time.perf_counter()
    slept = call("import subprocess, time\nsubprocess.Popen(['sleep', '98'])\ntime.sleep(60)", timeout_s=0.3)
    assert slept.status == "timeout" and time.perf_counter() - start < 5  # the caller's limit ends it too
    time.sleep(0.3)
    assert subprocess.run(["pgrep", "-f", "sleep 98"], capture_output=True).returncode == 1
    assert not [p for p in os.listdir("/tmp") if p.startswith("verl-sandbox-")]

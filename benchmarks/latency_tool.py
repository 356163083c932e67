"""A calculator behind a loopback HTTP server that answers each call after a stated latency: the stand-in for a
tool whose calls wait on a remote service (a search API, a code sandbox, an LLM judge). The latency model is
exactly that: every call takes `latency_s` of waiting (no CPU spent) plus the loopback round trip, however many
calls are in flight. benchmarks/agent_latency.py starts the server and points the recipe's tool at it.

    server = serve(latency_s=0.5)           # in the benchmark's process; server.url for the tool's settings
    rollout.agent.tools=[{_target_: latency_tool.RemoteCalculator, url: <server.url>}]
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

from verl.agents.tools import evaluate


@dataclass
class Server:
    httpd: ThreadingHTTPServer
    url: str
    thread: threading.Thread

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve(latency_s: float, host: str = "127.0.0.1") -> Server:
    """Start the service on a free loopback port, in a thread of this process."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(latency_s)  # the remote service's latency
            try:
                answer = str(evaluate(str(body["expression"])))
            except Exception as e:  # noqa: BLE001 (the caller reads the error, as from a real service)
                answer = f"error: {type(e).__name__}"
            data = json.dumps({"result": answer}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    class Service(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 4096  # every trajectory's call may arrive at once (the default backlog is 5)

    httpd = Service((host, 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    return Server(httpd, f"http://{host}:{httpd.server_address[1]}/calc", thread)


class RemoteCalculator:
    """The calculator tool (`calc(...)`, as the recipe's SFT data calls it), answered by the service at `url`.
    Asynchronous: a trajectory waiting on its call holds no thread, so every call in flight waits at once."""

    def __init__(self, url: str, name: str = "calc"):
        self.url, self.name = url, name
        self.description = "Evaluate an arithmetic expression such as 37*45 or (3+4)*2"
        self.parameters = {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression"}},
            "required": ["expression"],
        }

    async def __call__(self, expression: str) -> str:
        where = urlparse(self.url)
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        body = json.dumps({"expression": str(expression)}).encode()
        head = f"POST {where.path} HTTP/1.0\r\nHost: {where.hostname}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
        response = await reader.read()  # HTTP/1.0: the server closes after its answer
        writer.close()
        return json.loads(response.split(b"\r\n\r\n", 1)[1])["result"]

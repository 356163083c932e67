"""The base of verl's small loopback HTTP services (the agents' chat endpoint, the reward server): JSON answers,
bearer tokens compared in constant time, no line per request in the run's log."""

from __future__ import annotations

import hmac
import json
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # (the services log what they accept themselves)
        pass

    def send_json(self, status: int, payload: Dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def has_bearer(self, token: str) -> bool:
        """Whether the request's Authorization header is `Bearer <token>`."""
        auth = self.headers.get("Authorization") or ""
        return hmac.compare_digest(auth.encode(), f"Bearer {token}".encode())

"""An OpenAI-compatible chat-completions endpoint on loopback, so an existing agent program that takes a `base_url`
is trained unchanged (loop `openai_agent`).

Each trajectory is a session with a base URL of its own (`http://127.0.0.1:PORT/s/SESSION/v1`) and the run's
bearer token as the API key. The endpoint records the exact ids and log-probs of every completion it serves and
stitches a session's requests into one trajectory, token-in-token-out: a request that repeats the session's
history (its earlier messages and the assistant replies as served) adds only its new messages, rendered as the
chat template renders them after an assistant turn; the model's own tokens are never re-tokenized. A request that
rewrites the history (an agent that trims or edits its context) starts the trajectory over from the new
messages; what came before is dropped and counted (`info["history_rewrites"]`). Tool calls in the model's text
(the `tool_parser`'s format) come back as OpenAI `tool_calls`.

Served: `GET .../v1/models`, `POST .../v1/chat/completions` (n=1, no streaming). Requests are bounded in size; a
missing or wrong token is 401, an unknown session 404, bad JSON or fields 400, each with an OpenAI-style error.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from verl.agents.parsers import Parser
from verl.agents.render import InsertRenderer
from verl.agents.trajectory import Trajectory
from verl.utils.http import JSONHandler


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class _Session:
    ctx: Any  # the trajectory's AgentContext: its client, budget and trajectory
    seen: Optional[List[Tuple]] = None  # the history as served: request messages and the replies, normalized
    last_finished: bool = True  # the last completion ended with eos
    requests: int = 0
    history_rewrites: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _SchemaTool:  # a request's tool schema, in the shape parsers read
    name: str
    description: str
    parameters: Dict[str, Any]


def _text(content: Any) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise HTTPError(400, "message content must be a string or a list of text parts")


def _normalized(m: Dict[str, Any]) -> Tuple:
    calls = []
    for c in m.get("tool_calls") or []:
        fn = c.get("function", {}) if isinstance(c, dict) else {}
        args = fn.get("arguments", "{}")
        try:
            args = json.dumps(json.loads(args) if isinstance(args, str) else args, sort_keys=True)
        except (TypeError, ValueError):
            pass
        calls.append((fn.get("name"), args))
    return (m.get("role"), _text(m.get("content")), tuple(calls))


def _template_message(m: Dict[str, Any]) -> Dict[str, Any]:
    """A request message as the chat template takes it (text content, tool calls with parsed arguments)."""
    out: Dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {
                "type": "function",
                "function": {
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"]["arguments"])
                    if isinstance(c["function"].get("arguments"), str)
                    else c["function"].get("arguments", {}),
                },
            }
            for c in m["tool_calls"]
        ]
    for key in ("name", "tool_call_id"):
        if key in m:
            out[key] = m[key]
    return out


class ChatEndpoint:
    """The HTTP server (a thread) in front of the agent runner's event loop, for one batch of trajectories."""

    def __init__(
        self,
        tokenizer: Any,
        parser: Parser,
        *,
        max_prompt_tokens: int,
        model: str = "verl-policy",
        host: str = "127.0.0.1",
        max_request_bytes: int = 4 << 20,
    ):
        self.tokenizer, self.parser, self.max_prompt_tokens, self.model = tokenizer, parser, max_prompt_tokens, model
        self.max_request_bytes = max_request_bytes
        self.token = secrets.token_urlsafe(24)  # the run's API key: only its own agent programs hold it
        self.sessions: Dict[str, _Session] = {}
        self._renderers: Dict[str, InsertRenderer] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._http = ThreadingHTTPServer((host, 0), _handler(self))
        self._http.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._http.serve_forever, name="verl-chat-endpoint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._http.shutdown()
            self._thread.join()
        self._http.server_close()

    def open_session(self, ctx: Any) -> Tuple[str, str]:
        """A new session serving `ctx`'s trajectory: its id and base URL."""
        sid = secrets.token_hex(8)
        self.sessions[sid] = _Session(ctx)
        return sid, f"{self.address}/s/{sid}/v1"

    def close_session(self, sid: str) -> _Session:
        return self.sessions.pop(sid)

    # ------------------------------------------------------------------ requests (on the event loop)

    def _renderer(self, tools: Optional[List[Dict[str, Any]]]) -> InsertRenderer:
        key = json.dumps(tools, sort_keys=True)
        if key not in self._renderers:
            self._renderers[key] = InsertRenderer(self.tokenizer, tools)
        return self._renderers[key]

    def _prompt_ids(self, messages: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]]) -> List[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise HTTPError(
                400, f"the prompt has {len(ids)} tokens, over data.max_prompt_length={self.max_prompt_tokens}"
            )
        return ids

    async def complete(self, session: _Session, body: Dict[str, Any]) -> Dict[str, Any]:
        async with session.lock:  # a session's requests are one conversation: one at a time
            return await self._complete(session, body)

    async def _complete(self, session: _Session, body: Dict[str, Any]) -> Dict[str, Any]:
        messages, tools = _checked(body)
        ctx = session.ctx
        session.requests += 1
        template_messages = [_template_message(m) for m in messages]
        history = [_normalized(m) for m in messages]
        seen = session.seen
        if seen is not None and len(history) > len(seen) and history[: len(seen)] == seen:
            ids = self._renderer(tools).ids(template_messages[len(seen) :])
            if not session.last_finished:  # the agent went on after a cut-off turn: close it as the template does
                ids = [self.tokenizer.eos_token_id, *ids]
            if len(ids) >= ctx.budget:
                return self._reply("", [], "length", 0, len(ctx.trajectory.context))
            ctx.trajectory.add_inserted_tokens(ids)
        else:
            if seen is not None:  # the history was rewritten: start the trajectory over from these messages
                session.history_rewrites += 1
                ctx.trajectory = Trajectory(prompt_ids=[])
            ctx.trajectory.prompt_ids = self._prompt_ids(template_messages, tools)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if ctx.budget <= 0:
            return self._reply("", [], "length", 0, len(ctx.trajectory.context))
        c = await ctx.generate(max_new_tokens=max_tokens)
        session.last_finished = c.finished
        text = ctx.decode(c.ids)
        by_name = {
            t["function"]["name"]: _SchemaTool(
                t["function"]["name"], t["function"].get("description", ""), t["function"].get("parameters", {})
            )
            for t in tools or []
        }
        turn = self.parser(text, by_name) if tools else None  # type: ignore[arg-type]  # (schemas stand in for tools)
        calls = [
            {
                "id": f"call_{session.requests}_{k}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for k, call in enumerate(turn.calls if turn else [])
        ]
        finish = "tool_calls" if calls else "stop" if c.finished else "length"
        content = (_without_calls(text) if "<tool_call>" in text else "") if calls else text
        reply = {"role": "assistant", "content": content or None, **({"tool_calls": calls} if calls else {})}
        session.seen = history + [_normalized(reply)]
        return self._reply(content, calls, finish, len(c.ids), len(ctx.trajectory.context) - len(c.ids))

    def _reply(self, content: str, calls: List[Dict], finish: str, completion_tokens: int, prompt_tokens: int):
        message: Dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def _without_calls(text: str) -> str:
    return re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.DOTALL).strip()


_ROLES = ("system", "user", "assistant", "tool")


def _checked(body: Any) -> Tuple[List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """The request's messages and tools, or a 400 naming what is wrong."""
    if not isinstance(body, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise HTTPError(400, f"messages[{i}] needs a 'role' among {list(_ROLES)}")
        _text(m.get("content"))
    if body.get("stream"):
        raise HTTPError(400, "stream=true is not served; request without streaming")
    if body.get("n", 1) != 1:
        raise HTTPError(400, "n must be 1 (each trajectory is one conversation)")
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is not None and (not isinstance(v, int) or v < 1):
            raise HTTPError(400, f"'{key}' must be a positive integer, got {v!r}")
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not all(isinstance(t, dict) and isinstance(t.get("function", {}).get("name"), str) for t in tools)
    ):
        raise HTTPError(400, "'tools' must be a list of {type: function, function: {name, parameters}}")
    return messages, tools or None


def _handler(endpoint: ChatEndpoint) -> type:
    class Handler(JSONHandler):
        protocol_version = "HTTP/1.1"

        def _session(self, suffix: str) -> _Session:
            if not self.has_bearer(endpoint.token):
                raise HTTPError(401, "a valid API key (Authorization: Bearer ...) is required", "authentication_error")
            parts = self.path.split("?")[0].strip("/").split("/")
            if len(parts) < 3 or parts[0] != "s" or "/".join(parts[2:]) != suffix:
                raise HTTPError(404, f"no such route {self.path}; use the session's base URL + /{suffix}")
            session = endpoint.sessions.get(parts[1])
            if session is None:
                raise HTTPError(404, f"no open session {parts[1]!r} (it ended, or never existed)")
            return session

        def _handle(self, suffix: str, work) -> None:
            try:
                session = self._session(suffix)
                self.send_json(200, work(session))
            except HTTPError as e:
                self.close_connection = True  # (a body it did not read must not be taken for the next request)
                self.send_json(e.status, {"error": {"message": e.message, "type": e.kind, "code": e.status}})
            except Exception as e:  # the engine or the loop failed: the agent sees a 500, the runner the error
                self.send_json(500, {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error"}})

        def do_GET(self) -> None:
            self._handle("v1/models", lambda s: {"object": "list", "data": [{"id": endpoint.model, "object": "model"}]})

        def do_POST(self) -> None:
            def complete(session: _Session) -> Dict[str, Any]:
                size = int(self.headers.get("Content-Length") or 0)
                if size > endpoint.max_request_bytes:
                    raise HTTPError(413, f"the request has {size} bytes, over {endpoint.max_request_bytes}")
                try:
                    body = json.loads(self.rfile.read(size) or b"null")
                except ValueError as e:
                    raise HTTPError(400, f"the body is not JSON: {e}") from None
                future = asyncio.run_coroutine_threadsafe(endpoint.complete(session, body), endpoint._loop)
                return future.result()

            self._handle("v1/chat/completions", complete)

    return Handler

"""Local HTTP servers that speak OpenAI's Chat Completions and Anthropic's Messages APIs.

Each is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 in a thread. It records every request
it receives (method, path, headers, JSON body) and answers from a script of replies pushed by
the test (status, JSON body or server-sent events, headers); with the script empty it answers
a default reply built from the request (a short text reply, streamed if ``stream`` was asked).
The official SDKs talk to them through ``base_url``: nothing goes to the internet.

The builders below write the providers' documented wire shapes: ``openai_completion`` /
``openai_chunks`` (``chat.completion`` and ``chat.completion.chunk`` objects, the stream
ending with a usage chunk and ``[DONE]``), ``anthropic_message`` / ``anthropic_events``
(``message_start``, ``content_block_start/delta/stop`` with text, ``input_json``, ``thinking``
and ``signature`` deltas, ``message_delta``, ``message_stop``), and each API's error bodies.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted answer."""

    status: int = 200
    body: Any = None
    """A JSON body (ignored when ``events`` is set)."""
    events: list[tuple[str | None, Any]] | None = None
    """Server-sent events: ``(event name or None, data)``; data is JSON or a raw string."""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedServer:
    """A provider API on 127.0.0.1: scripted replies, every request recorded."""

    def __init__(self, default: Callable[[Any], Reply]) -> None:
        self.default = default
        self.script: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def push(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self.script.extend(replies)

    def bodies(self) -> list[Any]:
        """The JSON bodies received, in order."""
        return [r.body for r in self.requests]

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, body: Any) -> Reply:
        with self._lock:
            if self.script:
                return self.script.popleft()
        return self.default(body)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with server._lock:
                    server.requests.append(
                        Recorded(
                            "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
                        )
                    )
                reply = server._next(body)
                if reply.events is not None:
                    chunks = []
                    for name, data in reply.events:
                        text = data if isinstance(data, str) else json.dumps(data)
                        chunks.append((f"event: {name}\n" if name else "") + f"data: {text}\n\n")
                    payload = "".join(chunks).encode()
                    ctype = "text/event-stream"
                else:
                    payload = json.dumps(reply.body).encode()
                    ctype = "application/json"
                self.send_response(reply.status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(payload)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        return Handler


# -- OpenAI -----------------------------------------------------------------------------------


def openai_completion(
    text: str | None = "ok",
    *,
    tool_calls: list[tuple[str, str, str]] | None = None,
    model: str = "gpt-4o-2024-08-06",
    prompt_tokens: int = 20,
    completion_tokens: int = 5,
    cached_tokens: int = 0,
) -> dict[str, Any]:
    """A ``chat.completion``; ``tool_calls`` are ``(id, name, arguments JSON)``."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        },
    }


def openai_chunks(
    pieces: list[str],
    *,
    tool_calls: list[tuple[str, str, str]] | None = None,
    model: str = "gpt-4o-2024-08-06",
    prompt_tokens: int = 20,
    completion_tokens: int = 5,
) -> list[tuple[str | None, Any]]:
    """The SSE events of a streamed completion: a role chunk, one chunk per text piece, tool
    call chunks (name first, arguments in two halves), the finish chunk, a usage chunk and
    ``[DONE]``.
    """

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "chatcmpl-stream",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    events: list[tuple[str | None, Any]] = [(None, chunk({"role": "assistant", "content": ""}))]
    events += [(None, chunk({"content": p})) for p in pieces]
    for index, (cid, name, args) in enumerate(tool_calls or ()):
        half = len(args) // 2
        first = {"index": index, "id": cid, "type": "function"}
        events.append(
            (None, chunk({"tool_calls": [{**first, "function": {"name": name, "arguments": ""}}]}))
        )
        for part in (args[:half], args[half:]):
            events.append(
                (None, chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]}))
            )
    events.append((None, chunk({}, "tool_calls" if tool_calls else "stop")))
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    events.append((None, {**chunk({}), "choices": [], "usage": usage}))
    events.append((None, "[DONE]"))
    return events


def openai_error(status: int, message: str, *, code: str | None = None) -> Reply:
    """An OpenAI error reply."""
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return Reply(status=status, body={"error": error})


def openai_default(body: Any) -> Reply:
    if isinstance(body, dict) and body.get("stream"):
        return Reply(events=openai_chunks(["o", "k"]))
    return Reply(body=openai_completion())


# -- Anthropic --------------------------------------------------------------------------------


def anthropic_message(
    blocks: list[dict[str, Any]] | None = None,
    *,
    model: str = "claude-sonnet-4-5-20250929",
    input_tokens: int = 20,
    output_tokens: int = 5,
    cache_read: int = 0,
    cache_write: int = 0,
    stop_reason: str | None = None,
) -> dict[str, Any]:
    """A Messages ``message``; the stop reason follows the blocks unless given."""
    blocks = blocks if blocks is not None else [{"type": "text", "text": "ok"}]
    uses_tools = any(b["type"] == "tool_use" for b in blocks)
    return {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason or ("tool_use" if uses_tools else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        },
    }


def _halves(text: str) -> list[str]:
    half = len(text) // 2
    return [p for p in (text[:half], text[half:]) if p]


def anthropic_events(message: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The SSE events that stream ``message``: each block starts empty and grows by deltas
    (text and thinking in two halves, a tool's input as two pieces of partial JSON, a
    thinking block's signature in one ``signature_delta``).
    """
    start = {**message, "content": [], "stop_reason": None}
    start["usage"] = {**message["usage"], "output_tokens": 1}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for i, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            empty: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in _halves(block["text"])]
        elif kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in _halves(block["thinking"])]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            empty = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in _halves(json.dumps(block["input"]))
            ]
        else:  # redacted_thinking and the like arrive whole
            empty, deltas = block, []
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": empty},
            )
        )
        for d in deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": message["usage"]["output_tokens"]},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def anthropic_error(status: int, message: str, *, kind: str = "invalid_request_error") -> Reply:
    """An Anthropic error reply."""
    return Reply(status=status, body={"type": "error", "error": {"type": kind, "message": message}})


def anthropic_default(body: Any) -> Reply:
    if isinstance(body, dict) and body.get("stream"):
        return Reply(events=anthropic_events(anthropic_message()))
    return Reply(body=anthropic_message())


@contextmanager
def running(default: Callable[[Any], Reply]) -> Iterator[ScriptedServer]:
    """A started server, stopped on exit."""
    server = ScriptedServer(default).start()
    try:
        yield server
    finally:
        server.stop()


def materialise(value: Any) -> Any:
    """A validated value with pydantic's lazy iterables read (which validates them)."""
    if isinstance(value, dict):
        return {k: materialise(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [materialise(v) for v in value]
    if hasattr(value, "__next__"):
        return [materialise(v) for v in value]
    return value


def assert_valid_body(body: dict[str, Any], *, streaming: Any, non_streaming: Any) -> None:
    """``body`` validates against the SDK's params type (a pydantic ``TypeAdapter``: the
    streaming one when the body asks to stream) and has no key the type lacks.
    """
    adapter = streaming if body.get("stream") else non_streaming
    assert materialise(adapter.validate_python(body)) == body

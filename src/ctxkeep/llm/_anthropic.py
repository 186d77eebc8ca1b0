"""Anthropic Messages for :mod:`ctxkeep.llm`, I/O-free.

The adapter turns a gated prompt into ``messages.create`` arguments (system messages as
``system`` blocks, tool results merged into user turns, thinking blocks passed back byte for
byte: all by :func:`ctxkeep.to_anthropic`), a response or its server-sent events into a
:class:`~ctxkeep.llm.ChatResult` (by :func:`ctxkeep.from_anthropic`, so a reply's thinking
blocks stay with its tool calls), and "prompt is too long" into
:class:`~ctxkeep.errors.ContextWindowExceededError`. The SDK is imported only when a client
is made.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ctxkeep.errors import ContextWindowExceededError, InvalidMessageError
from ctxkeep.llm._common import Adapter, Prompt, RequestOptions
from ctxkeep.llm.types import ChatResult, Usage
from ctxkeep.messages import Message, from_anthropic, to_anthropic


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool.get("function")
    if tool.get("type") == "function" and isinstance(fn, Mapping):  # an OpenAI definition
        out: dict[str, Any] = {
            "name": fn["name"],
            "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        if fn.get("description"):
            out["description"] = fn["description"]
        return out
    return dict(tool)


def _tool_choice(choice: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(choice, Mapping):
        return dict(choice)
    if choice in ("auto", "none", "any"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    return {"type": "tool", "name": choice}


class AnthropicAdapter(Adapter):
    """Messages: ``POST /v1/messages``."""

    name = "anthropic"

    sync_client = "Anthropic"
    async_client = "AsyncAnthropic"
    module = "anthropic"

    def endpoint(self, client: Any) -> Any:
        """The SDK method that makes the call."""
        return client.messages.create

    def request(
        self, model: str, prompt: Prompt, opts: RequestOptions, *, stream: bool
    ) -> dict[str, Any]:
        """Keyword arguments for ``messages.create`` (``max_tokens`` is required)."""
        payload = (
            prompt.anthropic if prompt.anthropic is not None else to_anthropic(prompt.messages)
        )
        kwargs: dict[str, Any] = {"model": model, "max_tokens": opts.max_tokens}
        kwargs.update(payload.kwargs())
        if opts.tools:
            kwargs["tools"] = [_tool(t) for t in opts.tools]
        if opts.tool_choice is not None:
            kwargs["tool_choice"] = _tool_choice(opts.tool_choice)
        if stream:
            kwargs["stream"] = True
        kwargs.update(opts.options)
        return kwargs

    def parse(self, response: Any) -> ChatResult:
        """A :class:`ChatResult` from a ``Message``."""
        blocks = [b.to_dict() if hasattr(b, "to_dict") else dict(b) for b in response.content]
        return ChatResult(
            message=_assistant(blocks),
            model=response.model,
            provider=self.name,
            usage=_usage(response.usage),
            stop_reason=response.stop_reason,
            id=response.id,
            raw=response,
        )

    def stream_state(self) -> AnthropicStreamState:
        """A fresh accumulator for one stream."""
        return AnthropicStreamState()

    def context_error(self, exc: BaseException, model: str) -> ContextWindowExceededError | None:
        """The context-length error ``exc`` stands for, if it is one.

        Anthropic answers 400 ``invalid_request_error`` with "prompt is too long: N tokens >
        M maximum", or "input length and `max_tokens` exceed context limit: a + b > M".
        """
        anthropic = self.sdk()
        if not isinstance(exc, anthropic.BadRequestError):
            return None
        detail = str(getattr(exc, "api_message", None) or getattr(exc, "message", exc))
        lowered = detail.lower()
        if "prompt is too long" not in lowered and "exceed context limit" not in lowered:
            return None
        limit = actual = None
        found = re.search(r"(\d+) tokens > (\d+) maximum", detail)
        if found:
            actual, limit = int(found.group(1)), int(found.group(2))
        else:
            found = re.search(r"(\d+) \+ (\d+) > (\d+)", detail)
            if found:
                actual, limit = int(found.group(1)), int(found.group(3)) - int(found.group(2))
        return ContextWindowExceededError(
            provider=self.name, model=model, detail=detail, limit=limit, actual=actual
        )


def _assistant(blocks: list[dict[str, Any]]) -> Message:
    if not blocks:
        return Message("assistant", "")
    try:
        message = from_anthropic([{"role": "assistant", "content": blocks}])[0]
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"the provider's reply cannot be read: {exc}") from exc
    content = message.content
    if isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
        message = message.replace(content=content[0]["text"])  # a plain reply is plain text
    return message


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    read = getattr(usage, "cache_read_input_tokens", None) or 0
    write = getattr(usage, "cache_creation_input_tokens", None) or 0
    return Usage(
        input_tokens=(getattr(usage, "input_tokens", None) or 0) + read + write,
        output_tokens=getattr(usage, "output_tokens", None) or 0,
        cached_input_tokens=read,
        cache_write_tokens=write,
    )


class AnthropicStreamState:
    """Accumulates Messages stream events into the message they spell.

    Each content block starts empty and grows by its deltas: text, a tool's input as
    partial JSON, thinking text and its signature. The finished blocks are the ones a
    non-streaming call returns, so thinking blocks can be passed back unchanged.
    """

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.partial_json: dict[int, list[str]] = {}
        self.model = ""
        self.id: str | None = None
        self.stop_reason: str | None = None
        self.usage: Any = None
        self.output_tokens = 0

    def feed(self, event: Any) -> str | None:
        """Take one event; return its text delta, if it has one."""
        kind = event.type
        if kind == "message_start":
            self.id = event.message.id
            self.model = event.message.model
            self.usage = event.message.usage
            self.output_tokens = getattr(self.usage, "output_tokens", 0) or 0
        elif kind == "content_block_start":
            block = event.content_block
            self.blocks[event.index] = block.to_dict() if hasattr(block, "to_dict") else block
        elif kind == "content_block_delta":
            return self._delta(event.index, event.delta)
        elif kind == "content_block_stop":
            block = self.blocks.get(event.index)
            parts = self.partial_json.pop(event.index, None)
            if block is not None and parts is not None:
                text = "".join(parts)
                block["input"] = json.loads(text) if text.strip() else {}
        elif kind == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            if event.usage is not None:
                self.output_tokens = event.usage.output_tokens or self.output_tokens
        return None

    def _delta(self, index: int, delta: Any) -> str | None:
        block = self.blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.type
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.text
            return str(delta.text)
        if kind == "input_json_delta":
            self.partial_json.setdefault(index, []).append(delta.partial_json)
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.thinking
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + delta.signature
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.citation.to_dict())
        return None

    def result(self) -> ChatResult:
        """The reply, once the stream has ended."""
        usage = _usage(self.usage)
        if usage is not None:
            usage = Usage(
                input_tokens=usage.input_tokens,
                output_tokens=self.output_tokens,
                cached_input_tokens=usage.cached_input_tokens,
                cache_write_tokens=usage.cache_write_tokens,
            )
        return ChatResult(
            message=_assistant([self.blocks[i] for i in sorted(self.blocks)]),
            model=self.model,
            provider="anthropic",
            usage=usage,
            stop_reason=self.stop_reason,
            id=self.id,
        )

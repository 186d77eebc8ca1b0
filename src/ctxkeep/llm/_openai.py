"""OpenAI Chat Completions (and compatible servers) for :mod:`ctxkeep.llm`, I/O-free.

The adapter turns a gated prompt into ``chat.completions.create`` arguments, an SDK response
or stream of chunks into a :class:`~ctxkeep.llm.ChatResult`, and the SDK's context-length
error into :class:`~ctxkeep.errors.ContextWindowExceededError`. The clients in
:mod:`ctxkeep.llm.client` do the calls; the SDK is imported only when a client is made.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ctxkeep.errors import ContextWindowExceededError
from ctxkeep.llm._common import Adapter, Prompt, RequestOptions
from ctxkeep.llm.types import ChatResult, Usage
from ctxkeep.messages import Message, ToolCall


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if "input_schema" in tool and "type" not in tool:  # an Anthropic tool definition
        fn: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if "description" in tool:
            fn["description"] = tool["description"]
        return {"type": "function", "function": fn}
    return dict(tool)


def _tool_choice(choice: str | Mapping[str, Any]) -> Any:
    if isinstance(choice, Mapping):
        return dict(choice)
    if choice in ("auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    return {"type": "function", "function": {"name": choice}}


class OpenAIAdapter(Adapter):
    """Chat Completions: ``POST /chat/completions``."""

    name = "openai"

    sync_client = "OpenAI"
    async_client = "AsyncOpenAI"
    module = "openai"

    def endpoint(self, client: Any) -> Any:
        """The SDK method that makes the call."""
        return client.chat.completions.create

    def request(
        self, model: str, prompt: Prompt, opts: RequestOptions, *, stream: bool
    ) -> dict[str, Any]:
        """Keyword arguments for ``chat.completions.create``."""
        messages = (
            prompt.openai if prompt.openai is not None else [m.to_openai() for m in prompt.messages]
        )
        kwargs: dict[str, Any] = {"model": model, "messages": messages}
        if opts.tools:
            kwargs["tools"] = [_tool(t) for t in opts.tools]
        if opts.tool_choice is not None:
            kwargs["tool_choice"] = _tool_choice(opts.tool_choice)
        if opts.max_tokens is not None:
            kwargs["max_completion_tokens"] = opts.max_tokens
        if stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        kwargs.update(opts.options)
        return kwargs

    def parse(self, response: Any) -> ChatResult:
        """A :class:`ChatResult` from a ``ChatCompletion``."""
        choice = response.choices[0]
        msg = choice.message
        calls = [
            ToolCall(id=tc.id, name=tc.function.name, arguments=tc.function.arguments)
            for tc in (msg.tool_calls or ())
            if getattr(tc, "type", "function") == "function"
        ]
        refusal = getattr(msg, "refusal", None)
        message = _assistant(msg.content, calls, refusal)
        return ChatResult(
            message=message,
            model=response.model,
            provider=self.name,
            usage=_usage(getattr(response, "usage", None)),
            stop_reason=choice.finish_reason,
            id=response.id,
            raw=response,
        )

    def stream_state(self) -> OpenAIStreamState:
        """A fresh accumulator for one stream."""
        return OpenAIStreamState()

    def context_error(self, exc: BaseException, model: str) -> ContextWindowExceededError | None:
        """The context-length error ``exc`` stands for, if it is one.

        OpenAI says ``code: context_length_exceeded``; compatible servers (vLLM, llama.cpp,
        LiteLLM) say "maximum context length" in a plain 400.
        """
        openai = self.sdk()
        if not isinstance(exc, openai.BadRequestError):
            return None
        detail = str(getattr(exc, "message", exc))
        lowered = detail.lower()
        if getattr(exc, "code", None) != "context_length_exceeded" and not (
            "maximum context length" in lowered or "context window" in lowered
        ):
            return None
        limit = actual = None
        found = re.search(r"maximum context length is (\d+)", detail)
        if found:
            limit = int(found.group(1))
            more = re.search(r"(?:resulted in|requested) (\d+) tokens", detail)
            actual = int(more.group(1)) if more else None
        return ContextWindowExceededError(
            provider=self.name, model=model, detail=detail, limit=limit, actual=actual
        )


def _assistant(content: Any, calls: list[ToolCall], refusal: str | None) -> Message:
    extra = {"refusal": refusal} if refusal else None
    if content is None and not calls:
        content = ""
    return Message("assistant", content, tool_calls=calls, extra=extra)


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return Usage(
        input_tokens=usage.prompt_tokens or 0,
        output_tokens=usage.completion_tokens or 0,
        cached_input_tokens=cached or 0,
    )


class OpenAIStreamState:
    """Accumulates ``ChatCompletionChunk`` events into the reply they spell."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.model = ""
        self.id: str | None = None
        self.finish: str | None = None
        self.usage: Usage | None = None

    def feed(self, chunk: Any) -> str | None:
        """Take one chunk; return its text delta, if it has one."""
        self.model = getattr(chunk, "model", None) or self.model
        self.id = getattr(chunk, "id", None) or self.id
        if getattr(chunk, "usage", None) is not None:
            self.usage = _usage(chunk.usage)
        delta_text: str | None = None
        for choice in chunk.choices or ():
            if getattr(choice, "index", 0) != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self.text.append(delta.content)
                    delta_text = delta.content
                if getattr(delta, "refusal", None):
                    self.refusal.append(delta.refusal)
                for tc in delta.tool_calls or ():
                    slot = self.calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    if tc.id:
                        slot["id"] = tc.id
                    if tc.function is not None:
                        slot["name"] += tc.function.name or ""
                        slot["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                self.finish = choice.finish_reason
        return delta_text

    def result(self) -> ChatResult:
        """The reply, once the stream has ended."""
        calls = [
            ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"])
            for _, c in sorted(self.calls.items())
        ]
        content = "".join(self.text) if self.text or not calls else None
        return ChatResult(
            message=_assistant(content, calls, "".join(self.refusal) or None),
            model=self.model,
            provider="openai",
            usage=self.usage,
            stop_reason=self.finish,
            id=self.id,
        )

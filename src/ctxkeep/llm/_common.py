"""The I/O-free pieces both providers' adapters share: a gated prompt and a call's options."""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from ctxkeep import _check
from ctxkeep.errors import (
    ConfigError,
    ContextWindowExceededError,
    InvalidTypeError,
    MissingDependencyError,
    describe,
)
from ctxkeep.llm.types import ChatResult
from ctxkeep.messages import AnthropicPayload, Message


@dataclass(frozen=True)
class Prompt:
    """A prompt that passed the gate, and its provider form when one was made already."""

    messages: list[Message]
    """What the gate checked (and what the counter is calibrated on)."""
    openai: list[dict[str, Any]] | None = None
    """The OpenAI form a ``BuiltPrompt`` made (with its cache hints), or None."""
    anthropic: AnthropicPayload | None = None
    """The Anthropic form a ``BuiltPrompt`` made (with its ``cache_control``), or None."""


@dataclass(frozen=True, kw_only=True)
class RequestOptions:
    """What a call asks for besides the prompt (checked, provider-neutral)."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    """Tool definitions, OpenAI (``{"type": "function", ...}``) or Anthropic
    (``{"name", "input_schema"}``) form; each adapter converts."""
    tool_choice: str | Mapping[str, Any] | None = None
    """``auto``, ``none``, ``required`` (``any``), a tool's name, or a provider-native dict."""
    max_tokens: int | None = None
    """The output limit to send (None: the provider's default; Anthropic needs one)."""
    options: dict[str, Any] = field(default_factory=dict)
    """More keyword arguments for the SDK's create call (``thinking``, ``reasoning_effort``,
    ``temperature``, ``extra_headers``, ``extra_body``...)."""


RESERVED = frozenset(
    {"model", "messages", "system", "tools", "tool_choice", "stream", "max_tokens"}
    | {"max_completion_tokens", "stream_options"}
)
"""Create-call arguments ctxkeep sets itself: refused in ``options``."""


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """Tool definitions as a list of dicts (copied), each with a name.

    Raises:
        InvalidTypeError: not a list of mappings.
        ConfigError: a definition with no name.

    """
    if tools is None:
        return []
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(_check.iterable("tools", tools)):
        if not isinstance(tool, Mapping):
            raise InvalidTypeError(f"tools[{i}] must be a mapping, got {describe(tool)}")
        d = _check.deep_copy(f"tools[{i}]", dict(tool))
        fn = d.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else d.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(
                f"tools[{i}] needs a name: an OpenAI tool {{'type': 'function', 'function': "
                f"{{'name': ...}}}} or an Anthropic tool {{'name': ..., 'input_schema': ...}}, "
                f"got {describe(tool)}"
            )
        try:
            json.dumps(d, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"tools[{i}] is not JSON ({exc})") from None
        out.append(d)
    return out


def check_tool_choice(choice: Any) -> str | dict[str, Any] | None:
    """``None``, a non-empty string, or a mapping (copied)."""
    if choice is None:
        return None
    if isinstance(choice, Mapping):
        return _check.mapping("tool_choice", choice)
    return _check.text("tool_choice", choice)


def check_options(options: Any) -> dict[str, Any]:
    """Extra create-call arguments, none of them one ctxkeep sets itself."""
    out = _check.mapping("options", options)
    taken = sorted(set(out) & RESERVED)
    if taken:
        raise ConfigError(
            f"options may not set {', '.join(taken)}: pass them as the method's own arguments"
        )
    return out


def tools_text(tools: list[dict[str, Any]]) -> str:
    """The tool definitions as the text they cost in a prompt (for counting)."""
    return json.dumps(tools, ensure_ascii=False, sort_keys=True) if tools else ""


class StreamState(Protocol):
    """Accumulates one provider's stream events into the reply they spell."""

    def feed(self, event: Any) -> str | None:
        """Take one event; return its text delta, if it has one."""
        ...

    def result(self) -> ChatResult:
        """The reply, once the stream has ended."""
        ...


class Adapter(ABC):
    """One provider's API, I/O-free but for making its SDK client. A subclass names its SDK
    (:meth:`sdk` imports it) and the SDK's sync and async client classes; making clients is
    the same for every SDK and lives here.
    """

    name: ClassVar[str]
    sync_client: ClassVar[str]
    """The SDK's sync client class (``OpenAI``, ``Anthropic``)."""
    async_client: ClassVar[str]
    """The SDK's async client class."""

    module: ClassVar[str]
    """The SDK's module, and ctxkeep's extra that installs it (``openai``, ``anthropic``)."""

    def sdk(self) -> Any:
        """The SDK module, imported on first use.

        Raises:
            MissingDependencyError: it is not installed (``pip install 'ctxkeep[<module>]'``).

        """
        try:
            return importlib.import_module(self.module)
        except ImportError as exc:
            raise MissingDependencyError(self.module, self.module) from exc

    def make_client(
        self,
        *,
        is_async: bool,
        api_key: str | None,
        base_url: str | None,
        max_retries: int | None,
        timeout: float | None,
    ) -> Any:
        """A new SDK client (the SDK's defaults where an argument is None)."""
        kwargs: dict[str, Any] = {"api_key": api_key, "base_url": base_url}
        if max_retries is not None:
            kwargs["max_retries"] = max_retries
        if timeout is not None:
            kwargs["timeout"] = timeout
        return self.client_types(is_async=is_async)[0](**kwargs)

    def client_types(self, *, is_async: bool) -> tuple[type, ...]:
        """The SDK client classes a caller may pass in."""
        return (getattr(self.sdk(), self.async_client if is_async else self.sync_client),)

    @abstractmethod
    def endpoint(self, client: Any) -> Any:
        """The SDK method that makes the call."""
        ...

    @abstractmethod
    def request(
        self, model: str, prompt: Prompt, opts: RequestOptions, *, stream: bool
    ) -> dict[str, Any]:
        """Keyword arguments for the SDK method."""
        ...

    @abstractmethod
    def parse(self, response: Any) -> ChatResult:
        """A result from the SDK's response object."""
        ...

    @abstractmethod
    def stream_state(self) -> StreamState:
        """A fresh stream accumulator."""
        ...

    @abstractmethod
    def context_error(self, exc: BaseException, model: str) -> ContextWindowExceededError | None:
        """The context-length error ``exc`` stands for, if it is one."""
        ...

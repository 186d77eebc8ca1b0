"""What :class:`~ctxkeep.llm.ChatClient` and :class:`~ctxkeep.llm.AsyncChatClient` share.

Everything but the I/O lives here once, as httpx's ``BaseClient`` holds what ``Client`` and
``AsyncClient`` share: argument checks, the model's limits, the token counter, the gate, the
request a provider's adapter builds, calibration from reported usage, error translation, and
the messages of a chat turn. The two clients only await or do not.
"""

from __future__ import annotations

import inspect
import json
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NoReturn, cast

from ctxkeep import _check
from ctxkeep.config import setting_int
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    UnknownEncodingError,
    describe,
)
from ctxkeep.gate import PromptGate
from ctxkeep.llm._anthropic import AnthropicAdapter
from ctxkeep.llm._common import (
    RESERVED,
    Adapter,
    Prompt,
    RequestOptions,
    check_options,
    check_tool_choice,
    check_tools,
    tools_text,
)
from ctxkeep.llm._openai import OpenAIAdapter
from ctxkeep.llm.models import PROVIDERS, Provider, infer_provider, resolve_limits
from ctxkeep.llm.types import ChatResult
from ctxkeep.messages import AnthropicPayload, Message, coerce_messages, validate_sequence
from ctxkeep.tokens import CalibratedCounter, TokenCounter, get_counter

ADAPTERS: dict[str, Adapter] = {"openai": OpenAIAdapter(), "anthropic": AnthropicAdapter()}

# PromptGate always has a code-point limit (8192 unless configured); a client applies one only
# when it is configured, so an unconfigured client's gate gets one no prompt can reach.
_NO_LENGTH_LIMIT = sys.maxsize


@dataclass(frozen=True)
class Request:
    """A call that passed the gate: the prompt and the options, both checked."""

    prompt: Prompt
    opts: RequestOptions


def default_counter(provider: str, model: str) -> TokenCounter:
    """The exact tiktoken counter for an OpenAI model; a :class:`CalibratedCounter` for
    Claude and for models with no local tokenizer (it learns from the reported usage).
    """
    if provider == "openai":
        try:
            return get_counter(model)
        except UnknownEncodingError:
            pass
    return CalibratedCounter(model)


class BaseChatClient:
    """The shared part of the chat clients (see :class:`~ctxkeep.llm.ChatClient`)."""

    is_async = False

    def __init__(
        self,
        model: str,
        *,
        provider: Provider | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        client: Any = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
        max_prompt_length: int | None = None,
        max_prompt_tokens: int | None = None,
        counter: TokenCounter | None = None,
        memory: Any = None,
        builder: Any = None,
    ) -> None:
        self.model = _check.text("model", model)
        _check.optional_text("api_key", api_key)
        if base_url is not None:
            _check.url("base_url", base_url)
        _check.optional_integer("max_retries", max_retries, minimum=0)
        if timeout is not None:
            timeout = _check.number("timeout", timeout, positive=True)
        _check.optional_integer("context_window", context_window, minimum=2)
        _check.optional_integer("max_output_tokens", max_output_tokens, minimum=1)
        if counter is not None and not isinstance(counter, TokenCounter):
            raise InvalidTypeError(
                f"counter must be a TokenCounter (see ctxkeep.get_counter), got {describe(counter)}"
            )
        self.provider: Provider = self._pick_provider(provider, client, self.model)
        self._adapter = ADAPTERS[self.provider]
        limits = resolve_limits(
            self.model, context_window=context_window, max_output_tokens=max_output_tokens
        )
        self.context_window = limits.context_window
        """Tokens of prompt and output the model accepts."""
        self.max_output_tokens = limits.default_output_tokens
        """The output reserve (and Anthropic ``max_tokens``) of a call that names none."""
        self._send_max_tokens = max_output_tokens is not None
        self.max_prompt_length = setting_int("max_prompt_length", max_prompt_length, None)
        """The code-point limit, when one is configured (else None: tokens only)."""
        self._max_prompt_tokens = setting_int("max_prompt_tokens", max_prompt_tokens, None)
        self.counter: TokenCounter = (
            counter if counter is not None else default_counter(self.provider, self.model)
        )
        """The counter the gate counts with (calibrated by reported usage if estimated)."""
        self.gate = self.gate_for(self.max_output_tokens)
        """The gate for a call with the default output reserve."""
        self._client, self._owns_client = self._sdk_client(
            client, api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self.memory = memory if memory is not None else getattr(builder, "memory", None)
        """Where :meth:`chat` stores turns (a ``MemoryManager``), if set."""
        if self.memory is not None:
            self.memory = getattr(self.memory, "sync", self.memory)  # an AsyncMemoryManager
            _check.has_method("memory", self.memory, "add_structured_message", "MemoryManager")
        if builder is not None:
            _check.has_method("builder", builder, "build", "ContextBuilder")
        self._builder = builder
        self._builders: dict[int, Any] = {}
        self._accepted: frozenset[str] | None = None

    # -- construction ------------------------------------------------------------------

    @staticmethod
    def _pick_provider(provider: Any, client: Any, model: str) -> Provider:
        if provider is not None:
            if provider not in PROVIDERS:
                raise ConfigError(
                    f"provider must be one of {', '.join(PROVIDERS)}, got {describe(provider)}"
                )
            return cast(Provider, provider)
        if client is not None:
            module = type(client).__module__.split(".")[0]
            if module in PROVIDERS:
                return module
        return infer_provider(model)

    def _sdk_client(
        self,
        client: Any,
        *,
        api_key: str | None,
        base_url: str | None,
        max_retries: int | None,
        timeout: float | None,
    ) -> tuple[Any, bool]:
        kinds = self._adapter.client_types(is_async=self.is_async)
        if client is not None:
            if not isinstance(client, kinds):
                raise InvalidTypeError(
                    f"client must be a {' or '.join(k.__name__ for k in kinds)} for provider "
                    f"{self.provider!r}, got {describe(client)}"
                )
            if max_retries is not None or timeout is not None:
                options: dict[str, Any] = {}
                if max_retries is not None:
                    options["max_retries"] = max_retries
                if timeout is not None:
                    options["timeout"] = timeout
                return cast(Any, client).with_options(**options), False
            return client, False
        try:
            made = self._adapter.make_client(
                is_async=self.is_async,
                api_key=api_key,
                base_url=base_url,
                max_retries=max_retries,
                timeout=timeout,
            )
        except ImportError:
            raise
        except Exception as exc:  # the SDK's own refusal (no API key...): a setting to fix
            raise ConfigError(
                f"cannot make the {self.provider} client: {exc} (pass api_key=, or set the "
                "SDK's environment variable)"
            ) from exc
        return made, True

    # -- the gate ----------------------------------------------------------------------

    def gate_for(self, reserve: int) -> PromptGate:
        """The gate for a call that reserves ``reserve`` output tokens: the window less the
        reserve (or the configured ``max_prompt_tokens``, if lower), and the configured
        code-point limit, if any. With an estimating counter (a model with no local
        tokenizer) the gate keeps a margin of that limit free (:attr:`PromptGate.margin`),
        which grows with the largest error the calibration has seen.
        """
        limit = self.context_window - reserve
        if self._max_prompt_tokens:
            limit = min(limit, self._max_prompt_tokens)
        return PromptGate(
            self.max_prompt_length or _NO_LENGTH_LIMIT, max(limit, 1), counter=self.counter
        )

    def _check_fits(self, gate: PromptGate, msgs: list[Message], tools: list[Any]) -> None:
        gate.check(msgs)
        if not tools or not gate.max_prompt_tokens:
            return
        # Tool definitions are prompt tokens too: the provider counts them against the window.
        breakdown: dict[str, int] = {}
        for m in msgs:
            breakdown[m.role] = breakdown.get(m.role, 0) + self.counter.count_message(m)
        breakdown["reply_priming"] = self.counter.count_messages([])
        breakdown["tools"] = self.counter.count_text(tools_text(tools))
        # The chat builder reserves the tools like the output (see _chat_parts): the margin is
        # kept on what is left, so a prompt it built within its budget passes here too.
        gate.check_tokens(breakdown, reserved=breakdown["tools"])

    # -- a request ---------------------------------------------------------------------

    def _prompt(self, messages: Any, system: Any) -> Prompt:
        if hasattr(messages, "messages") and hasattr(messages, "to_anthropic"):  # BuiltPrompt
            if system is not None:
                raise ConfigError(
                    "a BuiltPrompt carries its own system prompt: pass system= to build()"
                )
            msgs = coerce_messages(messages.messages)
            if self.provider == "openai":
                return Prompt(msgs, openai=list(messages.to_openai()))
            payload = messages.to_anthropic()
            if isinstance(payload, Mapping):
                payload = AnthropicPayload(
                    system=payload.get("system") or [], messages=list(payload["messages"])
                )
            return Prompt(msgs, anthropic=payload)
        msgs = coerce_messages(messages)
        if system is not None:
            if not isinstance(system, str | Message):
                raise InvalidTypeError(
                    f"system must be a string or a Message, got {describe(system)}"
                )
            head = system if isinstance(system, Message) else Message("system", system)
            if not head.is_system:
                raise ConfigError(f"system must be a system message, got a {head.role!r} one")
            msgs = [head, *msgs]
        return Prompt(msgs)

    def _options(
        self, *, tools: Any, tool_choice: Any, max_tokens: Any, options: Any
    ) -> tuple[RequestOptions, int]:
        """The call's options, checked, and its output reserve."""
        _check.optional_integer("max_tokens", max_tokens, minimum=1)
        if max_tokens is not None and max_tokens >= self.context_window:
            raise ConfigError(
                f"max_tokens ({max_tokens}) must be less than the context window "
                f"({self.context_window}) of {self.model!r}"
            )
        reserve = max_tokens if max_tokens is not None else self.max_output_tokens
        send = max_tokens
        if send is None and (self._send_max_tokens or self.provider == "anthropic"):
            send = self.max_output_tokens
        opts = RequestOptions(
            tools=check_tools(tools),
            tool_choice=check_tool_choice(tool_choice),
            max_tokens=send,
            options=self._sdk_options(check_options(options)),
        )
        return opts, reserve

    def _sdk_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` if the installed SDK's create call takes every one of them (a typo
        is refused here, not as a bare ``TypeError`` from inside the SDK).
        """
        if not options:
            return options
        if self._accepted is None:
            params = inspect.signature(self._adapter.endpoint(self._client)).parameters
            if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
                self._accepted = frozenset()  # takes anything
            else:
                self._accepted = frozenset(params)
        unknown = sorted(set(options) - self._accepted) if self._accepted else []
        if unknown:
            takes = ", ".join(sorted(self._accepted - RESERVED))
            raise ConfigError(
                f"options: the installed {self.provider} SDK's create call takes no "
                f"{', '.join(map(repr, unknown))}; it takes {takes}"
            )
        return options

    def _prepare(
        self,
        messages: Any,
        *,
        system: Any,
        tools: Any,
        tool_choice: Any,
        max_tokens: Any,
        options: Any,
    ) -> Request:
        """Check everything and gate the prompt; nothing has gone to the network yet.

        Raises:
            PromptTooLongError: over the gate (window less output reserve, tools included).
            InvalidSequenceError / InvalidMessageError: not a prompt a provider accepts.
            ConfigError / InvalidTypeError: a bad argument.

        """
        opts, reserve = self._options(
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        prompt = self._prompt(messages, system)
        if not prompt.messages:
            raise ConfigError("messages must not be empty")
        validate_sequence(prompt.messages)
        gate = self.gate if reserve == self.max_output_tokens else self.gate_for(reserve)
        self._check_fits(gate, prompt.messages, opts.tools)
        return Request(prompt, opts)

    def _kwargs(self, request: Request, *, stream: bool) -> dict[str, Any]:
        """The SDK call's arguments, checked to be sendable (JSON, valid Unicode), so a bad
        value is a typed error here rather than a bare one from inside the SDK.
        """
        kwargs = self._adapter.request(self.model, request.prompt, request.opts, stream=stream)
        try:
            json.dumps(kwargs, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidMessageError(
                "the request holds text that is not valid Unicode (a lone surrogate?): fix the "
                "messages, system prompt, tools or options"
            ) from None
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"the request is not JSON ({exc}): check tools and options") from None
        return kwargs

    def _finish(self, request: Request, result: ChatResult) -> ChatResult:
        """Calibrate an estimating counter on the usage the provider reported."""
        if not result.model:
            result = replace(result, model=self.model)
        usage = result.usage
        if isinstance(self.counter, CalibratedCounter) and usage and usage.input_tokens > 0:
            observed = list(request.prompt.messages)
            if request.opts.tools:
                observed.append(Message("system", tools_text(request.opts.tools)))
            self.counter.observe(observed, usage.input_tokens)
        return result

    def _reraise(self, exc: Exception) -> NoReturn:
        """Raise the provider's error: a context-length refusal as
        :class:`ContextWindowExceededError` (the SDK's error chained), any other unchanged.
        """
        error = self._adapter.context_error(exc, self.model)
        if error is not None:
            raise error from exc
        raise exc

    # -- chat turns --------------------------------------------------------------------

    def _chat_parts(self, opts: RequestOptions, reserve: int) -> tuple[Any, Any]:
        """The memory and builder of a chat turn.

        The default builder leaves room for the output reserve and for the tool definitions
        (the provider counts them against the window; the builder does not see them): one
        builder per distinct reserve, made on first use, so its caches carry over between
        turns. A builder the caller gave is used as it is.
        """
        if self.memory is None:
            raise ConfigError(
                "chat() needs a session store: make the client with memory=open_memory(...) "
                "or builder=ContextBuilder(memory=...)"
            )
        if self._builder is not None:
            return self.memory, self._builder
        if opts.tools:
            reserve += self.counter.count_text(tools_text(opts.tools))
        builder = self._builders.get(reserve)
        if builder is None:
            from ctxkeep.builder import ContextBuilder

            if reserve >= self.context_window:
                raise ConfigError(
                    f"the output reserve and tool definitions ({reserve} tokens) leave no room "
                    f"for a prompt in the {self.context_window}-token window of {self.model!r}"
                )
            builder = ContextBuilder(
                memory=self.memory,
                counter=self.counter,
                max_prompt_tokens=self.context_window,
                reserve_output_tokens=reserve,
                gate=self.gate_for(reserve),
            )
            self._builders[reserve] = builder
        return self.memory, builder

    def _start_turn(
        self,
        session_id: Any,
        text: Any,
        *,
        tools: Any,
        tool_choice: Any,
        max_tokens: Any,
        options: Any,
    ) -> tuple[str, Message | None, Any, Any]:
        """Check a chat turn's arguments before anything is stored: the turn id, the user
        message to store, the memory and the builder.
        """
        turn_id, user = self._user_turn(session_id, text)
        opts, reserve = self._options(
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        memory, builder = self._chat_parts(opts, reserve)
        return turn_id, user, memory, builder

    @staticmethod
    def _user_turn(session_id: Any, text: Any) -> tuple[str, Message | None]:
        """A new turn id, and the user message to store (None to continue a turn whose
        tool results were just stored).
        """
        _check.text("session_id", session_id)
        turn_id = uuid.uuid4().hex
        if text is None:
            return turn_id, None
        if isinstance(text, Message):
            if text.role != "user":
                raise ConfigError(f"chat() takes a user message, got a {text.role!r} message")
            return turn_id, text.replace(turn_id=text.turn_id or turn_id)
        return turn_id, Message("user", _check.text("text", text), turn_id=turn_id)

    @staticmethod
    def _reply(
        result: ChatResult, turn_id: str, parent_id: str | None, report: Any = None
    ) -> Message:
        """The reply as stored: the turn's id, its parent, and the call in its metadata, with
        the window its prompt was built in (``report``'s ``max_prompt_tokens`` and
        ``reserve_output_tokens``: the inspector shows a session's prompts in that window).
        """
        window = (
            {}
            if report is None
            else {
                "max_prompt_tokens": report.max_prompt_tokens,
                "reserve_output_tokens": report.reserve_output_tokens,
            }
        )
        return result.message.replace(
            turn_id=turn_id,
            parent_id=parent_id,
            metadata={**result.message.metadata, **result.metadata(), **window},
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model!r}, provider={self.provider!r}, "
            f"context_window={self.context_window}, max_output_tokens={self.max_output_tokens})"
        )


def stored_result(result: ChatResult, stored: Message) -> ChatResult:
    """``result`` with the reply as the store returned it (its id, turn and metadata)."""
    return replace(result, message=stored)

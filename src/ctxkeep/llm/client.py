"""Gated chat clients over the official OpenAI and Anthropic SDKs, sync and async.

:class:`ChatClient` and :class:`AsyncChatClient` differ only in awaiting: every check, the
gate, request building, parsing and calibration live once in
:class:`~ctxkeep.llm._base.BaseChatClient`. A call goes:

1. check the arguments, coerce the messages, check they are a valid provider sequence;
2. the gate: code points (when configured) and tokens against the model's window less the
   output reserve, tool definitions included, less a margin when the count is an estimate
   (:func:`~ctxkeep.tokens.estimate_margin`); over it,
   :class:`~ctxkeep.errors.PromptTooLongError` and nothing is sent;
3. the SDK's create call, whose own retries (``max_retries``, exponential backoff that honours
   ``Retry-After``) cover 408, 409, 429 and 5xx;
4. the reply as a :class:`~ctxkeep.llm.ChatResult`; the reported input tokens calibrate an
   estimating counter (Claude, models with no local tokenizer), when they are plausible: an
   absurd report is ignored and logged (:class:`~ctxkeep.tokens.CalibratedCounter`).

A provider's context-length refusal becomes :class:`~ctxkeep.errors.ContextWindowExceededError`;
its other errors (authentication, a rate limit that outlasted the retries...) are the SDK's own,
unchanged, as an SDK user expects.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator
from types import TracebackType
from typing import Any

from ctxkeep.errors import CtxkeepError
from ctxkeep.llm._base import BaseChatClient, Request, stored_result
from ctxkeep.llm.types import ChatResult


class ChatClient(BaseChatClient):
    """A gated chat client for OpenAI (and compatible servers) or Anthropic.

    Args:
        model: the model to call (``gpt-4o``, ``claude-sonnet-4-5``, a local model's name).
        provider: ``"openai"`` or ``"anthropic"``; default: from ``client``'s type, else
            ``anthropic`` for ``claude-*`` models and ``openai`` for the rest.
        api_key: passed to the SDK (default: its environment variable).
        base_url: passed to the SDK: an OpenAI-compatible server (vLLM, llama.cpp, Ollama,
            LiteLLM...) or a proxy.
        client: an SDK client to use as is (``openai.OpenAI``, ``anthropic.Anthropic``);
            the caller keeps ownership.
        max_retries: how often the SDK retries 408/409/429/5xx and connection errors with
            backoff (default: the SDK's, 2); ``0`` turns retries off.
        timeout: seconds per request (default: the SDK's).
        context_window: the model's window in tokens (default: :data:`ctxkeep.llm.MODELS`;
            required for a model it does not list).
        max_output_tokens: the output reserve: the gate allows ``context_window`` less this,
            and it is sent as the output limit (Anthropic's ``max_tokens`` always; OpenAI's
            ``max_completion_tokens`` when given). Default: the table's.
        max_prompt_length: a code-point limit (default: ``CTXKEEP_MAX_PROMPT_LENGTH``, else
            the config file's ``max_prompt_length``, else none).
        max_prompt_tokens: a token limit below the window's (default:
            ``CTXKEEP_MAX_PROMPT_TOKENS``, else the config file, else the window's).
        counter: the token counter of the gate (default: exact tiktoken for OpenAI models, a
            :class:`~ctxkeep.CalibratedCounter` for Claude and unknown models; the gate and
            the default builder keep a margin for such an estimate).
        memory: the ``MemoryManager`` :meth:`chat` stores turns in.
        builder: the ``ContextBuilder`` :meth:`chat` builds prompts with (default: one over
            ``memory`` with this client's window, reserve, counter and gate).

    Raises:
        ConfigError: a bad setting, or an unknown model without ``context_window``.
        InvalidTypeError: an argument of the wrong type.
        MissingDependencyError: the provider's SDK is not installed (names the extra).

    """

    is_async = False

    def complete(
        self,
        messages: Any,
        *,
        system: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        options: Any = None,
    ) -> ChatResult:
        """One call: the assistant's reply to ``messages``.

        Args:
            messages: ``Message`` objects or OpenAI dicts, or a ``BuiltPrompt`` (its
                provider form is sent as built, cache breakpoints included).
            system: a system prompt put first (not with a ``BuiltPrompt``).
            tools: tool definitions, OpenAI or Anthropic form (converted as needed).
            tool_choice: ``auto``, ``none``, ``required``, a tool's name, or a provider dict.
            max_tokens: the output limit of this call (also its reserve in the gate).
            options: more arguments for the SDK's create call (``thinking``,
                ``reasoning_effort``, ``temperature``, ``extra_headers``...; what
                the installed SDK's create call accepts).

        Returns:
            The reply, its usage and the model.

        Raises:
            PromptTooLongError: the gate refused the prompt; nothing was sent.
            ContextWindowExceededError: the provider refused it as too long.
            InvalidSequenceError / InvalidMessageError: not a valid prompt; nothing was sent.

        """
        request = self._prepare(
            messages,
            system=system,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        kwargs = self._kwargs(request, stream=False)
        try:
            response = self._adapter.endpoint(self._client)(**kwargs)
        except Exception as exc:
            self._reraise(exc)
        return self._finish(request, self._adapter.parse(response))

    def stream(
        self,
        messages: Any,
        *,
        system: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        options: Any = None,
    ) -> ChatStream:
        """:meth:`complete`, streamed: iterate the result for text deltas.

        The gate runs and the request is made before this returns. Use it as a context
        manager so the connection closes if you stop early::

            with client.stream(messages) as stream:
                for delta in stream:
                    print(delta, end="")
            result = stream.result          # the same ChatResult complete() returns
        """
        request = self._prepare(
            messages,
            system=system,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        kwargs = self._kwargs(request, stream=True)
        try:
            events = self._adapter.endpoint(self._client)(**kwargs)
        except Exception as exc:
            self._reraise(exc)
        return ChatStream(self, request, events)

    def chat(
        self,
        session_id: str,
        text: Any,
        *,
        system: Any = None,
        query: str | None = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        options: Any = None,
    ) -> ChatResult:
        """One turn of a stored session: store ``text`` as the user's message, build the
        prompt from the session with the builder, call, and store the reply.

        The reply is stored with its tool calls, the turn's id (shared with the user
        message), the user message's id as ``parent_id``, and the call's model, provider,
        usage, stop reason and response id in its metadata. A reply that calls tools leaves
        the calls waiting: store their results (``memory.add_structured_message``), then call
        ``chat(session_id, None)`` for the next reply. The user message is stored before the
        call, so a failed call leaves it in the history for the next turn.

        Args:
            session_id: the session (see ``MemoryManager.create_session``).
            text: the user's message (a string or user ``Message``), or None to continue.
            system: the system prompt, passed to ``builder.build``.
            query: what episodic memory is searched for (default: the newest user message).
            tools: as for :meth:`complete`.
            tool_choice: as for :meth:`complete`.
            max_tokens: as for :meth:`complete`.
            options: as for :meth:`complete`.

        Returns:
            The result; its ``message`` is the reply as stored (with its id).

        """
        turn_id, user, memory, builder = self._start_turn(
            session_id,
            text,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        parent = memory.add_structured_message(session_id, user).id if user else None
        built = builder.build(session_id, system=system, query=query)
        result = self.complete(
            built,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        stored = memory.add_structured_message(
            session_id, self._reply(result, turn_id, parent, built.report)
        )
        return stored_result(result, stored)

    def close(self) -> None:
        """Close the SDK client, if this client made it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncChatClient(BaseChatClient):
    """The async twin of :class:`ChatClient` (same arguments; ``client`` is an
    ``openai.AsyncOpenAI`` or ``anthropic.AsyncAnthropic``; methods are awaited).
    """

    is_async = True

    async def complete(
        self,
        messages: Any,
        *,
        system: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        options: Any = None,
    ) -> ChatResult:
        """See :meth:`ChatClient.complete`."""
        request = self._prepare(
            messages,
            system=system,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        kwargs = self._kwargs(request, stream=False)
        try:
            response = await self._adapter.endpoint(self._client)(**kwargs)
        except Exception as exc:
            self._reraise(exc)
        return self._finish(request, self._adapter.parse(response))

    async def stream(
        self,
        messages: Any,
        *,
        system: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        options: Any = None,
    ) -> AsyncChatStream:
        """See :meth:`ChatClient.stream`.

        Usage::

            async with await client.stream(messages) as stream:
                async for delta in stream:
                    ...
        """
        request = self._prepare(
            messages,
            system=system,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        kwargs = self._kwargs(request, stream=True)
        try:
            events = await self._adapter.endpoint(self._client)(**kwargs)
        except Exception as exc:
            self._reraise(exc)
        return AsyncChatStream(self, request, events)

    async def chat(
        self,
        session_id: str,
        text: Any,
        *,
        system: Any = None,
        query: str | None = None,
        tools: Any = None,
        tool_choice: Any = None,
        max_tokens: int | None = None,
        options: Any = None,
    ) -> ChatResult:
        """See :meth:`ChatClient.chat` (storage and building run in a worker thread)."""
        turn_id, user, memory, builder = self._start_turn(
            session_id,
            text,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        parent = None
        if user is not None:
            parent = (await asyncio.to_thread(memory.add_structured_message, session_id, user)).id
        if callable(getattr(builder, "abuild", None)):
            built = await builder.abuild(session_id, system=system, query=query)
        else:
            built = await asyncio.to_thread(builder.build, session_id, system=system, query=query)
        result = await self.complete(
            built,
            tools=tools,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            options=options,
        )
        reply = self._reply(result, turn_id, parent, built.report)
        stored = await asyncio.to_thread(memory.add_structured_message, session_id, reply)
        return stored_result(result, stored)

    async def close(self) -> None:
        """Close the SDK client, if this client made it."""
        if self._owns_client:
            await self._client.close()

    async def __aenter__(self) -> AsyncChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


_NOT_FINISHED = "the stream was closed before it ended: it has no result"


class ChatStream:
    """A streamed reply: iterate for text deltas; ``result`` once it has ended."""

    def __init__(self, owner: ChatClient, request: Request, events: Any) -> None:
        self._owner = owner
        self._request = request
        self._events = events
        self._state = owner._adapter.stream_state()
        self._deltas = self._run()
        self.result: ChatResult | None = None
        """The reply (as :meth:`ChatClient.complete` returns it), once the stream ended."""

    def _run(self) -> Generator[str, None, None]:
        try:
            for event in self._events:
                delta = self._state.feed(event)
                if delta:
                    yield delta
        except Exception as exc:
            self._owner._reraise(exc)
        self.result = self._owner._finish(self._request, self._state.result())

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        return next(self._deltas)

    def final_result(self) -> ChatResult:
        """Read the rest of the stream and return the result.

        Raises:
            CtxkeepError: the stream was closed before it ended.

        """
        for _ in self:
            pass
        if self.result is None:
            raise CtxkeepError(_NOT_FINISHED)
        return self.result

    def close(self) -> None:
        """Stop reading and close the connection."""
        self._deltas.close()
        self._events.close()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncChatStream:
    """The async twin of :class:`ChatStream`."""

    def __init__(self, owner: AsyncChatClient, request: Request, events: Any) -> None:
        self._owner = owner
        self._request = request
        self._events = events
        self._state = owner._adapter.stream_state()
        self._deltas = self._run()
        self.result: ChatResult | None = None
        """The reply (as :meth:`AsyncChatClient.complete` returns it), once the stream ended."""

    async def _run(self) -> AsyncGenerator[str, None]:
        try:
            async for event in self._events:
                delta = self._state.feed(event)
                if delta:
                    yield delta
        except Exception as exc:
            self._owner._reraise(exc)
        self.result = self._owner._finish(self._request, self._state.result())

    def __aiter__(self) -> AsyncChatStream:
        return self

    async def __anext__(self) -> str:
        return await self._deltas.__anext__()

    async def final_result(self) -> ChatResult:
        """See :meth:`ChatStream.final_result`."""
        async for _ in self:
            pass
        if self.result is None:
            raise CtxkeepError(_NOT_FINISHED)
        return self.result

    async def close(self) -> None:
        """Stop reading and close the connection."""
        await self._deltas.aclose()
        await self._events.close()

    async def __aenter__(self) -> AsyncChatStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


__all__ = ["AsyncChatClient", "AsyncChatStream", "ChatClient", "ChatStream"]

"""ctxkeep under LangChain: a trimmer, a chat message history and an agent middleware.

Three parts, each over LangChain's own ``BaseMessage`` types (extra ``ctxkeep[langchain]``):

* :func:`prune_messages` is a drop-in for ``langchain_core.messages.trim_messages`` (the same
  keyword names where they mean the same thing, and a ``Runnable`` when called without
  messages) with ctxkeep's guarantees: an ``AIMessage``'s tool calls and their
  ``ToolMessage`` results are kept or dropped together, the budget is exact and hard, old tool
  outputs that do not fit are compressed (head, tail and a ref to the full text in an artifact
  store) before anything is dropped, and the input is never mutated: a message that comes
  back unchanged is the very object given.
* :class:`CtxkeepChatMessageHistory` is a ``BaseChatMessageHistory`` over any
  :func:`~ctxkeep.open_memory` URL, so ``RunnableWithMessageHistory`` gets TTL, LRU and
  ``max_history`` sessions on SQLite, Redis or PostgreSQL.
* :class:`ContextMiddleware` fits every model call of a LangChain v1 agent
  (``create_agent(model, tools, middleware=[ContextMiddleware(...)])``) into the model's window,
  system prompt and tool definitions counted, optionally recalls past runs into the system
  prompt (``### Prior Historical Context``) and saves each run as an episode when it ends.

Messages convert losslessly with :func:`to_ctxkeep_messages` / :func:`from_ctxkeep_messages`:
the ctxkeep :class:`~ctxkeep.Message` carries what ctxkeep counts and checks (role, content as
OpenAI parts, name, tool calls with JSON arguments, tool call id), and
``metadata["langchain"]`` keeps the rest (``message_to_dict``'s data: ids, ``additional_kwargs``,
``response_metadata``, usage, the original content blocks when ctxkeep's form differs), so a
message read back equals the one stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, cast, overload

from ctxkeep import _check
from ctxkeep.artifacts import ArtifactStore, MemoryArtifactStore, open_artifacts
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    MissingDependencyError,
    SessionExistsError,
    SessionNotFoundError,
    UnknownRoleError,
    describe,
)
from ctxkeep.messages import THINKING_TYPES, Content, ContentPart, Message, ToolCall
from ctxkeep.prune import PruneReport, TokenPruner
from ctxkeep.prune.units import _NO_RESULT
from ctxkeep.sessions import MemoryConfig, MemoryManager, open_memory
from ctxkeep.tokens import TokenCounter, get_counter

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain.agents.middleware.types import AgentState, ExtendedModelResponse
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.messages.utils import count_tokens_approximately
    from langchain_core.prompt_values import PromptValue
    from langchain_core.runnables import Runnable, RunnableLambda
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.runtime import Runtime
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langchain", "langchain") from exc

from ctxkeep.episodic.base import EpisodicMemoryStore, Hit

__all__ = [
    "ContextMiddleware",
    "ContextReport",
    "CtxkeepChatMessageHistory",
    "from_ctxkeep_messages",
    "prune_messages",
    "to_ctxkeep_messages",
    "tools_json",
]

MessageTypes: TypeAlias = str | type[BaseMessage] | Sequence[str | type[BaseMessage]]
MessagesInput: TypeAlias = Sequence[Any] | PromptValue
TokenCounterLike: TypeAlias = (
    TokenCounter | str | Callable[[list[BaseMessage]], int] | Callable[[BaseMessage], int] | Any
)

_RECORD = "langchain"  # metadata key of the lossless record
_KEY = "langchain_key"  # metadata key tying a pruned message to the LangChain one it came from
_MARK = "ctxkeep"  # response_metadata key on messages ctxkeep changed or made
_keys = itertools.count(1)
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_CHAT_ROLES = {
    "system": "system",
    "developer": "developer",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
}


# -- conversion ----------------------------------------------------------------------------


def _role(m: BaseMessage, i: int) -> str:
    kind = m.type.removesuffix("MessageChunk").lower()
    if kind == "chat":
        role = _CHAT_ROLES.get(str(getattr(m, "role", "")))
        if role is None:
            raise UnknownRoleError(
                f"ChatMessage role {getattr(m, 'role', None)!r} has no provider role; use one of "
                + ", ".join(sorted(_CHAT_ROLES)),
                index=i,
            )
        return role
    role = _ROLES.get(kind)
    if role is None:
        raise InvalidMessageError(
            f"a {type(m).__name__} cannot be sent to a chat model here (FunctionMessage is "
            "legacy function calling with no tool_call_id: use ToolMessage)",
            index=i,
        )
    if role == "system" and m.additional_kwargs.get("__openai_role__") == "developer":
        return "developer"
    return role


def _part(block: Any, role: str) -> ContentPart:
    """One LangChain content block as a part ctxkeep accepts (counted as it would be sent)."""
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if isinstance(block, Mapping) and isinstance(block.get("type"), str):
        kind = block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            return dict(block)
        if kind == "image_url":
            image = block.get("image_url")
            if isinstance(image, str):
                return {"type": "image_url", "image_url": {"url": image}}
            if isinstance(image, Mapping) and isinstance(image.get("url"), str):
                return dict(block)
        elif kind in THINKING_TYPES:
            needed = ("thinking", "signature") if kind == "thinking" else ("data",)
            if role == "assistant" and all(isinstance(block.get(k), str) for k in needed):
                return dict(block)
        elif kind != "text":
            return dict(block)  # counted as its JSON, never free
    return {"type": "text", "text": json.dumps(block, ensure_ascii=False, default=str)}


def _content(content: Any, role: str) -> Content:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return [_part(b, role) for b in content]
    return str(content)


def _tool_calls(m: BaseMessage, i: int) -> list[ToolCall]:
    out = []
    for tc in getattr(m, "tool_calls", None) or ():
        if not tc.get("id"):
            raise InvalidMessageError(
                f"tool call {tc.get('name')!r} has no id, so no ToolMessage can answer it; "
                "give every tool call an id",
                index=i,
            )
        try:
            arguments = json.dumps(tc.get("args", {}), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise InvalidMessageError(
                f"tool call {tc['id']!r} has arguments that are not JSON ({e})", index=i
            ) from e
        out.append(ToolCall(id=tc["id"], name=tc.get("name") or "", arguments=arguments))
    return out


def _convert(m: Any, i: int, metadata: dict[str, Any]) -> Message:
    if not isinstance(m, BaseMessage):
        raise InvalidMessageError(f"expected a LangChain message, got {describe(m)}", index=i)
    role = _role(m, i)
    tool_call_id = getattr(m, "tool_call_id", None) if role == "tool" else None
    try:
        return Message(
            role,
            _content(m.content, role),
            name=m.name if isinstance(m.name, str) else None,
            tool_call_id=tool_call_id,
            tool_calls=_tool_calls(m, i) if role == "assistant" else (),
            metadata=metadata,
        )
    except InvalidMessageError as exc:
        if exc.index is not None:
            raise
        raise type(exc)(str(exc), index=i) from None


def to_ctxkeep_messages(messages: MessagesInput) -> list[Message]:
    """LangChain messages (or anything ``convert_to_messages`` takes) as ctxkeep messages.

    Each message keeps its LangChain data in ``metadata["langchain"]`` (JSON when the message
    is), so :func:`from_ctxkeep_messages` gives back an equal message.

    Raises:
        InvalidMessageError: a message ctxkeep cannot represent (a tool call without an id,
            a ``FunctionMessage``, a ``RemoveMessage``); the error names its index.
        UnknownRoleError: a ``ChatMessage`` with a role no provider knows.

    """
    out = []
    for i, m in enumerate(_lc_messages(messages)):
        data = message_to_dict(m)
        record = {"type": data["type"], "data": dict(data["data"])}
        cm = _convert(m, i, {})
        if cm.content == m.content:
            del record["data"]["content"]  # ctxkeep's content is the same: stored once
        out.append(cm.replace(metadata={_RECORD: record}))
    return out


def from_ctxkeep_messages(messages: Iterable[Message]) -> list[BaseMessage]:
    """LangChain messages from ctxkeep ones: the inverse of :func:`to_ctxkeep_messages`.

    A message with no LangChain record (one ctxkeep made: a summary, a synthetic "no result"
    tool result) is built from its fields. A tool output ctxkeep compressed comes back with
    the compressed text and ``response_metadata["ctxkeep"]`` naming the artifact that holds
    the full one.
    """
    out = []
    for i, m in enumerate(_check.iterable("messages", messages)):
        if not isinstance(m, Message):
            raise InvalidTypeError(f"message {i} must be a ctxkeep Message, got {describe(m)}")
        record = m.metadata.get(_RECORD)
        if not isinstance(record, Mapping) or not isinstance(record.get("data"), Mapping):
            out.append(_from_fields(m))
            continue
        data = dict(record["data"])
        compressed = "ctxkeep_compressed" in m.metadata
        if compressed or "content" not in data:
            data["content"] = m.content if m.content is not None else ""
        lc = messages_from_dict([{"type": record["type"], "data": data}])[0]
        out.append(_apply_changes(lc, _convert(lc, i, {}), m))
    return out


def _from_fields(m: Message) -> BaseMessage:
    """A LangChain message for a ctxkeep message that has no LangChain original."""
    content: Any = m.content if m.content is not None else ""
    mark: dict[str, Any] = {}
    if m.event_kind:
        mark["event_kind"] = m.event_kind
    if m.role == "tool" and m.content == _NO_RESULT:
        mark["synthetic"] = True  # the pruner's result for a call that never got one
    meta = {_MARK: mark} if mark else {}
    if m.role == "tool":
        return ToolMessage(
            content,
            tool_call_id=m.tool_call_id or "",
            name=m.name,
            status="error" if mark.get("synthetic") else "success",
            response_metadata=meta,
        )
    if m.role == "assistant":
        return AIMessage(
            content,
            name=m.name,
            tool_calls=[_lc_call(tc) for tc in m.tool_calls],
            response_metadata=meta,
        )
    if m.role in ("system", "developer"):
        extra = {"__openai_role__": "developer"} if m.role == "developer" else {}
        return SystemMessage(content, name=m.name, additional_kwargs=extra, response_metadata=meta)
    return HumanMessage(content, name=m.name, response_metadata=meta)


def _lc_call(tc: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(tc.arguments)
    except ValueError:
        args = {"arguments": tc.arguments}
    return {"name": tc.name, "args": args, "id": tc.id, "type": "tool_call"}


def _apply_changes(original: BaseMessage, before: Message, after: Message) -> BaseMessage:
    """``original`` if ctxkeep left it as it was (``before`` -> ``after``), else a copy with
    the changes: compressed content, or tool call ids a repair made distinct.
    """
    update: dict[str, Any] = {}
    if after.content is not before.content and after.content != before.content:
        update["content"] = after.content if after.content is not None else ""
        info = after.metadata.get("ctxkeep_compressed")
        if isinstance(info, Mapping):
            mark = {
                "compressed": True,
                "artifact_ref": info.get("ref"),
                "original_chars": info.get("original_chars"),
            }
            update["response_metadata"] = {**original.response_metadata, _MARK: mark}
    if after.tool_call_id != before.tool_call_id:
        update["tool_call_id"] = after.tool_call_id
    if after.tool_calls != before.tool_calls:
        update["tool_calls"] = [_lc_call(tc) for tc in after.tool_calls]
    return original.model_copy(update=update) if update else original


def _lc_messages(messages: Any) -> list[BaseMessage]:
    if isinstance(messages, str | bytes | Mapping) or not isinstance(
        messages, Iterable | PromptValue
    ):
        raise InvalidTypeError(
            f"messages must be a list of messages or a PromptValue, got {describe(messages)}"
        )
    try:
        return convert_to_messages(cast("Sequence[Any]", messages))
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise InvalidMessageError(f"cannot read the messages as LangChain messages: {exc}") from exc


class _Converter:
    """LangChain messages to ctxkeep messages for pruning, each tagged with a key that ties it
    back to the object it came from. Conversions are cached (by LangChain id, or by object,
    and reused only while the message still equals a snapshot of it), so token counts carry
    over between the model calls of a run and a turn costs its new messages.
    """

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[Any, tuple[BaseMessage, Message]] = OrderedDict()
        self._size = size

    def convert(
        self, lcs: list[BaseMessage]
    ) -> tuple[list[Message], dict[int, tuple[BaseMessage, Message]]]:
        out: list[Message] = []
        originals: dict[int, tuple[BaseMessage, Message]] = {}
        for i, lc in enumerate(lcs):
            key = (type(lc), lc.id) if lc.id else id(lc)
            hit = self._cache.get(key)
            if hit is not None and hit[0] == lc:
                cm = hit[1]
                self._cache.move_to_end(key)
            else:
                cm = _convert(lc, i, {_KEY: next(_keys)})
                self._cache[key] = (lc.model_copy(deep=True), cm)
                if len(self._cache) > self._size:
                    self._cache.popitem(last=False)
            originals.setdefault(cm.metadata[_KEY], (lc, cm))
            out.append(cm)
        return out, originals


def _to_lc(m: Message, originals: Mapping[int, tuple[BaseMessage, Message]]) -> BaseMessage:
    found = originals.get(m.metadata.get(_KEY, 0))
    if found is None:
        return _from_fields(m)
    return _apply_changes(found[0], found[1], m)


# -- counting -----------------------------------------------------------------------------


class _CallableCounter:
    """A LangChain token counter (a function of a message list or of one message, or a model's
    ``get_num_tokens_from_messages``) as a ctxkeep :class:`~ctxkeep.TokenCounter`.

    A message costs what the function gives for it alone, less what it gives for no message
    (a per-prompt overhead, counted once as the reply priming). The pruner's total is then
    exact for an additive function; :class:`_Trimmer` checks the whole output with the function
    itself and prunes again, tighter, if it is not.
    """

    exact = False

    def __init__(self, fn: Callable[[list[BaseMessage]], int], to_lc: Callable[[Message], Any]):
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self._key = object()  # this counter's entry in a message's count cache
        self._fn = fn
        self._to_lc = to_lc
        self._empty = self._call([])

    def _call(self, messages: list[BaseMessage]) -> int:
        n = self._fn(messages)
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidTypeError(f"token_counter must return an int, got {describe(n)}")
        return n

    def count_text(self, text: str) -> int:
        """Tokens the function gives a human message of ``text``, beyond an empty one."""
        return self._call([HumanMessage(text)]) - self._call([HumanMessage("")])

    def count_message(self, message: Any) -> int:
        """Tokens of one message (cached on the message)."""
        cache: dict[Any, int] = message.__dict__.setdefault("_tokens", {})
        n = cache.get(self._key)
        if n is None:
            n = cache[self._key] = self._call([self._to_lc(message)]) - self._empty
        return n

    def count_messages(self, messages: Iterable[Any]) -> int:
        """Tokens of a prompt: each message plus the function's per-prompt overhead."""
        return sum(self.count_message(m) for m in messages) + self._empty


def _list_counter(token_counter: Any) -> Callable[[list[BaseMessage]], int] | None:
    """A LangChain-style counter as a function of a message list, as trim_messages reads it;
    None for a ctxkeep counter or name.
    """
    if token_counter == "approximate":
        return count_tokens_approximately
    if isinstance(token_counter, str | TokenCounter) or token_counter is None:
        return None
    method = getattr(token_counter, "get_num_tokens_from_messages", None)
    if callable(method):
        return cast("Callable[[list[BaseMessage]], int]", method)
    if not callable(token_counter):
        raise InvalidTypeError(
            "token_counter must be a ctxkeep TokenCounter or encoding name, 'approximate', a "
            "function of messages or a model with get_num_tokens_from_messages(), got "
            f"{describe(token_counter)}"
        )
    import inspect

    try:
        params = list(inspect.signature(token_counter).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].annotation in (BaseMessage, "BaseMessage"):
        per_message = cast("Callable[[BaseMessage], int]", token_counter)
        return lambda ms: sum(per_message(m) for m in ms)
    return cast("Callable[[list[BaseMessage]], int]", token_counter)


# -- pruning ------------------------------------------------------------------------------


def _types(value: Any, name: str) -> tuple[tuple[str, ...], tuple[type, ...]] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str | type) else list(value)
    for t in items:
        if not (isinstance(t, str) or (isinstance(t, type) and issubclass(t, BaseMessage))):
            raise InvalidTypeError(
                f"{name} must name message types ('human', 'ai', HumanMessage...), got "
                f"{describe(t)}"
            )
    return (
        tuple(t for t in items if isinstance(t, str)),
        tuple(t for t in items if isinstance(t, type)),
    )


def _is(m: BaseMessage, types: tuple[tuple[str, ...], tuple[type, ...]]) -> bool:
    return m.type in types[0] or isinstance(m, types[1])


def _unit_starts(messages: Sequence[BaseMessage]) -> list[int]:
    """Index of the unit each message belongs to: a ToolMessage belongs to the AIMessage
    whose call it answers (when that message is before it in the same run of results).
    """
    starts: list[int] = []
    calls: set[str] = set()
    start = -1
    for i, m in enumerate(messages):
        if isinstance(m, ToolMessage) and m.tool_call_id in calls:
            starts.append(start)
            continue
        start = i
        calls = {tc.get("id") or "" for tc in getattr(m, "tool_calls", None) or ()}
        starts.append(i)
    return starts


class _Trimmer:
    """prune_messages' configuration and state: one per call, or one per Runnable."""

    def __init__(
        self,
        *,
        max_tokens: int,
        token_counter: TokenCounterLike,
        include_system: bool,
        start_on: MessageTypes | None,
        end_on: MessageTypes | None,
        strategy: str,
        preserve_last_n: int,
        artifacts: ArtifactStore | str | None,
        compress_threshold: int | None,
        cache_stable: bool,
        repair: bool,
    ) -> None:
        self.max_tokens = _check.integer("max_tokens", max_tokens, minimum=1)
        if strategy not in ("last", "first"):
            raise ConfigError(f"strategy must be 'last' or 'first', got {strategy!r}")
        if strategy == "first" and start_on:
            raise ConfigError("start_on is only valid with strategy='last'")
        self.strategy = strategy
        if not isinstance(include_system, bool):
            raise InvalidTypeError(f"include_system must be True or False, got {include_system!r}")
        self.include_system = include_system
        self.start_on = _types(start_on, "start_on")
        self.end_on = _types(end_on, "end_on")
        self.fn = _list_counter(token_counter)
        self._originals: dict[int, tuple[BaseMessage, Message]] = {}
        if self.fn is not None:
            self.counter: TokenCounter = _CallableCounter(self.fn, self._to_lc)
        elif isinstance(token_counter, TokenCounter):
            self.counter = token_counter
        else:
            self.counter = get_counter(_check.optional_text("token_counter", token_counter))
        self.preserve_last_n = _check.integer("preserve_last_n", preserve_last_n, minimum=0)
        self.artifacts = _artifacts(artifacts)
        self.compress_threshold = _check.optional_integer(
            "compress_threshold", compress_threshold, minimum=0
        )
        self.cache_stable = cache_stable
        self.repair = repair
        self.last_report: PruneReport | None = None
        self._pruners: dict[int, TokenPruner] = {}
        self._converter = _Converter()
        self._lock = threading.Lock()

    def _to_lc(self, m: Message) -> BaseMessage:
        return _to_lc(m, self._originals)

    def pruner(self, budget: int) -> TokenPruner:
        pruner = self._pruners.get(budget)
        if pruner is None:
            if len(self._pruners) >= 16:
                self._pruners.pop(next(iter(self._pruners)))
            pruner = self._pruners[budget] = TokenPruner(
                budget,
                self.preserve_last_n,
                self.counter,
                self.artifacts,
                compress_threshold=self.compress_threshold,
                cache_stable=self.cache_stable,
                repair=self.repair,
            )
        return pruner

    def count(self, messages: list[BaseMessage]) -> int:
        """Tokens of a LangChain prompt with this trimmer's counter."""
        if self.fn is not None:
            return self.fn(messages)
        return self.counter.count_messages(self._converter.convert(messages)[0])

    def __call__(self, messages: Any) -> list[BaseMessage]:
        lcs = _lc_messages(messages)
        with self._lock:
            if self.strategy == "first":
                return self._first(lcs)
            if self.end_on is not None:
                lcs = lcs[: self._end(lcs)]
            lead: BaseMessage | None = None
            if not self.include_system and lcs and isinstance(lcs[0], SystemMessage):
                lead, lcs = lcs[0], lcs[1:]
            if not lcs:
                out: list[BaseMessage] = []
            else:
                out = self.fit(lcs, self.max_tokens)[0]
            if (
                lead is not None
                and len(out) == len(lcs)
                and all(map(_same, out, lcs))
                and self.count([lead, *out]) <= self.max_tokens
            ):
                out = [lead, *out]
            if self.start_on is not None:
                out = self._start(out)
            return out

    def fit(
        self, lcs: list[BaseMessage], budget: int, limit: int | None = None
    ) -> tuple[list[BaseMessage], PruneReport]:
        """Prune ``lcs`` to ``budget``; with a LangChain counter, check the output with it and
        prune tighter until it is within ``limit`` (default ``budget``).
        """
        limit = budget if limit is None else limit
        cms, self._originals = self._converter.convert(lcs)
        while True:
            kept, report = self.pruner(budget).prune_with_report(cms)
            out = [self._to_lc(m) for m in kept]
            self.last_report = report
            if self.fn is None:
                return out, report
            total = self.fn(out)
            if total <= limit:
                return out, report
            budget -= total - limit
            if budget < 1:
                raise BudgetExceededError(
                    budget=limit, required=total, blocking=["the messages that are never dropped"]
                )

    def _end(self, lcs: list[BaseMessage]) -> int:
        assert self.end_on is not None
        starts = _unit_starts(lcs)
        for i in range(len(lcs) - 1, -1, -1):
            if _is(lcs[i], self.end_on):
                j = i + 1  # the cut is after the whole unit of the match
                while j < len(lcs) and starts[j] == starts[i]:
                    j += 1
                return j
        return 0

    def _start(self, out: list[BaseMessage]) -> list[BaseMessage]:
        assert self.start_on is not None
        starts = _unit_starts(out)
        first = next((starts[i] for i, m in enumerate(out) if _is(m, self.start_on)), len(out))
        lead = 1 if self.include_system and out and isinstance(out[0], SystemMessage) else 0
        first = max(first, lead)
        return (
            out[:lead] + [m for m in out[lead:first] if isinstance(m, SystemMessage)] + out[first:]
        )

    def _first(self, lcs: list[BaseMessage]) -> list[BaseMessage]:
        starts = _unit_starts(lcs)
        end = 0
        i = 0
        while i < len(lcs):
            j = i + 1
            while j < len(lcs) and starts[j] == i:
                j += 1
            if self.count(lcs[:j]) > self.max_tokens:
                break
            end = i = j
        out = lcs[:end]
        if self.end_on is not None:
            out = out[: self._end(out)]
        return out


def _same(a: BaseMessage, b: BaseMessage) -> bool:
    return a is b


def _artifacts(artifacts: ArtifactStore | str | None) -> ArtifactStore:
    if artifacts is None:
        return MemoryArtifactStore()
    if isinstance(artifacts, str):
        return open_artifacts(artifacts)
    return cast(
        "ArtifactStore",
        _check.instance("artifacts", artifacts, ArtifactStore, "an ArtifactStore or a URL"),
    )


@overload
def prune_messages(
    messages: None = None,
    *,
    max_tokens: int,
    token_counter: TokenCounterLike = None,
    include_system: bool = True,
    start_on: MessageTypes | None = None,
    end_on: MessageTypes | None = None,
    strategy: Literal["first", "last"] = "last",
    preserve_last_n: int = 6,
    artifacts: ArtifactStore | str | None = None,
    compress_threshold: int | None = None,
    cache_stable: bool = False,
    repair: bool = True,
    allow_partial: bool = False,
    text_splitter: None = None,
) -> Runnable[MessagesInput, list[BaseMessage]]: ...


@overload
def prune_messages(
    messages: MessagesInput,
    *,
    max_tokens: int,
    token_counter: TokenCounterLike = None,
    include_system: bool = True,
    start_on: MessageTypes | None = None,
    end_on: MessageTypes | None = None,
    strategy: Literal["first", "last"] = "last",
    preserve_last_n: int = 6,
    artifacts: ArtifactStore | str | None = None,
    compress_threshold: int | None = None,
    cache_stable: bool = False,
    repair: bool = True,
    allow_partial: bool = False,
    text_splitter: None = None,
) -> list[BaseMessage]: ...


def prune_messages(
    messages: MessagesInput | None = None,
    *,
    max_tokens: int,
    token_counter: TokenCounterLike = None,
    include_system: bool = True,
    start_on: MessageTypes | None = None,
    end_on: MessageTypes | None = None,
    strategy: Literal["first", "last"] = "last",
    preserve_last_n: int = 6,
    artifacts: ArtifactStore | str | None = None,
    compress_threshold: int | None = None,
    cache_stable: bool = False,
    repair: bool = True,
    allow_partial: bool = False,
    text_splitter: None = None,
) -> list[BaseMessage] | Runnable[MessagesInput, list[BaseMessage]]:
    """``trim_messages`` with ctxkeep's guarantees: never a broken tool sequence, an exact budget.

    Called with messages it returns the messages that fit; called without, a ``Runnable``
    that does (``prompt | prune_messages(max_tokens=4000) | model``). One Runnable keeps its
    token counts and compressed forms between calls (a growing history costs its new
    messages) and serialises its calls.

    What differs from ``trim_messages``, on purpose:

    * Units, not messages: an ``AIMessage`` with tool calls and its ``ToolMessage`` results are
      kept or dropped together, so the output is always a sequence a provider accepts. A
      trailing call whose results have not arrived is left out; a damaged history is repaired
      (``repair``: a missing result gets a "no result" ``ToolMessage``, an orphan result is
      dropped). ``end_on`` / ``start_on`` cut after / before the whole unit of the matching
      message.
    * Compression before dropping: an old tool output that does not fit is sent as its head
      and tail and the ref of its full text, stored in ``artifacts``; the ``ToolMessage``
      carries ``response_metadata["ctxkeep"]`` (``artifact_ref``, ``original_chars``).
    * System messages are always kept and ``include_system`` defaults to True; with False a
      leading ``SystemMessage`` is kept only when everything else is (as trim_messages does).
      The newest ``HumanMessage`` is never dropped either: when it and the system messages
      alone do not fit, :class:`~ctxkeep.errors.BudgetExceededError` says by how much.
    * ``allow_partial`` and ``text_splitter`` (cutting a message's text) lose text, so they
      are refused: compression keeps the whole text in the artifact store instead.

    Args:
        messages: ``BaseMessage`` objects, or anything ``convert_to_messages`` reads (tuples,
            strings, OpenAI dicts, a ``PromptValue``). Never mutated; a message that is kept
            unchanged is the very object given.
        max_tokens: the most tokens the output may count (>= 1).
        token_counter: ``None`` (ctxkeep's exact default encoding, o200k_base), an encoding or
            model name for :func:`~ctxkeep.get_counter`, a :class:`~ctxkeep.TokenCounter`,
            ``"approximate"`` (LangChain's ``count_tokens_approximately``), a function of a
            message list or of one message, or a model (its
            ``get_num_tokens_from_messages``). A LangChain function is used as
            trim_messages uses it: the output's count *by that function*, on the whole
            list, is at most ``max_tokens`` (the pruner plans with per-message counts and
            prunes again, tighter, if the function is not additive).
        include_system: always keep a leading ``SystemMessage`` (see above).
        start_on: message types the output (after any leading system message) starts on.
        end_on: message types the input is cut after before pruning (``strategy="last"``)
            or the output after (``"first"``).
        strategy: ``"last"`` (ctxkeep's pruner) or ``"first"`` (the oldest whole units that
            fit, nothing compressed).
        preserve_last_n: conversation messages kept in full when they fit (a preference).
        artifacts: where compressed outputs' full texts go (a store or an
            :func:`~ctxkeep.open_artifacts` URL; default: a memory store of this call or
            Runnable).
        compress_threshold: old tool outputs over this many tokens are compressed even when
            they fit; ``None`` (the default) compresses only what would not fit otherwise.
        cache_stable: the pruner's cache-stable mode (prune in jumps so consecutive prompts
            share a prefix); off by default, as trim_messages fills the budget every call.
        repair: repair a damaged tool sequence rather than raise.
        allow_partial: must be False (see above).
        text_splitter: must be None (see above).

    Raises:
        BudgetExceededError: the system messages and the newest human message do not fit.
        InvalidMessageError: a message ctxkeep cannot read (a tool call without an id...).
        ConfigError / InvalidTypeError: a bad argument.

    """
    if allow_partial or text_splitter is not None:
        raise ConfigError(
            "allow_partial and text_splitter cut a message's text and lose the rest; "
            "prune_messages compresses old tool outputs instead (their full text goes to "
            "the artifact store): drop these arguments"
        )
    trimmer = _Trimmer(
        max_tokens=max_tokens,
        token_counter=token_counter,
        include_system=include_system,
        start_on=start_on,
        end_on=end_on,
        strategy=strategy,
        preserve_last_n=preserve_last_n,
        artifacts=artifacts,
        compress_threshold=compress_threshold,
        cache_stable=cache_stable,
        repair=repair,
    )
    if messages is None:
        return RunnableLambda(trimmer, name="prune_messages")
    return trimmer(messages)


# -- chat message history ------------------------------------------------------------------


class CtxkeepChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history kept in ctxkeep session memory.

    Give it to ``RunnableWithMessageHistory``::

        RunnableWithMessageHistory(
            chain, lambda sid: CtxkeepChatMessageHistory(sid, "redis://127.0.0.1:6379/0")
        )

    Messages are stored as ctxkeep messages with their LangChain data
    (:func:`to_ctxkeep_messages`), so they read back equal; the session's
    :class:`~ctxkeep.MemoryConfig` bounds the history (idle TTL, LRU beyond ``max_sessions``,
    ``max_history`` trimmed in whole tool units). The stored history is always a valid
    sequence: a ``ToolMessage`` must answer a call still waiting, and nothing else may follow
    a call before its results (``OrphanToolResultError`` / ``MissingToolResultError``).
    An expired session reads as empty; the next add starts it again.

    Args:
        session_id: the conversation's id; also the ctxkeep session's id.
        url: an :func:`~ctxkeep.open_memory` URL; ``None`` is the embedded SQLite file.
        config: the bounds when this history opens the store itself.
        memory: an open manager to use instead of ``url`` (the caller closes it).
        agent_id: the ``agent_id`` of the ctxkeep session created on first add.

    """

    def __init__(
        self,
        session_id: str,
        url: str | None = None,
        *,
        config: MemoryConfig | None = None,
        memory: MemoryManager | None = None,
        agent_id: str = "langchain",
    ) -> None:
        self.session_id = _check.text("session_id", session_id)
        if memory is not None and url is not None:
            raise ConfigError("pass either url or memory, not both")
        if memory is not None:
            _check.instance("memory", memory, MemoryManager, "a MemoryManager")
        self.agent_id = _check.text("agent_id", agent_id)
        self._owns_memory = memory is None
        self.memory: MemoryManager = memory if memory is not None else open_memory(url, config)

    # The base declares an attribute; LangChain's own histories override it with a property.
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The history, oldest first (copies)."""
        try:
            stored = self.memory.get_messages(self.session_id)
        except SessionNotFoundError:
            return []
        return from_ctxkeep_messages(stored)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` atomically, creating the session on first use.

        Raises:
            InvalidMessageError: a message ctxkeep cannot store (non-JSON data...).
            OrphanToolResultError / MissingToolResultError: a broken tool sequence.

        """
        batch = to_ctxkeep_messages(list(messages))
        if not batch:
            return
        self._ensure_session()
        try:
            self.memory.add_messages(self.session_id, batch)
        except SessionNotFoundError:  # expired or cleared since the check: start anew
            self._ensure_session()
            self.memory.add_messages(self.session_id, batch)

    def clear(self) -> None:
        """Delete the history (the ctxkeep session)."""
        self.memory.delete_session(self.session_id)

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages` (storage I/O in a worker thread)."""
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages`."""
        await asyncio.to_thread(self.add_messages, list(messages))

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        await asyncio.to_thread(self.clear)

    def close(self) -> None:
        """Close the store if this history opened it."""
        if self._owns_memory:
            self.memory.close()

    def _ensure_session(self) -> None:
        if self.memory.has_session(self.session_id):
            return
        with contextlib.suppress(SessionExistsError):  # another process was first
            self.memory.create_session(self.agent_id, session_id=self.session_id)


# -- agent middleware ----------------------------------------------------------------------


@dataclass
class ContextReport:
    """What one model call of :class:`ContextMiddleware` sent, and why."""

    budget: int
    """The window: the most the system prompt, tool definitions and messages may count."""
    tokens_sent: int
    """Tokens of the system prompt (recall included), messages and tool definitions sent."""
    tools_tokens: int
    """The tool definitions, counted as their OpenAI JSON."""
    recalled: int
    """Episodes recalled into the system prompt."""
    messages_in: int
    """Messages in the request (the system prompt not included)."""
    messages_out: int
    """Messages sent (the system prompt not included)."""
    prune: PruneReport = field(repr=False)
    """The pruner's report (the system prompt is message 0 when there is one)."""


class ContextMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Fits every model call of a LangChain v1 agent into the model's window.

    Before each call (``wrap_model_call``) the request's system prompt, tool definitions and
    messages are counted exactly and the messages pruned as :func:`prune_messages` does: an
    ``AIMessage``'s tool calls never go without their results, old tool outputs are
    compressed (their full text in ``artifacts``, readable with :attr:`read_artifact`),
    older history is dropped in whole units. The agent's state keeps every message: only
    what the model is sent is pruned.

    With an ``episodic`` store, the newest human message is the query for past runs: the best
    relevant ones are appended to the system prompt under ``### Prior Historical Context``
    (fenced, labelled as data; recall gives way when the conversation needs the room), and
    when the run ends (``after_agent``) it is saved as an episode: its goal is the newest
    human message, its summary ``summarize(messages after it)`` (by default the tools called
    and the final answer), its session the run's thread id.

    Args:
        max_tokens: the window (>= 1); ``None`` reads ``max_input_tokens`` from the model's
            profile at each call.
        preserve_last_n: conversation messages kept in full when they fit.
        counter: a :class:`~ctxkeep.TokenCounter` or a name for :func:`~ctxkeep.get_counter`.
        artifacts: where compressed outputs are kept (a store or URL; default: in memory).
        compress_threshold: old tool outputs over this many tokens are sent compressed;
            ``None`` compresses only what would not fit.
        cache_stable: the pruner's cache-stable mode (default on: consecutive calls share a
            prompt prefix, which provider caches discount).
        episodic: an episodic store to recall from and save runs to.
        recall_top_k: episodes recalled at most.
        max_prior_tokens: the most tokens the recalled block may take.
        recall_min_score: recall an episode only with lexical evidence and at least this
            score (:meth:`~ctxkeep.Hit.is_relevant`); None takes the best hits.
        recall_filters: filters for the episodic search.
        save_episodes: save each run as an episode (with ``episodic``).
        summarize: makes an episode's summary from the messages the run added.
        agent_id: the ``agent_id`` episodes are saved under.
        count_tools: count the tool definitions in the window.

    Attributes:
        last_report: the :class:`ContextReport` of the latest call (None before the first).

    """

    def __init__(
        self,
        max_tokens: int | None = None,
        *,
        preserve_last_n: int = 6,
        counter: TokenCounter | str | None = None,
        artifacts: ArtifactStore | str | None = None,
        compress_threshold: int | None = 256,
        cache_stable: bool | None = None,
        episodic: EpisodicMemoryStore | None = None,
        recall_top_k: int = 3,
        max_prior_tokens: int = 1500,
        recall_min_score: float | None = 0.0,
        recall_filters: Mapping[str, Any] | None = None,
        save_episodes: bool = True,
        summarize: Callable[[list[BaseMessage]], str] | None = None,
        agent_id: str = "langchain-agent",
        count_tools: bool = True,
    ) -> None:
        self.max_tokens = _check.optional_integer("max_tokens", max_tokens, minimum=1)
        if counter is not None and not isinstance(counter, TokenCounter | str):
            raise InvalidTypeError(f"counter must be a TokenCounter or a name, got {counter!r}")
        if cache_stable is not None and not isinstance(cache_stable, bool):
            raise InvalidTypeError(f"cache_stable must be True, False or None: {cache_stable!r}")
        self._trimmer = _Trimmer(
            max_tokens=1,
            token_counter=counter,
            include_system=True,
            start_on=None,
            end_on=None,
            strategy="last",
            preserve_last_n=preserve_last_n,
            artifacts=artifacts,
            compress_threshold=compress_threshold,
            cache_stable=True if cache_stable is None else cache_stable,
            repair=True,
        )
        self.counter = self._trimmer.counter
        self.artifacts = self._trimmer.artifacts
        if episodic is not None:
            _check.has_method("episodic", episodic, "search", "an episodic store")
        self.episodic = episodic
        self.recall_top_k = _check.integer("recall_top_k", recall_top_k, minimum=1)
        self.max_prior_tokens = _check.integer("max_prior_tokens", max_prior_tokens, minimum=0)
        self.recall_min_score = (
            None
            if recall_min_score is None
            else _check.number("recall_min_score", recall_min_score)
        )
        self.recall_filters = (
            None if recall_filters is None else _check.mapping("recall_filters", recall_filters)
        )
        for name, flag in (("save_episodes", save_episodes), ("count_tools", count_tools)):
            if not isinstance(flag, bool):
                raise InvalidTypeError(f"{name} must be True or False, got {flag!r}")
        self.save_episodes = save_episodes
        self.count_tools = count_tools
        if summarize is not None and not callable(summarize):
            raise InvalidTypeError(f"summarize must be a function, got {describe(summarize)}")
        self.summarize = summarize or _default_summary
        self.agent_id = _check.text("agent_id", agent_id)
        self.tools: list[BaseTool] = []
        self.last_report: ContextReport | None = None
        self._tools_cache: dict[tuple[int, ...], tuple[list[Any], int]] = {}

    # -- the hooks -----------------------------------------------------------------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Send the model the request fitted into the window."""
        return handler(self.fit_request(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]:
        """Async :meth:`wrap_model_call` (counting and recall in a worker thread)."""
        return await handler(await asyncio.to_thread(self.fit_request, request))

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Save the run as an episode (with an episodic store and ``save_episodes``)."""
        self.save_run(state.get("messages", []), _thread_id(runtime))
        return None

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async :meth:`after_agent`."""
        await asyncio.to_thread(self.save_run, state.get("messages", []), _thread_id(runtime))
        return None

    # -- the work ------------------------------------------------------------------------------

    def fit_request(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """The request with its messages pruned (and recall added) to fit the window.

        Raises:
            BudgetExceededError: the system prompt, tool definitions and newest human message
                alone do not fit.
            ConfigError: no ``max_tokens`` and no ``max_input_tokens`` in the model's profile.

        """
        window = self.max_tokens or _profile_window(request.model)
        tools_tokens = self._tools_tokens(request.tools) if self.count_tools else 0
        budget = window - tools_tokens
        if budget < 1:
            raise BudgetExceededError(
                budget=window,
                required=tools_tokens,
                blocking=[f"the tool definitions ({tools_tokens} tokens)"],
            )
        system = request.system_message
        hits, prior = self._recall(request.messages)
        with self._trimmer._lock:
            try:
                sent_system = _with_prior(system, prior)
                out, report = self._fit(sent_system, request.messages, budget)
            except BudgetExceededError:
                if not prior:
                    raise
                hits, sent_system = [], system  # recall gives way to the conversation
                out, report = self._fit(sent_system, request.messages, budget)
        if sent_system is not None and out and out[0] is sent_system:
            messages = out[1:]
        else:  # a system prompt with no content is dropped, as the pruner drops any
            messages, sent_system = out, None
        self.last_report = ContextReport(
            budget=window,
            tokens_sent=report.tokens_after + tools_tokens,
            tools_tokens=tools_tokens,
            recalled=len(hits),
            messages_in=len(request.messages),
            messages_out=len(messages),
            prune=report,
        )
        return request.override(system_message=sent_system, messages=cast("Any", messages))

    def _fit(
        self, system: SystemMessage | None, messages: list[AnyMessage], budget: int
    ) -> tuple[list[BaseMessage], PruneReport]:
        head: list[BaseMessage] = [system] if system is not None else []
        return self._trimmer.fit([*head, *messages], budget)

    def save_run(
        self, messages: Sequence[BaseMessage], session_id: str | None = None
    ) -> str | None:
        """Save the run that ended with ``messages`` as an episode; returns its id (None when
        there is no store, saving is off, or the run added nothing after a human message).
        """
        if self.episodic is None or not self.save_episodes:
            return None
        last = next(
            (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)),
            None,
        )
        if last is None or last == len(messages) - 1:
            return None
        goal = messages[last].text
        summary = self.summarize(list(messages[last + 1 :]))
        if not goal.strip() or not summary.strip():
            return None
        return self.episodic.save_episode(
            session_id or uuid.uuid4().hex,
            goal,
            summary,
            agent_id=self.agent_id,
            metadata={"source": "langchain"},
        )

    @property
    def read_artifact(self) -> BaseTool:
        """The ``read_artifact`` tool over this middleware's artifact store: give it to the
        agent (``create_agent(model, [*tools, mw.read_artifact], ...)``) so it can read a
        compressed output back in full.
        """
        from ctxkeep.artifacts import READ_ARTIFACT_TOOL, read_artifact_tool
        from ctxkeep.errors import ArtifactNotFoundError

        store = self.artifacts
        spec = READ_ARTIFACT_TOOL["function"]

        def read(ref: str, offset: int = 0, limit: int = 8000) -> str:
            args = json.dumps({"ref": ref, "offset": offset, "limit": limit})
            try:
                return read_artifact_tool(store, args)
            except (InvalidMessageError, ArtifactNotFoundError) as exc:
                return json.dumps({"error": str(exc)})

        return StructuredTool.from_function(
            read, name=spec["name"], description=spec["description"]
        )

    def _tools_tokens(self, tools: Sequence[Any]) -> int:
        key = tuple(id(t) for t in tools)
        hit = self._tools_cache.get(key)
        if hit is None:
            # The entry holds the tools, so the ids in its key stay theirs.
            hit = (list(tools), self.counter.count_text(tools_json(tools)))
            if len(self._tools_cache) >= 16:
                self._tools_cache.pop(next(iter(self._tools_cache)))
            self._tools_cache[key] = hit
        return hit[1]

    def _recall(self, messages: Sequence[BaseMessage]) -> tuple[list[Hit], str]:
        if self.episodic is None or self.max_prior_tokens == 0:
            return [], ""
        query = next((m.text for m in reversed(messages) if isinstance(m, HumanMessage)), "")
        if not query.strip():
            return [], ""
        from ctxkeep.builder.sections import fit_hits

        found = self.episodic.search(query, self.recall_top_k * 3, filters=self.recall_filters)
        relevant = [
            h
            for h in found
            if self.recall_min_score is None or h.is_relevant(self.recall_min_score)
        ][: self.recall_top_k]
        section, n, _ = fit_hits(relevant, self.max_prior_tokens, self.counter.count_message)
        if section is None or n == 0:
            return [], ""
        return relevant[:n], section.text


def tools_json(tools: Sequence[Any]) -> str:
    """Tool definitions as the text :class:`ContextMiddleware` counts for them."""
    specs = [convert_to_openai_tool(t) for t in tools]
    return json.dumps(specs, ensure_ascii=False, sort_keys=True) if specs else ""


def _with_prior(system: SystemMessage | None, prior: str) -> SystemMessage | None:
    if not prior:
        return system
    if system is None:
        return SystemMessage(prior)
    if isinstance(system.content, str):
        text = f"{system.content}\n\n{prior}" if system.content else prior
        return system.model_copy(update={"content": text})
    return system.model_copy(update={"content": [*system.content, {"type": "text", "text": prior}]})


def _profile_window(model: Any) -> int:
    profile = getattr(model, "profile", None)
    window = profile.get("max_input_tokens") if isinstance(profile, Mapping) else None
    if isinstance(window, int) and not isinstance(window, bool) and window > 0:
        return window
    raise ConfigError(
        f"ContextMiddleware needs max_tokens: the model {type(model).__name__} has no "
        "max_input_tokens in its profile"
    )


def _thread_id(runtime: Any) -> str | None:
    info = getattr(runtime, "execution_info", None)
    for name in ("thread_id", "run_id"):
        value = getattr(info, name, None)
        if isinstance(value, str) and value:
            return value
    return None


def _default_summary(messages: list[BaseMessage]) -> str:
    """The tools a run called (with how often) and its final answer."""
    calls: Counter[str] = Counter()
    answer = ""
    for m in messages:
        if isinstance(m, AIMessage):
            calls.update(tc["name"] for tc in m.tool_calls)
            if not m.tool_calls and m.text.strip():
                answer = m.text.strip()
    lines = []
    if calls:
        lines.append("Tools used: " + ", ".join(f"{n} x{k}" for n, k in calls.most_common()))
    if answer:
        lines.append("Answer: " + (answer if len(answer) <= 2000 else answer[:2000] + " [...]"))
    return "\n".join(lines)

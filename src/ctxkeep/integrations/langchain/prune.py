"""prune_messages: LangChain's ``trim_messages`` with ctxkeep's guarantees.

:func:`prune_messages` (a list of messages, or a ``Runnable`` when called without) reads its
arguments into a :class:`_Trimmer`, which converts the messages (:mod:`.convert`), counts them
(:mod:`.count`), prunes them with ctxkeep's :class:`~ctxkeep.prune.TokenPruner` and gives back
LangChain messages, the unchanged ones as the very objects given. :class:`.ContextMiddleware`
fits each model call with a :class:`_Trimmer` too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias, overload

from ctxkeep import _check
from ctxkeep.artifacts import ArtifactStore, as_artifact_store
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidTypeError,
    MissingDependencyError,
    describe,
)
from ctxkeep.integrations.langchain.convert import (
    MessagesInput,
    _Converter,
    _lc_messages,
    _to_lc,
)
from ctxkeep.integrations.langchain.count import _CallableCounter, _list_counter
from ctxkeep.messages import Message
from ctxkeep.prune import PruneReport, TokenPruner
from ctxkeep.tokens import TokenCounter, get_counter

try:
    from langchain_core.messages import BaseMessage, SystemMessage, ToolMessage
    from langchain_core.runnables import Runnable, RunnableLambda
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langchain", "langchain") from exc

__all__ = ["MessageTypes", "TokenCounterLike", "prune_messages"]

MessageTypes: TypeAlias = str | type[BaseMessage] | Sequence[str | type[BaseMessage]]
TokenCounterLike: TypeAlias = (
    TokenCounter | str | Callable[[list[BaseMessage]], int] | Callable[[BaseMessage], int] | Any
)


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
        keep_first: int = 0,
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
        self.artifacts = as_artifact_store(artifacts)
        self.compress_threshold = _check.optional_integer(
            "compress_threshold", compress_threshold, minimum=0
        )
        self.cache_stable = cache_stable
        self.repair = repair
        self.keep_first = _check.integer("keep_first", keep_first, minimum=0)
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
                keep_first=self.keep_first,
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
    keep_first: int = 0,
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
    keep_first: int = 0,
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
    keep_first: int = 0,
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
        keep_first: the conversation's head kept in every output (the first human message
            and ``keep_first - 1`` units after it: an agent's task statement); 0, the
            default, prunes it as trim_messages would. :class:`ContextMiddleware` keeps 1.
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
        keep_first=keep_first,
    )
    if messages is None:
        return RunnableLambda(trimmer, name="prune_messages")
    return trimmer(messages)

"""The pruner: what of a history goes into this prompt, within an exact token budget.

Rules, in the order they apply:

1. History is cut into **units**: an assistant message with ``tool_calls`` together with all
   of its results is one unit; any other message is a unit of its own. Units are kept,
   compressed or dropped whole, so the output is always a valid provider sequence (a damaged
   input is repaired on the way, and each repair reported: see ``repair``). An assistant
   message's Anthropic thinking blocks are content parts of it, so they stay with its tool
   calls, unchanged: compression only ever rewrites tool outputs (and, as a last resort, the
   newest user message).
2. System (and developer) messages are always kept, in place.
3. The units holding the last ``preserve_last_n`` conversation messages are the **recent**
   units; the newest user message is **pinned** wherever it is.
4. If system + recent + pinned fit the budget, older units are added newest first while they
   fit. Old tool outputs over ``compress_threshold`` tokens are compressed (head and tail
   excerpt plus a ref to the full text in an :class:`~ctxkeep.artifacts.ArtifactStore`); a unit
   that does not fit even compressed ends the history: it and everything older is dropped
   (optionally replaced by one summary message).
5. If they do not fit, recent tool outputs are compressed oldest first, then the oldest recent
   units are dropped; system messages and the newest user message are never dropped; if that
   is still too much, :class:`~ctxkeep.errors.BudgetExceededError` says by how much and what
   is in the way.

In the **cache-stable mode** (the default; ``cache_stable=False`` turns it off) these rules
apply only at a cut: when the prompt would overflow the budget it is cut down to
``low_water`` of the budget, then each new message is appended as it is until the budget is
full again, so consecutive prompts share their prefix byte for byte (:mod:`ctxkeep.cache`).

The budget counts every output message with its overhead plus the reply priming, with the
configured counter. Token counts are cached per message, so the walk back from the newest
message costs what is kept, not the length of the history; the per-message report is built
only when asked for.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from ctxkeep.artifacts import ArtifactStore, MemoryArtifactStore
from ctxkeep.cache import _StableFolds
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    MissingToolResultError,
    OrphanToolResultError,
    describe,
)
from ctxkeep.messages import (
    SYSTEM_ROLES,
    Message,
    ToolCall,
    coerce_message,
    coerce_messages,
    missing_content,
)
from ctxkeep.tokens import TokenCounter, get_counter

Action: TypeAlias = Literal["kept", "compressed", "dropped", "summarised"]


@runtime_checkable
class Summarizer(Protocol):
    """Writes one summary of messages that are being dropped."""

    def summarize(self, messages: list[Message]) -> str:
        """A summary of ``messages`` (oldest first)."""
        ...


@runtime_checkable
class AsyncSummarizer(Protocol):
    """The async twin of :class:`Summarizer`."""

    async def asummarize(self, messages: list[Message]) -> str:
        """A summary of ``messages`` (oldest first)."""
        ...


@dataclass(frozen=True)
class MessageDecision:
    """What the pruner did with one input message."""

    index: int
    """Position in the input."""
    role: str
    """The message's role."""
    action: Action
    """kept, compressed, dropped, or summarised (dropped, and covered by the summary)."""
    reason: str
    """Why, in a few words."""
    tokens_before: int
    """Tokens of the message as given."""
    tokens_after: int
    """Tokens it takes in the output (0 if dropped)."""
    artifact_ref: str | None = None
    """For a compressed message: where its full text is."""


@dataclass
class PruneReport:
    """What a prune kept, compressed and dropped, why, and the tokens of each section."""

    budget: int
    """The token budget."""
    tokens_after: int
    """Tokens of the output (overhead and reply priming included)."""
    sections: dict[str, int]
    """Output tokens per section: system, history, tools, summary, priming."""
    summary_error: str | None = None
    """Why no summary stands in for dropped history, if a summarizer was given and failed."""
    notes: list[str] = field(default_factory=list)
    """Notable events (recent outputs compressed, recent units dropped, pending calls)."""
    stable_prefix_messages: int | None = None
    """Cache-stable mode: how many leading output messages stay exactly as they are until the
    next cut (what a provider cache written at the cut can hit); None in the default mode."""
    stable_prefix_tokens: int | None = None
    """Cache-stable mode: the tokens of those messages (overhead included)."""
    _messages: Sequence[Message] = field(default=(), repr=False)
    _tokens: Any = field(default=None, repr=False)
    _fates: dict[int, tuple[Action, str, int, str | None]] = field(default_factory=dict, repr=False)
    _default_fate: tuple[Action, str] = field(default=("dropped", "over budget"), repr=False)

    @property
    def decisions(self) -> list[MessageDecision]:
        """One decision per input message, in input order (built on first access)."""
        out = []
        for i, m in enumerate(self._messages):
            before = self._tokens(m)
            fate = self._fates.get(i)
            if fate is None:
                action, reason = self._default_fate
                out.append(MessageDecision(i, m.role, action, reason, before, 0))
            else:
                action, reason, after, ref = fate
                out.append(MessageDecision(i, m.role, action, reason, before, after, ref))
        return out

    @property
    def tokens_before(self) -> int:
        """Tokens of the whole input as a prompt."""
        return int(sum(self._tokens(m) for m in self._messages) + self.sections.get("priming", 0))

    def count(self, action: Action) -> int:
        """How many input messages got ``action``."""
        if action == self._default_fate[0]:
            return len(self._messages) - sum(1 for f in self._fates.values() if f[0] != action)
        return sum(1 for f in self._fates.values() if f[0] == action)

    def summary(self) -> dict[str, Any]:
        """Totals, for logs and ``--json`` output."""
        return {
            "budget": self.budget,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "sections": dict(self.sections),
            "kept": self.count("kept"),
            "compressed": self.count("compressed"),
            "dropped": self.count("dropped"),
            "summarised": self.count("summarised"),
            "summary_error": self.summary_error,
            "notes": list(self.notes),
            "stable_prefix_messages": self.stable_prefix_messages,
            "stable_prefix_tokens": self.stable_prefix_tokens,
        }


_NO_RESULT = "[ctxkeep: no result was recorded for this tool call]"


@dataclass
class _Unit:
    start: int
    members: list[int]  # input indexes, in order
    tool: bool
    pinned: bool = False
    synthetic: list[Message] = field(default_factory=list)  # results made up for missing ones


@dataclass
class _Repairs:
    """What the walk repaired in a damaged history (reported; see ``repair``)."""

    orphans: list[int] = field(default_factory=list)  # tool results with no call: dropped
    empty: set[int] = field(default_factory=set)  # messages with no content: dropped
    originals: dict[int, Message] = field(default_factory=dict)  # input messages replaced
    notes: list[str] = field(default_factory=list)


@dataclass
class _Plan:
    msgs: list[Message]
    system: list[int]
    kept: list[_Unit]  # newest first
    compressed: dict[int, Message]
    dropped_units: list[_Unit]  # units dropped, as far as the walk went
    rest: Any  # the walk's remaining units (all dropped), consumed only when needed
    user_idx: int  # the pinned newest user message, or -1
    pending: _Unit | None
    total: int
    notes: list[str]
    budget_for_summary: int
    fix: _Repairs
    stable_before: int | None = None  # cache-stable: inputs before this index are a stable prefix


@dataclass
class _Fit:
    kept: list[_Unit]
    compressed: dict[int, Message]
    dropped: list[_Unit]
    rest: Any
    pending: _Unit | None
    total: int
    summary_room: int


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {describe(value)}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


class TokenPruner:
    """Fits a history into an exact token budget without breaking tool-call sequences.

    Args:
        max_token_budget: the most tokens the output may count (overhead included; >= 1).
        preserve_last_n: conversation messages to keep in full when they fit (a preference;
            the budget wins; >= 0).
        counter: the token counter (default: ``get_counter()``, o200k_base).
        artifacts: where compressed outputs' full texts go (default: a memory store owned by
            this pruner).
        compress_threshold: old tool outputs over this many tokens (>= 0) are compressed;
            ``None`` compresses an old output only when its unit would not fit otherwise.
        excerpt_tokens: about how many tokens of head and of tail a compressed output keeps
            (>= 0).
        summarizer: optional; writes one message that stands in for dropped history (an
            object with ``summarize(messages)`` or ``async asummarize(messages)``).
        summary_max_tokens: space reserved for the summary when history must be dropped
            (>= 0; with a summarizer, at most ``max_token_budget``).
        repair: make a damaged history valid instead of refusing it, each repair reported in
            the report's notes: a tool call left unanswered before later messages gets a
            synthetic "no result" result; a tool result with no call is dropped; tool calls
            of one message that share an id get distinct ids (``<id>_2``, ...), each result
            renamed with the call it answers, in order; a message with no content (``None``
            or no parts) is dropped, or given ``""`` if it is a tool result. With ``False``
            each of these raises (``MissingToolResultError``, ``OrphanToolResultError``,
            ``InvalidMessageError``).
        compress_oversized_user: when the system messages and the newest user message alone
            exceed the budget, compress that user message (head, tail and an artifact ref)
            rather than refuse; with ``False`` the pruner raises ``BudgetExceededError``.
        cache_stable: prune in jumps so that consecutive prompts of a growing history share
            their prefix byte for byte (what provider prompt caches discount): when the budget
            overflows, cut down to ``low_water`` of it, then append until it is full again.
            The prompt is a pure function of the history (see :mod:`ctxkeep.cache`). The
            default (None) is on, except with a ``summarizer`` (a summary rewritten each turn
            would change the prefix; ``True`` with one is a ``ConfigError``). On the real
            trajectories it halves the Anthropic input cost of the default mode at equal
            validity (BENCHMARKS.md, "Prompt caching"); ``False`` prunes every turn to the
            full budget and reads only what it keeps (the first prune of a long history in
            the cache-stable mode counts every message once).
        low_water: with ``cache_stable``, the fraction of the budget a cut prunes down to
            (0 < low_water <= 1; the recent units and the newest user message are kept even
            above it).

    """

    def __init__(
        self,
        max_token_budget: int = 6000,
        preserve_last_n: int = 6,
        counter: TokenCounter | None = None,
        artifacts: ArtifactStore | None = None,
        *,
        compress_threshold: int | None = 256,
        excerpt_tokens: int = 60,
        summarizer: Summarizer | AsyncSummarizer | None = None,
        summary_max_tokens: int = 400,
        repair: bool = True,
        compress_oversized_user: bool = True,
        cache_stable: bool | None = None,
        low_water: float = 0.7,
    ) -> None:
        _check_int("max_token_budget", max_token_budget, 1)
        _check_int("preserve_last_n", preserve_last_n, 0)
        if compress_threshold is not None:
            _check_int("compress_threshold", compress_threshold, 0)
        _check_int("excerpt_tokens", excerpt_tokens, 0)
        _check_int("summary_max_tokens", summary_max_tokens, 0)
        if summarizer is not None and summary_max_tokens > max_token_budget:
            raise ConfigError(
                f"summary_max_tokens ({summary_max_tokens}) must not exceed max_token_budget "
                f"({max_token_budget}): it is space reserved inside the budget"
            )
        for name, flag in (
            ("repair", repair),
            ("compress_oversized_user", compress_oversized_user),
        ):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name} must be True or False, got {describe(flag)}")
        if counter is not None and not isinstance(counter, TokenCounter):
            raise ConfigError(
                f"counter must be a TokenCounter (see ctxkeep.get_counter), got {describe(counter)}"
            )
        if artifacts is not None and not isinstance(artifacts, ArtifactStore):
            raise ConfigError(
                f"artifacts must be an ArtifactStore (see ctxkeep.open_artifacts), got "
                f"{describe(artifacts)}"
            )
        if summarizer is not None and not (
            callable(getattr(summarizer, "summarize", None))
            or callable(getattr(summarizer, "asummarize", None))
        ):
            raise ConfigError(
                "summarizer must have a summarize(messages) or an async asummarize(messages) "
                f"method, got {describe(summarizer)}"
            )
        self.max_token_budget = max_token_budget
        self.preserve_last_n = preserve_last_n
        self.counter = counter or get_counter()
        self.artifacts: ArtifactStore = (
            artifacts if artifacts is not None else MemoryArtifactStore()
        )
        self.compress_threshold = compress_threshold
        self.excerpt_tokens = excerpt_tokens
        self.summarizer = summarizer
        self.summary_max_tokens = summary_max_tokens
        self.repair = repair
        self.compress_oversized_user = compress_oversized_user
        if (
            isinstance(low_water, bool)
            or not isinstance(low_water, int | float)
            or not 0 < low_water <= 1
        ):
            raise ConfigError(f"low_water must be a number in (0, 1], got {describe(low_water)}")
        if cache_stable is None:
            cache_stable = summarizer is None
        if not isinstance(cache_stable, bool):
            raise ConfigError(f"cache_stable must be True or False, got {describe(cache_stable)}")
        if cache_stable and summarizer is not None:
            raise ConfigError(
                "cache_stable=True does not take a summarizer: a summary rewritten every turn "
                "would change the prompt's prefix every turn"
            )
        self.cache_stable = cache_stable
        self.low_water = float(low_water)
        self._stable = _StableFolds(self) if cache_stable else None
        self._priming = self.counter.count_messages([])
        # The compressed form is cached on the message, keyed by the store object itself (a
        # strong reference: a store's id could be reused after it is collected).
        try:
            hash(self.artifacts)
            store_key: Any = self.artifacts
        except TypeError:
            store_key = None  # unhashable store: the cache is not used
        self._compress_key = ("ctxkeep.compressed", store_key, excerpt_tokens)

    # -- public --------------------------------------------------------------------------

    def prune(self, messages: Sequence[Any]) -> list[Message]:
        """The messages that fit the budget (see the module docstring for the rules)."""
        return self.prune_with_report(messages)[0]

    def prune_with_report(self, messages: Sequence[Any]) -> tuple[list[Message], PruneReport]:
        """Prune, and say what happened to every message.

        Raises:
            BudgetExceededError: system messages and the newest user message alone exceed
                the budget.
            OrphanToolResultError / MissingToolResultError: the input itself is not a valid
                sequence where the pruner has to read it (only with ``repair=False``).
            InvalidMessageError: a malformed message; with ``repair=False`` also a message
                with no content or duplicate tool call ids in one message.

        """
        plan = self._plan_either(messages)
        summary, error = None, None
        if self._wants_summary(plan):
            summarize = getattr(self.summarizer, "summarize", None)
            if summarize is None:
                error = "the summarizer is async only; use aprune / aprune_with_report"
            else:
                try:
                    summary = str(summarize(self._dropped_messages(plan)))
                except Exception as exc:  # a failing summarizer must not lose the prompt
                    error = f"summarizer failed: {type(exc).__name__}: {exc}"
        return self._assemble(plan, summary, error)

    async def aprune(self, messages: Sequence[Any]) -> list[Message]:
        """Async :meth:`prune` (awaits an async summarizer)."""
        return (await self.aprune_with_report(messages))[0]

    async def aprune_with_report(
        self, messages: Sequence[Any]
    ) -> tuple[list[Message], PruneReport]:
        """Async :meth:`prune_with_report` (awaits an async summarizer)."""
        plan = self._plan_either(messages)
        summary, error = None, None
        if self._wants_summary(plan):
            dropped = self._dropped_messages(plan)
            try:
                fn = getattr(self.summarizer, "asummarize", None)
                if fn is not None:
                    summary = str(await fn(dropped))
                else:
                    result: Any = self.summarizer.summarize(dropped)  # type: ignore[union-attr]
                    if inspect.isawaitable(result):
                        result = await _await(result)
                    summary = str(result)
            except Exception as exc:  # a failing summarizer must not lose the prompt
                error = f"summarizer failed: {type(exc).__name__}: {exc}"
        return self._assemble(plan, summary, error)

    def _plan_either(self, messages: Sequence[Any]) -> _Plan:
        plan = self._stable.plan(messages) if self._stable is not None else None
        return plan if plan is not None else self._plan(messages)

    def tokens(self, message: Message) -> int:
        """Tokens of one message with this pruner's counter (cached)."""
        return self.counter.count_message(message)

    # -- compression ---------------------------------------------------------------------

    def compress(self, message: Message) -> Message:
        """The compressed form of a tool output: head, tail, and a ref to the full text.

        The full text is stored in :attr:`artifacts` first, so nothing is lost.
        """
        message = coerce_message(message)
        cache: dict[Any, Message] = message.__dict__.setdefault("_ctxkeep_compressed", {})
        hit = cache.get(self._compress_key) if self._compress_key[1] is not None else None
        if hit is not None:
            return hit
        full = message.text if isinstance(message.content, list) else (message.content or "")
        ref = self.artifacts.put(full)
        chars = max(0, self.excerpt_tokens * 3)
        if len(full) <= 2 * chars + 200:
            head, tail = full[: len(full) // 3], ""
        else:
            head, tail = full[:chars], full[-chars:]
        omitted = len(full) - len(head) - len(tail)
        marker = (
            f"[ctxkeep: {omitted} of {len(full)} characters omitted "
            f"({self.tokens(message)} tokens in full); full output is artifact {ref}: "
            f"call read_artifact to read it]"
        )
        body = "\n".join(p for p in (head, marker, tail) if p)
        meta = dict(message.metadata)
        meta["ctxkeep_compressed"] = {"ref": ref, "original_chars": len(full)}
        out = message.replace(
            content=body,
            artifact_refs=(*message.artifact_refs, ref),
            metadata=meta,
        )
        cache[self._compress_key] = out
        return out

    # -- planning ------------------------------------------------------------------------

    def _units_backwards(
        self,
        msgs: list[Message],
        sys_set: set[int],
        fix: _Repairs,
        lo: int = 0,
        hi: int | None = None,
    ) -> Any:
        """Yield ``(unit, state)`` from the newest back, checking tool sequences as it goes.

        ``state`` is ``"pending"`` for a trailing tool call whose results have not arrived
        (never part of a prompt), else None. With ``repair``, a call left unanswered in the
        middle of the history gets a synthetic result, a result with no call is dropped (its
        index goes to ``fix.orphans``), duplicate call ids of one message are made distinct
        and a message with no content is dropped (a tool result gets ``""``); without it
        each raises. Repaired messages replace their originals in ``msgs`` (the pruner's own
        list; ``fix.originals`` keeps the input's for the report).

        The walk covers ``msgs[lo:hi]`` (``hi`` defaults to the end). ``lo`` must be a unit
        boundary (the cache-stable fold walks only the messages added since its frontier);
        with ``hi`` given, the range ends at a unit boundary too and nothing in it is pending.
        """
        i = (len(msgs) if hi is None else hi) - 1
        first = hi is None
        while i >= lo:
            if i in sys_set:
                i -= 1
                continue
            m = msgs[i]
            if m.role == "tool" or m.tool_calls:
                members: list[int] = []
                while i >= lo and msgs[i].role == "tool":
                    members.append(i)
                    i -= 1
                owner = msgs[i] if i >= lo and i not in sys_set else None
                if owner is None or not owner.tool_calls:
                    # Results with no call right before them.
                    if not self.repair:
                        j = members[-1]
                        raise OrphanToolResultError(
                            f"tool result for {msgs[j].tool_call_id!r} has no assistant tool "
                            "call before it",
                            index=j,
                            tool_call_id=msgs[j].tool_call_id,
                        )
                    fix.orphans.extend(members)
                    continue
                call_ids = [tc.id for tc in owner.tool_calls]
                if len(call_ids) > 1 and len(set(call_ids)) < len(call_ids):
                    call_ids = self._distinct_ids(msgs, i, members, fix)
                answered: set[str] = set()
                kept_members: list[int] = []
                for j in reversed(members):
                    tid = msgs[j].tool_call_id or ""
                    if tid in call_ids and tid not in answered:
                        answered.add(tid)
                        kept_members.append(j)
                        if missing_content(msgs[j]):
                            self._blank(msgs, j, fix)
                    elif self.repair:
                        fix.orphans.append(j)
                    else:
                        raise OrphanToolResultError(
                            f"tool result for {tid!r} does not answer a call of the assistant "
                            f"message {i} before it",
                            index=j,
                            tool_call_id=tid,
                        )
                missing = [c for c in call_ids if c not in answered]
                unit = _Unit(i, [i, *kept_members], tool=True)
                if missing and first:
                    yield unit, "pending"
                elif missing and not self.repair:
                    raise MissingToolResultError(
                        f"assistant tool call {missing[0]!r} has no result",
                        index=i,
                        tool_call_id=missing[0],
                    )
                else:
                    unit.synthetic = [
                        Message(
                            "tool",
                            _NO_RESULT,
                            tool_call_id=c,
                            event_kind="synthetic_tool_result",
                            metadata={"ctxkeep_synthetic": True},
                        )
                        for c in missing
                    ]
                    yield unit, None
                i -= 1
            else:
                if not (missing_content(m) and self._drop_empty(msgs, i, fix)):
                    yield _Unit(i, [i], tool=False), None
                i -= 1
            first = False

    def _distinct_ids(
        self, msgs: list[Message], i: int, members: list[int], fix: _Repairs
    ) -> list[str]:
        """Give the calls of message ``i`` that share an id distinct ids (``<id>_2``...); the
        k-th result for a shared id (in input order) answers its k-th call. Returns the ids.
        """
        owner = msgs[i]
        ids = [tc.id for tc in owner.tool_calls]
        if not self.repair:
            dup = next(c for k, c in enumerate(ids) if c in ids[:k])
            raise InvalidMessageError(
                f"duplicate tool call id {dup!r}: the tool calls of one message need distinct ids",
                index=i,
            )
        taken = set(ids)
        renamed: dict[str, list[str]] = {}  # original id -> the id of each call, in order
        new_ids: list[str] = []
        for c in ids:
            seen = renamed.setdefault(c, [])
            new = c
            n = len(seen) + 1
            while seen and new in taken:
                new = f"{c}_{n}"
                n += 1
            taken.add(new)
            seen.append(new)
            new_ids.append(new)
        fix.originals.setdefault(i, owner)
        msgs[i] = owner.replace(
            tool_calls=[
                ToolCall(id=new, name=tc.name, arguments=tc.arguments)
                for tc, new in zip(owner.tool_calls, new_ids, strict=True)
            ]
        )
        answered: dict[str, int] = {}
        for j in reversed(members):  # input order
            tid = msgs[j].tool_call_id or ""
            targets = renamed.get(tid)
            if targets is None:
                continue
            k = answered.get(tid, 0)
            answered[tid] = k + 1
            if k < len(targets) and targets[k] != tid:
                fix.originals.setdefault(j, msgs[j])
                msgs[j] = msgs[j].replace(tool_call_id=targets[k])
        changes = [
            f"{old!r} -> {new!r}" for old, new in zip(ids, new_ids, strict=True) if old != new
        ]
        fix.notes.append(
            f"gave duplicate tool call ids of message {i} distinct ids ({', '.join(changes)}), "
            "each with its result"
        )
        return new_ids

    def _drop_empty(self, msgs: list[Message], i: int, fix: _Repairs) -> bool:
        """True if message ``i`` has no content and is to be dropped (or raise, no repair)."""
        m = msgs[i]
        if not missing_content(m):
            return False
        if not self.repair:
            raise InvalidMessageError(
                f"a {m.role} message needs content, not {m.content!r}", index=i
            )
        fix.empty.add(i)
        return True

    def _blank(self, msgs: list[Message], j: int, fix: _Repairs) -> None:
        """Give tool result ``j``, which has no content, an empty text (or raise)."""
        if not self.repair:
            raise InvalidMessageError(
                f"a tool message needs content, not {msgs[j].content!r}", index=j
            )
        fix.originals.setdefault(j, msgs[j])
        msgs[j] = msgs[j].replace(content="")
        fix.notes.append(f"gave tool result {j}, which had no content, an empty text")

    def _unit_tokens(self, msgs: list[Message], u: _Unit, compressed: dict[int, Message]) -> int:
        t = self.tokens
        n = sum(t(compressed.get(j, msgs[j])) for j in u.members)
        if u.synthetic:
            n += sum(t(m) for m in u.synthetic)
        return n

    def _compress_unit(
        self, msgs: list[Message], u: _Unit, compressed: dict[int, Message], threshold: int
    ) -> bool:
        changed = False
        for j in u.members:
            m = msgs[j]
            if m.role == "tool" and j not in compressed and self.tokens(m) > threshold:
                c = self.compress(m)
                if self.tokens(c) < self.tokens(m):
                    compressed[j] = c
                    changed = True
        return changed

    def _plan(self, messages: Sequence[Any]) -> _Plan:
        msgs = coerce_messages(messages)
        budget = self.max_token_budget
        roles = [m.role for m in msgs]
        system = [i for i, r in enumerate(roles) if r in SYSTEM_ROLES]
        sys_set = set(system)
        fix = _Repairs()
        if any(missing_content(msgs[i]) for i in system):
            system = [i for i in system if not self._drop_empty(msgs, i, fix)]
        sys_tokens = sum(self.tokens(msgs[i]) for i in system)
        notes: list[str] = []

        walker = self._units_backwards(msgs, sys_set, fix)
        limit = budget - (self.summary_max_tokens if self.summarizer is not None else 0)
        # The newest user message is pinned wherever it is; a reverse scan of roles finds it
        # without walking (and checking) the units in between. One with no content is no
        # message to pin (the walk drops it or raises): the one before it is pinned.
        user_idx = len(roles) - 1 - roles[::-1].index("user") if "user" in roles else -1
        while user_idx >= 0 and missing_content(msgs[user_idx]):
            self._drop_empty(msgs, user_idx, fix)
            user_idx = next((j for j in range(user_idx - 1, -1, -1) if roles[j] == "user"), -1)
        fit = self._fit(msgs, system, sys_tokens, walker, user_idx, limit, {}, notes)
        return _Plan(
            msgs=msgs,
            system=system,
            kept=fit.kept,
            compressed=fit.compressed,
            dropped_units=fit.dropped,
            rest=fit.rest,
            user_idx=user_idx,
            pending=fit.pending,
            total=fit.total,
            notes=notes,
            budget_for_summary=fit.summary_room,
            fix=fix,
        )

    def _fit(
        self,
        msgs: list[Message],
        system: list[int],
        sys_tokens: int,
        walker: Any,
        user_idx: int,
        limit: int,
        compressed: dict[int, Message],
        notes: list[str],
    ) -> _Fit:
        """Choose the units of a prompt from ``walker`` (``(unit, state)``, newest first).

        The recent units and the newest user message (``user_idx``) must fit the budget (recent
        outputs compressed, then the oldest recent units dropped, if not); older units are
        added newest first while the total stays within ``limit``. ``compressed`` holds the
        messages already compressed (the cache-stable mode keeps them so) and is filled in.
        """
        budget = self.max_token_budget
        recent: list[_Unit] = []
        pending: _Unit | None = None
        seen = 0
        pinned_user: _Unit | None = None
        older: list[_Unit] = []  # a unit walked past once the recent ones are complete
        for unit, state in walker:
            if state == "pending":
                pending = unit
                notes.append("dropped a trailing tool call whose results have not arrived")
                continue
            if seen < self.preserve_last_n:
                recent.append(unit)
                seen += len(unit.members)
                if unit.start == user_idx:
                    unit.pinned = True
                continue
            if unit.start == user_idx:
                unit.pinned = True
                pinned_user = unit
            else:
                older.append(unit)
            break
        if user_idx >= 0 and pinned_user is None and not any(u.pinned for u in recent):
            pinned_user = _Unit(user_idx, [user_idx], tool=False, pinned=True)

        must = (
            sys_tokens + self._priming + sum(self._unit_tokens(msgs, u, compressed) for u in recent)
        )
        if pinned_user is not None:
            must += self.tokens(msgs[pinned_user.start])

        dropped: list[_Unit] = []
        rest: Any = None  # the part of the walk not taken yet (all of it dropped)
        kept: list[_Unit] = list(recent)
        if must > budget:
            # Compress recent tool outputs, oldest first, then drop the oldest recent units.
            for u in reversed(recent):
                if must <= budget:
                    break
                if u.tool:
                    before = self._unit_tokens(msgs, u, compressed)
                    if self._compress_unit(msgs, u, compressed, 0):
                        must += self._unit_tokens(msgs, u, compressed) - before
                        notes.append("compressed recent tool output to fit the budget")
            for u in reversed(recent):
                if must <= budget:
                    break
                if u.pinned:
                    continue
                must -= self._unit_tokens(msgs, u, compressed)
                kept.remove(u)
                dropped.append(u)
                for j in u.members:
                    compressed.pop(j, None)
                notes.append("dropped a recent unit to fit the budget")
            user_unit = pinned_user or next((u for u in kept if u.pinned), None)
            if must > budget and self.compress_oversized_user and user_unit is not None:
                j = user_unit.start
                c = self.compress(msgs[j])
                if self.tokens(c) < self.tokens(msgs[j]):
                    must += self.tokens(c) - self.tokens(msgs[j])
                    compressed[j] = c
                    notes.append("compressed the newest user message: alone it exceeds the budget")
            if must > budget:
                blocking = [f"system messages: {sys_tokens} tokens"] if system else []
                blocking += [
                    f"message {u.start} ({msgs[u.start].role}): "
                    f"{self._unit_tokens(msgs, u, compressed)} tokens"
                    for u in kept
                ]
                if pinned_user is not None:
                    j = pinned_user.start
                    blocking.append(
                        f"newest user message {j}: {self.tokens(compressed.get(j, msgs[j]))} tokens"
                    )
                raise BudgetExceededError(budget=budget, required=must, blocking=blocking)

        if pinned_user is not None:
            kept.append(pinned_user)
        total = must
        summary_room = 0
        if not dropped:
            # Fill with older units, newest first; continue the walk past the pinned user.
            candidates = [u for u in older if not u.pinned]
            walking = iter(candidates)
            rest_walker = walker
            stop = False
            while not stop:
                u_next = next(walking, None)
                if u_next is None:
                    nxt = next(rest_walker, None)
                    if nxt is None:
                        break
                    u_next = nxt[0]
                    if u_next.start == user_idx:
                        continue  # the pinned user message, already kept
                u = u_next
                if u.tool and self.compress_threshold is not None:
                    self._compress_unit(msgs, u, compressed, self.compress_threshold)
                cost = self._unit_tokens(msgs, u, compressed)
                if total + cost > limit and u.tool and self._compress_unit(msgs, u, compressed, 0):
                    cost = self._unit_tokens(msgs, u, compressed)
                if total + cost <= limit:
                    kept.append(u)
                    total += cost
                    continue
                for j in u.members:
                    compressed.pop(j, None)
                dropped.append(u)
                stop = True
            if stop:
                # Everything older than the first unit that did not fit is dropped, except
                # the pinned user message (already kept). The rest of the walk is left to
                # be done lazily: only a summary needs it, so a prune costs what it keeps.
                dropped.extend(walking)
                rest = rest_walker
                summary_room = budget - total
        else:
            dropped.extend(u for u in older if not u.pinned)
            rest = walker
            summary_room = budget - total
        return _Fit(kept, compressed, dropped, rest, pending, total, summary_room)

    def _wants_summary(self, plan: _Plan) -> bool:
        return self.summarizer is not None and bool(plan.dropped_units)

    def _all_dropped(self, plan: _Plan) -> list[_Unit]:
        if plan.rest is not None:
            plan.dropped_units.extend(
                u for u, _ in plan.rest if not u.pinned and u.start != plan.user_idx
            )
            plan.rest = None
        return plan.dropped_units

    def _dropped_messages(self, plan: _Plan) -> list[Message]:
        idx = sorted(j for u in self._all_dropped(plan) for j in u.members)
        return [plan.msgs[j].copy() for j in idx]

    # -- output --------------------------------------------------------------------------

    def _assemble(
        self, plan: _Plan, summary: str | None, error: str | None
    ) -> tuple[list[Message], PruneReport]:
        msgs = plan.msgs
        t = self.tokens
        fates: dict[int, tuple[Action, str, int, str | None]] = {}
        sections = {"system": 0, "history": 0, "tools": 0, "summary": 0, "priming": self._priming}
        for i in plan.system:
            n = t(msgs[i])
            fates[i] = ("kept", "system message", n, None)
            sections["system"] += n
        for u in plan.kept:
            if u.start == plan.user_idx:
                reason = "newest user message"
            elif u.pinned:
                reason = "kept for a stable prompt prefix (the newest user message at the last cut)"
            else:
                reason = "fits the budget"
            for j in u.members:
                m = plan.compressed.get(j)
                if m is not None:
                    n = t(m)
                    ref = m.artifact_refs[-1]
                    why = "tool output compressed" if m.role == "tool" else "too long: compressed"
                    fates[j] = ("compressed", why, n, ref)
                else:
                    n = t(msgs[j])
                    fates[j] = ("kept", reason, n, None)
                sections["tools" if msgs[j].role == "tool" else "history"] += n

        summary_msg: Message | None = None
        summary_at = -1
        if summary is not None:
            dropped_idx = [j for u in self._all_dropped(plan) for j in u.members]
            summary_at = min(dropped_idx)
            candidate = Message(
                "user",
                "[Summary of earlier conversation, written by ctxkeep]\n" + summary,
                event_kind="summary",
                metadata={"ctxkeep_summary_of": sorted(dropped_idx)},
            )
            n = t(candidate)
            if n <= plan.budget_for_summary:
                summary_msg = candidate
                sections["summary"] = n
                for j in dropped_idx:
                    fates[j] = ("summarised", "dropped; covered by the summary", 0, None)
            else:
                error = (
                    f"summary of {n} tokens did not fit the {plan.budget_for_summary} tokens "
                    "left; dropped history is not summarised"
                )
        if plan.pending is not None:
            for j in plan.pending.members:
                fates[j] = ("dropped", "tool call still waiting for its results", 0, None)

        fix = plan.fix
        for j in fix.orphans:
            fates[j] = ("dropped", "tool result with no matching call", 0, None)
        if fix.orphans:
            plan.notes.append(f"dropped {len(fix.orphans)} tool result(s) with no call")
        for j in fix.empty:
            fates[j] = ("dropped", "message with no content", 0, None)
        if fix.empty:
            plan.notes.append(
                f"dropped {len(fix.empty)} message(s) with no content: "
                + ", ".join(str(j) for j in sorted(fix.empty))
            )
        plan.notes.extend(fix.notes)
        entries: list[tuple[float, Message]] = [(i, msgs[i]) for i in plan.system]
        for u in plan.kept:
            for j in u.members:
                entries.append((j, plan.compressed.get(j, msgs[j])))
            for k, m in enumerate(u.synthetic):
                entries.append((u.members[-1] + (k + 1) / (len(u.synthetic) + 1), m))
                n = t(m)
                sections["tools"] += n
            if u.synthetic:
                plan.notes.append(
                    f"added {len(u.synthetic)} synthetic result(s) for unanswered tool calls "
                    f"of message {u.start}"
                )
        if summary_msg is not None:
            entries.append((summary_at - 0.5, summary_msg))
        entries.sort(key=lambda e: e[0])
        out = [m.copy() for _, m in entries]
        stable_n = stable_t = None
        if plan.stable_before is not None:
            stable_n = sum(1 for i, _ in entries if i < plan.stable_before)
            stable_t = sum(t(m) for _, m in entries[:stable_n])
        total = sum(sections.values())
        if total > self.max_token_budget:  # pragma: no cover - a bug, never an input
            raise AssertionError(f"pruner produced {total} > {self.max_token_budget} tokens")
        report = PruneReport(
            budget=self.max_token_budget,
            tokens_after=total,
            sections=sections,
            summary_error=error,
            notes=plan.notes,
            _messages=_with_originals(msgs, fix.originals),
            _tokens=t,
            _fates=fates,
            _default_fate=("dropped", "older history over the budget"),
            stable_prefix_messages=stable_n,
            stable_prefix_tokens=stable_t,
        )
        return out, report


def _with_originals(msgs: list[Message], originals: dict[int, Message]) -> list[Message]:
    """The input as given: repaired messages replaced by their originals (for the report)."""
    if not originals:
        return msgs
    out = list(msgs)
    for j, m in originals.items():
        out[j] = m
    return out


async def _await(x: Awaitable[Any]) -> Any:
    return await x


__all__ = [
    "AsyncSummarizer",
    "MessageDecision",
    "PruneReport",
    "Summarizer",
    "TokenPruner",
]

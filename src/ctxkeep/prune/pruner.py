"""TokenPruner: the configured pruner, its entry points and the output step.

A prune takes three steps: a **plan** (the units kept and the messages compressed, by the
pruner's :attr:`~TokenPruner.mode`, a value of :mod:`ctxkeep.prune.modes`: the fill mode's
:meth:`~ctxkeep.prune.fit._Fitter._plan`, or the cache-stable fold of
:mod:`ctxkeep.prune.stable`), an optional **summary** of the dropped history
(:mod:`ctxkeep.prune.summary`), and the **output** (:meth:`TokenPruner._assemble`): the kept
messages in input order, compressed and synthetic ones in place, the summary where the dropped
history began, and a :class:`~ctxkeep.prune.report.PruneReport` on every input message.

:class:`TokenPruner` checks its configuration and inherits the rest, one layer on another: the
walk over units (:mod:`ctxkeep.prune.units`), the plan (:mod:`ctxkeep.prune.fit`) and the
summary (:mod:`ctxkeep.prune.summary`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ctxkeep.artifacts import ArtifactStore, MemoryArtifactStore
from ctxkeep.errors import ConfigError, describe
from ctxkeep.foldstate import FoldMismatch, FoldState
from ctxkeep.messages import Message
from ctxkeep.prune.config import PrunerConfig
from ctxkeep.prune.inputs import Reader, as_list
from ctxkeep.prune.modes import CacheStableMode, PruneMode, mode_for
from ctxkeep.prune.report import Action, PruneReport, _with_originals
from ctxkeep.prune.summary import AsyncSummarizer, Summarizer, _Summaries
from ctxkeep.prune.units import _Plan
from ctxkeep.tokens import TokenCounter, get_counter

if TYPE_CHECKING:
    from ctxkeep.sessions.base import MemoryManager, SessionPrompt

_TASK = "the task (the conversation's first user message, kept in every prompt: keep_first)"


_SETTINGS = tuple(f.name for f in dataclasses.fields(PrunerConfig))
"""The settings a pruner carries in its :attr:`~TokenPruner.config`."""


class TokenPruner(_Summaries):
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
            The prompt is a pure function of the history (see :mod:`ctxkeep.prune.stable`). The
            default (None) is on, except with a ``summarizer`` (a summary rewritten each turn
            would change the prefix; ``True`` with one is a ``ConfigError``). On the real
            trajectories it halves the Anthropic input cost of the default mode at equal
            validity (BENCHMARKS.md, "Prompt caching"); ``False`` prunes every turn to the
            full budget and reads only what it keeps (the first prune of a long history in
            the cache-stable mode counts every message once, but for a session's prompt from a
            fold snapshot stored with it: :mod:`ctxkeep.prune.snapshots`).
        low_water: with ``cache_stable``, the fraction of the budget a cut prunes down to
            (0 < low_water <= 1; the recent units and the newest user message are kept even
            above it).
        keep_first: the conversation's **head** kept in every prompt, in place, in both
            modes: the first user message with content (an agent's task statement) and, for
            ``keep_first=N``, the N units that start with it (each a message that is neither
            a tool result nor a system message, with its tool results). The newest user
            message comes first: if the system messages, the newest user message and the head
            exceed the budget, the head is compressed (head and tail excerpts with an artifact
            ref, as ``compress_oversized_user`` does), and if even that does not fit it is
            dropped for that prompt (reported in the notes). Reported as the ``task`` section
            (>= 0; 0 keeps no head; default 1).

    """

    _plain_pruner = True  # read strategies and fold snapshots may stand in for a whole read

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
        keep_first: int = 1,
    ) -> None:
        if cache_stable is None:
            cache_stable = summarizer is None
        self.config = PrunerConfig(
            max_token_budget=max_token_budget,
            preserve_last_n=preserve_last_n,
            compress_threshold=compress_threshold,
            excerpt_tokens=excerpt_tokens,
            summary_max_tokens=summary_max_tokens,
            repair=repair,
            compress_oversized_user=compress_oversized_user,
            cache_stable=cache_stable,
            low_water=low_water,
            keep_first=keep_first,
        )
        """The settings, checked (:class:`~ctxkeep.prune.config.PrunerConfig`)."""
        if summarizer is not None and summary_max_tokens > max_token_budget:
            raise ConfigError(
                f"summary_max_tokens ({summary_max_tokens}) must not exceed max_token_budget "
                f"({max_token_budget}): it is space reserved inside the budget"
            )
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
        if cache_stable and summarizer is not None:
            raise ConfigError(
                "cache_stable=True does not take a summarizer: a summary rewritten every turn "
                "would change the prompt's prefix every turn"
            )
        self.counter = counter or get_counter()
        self.artifacts: ArtifactStore = (
            artifacts if artifacts is not None else MemoryArtifactStore()
        )
        self.summarizer = summarizer
        self._reader = Reader()
        self.mode: PruneMode = mode_for(self)
        """The plan stage (:mod:`ctxkeep.prune.modes`): fill the budget on every prune, or
        prune in jumps for a stable prefix (``cache_stable``)."""
        self._priming = self.counter.count_messages([])
        # The compressed form is cached on the message, keyed by the store object itself (a
        # strong reference: a store's id could be reused after it is collected).
        try:
            hash(self.artifacts)
            store_key: Any = self.artifacts
        except TypeError:
            store_key = None  # unhashable store: the cache is not used
        self._compress_key = ("ctxkeep.compressed", store_key, self.config.excerpt_tokens)

    def with_budget(self, budget: int) -> TokenPruner:
        """A pruner like this one (every setting of its :attr:`config`, the same counter,
        artifact store and summarizer) with another budget (and a summary room no larger);
        its cache-stable fold is its own.
        """
        # The summary's room is inside the budget: at most all of it.
        config = self.config.replace(
            max_token_budget=budget,
            summary_max_tokens=min(self.config.summary_max_tokens, budget),
        )
        return TokenPruner(
            budget,
            counter=self.counter,
            artifacts=self.artifacts,
            summarizer=self.summarizer,
            **{k: getattr(config, k) for k in _SETTINGS if k != "max_token_budget"},
        )

    def __copy__(self) -> TokenPruner:
        """A shallow copy (the same counter, artifact store and summarizer) with a mode of
        its own: a mode plans with the pruner it was made for, so a copy given another budget
        plans with that budget, and a cache-stable copy folds apart from this pruner.
        """
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        clone.mode = mode_for(clone)
        return clone

    # -- public --------------------------------------------------------------------------

    def prune(self, messages: Sequence[Any]) -> list[Message]:
        """The messages that fit the budget (see :mod:`ctxkeep.prune` for the rules)."""
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
        plan = self.mode.plan(as_list(messages))  # a list once: an iterator is read once
        summary, error = self._summarize(plan)
        return self._assemble(plan, summary, error)

    async def aprune(self, messages: Sequence[Any]) -> list[Message]:
        """Async :meth:`prune` (awaits an async summarizer)."""
        return (await self.aprune_with_report(messages))[0]

    async def aprune_with_report(
        self, messages: Sequence[Any]
    ) -> tuple[list[Message], PruneReport]:
        """Async :meth:`prune_with_report` (awaits an async summarizer)."""
        plan = self.mode.plan(as_list(messages))  # a list once: an iterator is read once
        summary, error = await self._asummarize(plan)
        return self._assemble(plan, summary, error)

    def _prune_folded(
        self, messages: list[Any], seed: FoldState | None
    ) -> tuple[list[Message], PruneReport, FoldState | None]:
        """:meth:`prune_with_report` in the cache-stable mode, from ``seed`` where this pruner
        keeps no fold that covers it, and the fold's state afterwards (for a snapshot; None
        where there can be none): what a session store's first prompt of a process uses
        (:mod:`ctxkeep.prune.snapshots`).

        Raises:
            FoldMismatch: ``seed`` does not describe ``messages``, or this pruner does not
                prune in the cache-stable mode.
            Whatever :meth:`prune` raises.

        """
        mode = self.mode
        if not isinstance(mode, CacheStableMode):
            raise FoldMismatch("not a cache-stable pruner")
        plan, state = mode.plan_state(as_list(messages), seed)
        summary, error = self._summarize(plan)
        out, report = self._assemble(plan, summary, error)
        return out, report, state

    def read_prompt(
        self, memory: MemoryManager, session_id: str, prefix: list[Message]
    ) -> SessionPrompt | None:
        """How this pruner reads a stored session (what
        :meth:`~ctxkeep.MemoryManager.build_prompt` asks of it): its :attr:`mode`'s read, the
        newest pages when it fills the budget, the fold snapshot when it is cache-stable
        (:mod:`ctxkeep.prune.modes`); None where it needs every message (the manager reads
        them all).
        """
        return self.mode.read(memory, session_id, prefix)

    # -- output --------------------------------------------------------------------------

    def _assemble(
        self, plan: _Plan, summary: str | None, error: str | None
    ) -> tuple[list[Message], PruneReport]:
        msgs = plan.msgs
        t = self.tokens
        fates: dict[int, tuple[Action, str, int, str | None]] = {}
        sections = {
            "system": 0,
            "task": 0,
            "history": 0,
            "tools": 0,
            "summary": 0,
            "priming": self._priming,
        }
        for i in plan.system:
            n = t(msgs[i])
            fates[i] = ("kept", "system message", n, None)
            sections["system"] += n
        task = min((u.start for u in plan.kept if u.head), default=-1)
        for u in plan.kept:
            if u.head:
                reason = (
                    _TASK if u.start == task else "the task: the conversation's head (keep_first)"
                )
                if u.start == plan.user_idx:
                    reason += ", and the newest user message"
            elif u.start == plan.user_idx:
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
                    if u.head:
                        why = f"{reason}: {why}"
                    fates[j] = ("compressed", why, n, ref)
                else:
                    n = t(msgs[j])
                    fates[j] = ("kept", reason, n, None)
                sections[
                    "task" if u.head else "tools" if msgs[j].role == "tool" else "history"
                ] += n

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
                sections["task" if u.head else "tools"] += n
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


__all__ = ["TokenPruner"]

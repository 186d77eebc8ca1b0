"""ContextBuilder: one agent's prompt for this turn, its budgets, and what it recalls.

A build takes three steps. :meth:`ContextBuilder._prepare` reads the session, makes the fabric
and recall sections (:mod:`ctxkeep.builder.sections`) and sets the history's budget; the pruner
prunes the history to it; :meth:`ContextBuilder._finish` puts the sections before the newest
user message, counts, reports (:mod:`ctxkeep.builder.report`) and runs the gate.

Budgets. The prompt may hold ``max_prompt_tokens - reserve_output_tokens`` tokens. The fabric
view gets at most ``max_fabric_tokens`` and recall at most ``max_prior_tokens``, but never the
room the system messages and the newest user message need; each takes only what it uses, and
the history gets everything left (unused section budget flows to history; in cache-stable mode
the history's budget is fixed instead, see ``cache_stable``). A section over its
budget is shrunk, not refused: recall keeps fewer episodes (the best ones; the last one cut
short if it alone is too long), the fabric view is cut with a note saying so. The history is
pruned by a :class:`~ctxkeep.TokenPruner` to exactly what remains, and
:class:`~ctxkeep.PromptGate` runs last with the prompt limit (and a code-point limit if one is
configured): an over-long prompt raises a typed error (``BudgetExceededError`` from the pruner,
``PromptTooLongError`` from the gate), it is never returned.

Recall scope. Episodes are searched with the newest user message (or ``query``) in the whole
store by default (``recall_scope="agent"`` or ``"task"`` narrows it to the session's agent or
task), keeping only relevant hits (lexical evidence and a fused score of at least
``recall_min_score``, the rule ``ctxkeep memory search`` uses). Episodes of the session being
built are left out by default: its history is already in the prompt, and recalling a summary
of it spends the budget twice (``recall_current_session=True`` lets a very long session recall
what its pruned past left in episodic memory).
"""

from __future__ import annotations

import asyncio
import copy
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxkeep import _check
from ctxkeep.builder.compose import prompt_budget
from ctxkeep.builder.config import DEFAULT_MAX_FABRIC_TOKENS as DEFAULT_MAX_FABRIC_TOKENS
from ctxkeep.builder.config import DEFAULT_MAX_PRIOR_TOKENS as DEFAULT_MAX_PRIOR_TOKENS
from ctxkeep.builder.config import DEFAULT_MAX_PROMPT_TOKENS as DEFAULT_MAX_PROMPT_TOKENS
from ctxkeep.builder.config import DEFAULT_RESERVE_OUTPUT_TOKENS as DEFAULT_RESERVE_OUTPUT_TOKENS
from ctxkeep.builder.config import SECTION_SHARE as SECTION_SHARE
from ctxkeep.builder.config import BuilderConfig
from ctxkeep.builder.config import RecallScope as RecallScope
from ctxkeep.builder.report import SECTIONS, BuildReport, BuiltPrompt, EpisodeDecision, _decision
from ctxkeep.builder.sections import _history_section, _insertion_point, fabric_section, fit_hits
from ctxkeep.config import setting_int
from ctxkeep.errors import ConfigError
from ctxkeep.gate import PromptGate
from ctxkeep.messages import SYSTEM_ROLES, Message
from ctxkeep.prune import PruneReport, TokenPruner
from ctxkeep.sessions.aio import AsyncMemoryManager
from ctxkeep.sessions.base import MemoryManager
from ctxkeep.sessions.records import SessionInfo
from ctxkeep.tokens import TokenCounter, get_counter

if TYPE_CHECKING:
    from ctxkeep.episodic.base import Hit


class _AsStored:
    """A pass-through "pruner" for :meth:`MemoryManager.build_prompt`, for a pruner whose
    async summarizer the builder must await (:meth:`ContextBuilder.abuild`).

    It hands back the manager's cached messages themselves rather than copies (copying a
    5,000-message history costs ~100 ms a turn; this, ~0.3 ms), so their cached token counts
    carry over between turns. The real pruner runs afterwards, once the history's budget is
    known, and copies what it outputs; nothing here changes a message.
    """

    def prune(self, messages: list[Message]) -> list[Message]:
        return messages


_AS_STORED = _AsStored()


@dataclass
class _Plan:
    """A build before its history is final: the session read, the sections made, the budgets
    set. ``pruned``/``report`` hold the history as pruned to ``history_budget`` through the
    manager's read (newest pages or the fold snapshot: what the pruner declares it needs);
    with an async summarizer they are None and ``prune_input`` holds the history as stored,
    for the caller to prune with ``aprune_with_report``.
    """

    budget: int
    info: SessionInfo
    newest_user: Message | None
    sections: list[Message]  # fabric view, recall: the messages put before the newest user
    budgets: dict[str, int]
    history_budget: int
    query: str | None
    episodes: list[EpisodeDecision]
    notes: list[str]
    pruned: list[Message] | None = None
    report: PruneReport | None = None
    prune_input: list[Message] | None = None


class ContextBuilder:
    """Builds one agent's prompt from its session, the fabric and episodic memory.

    Args:
        memory: the session store (a :class:`MemoryManager`, or an
            :class:`AsyncMemoryManager`, whose sync manager is used).
        episodic: optional; an episodic store to recall prior context from.
        counter: the token counter (default: the pruner's, else :func:`get_counter`).
        max_prompt_tokens: the model's context window, in tokens (>= 2).
        reserve_output_tokens: tokens of the window kept free for the reply (>= 0, less
            than ``max_prompt_tokens``).
        gate: the last check (default: a :class:`PromptGate` with the token limit
            ``max_prompt_tokens - reserve_output_tokens`` and the code-point limit
            ``max_prompt_length`` if one is configured).
        fabric: optional; a :class:`~ctxkeep.ContextFabric` whose view of the session's agent
            goes into the prompt.
        pruner: a configured :class:`TokenPruner` for the history (default: ``TokenPruner()``
            with ``counter``). In the default mode its ``max_token_budget`` is not used: each
            build prunes with the budget left after the other sections (on a shallow copy;
            the pruner itself is not changed). A cache-stable pruner keeps its own budget
            (it must fit the prompt budget) and the sections get at most the rest.
        max_prior_tokens: most tokens for recalled context (>= 0; default: 1500, at most a
            quarter of the prompt budget).
        max_fabric_tokens: most tokens for the fabric view (>= 0; default: 1000, at most a
            quarter of the prompt budget).
        recall_top_k: most episodes recalled (>= 0; 0 turns recall off).
        recall_min_score: an episode is recalled only with lexical evidence and a fused score
            of at least this (``None``: the top hits as ranked, relevant or not).
        recall_scope: ``"all"`` episodes of the store, the session's ``"agent"``, or its
            ``"task"`` (a session with no task recalls nothing then).
        recall_current_session: also recall episodes of the session being built.
        max_prompt_length: the gate's code-point limit (``None``: ``CTXKEEP_MAX_PROMPT_LENGTH``
            or the config file's ``max_prompt_length`` if set, else no code-point limit).
            Ignored when ``gate`` is given.
        cache_stable: prune so that consecutive prompts share their prefix (see
            :mod:`ctxkeep.prune.stable`); default: the given pruner's mode, else
            :class:`TokenPruner`'s default. With no pruner given, a cache-stable one gets
            the prompt budget less the section caps: the history's budget then stays the
            same every turn (unused section budget does not flow to it, or the cuts would
            move).

    Raises:
        InvalidTypeError: an argument of the wrong type.
        ConfigError: a value out of range, or a pruner that counts with another counter.

    """

    def __init__(
        self,
        memory: MemoryManager | AsyncMemoryManager,
        *,
        episodic: Any = None,
        counter: TokenCounter | None = None,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
        reserve_output_tokens: int = DEFAULT_RESERVE_OUTPUT_TOKENS,
        gate: PromptGate | None = None,
        fabric: Any = None,
        pruner: TokenPruner | None = None,
        max_prior_tokens: int | None = None,
        max_fabric_tokens: int | None = None,
        recall_top_k: int = 3,
        recall_min_score: float | None = 0.0,
        recall_scope: RecallScope = "all",
        recall_current_session: bool = False,
        max_prompt_length: int | None = None,
        cache_stable: bool | None = None,
    ) -> None:
        if isinstance(memory, AsyncMemoryManager):
            memory = memory.sync
        self.memory: MemoryManager = _check.instance(
            "memory", memory, MemoryManager, "a MemoryManager (see ctxkeep.open_memory)"
        )
        self.config = BuilderConfig(
            max_prompt_tokens=max_prompt_tokens,
            reserve_output_tokens=reserve_output_tokens,
            max_prior_tokens=max_prior_tokens,
            max_fabric_tokens=max_fabric_tokens,
            recall_top_k=recall_top_k,
            recall_min_score=recall_min_score,
            recall_scope=recall_scope,
            recall_current_session=recall_current_session,
            max_prompt_length=max_prompt_length,
            cache_stable=cache_stable,
        )
        """The settings, checked (:class:`~ctxkeep.builder.config.BuilderConfig`)."""
        if episodic is not None:
            _check.has_method("episodic", episodic, "search", "EpisodicMemoryStore")
        if fabric is not None:
            _check.has_method("fabric", fabric, "context_view", "ContextFabric")
        if gate is not None:
            _check.has_method("gate", gate, "check", "PromptGate")
        if counter is not None:
            _check.instance("counter", counter, TokenCounter, "a TokenCounter (see get_counter)")
        if pruner is not None:
            _check.instance("pruner", pruner, TokenPruner, "a TokenPruner")
            if counter is not None and pruner.counter is not counter:
                raise ConfigError(
                    f"the pruner counts with {pruner.counter!r} and the builder with {counter!r}: "
                    "pass the same counter to both (or leave the builder's out)"
                )
            if cache_stable is not None and pruner.cache_stable != cache_stable:
                raise ConfigError(
                    f"cache_stable={cache_stable} but the pruner has cache_stable="
                    f"{pruner.cache_stable}: configure the mode on the pruner (or leave this out)"
                )
        self.episodic = episodic
        self.fabric = fabric
        self.counter: TokenCounter = (
            counter or (pruner.counter if pruner is not None else None) or get_counter()
        )
        budget = self.prompt_budget
        self.max_fabric_tokens, self.max_prior_tokens = self.config.section_caps(budget)
        self._own_pruner = pruner is None
        self._lock = threading.Lock()
        self.pruner: TokenPruner = pruner or self._default_pruner(budget)
        self.gate = gate or PromptGate(
            max_prompt_length=setting_int("max_prompt_length", max_prompt_length, None)
            or sys.maxsize,
            max_prompt_tokens=self.prompt_limit,
            counter=self.counter,
        )
        if self.pruner.mode.keeps_budget and self.pruner.max_token_budget > budget:
            raise ConfigError(
                f"the cache-stable pruner's budget ({self.pruner.max_token_budget}) exceeds the "
                f"prompt budget ({budget} = max_prompt_tokens - reserve_output_tokens, less "
                "the margin of an estimated count): in cache-stable mode the pruner's own "
                "budget is the history's"
            )
        self._priming = self.counter.count_messages([])

    def _default_pruner(self, budget: int) -> TokenPruner:
        """The pruner a builder makes when given none: TokenPruner's mode unless
        ``cache_stable`` says, with the history's budget (what a cache-stable one keeps; a
        filling one is given each build's budget).
        """
        history = budget - self._wanted_room()
        pruner = TokenPruner(
            max(1, history), counter=self.counter, cache_stable=self.config.cache_stable
        )
        if pruner.mode.keeps_budget and history < 1:
            raise self._no_history_room(budget)
        return pruner

    # -- settings (read from config) -------------------------------------------------------

    @property
    def max_prompt_tokens(self) -> int:
        """The model's context window, in tokens."""
        return self.config.max_prompt_tokens

    @property
    def reserve_output_tokens(self) -> int:
        """Tokens of the window kept for the reply."""
        return self.config.reserve_output_tokens

    @property
    def recall_top_k(self) -> int:
        """Most episodes recalled."""
        return self.config.recall_top_k

    @property
    def recall_min_score(self) -> float | None:
        """The least fused score of a recalled episode (None: any)."""
        return self.config.recall_min_score

    @property
    def recall_scope(self) -> RecallScope:
        """Where recall searches."""
        return self.config.recall_scope

    @property
    def recall_current_session(self) -> bool:
        """Whether episodes of the session being built are recalled."""
        return self.config.recall_current_session

    @property
    def cache_stable(self) -> bool:
        """Whether the history is pruned for a stable prefix (the pruner's mode)."""
        return self.pruner.mode.keeps_budget

    @property
    def prompt_limit(self) -> int:
        """``max_prompt_tokens - reserve_output_tokens``: the default gate's token limit."""
        return self.config.prompt_limit

    @property
    def prompt_budget(self) -> int:
        """The most tokens a prompt may have: :attr:`prompt_limit`, less the margin an
        estimating counter keeps (:func:`~ctxkeep.builder.compose.prompt_budget`, the rule
        every prompt of ctxkeep follows; it follows the counter's calibration).
        """
        return prompt_budget(
            self.max_prompt_tokens, self.reserve_output_tokens, counter=self.counter
        )

    # -- public --------------------------------------------------------------------------

    def build(
        self,
        session_id: str,
        *,
        system: str | Message | None = None,
        query: str | None = None,
        agent_id: str | None = None,
    ) -> BuiltPrompt:
        """The prompt for the session's next model call (see :mod:`ctxkeep.builder`).

        Args:
            session_id: the session; its agent is the one whose fabric view is shown.
            system: the system prompt (a string, or a system or developer ``Message``).
            query: what to recall prior context with (default: the newest user message).
            agent_id: optional; the agent the caller builds for, checked against the
                session's owner (a prompt never shows another agent's private layer).

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.
            BudgetExceededError: the system messages and the newest user message alone do
                not fit ``max_prompt_tokens - reserve_output_tokens``.
            PromptTooLongError: the gate refused the prompt (its code-point limit).
            InvalidTypeError / ConfigError: a malformed argument, or ``agent_id`` is not the
                session's agent.

        """
        plan = self._prepare(session_id, system, query, agent_id)
        assert plan.pruned is not None and plan.report is not None
        return self._finish(plan, plan.pruned, plan.report)

    async def abuild(
        self,
        session_id: str,
        *,
        system: str | Message | None = None,
        query: str | None = None,
        agent_id: str | None = None,
    ) -> BuiltPrompt:
        """Async :meth:`build`: storage, search and counting run in a worker thread, so the
        event loop is never blocked; an async summarizer of the pruner is awaited.
        """
        deferred = callable(getattr(self.pruner.summarizer, "asummarize", None))
        plan = await asyncio.to_thread(
            self._prepare, session_id, system, query, agent_id, deferred=deferred
        )
        if plan.pruned is None or plan.report is None:
            assert plan.prune_input is not None
            pruner = self._pruner_for(plan.history_budget)
            plan.pruned, plan.report = await pruner.aprune_with_report(plan.prune_input)
        return await asyncio.to_thread(self._finish, plan, plan.pruned, plan.report)

    # -- the steps -----------------------------------------------------------------------

    def _tokens(self, message: Message) -> int:
        return self.counter.count_message(message)

    def _prepare(
        self, session_id: str, system: Any, query: Any, agent_id: Any, *, deferred: bool = False
    ) -> _Plan:
        """Read and prune the session, make the fabric and recall sections, set the budgets.

        The history is read through :meth:`MemoryManager.build_prompt` with the pruner
        itself, so the read is what the pruner declares it needs: a cache-stable pruner's
        fold snapshot and the messages from its window on, the default mode's newest pages.
        A cache-stable pruner keeps its own budget, so one read serves; in the default mode
        the history gets what the sections leave, so the read is pruned again to that budget
        when a section took room (the second read reuses the first one's messages).
        """
        asked = query
        prefix = _system_message(system)
        query = _check.optional_text("query", query, empty=True)
        agent_id = _check.optional_text("agent_id", agent_id)
        if agent_id is not None:
            owner = self.memory.get_session(session_id).agent_id
            if agent_id != owner:
                raise ConfigError(
                    f"session {session_id!r} belongs to agent {owner!r}, not "
                    f"{agent_id!r}: build an agent's prompt from its own session"
                )
        head = prefix[0] if prefix else None
        budget = self.prompt_budget  # once: an estimating counter's margin follows calibration
        prune_input: list[Message] | None = None
        pruned: list[Message] | None = None
        report: PruneReport | None = None
        pruner = self.pruner
        if deferred:
            # An async summarizer is awaited by the caller: the history as stored.
            read = self.memory.build_prompt(session_id, pruner=_AS_STORED)
            prune_input = prefix + read.messages
            system_tokens = sum(self._tokens(m) for m in prune_input if m.role in SYSTEM_ROLES)
        else:
            pruner = self._pruner_for(budget)
            read = self.memory.build_prompt(session_id, system=head, pruner=pruner)
            pruned, report = read.messages, read.report
            assert report is not None  # a TokenPruner reports
            # Every system message is in the prompt (never dropped, never compressed).
            system_tokens = sum(self._tokens(m) for m in pruned if m.role in SYSTEM_ROLES)
        info, newest_user = read.info, read.newest_user
        notes: list[str] = []
        wanted = self._wanted_room()
        keeps_budget = pruner.mode.keeps_budget
        if keeps_budget:
            # The pruner keeps its own budget (a budget that moved would move its cuts): the
            # sections get the rest of the prompt budget, and what they leave is not used.
            floor = pruner.max_token_budget
            room = budget - floor
        else:
            # The room the sections may take: never what the messages the pruner cannot
            # drop need.
            floor = self._priming + system_tokens
            if newest_user is not None:
                floor += self._tokens(newest_user)
            room = max(0, budget - floor)
        if room < wanted:
            notes.append(
                (
                    f"the cache-stable pruner's budget takes {floor}"
                    if keeps_budget
                    else f"the system messages and the newest user message take {floor}"
                )
                + f" of the {budget} prompt tokens: {room} left for the fabric "
                "view and recall"
            )
        sections: list[Message] = []
        budgets = {"fabric": min(self.max_fabric_tokens, room), "prior_context": 0}
        if self.fabric is not None:
            view = self.fabric.context_view(info.agent_id)
            fabric_msg = fabric_section(view, budgets["fabric"], notes, self._tokens)
            if fabric_msg is not None:
                sections.append(fabric_msg)
                room -= self._tokens(fabric_msg)
        else:
            budgets["fabric"] = 0
        budgets["prior_context"] = min(self.max_prior_tokens, room)
        if query is None and newest_user is not None:
            query = newest_user.text
        episodes: list[EpisodeDecision] = []
        if self.episodic is not None and self.recall_top_k > 0:
            if query:
                prior_msg = self._prior_section(
                    info, query, budgets["prior_context"], episodes, notes
                )
                if prior_msg is not None:
                    sections.append(prior_msg)
            else:
                query = None
                notes.append("nothing recalled: no query and no user message to recall with")
        else:
            budgets["prior_context"] = 0
            query = None
        used = sum(self._tokens(m) for m in sections)
        history_budget = floor if keeps_budget else budget - used
        budgets["history"] = history_budget
        if used and not keeps_budget and not deferred:
            read = self.memory.build_prompt(
                session_id, system=head, pruner=self._pruner_for(history_budget)
            )
            if (read.info.generation, read.info.revision) != (info.generation, info.revision):
                # Changed between the two reads (another writer): build again from the start.
                return self._prepare(session_id, system, asked, agent_id)
            pruned, report = read.messages, read.report
        return _Plan(
            budget=budget,
            info=info,
            newest_user=newest_user,
            sections=sections,
            budgets=budgets,
            history_budget=history_budget,
            query=query,
            episodes=episodes,
            notes=notes,
            pruned=pruned,
            report=report,
            prune_input=prune_input,
        )

    def _wanted_room(self) -> int:
        """The tokens the fabric view and recall may take at most (their caps)."""
        fabric = self.max_fabric_tokens if self.fabric is not None else 0
        recall = self.max_prior_tokens if self.episodic is not None and self.recall_top_k else 0
        return fabric + recall

    def _pruner_for(self, budget: int) -> TokenPruner:
        """The pruner for a build whose history may take ``budget`` tokens.

        A pruner that fills its budget is copied with this one (shallow: the caller's pruner
        is not changed, and two builds at once, threads or ``abuild``, do not see each
        other's budget). A cache-stable pruner keeps its fold and its own budget, which must
        fit: an estimating counter's margin can grow as it calibrates, and a pruner the
        builder made is then made again with the budget left (its fold starts over once);
        one the caller gave must fit as it is.
        """
        pruner = self.pruner
        if not pruner.mode.keeps_budget:
            pruner = copy.copy(pruner)
            pruner.max_token_budget = budget
            return pruner
        if pruner.max_token_budget <= budget:
            return pruner
        if not self._own_pruner:
            raise ConfigError(
                f"the cache-stable pruner's budget ({pruner.max_token_budget}) exceeds the "
                f"prompt budget ({budget}: the window less the reserve and the margin the "
                f"estimated count of {self.counter!r} now keeps): give the pruner a lower "
                "budget"
            )
        # Some headroom, so that a margin creeping up does not restart the fold every turn.
        history = budget - self._wanted_room() - budget // 50
        if history < 1:
            raise self._no_history_room(budget)
        with self._lock:
            if self.pruner.max_token_budget > budget:
                self.pruner = self.pruner.with_budget(history)
            return self.pruner

    def _no_history_room(self, budget: int) -> ConfigError:
        return ConfigError(
            f"the section budgets ({self._wanted_room()} tokens) leave no history budget in "
            f"the {budget}-token prompt: lower max_fabric_tokens / max_prior_tokens"
        )

    def _finish(self, plan: _Plan, pruned: list[Message], prune_report: PruneReport) -> BuiltPrompt:
        """Put the sections before the newest user message, count, report, gate."""
        at = _insertion_point(pruned, plan.newest_user)
        messages = pruned[:at] + plan.sections + pruned[at:]
        section_ids = {id(m): m.metadata["ctxkeep_section"] for m in plan.sections}
        sections = dict.fromkeys(SECTIONS, 0)
        for m in messages:
            sections[section_ids.get(id(m)) or _history_section(m)] += self._tokens(m)
        sections["priming"] = self._priming
        prompt_tokens = sum(sections.values())
        if prompt_tokens > plan.budget:  # pragma: no cover - a bug, never an input
            raise AssertionError(f"built {prompt_tokens} > {plan.budget} tokens")
        self.gate.check(messages)
        report = BuildReport(
            session_id=plan.info.session_id,
            agent_id=plan.info.agent_id,
            max_prompt_tokens=self.max_prompt_tokens,
            reserve_output_tokens=self.reserve_output_tokens,
            prompt_tokens=prompt_tokens,
            sections=sections,
            budgets=plan.budgets,
            prune=prune_report,
            query=plan.query,
            episodes=tuple(plan.episodes),
            notes=tuple(plan.notes),
        )
        return BuiltPrompt(messages, report, at if plan.sections else None)

    # -- recall --------------------------------------------------------------------------

    def _prior_section(
        self,
        info: SessionInfo,
        query: str,
        budget: int,
        episodes: list[EpisodeDecision],
        notes: list[str],
    ) -> Message | None:
        """The ``### Prior Historical Context`` section: the best relevant hits that fit."""
        filters: dict[str, Any] | None = None
        if self.recall_scope == "agent":
            filters = {"agent_id": info.agent_id}
        elif self.recall_scope == "task":
            if info.task_id is None:
                notes.append("nothing recalled: recall_scope is 'task' and the session has none")
                return None
            filters = {"task_id": info.task_id}
        # Hits of this session and irrelevant ones are dropped after the search (a filter
        # cannot exclude): look a little further than top_k.
        k = self.recall_top_k
        hits: list[Hit] = self.episodic.search(query, k * 3, filters=filters)
        fates: dict[int, EpisodeDecision] = {}
        chosen: list[int] = []  # positions in hits, best first
        for i, h in enumerate(hits):
            if not self.recall_current_session and h.episode.session_id == info.session_id:
                fates[i] = _decision(h, "dropped", "from the session being built")
            elif self.recall_min_score is not None and not h.is_relevant(self.recall_min_score):
                fates[i] = _decision(h, "dropped", "not relevant enough")
            elif len(chosen) >= k:
                fates[i] = _decision(h, "dropped", f"beyond recall_top_k={k}")
            else:
                chosen.append(i)
        msg, kept, cut_short = fit_hits([hits[i] for i in chosen], budget, self._tokens)
        for n, i in enumerate(chosen):
            if n >= kept:
                fates[i] = _decision(hits[i], "dropped", f"over the {budget}-token budget")
            elif cut_short:
                fates[i] = _decision(hits[i], "truncated", "cut short to fit the budget")
            else:
                fates[i] = _decision(hits[i], "included", "relevant")
        episodes.extend(fates[i] for i in range(len(hits)))
        if kept < len(chosen):
            notes.append(
                f"prior context: {kept} of {len(chosen)} relevant episodes fit {budget} tokens"
                + (" (the one kept cut short)" if cut_short else "")
            )
        return msg


# -- helpers -------------------------------------------------------------------------------


def _system_message(system: Any) -> list[Message]:
    if system is None:
        return []
    if isinstance(system, str):
        return [Message("system", _check.text("system", system, empty=True))]
    _check.instance("system", system, Message, "a string or a system Message")
    if system.role not in SYSTEM_ROLES:
        raise ConfigError(f"system must be a system or developer message, not {system.role!r}")
    return [system.copy()]


__all__ = ["ContextBuilder"]

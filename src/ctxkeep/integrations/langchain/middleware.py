"""ContextMiddleware: a LangChain v1 agent's model calls fitted into the model's window.

:class:`ContextMiddleware` counts each request's system prompt, tool definitions
(:func:`tools_json`) and messages, prunes the messages with :mod:`.prune`'s trimmer, optionally
recalls past runs from an episodic store into the system prompt, and saves each run as an
episode when it ends; :class:`ContextReport` says what one call sent.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from ctxkeep import _check
from ctxkeep.artifacts import ArtifactStore
from ctxkeep.builder.compose import RecallPolicy, prompt_budget, recall_room, recall_then_fit
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    MissingDependencyError,
    describe,
)
from ctxkeep.integrations.langchain.prune import _Trimmer
from ctxkeep.prune import PruneReport
from ctxkeep.tokens import TokenCounter

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
    from langchain.agents.middleware.types import AgentState, ExtendedModelResponse
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
    )
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.runtime import Runtime
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langchain", "langchain") from exc

from ctxkeep.episodic.base import EpisodicMemoryStore

__all__ = ["ContextMiddleware", "ContextReport", "tools_json"]


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
        cache_stable = _check.optional_flag("cache_stable", cache_stable)
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
            keep_first=1,  # an agent's task stays in every call (TokenPruner's default)
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
        self.save_episodes = _check.flag("save_episodes", save_episodes)
        self.count_tools = _check.flag("count_tools", count_tools)
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
        budget = prompt_budget(window, tools=tools_tokens, counter=self.counter)
        if budget < 1:
            raise BudgetExceededError(
                budget=window,
                required=window - budget,
                blocking=[f"the tool definitions ({tools_tokens} tokens)"],
            )
        system = request.system_message
        newest = next((m for m in reversed(request.messages) if isinstance(m, HumanMessage)), None)
        keep: list[BaseMessage] = [system] if system is not None else []
        keep += [m for m in request.messages if isinstance(m, SystemMessage)]
        keep += [newest] if newest is not None else []
        recall = None
        if self.episodic is not None:
            recall = RecallPolicy(
                self.episodic,
                top_k=self.recall_top_k,
                max_tokens=self.max_prior_tokens,
                min_score=self.recall_min_score,
                filters=self.recall_filters,
            )

        def fit(prior: str) -> tuple[SystemMessage | None, list[BaseMessage], PruneReport]:
            sent = _with_prior(system, prior)
            out, report = self._fit(sent, request.messages, budget)
            return sent, out, report

        with self._trimmer._lock:
            room = recall_room(budget, self._trimmer.count(keep), self.max_prior_tokens)
            (sent_system, out, report), hits, _ = recall_then_fit(
                fit,
                query=newest.text if newest is not None else "",
                room=room,
                recall=recall,
                counter=self.counter,
            )
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

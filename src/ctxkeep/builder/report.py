"""What a build returns: the prompt, and a report of every section and decision in it.

:meth:`~ctxkeep.ContextBuilder.build` returns a :class:`BuiltPrompt`: the messages, ready for a
provider (with Anthropic cache breakpoints on the stable prefix if wanted), and a
:class:`BuildReport`. The report gives every section's tokens, counted on the final messages,
so that they add up exactly to ``counter.count_messages(built.messages)``; the pruner's
:class:`~ctxkeep.PruneReport` (a decision per history message), every recalled episode's fate
(:class:`EpisodeDecision`), the budgets and notes on whatever was shrunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ctxkeep.messages import AnthropicPayload, Message, to_anthropic, to_openai
from ctxkeep.prune import PruneReport

if TYPE_CHECKING:
    from ctxkeep.episodic.base import Hit


EpisodeAction: TypeAlias = Literal["included", "truncated", "dropped"]

SECTIONS: tuple[str, ...] = (
    "system",
    "fabric",
    "prior_context",
    "history",
    "tools",
    "summary",
    "priming",
)
"""The report's sections, in prompt order (``priming``: the tokens that prime the reply)."""


@dataclass(frozen=True, kw_only=True)
class EpisodeDecision:
    """What the builder did with one episode that recall found."""

    episode_id: str
    """The episode."""
    session_id: str
    """The session it came from."""
    score: float
    """Its fused search score."""
    action: EpisodeAction
    """included, truncated (included, its text cut to fit), or dropped."""
    reason: str
    """Why, in a few words."""


@dataclass(frozen=True, kw_only=True)
class BuildReport:
    """What went into a built prompt, section by section, and why.

    ``sum(sections.values()) == prompt_tokens == counter.count_messages(messages)``, and
    ``prompt_tokens + reserve_output_tokens <= max_prompt_tokens``.
    """

    session_id: str
    """The session built."""
    agent_id: str
    """The agent whose prompt it is (the session's owner)."""
    max_prompt_tokens: int
    """The model's window."""
    reserve_output_tokens: int
    """Tokens of the window left for the reply."""
    prompt_tokens: int
    """Tokens of the final prompt (every message's overhead and the reply priming included)."""
    sections: dict[str, int]
    """Tokens per section (keys: :data:`SECTIONS`), counted on the final messages."""
    budgets: dict[str, int]
    """The budget each section had this turn: ``fabric`` and ``prior_context`` (their caps,
    lowered to the room left by the system messages and the newest user message), ``history``
    (what the pruner got: the prompt budget less the two sections' tokens)."""
    prune: PruneReport
    """The pruner's report on the system messages and the history: a decision per message."""
    query: str | None
    """What recall searched for (None: no recall)."""
    episodes: tuple[EpisodeDecision, ...]
    """Every episode recall found, included or not, best first."""
    notes: tuple[str, ...]
    """Sections shrunk or left out, and why; the pruner's notes are in :attr:`prune`."""

    @property
    def prompt_budget(self) -> int:
        """The most tokens the prompt may have: the window less the reserve."""
        return self.max_prompt_tokens - self.reserve_output_tokens

    @property
    def total_tokens(self) -> int:
        """The prompt plus the reserve: what the turn may take of the window."""
        return self.prompt_tokens + self.reserve_output_tokens

    def summary(self) -> dict[str, Any]:
        """A JSON-ready digest, for logs and ``--json`` output."""
        return {
            "session_id": self.session_id,
            "agent_id": self.agent_id,
            "max_prompt_tokens": self.max_prompt_tokens,
            "reserve_output_tokens": self.reserve_output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "sections": dict(self.sections),
            "budgets": dict(self.budgets),
            "query": self.query,
            "episodes": [
                {
                    "episode_id": e.episode_id,
                    "session_id": e.session_id,
                    "score": e.score,
                    "action": e.action,
                    "reason": e.reason,
                }
                for e in self.episodes
            ],
            "notes": list(self.notes),
            "prune": self.prune.summary(),
        }


@dataclass(frozen=True)
class BuiltPrompt:
    """A prompt ready for a provider, with the report of how it was built."""

    messages: list[Message]
    """The prompt (copies: the caller may change them)."""
    report: BuildReport
    """Tokens per section, every pruning and recall decision."""
    context_at: int | None = None
    """Index of the first per-turn section (fabric view or recall) in :attr:`messages`, or
    None if there is none; the messages before it are the same from turn to turn (where a
    provider cache breakpoint belongs)."""

    def to_openai(self) -> list[dict[str, Any]]:
        """The messages as OpenAI chat dicts."""
        return to_openai(self.messages)

    @property
    def stable_prefix(self) -> int:
        """How many leading messages stay the same from turn to turn until the pruner's next
        cut (0 when the pruner is not cache-stable): what a provider's prompt cache can hit.
        """
        n = self.report.prune.stable_prefix_messages or 0
        return n if self.context_at is None else min(n, self.context_at)

    def to_anthropic(
        self, *, cache: bool = True, ttl: Literal["5m", "1h"] | None = None
    ) -> AnthropicPayload:
        """The messages in Anthropic's format (``system`` blocks and ``messages``), with
        ``cache_control`` breakpoints on the stable prefix unless ``cache`` is False (see
        :func:`~ctxkeep.anthropic_cache.place_cache_breakpoints`).
        """
        if not cache:
            return to_anthropic(self.messages)
        from ctxkeep.anthropic_cache import place_cache_breakpoints

        return place_cache_breakpoints(self.messages, stable_prefix=self.stable_prefix, ttl=ttl)


def _decision(h: Hit, action: EpisodeAction, reason: str) -> EpisodeDecision:
    return EpisodeDecision(
        episode_id=h.episode.episode_id,
        session_id=h.episode.session_id,
        score=h.score,
        action=action,
        reason=reason,
    )


__all__ = [
    "SECTIONS",
    "BuildReport",
    "BuiltPrompt",
    "EpisodeAction",
    "EpisodeDecision",
]

"""The compose stage: one budget rule and one recall policy for every prompt ctxkeep makes.

Every caller that turns a history into a prompt (:class:`~ctxkeep.ContextBuilder`, the chat
clients, the Agents SDK input filter, the LangChain middleware, the pydantic-ai processor, the
server's prompt route) takes its budget from :func:`prompt_budget` and gives recall its room
by :func:`recall_room`, so the same window, reserve and tools give the same prompt budget, and
recall competes with history by the same rule, wherever the prompt is made:

* **The budget**: ``window - reserve - tools - margin``. The margin is
  :func:`~ctxkeep.tokens.estimate_margin`: 0 for an exact counter, at least a few percent (and
  at least the largest error its calibration has seen) for an estimating one, so an estimate
  never fills the window to its last token.
* **Recall's room**: at most ``max_tokens`` (the recall cap), and never what the messages the
  pruner cannot drop need (the system messages, the instructions, the newest user message and
  the reply priming): recall takes room from older history, never from those.

:func:`recall_then_fit` is the stage the framework adapters share: recall for the newest user
message within :func:`recall_room`, joined to the instructions (the frameworks carry one system
prompt), and the history pruned into what is left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ctxkeep.builder.sections import recall_block
from ctxkeep.errors import BudgetExceededError
from ctxkeep.messages import SYSTEM_ROLES, Message
from ctxkeep.tokens import TokenCounter, estimate_margin

if TYPE_CHECKING:
    from ctxkeep.episodic.base import Hit

R = TypeVar("R")


def prompt_budget(
    window: int,
    reserve: int = 0,
    *,
    tools: int = 0,
    counter: TokenCounter | None = None,
) -> int:
    """The most tokens a prompt may count: ``window - reserve - tools - margin``.

    Args:
        window: the model's context window (or the budget a caller gave), in tokens.
        reserve: tokens kept for the reply.
        tools: tokens of the tool definitions sent with the prompt.
        counter: the counter the prompt is counted with; an estimating one
            (``exact`` False) keeps :func:`~ctxkeep.tokens.estimate_margin` free.

    Returns:
        The budget; 0 or less when nothing fits (the caller says what is in the way).

    """
    limit = window - reserve - tools
    if counter is None or limit <= 0:
        return limit
    return limit - estimate_margin(counter, limit)


def must_keep_tokens(
    counter: TokenCounter, messages: Sequence[Message], newest_user: Message | None
) -> int:
    """Tokens of what a pruner never drops: the system messages among ``messages``, the
    newest user message and the reply priming.
    """
    n = counter.count_messages([]) + sum(
        counter.count_message(m) for m in messages if m.role in SYSTEM_ROLES
    )
    if newest_user is not None:
        n += counter.count_message(newest_user)
    return n


def recall_room(budget: int, must_keep: int, max_tokens: int) -> int:
    """The tokens recall may take: at most ``max_tokens``, never what ``must_keep`` needs."""
    return max(0, min(max_tokens, budget - must_keep))


def newest_user_message(messages: Sequence[Message]) -> Message | None:
    """The newest user message of ``messages`` (None if there is none)."""
    return next((m for m in reversed(messages) if m.role == "user"), None)


@dataclass(frozen=True)
class RecallPolicy:
    """What recall looks for and how much it may take (the adapters' settings)."""

    episodic: Any
    """The episodic store searched (None: no recall)."""
    top_k: int = 3
    """Episodes recalled at most."""
    max_tokens: int = 1500
    """The most tokens the recalled block may take."""
    min_score: float | None = 0.0
    """An episode is recalled only with lexical evidence and at least this fused score."""
    filters: Mapping[str, Any] | None = None
    """Filters for the episodic search."""


def join_prior(instructions: str | None, prior: str) -> str | None:
    """The instructions with the recalled block after them (either may be missing)."""
    if not prior:
        return instructions
    return f"{instructions}\n\n{prior}" if instructions else prior


def recall_then_fit(
    fit: Callable[[str], R],
    *,
    query: str,
    room: int,
    recall: RecallPolicy | None,
    counter: TokenCounter,
) -> tuple[R, list[Hit], str]:
    """Recall for ``query`` within ``room`` tokens (:func:`recall_room`), then ``fit(prior)``
    (the caller joins the ``### Prior Historical Context`` block ``prior`` to its system
    prompt and prunes): what the framework adapters share.

    The room leaves what the pruner cannot drop; the block joined to a system prompt counts a
    few tokens apart from the block alone, so where that tips the budget the prompt is fitted
    again without recall: recall yields to the conversation, never the other way.

    Returns:
        What ``fit`` returned, the episodes recalled, and the block (``""``: none).

    Raises:
        Whatever ``fit("")`` raises (``BudgetExceededError``...).

    """
    hits: list[Hit] = []
    prior = ""
    if recall is not None and recall.episodic is not None and room > 0 and query.strip():
        hits, prior = recall_block(
            recall.episodic,
            query,
            top_k=recall.top_k,
            max_tokens=room,
            min_score=recall.min_score,
            filters=recall.filters,
            tokens=counter.count_message,
        )
    if prior:
        try:
            return fit(prior), hits, prior
        except BudgetExceededError:
            pass
    return fit(""), [], ""


__all__ = [
    "RecallPolicy",
    "join_prior",
    "must_keep_tokens",
    "newest_user_message",
    "prompt_budget",
    "recall_room",
    "recall_then_fit",
]

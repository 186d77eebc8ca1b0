"""Replaying agent runs through the pruner, step by step.

A run is a list of messages. Every assistant message marks a step: the prompt of that step
is everything before it. :func:`replay_run` prunes every step's prompt and checks the result
(budget, provider validity), which is what ``ctxkeep replay``, ``ctxkeep demo`` and the
benchmarks report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ctxkeep.errors import BudgetExceededError, MessageError
from ctxkeep.messages import Message, coerce_messages, validate_sequence
from ctxkeep.prune import TokenPruner
from ctxkeep.tokens import TokenCounter


@dataclass
class RunStats:
    """What replaying one run through a pruner gave."""

    name: str
    """The run's name (file name or id)."""
    prompts: int = 0
    """Steps replayed (assistant messages with history before them)."""
    tokens_unpruned: int = 0
    """Tokens the prompts would have had unpruned."""
    tokens_sent: int = 0
    """Tokens of the pruned prompts."""
    over_budget: int = 0
    """Pruned prompts over the budget."""
    invalid: int = 0
    """Pruned prompts that are not a valid provider sequence."""
    compressed: int = 0
    """Tool outputs sent compressed, over all prompts."""
    errors: int = 0
    """Steps the pruner refused (the must-keep messages alone exceed the budget)."""
    per_step: list[tuple[int, int]] = field(default_factory=list)
    """(tokens unpruned, tokens sent) per step, for plots."""

    @property
    def saving(self) -> float:
        """Fraction of tokens not sent."""
        return 1 - self.tokens_sent / self.tokens_unpruned if self.tokens_unpruned else 0.0

    def add(self, other: RunStats) -> None:
        """Fold another run's totals into this one."""
        for k in (
            "prompts",
            "tokens_unpruned",
            "tokens_sent",
            "over_budget",
            "invalid",
            "compressed",
            "errors",
        ):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def to_dict(self) -> dict[str, Any]:
        """The totals as a dict (without per-step data)."""
        d = asdict(self)
        d.pop("per_step")
        d["saving"] = round(self.saving, 4)
        return d


def step_prompts(messages: Sequence[Message]) -> list[int]:
    """The indexes of the assistant messages that begin a step."""
    return [i for i, m in enumerate(messages) if m.role == "assistant" and i > 0]


def replay_run(
    name: str,
    messages: Sequence[Any],
    prune: Callable[[list[Message]], list[Message]],
    counter: TokenCounter,
    budget: int,
    *,
    on_step: Callable[[], None] | None = None,
) -> RunStats:
    """Prune every step's prompt of one run and measure the result.

    Args:
        name: the run's name.
        messages: the whole run.
        prune: the pruner under test (any callable from messages to messages).
        counter: counts the tokens sent.
        budget: the budget the prompts must keep.
        on_step: called after each step (progress bars).

    """
    msgs = coerce_messages(messages)
    stats = RunStats(name)
    for k in step_prompts(msgs):
        prompt = msgs[:k]
        before = counter.count_messages(prompt)
        stats.prompts += 1
        stats.tokens_unpruned += before
        try:
            out = prune(prompt)
        except BudgetExceededError:
            stats.errors += 1
            stats.per_step.append((before, 0))
            continue
        sent = counter.count_messages(out)
        stats.tokens_sent += sent
        stats.per_step.append((before, sent))
        if sent > budget:
            stats.over_budget += 1
        try:
            validate_sequence(out)
        except MessageError:
            stats.invalid += 1
        stats.compressed += sum(1 for m in out if "ctxkeep_compressed" in m.metadata)
        if on_step is not None:
            on_step()
    return stats


def ctxkeep_pruner(
    budget: int, last_n: int, counter: TokenCounter, *, cache_stable: bool | None = None
) -> TokenPruner:
    """The pruner ``ctxkeep replay`` uses: :class:`TokenPruner`'s defaults otherwise.

    ``cache_stable`` is passed through: None is the pruner's default (the cache-stable mode);
    ``False`` gives the mode that prunes every prompt to the full budget (the benchmarks
    compare the two).
    """
    return TokenPruner(
        max_token_budget=budget,
        preserve_last_n=last_n,
        counter=counter,
        cache_stable=cache_stable,
    )

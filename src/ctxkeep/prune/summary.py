"""Summaries: the protocols a summarizer meets, and how the pruner asks it for a summary.

When a prune drops history and the pruner has a summarizer, one message it writes stands in for
what was dropped (the plan reserves ``summary_max_tokens`` for it). The plan leaves the walk
over the dropped units unfinished (``_Plan.rest``): only a summary needs them, so
:meth:`_Summaries._all_dropped` finishes it. A summarizer that fails, or an async-only one
given to a sync prune, never loses the prompt: the report says why
(``PruneReport.summary_error``) and the dropped history goes unsummarised.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable
from typing import Any, Protocol, runtime_checkable

from ctxkeep.messages import Message
from ctxkeep.prune.fit import _Fitter
from ctxkeep.prune.units import _Plan, _Unit


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


class _Summaries(_Fitter):
    """Asking the summarizer for a summary of the dropped history: the third layer of
    :class:`~ctxkeep.TokenPruner`.
    """

    def _summarize(self, plan: _Plan) -> tuple[str | None, str | None]:
        """The summary of ``plan``'s dropped history if one is wanted, and why there is none
        if the summarizer could not write it.
        """
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
        return summary, error

    async def _asummarize(self, plan: _Plan) -> tuple[str | None, str | None]:
        """Async :meth:`_summarize` (awaits an async summarizer)."""
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
        return summary, error

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


async def _await(x: Awaitable[Any]) -> Any:
    return await x


__all__ = [
    "AsyncSummarizer",
    "Summarizer",
]

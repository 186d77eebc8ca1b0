"""The plan stage's two modes, as values: how a pruner chooses the units of each prompt, and
how it reads a stored session for it.

A :class:`~ctxkeep.TokenPruner` holds one mode, :attr:`~ctxkeep.TokenPruner.mode`, made once
from its config (``cache_stable``); nothing else in the pruner asks which mode it is in. Both
modes plan over the same parts (the walk over units of :mod:`ctxkeep.prune.units`, the costs and
the fit of :mod:`ctxkeep.prune.fit`) and answer the same two questions:

* ``plan(items)``: the units kept and the messages compressed (a
  :class:`~ctxkeep.prune.units._Plan`);
* ``read(memory, session_id, prefix)``: the session's prompt read the way the mode needs it,
  or None where it needs every message (the manager then reads them all).

:class:`FillMode` (``cache_stable=False``) fills the budget on every prune (the default
mode's rules, :meth:`~ctxkeep.prune.fit._Fitter._plan`) and reads the newest pages of a
session, as many as the prune provably needs (:mod:`ctxkeep.prune.tail`).
:class:`CacheStableMode` (the default) folds over the history in jumps so that consecutive
prompts share their prefix (:mod:`ctxkeep.prune.stable`), keeps the folds of the last few
histories, and reads a session from its fold snapshot (:mod:`ctxkeep.prune.snapshots`).

A caller that splits a prompt's budget with other sections asks :attr:`keeps_budget`: a
cache-stable prune keeps its own budget (a budget that moved would move its cuts), a filling
one takes whatever it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ctxkeep.prune.stable import _StableFolds

if TYPE_CHECKING:
    from ctxkeep.foldstate import FoldState
    from ctxkeep.messages import Message
    from ctxkeep.prune.pruner import TokenPruner
    from ctxkeep.prune.units import _Plan
    from ctxkeep.sessions.base import MemoryManager, SessionPrompt


class FillMode:
    """Every prune fills the budget: the newest units that fit, the older ones dropped."""

    name: ClassVar[str] = "fill"
    keeps_budget: ClassVar[bool] = False
    """Whether the prune keeps its own budget whatever room a caller has (no: it fills any)."""

    def __init__(self, pruner: TokenPruner) -> None:
        self.pruner = pruner

    def plan(self, items: list[Any]) -> _Plan:
        """The units kept and the messages compressed for ``items``."""
        return self.pruner._plan(items)

    def read(
        self, memory: MemoryManager, session_id: str, prefix: list[Message]
    ) -> SessionPrompt | None:
        """The prompt from the session's newest pages (see :mod:`ctxkeep.prune.tail`), or
        None where the pruner may not read so (a subclass, a summarizer) or the pages cannot
        place their report.
        """
        from ctxkeep.prune.read import prompt_from_pages
        from ctxkeep.prune.tail import pages_suffice

        if not pages_suffice(self.pruner):
            return None
        return prompt_from_pages(memory.reads, session_id, prefix, self.pruner)


class CacheStableMode:
    """Prunes in jumps so consecutive prompts share their prefix (:mod:`ctxkeep.prune.stable`):
    the fold of each history, kept for the last few histories, and dropped when the counter's
    counts change (an estimating counter that learnt a new ratio says so by its ``version``:
    sums kept from the old counts would let a prompt overrun its budget).
    """

    name: ClassVar[str] = "cache-stable"
    keeps_budget: ClassVar[bool] = True
    """Whether the prune keeps its own budget whatever room a caller has (yes: a budget that
    moved would move its cuts, and the prefix with them)."""

    def __init__(self, pruner: TokenPruner) -> None:
        self.pruner = pruner
        self._folds = _StableFolds(pruner)
        self._counts = getattr(pruner.counter, "version", None)

    @property
    def folds(self) -> _StableFolds:
        """The folds kept, new ones when the counter's counts changed since they were made."""
        version = getattr(self.pruner.counter, "version", None)
        if version != self._counts:
            self._folds, self._counts = _StableFolds(self.pruner), version
        return self._folds

    def plan(self, items: list[Any]) -> _Plan:
        """The units kept and the messages compressed for ``items``: the fold's plan (an empty
        history has none: the fill rules plan it, and refuse it alike).
        """
        plan = self.folds.plan(items)
        return plan if plan is not None else self.pruner._plan(items)

    def plan_state(
        self, items: list[Any], seed: FoldState | None
    ) -> tuple[_Plan, FoldState | None]:
        """:meth:`plan` from ``seed`` where no fold kept here covers it, and the fold's state
        afterwards (None where there can be none): what a session's first prompt of a process
        folds from (:mod:`ctxkeep.prune.snapshots`).

        Raises:
            FoldMismatch: ``seed`` does not describe ``items``.

        """
        if self._counts is not None:
            seed = None  # an estimate's counts change as it learns: no state stands for them
        plan, state = self.folds.plan_state(items, seed, state=True)
        return (plan if plan is not None else self.pruner._plan(items)), state

    def read(
        self, memory: MemoryManager, session_id: str, prefix: list[Message]
    ) -> SessionPrompt | None:
        """The prompt from the session's fold snapshot and the messages from its window on
        (:func:`~ctxkeep.prune.read.prompt_from_fold`), or None where no snapshot may stand
        for a replay (:func:`~ctxkeep.prune.snapshots.snapshot_key`) or the store keeps none.
        """
        from ctxkeep.prune.read import prompt_from_fold
        from ctxkeep.prune.snapshots import snapshot_key

        reads = memory.reads
        key = snapshot_key(self.pruner, prefix) if reads.backend.supports_folds else None
        if key is None:
            return None
        return prompt_from_fold(reads, session_id, prefix, self.pruner, key)


PruneMode = FillMode | CacheStableMode
"""A pruner's plan stage (see the module docstring)."""


def mode_for(pruner: TokenPruner) -> PruneMode:
    """The mode ``pruner``'s config names: what :class:`~ctxkeep.TokenPruner` holds."""
    return CacheStableMode(pruner) if pruner.config.cache_stable else FillMode(pruner)


__all__ = ["CacheStableMode", "FillMode", "PruneMode", "mode_for"]

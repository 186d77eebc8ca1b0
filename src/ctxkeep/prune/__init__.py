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
full again, so consecutive prompts share their prefix byte for byte (:mod:`ctxkeep.prune.stable`).

The budget counts every output message with its overhead plus the reply priming, with the
configured counter. Token counts are cached per message, so the walk back from the newest
message costs what is kept, not the length of the history; the per-message report is built
only when asked for.

The input may be ``Message`` objects or OpenAI dicts: a dict is read (validated and made a
``Message``) only when the pruner reaches it, and the message made from it is reused, token
counts included, while the dict compares equal to a snapshot taken when it was read
(:mod:`~ctxkeep.prune.inputs`), so a warm prune of 10,000 dicts costs what it keeps plus one
pass over the input, not 10,000 validations.

The package, in the order its modules build on one another: :mod:`~ctxkeep.prune.inputs` (the
input, read lazily), :mod:`~ctxkeep.prune.report`
(:class:`PruneReport` and :class:`MessageDecision`), :mod:`~ctxkeep.prune.units` (the walk that
cuts a history into units and repairs it), :mod:`~ctxkeep.prune.fit` (token costs, compression
and the default mode's plan), :mod:`~ctxkeep.prune.summary` (the summarizer protocols and the
summary of dropped history) and :mod:`~ctxkeep.prune.pruner` (:class:`TokenPruner`, which
inherits those layers, and the output step). Its settings are one frozen
:class:`PrunerConfig` (:mod:`~ctxkeep.prune.config`); its plan stage is one of two modes, as
values (:mod:`~ctxkeep.prune.modes`): filling the budget, or the cache-stable fold of
:mod:`ctxkeep.prune.stable`.
"""

from ctxkeep.prune.config import PrunerConfig
from ctxkeep.prune.pruner import TokenPruner
from ctxkeep.prune.report import Action as Action
from ctxkeep.prune.report import MessageDecision, PruneReport
from ctxkeep.prune.summary import AsyncSummarizer, Summarizer
from ctxkeep.prune.units import _Plan as _Plan
from ctxkeep.prune.units import _Repairs as _Repairs
from ctxkeep.prune.units import _Unit as _Unit

__all__ = [
    "AsyncSummarizer",
    "MessageDecision",
    "PruneReport",
    "PrunerConfig",
    "Summarizer",
    "TokenPruner",
]

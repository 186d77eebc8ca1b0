"""The old home of the cache-stable fold and the Anthropic breakpoints, kept so that imports
users hold keep working: the fold is :mod:`ctxkeep.prune.stable` (with the pruner), the
breakpoints :mod:`ctxkeep.anthropic_cache` (with the Anthropic format).
"""

from ctxkeep.anthropic_cache import ANTHROPIC_MAX_BREAKPOINTS, place_cache_breakpoints
from ctxkeep.foldstate import FOLD_FORMAT, FoldMismatch, FoldState, Unread, UnreadMessageTouched

__all__ = [
    "ANTHROPIC_MAX_BREAKPOINTS",
    "FOLD_FORMAT",
    "FoldMismatch",
    "FoldState",
    "Unread",
    "UnreadMessageTouched",
    "place_cache_breakpoints",
]

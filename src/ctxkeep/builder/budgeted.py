"""A :class:`~ctxkeep.builder.core.ContextBuilder` for one window: the builder every front end
(``POST /v1/sessions/{id}/prompt``, the inspector, ``ctxkeep mcp``'s ``build_prompt``) makes
from a window size, an output reserve, the recent messages kept and an encoding.
"""

from __future__ import annotations

from ctxkeep.artifacts.base import ArtifactStore
from ctxkeep.builder.compose import prompt_budget
from ctxkeep.builder.core import ContextBuilder
from ctxkeep.prune import TokenPruner
from ctxkeep.sessions.base import MemoryManager
from ctxkeep.tokens import get_counter


def budgeted_builder(
    memory: MemoryManager,
    *,
    artifacts: ArtifactStore,
    max_prompt_tokens: int,
    reserve_output_tokens: int,
    preserve_last_n: int,
    encoding: str | None,
) -> ContextBuilder:
    """The builder of ``POST /v1/sessions/{id}/prompt`` (and the inspector's compositions):
    the history pruned to ``max_prompt_tokens - reserve_output_tokens``, old outputs
    compressed into ``artifacts``.

    Raises:
        UnknownEncodingError: an unknown encoding.
        ConfigError: a reserve that leaves the prompt no room.

    """
    counter = get_counter(encoding)
    pruner = TokenPruner(
        max(1, prompt_budget(max_prompt_tokens, reserve_output_tokens, counter=counter)),
        preserve_last_n,
        counter=counter,
        artifacts=artifacts,
    )
    return ContextBuilder(
        memory,
        counter=counter,
        pruner=pruner,
        max_prompt_tokens=max_prompt_tokens,
        reserve_output_tokens=reserve_output_tokens,
    )


__all__ = ["budgeted_builder"]

"""ctxkeep for LangGraph: a checkpointer and a memory store (extra ``ctxkeep[langgraph]``).

* :class:`CtxkeepSaver`: a ``BaseCheckpointSaver`` (sync and async) over SQLite, PostgreSQL
  and Redis, on ctxkeep's engine clients and migrations;
* :class:`CtxkeepStore`: a ``BaseStore`` over ctxkeep's episodic stores, so ``search`` is
  hybrid (lexical + dense) recall.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxkeep.integrations.langgraph.saver import CtxkeepSaver
    from ctxkeep.integrations.langgraph.store import CtxkeepStore

__all__ = ["CtxkeepSaver", "CtxkeepStore"]


def __getattr__(name: str) -> Any:
    # Each part imports its LangGraph modules only when asked for.
    if name == "CtxkeepSaver":
        from ctxkeep.integrations.langgraph.saver import CtxkeepSaver

        return CtxkeepSaver
    if name == "CtxkeepStore":
        from ctxkeep.integrations.langgraph.store import CtxkeepStore

        return CtxkeepStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

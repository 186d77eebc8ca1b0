"""Context isolation: task-shared state, agent-private scratchpads, and the message bus.

The PostgreSQL fabric (:class:`PostgresBus`, :class:`PostgresTaskState`, from
``ctxkeep.fabric.postgres``) is loaded on first use, as it needs the ``postgres`` extra.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ctxkeep.fabric.bus import BusStats, DeadLetter, InProcessBus, IPCMessage, MessageBus
from ctxkeep.fabric.core import ContextFabric, ContextLayer, ContextView, freeze

if _TYPE_CHECKING:
    from ctxkeep.fabric.postgres import PgHandledMark, PostgresBus, PostgresTaskState

_LAZY = {
    "PgHandledMark": "ctxkeep.fabric.postgres",
    "PostgresBus": "ctxkeep.fabric.postgres",
    "PostgresTaskState": "ctxkeep.fabric.postgres",
}


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxkeep.fabric' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BusStats",
    "ContextFabric",
    "ContextLayer",
    "ContextView",
    "DeadLetter",
    "IPCMessage",
    "InProcessBus",
    "MessageBus",
    "PgHandledMark",
    "PostgresBus",
    "PostgresTaskState",
    "freeze",
]

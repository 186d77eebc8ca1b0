"""``ctxkeep serve``: session memory, prompt building, artifacts, episodic memory,
checkpoints and the context fabric as an HTTP service, per tenant.

:func:`create_app` builds the ASGI application (FastAPI) over a storage URL;
:mod:`~ctxkeep.server.routes` lists the session, message and prompt endpoints,
:mod:`~ctxkeep.server.routes_memory` those of artifacts, episodes and checkpoints,
:mod:`~ctxkeep.server.routes_fabric` those of task state and the bus (over
:mod:`~ctxkeep.server.fabric`); :mod:`~ctxkeep.server.tenants` says how each tenant gets stores
of its own, :mod:`~ctxkeep.server.keys` the API keys,
:mod:`~ctxkeep.server.problems` the errors (RFC 9457) and :mod:`~ctxkeep.server.wire` the JSON
of messages. :class:`ctxkeep.client.RemoteMemory` is the client.

The service needs the ``server`` extra (``pip install 'ctxkeep[server]'``); importing
:func:`create_app` without it raises an ``ImportError`` naming the extra. ``problems`` and
``wire`` import nothing beyond ctxkeep (the client uses them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ctxkeep.server.app import create_app


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ctxkeep.server.app import create_app

        return create_app
    raise AttributeError(f"module 'ctxkeep.server' has no attribute {name!r}")


__all__ = ["create_app"]

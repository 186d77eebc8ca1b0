"""What every route depends on: the server's state, the request's record, and the tenant of the
request's API key.

:mod:`ctxkeep.server.app` makes the :class:`ServerState` and puts it on ``app.state.ctxkeep``;
the routes (:mod:`~ctxkeep.server.routes`, :mod:`~ctxkeep.server.routes_memory`,
:mod:`~ctxkeep.server.routes_fabric`, :mod:`~ctxkeep.server.inspector`) take a :class:`Tenant`
through :data:`TenantDep`, which authenticates the request (:func:`tenant_of`). The app
imports the routes and both import this module; the routes never import the app.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import Scope

from ctxkeep.server.keys import KeyRegistry
from ctxkeep.server.models import EvictedOut
from ctxkeep.server.tenants import TenantResources, TenantStores, collect_evictions
from ctxkeep.server.wire import evicted_to_wire
from ctxkeep.sessions.base import Evicted, MemoryManager


class Unauthorized(Exception):
    """A request without a valid API key (answered 401)."""


@dataclass
class ServerState:
    """What the application holds: the key registry and the tenants' stores."""

    url: str
    """The storage URL."""
    keys: KeyRegistry
    """The API keys."""
    stores: TenantStores
    """The tenants' managers."""
    max_body_bytes: int
    """The request body limit."""

    def close(self) -> None:
        """Close every tenant's manager and the registry."""
        self.stores.close()
        self.keys.close()


@dataclass
class RequestInfo:
    """What the access log learns during a request (shared through the ASGI scope)."""

    tenant: str | None = None
    evicted: list[Evicted] = field(default_factory=list)
    appended: int = 0
    """Messages the request stored (the append and replace routes), for the metrics."""
    report: Any = None
    """The prompt route's :class:`~ctxkeep.builder.BuildReport`, for the metrics."""


def request_info(scope: Scope) -> RequestInfo:
    """The request's :class:`RequestInfo` (made on first use)."""
    info = scope.get("ctxkeep.request")
    if not isinstance(info, RequestInfo):
        info = scope["ctxkeep.request"] = RequestInfo()
    return info


_bearer = HTTPBearer(
    auto_error=False,
    description="An API key from `ctxkeep keys create --tenant NAME`.",
)


@dataclass
class Tenant:
    """An authenticated request's tenant."""

    name: str
    """The tenant."""
    state: ServerState
    """The server."""
    info: RequestInfo
    """The request's access-log and eviction record."""

    @contextmanager
    def memory(self) -> Iterator[MemoryManager]:
        """The tenant's manager for the block; its evictions are recorded for the response."""
        with self.stores() as resources:
            yield resources.memory

    @contextmanager
    def stores(self) -> Iterator[TenantResources]:
        """All the tenant's stores for the block; evictions are recorded for the response."""
        with (
            self.state.stores.lease_stores(self.name) as resources,
            collect_evictions(self.info.evicted),
        ):
            yield resources

    def evicted(self) -> list[EvictedOut]:
        """What the request evicted, for the response."""
        return [EvictedOut.model_validate(evicted_to_wire(e)) for e in self.info.evicted]


async def tenant_of(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """The tenant of the request's API key.

    Raises:
        Unauthorized: no ``Authorization: Bearer`` key, or not a live one.

    """
    if credentials is None:
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    state: ServerState = request.app.state.ctxkeep
    # A key checked within the last seconds is taken from memory on the event loop: no
    # statement and no thread hand-off (see ctxkeep.server.keys).
    key = state.keys.cached(credentials.credentials)
    if key is None:
        key = await anyio.to_thread.run_sync(state.keys.authenticate, credentials.credentials)
    if key is None:
        # Where the key was looked for, without naming the store to a client with no key.
        raise Unauthorized(
            "the API key is not a live key of this server's store: it was revoked, or made "
            "for another store (`ctxkeep keys create --tenant NAME --db URL` with the URL "
            "`ctxkeep serve --db` was given; `ctxkeep serve` prints it at startup)"
        )
    info = request_info(request.scope)
    info.tenant = key.tenant
    return Tenant(key.tenant, state, info)


TenantDep = Annotated[Tenant, Depends(tenant_of)]
"""A route's parameter for the request's authenticated :class:`Tenant`."""

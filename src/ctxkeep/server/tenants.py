"""Each tenant's own stores, derived from the server's storage URL, and a bounded pool of
open ones.

Isolation is structural: a tenant's sessions, artifacts, checkpoints, episodes, task states and
bus live in stores of their own, so an id from another tenant is simply not there (404) and no
listing, count or search can include it. From the server's URL:

==========================  =========================================================
server URL                  tenant ``acme``
==========================  =========================================================
``memory://``               its own in-process :class:`~ctxkeep.SessionMemory`
``sqlite:///dir/f.db``      ``sqlite:///dir/f.tenants/acme.db``
``redis://...?prefix=P``    key prefix ``Ptenant:acme:`` (``P`` default ``ctxkeep:``)
``postgresql://...``        schema ``<base>_tenant_acme`` (``<base>``: the URL's
                            ``search_path`` schema, else ``ctxkeep``), created on first use
==========================  =========================================================

Every kind of record of a tenant lives at that one URL: the SQLite file holds the sessions,
artifacts, checkpoints and episodes tables; the Redis prefix and the PostgreSQL schema hold
them all too. Three exceptions, all from what ctxkeep's stores support (DESIGN.md, Storage):

* episodes have no Redis store: on a ``redis://`` server the episodic routes answer 501
  ``not-available`` (:class:`~ctxkeep.server.problems.NotAvailableError`);
* on PostgreSQL, the episodes' ``vector`` type comes from the pgvector extension, which lives
  in one schema of the database: a tenant's episodic store searches its own schema, then the
  extension's (created as ``ctxkeep_extensions`` if the database has none), never another
  tenant's;
* task states and the bus (:mod:`ctxkeep.server.fabric`) are in Redis under the tenant's prefix
  on a ``redis://`` server, in the tenant's schema on a ``postgresql://`` one, and in this
  process for the other URLs (ctxkeep has no SQLite store for them): there they last as long
  as the server process.

:class:`TenantStores` keeps at most ``max_open`` tenants' stores open
(:class:`TenantResources`: the session manager at once, the others on first use), closing the
least recently used tenant's when another is needed; stores in use by a request are closed
only once that request is done with them. ``memory://`` stores hold the data itself and are
never closed before the server stops, nor are the in-process fabrics. The stores are plain
ctxkeep stores over the shared storage, so several server processes can serve the same
tenants at once.

Connections. On PostgreSQL every tenant's stores (and the key registry) share the process's
one pool of the server (:mod:`ctxkeep._pg`): a tenant's schema is chosen per connection as a
store takes it, so a server process holds at most the pool's maximum of connections
(``CTXKEEP_PG_POOL_MAX``) however many tenants are open, and ``N`` workers ``N`` times that;
the server's receives never wait, so its buses open no ``LISTEN`` connection of their own.

Evictions. Every manager reports the messages it trims or evicts to the request that caused
it (:func:`collect_evictions`), so a response can tell its client (and a remote client's
evict hooks) what left the session.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from ctxkeep.artifacts import ArtifactStore, open_artifacts
from ctxkeep.checkpoints import CheckpointStore, open_checkpoints
from ctxkeep.errors import ConfigError
from ctxkeep.server.fabric import LocalFabric, PostgresFabric, RedisFabric, TenantFabric
from ctxkeep.server.keys import KeyRegistry, PostgresKeyRegistry, check_tenant, sqlite_path
from ctxkeep.server.problems import NotAvailableError
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import Evicted, MemoryConfig, MemoryManager

if TYPE_CHECKING:
    from ctxkeep.episodic import Embedder, EpisodicMemoryStore

DEFAULT_MAX_OPEN = 32
EXTENSION_SCHEMA = "ctxkeep_extensions"
"""Where the server creates pgvector when the database has it nowhere."""

_REDIS = ("redis", "rediss", "unix")
SESSION_PARAMS = ("ttl_grace",)
"""Query parameters of a Redis URL that only the session store reads."""
_POSTGRES = ("postgresql", "postgres")
Store = Union[ArtifactStore, CheckpointStore, "EpisodicMemoryStore"]

_EVICTIONS: ContextVar[list[Evicted] | None] = ContextVar("ctxkeep_evictions", default=None)


@contextmanager
def collect_evictions(into: list[Evicted]) -> Iterator[list[Evicted]]:
    """Within the block (and threads started from its context), evictions go to ``into``."""
    token = _EVICTIONS.set(into)
    try:
        yield into
    finally:
        _EVICTIONS.reset(token)


def _report_eviction(evicted: Evicted) -> None:
    """The evict hook of every tenant manager: hand the eviction to the current request."""
    sink = _EVICTIONS.get()
    if sink is not None:
        sink.append(evicted)


def tenant_url(url: str, tenant: str) -> str:
    """The storage URL of a tenant's sessions (see the module docstring).

    Raises:
        ConfigError: an invalid tenant name or unsupported URL.

    """
    check_tenant(tenant)
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        path = Path(sqlite_path(url))
        folder = path.with_name(f"{path.stem}.tenants")
        suffix = f"?{parsed.query}" if parsed.query else ""
        return f"sqlite:///{folder / f'{tenant}.db'}{suffix}"
    if parsed.scheme in _REDIS:
        query = parse_qsl(parsed.query, keep_blank_values=True)
        base = next((v for k, v in reversed(query) if k == "prefix"), "ctxkeep:")
        rest = [(k, v) for k, v in query if k != "prefix"]
        rest.append(("prefix", f"{base}tenant:{tenant}:"))
        return urlunparse(parsed._replace(query=urlencode(rest)))
    if parsed.scheme in _POSTGRES:
        return with_search_path(url, tenant_schema(_base_schema(url), tenant))
    raise ConfigError(f"no tenant stores for {parsed.scheme or url!r} URLs")


def with_search_path(url: str, *schemas: str) -> str:
    """A PostgreSQL URL with its ``search_path`` replaced by ``schemas`` (checked names)."""
    from ctxkeep._pg import split_options

    parsed = urlparse(url)
    query = parse_qsl(parsed.query, keep_blank_values=True)
    kept, _ = split_options(next((v for k, v in reversed(query) if k == "options"), ""))
    rest = [(k, v) for k, v in query if k != "options"]
    rest.append(("options", f"{kept} -csearch_path={','.join(schemas)}".strip()))
    return urlunparse(parsed._replace(query=urlencode(rest)))


def _base_schema(url: str) -> str:
    """The first ``search_path`` schema of a PostgreSQL URL (``ctxkeep`` if none)."""
    from ctxkeep._pg import split_options

    options = parse_qsl(urlparse(url).query, keep_blank_values=True)
    path = split_options(next((v for k, v in reversed(options) if k == "options"), ""))[1]
    first = (path or "").split(",")[0].strip().strip('"')
    return first or "ctxkeep"


def tenant_schema(base: str, tenant: str) -> str:
    """The PostgreSQL schema of a tenant: ``<base>_tenant_<tenant>``.

    Raises:
        ConfigError: the name would be longer than PostgreSQL's 63 bytes, or ``base`` is not a
            plain lower-case identifier.

    """
    schema = f"{base}_tenant_{tenant}"
    if len(schema) > 63 or not schema.replace("_", "a").isalnum() or schema.lower() != schema:
        raise ConfigError(
            f"tenant schema {schema!r} is not a plain identifier of at most 63 characters: "
            "use a shorter lower-case search_path schema or tenant name"
        )
    return schema


def check_embedder_name(name: str) -> str:
    """``name`` if :func:`~ctxkeep.episodic.get_embedder` knows it (checked without loading a
    model, so a server with a bad ``--embedder`` fails at start, not at its first search).

    Raises:
        ConfigError: an unknown name.

    """
    from ctxkeep.episodic import embedders

    known = {*embedders.ALIASES, *embedders.EMBEDDERS}
    if name not in known:
        raise ConfigError(f"unknown embedder {name!r}; use one of {', '.join(sorted(known))}")
    return name


class TenantResources:
    """One tenant's stores: the session manager (opened with the tenant) and the artifacts,
    checkpoints and episodes (each opened on first use). Thread-safe.
    """

    def __init__(self, tenant: str, memory: MemoryManager, owner: TenantStores) -> None:
        self.tenant = tenant
        """The tenant."""
        self.memory = memory
        """Its sessions."""
        self._owner = owner
        self._lock = threading.Lock()
        self._opened: dict[str, Store] = {}

    def _once(self, name: str, make: Callable[[], Store]) -> Store:
        """The store ``name``, opened by ``make`` on first use."""
        with self._lock:
            found = self._opened.get(name)
            if found is None:
                found = self._opened[name] = make()
            return found

    def artifacts(self) -> ArtifactStore:
        """The tenant's artifacts (where prompt building puts compressed tool outputs)."""
        store = self._once(
            "artifacts", lambda: open_artifacts(self._owner.records_url(self.tenant))
        )
        assert isinstance(store, ArtifactStore)
        return store

    def checkpoints(self) -> CheckpointStore:
        """The tenant's checkpoints."""
        store = self._once(
            "checkpoints", lambda: open_checkpoints(self._owner.records_url(self.tenant))
        )
        assert isinstance(store, CheckpointStore)
        return store

    def episodic(self) -> EpisodicMemoryStore:
        """The tenant's episodes.

        Raises:
            NotAvailableError: the server's storage has no episodic store (Redis).

        """
        from ctxkeep.episodic import EpisodicMemoryStore, open_episodic

        store = self._once(
            "episodic",
            lambda: open_episodic(
                self._owner.episodic_url(self.tenant), embedder=self._owner.embedder()
            ),
        )
        assert isinstance(store, EpisodicMemoryStore)
        return store

    def fabric(self) -> TenantFabric:
        """The tenant's task states and bus (kept by :class:`TenantStores`, not closed with
        these stores).
        """
        return self._owner.fabric(self.tenant)

    def close(self) -> None:
        """Close the session manager and every store opened."""
        with self._lock:
            opened = list(self._opened.values())
            self._opened.clear()
        try:
            for store in opened:
                store.close()
        finally:
            self.memory.close()


@dataclass
class _Open:
    """A tenant's open stores and how many requests use them."""

    resources: TenantResources
    users: int = 0
    closing: bool = False


class TenantStores:
    """The tenants' stores over one storage URL, at most ``max_open`` tenants' open at once.

    Args:
        url: the server's storage URL.
        registry: the key registry of the same URL (creates PostgreSQL schemas).
        config: every tenant manager's bounds.
        clock: the managers' time source (tests).
        max_open: how many tenants' stores stay open (not for ``memory://``: those hold the
            data, and every tenant's stays).
        embedder: the episodic stores' embedder: a name (``local``, ``wordllama``, ...) or an
            :class:`~ctxkeep.episodic.Embedder`, made once on first use and shared by every
            tenant (as is its cache of vectors by text).

    """

    def __init__(
        self,
        url: str,
        registry: KeyRegistry,
        *,
        config: MemoryConfig | None = None,
        clock: Callable[[], float] | None = None,
        max_open: int = DEFAULT_MAX_OPEN,
        embedder: str | Embedder = "local",
    ) -> None:
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ConfigError(f"max_open must be a positive int, got {max_open!r}")
        if isinstance(embedder, str):
            check_embedder_name(embedder)
        self.url = url
        self.registry = registry
        self.config = config
        self.clock = clock
        self.max_open = max_open
        self.in_memory = url == "memory://"
        self.scheme = "memory" if self.in_memory else urlparse(url).scheme
        self._embedder_spec = embedder
        self._embedder: Embedder | None = None
        self._vector_schema: str | None = None
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._fabrics: dict[str, TenantFabric] = {}
        self._lock = threading.Lock()
        self._opening: dict[str, threading.Lock] = {}
        self._shared = threading.Lock()  # the embedder, the vector schema, the fabrics

    @contextmanager
    def lease(self, tenant: str) -> Iterator[MemoryManager]:
        """The tenant's manager, held open for the block."""
        with self.lease_stores(tenant) as resources:
            yield resources.memory

    @contextmanager
    def lease_stores(self, tenant: str) -> Iterator[TenantResources]:
        """The tenant's stores, held open for the block."""
        entry = self._acquire(tenant)
        try:
            yield entry.resources
        finally:
            self._release(entry)

    def open_count(self) -> int:
        """How many tenants' stores are open."""
        with self._lock:
            return len(self._open)

    # -- where each tenant's records live ---------------------------------------------------

    def store_url(self, tenant: str) -> str:
        """The URL of the tenant's sessions."""
        return "memory://" if self.in_memory else tenant_url(self.url, tenant)

    def records_url(self, tenant: str) -> str:
        """The URL of the tenant's artifacts, checkpoints and (on Redis) fabric: its sessions'
        without the session store's own parameters (``?ttl_grace=`` on Redis).
        """
        url = self.store_url(tenant)
        if self.scheme in _REDIS:
            from ctxkeep._redis import take_params

            url = take_params(url, SESSION_PARAMS)[0]
        return url

    def episodic_url(self, tenant: str) -> str:
        """The URL of the tenant's episodes.

        Raises:
            NotAvailableError: a Redis server (ctxkeep keeps no episodes in Redis).

        """
        if self.scheme in _REDIS:
            raise NotAvailableError(
                "episodic memory is not available on a redis:// server: ctxkeep keeps "
                "episodes in SQLite or PostgreSQL (pgvector); serve from one of those to save, "
                "search and forget episodes"
            )
        url = self.store_url(tenant)
        if self.scheme in _POSTGRES and isinstance(self.registry, PostgresKeyRegistry):
            with self._shared:
                if self._vector_schema is None:
                    self._vector_schema = self.registry.extension_schema("vector", EXTENSION_SCHEMA)
                vector = self._vector_schema
            url = with_search_path(url, tenant_schema(_base_schema(self.url), tenant), vector)
        return url

    def embedder(self) -> Embedder:
        """The episodic embedder, made on first use."""
        from ctxkeep.episodic import get_embedder

        with self._shared:
            if self._embedder is None:
                self._embedder = get_embedder(self._embedder_spec)
            return self._embedder

    def fabric(self, tenant: str) -> TenantFabric:
        """The tenant's task states and bus, made on first use and kept until :meth:`close`."""
        check_tenant(tenant)
        with self._shared:
            found = self._fabrics.get(tenant)
            if found is None:
                found = self._fabrics[tenant] = self._new_fabric(tenant)
            return found

    def open_fabrics(self) -> dict[str, TenantFabric]:
        """Tenant -> its fabric, for every fabric made so far (``/metrics`` counts their buses)."""
        with self._shared:
            return dict(self._fabrics)

    def _new_fabric(self, tenant: str) -> TenantFabric:
        if self.scheme in _REDIS:
            return RedisFabric(self.records_url(tenant))
        if self.scheme in _POSTGRES:
            if isinstance(self.registry, PostgresKeyRegistry):
                self.registry.create_schema(tenant_schema(_base_schema(self.url), tenant))
            return PostgresFabric(self.records_url(tenant))
        return LocalFabric()

    # -- the pool --------------------------------------------------------------------------

    def _acquire(self, tenant: str) -> _Open:
        with self._lock:
            entry = self._open.get(tenant)
            if entry is not None:
                self._open.move_to_end(tenant)
                entry.users += 1
                return entry
            opening = self._opening.setdefault(tenant, threading.Lock())
        with opening:  # one opener per tenant; others wait and reuse its stores
            with self._lock:
                entry = self._open.get(tenant)
                if entry is not None:
                    self._open.move_to_end(tenant)
                    entry.users += 1
                    return entry
            resources = self._new_resources(tenant)
            with self._lock:
                entry = self._open[tenant] = _Open(resources, users=1)
                evicted = self._overflow()
        for old in evicted:
            old.resources.close()
        return entry

    def _overflow(self) -> list[_Open]:
        """Take the least recently used idle tenants beyond ``max_open`` out (under the lock);
        those in use are marked and closed by their last user.
        """
        if self.in_memory:
            return []
        idle: list[_Open] = []
        while len(self._open) > self.max_open:
            _, old = self._open.popitem(last=False)
            if old.users:
                old.closing = True
            else:
                idle.append(old)
        return idle

    def _release(self, entry: _Open) -> None:
        with self._lock:
            entry.users -= 1
            close = entry.closing and entry.users == 0
        if close:
            entry.resources.close()

    def _new_resources(self, tenant: str) -> TenantResources:
        if not self.in_memory and isinstance(self.registry, PostgresKeyRegistry):
            self.registry.create_schema(tenant_schema(_base_schema(self.url), tenant))
        manager = open_memory(self.store_url(tenant), self.config, clock=self.clock)
        manager.add_evict_hook(_report_eviction)
        return TenantResources(tenant, manager, self)

    def close(self) -> None:
        """Close every open store and fabric."""
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
        with self._shared:
            fabrics = list(self._fabrics.values())
            self._fabrics.clear()
        for entry in entries:
            entry.resources.close()
        for fabric in fabrics:
            fabric.close()

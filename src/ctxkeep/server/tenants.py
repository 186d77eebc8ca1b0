"""Each tenant's own session store, derived from the server's storage URL, and a bounded pool
of open managers.

Isolation is structural: a tenant's sessions live in a store of its own, so an id from another
tenant is simply not there (404) and no listing or count can include it. From the server's
URL:

==========================  =========================================================
server URL                  tenant ``acme``
==========================  =========================================================
``memory://``               its own in-process :class:`~ctxkeep.SessionMemory`
``sqlite:///dir/f.db``      ``sqlite:///dir/f.tenants/acme.db``
``redis://...?prefix=P``    key prefix ``Ptenant:acme:`` (``P`` default ``ctxkeep:``)
``postgresql://...``        schema ``<base>_tenant_acme`` (``<base>``: the URL's
                            ``search_path`` schema, else ``ctxkeep``), created on first use
==========================  =========================================================

:class:`TenantStores` keeps at most ``max_open`` tenants' managers open, closing the least
recently used one when another is needed; a manager in use by a request is closed only once
that request is done with it. ``memory://`` managers hold the data itself and are never
closed before the server stops. The managers are plain :class:`~ctxkeep.MemoryManager` objects
over the shared store, so several server processes can serve the same tenants at once.

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
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from ctxkeep.errors import ConfigError
from ctxkeep.server.keys import KeyRegistry, PostgresKeyRegistry, check_tenant, sqlite_path
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import Evicted, MemoryConfig, MemoryManager

DEFAULT_MAX_OPEN = 32

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
    if parsed.scheme in ("redis", "rediss", "unix"):
        query = parse_qsl(parsed.query, keep_blank_values=True)
        base = next((v for k, v in reversed(query) if k == "prefix"), "ctxkeep:")
        rest = [(k, v) for k, v in query if k != "prefix"]
        rest.append(("prefix", f"{base}tenant:{tenant}:"))
        return urlunparse(parsed._replace(query=urlencode(rest)))
    if parsed.scheme in ("postgresql", "postgres"):
        query = parse_qsl(parsed.query, keep_blank_values=True)
        options = next((v for k, v in reversed(query) if k == "options"), "")
        kept, base = _without_search_path(options)
        schema = tenant_schema(base, tenant)
        rest = [(k, v) for k, v in query if k != "options"]
        rest.append(("options", f"{kept} -csearch_path={schema}".strip()))
        return urlunparse(parsed._replace(query=urlencode(rest)))
    raise ConfigError(f"no tenant stores for {parsed.scheme or url!r} URLs")


def _without_search_path(options: str) -> tuple[str, str]:
    """The libpq ``options`` without its ``search_path`` setting, and that setting's first schema
    (``ctxkeep`` if none).
    """
    kept: list[str] = []
    base = "ctxkeep"
    words = options.split()
    i = 0
    while i < len(words):
        word = words[i]
        setting = word[2:] if word.startswith("-c") and len(word) > 2 else None
        if word == "-c" and i + 1 < len(words):
            setting, i = words[i + 1], i + 1
        if setting is not None and setting.startswith("search_path="):
            first = setting.split("=", 1)[1].split(",")[0].strip().strip('"')
            base = first or base
        elif setting is not None:
            kept.append(f"-c{setting}")
        else:
            kept.append(word)
        i += 1
    return " ".join(kept), base


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


@dataclass
class _Open:
    """A tenant's open manager and how many requests use it."""

    manager: MemoryManager
    users: int = 0
    closing: bool = False


class TenantStores:
    """The tenants' managers over one storage URL, at most ``max_open`` open at once.

    Args:
        url: the server's storage URL.
        registry: the key registry of the same URL (creates PostgreSQL schemas).
        config: every tenant manager's bounds.
        clock: the managers' time source (tests).
        max_open: how many tenants' managers stay open (not for ``memory://``: those hold
            the data, and every tenant's stays).

    """

    def __init__(
        self,
        url: str,
        registry: KeyRegistry,
        *,
        config: MemoryConfig | None = None,
        clock: Callable[[], float] | None = None,
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ConfigError(f"max_open must be a positive int, got {max_open!r}")
        self.url = url
        self.registry = registry
        self.config = config
        self.clock = clock
        self.max_open = max_open
        self.in_memory = url == "memory://"
        self._open: OrderedDict[str, _Open] = OrderedDict()
        self._lock = threading.Lock()
        self._opening: dict[str, threading.Lock] = {}

    @contextmanager
    def lease(self, tenant: str) -> Iterator[MemoryManager]:
        """The tenant's manager, held open for the block."""
        entry = self._acquire(tenant)
        try:
            yield entry.manager
        finally:
            self._release(entry)

    def open_count(self) -> int:
        """How many tenants' managers are open."""
        with self._lock:
            return len(self._open)

    def _acquire(self, tenant: str) -> _Open:
        with self._lock:
            entry = self._open.get(tenant)
            if entry is not None:
                self._open.move_to_end(tenant)
                entry.users += 1
                return entry
            opening = self._opening.setdefault(tenant, threading.Lock())
        with opening:  # one opener per tenant; others wait and reuse its manager
            with self._lock:
                entry = self._open.get(tenant)
                if entry is not None:
                    self._open.move_to_end(tenant)
                    entry.users += 1
                    return entry
            manager = self._new_manager(tenant)
            with self._lock:
                entry = self._open[tenant] = _Open(manager, users=1)
                evicted = self._overflow()
        for old in evicted:
            old.manager.close()
        return entry

    def _overflow(self) -> list[_Open]:
        """Take the least recently used idle managers beyond ``max_open`` out (under the lock);
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
            entry.manager.close()

    def _new_manager(self, tenant: str) -> MemoryManager:
        if self.in_memory:
            manager = open_memory("memory://", self.config, clock=self.clock)
        else:
            url = tenant_url(self.url, tenant)
            if isinstance(self.registry, PostgresKeyRegistry):
                options = parse_qsl(urlparse(self.url).query)
                base = _without_search_path(
                    next((v for k, v in reversed(options) if k == "options"), "")
                )
                self.registry.create_schema(tenant_schema(base[1], tenant))
            manager = open_memory(url, self.config, clock=self.clock)
        manager.add_evict_hook(_report_eviction)
        return manager

    def close(self) -> None:
        """Close every open manager."""
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
        for entry in entries:
            entry.manager.close()

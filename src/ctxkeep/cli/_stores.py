"""Which store a command works on: ``--db`` (default: the embedded SQLite file), or with
``--tenant NAME`` the store that ``ctxkeep serve --db <the same URL>`` keeps for that tenant.

A tenant's records live at a URL derived from the server's (:mod:`ctxkeep.server.tenants`:
``sqlite:///dir/f.db`` -> ``sqlite:///dir/f.tenants/NAME.db``, a Redis key prefix, a
PostgreSQL schema), so ``ctxkeep sessions list --tenant acme`` lists what the API stored for
acme, and ``ctxkeep demo --tenant acme`` stores a session the inspector shows. The URL is
derived here with the server's own functions, never a copy of its rule.

Commands that only read (``sessions list/show/delete``, ``memory search/forget``, ``keys
list/revoke``) never create a store: opening a SQLite URL makes its directory and file, so a
mistyped ``--db`` would otherwise print an empty listing from a store it just made. They
check first (:func:`require_existing`) and stop with one line saying the store does not
exist. The check covers files (SQLite); a Redis or PostgreSQL URL names a server, whose
stores are read as they are.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from ctxkeep.cli._args import Option
from ctxkeep.errors import ConfigError

if TYPE_CHECKING:
    from ctxkeep.server.tenants import TenantStores
    from ctxkeep.sessions import MemoryManager

TENANT_OPTION = Option(
    ("--tenant",),
    {
        "metavar": "NAME",
        "help": "work on this tenant's store, as `ctxkeep serve --db <the same --db>` keeps it "
        "(the sessions and episodes the API shows for keys of that tenant)",
    },
)
"""``--tenant``, shared by the commands that read or write sessions and episodes."""

_POSTGRES = ("postgresql", "postgres")
_REDIS = ("redis", "rediss", "unix")


def base_url(db: str | None) -> str:
    """``--db``, or the embedded SQLite file's URL."""
    from ctxkeep.sessions import default_url

    return db or default_url()


def _tenant_store_url(url: str, tenant: str) -> str:
    """The URL of a tenant's sessions under a server on ``url``.

    Raises:
        ConfigError: ``memory://`` (a memory server's tenants live inside its process), an
            invalid tenant name or an unsupported URL.

    """
    if url == "memory://":
        raise ConfigError(
            "--tenant needs the server's store: a memory:// server keeps its tenants inside "
            "its own process, where no other command can reach them; give --db the URL that "
            "`ctxkeep serve --db` uses (sqlite:///path.db, redis://... or postgresql://...)"
        )
    from ctxkeep.server.tenants import tenant_url

    return tenant_url(url, tenant)


def require_existing(
    url: str, *, given: bool, tenant: str | None = None, maker: str = "ctxkeep demo"
) -> None:
    """Stop a command that only reads when ``url`` names a SQLite file that does not exist.

    Args:
        url: the store's URL.
        given: whether the user gave ``--db`` (the message differs for the default file).
        tenant: the tenant whose store it is, if any.
        maker: a command that writes to the store (named when the default file is missing).

    Raises:
        ConfigError: the file does not exist; nothing is created.

    """
    if urlparse(url).scheme != "sqlite":
        return
    from ctxkeep.server.keys import sqlite_path

    path = Path(sqlite_path(url))
    if path.is_file():
        return
    if tenant is not None:
        raise ConfigError(
            f"tenant {tenant!r} has no store at {path}: a server on this --db creates it at "
            "the tenant's first request (is --db the URL the server was started with?); "
            "nothing was created"
        )
    if given:
        raise ConfigError(
            f"the store {url} does not exist (no file {path}); check --db: this command only "
            "reads, so it created nothing"
        )
    raise ConfigError(
        f"there is no store yet at {path} (the default; $CTXKEEP_DB sets another): "
        f"`{maker}` makes it, or give --db; nothing was created"
    )


@contextmanager
def open_sessions(db: str | None, tenant: str | None, *, create: bool) -> Iterator[MemoryManager]:
    """The session store of ``--db`` / ``--tenant``, open for the block.

    Args:
        db: ``--db`` (``None``: the embedded file).
        tenant: ``--tenant`` (``None``: ``--db``'s own sessions).
        create: whether the command writes (and may create the store); when not, a store that
            does not exist is an error (:func:`require_existing`).

    Raises:
        ConfigError: see :func:`require_existing` and ``--tenant`` on ``memory://``.

    """
    from ctxkeep.sessions import open_memory

    url = base_url(db)
    if tenant is None:
        if not create:
            require_existing(url, given=db is not None)
        with open_memory(url) as mem:
            yield mem
        return
    store = _tenant_store_url(url, tenant)
    if not create:
        require_existing(store, given=True, tenant=tenant)
    if urlparse(url).scheme in _POSTGRES:
        with _postgres_tenant(url, tenant) as stores, stores.lease(tenant) as mem:
            yield mem  # the server's own path: its schema created as the server creates it
        return
    with open_memory(store) as mem:
        yield mem


def episodic_url(db: str | None, tenant: str | None, *, create: bool) -> str:
    """The URL of the episodic store of ``--db`` / ``--tenant`` (checked as
    :func:`open_sessions` checks, when the command only reads).

    Raises:
        ConfigError: a store that does not exist (reading), ``--tenant`` on ``memory://``, or
            on ``redis://`` (a Redis server keeps no episodes: its episodic routes answer 501).

    """
    url = base_url(db)
    if tenant is None:
        if not create:
            require_existing(url, given=db is not None, maker="ctxkeep memory add")
        return url
    store = _tenant_store_url(url, tenant)
    scheme = urlparse(url).scheme
    if scheme in _REDIS:
        raise ConfigError(
            "a redis:// server keeps no episodes (its episodic routes answer 501): ctxkeep "
            "keeps them in SQLite or PostgreSQL"
        )
    if not create:
        require_existing(store, given=True, tenant=tenant)
    if scheme in _POSTGRES:  # the tenant's schema, then the one that holds pgvector
        with _postgres_tenant(url, tenant) as stores:
            if create:
                with stores.lease(tenant):
                    pass  # creates the tenant's schema, as the server does
            return stores.episodic_url(tenant)
    return store


@contextmanager
def _postgres_tenant(url: str, tenant: str) -> Iterator[TenantStores]:
    """The server's :class:`~ctxkeep.server.tenants.TenantStores` over a PostgreSQL URL (its
    key registry creates the tenants' schemas and finds pgvector's).
    """
    from ctxkeep.server.keys import check_tenant, open_key_registry
    from ctxkeep.server.tenants import TenantStores

    check_tenant(tenant)
    registry = open_key_registry(url)
    try:
        stores = TenantStores(url, registry, max_open=1)
        try:
            yield stores
        finally:
            stores.close()
    finally:
        registry.close()


def where_flags(db: str | None, tenant: str | None) -> str:
    """`` --db URL --tenant NAME`` as given (for a next-step hint), each shell-quoted."""
    out = ""
    if db is not None:
        out += f" --db {shlex.quote(db)}"
    if tenant is not None:
        out += f" --tenant {shlex.quote(tenant)}"
    return out

"""Which store a command works on: ``--db`` (default: the embedded SQLite file), or with
``--tenant NAME`` the store that ``ctxkeep serve --db <the same URL>`` keeps for that tenant.

A tenant's records live at a URL derived from the server's (:mod:`ctxkeep.server.tenants`:
``sqlite:///dir/f.db`` -> ``sqlite:///dir/f.tenants/NAME.db``, a Redis key prefix, a
PostgreSQL schema), so ``ctxkeep sessions list --tenant acme`` lists what the API stored for
acme, and ``ctxkeep demo --tenant acme`` stores a session the inspector shows. The URL is
derived here with the server's own functions, never a copy of its rule.

Commands that only read (``sessions list/show/delete``, ``memory search/forget``, ``keys
list/revoke``) never create a store: opening a store sets it up (a SQLite URL makes its
directory and file; a PostgreSQL one creates ``ctxkeep_meta`` and the store's tables in the
URL's schema; a Redis one writes the schema versions under the key prefix), so a mistyped
``--db`` would otherwise print an empty listing from a store it just made. They check first,
without writing (:func:`require_existing`), and stop with one line saying the store does not
exist. A store exists where ctxkeep has set one up: the SQLite file; the ``ctxkeep_meta``
table in the URL's ``search_path`` (a tenant's: its schema); the ``{prefix}meta`` hash (or an
older ctxkeep's ``{prefix}schema:*`` version key) under the URL's key prefix (a tenant's:
``{prefix}tenant:NAME:``). The check is for the store, not for each kind of record in it: as
in a SQLite file that holds only API keys, a reader of sessions there sets up their (empty)
tables. Reading a PostgreSQL tenant opens its schema as it is (the server's path,
:class:`~ctxkeep.server.tenants.TenantStores`, creates the schema and pgvector's), and finds
the schema that holds pgvector without creating it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse, urlunparse

from ctxkeep.cli._args import Option
from ctxkeep.errors import ConfigError, StorageError

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


def tenant_store_url(url: str, tenant: str) -> str:
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


def artifacts_url(db: str | None, tenant: str | None) -> str:
    """The URL of the artifact store beside the sessions of ``--db`` / ``--tenant``, as
    ``ctxkeep serve`` keeps it (:meth:`~ctxkeep.server.tenants.TenantStores.records_url`): the
    sessions' URL without the session store's own parameters (``?ttl_grace=`` on Redis).

    Raises:
        ConfigError: see :func:`tenant_store_url`.

    """
    url = base_url(db)
    if tenant is not None:
        url = tenant_store_url(url, tenant)
    if urlparse(url).scheme in _REDIS:
        from ctxkeep._redis import take_params
        from ctxkeep.server.tenants import SESSION_PARAMS

        url = take_params(url, SESSION_PARAMS)[0]
    return url


@dataclass(frozen=True)
class Absent:
    """Where a store that does not exist was looked for (for the message that says so)."""

    place: str
    """Where it would be: a file, a key prefix of a Redis, a schema of a database."""
    reason: str
    """What was not found there."""


def require_existing(
    url: str, *, given: bool, tenant: str | None = None, maker: str = "ctxkeep demo"
) -> None:
    """Stop a command that only reads when no store exists at ``url`` (see the module
    docstring; looked for without writing).

    Args:
        url: the store's URL.
        given: whether the user gave ``--db`` (the message differs for the default store).
        tenant: the tenant whose store it is, if any.
        maker: a command that writes to the store (named when the default store is missing).

    Raises:
        ConfigError: the store does not exist; nothing is created.
        StorageError: the Redis or PostgreSQL server does not answer.

    """
    absent = find_absent(url)
    if absent is None:
        return
    if tenant is not None:
        raise ConfigError(
            f"tenant {tenant!r} has no store at {absent.place}: a server on this --db creates "
            "it at the tenant's first request (is --db the URL the server was started with?); "
            "nothing was created"
        )
    if given:
        raise ConfigError(
            f"the store {shown_url(url)} does not exist ({absent.reason}); check --db: this "
            "command only reads, so it created nothing"
        )
    raise ConfigError(
        f"there is no store yet at {absent.place} (the default; $CTXKEEP_DB sets another): "
        f"`{maker}` makes it, or give --db; nothing was created"
    )


def find_absent(url: str) -> Absent | None:
    """``None`` when a ctxkeep store exists at ``url`` (always for ``memory://``), else where
    it was looked for. Reads only.

    Raises:
        ConfigError: an invalid URL.
        StorageError: the Redis or PostgreSQL server does not answer.

    """
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        from ctxkeep.server.keys import sqlite_path

        path = Path(sqlite_path(url))
        return None if path.is_file() else Absent(str(path), f"no file {path}")
    if scheme in _REDIS:
        return _redis_absent(url)
    if scheme in _POSTGRES:
        return _postgres_absent(url)
    return None  # memory:// (or a URL open_memory refuses with its own message)


def shown_url(url: str) -> str:
    """``url`` without its password (for messages)."""
    parsed = urlparse(url)
    if not parsed.password:
        return url
    host = parsed.netloc.rsplit("@", 1)[1]
    return urlunparse(parsed._replace(netloc=f"{parsed.username or ''}:***@{host}"))


def _redis_absent(url: str) -> Absent | None:
    """Whether the key prefix of ``url`` holds ctxkeep's schema versions: the meta hash, or the
    version key of a store that kept one before it (an ``EXISTS``, no write).
    """
    from ctxkeep._redis import connect, describe_url, redis, split_url, storage_error, take_params
    from ctxkeep.server.tenants import SESSION_PARAMS

    client_url, prefix = split_url(take_params(url, SESSION_PARAMS)[0])
    where = describe_url(client_url)
    markers = [f"{prefix}meta", *(f"{prefix}schema:{s}" for s in _REDIS_LEGACY_VERSIONS)]
    conn = connect(client_url)
    try:
        found = int(conn.exists(*markers))
    except redis.RedisError as exc:
        raise storage_error(where, exc) from exc
    finally:
        conn.close()
    if found:
        return None
    place = f"key prefix {prefix!r} of the Redis at {where}"
    return Absent(place, f"no ctxkeep keys under the {place}")


_REDIS_LEGACY_VERSIONS = ("sessions", "checkpoints")
"""The stores that kept their schema version in ``{prefix}schema:{store}`` before the meta
hash (:class:`~ctxkeep._redis.RedisClient`'s ``legacy_schema_key``).
"""


def _postgres_absent(url: str) -> Absent | None:
    """Whether the ``search_path`` of ``url`` holds ``ctxkeep_meta`` (one ``SELECT``); a
    database that does not exist is absent too.
    """
    row = _postgres_row(
        url,
        "SELECT to_regclass('ctxkeep_meta') IS NOT NULL, current_setting('search_path')",
        missing_ok=True,
    )
    where = _postgres_where(url)
    if row is None:
        return Absent(f"the PostgreSQL at {where}", f"the database {where} does not exist")
    if row[0]:
        return None
    return Absent(
        f"schema {row[1]} of the PostgreSQL at {where}",
        f"no table ctxkeep_meta in the search_path ({row[1]}) of the PostgreSQL at {where}",
    )


def _postgres_episodic_url(store: str, tenant: str) -> str:
    """The URL of the episodes of a tenant whose schema exists, found without writing: its
    schema, then the one that holds pgvector (where the server looks,
    :meth:`~ctxkeep.server.tenants.TenantStores.episodic_url`, which creates what is missing).

    Raises:
        ConfigError: the database has no pgvector yet (so no episodes).
        StorageError: PostgreSQL does not answer.

    """
    from ctxkeep.server.tenants import with_search_path

    row = _postgres_row(
        store,
        "SELECT current_schema(), (SELECT n.nspname FROM pg_extension e JOIN pg_namespace n "
        "ON n.oid = e.extnamespace WHERE e.extname = 'vector')",
    )
    assert row is not None
    schema, vector = row
    if vector is None:
        raise ConfigError(
            f"tenant {tenant!r} has no episodes in schema {schema} of the PostgreSQL at "
            f"{_postgres_where(store)}: the database has no pgvector extension yet (a server "
            "on this --db creates it at the first episode); nothing was created"
        )
    return with_search_path(store, str(schema), str(vector))


def _postgres_row(url: str, sql: str, *, missing_ok: bool = False) -> tuple[Any, ...] | None:
    """The one row of a read-only ``sql`` on a connection of its own.

    Returns:
        the row; ``None`` when the database does not exist and ``missing_ok``.

    Raises:
        ConfigError: an invalid URL.
        StorageError: PostgreSQL does not answer (or the database does not exist).

    """
    psycopg = _psycopg()
    where = _postgres_where(url)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row: tuple[Any, ...] | None = conn.execute(sql).fetchone()
    except psycopg.Error as exc:
        first = " ".join(str(exc).split())
        no_database = exc.sqlstate == _NO_DATABASE or (
            f'database "{_postgres_dbname(url)}" does not exist' in first
        )
        if missing_ok and no_database:
            return None
        raise StorageError(f"PostgreSQL at {where}: {first}") from exc
    assert row is not None  # a SELECT of expressions has one row
    return row


_NO_DATABASE = "3D000"  # SQLSTATE invalid_catalog_name


def _psycopg() -> ModuleType:
    """The psycopg module (without it, :mod:`ctxkeep._pg`'s ImportError, naming the extra)."""
    import ctxkeep._pg  # noqa: F401 - first, for its ImportError

    # isort: split
    import psycopg.conninfo

    return psycopg


def _postgres_where(url: str) -> str:
    """``host/dbname`` of a PostgreSQL URL (as the stores name it).

    Raises:
        ConfigError: not a URL libpq reads.

    """
    host, dbname = _postgres_params(url)
    return f"{host}/{dbname}"


def _postgres_dbname(url: str) -> str:
    return _postgres_params(url)[1]


def _postgres_params(url: str) -> tuple[str, str]:
    psycopg = _psycopg()
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ConfigError(f"invalid PostgreSQL URL: {exc}") from exc
    return str(params.get("host") or "localhost"), str(params.get("dbname") or "")


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
    store = tenant_store_url(url, tenant)
    if create and urlparse(url).scheme in _POSTGRES:
        with _postgres_tenant(url, tenant) as stores, stores.lease(tenant) as mem:
            yield mem  # the server's own path: its schema created as the server creates it
        return
    if not create:
        require_existing(store, given=True, tenant=tenant)
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
    store = tenant_store_url(url, tenant)
    scheme = urlparse(url).scheme
    if scheme in _REDIS:
        raise ConfigError(
            "a redis:// server keeps no episodes (its episodic routes answer 501): ctxkeep "
            "keeps them in SQLite or PostgreSQL"
        )
    if not create:
        require_existing(store, given=True, tenant=tenant)
        # the tenant's schema, then the one that holds pgvector, found without writing
        return _postgres_episodic_url(store, tenant) if scheme in _POSTGRES else store
    if scheme in _POSTGRES:  # as the server does: the tenant's schema, pgvector's, created
        with _postgres_tenant(url, tenant) as stores:
            with stores.lease(tenant):
                pass
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

"""PostgreSQL plumbing shared by every PostgreSQL store: one connection pool per server for the
whole process, one place that translates psycopg's errors, transactions, and versioned schema
setup under an advisory lock.

One pool per server, whatever the schemas. A store's URL names its schema through libpq's
``options`` (``?options=-csearch_path%3Dacme``); a service gives each tenant its own schema, so
a pool per store made 4 or more pools per open tenant, and 32 tenants passed PostgreSQL's
default of 100 connections. Instead every :class:`PgClient` of the process whose URL is the
same but for the ``search_path`` (the *address*: host, port, database, user, other options)
shares one psycopg :class:`~psycopg_pool.ConnectionPool`, and keeps its own ``search_path``:

* a connection taken by a client gets the client's ``search_path`` set first, but only when the
  one it holds differs (the pool notes each connection's, so a process serving one schema, or a
  connection used again by the same tenant, pays no round trip); it is set outside any
  transaction (the pool's connections are autocommit), so every transaction of a client runs
  under that client's ``search_path`` and no other;
* a connection whose setting did not go through (an error) is set again on its next use, and a
  broken connection is dropped with what was noted of it; a new one starts from the server's
  default, which :meth:`PgClient.connection` restores (``RESET``) for a client whose URL names
  no ``search_path``;
* the pool opens with its first client and closes with its last (:meth:`PgClient.close`
  releases a client's share; the others go on using the pool).

The budget. A pool opens at most its maximum of connections, configured as a client joins it
(the latest client's setting counts): the client's ``pool_max``, else ``CTXKEEP_PG_POOL_MAX``,
else ``pg_pool_max`` in the config file (:func:`configured_pool_max`, :mod:`ctxkeep.config`);
with none ever set, the largest ``max_size`` its clients ask for (the stores' own keyword: 8
for sessions). So a process holds at most that many connections to one server however many tenants
it serves, and ``N`` server workers ``N`` times it. A bus whose receive waits
(:mod:`ctxkeep.fabric.postgres`) has a ``LISTEN`` connection of its own, outside the pool.

Prepared statements stay right across schemas: PostgreSQL parses a statement psycopg prepared
again when the ``search_path`` it was prepared under has changed. It refuses one whose result
columns would change type (``cached plan must not change result type``), which cannot happen
between schemas of one ctxkeep: a client brings its schema to the current version as it opens,
so a table of one name has the same columns in every schema a process uses.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ctxkeep.config import setting_int
from ctxkeep.errors import ConfigError, MissingDependencyError, SchemaVersionError, StorageError

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("psycopg", "postgres") from exc

_MIGRATION_LOCK = 0x6374786B  # the same lock as the session store: one schema setup at a time

ALIVE_BYPASS = 0.5
"""Seconds after its last use in which a pooled connection is handed out without a ping."""

REPEATABLE_READ = psycopg.IsolationLevel.REPEATABLE_READ
"""The isolation of a snapshot read (:meth:`PgClient.tx`'s ``isolation``)."""

POOL_MAX_SETTING = "pg_pool_max"
"""The setting of a pool's maximum (``CTXKEEP_PG_POOL_MAX``, or ``pg_pool_max`` in the config
file); see the module docstring."""


def configured_pool_max(explicit: int | None = None) -> int | None:
    """The configured maximum of a pool: ``explicit``, else ``CTXKEEP_PG_POOL_MAX``, else the
    config file's ``pg_pool_max``; None when none is set (the pool is then as large as the
    largest ``max_size`` its clients ask for).

    Raises:
        ConfigError: a value that is not a positive integer.

    """
    if explicit is not None and (
        isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 1
    ):
        raise ConfigError(f"pool_max must be a positive integer, got {explicit!r}")
    return setting_int(POOL_MAX_SETTING, explicit, None)


def split_options(options: str) -> tuple[str, str | None]:
    """The libpq ``options`` without their ``search_path`` setting, and that setting's value
    (None if there is none; the last one counts, as in PostgreSQL). Understands ``-cname=v``,
    ``-c name=v`` and ``--name=v``.
    """
    kept: list[str] = []
    path: str | None = None
    words = options.split()
    i = 0
    while i < len(words):
        word = words[i]
        setting = None
        if (word.startswith("-c") and len(word) > 2) or (word.startswith("--") and "=" in word):
            setting = word[2:]
        elif word == "-c" and i + 1 < len(words):
            setting, i = words[i + 1], i + 1
        name, _, value = (setting or "").partition("=")
        if setting is not None and name.replace("-", "_") == "search_path":
            path = value
        elif setting is not None:
            kept.append(f"-c{setting}")
        else:
            kept.append(word)
        i += 1
    return " ".join(kept), path


def split_url(url: str) -> tuple[str, str | None]:
    """A libpq URL or conninfo as the address of its server (a conninfo, keys sorted, without
    the ``search_path``) and its ``search_path`` (None: the server's default).

    Raises:
        ConfigError: an invalid URL.

    """
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ConfigError(f"invalid PostgreSQL URL: {exc}") from exc
    options, path = split_options(str(params.pop("options", "") or ""))
    if options:
        params["options"] = options
    return make_conninfo("", **dict(sorted(params.items()))), path


class _Liveness:
    """The pool's check on a connection it hands out: a ping (an empty statement, one round
    trip) unless the connection was in use within the last :data:`ALIVE_BYPASS` seconds, as
    HikariCP's ``aliveBypassWindowMs`` does. A ping per use doubled the round trips of a
    one-statement append; a connection that died within the window fails its statement with
    a StorageError (nothing is written) and the pool drops it.

    The time of last use is noted by :meth:`PgClient.connection` as the connection goes back,
    not by the pool's ``reset`` callback: with a ``reset`` the pool returns every connection
    through a worker thread, a thread hand-off per call; a caller asking again before the
    worker was done made the pool open another connection (a loop of appends from one thread
    grew it to 4-8, each pinged after sitting idle). Without it a one-message session append
    takes about 0.21 ms of client CPU instead of 0.32.
    """

    def __init__(self) -> None:
        self._used: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def check(self, conn: Any) -> None:
        """Ping ``conn`` unless it was used just now (the pool's ``check``)."""
        if time.monotonic() - self._used.get(conn, -ALIVE_BYPASS) >= ALIVE_BYPASS:
            ConnectionPool.check_connection(conn)

    def returned(self, conn: Any) -> None:
        """Note that ``conn`` was used just now."""
        self._used[conn] = time.monotonic()


_UNKNOWN = "\x00unknown"
"""The noted ``search_path`` of a connection whose setting failed half way (no real value:
PostgreSQL refuses NUL in text), so the next user sets it again."""


class SharedPool:
    """One server's pool, shared by the process's clients of that address (see the module
    docstring); made and released by :class:`PgClient`.
    """

    def __init__(self, address: str, *, min_size: int, max_size: int, timeout: float) -> None:
        self.address = address
        self.clients = 0
        """How many open clients share the pool (changed under the registry's lock)."""
        self.configured: int | None = None
        """The configured maximum, if one was (then clients' ``max_size`` is not read)."""
        self.liveness = liveness = _Liveness()
        self.paths: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
        """Each connection's ``search_path`` as last set (absent: the server's default)."""
        self.settings: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
        """Each connection's other session settings as :meth:`set` last set them."""
        self.pool: ConnectionPool[Any] = ConnectionPool(
            address,
            min_size=min(min_size, max_size),
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True},
            check=liveness.check,
            open=False,
            name="ctxkeep-pg",
        )

    def fit(self, configured: int | None, asked: int, min_size: int) -> None:
        """Size the pool for a new client: the configured maximum if there is one, else at
        least what the client asks for (called under the registry's lock).
        """
        if configured is not None:
            self.configured = configured
        size = self.pool.max_size
        wanted = self.configured if self.configured is not None else max(size, asked)
        low = min(max(self.pool.min_size, min_size), wanted)
        if (wanted, low) != (size, self.pool.min_size):
            self.pool.resize(low, wanted)

    def use(self, conn: Any, path: str | None) -> None:
        """Give ``conn`` the ``search_path`` ``path`` (None: the default) unless it has it."""
        paths = self.paths
        if paths.get(conn) == path:
            return
        paths[conn] = _UNKNOWN
        if path is None:
            conn.execute("RESET search_path")
        else:
            conn.execute("SELECT set_config('search_path', %s, false)", (path,))
        paths[conn] = path

    def holds(self, conn: Any, name: str, value: int) -> bool:
        """Whether ``conn`` has the session setting ``name`` at ``value`` (:meth:`set`)."""
        held = self.settings.get(conn)
        return held is not None and held.get(name) == value

    def set(self, conn: Any, name: str, value: int) -> None:
        """Give ``conn`` the session setting ``name`` (a numeric one, e.g. pgvector's
        ``hnsw.ef_search``) ``value`` unless it has it: set once a connection, as its
        ``search_path``, where a ``SET LOCAL`` would take a transaction around each use.
        In pipeline mode the ``SET`` is queued, noted as done: a block of
        :meth:`PgClient.connection` that fails forgets what was noted.
        """
        held = self.settings.setdefault(conn, {})
        if held.get(name) == value:
            return
        held.pop(name, None)  # unknown until the SET is done
        conn.execute(f"SET {name} = {int(value)}")
        held[name] = value


_POOLS: dict[str, SharedPool] = {}
_POOLS_LOCK = threading.Lock()
_OPENING: dict[str, threading.Lock] = {}


def _join(
    address: str, *, configured: int | None, min_size: int, max_size: int, timeout: float
) -> SharedPool:
    """The address's pool with one more client, opened (waiting up to ``timeout``) if new.

    Raises:
        psycopg.Error: the server did not answer.

    """
    with _POOLS_LOCK:
        opening = _OPENING.setdefault(address, threading.Lock())
    with opening:  # one opener per address; the others wait and share its pool
        with _POOLS_LOCK:
            shared = _POOLS.get(address)
            if shared is not None:
                shared.clients += 1
                shared.fit(configured, max_size, min_size)
                return shared
        _probe(address, timeout)
        size = configured if configured is not None else max_size
        shared = SharedPool(address, min_size=min_size, max_size=size, timeout=timeout)
        shared.configured = configured
        try:
            shared.pool.open(wait=True, timeout=timeout)
        except BaseException:
            shared.pool.close()
            raise
        with _POOLS_LOCK:
            shared.clients = 1
            _POOLS[address] = shared
        return shared


def _probe(address: str, timeout: float) -> None:
    """Connect once before a pool is made, so a server that does not answer is an error at
    once, with libpq's reason: a pool keeps trying until its timeout (30 s by default) and
    then says only that it did not fill.

    Raises:
        psycopg.Error: the server did not answer.

    """
    if "connect_timeout" not in conninfo_to_dict(address):
        address = make_conninfo(address, connect_timeout=max(2, int(timeout)))
    psycopg.connect(address, autocommit=True).close()


def _leave(shared: SharedPool) -> None:
    """One client fewer; the last closes the pool."""
    with _POOLS_LOCK:
        shared.clients -= 1
        if shared.clients > 0:
            return
        if _POOLS.get(shared.address) is shared:
            del _POOLS[shared.address]
    shared.pool.close()


class PgClient:
    """A schema of a PostgreSQL server (the URL's ``search_path``) over the process's shared
    pool of that server, with versioned schema setup.

    Args:
        url: a libpq URI or conninfo; its ``search_path`` (in ``options``) is this client's.
        name: what the client is, for messages.
        meta_key: the key of the store's schema version in ``ctxkeep_meta``.
        migrations: the store's schema, one statement per version.
        min_size: connections the shared pool keeps open when idle (the largest any client
            asks for, at most the pool's maximum).
        max_size: the pool size this client asks for when no maximum is configured (the pool
            is as large as the largest asked).
        timeout: seconds to wait for a connection (and for a new pool to connect).
        pool_max: the pool's maximum, ahead of ``CTXKEEP_PG_POOL_MAX``
            (:func:`configured_pool_max`).
        extensions: the extensions whose schemas end the client's ``search_path`` where the
            database holds them in a schema the path lacks (:meth:`_reach`); pgvector by
            default, for every client: the process's clients of one URL share its pool and
            (a LangGraph store's) transactions, and a path of each their own was set again on
            the connection at every switch between them, a round trip each.

    Raises:
        ConfigError: an invalid URL or pool maximum.
        StorageError: the server does not answer.
        SchemaVersionError: the schema was written by a newer ctxkeep.

    """

    def __init__(
        self,
        url: str,
        *,
        name: str,
        meta_key: str,
        migrations: Sequence[str],
        min_size: int = 1,
        max_size: int = 8,
        timeout: float = 30.0,
        pool_max: int | None = None,
        extensions: Sequence[str] = ("vector",),
    ) -> None:
        address, self.search_path = split_url(url)
        params = conninfo_to_dict(address)
        self.name = name
        self.where = f"{params.get('host') or 'localhost'}/{params.get('dbname') or ''}"
        self.timeout = timeout
        configured = configured_pool_max(pool_max)
        self._lock = threading.Lock()
        self._shared: SharedPool | None = None
        with self.errors("cannot connect"):
            shared = _join(
                address,
                configured=configured,
                min_size=min_size,
                max_size=max_size,
                timeout=timeout,
            )
        self._shared = shared
        self.pool: ConnectionPool[Any] = shared.pool
        """The shared pool (for its statistics)."""
        try:
            if extensions:
                self._reach(extensions)
            self._migrate(meta_key, migrations)
        except BaseException:
            self.close()
            raise

    def _reach(self, extensions: Sequence[str]) -> None:
        """End this client's ``search_path`` with the schemas that hold ``extensions`` where
        the database has them in a schema the path lacks. An extension lives in one schema of
        a database (put there by whoever created it: ``public``, a host's ``extensions``, a
        server's shared schema), and a store names its types and operators unqualified: a
        URL whose ``search_path`` is its own schema alone would not find them (``type
        "vector" does not exist``).
        """
        find = (
            "SELECT current_setting('search_path'), ARRAY(SELECT DISTINCT n.nspname "
            "FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = ANY(%s) AND NOT n.nspname = ANY(current_schemas(false)) "
            "ORDER BY n.nspname)"
        )
        with self.errors("find extensions"), self.connection() as conn:
            path, found = conn.execute(find, (list(extensions),)).fetchone()
        if found:  # the path as the server has it (the URL's, else the role's or its default)
            quoted = ['"' + str(name).replace('"', '""') + '"' for name in found]
            self.search_path = ", ".join([str(path), *quoted])

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Translate psycopg's errors into StorageError."""
        try:
            yield
        except psycopg.Error as exc:
            raise StorageError(f"PostgreSQL at {self.where}: {doing}: {exc}") from exc

    @contextmanager
    def connection(self, *, any_path: bool = False) -> Iterator[Any]:
        """A connection from the pool (autocommit) under this client's ``search_path``, noted
        as just used when it goes back. With ``any_path``, under whatever ``search_path`` the
        connection holds: for statements that name their tables' schema (:meth:`schema`), so
        a connection another tenant's client set up is used as it is, with no round trip to
        set the path and none for the next user to set it back.

        Raises:
            StorageError: the client is closed.

        """
        shared = self._shared
        if shared is None:
            raise StorageError(f"PostgreSQL at {self.where}: {self.name} is closed")
        with shared.pool.connection(timeout=self.timeout) as conn:
            try:
                if not any_path:
                    shared.use(conn, self.search_path)
                yield conn
            except BaseException:
                # a setting made in the block may have been undone with it (a SET pipelined
                # with a statement that failed: one implicit transaction): set it again
                shared.settings.pop(conn, None)
                raise
            finally:
                shared.liveness.returned(conn)
                if conn.broken or conn.closed:
                    shared.paths.pop(conn, None)
                    shared.settings.pop(conn, None)

    def set(self, conn: Any, name: str, value: int) -> None:
        """Give ``conn`` (one of :meth:`connection`'s) the session setting ``name``
        ``value`` unless it has it (:meth:`SharedPool.set`).

        Raises:
            StorageError: the client is closed.

        """
        shared = self._shared
        if shared is None:
            raise StorageError(f"PostgreSQL at {self.where}: {self.name} is closed")
        shared.set(conn, name, value)

    def holds(self, conn: Any, name: str, value: int) -> bool:
        """Whether ``conn`` has the session setting ``name`` at ``value`` (:meth:`set`)."""
        shared = self._shared
        return shared is not None and shared.holds(conn, name, value)

    @contextmanager
    def tx(
        self,
        doing: str,
        *,
        isolation: psycopg.IsolationLevel | None = None,
        read_only: bool | None = None,
    ) -> Iterator[Any]:
        """A connection inside one transaction; with ``isolation`` and/or ``read_only``, one
        that begins as ``BEGIN ISOLATION LEVEL ... READ ONLY``: psycopg builds its ``BEGIN``
        from the connection's attributes, so the transaction's characteristics cost no
        ``SET TRANSACTION`` round trip. The pooled connection's attributes are set back as it
        goes back (a connection whose attributes cannot be set back is closed, so the pool
        drops it): the next user of the connection begins as it would have.
        """
        if isolation is None and read_only is None:
            with self.errors(doing), self.connection() as conn, conn.transaction():
                yield conn
            return
        with self.errors(doing), self.connection() as conn:
            before = conn.isolation_level, conn.read_only
            try:
                conn.isolation_level, conn.read_only = isolation, read_only
                with conn.transaction():
                    yield conn
            finally:
                try:
                    conn.isolation_level, conn.read_only = before
                except psycopg.Error:
                    conn.close()

    def q(
        self,
        doing: str,
        sql: str,
        params: tuple[Any, ...] | Mapping[str, Any] = (),
        *,
        any_path: bool = False,
        prepare: bool | None = None,
    ) -> list[Any]:
        """Run one statement outside a transaction; its rows (``any_path``: see
        :meth:`connection`; ``prepare``: psycopg's, True to prepare it on its first run on a
        connection, not its fifth).
        """
        with self.errors(doing), self.connection(any_path=any_path) as conn:
            rows: list[Any] = conn.execute(sql, params, prepare=prepare).fetchall()
            return rows

    def schema(self) -> str:
        """The schema this client's tables are created in (the first existing schema of its
        ``search_path``), quoted as an identifier, to name tables with.

        Raises:
            StorageError: no schema of the ``search_path`` exists.

        """
        rows = self.q("read the current schema", "SELECT current_schema()")
        if not rows or rows[0][0] is None:
            raise StorageError(
                f"PostgreSQL at {self.where}: {self.name}: no schema of the search_path exists"
            )
        name = str(rows[0][0])
        return '"' + name.replace('"', '""') + '"'

    @contextmanager
    def setup(self, doing: str) -> Iterator[Any]:
        """A connection inside one transaction that holds the schema-setup lock: DDL that
        another process may run at the same moment goes in here. ``CREATE ... IF NOT EXISTS``
        alone is not safe against that: two servers creating one schema at once can both
        pass the check, and the second fails on the catalogue's unique index.
        """
        with self.tx(doing) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            yield conn

    def _migrate(self, key: str, migrations: Sequence[str]) -> None:
        if self._version(key) == len(migrations):
            return  # current: write nothing (a read-only database opens too)
        with self.setup("schema setup") as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS ctxkeep_meta "
                "(key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            row = conn.execute("SELECT value FROM ctxkeep_meta WHERE key = %s", (key,)).fetchone()
            version = int(row[0]) if row else 0
            if version > len(migrations):
                raise SchemaVersionError(
                    f"PostgreSQL at {self.where} was written by a newer ctxkeep ({key} schema "
                    f"{version}; this one reads up to {len(migrations)}); upgrade ctxkeep"
                )
            for i in range(version, len(migrations)):
                conn.execute(migrations[i])
                conn.execute(
                    "INSERT INTO ctxkeep_meta (key, value) VALUES (%s, %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, str(i + 1)),
                )

    def _version(self, key: str) -> int | None:
        """The store's schema version, read without writing (None: no ``ctxkeep_meta`` yet,
        or no row for ``key``).
        """
        with self.errors("read the schema version"), self.connection() as conn:
            if conn.execute("SELECT to_regclass('ctxkeep_meta')").fetchone()[0] is None:
                return None
            row = conn.execute("SELECT value FROM ctxkeep_meta WHERE key = %s", (key,)).fetchone()
        return int(row[0]) if row and str(row[0]).isdigit() else None

    def close(self) -> None:
        """Release this client's share of the pool (the last client's closes it); again is
        a no-op.
        """
        with self._lock:
            shared, self._shared = self._shared, None
        if shared is not None:
            _leave(shared)

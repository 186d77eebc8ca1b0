"""PostgreSQL plumbing shared by the stores that are not sessions: a pool, one place that
translates psycopg's errors, transactions, and versioned schema setup under an advisory lock.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from ctxkeep.errors import ConfigError, MissingDependencyError, SchemaVersionError, StorageError

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("psycopg", "postgres") from exc

_MIGRATION_LOCK = 0x6374786B  # the same lock as the session store: one schema setup at a time

ALIVE_BYPASS = 0.5
"""Seconds after its last use in which a pooled connection is handed out without a ping."""


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


class PgClient:
    """A pooled connection to PostgreSQL with versioned schema setup."""

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
    ) -> None:
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:
            raise ConfigError(f"invalid PostgreSQL URL: {exc}") from exc
        self.where = f"{params.get('host') or 'localhost'}/{params.get('dbname') or ''}"
        self._liveness = liveness = _Liveness()
        self.pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True},
            check=liveness.check,
            open=False,
            name=name,
        )
        try:
            with self.errors("cannot connect"):
                self.pool.open(wait=True, timeout=timeout)
            self._migrate(meta_key, migrations)
        except BaseException:
            self.pool.close()
            raise

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Translate psycopg's errors into StorageError."""
        try:
            yield
        except psycopg.Error as exc:
            raise StorageError(f"PostgreSQL at {self.where}: {doing}: {exc}") from exc

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection from the pool (autocommit), noted as just used when it goes back."""
        with self.pool.connection() as conn:
            try:
                yield conn
            finally:
                self._liveness.returned(conn)

    @contextmanager
    def tx(self, doing: str) -> Iterator[Any]:
        """A connection inside one transaction."""
        with self.errors(doing), self.connection() as conn, conn.transaction():
            yield conn

    def q(
        self, doing: str, sql: str, params: tuple[Any, ...] | Mapping[str, Any] = ()
    ) -> list[Any]:
        """Run one statement outside a transaction; its rows."""
        with self.errors(doing), self.connection() as conn:
            rows: list[Any] = conn.execute(sql, params).fetchall()
            return rows

    def _migrate(self, key: str, migrations: Sequence[str]) -> None:
        if self._version(key) == len(migrations):
            return  # current: write nothing (a read-only database opens too)
        with self.tx("schema setup") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
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
        """Close the pool."""
        self.pool.close()

"""PostgreSQL plumbing shared by the stores that are not sessions: a pool, one place that
translates psycopg's errors, transactions, and versioned schema setup under an advisory lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
        self.pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
            kwargs={"autocommit": True},
            check=ConnectionPool.check_connection,
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
    def tx(self, doing: str) -> Iterator[Any]:
        """A connection inside one transaction."""
        with self.errors(doing), self.pool.connection() as conn, conn.transaction():
            yield conn

    def q(self, doing: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Run one statement outside a transaction; its rows."""
        with self.errors(doing), self.pool.connection() as conn:
            rows: list[Any] = conn.execute(sql, params).fetchall()
            return rows

    def _migrate(self, key: str, migrations: Sequence[str]) -> None:
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

    def close(self) -> None:
        """Close the pool."""
        self.pool.close()

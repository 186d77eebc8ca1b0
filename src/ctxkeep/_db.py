"""What the SQL layers of every store share, free of any driver: the engine-client interface
(:class:`Database`, met by ``_sqlite.SQLiteClient`` and ``_pg.PgClient``), the placeholder
translation, ``executemany``, and how to tell a store that refuses writes
(:func:`refuses_writes`).

SQL in ctxkeep is written once with ``?`` placeholders and translated to PostgreSQL's ``%s``
here; the statements hold no other ``?`` (and no ``%``).
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Database(Protocol):
    """What a store's SQL layer needs of an engine client (``SQLiteClient``, ``PgClient``)."""

    def tx(self, doing: str) -> AbstractContextManager[Any]:
        """A connection inside one write transaction."""
        ...

    def q(self, doing: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of one statement run outside a transaction."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


@functools.lru_cache(maxsize=512)
def placeholders(sql: str, param: str) -> str:
    """``sql`` with its ``?`` placeholders written as ``param``."""
    return sql if param == "?" else sql.replace("?", param)


def executemany(conn: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """``executemany`` on a cursor of ``conn`` (psycopg connections have none of their own)."""
    cur = conn.cursor()
    try:
        cur.executemany(sql, rows)
    finally:
        cur.close()


_SQLITE_READONLY = 8  # SQLITE_READONLY (the low byte of its extended codes too)
_PG_READ_ONLY_TRANSACTION = "25006"  # SQLSTATE read_only_sql_transaction


def refuses_writes(exc: BaseException) -> bool:
    """Whether ``exc`` (a :class:`~ctxkeep.errors.StorageError` or the driver's error behind
    it) says the store is read-only: SQLite's "attempt to write a readonly database" (a file
    opened with ``mode=ro``, or one the process may not write), PostgreSQL's "cannot execute
    ... in a read-only transaction" (``default_transaction_read_only``, a hot standby), or a
    read-only Redis replica.
    """
    for err in (exc, exc.__cause__):
        if err is None:
            continue
        code = getattr(err, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF == _SQLITE_READONLY:
            return True
        if getattr(err, "sqlstate", None) == _PG_READ_ONLY_TRANSACTION:
            return True
        if type(err).__name__ == "ReadOnlyError":  # redis-py's, for a READONLY replica
            return True
    return False

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


ANALYZE_AFTER = 1000
"""Rows in one batch from which a store analyzes the PostgreSQL table the batch filled, once per
table object: a bulk load. Until autovacuum analyzes a new table (a minute or more later) it has
no statistics. PostgreSQL's manual says the same of bulk loads ("Populating a Database": run
``ANALYZE`` afterwards). It runs inside the write's transaction, whose own rows it counts; a
role that does not own the table gets a warning, not an error. Once per object, not per bulk
load: after the first, autovacuum keeps the statistics (it analyzes a table once a tenth of its
rows changed), and an ``ANALYZE`` holds a lock that conflicts with another's until its
transaction ends, so concurrent bulk loads of one table would each wait for the other's commit.
The tables:

* ``CtxkeepStore``'s items (``integrations/langgraph/_store_items``): without statistics the
  planner guessed a handful of rows, scanned the table and sorted the matches of a filtered
  search, casting every value to ``jsonb`` (2.2 of 2.5 ms by EXPLAIN ANALYZE at 1,000 items),
  where with them it walks the order's index until the page is full (0.07 ms);
* the episodes' window documents (``episodic/postgres``' ``TEXT_TABLE``), whose statistics say
  which query terms find lexical candidates (``PostgresEpisodicStore._informative``): without
  them every term did, and a query of ``bench/peers.py``'s at 10,000 items ranked the 2,222
  documents holding "work", "bill" or "servic" where with them it ranks the 556 holding "bill"
  or "servic" (its statement's server CPU 1,571 -> 917 us, its two other queries', which keep
  their terms, unchanged; medians of 7 interleaved rounds on one server). That ``ANALYZE``
  took 1.4 ms of server CPU at 1,000 episodes and 6.4 ms at 10,000, whose load took 7-13 s.
"""

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

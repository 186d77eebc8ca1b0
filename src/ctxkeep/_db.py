"""What the SQL layers of every store share, free of any driver: the engine-client interface
(:class:`Database`, met by ``_sqlite.SQLiteClient`` and ``_pg.PgClient``), the placeholder
translation and ``executemany``.

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

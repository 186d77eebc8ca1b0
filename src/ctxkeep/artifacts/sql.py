"""The artifact primitives over SQL, written once for SQLite and PostgreSQL.

:class:`SQLArtifactStore` implements ``_put``, ``_get`` and ``_has`` over one table,
``ctxkeep_artifacts`` (``ref`` primary key, the text, ``schema_version`` of the row,
``created_at`` in Unix seconds), created by each backend's migrations. A subclass supplies the
engine client (``ctxkeep._sqlite`` or ``ctxkeep._pg``: connections, transactions, driver-error
translation, schema versions), its placeholder, the text column and how the text is kept in it.
SQL here is written with ``?`` placeholders.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from ctxkeep._db import Database, placeholders
from ctxkeep.artifacts.base import RECORD_VERSION, ArtifactStore

BATCH = 500
"""Refs looked up per statement by :meth:`SQLArtifactStore._put_many`."""


class SQLArtifactStore(ArtifactStore):
    """Artifacts in the ``ctxkeep_artifacts`` table of a SQL engine."""

    param: ClassVar[str]
    """The driver's placeholder: ``?`` or ``%s``."""
    column: ClassVar[str]
    """The column that holds the text."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _encode(self, text: str) -> Any:
        """The column value for ``text``."""
        return text

    def _decode(self, value: Any) -> str:
        """The text of a column value."""
        return str(value)

    def _sql(self, sql: str) -> str:
        return placeholders(sql, self.param)

    def _put(self, ref: str, text: str) -> None:
        with self._db.tx("store an artifact") as conn:
            conn.execute(
                self._sql(
                    f"INSERT INTO ctxkeep_artifacts (ref, {self.column}, schema_version, "
                    "created_at) VALUES (?, ?, ?, ?) ON CONFLICT (ref) DO NOTHING"
                ),
                (ref, self._encode(text), RECORD_VERSION, time.time()),
            )

    def _put_many(self, items: dict[str, str]) -> None:
        """One read of which refs are stored (no transaction, nothing written when all are),
        then the others in one transaction.
        """
        refs = list(items)
        stored: set[str] = set()
        for i in range(0, len(refs), BATCH):
            chunk = tuple(refs[i : i + BATCH])
            marks = ", ".join("?" * len(chunk))
            sql = self._sql(f"SELECT ref FROM ctxkeep_artifacts WHERE ref IN ({marks})")
            stored.update(str(r[0]) for r in self._db.q("look up artifacts", sql, chunk))
        new = [ref for ref in refs if ref not in stored]
        if not new:
            return
        now = time.time()
        with self._db.tx("store artifacts") as conn:
            conn.cursor().executemany(
                self._sql(
                    f"INSERT INTO ctxkeep_artifacts (ref, {self.column}, schema_version, "
                    "created_at) VALUES (?, ?, ?, ?) ON CONFLICT (ref) DO NOTHING"
                ),
                [(ref, self._encode(items[ref]), RECORD_VERSION, now) for ref in new],
            )

    def _get(self, ref: str) -> str | None:
        rows = self._db.q(
            "read an artifact",
            self._sql(f"SELECT {self.column} FROM ctxkeep_artifacts WHERE ref = ?"),
            (ref,),
        )
        return self._decode(rows[0][0]) if rows else None

    def _has(self, ref: str) -> bool:
        rows = self._db.q(
            "look up an artifact",
            self._sql("SELECT 1 FROM ctxkeep_artifacts WHERE ref = ?"),
            (ref,),
        )
        return bool(rows)

    def close(self) -> None:
        """Release the engine's connections (a later call opens new ones where it can)."""
        self._db.close()

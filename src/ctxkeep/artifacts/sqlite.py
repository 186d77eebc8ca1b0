"""Artifacts in a SQLite file (``sqlite:///path.db``): one table, WAL, safe across processes.

The table can share a file with the other stores; its schema version is the ``artifacts`` row
of ``ctxkeep_meta`` (see :mod:`ctxkeep._sqlite`). Files written before that table existed hold
``ctxkeep_artifacts`` and no version row: their layout is version 1, and they are adopted as such.
"""

from __future__ import annotations

import os
import sqlite3

from ctxkeep._sqlite import Migration, SQLiteClient, table_exists
from ctxkeep.artifacts.sql import SQLArtifactStore

MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_artifacts (
        ref TEXT PRIMARY KEY,
        text TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        created_at REAL NOT NULL
    )
    """,
]


def legacy_version(conn: sqlite3.Connection) -> int:
    """The layout version of a file written before ``ctxkeep_meta``: 1 if it has the table."""
    return 1 if table_exists(conn, "ctxkeep_artifacts") else 0


class SQLiteArtifactStore(SQLArtifactStore):
    """Artifacts in one SQLite file.

    Raises:
        StorageError: the file cannot be opened or set up.
        SchemaVersionError: the file holds artifacts of a newer ctxkeep.

    """

    name = "sqlite"
    param = "?"
    column = "text"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        db = SQLiteClient(
            os.fspath(path),
            meta_key="artifacts",
            migrations=MIGRATIONS,
            legacy_version=legacy_version,
        )
        super().__init__(db)
        self.path = db.path

    @property
    def where(self) -> str:
        """The file."""
        return str(self.path)

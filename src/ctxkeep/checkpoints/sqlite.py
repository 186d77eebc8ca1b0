"""Checkpoints in a SQLite file (``sqlite:///path.db``), WAL, safe across processes.

The table can share a file with the other stores (:mod:`ctxkeep._sqlite` owns connections,
transactions and schema versions: the ``checkpoints`` row of ``ctxkeep_meta``). A save's
``BEGIN IMMEDIATE`` takes the file's write lock, so concurrent savers queue for the next seq.

Files written before ``ctxkeep_meta`` kept the version in a table of their own,
``ctxkeep_checkpoint_meta``; its version is adopted once and the table is left as it was. A
migration that changes the layout must also raise the version in that table when it exists, so
that a ctxkeep from before ``ctxkeep_meta`` refuses the file instead of misreading it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ctxkeep._sqlite import Migration, SQLiteClient, table_exists
from ctxkeep.checkpoints.base import SQLCheckpointStore

MIGRATIONS: list[Migration] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_checkpoints (
        checkpoint_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        session_id TEXT,
        record TEXT NOT NULL,
        UNIQUE (agent_id, seq)
    )
    """,
]


def legacy_version(conn: sqlite3.Connection) -> int:
    """The version in ``ctxkeep_checkpoint_meta`` of a file written before ``ctxkeep_meta``."""
    if not table_exists(conn, "ctxkeep_checkpoint_meta"):
        return 0
    row = conn.execute("SELECT max(version) FROM ctxkeep_checkpoint_meta").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


class SQLiteCheckpointStore(SQLCheckpointStore):
    """Checkpoints in one SQLite file.

    Raises:
        StorageError: the file cannot be opened or set up.
        SchemaVersionError: the file holds checkpoints of a newer ctxkeep.

    """

    name = "sqlite"
    param = "?"

    def __init__(self, path: str | Path) -> None:
        db = SQLiteClient(
            path, meta_key="checkpoints", migrations=MIGRATIONS, legacy_version=legacy_version
        )
        super().__init__(db)
        self.path = db.path

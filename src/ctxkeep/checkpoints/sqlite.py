"""Checkpoints in a SQLite file (``sqlite:///path.db``), WAL, safe across processes.

The table can share a file with the session store; its schema version is kept in the
``ctxkeep_checkpoint_meta`` table, migrations are an ordered list, and a newer file is refused.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

from ctxkeep.checkpoints.base import Checkpoint, CheckpointStore, encode_checkpoint
from ctxkeep.errors import SchemaVersionError, StorageError

MIGRATIONS: list[str] = [
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


class SQLiteCheckpointStore(CheckpointStore):
    """Checkpoints in one SQLite file."""

    name = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._migrate()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA busy_timeout=60000")
            except sqlite3.Error as exc:
                raise StorageError(f"cannot open {self.path}: {exc}") from exc
            self._local.conn = conn
        return conn

    def _migrate(self) -> None:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS ctxkeep_checkpoint_meta (version INTEGER NOT NULL)"
            )
            row = conn.execute("SELECT version FROM ctxkeep_checkpoint_meta").fetchone()
            version = row[0] if row else 0
            if version > len(MIGRATIONS):
                conn.execute("ROLLBACK")
                raise SchemaVersionError(
                    f"{self.path} holds checkpoints of a newer ctxkeep (schema {version}; "
                    f"this one reads up to {len(MIGRATIONS)}); upgrade ctxkeep"
                )
            for i in range(version, len(MIGRATIONS)):
                conn.execute(MIGRATIONS[i])
            conn.execute("DELETE FROM ctxkeep_checkpoint_meta")
            conn.execute("INSERT INTO ctxkeep_checkpoint_meta VALUES (?)", (len(MIGRATIONS),))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise StorageError(f"cannot set up checkpoints in {self.path}: {exc}") from exc

    def _put(self, cp: Checkpoint) -> str:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            seq = conn.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM ctxkeep_checkpoints WHERE agent_id = ?",
                (cp.agent_id,),
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO ctxkeep_checkpoints (checkpoint_id, agent_id, seq, session_id, record)"
                " VALUES (?, ?, ?, ?, ?)",
                (
                    cp.checkpoint_id,
                    cp.agent_id,
                    seq,
                    cp.session_id,
                    encode_checkpoint(replace(cp, seq=seq)),
                ),
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise StorageError(f"cannot save a checkpoint in {self.path}: {exc}") from exc
        return cp.checkpoint_id

    def _one(self, sql: str, params: tuple[object, ...]) -> str | None:
        try:
            row = self._conn().execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: {exc}") from exc
        return str(row[0]) if row else None

    def _get(self, checkpoint_id: str) -> str | None:
        return self._one(
            "SELECT record FROM ctxkeep_checkpoints WHERE checkpoint_id = ?", (checkpoint_id,)
        )

    def _latest(self, agent_id: str) -> str | None:
        return self._one(
            "SELECT record FROM ctxkeep_checkpoints WHERE agent_id = ? ORDER BY seq DESC LIMIT 1",
            (agent_id,),
        )

    def _history(self, agent_id: str, limit: int) -> list[str]:
        try:
            rows = (
                self._conn()
                .execute(
                    "SELECT record FROM ctxkeep_checkpoints WHERE agent_id = ? "
                    "ORDER BY seq DESC LIMIT ?",
                    (agent_id, limit),
                )
                .fetchall()
            )
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: {exc}") from exc
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

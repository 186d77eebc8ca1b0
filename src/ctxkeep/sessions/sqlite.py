"""The SQLite session backend (``sqlite:///path.db``): the embedded default.

One file in WAL mode, safe for several processes on one machine: an append is one
``BEGIN IMMEDIATE`` transaction that reads the session row, runs the tool-call check, inserts
the messages under the next sequence numbers and updates the row.

Durability: WAL with ``synchronous=NORMAL`` by default. A committed append survives the
process being killed at any moment (tested with SIGKILL); after a power loss or OS crash the
newest commits may roll back, but the file is never corrupt. ``?synchronous=full`` in the URL
fsyncs every commit, surviving power loss too, at about a fifth of the append rate.

The schema version is SQLite's ``user_version``; :data:`MIGRATIONS` are applied in order, and
a file written by a newer ctxkeep is refused.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctxkeep.errors import (
    ConfigError,
    SchemaVersionError,
    SessionExistsError,
    SessionNotFoundError,
    StorageError,
)
from ctxkeep.messages import Message
from ctxkeep.sessions.base import Backend, Check, Evicted
from ctxkeep.sessions.records import SessionInfo, dumps, dumps_record, loads, record_to_message

# Position i brings a database from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_sessions (
        session_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        task_id TEXT,
        metadata TEXT NOT NULL,
        created_at REAL NOT NULL,
        accessed_at REAL NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        next_seq INTEGER NOT NULL DEFAULT 1,
        pending TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_agent
        ON ctxkeep_sessions (agent_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_task ON ctxkeep_sessions (task_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_accessed ON ctxkeep_sessions (accessed_at);
    CREATE TABLE IF NOT EXISTS ctxkeep_messages (
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS ctxkeep_archive (
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        record TEXT NOT NULL,
        archived_at REAL NOT NULL DEFAULT (julianday('now')),
        PRIMARY KEY (session_id, message_id)
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_COLUMNS = (
    "session_id, agent_id, task_id, metadata, created_at, accessed_at, message_count, "
    "next_seq, pending"
)


def _info(row: tuple[Any, ...]) -> SessionInfo:
    return SessionInfo(
        session_id=row[0],
        agent_id=row[1],
        task_id=row[2],
        metadata=json.loads(row[3]),
        created_at=row[4],
        accessed_at=row[5],
        message_count=row[6],
        next_seq=row[7],
        pending=tuple(json.loads(row[8])),
    )


class SQLiteBackend(Backend):
    """Sessions in one SQLite file."""

    name = "sqlite"

    def __init__(self, path: str | Path, *, synchronous: str = "normal") -> None:
        if synchronous.lower() not in ("full", "normal", "extra"):
            raise ConfigError(f"synchronous must be full, normal or extra, got {synchronous!r}")
        self.path = Path(path)
        self.synchronous = synchronous.upper()
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._migrate()

    # -- connections -------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
                conn.execute("PRAGMA busy_timeout=60000")
            except sqlite3.Error as exc:
                raise StorageError(f"cannot open {self.path}: {exc}") from exc
            self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self, immediate: bool = True) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot start a transaction on {self.path}: {exc}") from exc
        try:
            yield conn
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            raise StorageError(f"{self.path}: {exc}") from exc
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise StorageError(f"commit failed on {self.path}: {exc}") from exc

    def _q(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn().execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: {exc}") from exc

    def _migrate(self) -> None:
        try:
            with self._tx() as conn:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise SchemaVersionError(
                        f"{self.path} was written by a newer ctxkeep (schema {version}; this "
                        f"one reads up to {SCHEMA_VERSION}); upgrade ctxkeep"
                    )
                for i in range(version, SCHEMA_VERSION):
                    for stmt in MIGRATIONS[i].split(";"):
                        if stmt.strip():
                            conn.execute(stmt)
                    conn.execute(f"PRAGMA user_version={i + 1}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot set up {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- primitives --------------------------------------------------------------------

    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Insert the session row; an id in use is a SessionExistsError."""
        with self._tx() as conn:
            cur = conn.execute(
                f"INSERT INTO ctxkeep_sessions ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (session_id) DO NOTHING",
                (
                    info.session_id,
                    info.agent_id,
                    info.task_id,
                    json.dumps(info.metadata),
                    info.created_at,
                    info.accessed_at,
                    0,
                    1,
                    "[]",
                ),
            )
            if cur.rowcount == 0:
                raise SessionExistsError(info.session_id)

    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """Read (and touch) a session row."""
        if touch is not None:
            self._q(
                "UPDATE ctxkeep_sessions SET accessed_at = max(accessed_at, ?) "
                "WHERE session_id = ?",
                (touch, session_id),
            )
        rows = self._q(
            f"SELECT {_COLUMNS} FROM ctxkeep_sessions WHERE session_id = ?", (session_id,)
        )
        return _info(rows[0]) if rows else None

    def append(
        self,
        session_id: str,
        records: list[dict[str, Any]],
        check: Check,
        now: float,
        ttl: float | None,
    ) -> list[int]:
        """One IMMEDIATE transaction: check, insert, update."""
        texts = [dumps(r) for r in records]
        try:
            with self._tx() as conn:
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM ctxkeep_sessions WHERE session_id = ?", (session_id,)
                ).fetchone()
                if row is None:
                    raise SessionNotFoundError(f"no session {session_id!r}")
                info = _info(row)
                pending = check(info)
                start = info.next_seq
                seqs = list(range(start, start + len(texts)))
                conn.executemany(
                    "INSERT INTO ctxkeep_messages (session_id, seq, record) VALUES (?, ?, ?)",
                    [(session_id, s, t) for s, t in zip(seqs, texts, strict=True)],
                )
                conn.execute(
                    "UPDATE ctxkeep_sessions SET next_seq = ?, message_count = message_count + ?,"
                    " pending = ?, accessed_at = max(accessed_at, ?) WHERE session_id = ?",
                    (start + len(texts), len(texts), json.dumps(list(pending)), now, session_id),
                )
                return seqs
        except sqlite3.Error as exc:
            raise StorageError(f"append to {self.path} failed: {exc}") from exc

    def messages(self, session_id: str) -> list[tuple[int, dict[str, Any]]]:
        """Rows oldest first."""
        rows = self._q(
            "SELECT seq, record FROM ctxkeep_messages WHERE session_id = ? ORDER BY seq",
            (session_id,),
        )
        return [(seq, loads(rec)) for seq, rec in rows]

    def messages_after(self, session_id: str, after_seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Rows with ``seq > after_seq``, oldest first (an indexed range read)."""
        rows = self._q(
            "SELECT seq, record FROM ctxkeep_messages WHERE session_id = ? AND seq > ? "
            "ORDER BY seq",
            (session_id, after_seq),
        )
        return [(seq, loads(rec)) for seq, rec in rows]

    def remove_oldest(self, session_id: str, upto_seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Delete rows up to ``upto_seq`` and fix the count."""
        with self._tx() as conn:
            rows = conn.execute(
                "SELECT seq, record FROM ctxkeep_messages WHERE session_id = ? AND seq <= ? "
                "ORDER BY seq",
                (session_id, upto_seq),
            ).fetchall()
            conn.execute(
                "DELETE FROM ctxkeep_messages WHERE session_id = ? AND seq <= ?",
                (session_id, upto_seq),
            )
            conn.execute(
                "UPDATE ctxkeep_sessions SET message_count = "
                "(SELECT count(*) FROM ctxkeep_messages WHERE session_id = ?) "
                "WHERE session_id = ?",
                (session_id, session_id),
            )
        return [(seq, loads(rec)) for seq, rec in rows]

    def delete(self, session_id: str) -> bool:
        """Delete the session and its messages in one transaction."""
        with self._tx() as conn:
            conn.execute("DELETE FROM ctxkeep_messages WHERE session_id = ?", (session_id,))
            cur = conn.execute("DELETE FROM ctxkeep_sessions WHERE session_id = ?", (session_id,))
            return cur.rowcount > 0

    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """A page, newest first."""
        where, params = [], []
        if agent_id is not None:
            where.append("agent_id = ?")
            params.append(agent_id)
        if task_id is not None:
            where.append("task_id = ?")
            params.append(task_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._q(
            f"SELECT {_COLUMNS} FROM ctxkeep_sessions {clause} "
            "ORDER BY created_at DESC, session_id LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [_info(r) for r in rows]

    def latest_for_agent(self, agent_id: str) -> str | None:
        """The agent's newest session id."""
        rows = self._q(
            "SELECT session_id FROM ctxkeep_sessions WHERE agent_id = ? "
            "ORDER BY created_at DESC, session_id LIMIT 1",
            (agent_id,),
        )
        return rows[0][0] if rows else None

    def count(self) -> int:
        """Sessions stored."""
        return int(self._q("SELECT count(*) FROM ctxkeep_sessions")[0][0])

    def least_recent(self, n: int) -> list[str]:
        """Oldest-accessed ids."""
        rows = self._q(
            "SELECT session_id FROM ctxkeep_sessions ORDER BY accessed_at, session_id LIMIT ?",
            (n,),
        )
        return [r[0] for r in rows]

    def idle_since(self, cutoff: float) -> list[str]:
        """Ids idle since before ``cutoff``."""
        rows = self._q("SELECT session_id FROM ctxkeep_sessions WHERE accessed_at < ?", (cutoff,))
        return [r[0] for r in rows]

    def archive(self, evicted: Evicted) -> None:
        """Keep evicted messages in ``ctxkeep_archive`` (idempotent per message id)."""
        with self._tx() as conn:
            conn.executemany(
                "INSERT INTO ctxkeep_archive (session_id, message_id, agent_id, reason, record) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [
                    (
                        evicted.session_id,
                        m.id or "",
                        evicted.agent_id,
                        evicted.reason,
                        dumps_record(m),
                    )
                    for m in evicted.messages
                ],
            )

    def archived(self, session_id: str) -> list[Message]:
        """A session's archived messages, in archive order."""
        rows = self._q(
            "SELECT record FROM ctxkeep_archive WHERE session_id = ? ORDER BY rowid",
            (session_id,),
        )
        return [record_to_message(r[0]) for r in rows]

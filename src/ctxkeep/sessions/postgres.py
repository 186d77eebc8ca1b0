"""The PostgreSQL session backend (``postgresql://...``): shared and durable.

psycopg 3 over a :class:`psycopg_pool.ConnectionPool`. Tables are prefixed ``ctxkeep_`` and
live in the connection's ``search_path`` (``?options=-csearch_path%3Dmyschema`` in the URL
picks a schema). An append is one transaction: ``SELECT ... FOR UPDATE`` locks the session row,
the manager's tool-call check runs, the messages are inserted under the next sequence numbers
and the row is updated; concurrent writers queue on the row lock, so sequence numbers stay
gapless. Once an append returns, its commit is durable by PostgreSQL's own guarantees
(``synchronous_commit``, ``fsync``); a client killed mid-append leaves nothing behind.

Messages are stored as the JSON text of their record (``TEXT``, not ``JSONB``): JSONB would
reorder keys and normalise numbers, and ctxkeep compares messages by equality.

The schema version is a row of ``ctxkeep_meta``; :data:`MIGRATIONS` are applied in order under
an advisory lock (so several processes may start at once), and a database written by a newer
ctxkeep is refused.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ctxkeep._pg import PgClient
from ctxkeep.errors import (
    SessionExistsError,
    SessionNotFoundError,
)
from ctxkeep.messages import Message
from ctxkeep.sessions.base import Backend, Check, Evicted
from ctxkeep.sessions.records import SessionInfo, dumps, dumps_record, loads, record_to_message

if TYPE_CHECKING:
    import psycopg

META_KEY = "sessions"

# Position i brings a database from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_sessions (
        session_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        task_id TEXT,
        metadata TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        accessed_at DOUBLE PRECISION NOT NULL,
        message_count INTEGER NOT NULL DEFAULT 0,
        next_seq BIGINT NOT NULL DEFAULT 1,
        pending TEXT NOT NULL DEFAULT '[]'
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_agent
        ON ctxkeep_sessions (agent_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_task ON ctxkeep_sessions (task_id, created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_created ON ctxkeep_sessions (created_at);
    CREATE INDEX IF NOT EXISTS ctxkeep_sessions_accessed ON ctxkeep_sessions (accessed_at);
    CREATE TABLE IF NOT EXISTS ctxkeep_messages (
        session_id TEXT NOT NULL REFERENCES ctxkeep_sessions ON DELETE CASCADE,
        seq BIGINT NOT NULL,
        record TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE IF NOT EXISTS ctxkeep_archive (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        agent_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        record TEXT NOT NULL,
        archived_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (session_id, message_id)
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

_COLUMNS = (
    "session_id, agent_id, task_id, metadata, created_at, accessed_at, message_count, "
    "next_seq, pending"
)

Row = tuple[Any, ...]


def _info(row: Row) -> SessionInfo:
    return SessionInfo(
        session_id=row[0],
        agent_id=row[1],
        task_id=row[2],
        metadata=loads(row[3]),
        created_at=row[4],
        accessed_at=row[5],
        message_count=row[6],
        next_seq=row[7],
        pending=tuple(loads(row[8])),
    )


class PostgresBackend(Backend):
    """Sessions in PostgreSQL tables, over a connection pool.

    Args:
        url: a libpq URI (``postgresql://user:password@host:port/dbname?...``).
        min_size: connections kept open.
        max_size: connections at most (callers wait for a free one beyond it).
        timeout: seconds to wait for a connection before giving up.

    Raises:
        StorageError: the server cannot be reached.
        SchemaVersionError: the database was written by a newer ctxkeep.

    """

    name = "postgres"

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0
    ) -> None:
        self._pg = PgClient(
            url,
            name="ctxkeep-sessions",
            meta_key=META_KEY,
            migrations=MIGRATIONS,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout,
        )
        self.where = self._pg.where

    # -- plumbing (shared with the other PostgreSQL stores, in ctxkeep._pg) ---------------

    def _errors(self, doing: str) -> AbstractContextManager[None]:
        return self._pg.errors(doing)

    def _tx(self, doing: str) -> AbstractContextManager[psycopg.Connection[Row]]:
        return self._pg.tx(doing)

    def _q(self, doing: str, sql: str, params: tuple[Any, ...] = ()) -> list[Row]:
        return self._pg.q(doing, sql, params)

    def close(self) -> None:
        """Close the pool."""
        self._pg.close()

    # -- primitives --------------------------------------------------------------------

    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Insert the session row."""
        with self._tx("create a session") as conn:
            cur = conn.execute(
                f"INSERT INTO ctxkeep_sessions ({_COLUMNS}) "
                "VALUES (%s, %s, %s, %s, %s, %s, 0, 1, '[]') ON CONFLICT DO NOTHING",
                (
                    info.session_id,
                    info.agent_id,
                    info.task_id,
                    dumps(info.metadata),
                    info.created_at,
                    info.accessed_at,
                ),
            )
            if cur.rowcount == 0:
                raise SessionExistsError(info.session_id)

    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """Read (and touch) a session row."""
        if touch is None:
            rows = self._q(
                "read a session",
                f"SELECT {_COLUMNS} FROM ctxkeep_sessions WHERE session_id = %s",
                (session_id,),
            )
        else:
            rows = self._q(
                "touch a session",
                "UPDATE ctxkeep_sessions SET accessed_at = GREATEST(accessed_at, %s) "
                f"WHERE session_id = %s RETURNING {_COLUMNS}",
                (touch, session_id),
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
        """One transaction: lock the row, check, insert, update."""
        texts = [dumps(r) for r in records]
        with self._tx("append") as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM ctxkeep_sessions WHERE session_id = %s FOR UPDATE",
                (session_id,),
            ).fetchone()
            if row is None:
                raise SessionNotFoundError(f"no session {session_id!r}")
            info = _info(row)
            pending = check(info)
            seqs = list(range(info.next_seq, info.next_seq + len(texts)))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO ctxkeep_messages (session_id, seq, record) VALUES (%s, %s, %s)",
                    [(session_id, s, t) for s, t in zip(seqs, texts, strict=True)],
                )
            conn.execute(
                "UPDATE ctxkeep_sessions SET next_seq = %s, message_count = message_count + %s, "
                "pending = %s, accessed_at = GREATEST(accessed_at, %s) WHERE session_id = %s",
                (info.next_seq + len(texts), len(texts), dumps(list(pending)), now, session_id),
            )
            return seqs

    def messages(self, session_id: str) -> list[tuple[int, dict[str, Any]]]:
        """Rows oldest first."""
        rows = self._q(
            "read messages",
            "SELECT seq, record FROM ctxkeep_messages WHERE session_id = %s ORDER BY seq",
            (session_id,),
        )
        return [(seq, loads(rec)) for seq, rec in rows]

    def messages_after(self, session_id: str, after_seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Rows with ``seq > after_seq``, oldest first (an indexed range read)."""
        rows = self._q(
            "read new messages",
            "SELECT seq, record FROM ctxkeep_messages WHERE session_id = %s AND seq > %s "
            "ORDER BY seq",
            (session_id, after_seq),
        )
        return [(seq, loads(rec)) for seq, rec in rows]

    def remove_oldest(self, session_id: str, upto_seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Delete rows up to ``upto_seq`` and fix the count, with the session row locked."""
        with self._tx("trim messages") as conn:
            conn.execute(
                "SELECT 1 FROM ctxkeep_sessions WHERE session_id = %s FOR UPDATE", (session_id,)
            )
            rows = conn.execute(
                "DELETE FROM ctxkeep_messages WHERE session_id = %s AND seq <= %s "
                "RETURNING seq, record",
                (session_id, upto_seq),
            ).fetchall()
            if rows:
                conn.execute(
                    "UPDATE ctxkeep_sessions SET message_count = message_count - %s "
                    "WHERE session_id = %s",
                    (len(rows), session_id),
                )
        return [(seq, loads(rec)) for seq, rec in sorted(rows)]

    def delete(self, session_id: str) -> bool:
        """Delete the session (its messages go with it, by the foreign key)."""
        with self._tx("delete a session") as conn:
            cur = conn.execute("DELETE FROM ctxkeep_sessions WHERE session_id = %s", (session_id,))
            return cur.rowcount > 0

    def latest_for_agent(self, agent_id: str) -> str | None:
        """The agent's newest session id."""
        rows = self._q(
            "find the latest session",
            "SELECT session_id FROM ctxkeep_sessions WHERE agent_id = %s "
            "ORDER BY created_at DESC, session_id LIMIT 1",
            (agent_id,),
        )
        return str(rows[0][0]) if rows else None

    def count(self) -> int:
        """Sessions stored."""
        return int(self._q("count sessions", "SELECT count(*) FROM ctxkeep_sessions")[0][0])

    def least_recent(self, n: int) -> list[str]:
        """Oldest-accessed ids."""
        rows = self._q(
            "find least recent sessions",
            "SELECT session_id FROM ctxkeep_sessions ORDER BY accessed_at, session_id LIMIT %s",
            (n,),
        )
        return [r[0] for r in rows]

    def idle_since(self, cutoff: float) -> list[str]:
        """Ids idle since before ``cutoff``."""
        rows = self._q(
            "find idle sessions",
            "SELECT session_id FROM ctxkeep_sessions WHERE accessed_at < %s",
            (cutoff,),
        )
        return [r[0] for r in rows]

    def archive(self, evicted: Evicted) -> None:
        """Keep evicted messages in ``ctxkeep_archive`` (idempotent per message id)."""
        rows = [
            (evicted.session_id, m.id or "", evicted.agent_id, evicted.reason, dumps_record(m))
            for m in evicted.messages
        ]
        with self._tx("archive messages") as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO ctxkeep_archive (session_id, message_id, agent_id, reason, record) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                rows,
            )

    def archived(self, session_id: str) -> list[Message]:
        """A session's archived messages, in archive order."""
        rows = self._q(
            "read the archive",
            "SELECT record FROM ctxkeep_archive WHERE session_id = %s ORDER BY id",
            (session_id,),
        )
        return [record_to_message(r[0]) for r in rows]

    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """A page, newest first."""
        where, params = [], []
        if agent_id is not None:
            where.append("agent_id = %s")
            params.append(agent_id)
        if task_id is not None:
            where.append("task_id = %s")
            params.append(task_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._q(
            "list sessions",
            f"SELECT {_COLUMNS} FROM ctxkeep_sessions {clause} "
            "ORDER BY created_at DESC, session_id LIMIT %s OFFSET %s",
            (*params, limit, offset),
        )
        return [_info(r) for r in rows]

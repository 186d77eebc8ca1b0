"""Checkpoints in PostgreSQL (``postgresql://...``).

One table; a save takes a per-agent advisory lock for the next sequence number, so concurrent
savers of one agent never collide. Records are the JSON text of the checkpoint.
"""

from __future__ import annotations

from dataclasses import replace

from ctxkeep._pg import PgClient
from ctxkeep.checkpoints.base import Checkpoint, CheckpointStore, encode_checkpoint

MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_checkpoints (
        checkpoint_id TEXT PRIMARY KEY,
        agent_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        session_id TEXT,
        record TEXT NOT NULL,
        UNIQUE (agent_id, seq)
    )
    """,
]


class PostgresCheckpointStore(CheckpointStore):
    """Checkpoints in a PostgreSQL table."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        self._pg = PgClient(
            url, name="ctxkeep-checkpoints", meta_key="checkpoints", migrations=MIGRATIONS
        )

    def _put(self, cp: Checkpoint) -> str:
        with self._pg.tx("save a checkpoint") as conn:
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (cp.agent_id,))
            seq = conn.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM ctxkeep_checkpoints WHERE agent_id = %s",
                (cp.agent_id,),
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO ctxkeep_checkpoints (checkpoint_id, agent_id, seq, session_id, "
                "record) VALUES (%s, %s, %s, %s, %s)",
                (
                    cp.checkpoint_id,
                    cp.agent_id,
                    seq,
                    cp.session_id,
                    encode_checkpoint(replace(cp, seq=seq)),
                ),
            )
        return cp.checkpoint_id

    def _one(self, sql: str, params: tuple[object, ...]) -> str | None:
        rows = self._pg.q("read a checkpoint", sql, params)
        return str(rows[0][0]) if rows else None

    def _get(self, checkpoint_id: str) -> str | None:
        return self._one(
            "SELECT record FROM ctxkeep_checkpoints WHERE checkpoint_id = %s", (checkpoint_id,)
        )

    def _latest(self, agent_id: str) -> str | None:
        return self._one(
            "SELECT record FROM ctxkeep_checkpoints WHERE agent_id = %s ORDER BY seq DESC LIMIT 1",
            (agent_id,),
        )

    def _history(self, agent_id: str, limit: int) -> list[str]:
        rows = self._pg.q(
            "read checkpoints",
            "SELECT record FROM ctxkeep_checkpoints WHERE agent_id = %s ORDER BY seq DESC LIMIT %s",
            (agent_id, limit),
        )
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        """Close the pool."""
        self._pg.close()

"""Checkpoints in PostgreSQL (``postgresql://...``).

One table (see :class:`~ctxkeep.checkpoints.base.SQLCheckpointStore`); a save takes a per-agent
advisory lock for the next sequence number, so concurrent savers of one agent never collide.
Records are the JSON text of the checkpoint.
"""

from __future__ import annotations

from typing import Any

from ctxkeep._pg import PgClient
from ctxkeep.checkpoints.base import SQLCheckpointStore

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


class PostgresCheckpointStore(SQLCheckpointStore):
    """Checkpoints in a PostgreSQL table."""

    name = "postgres"
    param = "%s"

    def __init__(self, url: str) -> None:
        super().__init__(
            PgClient(url, name="ctxkeep-checkpoints", meta_key="checkpoints", migrations=MIGRATIONS)
        )

    def _lock_agent(self, conn: Any, agent_id: str) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (agent_id,))

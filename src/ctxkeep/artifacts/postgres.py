"""Artifacts in PostgreSQL (``postgresql://...``): one table, shared and durable.

The text is stored as its UTF-8 bytes (``BYTEA``), not as ``TEXT``: PostgreSQL's text types
cannot hold the NUL character, which tool outputs (binary dumps, C strings) do contain, and an
artifact must come back exactly. ``JSONB`` would be worse still (it normalises). The schema
version is the ``artifacts`` row of ``ctxkeep_meta`` (see :mod:`ctxkeep._pg`).
"""

from __future__ import annotations

from typing import Any

from ctxkeep._pg import PgClient
from ctxkeep.artifacts.sql import SQLArtifactStore

MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_artifacts (
        ref TEXT PRIMARY KEY,
        body BYTEA NOT NULL,
        schema_version INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )
    """,
]


class PostgresArtifactStore(SQLArtifactStore):
    """Artifacts in a PostgreSQL table.

    Raises:
        ConfigError: an invalid URL.
        StorageError: the server does not answer.
        SchemaVersionError: the database holds artifacts of a newer ctxkeep.

    """

    name = "postgres"
    param = "%s"
    column = "body"

    def __init__(self, url: str) -> None:
        self._pg = PgClient(
            url, name="ctxkeep-artifacts", meta_key="artifacts", migrations=MIGRATIONS
        )
        super().__init__(self._pg)

    @property
    def where(self) -> str:
        """The server and database."""
        return f"PostgreSQL at {self._pg.where}"

    def _encode(self, text: str) -> Any:
        return text.encode("utf-8")

    def _decode(self, value: Any) -> str:
        return bytes(value).decode("utf-8")

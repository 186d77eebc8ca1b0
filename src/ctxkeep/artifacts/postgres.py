"""Artifacts in PostgreSQL (``postgresql://...``): one table, shared and durable.

The text is stored as its UTF-8 bytes (``BYTEA``), not as ``TEXT``: PostgreSQL's text types
cannot hold the NUL character, which tool outputs (binary dumps, C strings) do contain, and an
artifact must come back exactly. ``JSONB`` would be worse still (it normalises). The schema
version is the ``artifacts`` row of ``ctxkeep_meta`` (see :mod:`ctxkeep._pg`).
"""

from __future__ import annotations

import time
from typing import Any

from ctxkeep._pg import PgClient
from ctxkeep.artifacts.base import RECORD_VERSION
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


LOOKUP_SQL = "SELECT ref FROM ctxkeep_artifacts WHERE ref = ANY(%s)"
"""Which of the refs (one array: the statement's text is the same for any number) are stored."""

INSERT_SQL = (
    "INSERT INTO ctxkeep_artifacts (ref, body, schema_version, created_at) "
    "SELECT ref, body, %s, %s FROM unnest(%s::text[], %s::bytea[]) AS new (ref, body) "
    "ON CONFLICT (ref) DO NOTHING RETURNING ref"
)
"""Store the artifacts not stored (parameters: the schema version, the time, the refs and their
bytes, as two arrays): one statement, atomic by itself."""


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

    def _put_many(self, items: dict[str, str]) -> None:
        """Which refs are stored, then the others: two statements of fixed text, each its own
        transaction, where the shared path sent a statement of as many placeholders as refs
        (parsed and planned each time), then ``BEGIN``, an ``INSERT`` per artifact and
        ``COMMIT``. Nothing is written when every ref is stored (a prompt build on a
        read-only database).
        """
        refs = list(items)
        stored = {str(r[0]) for r in self._pg.q("look up artifacts", LOOKUP_SQL, (refs,))}
        new = [ref for ref in refs if ref not in stored]
        if new:
            bodies = [self._encode(items[ref]) for ref in new]
            self._pg.q("store artifacts", INSERT_SQL, (RECORD_VERSION, time.time(), new, bodies))

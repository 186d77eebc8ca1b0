"""The SQLite session backend (``sqlite:///path.db``): the embedded default.

One file in WAL mode, safe for several processes on one machine, on the shared engine client
(:mod:`ctxkeep._sqlite`); the primitives are the shared SQL ones (:mod:`ctxkeep.sessions.sql`).
An append is one ``BEGIN IMMEDIATE`` transaction (the file's write lock is taken up front), a
read of a session and its messages one deferred transaction (a WAL snapshot).

Durability: WAL with ``synchronous=NORMAL`` by default. A committed append survives the
process being killed at any moment (tested with SIGKILL); after a power loss or OS crash the
newest commits may roll back, but the file is never corrupt. ``?synchronous=full`` in the URL
fsyncs every commit, surviving power loss too, at about a fifth of the append rate.

``?mode=ro`` opens the file read-only (SQLite's own ``mode=ro``, which binds root too): reads
work (a read's access-time update is skipped, said once in the log), writes raise
StorageError. The file must be at the newest schema version already.

The schema version is the ``sessions`` row of ``ctxkeep_meta``; :data:`MIGRATIONS` are applied
in order, and a file written by a newer ctxkeep is refused. Files of the first release kept
their version in ``PRAGMA user_version``; it is adopted.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path

from ctxkeep._sqlite import SQLiteClient
from ctxkeep.errors import ConfigError
from ctxkeep.sessions.sql import SQLITE, SQLBackend, migrations

MIGRATIONS = migrations(SQLITE)
SCHEMA_VERSION = len(MIGRATIONS)


def _legacy_version(conn: sqlite3.Connection) -> int:
    """The version a file of the first release kept in ``user_version``."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


class SQLiteBackend(SQLBackend):
    """Sessions in one SQLite file.

    Args:
        path: the database file (its folder is created).
        synchronous: ``normal`` (default), ``full`` or ``extra``: see the module docstring.
        read_only: open the file read-only (``?mode=ro`` in the URL): reads work, a read's
            access-time update is skipped (:class:`~ctxkeep.sessions.base.MemoryManager`),
            writes raise StorageError.

    Raises:
        ConfigError: a bad ``synchronous``.
        StorageError: the file cannot be opened.
        SchemaVersionError: the file was written by a newer ctxkeep.

    """

    name = "sqlite"
    dialect = SQLITE

    def __init__(
        self, path: str | Path, *, synchronous: str = "normal", read_only: bool = False
    ) -> None:
        if synchronous.lower() not in ("full", "normal", "extra"):
            raise ConfigError(f"synchronous must be full, normal or extra, got {synchronous!r}")
        self.db = self.client = SQLiteClient(
            path,
            meta_key="sessions",
            migrations=MIGRATIONS,
            synchronous=synchronous,
            legacy_version=_legacy_version,
            read_only=read_only,
        )
        self.path = self.db.path
        self.synchronous = self.db.synchronous

    def snapshot(self, doing: str) -> AbstractContextManager[sqlite3.Connection]:
        """A deferred transaction: its first read fixes the WAL snapshot it sees."""
        return self.client.tx(doing, immediate=False)

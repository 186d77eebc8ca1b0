"""SQLite plumbing shared by every store that keeps a file (sessions, checkpoints, episodes,
artifacts): connections, transactions, the one place ``sqlite3`` errors become
:class:`~ctxkeep.errors.StorageError`, and versioned schema setup.

Connections. Each thread gets its own connection (a ``sqlite3.Connection`` is not safe to share
between threads), opened in WAL mode with a busy timeout, in autocommit mode so that every
transaction is explicit: :meth:`SQLiteClient.tx` runs ``BEGIN IMMEDIATE`` (the write lock is
taken up front, so two writers queue instead of failing half-way with ``SQLITE_BUSY``), commits
when its block ends and rolls back on any exception. :meth:`SQLiteClient.close` closes every
thread's connection.

Schema versions. Stores may share one file, so their versions live side by side in one table,
``ctxkeep_meta(key, value)``, one row per store (``sessions``, ``checkpoints``, ``episodic``,
``artifacts``). Each store passes an ordered list of migrations: position ``i`` brings the store
from version ``i`` to ``i + 1``. A store already at the newest version is opened without writing
(a write would make every other process's cache reload); a newer version is refused with
:class:`~ctxkeep.errors.SchemaVersionError`. Files written before ``ctxkeep_meta`` existed are
adopted through the store's ``legacy_version`` reader.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

from ctxkeep.errors import ConfigError, SchemaVersionError, StorageError

Migration: TypeAlias = "str | Callable[[sqlite3.Connection], None]"
"""SQL text (one or more statements) or a function run inside the migration's transaction."""

_SYNCHRONOUS = ("off", "normal", "full", "extra")

META_TABLE = (
    "CREATE TABLE IF NOT EXISTS ctxkeep_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) "
    "WITHOUT ROWID"
)
"""The versions table. Its rows kept in the primary key's b-tree (``WITHOUT ROWID``): one page
of the file, where a rowid table took two (its rows, and their keys again in the key's index).
A file written before keeps its rowid table, the same columns read and written alike."""


def statements(sql: str) -> list[str]:
    """The complete statements of ``sql``, in order (a ``;`` inside a string or a trigger body
    does not split).
    """
    out: list[str] = []
    buf = ""
    for piece in sql.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \t\r\n;"):
                out.append(buf.strip())
            buf = ""
    if buf.strip(" \t\r\n;"):
        out.append(buf.strip())
    return out


class SQLiteClient:
    """One SQLite file: per-thread connections, transactions and versioned schema setup.

    Args:
        path: the database file (its folder is created), or ``":memory:"``.
        meta_key: the store's row in ``ctxkeep_meta`` (``"sessions"``, ``"checkpoints"``...).
        migrations: the store's ordered migrations.
        synchronous: SQLite's ``synchronous`` setting (``normal``: WAL commits survive a killed
            process; ``full`` survives power loss too).
        legacy_version: reads the version of a file written before ``ctxkeep_meta`` (called
            inside the setup transaction when the store has no row; ``None``: version 0).
        timeout: seconds to wait for another process's write lock.
        read_only: open the file read-only (SQLite's ``mode=ro``: every write fails with
            "attempt to write a readonly database", as on a file the process may not write;
            root included). The store must be at the newest schema version already.
        mmap_size: bytes of the file each connection reads through a memory map (SQLite's
            ``mmap_size``; 0: none, every page read with a system call into SQLite's cache).
            Pages still in the WAL are read from it as before, and writes go through the WAL.

    Raises:
        ConfigError: an unknown ``synchronous`` value.
        StorageError: the file cannot be opened or set up.
        SchemaVersionError: the file was written by a newer ctxkeep.

    """

    def __init__(
        self,
        path: str | Path,
        *,
        meta_key: str,
        migrations: Sequence[Migration],
        synchronous: str = "normal",
        legacy_version: Callable[[sqlite3.Connection], int] | None = None,
        timeout: float = 60.0,
        read_only: bool = False,
        mmap_size: int = 0,
    ) -> None:
        if synchronous.lower() not in _SYNCHRONOUS:
            raise ConfigError(
                f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, got {synchronous!r}"
            )
        self.path = Path(path)
        self.memory = str(path) == ":memory:"
        self.read_only = read_only and not self.memory
        self.synchronous = synchronous.upper()
        self.timeout = timeout
        self.mmap_size = 0 if self.memory else int(mmap_size)
        self.meta_key = meta_key
        self.version = len(migrations)
        if not self.memory and not self.read_only:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create the folder of {self.path}: {exc}") from exc
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        self._epoch = 0  # moved by close(): a thread's older connection is not reused
        self.migrate(migrations, legacy_version)

    # -- connections -------------------------------------------------------------------

    def conn(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use)."""
        held = getattr(self._local, "held", None)
        if held is not None and held[0] == self._epoch:
            conn: sqlite3.Connection = held[1]
            return conn
        try:
            target = f"file:{quote(str(self.path))}?mode=ro" if self.read_only else self.path
            conn = sqlite3.connect(
                target,
                timeout=self.timeout,
                isolation_level=None,
                check_same_thread=False,
                uri=self.read_only,
            )
            if not self.memory and not self.read_only:  # (WAL is the file's, set on writing)
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            if self.mmap_size:
                conn.execute(f"PRAGMA mmap_size={self.mmap_size}")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self.path}: {exc}") from exc
        with self._lock:
            self._conns.append(conn)
            self._local.held = (self._epoch, conn)
        return conn

    def close(self) -> None:
        """Close every thread's connection (idempotent); a later call opens new ones."""
        with self._lock:
            conns, self._conns = self._conns, []
            self._epoch += 1
        for conn in conns:
            with suppress(sqlite3.Error):
                conn.close()

    # -- statements and transactions ---------------------------------------------------

    @contextmanager
    def errors(self, doing: str) -> Iterator[None]:
        """Translate ``sqlite3`` errors raised inside the block into StorageError."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self.error(doing, exc) from exc

    def tx(
        self, doing: str, *, immediate: bool = True
    ) -> AbstractContextManager[sqlite3.Connection]:
        """This thread's connection inside one transaction: committed when the block ends,
        rolled back if it raises (the exception propagates; ``sqlite3`` errors translated).
        """
        return _Tx(self, doing, immediate)

    def error(self, doing: str, exc: sqlite3.Error) -> StorageError:
        """The StorageError ``exc`` becomes (as :meth:`errors` raises it)."""
        return StorageError(f"SQLite {self.path}: {doing}: {exc}")

    def q(self, doing: str, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement outside a transaction; its rows."""
        with self.errors(doing):
            return self.conn().execute(sql, tuple(params)).fetchall()

    def data_version(self) -> int:
        """``PRAGMA data_version`` of this thread's connection: it changes when another
        connection commits (values are per connection).
        """
        return int(self.q("read data_version", "PRAGMA data_version")[0][0])

    # -- schema ------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A value of ``ctxkeep_meta`` (``None`` if absent or the table does not exist)."""
        with self.errors("read ctxkeep_meta"):
            try:
                row = (
                    self.conn()
                    .execute("SELECT value FROM ctxkeep_meta WHERE key = ?", (key,))
                    .fetchone()
                )
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return None
                raise
        return None if row is None else str(row[0])

    @staticmethod
    def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
        """Set a value of ``ctxkeep_meta`` (inside the caller's transaction)."""
        conn.execute(
            "INSERT INTO ctxkeep_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def migrate(
        self,
        migrations: Sequence[Migration],
        legacy_version: Callable[[sqlite3.Connection], int] | None = None,
    ) -> None:
        """Bring the store's tables to the newest version (see the module docstring)."""
        newest = len(migrations)
        current = self.meta(self.meta_key)
        if current is not None and self._checked(current) == newest:
            return  # current: write nothing
        if self.read_only:
            raise StorageError(
                f"{self.path} is opened read-only and holds {self.meta_key} at schema "
                f"{current or 0}, not {newest}: open it writable once to upgrade it"
            )
        with self.tx("schema setup") as conn:
            conn.execute(META_TABLE)
            row = conn.execute(
                "SELECT value FROM ctxkeep_meta WHERE key = ?", (self.meta_key,)
            ).fetchone()
            if row is not None:
                version = self._checked(str(row[0]))
            else:
                version = legacy_version(conn) if legacy_version is not None else 0
            if version > newest:
                raise SchemaVersionError(
                    f"{self.path} holds {self.meta_key} of a newer ctxkeep (schema {version}; "
                    f"this one reads up to {newest}); upgrade ctxkeep"
                )
            for step in migrations[version:]:
                if callable(step):
                    step(conn)
                else:
                    for stmt in statements(step):
                        conn.execute(stmt)
            if row is None or version != newest:
                self.set_meta(conn, self.meta_key, str(newest))

    def _checked(self, value: str) -> int:
        try:
            version = int(value)
        except ValueError:
            raise SchemaVersionError(
                f"{self.path}: {self.meta_key} has an invalid schema version {value!r}"
            ) from None
        if version > self.version:
            raise SchemaVersionError(
                f"{self.path} holds {self.meta_key} of a newer ctxkeep (schema {version}; "
                f"this one reads up to {self.version}); upgrade ctxkeep"
            )
        return version


class _Tx:
    """:meth:`SQLiteClient.tx`'s transaction (a class, not a generator: a generator's context
    manager costs a few us a transaction, of some 50 us of Python an append makes).
    """

    __slots__ = ("_client", "_conn", "_doing", "_immediate")

    def __init__(self, client: SQLiteClient, doing: str, immediate: bool) -> None:
        self._client = client
        self._doing = doing
        self._immediate = immediate

    def __enter__(self) -> sqlite3.Connection:
        conn = self._conn = self._client.conn()
        try:
            conn.execute("BEGIN IMMEDIATE" if self._immediate else "BEGIN")
        except sqlite3.Error as exc:
            raise self._client.error(self._doing, exc) from exc
        return conn

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> Literal[False]:
        conn = self._conn
        try:
            if kind is None:
                conn.execute("COMMIT")
                return False
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        except sqlite3.Error as err:
            raise self._client.error(self._doing, err) from err
        if isinstance(exc, sqlite3.Error):
            raise self._client.error(self._doing, exc) from exc
        return False  # the block's exception propagates


def table_exists(conn: sqlite3.Connection, name: str) -> bool:
    """Whether the file has a table called ``name``."""
    row = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return row is not None

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

An append of new messages that this process knows the session's state for (it made the
session, or wrote it last) is a compare-and-set inside that transaction
(:meth:`SQLiteBackend.append`): the tool-call check runs on the state known, and one ``UPDATE``
moves the counters, the pending calls and the access time only if the row is still in that
state; then the insert. A row in another state (another writer came first) takes the shared
path in the same transaction: the row read back by the counters' update, the check run on
it, a second update where pending or the access time change. A session's first add through
:meth:`~ctxkeep.sessions.base.MemoryManager.add_messages_creating` (an adapter's, on a session
there is none of) makes the row in that same transaction (:attr:`Append.creates`): one
transaction, where the append refused, the session made and the append sent again were three.

The schema version is the ``sessions`` row of ``ctxkeep_meta``; :data:`MIGRATIONS` are applied
in order, and a file written by a newer ctxkeep is refused. Files of the first release kept
their version in ``PRAGMA user_version``; it is adopted.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ctxkeep._sqlite import SQLiteClient
from ctxkeep.errors import ConfigError, SessionNotFoundError
from ctxkeep.sessions.backend import KnownStates
from ctxkeep.sessions.records import (
    Append,
    SessionInfo,
    dumps,
    info_with,
    load_record,
    pending_after_pop,
)
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
        self._known = KnownStates()

    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Insert the session row; its state is known from then on."""
        super().create(info, ttl)
        self._known.put(info)

    def append(self, session_id: str, batch: Append) -> list[int]:
        """One write transaction: a compare-and-set on the state known of the session where
        there is one (messages under ids made for them), else the shared path (see the
        module docstring). The session's state after it is known from then on.
        """
        texts = batch.encoded()
        base = self._known.get(session_id)
        try:
            with self.db.tx("append") as conn:
                done = None
                if base is not None and batch.fresh_ids:
                    done = self._cas_append(conn, session_id, batch, texts, base)
                if done is None:
                    done = self._shared_append(conn, session_id, batch, texts)
        except _Stale:  # rolled back: the shared path decides on the row itself
            with self.db.tx("append") as conn:
                done = self._shared_append(conn, session_id, batch, texts)
        self._known.put(done[1])
        return done[0]

    def _shared_append(
        self, conn: sqlite3.Connection, session_id: str, batch: Append, texts: list[str]
    ) -> tuple[list[int], SessionInfo]:
        """The shared path inside ``conn``'s transaction; the seqs and the state after. A
        session there is none of is made first where the batch :attr:`~Append.creates` it
        (the counters' update found no row: nothing was written), in the same transaction.
        """
        try:
            seqs, info, pending, touch = self._append_in(conn, session_id, batch, texts)
        except SessionNotFoundError:
            self._known.forget(session_id)
            if batch.creates is None or not self._insert_session(conn, batch.creates()):
                raise
            seqs, info, pending, touch = self._append_in(conn, session_id, batch, texts)
        return seqs, _moved(info, len(texts), pending, batch.now if touch else None)

    def _cas_append(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        batch: Append,
        texts: list[str],
        base: SessionInfo,
    ) -> tuple[list[int], SessionInfo] | None:
        """Inside ``conn``'s write transaction: the batch checked on ``base`` and stored if
        the row is still in that state (its generation, next seq, revision and pending calls;
        an access time no earlier, which the check passes with as well): one ``UPDATE`` and
        the insert. The seqs and the state after; None where nothing was written (the row
        is in another state, or the check refused ``base``): the shared path decides on the
        row in the same transaction.

        A replacement takes the newest message first (``DELETE ... RETURNING``: the pending
        calls after it follow from the record, so the ``UPDATE`` sets them too); where the
        row then proves to be in another state, or the message or the check refuses,
        :class:`_Stale` rolls the transaction back.
        """
        n = len(texts)
        info = base
        taken = 0
        if batch.replaces is not None or batch.replaces_id is not None:  # (batch.replacing)
            newest = conn.execute(SQLITE.take_newest, (session_id,)).fetchone()
            if newest is None:
                raise _Stale
            record = load_record(session_id, *newest)
            if not batch.takes(newest[0], record):
                raise _Stale
            taken = 1
            info = info_with(
                base,
                {
                    "message_count": base.message_count - 1,
                    "revision": base.revision + 1,
                    "pending": pending_after_pop(base.pending, record),
                },
            )
        try:
            pending = batch.check(info)
        except Exception:  # a guess refused it: the shared path checks the row itself
            if taken:
                raise _Stale from None
            return None
        now = batch.now
        touch = now - base.accessed_at >= batch.touch_after  # (batch.touches, inline)
        moves = pending != base.pending
        # (a take-back alone moves no next_seq: its update leaves the column out)
        params: tuple[Any, ...] = (n, n - taken, taken) if n else (taken, taken)
        if moves:
            params += (_pending_text(pending),)
        if touch:
            params += (now,)
        params += (
            session_id,
            base.generation,
            base.next_seq,
            base.revision,
            _pending_text(base.pending),
            base.accessed_at,
        )
        if touch:
            params += (now, batch.touch_after)
        if conn.execute(_CAS_SQL[n > 0, moves, touch], params).rowcount != 1:
            if taken:
                raise _Stale
            return None
        first = base.next_seq
        if n == 1:
            record = batch.records[0]
            conn.execute(
                SQLITE.insert, (session_id, first, texts[0], record["role"], record.get("id"))
            )
        elif n:
            conn.executemany(
                SQLITE.insert,
                [
                    (session_id, first + i, t, r["role"], r.get("id"))
                    for i, (t, r) in enumerate(zip(texts, batch.records, strict=True))
                ],
            )
        # The state after (as _moved makes it, without a call more).
        after = {"next_seq": first + n, "message_count": info.message_count + n, "pending": pending}
        if touch and now > info.accessed_at:
            after["accessed_at"] = now
        return list(range(first, first + n)), info_with(info, after)

    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """Read (and touch) a session row; its state is known from then on."""
        found = super().info(session_id, touch=touch, ttl=ttl)
        if found is not None:
            self._known.put(found)
        return found

    def pop_newest(self, session_id: str, generation: str) -> tuple[int, dict[str, Any]] | None:
        """Delete the newest row and update the session, in one write transaction."""
        self._known.forget(session_id)
        return super().pop_newest(session_id, generation)

    def snapshot(self, doing: str) -> AbstractContextManager[sqlite3.Connection]:
        """A deferred transaction: its first read fixes the WAL snapshot it sees."""
        return self.client.tx(doing, immediate=False)


def _cas_sql(appends: bool, moves_pending: bool, touches: bool) -> str:
    """The compare-and-set ``UPDATE`` of :meth:`SQLiteBackend._cas_append`: the counters moved
    (parameters: the messages appended, those added to the count, those taken back; where
    nothing is appended, a take-back alone, those taken back twice: the count and the
    revision, next_seq left out of the ``SET``: 58 VM steps a pop, 54), the pending calls set
    where they change and the access time where it moves, on the row only if it is in the
    state known (its id, generation, next seq, revision, pending calls; an access time no
    earlier and, where it moves, past the touch resolution: as in the shared path, the
    ``accessed_at`` index is left alone otherwise, and a row touched since is in another
    state).
    """
    sets = (
        "next_seq = next_seq + ?, message_count = message_count + ?, revision = revision + ?"
        if appends
        else "message_count = message_count - ?, revision = revision + ?"
    )
    where = (
        "session_id = ? AND generation = ? AND next_seq = ? AND revision = ? "
        "AND pending = ? AND accessed_at >= ?"
    )
    if moves_pending:
        sets += ", pending = ?"
    if touches:
        sets += ", accessed_at = max(accessed_at, ?)"
        where += " AND ? - accessed_at >= ?"
    return f"UPDATE ctxkeep_sessions SET {sets} WHERE {where}"


_CAS_SQL = {
    (a, p, t): _cas_sql(a, p, t)
    for a in (False, True)
    for p in (False, True)
    for t in (False, True)
}
""":func:`_cas_sql` of each case, made once (not formatted on each append)."""


def _pending_text(pending: tuple[str, ...]) -> str:
    """The stored JSON of ``pending`` (``dumps``; none waiting, the common case, without it)."""
    return dumps(list(pending)) if pending else "[]"


class _Stale(Exception):
    """A compare-and-set append wrote before it found the row in another state than the one
    known (or its check refused that state): its transaction is rolled back.
    """


def _moved(
    info: SessionInfo, n: int, pending: tuple[str, ...], touched: float | None
) -> SessionInfo:
    """The session of ``info`` after ``n`` messages were appended, leaving ``pending`` waiting
    (and ``accessed_at`` moved to ``touched``, if given and later).
    """
    changes: dict[str, Any] = {
        "next_seq": info.next_seq + n,
        "message_count": info.message_count + n,
        "pending": pending,
    }
    if touched is not None and touched > info.accessed_at:
        changes["accessed_at"] = touched
    return info_with(info, changes)

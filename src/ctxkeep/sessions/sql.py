"""The session primitives over SQL, written once for SQLite and PostgreSQL.

:class:`SQLBackend` implements every :class:`~ctxkeep.sessions.base.Backend` primitive with
the same statements on both engines; a subclass supplies the engine client (``ctxkeep._sqlite``
or ``ctxkeep._pg``: connections, transactions, driver-error translation, schema migrations) and
the few words the dialects spell differently (:class:`Dialect`). SQL here is written with ``?``
placeholders; PostgreSQL's ``%s`` are substituted once per statement.

Tables (created by each backend's migrations): ``ctxkeep_sessions`` (one row per session),
``ctxkeep_messages`` (``session_id, seq, record``: a message's JSON text, never rewritten, and
``role``, indexed, so that :meth:`SQLBackend.read_tail` reads the newest messages and the older
system ones without parsing the rest (on SQLite the index holds only the rows of
:data:`MARK_ROLES`: migration 9); ``message_id``, unique per session, for idempotent
appends; on SQLite a rowid table whose key, ``seq_key``, is the session's number (a column
of its row, ``session_no``) times :data:`SEQ_SPAN` plus the seq: a session's messages are
one run of the table's keys, read and deleted by key ranges (:meth:`SQLBackend._span`), with
no index of ``(session_id, seq)`` to write beside them: migration 10) and
``ctxkeep_archive`` (trimmed and evicted messages, once per message id) and ``ctxkeep_folds``
(``session_id, fold_key, body``: a cache-stable pruner's fold snapshot per setting, deleted
with the session; :mod:`ctxkeep.prune.snapshots`).

An append is one write transaction: the session row's counters are moved and the row read
back (and locked, where the engine locks rows) by one ``UPDATE ... RETURNING``, the
manager's tool-call check runs on the state before it, the messages are inserted under the
next sequence numbers, and the row is updated again only where its pending calls or access
time change; concurrent writers queue, so sequence numbers stay gapless. Ids the manager
made for the append (:attr:`~ctxkeep.sessions.records.Append.fresh_ids`) are not looked up:
none can be stored. (PostgreSQL appends new messages with one statement instead: see
:mod:`ctxkeep.sessions.postgres`.) A read of a session and its messages is one snapshot
transaction.
A trim is one write transaction too: the messages up to the cut are copied into the archive (in
seq order) and deleted under the session row's lock (:meth:`SQLBackend.remove_oldest`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from ctxkeep._db import Database, executemany, placeholders
from ctxkeep.errors import SessionChangedError, SessionExistsError, SessionNotFoundError
from ctxkeep.messages import Message
from ctxkeep.sessions.base import (
    Backend,
    Evicted,
    EvictReason,
    KnownStates,
    Row,
    Snapshot,
    Stored,
    Tail,
)
from ctxkeep.sessions.records import (
    Append,
    SessionInfo,
    corrupt_session,
    dumps,
    dumps_record,
    load_record,
    loads,
    pending_after_pop,
    record_to_message,
    settle_ids,
)

_NO_SEQ = 2**62  # above every sequence number
_IDS_PER_STATEMENT = 500  # well under SQLite's 32,766 parameters a statement

MARK_ROLES = ("developer", "system", "user")
"""The roles :meth:`SQLBackend.read_tail` finds older messages of by an index: those a prompt
keeps from before its page (:data:`~ctxkeep.messages.SYSTEM_ROLES` and the newest ``user``
message, :meth:`~ctxkeep.sessions.base.MemoryManager._tail`). On SQLite the index holds only
these rows and those of no role (migration 9): an agent's history is mostly ``assistant`` and
``tool`` messages, whose appends and pops then write one index page fewer. A query by another
role reads the session's messages by seq instead. (Fixed by the migration: changing it takes
another.)"""

_MARKS_WHERE = " OR ".join(["role IS NULL", *(f"role = '{r}'" for r in MARK_ROLES)])
"""The rows SQLite's role index holds, spelled so that a query's ``role = '<a mark role>'``
or ``role IS NULL`` is seen to imply it (SQLite proves a partial index usable term by term)."""

COLUMNS = (
    "session_id, agent_id, task_id, metadata, created_at, accessed_at, message_count, "
    "next_seq, pending, generation, first_seq, revision"
)
_WIDTH = COLUMNS.count(",") + 1

NEWER_SQL = (
    "SELECT "
    + ", ".join(f"s.{c}" for c in COLUMNS.split(", "))
    + ", m.seq, m.record FROM ctxkeep_sessions s LEFT JOIN ctxkeep_messages m "
    "ON m.session_id = s.session_id AND m.seq > ? WHERE s.session_id = ? ORDER BY m.seq"
)
"""The session's row and its messages after a seq in one statement, which sees one snapshot by
itself (parameters: the seq, the session id): the row's columns, then each message's seq and
record (``NULL`` for both when there is none). (SQLite's is :data:`SQLITE`'s ``newer``.)"""

INSERT_SQL = (
    "INSERT INTO ctxkeep_messages (session_id, seq, record, role, message_id) "
    "VALUES (?, ?, ?, ?, ?)"
)
"""An append's insert of its messages (parameters per message: the session id, the seq, the
record's JSON, the role and the id). (SQLite's is :data:`SQLITE`'s ``insert``.)"""

TAKE_NEWEST_SQL = (
    "DELETE FROM ctxkeep_messages WHERE (session_id, seq) = (SELECT session_id, seq "
    "FROM ctxkeep_messages WHERE session_id = ? ORDER BY seq DESC LIMIT 1) RETURNING seq, record"
)
"""Take the session's newest message and read it back (parameter: the session id). (SQLite's
is :data:`SQLITE`'s ``take_newest``.)"""

SEQ_SPAN = 2**32
"""On SQLite a message's key is its session's number times this plus its seq (migration 10):
each session's messages are one run of the table's keys, in seq order. Seqs stay below it (a
``CHECK``: 4 billion appends to one session), session numbers below :data:`_MAX_SESSION_NO`,
so that every key and every bound fits SQLite's 64-bit integers."""

_MAX_SESSION_NO = 2**31 - 2

_SQLITE_NEXT_NO = (
    f"(SELECT CASE WHEN n < {_MAX_SESSION_NO} THEN n + 1 ELSE"
    " (SELECT min(session_no) + 1 FROM ctxkeep_sessions a WHERE NOT EXISTS"
    " (SELECT 1 FROM ctxkeep_sessions b WHERE b.session_no = a.session_no + 1)) END"
    " FROM (SELECT coalesce(max(session_no), 0) AS n FROM ctxkeep_sessions))"
)
"""A new session's number: one above the highest (by its unique index), or, once that reaches
:data:`_MAX_SESSION_NO`, one above a number whose successor is free (a scan, once in two
billion sessions)."""


@dataclass(frozen=True, kw_only=True)
class Dialect:
    """The words SQLite and PostgreSQL spell differently."""

    param: str
    """The placeholder: ``?`` or ``%s``."""
    greatest: str
    """The two-argument maximum: ``max`` or ``GREATEST``."""
    for_update: str
    """Row locking for a read inside a write transaction (SQLite locks the whole file)."""
    archive_order: str
    """The column that orders the archive by insertion."""
    real: str
    """The type of Unix times."""
    bigint: str
    """The type of sequence numbers."""
    messages_session: str
    """What follows ``session_id TEXT NOT NULL`` in ``ctxkeep_messages`` (a foreign key)."""
    messages_options: str
    """Table options of ``ctxkeep_messages`` and ``ctxkeep_folds`` as first created (SQLite's
    messages are rebuilt without them by migration 8)."""
    archive_id: str
    """The archive's insertion-order column, if the engine has no implicit one."""
    archived_at: str
    """The archive's timestamp column."""
    random_hex: str
    """A random hex text per row (a generation for sessions stored before generations)."""
    by_role: str
    """What makes a query by role use the ``(session_id, role, seq)`` index (SQLite's planner,
    without statistics, prefers the primary key's range on ``seq``)."""
    id_backfill: str
    """Fill ``ctxkeep_messages.message_id`` from the records stored before it existed (NULL
    where a record cannot be read; duplicates are cleared after it, see :func:`migrations`)."""
    role_backfill: str
    """Fill ``ctxkeep_messages.role`` from the records stored before it existed (NULL where a
    record cannot be read: such rows are read as if of any role)."""
    drop_messages_key: str
    """Drop ``ctxkeep_messages``' foreign key to ``ctxkeep_sessions`` (migration 7; nothing
    where there is none)."""
    rowid_messages: str
    """Rebuild ``ctxkeep_messages`` as a table of rows with its key in an index of its own
    (migration 8; nothing where it is one already: PostgreSQL's heap)."""
    marks_index: str
    """Narrow the ``(session_id, role, seq)`` index to the rows of :data:`MARK_ROLES` and
    those of no role (migration 9; nothing on PostgreSQL, whose index keeps every row)."""
    keyed_messages: str
    """Key ``ctxkeep_messages`` by each session's number and the seq (migration 10; nothing
    on PostgreSQL): see :data:`SEQ_SPAN`."""
    session_no: str
    """What follows the session row's columns where it is read or made: ``, session_no`` on
    SQLite (its messages' keys are reckoned from it), nothing on PostgreSQL."""
    new_session_no: str
    """The value of :attr:`session_no` in a new session row's ``VALUES``."""
    newer: str
    """:data:`NEWER_SQL` in this dialect."""
    insert: str
    """:data:`INSERT_SQL` in this dialect (the same parameters)."""
    take_newest: str
    """:data:`TAKE_NEWEST_SQL` in this dialect (the same parameters)."""
    seq_order: str
    """What orders a session's messages by seq in a query that reads them by
    :meth:`SQLBackend._span`: their key on SQLite (its rows come in that order: no sort)."""


SQLITE = Dialect(
    param="?",
    greatest="max",
    for_update="",
    archive_order="rowid",
    real="REAL",
    bigint="INTEGER",
    messages_session="",
    messages_options=" WITHOUT ROWID",
    archive_id="",
    archived_at="REAL NOT NULL DEFAULT (julianday('now'))",
    random_hex="lower(hex(randomblob(16)))",
    by_role=" INDEXED BY ctxkeep_messages_role",
    role_backfill=(
        "UPDATE ctxkeep_messages SET role = CASE WHEN json_valid(record) THEN"
        " CASE WHEN json_type(record, '$.role') = 'text' THEN json_extract(record, '$.role')"
        " END END"
    ),
    id_backfill=(
        "UPDATE ctxkeep_messages SET message_id = CASE WHEN json_valid(record) THEN"
        " CASE WHEN json_type(record, '$.id') = 'text' THEN json_extract(record, '$.id')"
        " END END"
    ),
    drop_messages_key="",
    rowid_messages="""
        CREATE TABLE ctxkeep_messages_rowid (
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            record TEXT NOT NULL,
            role TEXT,
            message_id TEXT,
            PRIMARY KEY (session_id, seq)
        );
        INSERT INTO ctxkeep_messages_rowid (session_id, seq, record, role, message_id)
            SELECT session_id, seq, record, role, message_id FROM ctxkeep_messages
            ORDER BY session_id, seq;
        DROP TABLE ctxkeep_messages;
        ALTER TABLE ctxkeep_messages_rowid RENAME TO ctxkeep_messages;
        CREATE INDEX ctxkeep_messages_role ON ctxkeep_messages (session_id, role, seq);
        CREATE UNIQUE INDEX ctxkeep_messages_id ON ctxkeep_messages (session_id, message_id);
    """,
    marks_index=f"""
        DROP INDEX IF EXISTS ctxkeep_messages_role;
        CREATE INDEX ctxkeep_messages_role ON ctxkeep_messages (session_id, role, seq)
            WHERE {_MARKS_WHERE};
    """,
    # Sessions numbered in their rows' order (UPDATE ... FROM: one numbering pass); a message
    # whose session has no row (none is made: a session's delete takes its messages in the
    # same transaction, and no read could find one) is not carried over.
    keyed_messages=f"""
        ALTER TABLE ctxkeep_sessions ADD COLUMN session_no INTEGER;
        UPDATE ctxkeep_sessions SET session_no = numbered.n FROM (
            SELECT rowid AS r, ROW_NUMBER() OVER (ORDER BY rowid) AS n FROM ctxkeep_sessions
        ) AS numbered WHERE ctxkeep_sessions.rowid = numbered.r;
        CREATE UNIQUE INDEX ctxkeep_sessions_no ON ctxkeep_sessions (session_no);
        CREATE TABLE ctxkeep_messages_keyed (
            seq_key INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq BETWEEN 1 AND {SEQ_SPAN - 1}),
            record TEXT NOT NULL,
            role TEXT,
            message_id TEXT
        );
        INSERT INTO ctxkeep_messages_keyed (seq_key, session_id, seq, record, role, message_id)
            SELECT s.session_no * {SEQ_SPAN} + m.seq, m.session_id, m.seq, m.record, m.role,
                m.message_id
            FROM ctxkeep_messages m JOIN ctxkeep_sessions s ON s.session_id = m.session_id
            ORDER BY 1;
        DROP TABLE ctxkeep_messages;
        ALTER TABLE ctxkeep_messages_keyed RENAME TO ctxkeep_messages;
        CREATE INDEX ctxkeep_messages_role ON ctxkeep_messages (session_id, role, seq)
            WHERE {_MARKS_WHERE};
        CREATE UNIQUE INDEX ctxkeep_messages_id ON ctxkeep_messages (session_id, message_id);
    """,
    session_no=", session_no",
    new_session_no=f", {_SQLITE_NEXT_NO}",
    newer=(
        "SELECT "
        + ", ".join(f"s.{c}" for c in COLUMNS.split(", "))
        + ", m.seq, m.record FROM ctxkeep_sessions s LEFT JOIN ctxkeep_messages m "
        f"ON m.seq_key > s.session_no * {SEQ_SPAN} + min(?, {SEQ_SPAN - 1}) "
        f"AND m.seq_key < (s.session_no + 1) * {SEQ_SPAN} WHERE s.session_id = ? "
        "ORDER BY m.seq_key"
    ),
    # Numbered parameters: the same five as INSERT_SQL's, the session id and seq used twice.
    insert=(
        "INSERT INTO ctxkeep_messages (seq_key, session_id, seq, record, role, message_id) "
        f"SELECT session_no * {SEQ_SPAN} + ?2, ?1, ?2, ?3, ?4, ?5 FROM ctxkeep_sessions "
        "WHERE session_id = ?1"
    ),
    # The session's row read once, then its newest key (CROSS JOIN: in that order): a
    # subquery for each bound of the key range read the row twice (94 VM steps a pop of the
    # bench's 10,000-item Agents SDK session, 75 now; 16.9 against 14.9 us of thread CPU
    # for the statement, medians of 300, on a copy of that file).
    take_newest=(
        "DELETE FROM ctxkeep_messages WHERE seq_key = (SELECT m.seq_key FROM ctxkeep_sessions s"
        f" CROSS JOIN ctxkeep_messages m WHERE s.session_id = ? AND m.seq_key > s.session_no *"
        f" {SEQ_SPAN} AND m.seq_key < (s.session_no + 1) * {SEQ_SPAN} ORDER BY m.seq_key DESC"
        " LIMIT 1) RETURNING seq, record"
    ),
    seq_order="seq_key",
)

POSTGRES = Dialect(
    param="%s",
    greatest="GREATEST",
    for_update=" FOR UPDATE",
    archive_order="id",
    real="DOUBLE PRECISION",
    bigint="BIGINT",
    messages_session=" REFERENCES ctxkeep_sessions ON DELETE CASCADE",
    messages_options="",
    archive_id="id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, ",
    archived_at="TIMESTAMPTZ NOT NULL DEFAULT now()",
    random_hex="md5(random()::text || session_id)",
    by_role="",
    # All or nothing: one unreadable record leaves every role NULL (read as any role).
    role_backfill=(
        "DO $$ BEGIN UPDATE ctxkeep_messages SET role = record::jsonb ->> 'role'; "
        "EXCEPTION WHEN others THEN NULL; END $$"
    ),
    id_backfill=(
        "DO $$ BEGIN UPDATE ctxkeep_messages SET message_id = record::jsonb ->> 'id'; "
        "EXCEPTION WHEN others THEN NULL; END $$"
    ),
    drop_messages_key=(
        "ALTER TABLE ctxkeep_messages DROP CONSTRAINT IF EXISTS ctxkeep_messages_session_id_fkey"
    ),
    rowid_messages="",
    marks_index="",
    keyed_messages="",
    session_no="",
    new_session_no="",
    newer=NEWER_SQL,
    insert=INSERT_SQL,
    take_newest=TAKE_NEWEST_SQL,
    seq_order="seq",
)


def migrations(d: Dialect) -> list[str]:
    """The session tables' migrations in ``d``: position ``i`` brings version ``i`` to
    ``i + 1``.
    """
    return [
        f"""
        CREATE TABLE IF NOT EXISTS ctxkeep_sessions (
            session_id TEXT PRIMARY KEY,
            agent_id TEXT NOT NULL,
            task_id TEXT,
            metadata TEXT NOT NULL,
            created_at {d.real} NOT NULL,
            accessed_at {d.real} NOT NULL,
            message_count INTEGER NOT NULL DEFAULT 0,
            next_seq {d.bigint} NOT NULL DEFAULT 1,
            pending TEXT NOT NULL DEFAULT '[]'
        );
        CREATE INDEX IF NOT EXISTS ctxkeep_sessions_agent
            ON ctxkeep_sessions (agent_id, created_at);
        CREATE INDEX IF NOT EXISTS ctxkeep_sessions_task ON ctxkeep_sessions (task_id, created_at);
        CREATE INDEX IF NOT EXISTS ctxkeep_sessions_created ON ctxkeep_sessions (created_at);
        CREATE INDEX IF NOT EXISTS ctxkeep_sessions_accessed ON ctxkeep_sessions (accessed_at);
        CREATE TABLE IF NOT EXISTS ctxkeep_messages (
            session_id TEXT NOT NULL{d.messages_session},
            seq {d.bigint} NOT NULL,
            record TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        ){d.messages_options};
        CREATE TABLE IF NOT EXISTS ctxkeep_archive (
            {d.archive_id}session_id TEXT NOT NULL,
            message_id TEXT NOT NULL,
            agent_id TEXT NOT NULL,
            reason TEXT NOT NULL,
            record TEXT NOT NULL,
            archived_at {d.archived_at},
            UNIQUE (session_id, message_id)
        );
        """,
        # 2: session identity (a generation per creation) and the oldest seq held.
        f"""
        ALTER TABLE ctxkeep_sessions ADD COLUMN generation TEXT NOT NULL DEFAULT '';
        ALTER TABLE ctxkeep_sessions ADD COLUMN first_seq {d.bigint} NOT NULL DEFAULT 1;
        UPDATE ctxkeep_sessions SET generation = {d.random_hex},
            first_seq = coalesce(
                (SELECT min(seq) FROM ctxkeep_messages m
                 WHERE m.session_id = ctxkeep_sessions.session_id),
                next_seq);
        """,
        # 3: messages taken back from the end (pop) are part of a session's identity.
        f"ALTER TABLE ctxkeep_sessions ADD COLUMN revision {d.bigint} NOT NULL DEFAULT 0",
        # 4: each message's role beside its record, indexed, so that a prompt can read the
        # newest messages and the older system ones without decoding every record.
        f"""
        ALTER TABLE ctxkeep_messages ADD COLUMN role TEXT;
        {d.role_backfill};
        CREATE INDEX IF NOT EXISTS ctxkeep_messages_role
            ON ctxkeep_messages (session_id, role, seq);
        """,
        # 5: each session's fold snapshots, one per pruner setting (ctxkeep.prune.snapshots).
        f"""
        CREATE TABLE IF NOT EXISTS ctxkeep_folds (
            session_id TEXT NOT NULL{d.messages_session},
            fold_key TEXT NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (session_id, fold_key)
        ){d.messages_options}
        """,
        # 6: each message's id beside its record, unique per session, so that an append is
        # idempotent by id (a retry finds its messages; two concurrent ones cannot both
        # insert). Sessions written before may hold an id twice (a retried append): the
        # oldest keeps it, the later copies none (NULLs never collide). The copies are found
        # by one numbering pass (a correlated EXISTS before the index exists is quadratic per
        # session: a 20,000-message SQLite file took minutes).
        f"""
        ALTER TABLE ctxkeep_messages ADD COLUMN message_id TEXT;
        {d.id_backfill};
        UPDATE ctxkeep_messages SET message_id = NULL WHERE (session_id, seq) IN (
            SELECT session_id, seq FROM (
                SELECT session_id, seq, ROW_NUMBER() OVER (
                    PARTITION BY session_id, message_id ORDER BY seq) AS copy
                FROM ctxkeep_messages WHERE message_id IS NOT NULL) AS numbered
            WHERE copy > 1);
        CREATE UNIQUE INDEX IF NOT EXISTS ctxkeep_messages_id
            ON ctxkeep_messages (session_id, message_id);
        """,
        # 7: no foreign key from a message to its session (PostgreSQL's; SQLite's tables
        # have none). Every statement that inserts a message holds the session row's lock
        # (the append's UPDATE, or its SELECT ... FOR UPDATE) and a session's delete removes
        # its messages in its own transaction under that lock, so the key guarded nothing;
        # its check, an after-trigger that looked the row up and locked it again, was 65 of
        # the 170 us the server spent on a one-message append. (A fold snapshot keeps its
        # key: put_fold takes no lock, and the key is what stops one outliving its session.)
        d.drop_messages_key,
        # 8: SQLite's messages in a rowid table, their (session_id, seq) key in an index
        # beside it, instead of a WITHOUT ROWID table (which SQLite advises for rows under
        # about a twentieth of a page; a record of a tool output runs to kilobytes). A WITHOUT
        # ROWID leaf keeps at most about 1 kB of a row, the rest in overflow pages of its own,
        # and splits where a rowid table's last leaf just fills: a one-message append of the
        # demo's items wrote 4.3 pages of the table, now 1.7 (8.9 -> 7.3 WAL pages in all; CPU
        # within the noise); a pop writes one page more (the key's index): 4 -> 5.
        d.rowid_messages,
        # 9: SQLite's role index holds only the rows read by role (MARK_ROLES, and those of
        # no role): an append or pop of an assistant or tool message wrote a page of it that
        # no read needed, one of the 5 WAL pages a one-message pop of one wrote (4 now).
        d.marks_index,
        # 10: SQLite's messages keyed by their session's number and seq (SEQ_SPAN), the
        # table's own key (its rowid), where schema 8 kept the (session_id, seq) key in an
        # index beside the rows: every append and pop wrote a page of that index as well as
        # the table's (a pop of a 1,000-item Agents SDK session wrote 5 WAL pages, 4 now),
        # and a session's messages lie together in key order as they did in it.
        d.keyed_messages,
    ]


def row_to_info(
    row: Sequence[Any], *, less_seq: int = 0, less_count: int = 0, less_revision: int = 0
) -> SessionInfo:
    """The session a ``SELECT {COLUMNS}`` row describes; with the ``less_*`` deltas, the
    session before an ``UPDATE ... RETURNING`` that moved those counters by them (one
    ``SessionInfo`` built, not one and then a ``dataclasses.replace`` of it: some 5 us an
    append).

    Raises:
        CorruptRecordError: metadata or pending calls that are not JSON.

    """
    try:
        metadata, pending = loads(row[3]), tuple(loads(row[8]))
    except (ValueError, TypeError, RecursionError) as exc:
        raise corrupt_session(row[0], f"{type(exc).__name__}: {exc}") from None
    return SessionInfo(
        session_id=row[0],
        agent_id=row[1],
        task_id=row[2],
        metadata=metadata,
        created_at=row[4],
        accessed_at=row[5],
        message_count=row[6] - less_count,
        next_seq=row[7] - less_seq,
        pending=pending,
        generation=row[9],
        first_seq=row[10],
        revision=row[11] - less_revision,
    )


class SQLBackend(Backend):
    """Sessions in SQL tables; see the module docstring. Subclasses set :attr:`db`,
    :attr:`dialect` and :attr:`_known` and implement :meth:`snapshot`.
    """

    db: Database
    dialect: Dialect
    _known: KnownStates
    """The state of each session this process last saw, what its compare-and-set appends
    check on; :meth:`delete` forgets a session's."""
    supports_folds = True

    def _sql(self, text: str) -> str:
        return placeholders(text, self.dialect.param)

    def _q(self, doing: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        return self.db.q(doing, self._sql(sql), params)

    def snapshot(self, doing: str) -> AbstractContextManager[Any]:
        """A connection inside a read transaction that sees one instant of the database."""
        raise NotImplementedError

    def _no(self, row: Sequence[Any], at: int = _WIDTH) -> int | None:
        """The session's number in ``row`` (at ``at``, where :attr:`Dialect.session_no`
        put it), or None where the dialect keeps none.
        """
        return row[at] if self.dialect.session_no else None

    def _span(
        self,
        session_id: str,
        no: int | None,
        *,
        above: int | None = None,
        below: int | None = None,
    ) -> tuple[str, tuple[Any, ...]]:
        """The condition on ``ctxkeep_messages`` that holds the session's messages with
        ``above < seq < below`` (either bound left out: none), and its parameters: by
        ``(session_id, seq)``, or where the session has a number ``no`` (SQLite), a range
        of the table's key (:data:`SEQ_SPAN`), in :attr:`Dialect.seq_order`.
        """
        if no is None:
            where = "session_id = ?"
            params: list[Any] = [session_id]
            if above is not None:
                where += " AND seq > ?"
                params.append(above)
            if below is not None:
                where += " AND seq < ?"
                params.append(below)
            return where, tuple(params)
        base = no * SEQ_SPAN
        low = 0 if above is None else min(above, SEQ_SPAN)
        high = SEQ_SPAN if below is None else min(below, SEQ_SPAN)
        return "seq_key > ? AND seq_key < ?", (base + low, base + high)

    def _at(
        self, session_id: str, no: int | None, seqs: Sequence[int]
    ) -> tuple[str, tuple[Any, ...]]:
        """:meth:`_span`'s condition for the session's messages at ``seqs`` (a few)."""
        marks = ", ".join("?" for _ in seqs)
        if no is None:
            return f"session_id = ? AND seq IN ({marks})", (session_id, *seqs)
        return f"seq_key IN ({marks})", tuple(no * SEQ_SPAN + s for s in seqs)

    def close(self) -> None:
        """Close the engine's connections."""
        self.db.close()

    # -- primitives --------------------------------------------------------------------

    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Insert the session row; an id in use is a SessionExistsError."""
        with self.db.tx("create a session") as conn:
            if not self._insert_session(conn, info):
                raise SessionExistsError(info.session_id)

    def _insert_session(self, conn: Any, info: SessionInfo) -> bool:
        """Inside ``conn``'s write transaction: insert the row of the new session ``info``;
        False where the id is in use (nothing written).
        """
        cur = conn.execute(
            self._sql(
                f"INSERT INTO ctxkeep_sessions ({COLUMNS}{self.dialect.session_no}) "
                f"VALUES (?, ?, ?, ?, ?, ?, 0, 1, '[]', ?, 1, 0{self.dialect.new_session_no}) "
                "ON CONFLICT (session_id) DO NOTHING"
            ),
            (
                info.session_id,
                info.agent_id,
                info.task_id,
                dumps(info.metadata),
                info.created_at,
                info.accessed_at,
                info.generation,
            ),
        )
        return bool(cur.rowcount)

    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """Read (and touch) a session row."""
        if touch is None:
            rows = self._q(
                "read a session",
                f"SELECT {COLUMNS} FROM ctxkeep_sessions WHERE session_id = ?",
                (session_id,),
            )
        else:
            rows = self._q(
                "touch a session",
                f"UPDATE ctxkeep_sessions SET accessed_at = {self.dialect.greatest}"
                f"(accessed_at, ?) WHERE session_id = ? RETURNING {COLUMNS}",
                (touch, session_id),
            )
        return row_to_info(rows[0]) if rows else None

    def _session_row(self, conn: Any, session_id: str, *, lock: bool = False) -> Any:
        """The session's row inside ``conn``'s transaction (locked for update if ``lock``),
        or None.
        """
        sql = (
            f"SELECT {COLUMNS}{self.dialect.session_no} FROM ctxkeep_sessions WHERE session_id = ?"
        )
        if lock:
            sql += self.dialect.for_update
        return conn.execute(self._sql(sql), (session_id,)).fetchone()

    def append(self, session_id: str, batch: Append) -> list[int]:
        """One write transaction: the row moved on and read back (locked) by one ``UPDATE
        ... RETURNING``, then the checks, the insert, and a second update only where the
        pending calls or the access time change (a check that raises rolls all back).
        """
        texts = batch.encoded()
        with self.db.tx("append") as conn:
            return self._append_in(conn, session_id, batch, texts)[0]

    def _append_in(
        self, conn: Any, session_id: str, batch: Append, texts: list[str]
    ) -> tuple[list[int], SessionInfo, tuple[str, ...], bool]:
        """:meth:`append` inside ``conn``'s write transaction; the seqs given, the session
        as the check saw it (after the newest message was taken, when replacing), the
        pending calls after the append and whether ``accessed_at`` moved to ``batch.now``.
        """
        n, taken = len(texts), int(batch.replacing)
        # The counters move first: the row's state before the append is the one read
        # back less the deltas (one statement where a read and an update were two).
        row = conn.execute(
            self._sql(
                "UPDATE ctxkeep_sessions SET next_seq = next_seq + ?, "
                "message_count = message_count + ?, revision = revision + ? "
                f"WHERE session_id = ? RETURNING {COLUMNS}"
            ),
            (n, n - taken, taken, session_id),
        ).fetchone()
        if row is None:
            raise SessionNotFoundError(f"no session {session_id!r}")
        info = row_to_info(row, less_seq=n, less_count=n - taken, less_revision=taken)
        stored_pending = info.pending  # (the UPDATE leaves pending as it was)
        if batch.replacing:
            info = self._take_newest(conn, info, batch)
        if not batch.fresh_ids:  # (ids made for this append cannot be stored)
            settle_ids(session_id, batch.records, self._rows_with_ids(conn, session_id, batch))
        pending = batch.check(info)
        seqs = list(range(info.next_seq, info.next_seq + n))
        if texts:  # (a pop: nothing takes the newest message's place)
            executemany(
                conn,
                self._sql(self.dialect.insert),
                [
                    (session_id, s, t, r["role"], r.get("id"))
                    for s, t, r in zip(seqs, texts, batch.records, strict=True)
                ],
            )
        # accessed_at only where it moves past the touch resolution: else the statement
        # leaves its index alone (SQLite rewrites an index whose column is SET at all).
        touch = batch.touches(info.accessed_at)
        if touch or pending != stored_pending:
            conn.execute(
                self._sql(
                    "UPDATE ctxkeep_sessions SET pending = ?"
                    + (f", accessed_at = {self.dialect.greatest}(accessed_at, ?)" if touch else "")
                    + " WHERE session_id = ?"
                ),
                (dumps(list(pending)), *((batch.now,) if touch else ()), session_id),
            )
        return seqs, info, pending, touch

    def _rows_with_ids(self, conn: Any, session_id: str, batch: Append) -> list[Row]:
        """The session's messages under the batch's ids, inside ``conn``'s transaction (by
        the ``(session_id, message_id)`` index, some hundred ids a statement).
        """
        ids = batch.message_ids
        out: list[Row] = []
        for start in range(0, len(ids), _IDS_PER_STATEMENT):
            chunk = ids[start : start + _IDS_PER_STATEMENT]
            marks = ", ".join("?" * len(chunk))
            rows = conn.execute(
                self._sql(
                    "SELECT seq, record FROM ctxkeep_messages"
                    f" WHERE session_id = ? AND message_id IN ({marks})"
                ),
                (session_id, *chunk),
            ).fetchall()
            out += [(seq, load_record(session_id, seq, text)) for seq, text in rows]
        return out

    def _take_newest(self, conn: Any, info: SessionInfo, batch: Append) -> SessionInfo:
        """Inside an append's transaction: delete the newest message, which must be the one
        ``batch`` replaces (:meth:`Append.takes`); the session as it is without it.
        """
        # Taken and read back in one statement; one that is not the batch's to replace is
        # put back by the transaction's rollback (the SessionChangedError ends it).
        newest = conn.execute(self._sql(self.dialect.take_newest), (info.session_id,)).fetchone()
        if newest is None:
            raise SessionChangedError(info.session_id)
        record = load_record(info.session_id, *newest)
        if not batch.takes(newest[0], record):
            raise SessionChangedError(info.session_id)
        return replace(
            info,
            message_count=info.message_count - 1,
            pending=pending_after_pop(info.pending, record),
            revision=info.revision + 1,
        )

    def read(self, session_id: str, after_seq: int = 0) -> Snapshot | None:
        """The row and the messages after ``after_seq``, in one snapshot."""
        snap = self._texts(session_id, after_seq)
        if snap is None:
            return None
        return snap[0], [(seq, load_record(session_id, seq, rec)) for seq, rec in snap[1]]

    def read_stored(
        self, session_id: str, after_seq: int = 0
    ) -> tuple[SessionInfo, list[Stored]] | None:
        """The row and the records' texts after ``after_seq``, in one snapshot."""
        return self._texts(session_id, after_seq)

    def _texts(self, session_id: str, after_seq: int) -> tuple[SessionInfo, list[Any]] | None:
        """The row and the records' texts after ``after_seq``. Above 0 (a reader that holds the
        older ones: a prompt's cached tail) in one statement (:data:`NEWER_SQL`): a read
        transaction was four statements in three round trips on PostgreSQL, the row repeated
        on each of the few newer messages costs less; a whole read keeps the transaction.
        """
        if after_seq > 0:
            found = self._q("read a session", self.dialect.newer, (after_seq, session_id))
            if not found:
                return None
            tail = [(r[_WIDTH], r[_WIDTH + 1]) for r in found if r[_WIDTH] is not None]
            return row_to_info(found[0][:_WIDTH]), tail
        with self.snapshot("read a session") as conn:
            row = self._session_row(conn, session_id)
            if row is None:
                return None
            where, params = self._span(session_id, self._no(row), above=after_seq)
            rows = conn.execute(
                self._sql(
                    f"SELECT seq, record FROM ctxkeep_messages WHERE {where} "
                    f"ORDER BY {self.dialect.seq_order}"
                ),
                params,
            ).fetchall()
        return row_to_info(row), rows

    def read_tail(
        self,
        session_id: str,
        *,
        limit: int | None,
        before_seq: int | None = None,
        roles: Collection[str] = (),
        newest_role: str | None = None,
    ) -> Tail | None:
        """The row, the newest messages below ``before_seq`` and the older marks (by the
        ``role`` column's index), in one snapshot; only those records are parsed.
        """
        before = _NO_SEQ if before_seq is None else before_seq
        with self.snapshot("read a session's newest messages") as conn:
            row = self._session_row(conn, session_id)
            if row is None:
                return None
            no = self._no(row)
            where, params = self._span(session_id, no, below=before)
            order = self.dialect.seq_order
            if limit is None:
                page = conn.execute(
                    self._sql(
                        f"SELECT seq, record FROM ctxkeep_messages WHERE {where} ORDER BY {order}"
                    ),
                    params,
                ).fetchall()
            else:
                page = conn.execute(
                    self._sql(
                        f"SELECT seq, record FROM ctxkeep_messages WHERE {where} "
                        f"ORDER BY {order} DESC LIMIT ?"
                    ),
                    (*params, limit),
                ).fetchall()[::-1]
            marks: list[Any] = []
            if limit is not None and len(page) == limit:
                floor = page[0][0] if page else before
                sql, params = self._marks_sql(session_id, floor, roles, newest_role, no)
                found = conn.execute(self._sql(sql), params)
                marks = sorted(dict(found.fetchall()).items())
        return Tail(
            row_to_info(row),
            [(seq, load_record(session_id, seq, rec)) for seq, rec in page],
            [(seq, load_record(session_id, seq, rec)) for seq, rec in marks],
        )

    def _marks_sql(
        self,
        session_id: str,
        floor: int,
        roles: Collection[str],
        newest_role: str | None,
        no: int | None = None,
    ) -> tuple[str, tuple[Any, ...]]:
        """The statement of :meth:`read_tail`'s marks below ``floor`` and its parameters: the
        messages of no role or of ``roles``, and the newest of ``newest_role``. A role of
        :data:`MARK_ROLES` is written into the statement (so SQLite sees its partial index
        holds the rows: a parameter's value is not looked at) and read by the role index; any
        other role is a parameter, read by the session's messages in seq order (:meth:`_span`;
        ``no``: the session's number, where the dialect keeps one).
        """

        def branch(role: str | None) -> tuple[str, tuple[Any, ...], str]:
            if role is None:
                where, args = "role IS NULL", ()
            elif role in MARK_ROLES:
                where, args = f"role = '{role}'", ()
            else:
                span, args = self._span(session_id, no, below=floor)
                return (
                    f"FROM ctxkeep_messages WHERE {span} AND role = ?",
                    (*args, role),
                    self.dialect.seq_order,
                )
            return (
                f"FROM ctxkeep_messages{self.dialect.by_role} WHERE session_id = ? AND {where}"
                " AND seq < ?",
                (session_id, *args, floor),
                "seq",
            )

        parts: list[str] = []
        params: list[Any] = []
        for role in (None, *sorted(set(roles))):
            source, args, _ = branch(role)
            parts.append(f"SELECT seq, record {source}")
            params += args
        if newest_role is not None:
            source, args, order = branch(newest_role)
            parts.append(
                f"SELECT seq, record FROM (SELECT seq, record {source} "
                f"ORDER BY {order} DESC LIMIT 1) AS newest"
            )
            params += args
        return " UNION ALL ".join(parts), tuple(params)

    def read_rows(
        self, session_id: str, *, seqs: Collection[int], after_seq: int
    ) -> Snapshot | None:
        """The row, the messages above ``after_seq`` and those in ``seqs`` (by the primary
        key), in one snapshot.
        """
        wanted = sorted({s for s in seqs if s <= after_seq})
        with self.snapshot("read a session's messages") as conn:
            row = self._session_row(conn, session_id)
            if row is None:
                return None
            no = self._no(row)
            where, params = self._span(session_id, no, above=after_seq)
            sql = f"SELECT seq, record FROM ctxkeep_messages WHERE {where}"
            if wanted:
                at, more = self._at(session_id, no, wanted)
                sql += f" UNION ALL SELECT seq, record FROM ctxkeep_messages WHERE {at}"
                params += more
            found = conn.execute(self._sql(sql + " ORDER BY seq"), params).fetchall()
        return row_to_info(row), [(seq, load_record(session_id, seq, rec)) for seq, rec in found]

    def get_fold(self, session_id: str, key: str) -> str | None:
        """The snapshot under ``key``."""
        rows = self._q(
            "read a fold snapshot",
            "SELECT body FROM ctxkeep_folds WHERE session_id = ? AND fold_key = ?",
            (session_id, key),
        )
        return str(rows[0][0]) if rows else None

    def put_fold(self, session_id: str, generation: str, key: str, body: str) -> None:
        """Upsert the snapshot, if the session row still has ``generation`` (one statement)."""
        self._q(
            "store a fold snapshot",
            "INSERT INTO ctxkeep_folds (session_id, fold_key, body) SELECT ?, ?, ? "
            "WHERE EXISTS (SELECT 1 FROM ctxkeep_sessions WHERE session_id = ? AND generation = ?) "
            "ON CONFLICT (session_id, fold_key) DO UPDATE SET body = excluded.body RETURNING 1",
            (session_id, key, body, session_id, generation),
        )

    def remove_oldest(
        self, session_id: str, upto_seq: int, generation: str, *, archive: bool = False
    ) -> list[Row]:
        """Archive (with ``archive``) and delete the rows up to ``upto_seq`` and move
        ``first_seq``, in one write transaction that holds the session row's lock: the rows
        moved are the ones still there (another trim's are gone), copied into the archive in
        seq order by one ``INSERT ... SELECT`` (no record crosses the wire to be archived).
        """
        with self.db.tx("trim messages") as conn:
            found = conn.execute(
                self._sql(
                    f"SELECT agent_id{self.dialect.session_no} FROM ctxkeep_sessions "
                    "WHERE session_id = ? AND generation = ?" + self.dialect.for_update
                ),
                (session_id, generation),
            ).fetchone()
            if found is None:
                return []
            no = self._no(found, 1)
            if archive:
                self._archive_rows(conn, session_id, no, found[0], "max_history", upto_seq)
            where, params = self._upto(session_id, no, upto_seq)
            gone = conn.execute(
                self._sql(f"DELETE FROM ctxkeep_messages WHERE {where} RETURNING seq, record"),
                params,
            ).fetchall()
            conn.execute(
                self._sql(
                    "UPDATE ctxkeep_sessions SET message_count = message_count - ?, "
                    f"first_seq = {self.dialect.greatest}(first_seq, ?) WHERE session_id = ?"
                ),
                (len(gone), upto_seq + 1, session_id),
            )
        rows = sorted(gone, key=lambda r: int(r[0]))
        return [(seq, load_record(session_id, seq, rec)) for seq, rec in rows]

    def pop_newest(self, session_id: str, generation: str) -> Row | None:
        """Delete the newest row and update the session, in one write transaction."""
        with self.db.tx("take back a message") as conn:
            row = conn.execute(
                self._sql(
                    f"SELECT {COLUMNS}{self.dialect.session_no} FROM ctxkeep_sessions "
                    "WHERE session_id = ? AND generation = ?" + self.dialect.for_update
                ),
                (session_id, generation),
            ).fetchone()
            if row is None:
                return None
            info = row_to_info(row)
            no = self._no(row)
            where, params = self._span(session_id, no)
            newest = conn.execute(
                self._sql(
                    f"SELECT seq, record FROM ctxkeep_messages WHERE {where} "
                    f"ORDER BY {self.dialect.seq_order} DESC LIMIT 1"
                ),
                params,
            ).fetchone()
            if newest is None:
                return None
            seq, record = newest[0], load_record(session_id, *newest)
            where, params = self._at(session_id, no, [seq])
            conn.execute(self._sql(f"DELETE FROM ctxkeep_messages WHERE {where}"), params)
            conn.execute(
                self._sql(
                    "UPDATE ctxkeep_sessions SET message_count = message_count - 1, "
                    "pending = ?, revision = revision + 1 WHERE session_id = ?"
                ),
                (dumps(list(pending_after_pop(info.pending, record))), session_id),
            )
            return seq, record

    def delete(
        self,
        session_id: str,
        generation: str | None = None,
        *,
        archive: EvictReason | None = None,
    ) -> bool:
        """Delete the session and its messages (archived first, with ``archive``) in one
        transaction.
        """
        self._known.forget(session_id)
        with self.db.tx("delete a session") as conn:
            where = "session_id = ?" + (" AND generation = ?" if generation is not None else "")
            params = (session_id,) if generation is None else (session_id, generation)
            found = conn.execute(
                self._sql(
                    f"SELECT agent_id{self.dialect.session_no} FROM ctxkeep_sessions WHERE {where}"
                )
                + self.dialect.for_update,
                params,
            ).fetchone()
            if found is None:
                return False
            no = self._no(found, 1)
            if archive is not None:
                self._archive_rows(conn, session_id, no, found[0], archive, _NO_SEQ)
            conn.execute(self._sql(f"DELETE FROM ctxkeep_sessions WHERE {where}"), params)
            span, args = self._span(session_id, no)
            conn.execute(self._sql(f"DELETE FROM ctxkeep_messages WHERE {span}"), args)
            conn.execute(self._sql("DELETE FROM ctxkeep_folds WHERE session_id = ?"), (session_id,))
            return True

    def _archive_rows(
        self,
        conn: Any,
        session_id: str,
        no: int | None,
        agent_id: str,
        reason: str,
        upto_seq: int,
    ) -> None:
        """Inside ``conn``'s transaction: copy the session's messages up to ``upto_seq`` into
        the archive in seq order (one ``INSERT ... SELECT``: no record crosses the wire), but
        for ids it holds (``no``: the session's number, where the dialect keeps one).
        """
        where, params = self._upto(session_id, no, upto_seq)
        conn.execute(
            self._sql(
                "INSERT INTO ctxkeep_archive (session_id, message_id, agent_id, reason, record) "
                "SELECT session_id, coalesce(message_id, ''), ?, ?, record FROM ctxkeep_messages "
                f"WHERE {where} ORDER BY {self.dialect.seq_order} ON CONFLICT DO NOTHING"
            ),
            (agent_id, reason, *params),
        )

    def _upto(self, session_id: str, no: int | None, upto_seq: int) -> tuple[str, tuple[Any, ...]]:
        """:meth:`_span`'s condition for the session's messages up to ``upto_seq``."""
        if no is None:  # (as it was written before SQLite's keys)
            return "session_id = ? AND seq <= ?", (session_id, upto_seq)
        return self._span(session_id, no, below=upto_seq + 1)

    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """A page, newest first (ties by id)."""
        where, params = [], []
        for column, value in (("agent_id", agent_id), ("task_id", task_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._q(
            "list sessions",
            f"SELECT {COLUMNS} FROM ctxkeep_sessions {clause} "
            "ORDER BY created_at DESC, session_id LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [row_to_info(r) for r in rows]

    def latest_for_agent(self, agent_id: str) -> str | None:
        """The agent's newest session id."""
        found = self.list_sessions(agent_id=agent_id, task_id=None, limit=1, offset=0)
        return found[0].session_id if found else None

    def count(self) -> int:
        """Sessions stored."""
        return int(self._q("count sessions", "SELECT count(*) FROM ctxkeep_sessions")[0][0])

    def least_recent(self, n: int) -> list[str]:
        """Oldest-accessed ids (ties by id)."""
        rows = self._q(
            "find least recent sessions",
            "SELECT session_id FROM ctxkeep_sessions ORDER BY accessed_at, session_id LIMIT ?",
            (n,),
        )
        return [r[0] for r in rows]

    def idle_since(self, cutoff: float) -> list[str]:
        """Ids idle since before ``cutoff``."""
        rows = self._q(
            "find idle sessions",
            "SELECT session_id FROM ctxkeep_sessions WHERE accessed_at < ?",
            (cutoff,),
        )
        return [r[0] for r in rows]

    def archive(self, evicted: Evicted) -> None:
        """Keep evicted messages in ``ctxkeep_archive`` (idempotent per message id)."""
        with self.db.tx("archive messages") as conn:
            executemany(
                conn,
                self._sql(
                    "INSERT INTO ctxkeep_archive (session_id, message_id, agent_id, reason, "
                    "record) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                ),
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
            "read the archive",
            "SELECT record FROM ctxkeep_archive WHERE session_id = ? "
            f"ORDER BY {self.dialect.archive_order}",
            (session_id,),
        )
        return [record_to_message(r[0]) for r in rows]

"""The PostgreSQL session backend (``postgresql://...``): shared and durable.

psycopg 3 over a :class:`psycopg_pool.ConnectionPool`. Tables are prefixed ``ctxkeep_`` and
live in the connection's ``search_path`` (``?options=-csearch_path%3Dmyschema`` in the URL
picks a schema). An append is one transaction: ``SELECT ... FOR UPDATE`` locks the session row,
the manager's tool-call check runs, the messages are inserted under the next sequence numbers
and the row is updated; concurrent writers queue on the row lock, so sequence numbers stay
gapless. Once an append returns, its commit is durable by PostgreSQL's own guarantees
(``synchronous_commit``, ``fsync``); a client killed mid-append leaves the whole append or
nothing (a statement the server already runs still commits after its client has gone).

Messages are stored as the JSON text of their record (``TEXT``, not ``JSONB``): JSONB would
reorder keys and normalise numbers, and ctxkeep compares messages by equality.

The primitives are the shared SQL ones (:mod:`ctxkeep.sessions.sql`); a read of a session and
its messages is one ``REPEATABLE READ`` transaction, so both come from one snapshot.

An append of new messages is one statement, :data:`APPEND_SQL`, in one round trip (autocommit:
it commits on its own, durable as above): a compare-and-set on the state of the session this
process last saw, which the manager's tool-call check ran on (see
:func:`~ctxkeep.sessions.base.cas_append`); it locks the row as the transaction did, so
sequence numbers stay gapless. When another writer moved the session on, the statement answers
the row as it is, the check runs again on it, and the append is tried again.

The schema version is a row of ``ctxkeep_meta``; :data:`MIGRATIONS` are applied in order under
an advisory lock (so several processes may start at once), and a database written by a newer
ctxkeep is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ctxkeep._pg import REPEATABLE_READ, PgClient
from ctxkeep.errors import StorageError
from ctxkeep.sessions.base import KnownStates, Written, cas_append
from ctxkeep.sessions.records import Append, SessionInfo, dumps
from ctxkeep.sessions.sql import COLUMNS, POSTGRES, SQLBackend, migrations, row_to_info

if TYPE_CHECKING:
    import psycopg

META_KEY = "sessions"
_UNIQUE_VIOLATION = "23505"  # SQLSTATE unique_violation

MIGRATIONS = migrations(POSTGRES)
SCHEMA_VERSION = len(MIGRATIONS)

# One append as one statement (autocommit: one round trip, one commit): a compare-and-set on
# the session's state (see ctxkeep.sessions.base.cas_append). The row is updated only if its
# pending is still the one the client checked against, its accessed_at no earlier and its
# generation the same (a session deleted and made again under the same id is another);
# accessed_at moves only past the touch resolution (Append.touch_after; an unchanged value
# keeps the update HOT: no new entries in the session table's indexes); the
# UPDATE takes the row lock (a concurrent writer waits, and the condition is evaluated again on
# the row it committed), then the messages go in under the sequence numbers it moved past.
# Answers (true, the row after) when stored, (false, the row) when not, nothing when there is
# no session. An id already in the session fails the statement on the unique
# (session_id, message_id) index (nothing is stored): the append then takes the locked path,
# which decides a retry or a conflict (ctxkeep.sessions.records.settle_ids). The records,
# roles and ids go as binary arrays (%b): in a text array psycopg escapes
# each of a JSON record's double quotes with a regular expression, about 25 us of client CPU
# per one-message append (more for records with more quotes); one message's go as scalars
# (APPEND_ONE_SQL).
_APPEND = """
WITH upd AS (
    UPDATE ctxkeep_sessions
    SET next_seq = next_seq + %(n)s, message_count = message_count + %(n)s,
        pending = %(pending)s, accessed_at = CASE WHEN %(now)s - accessed_at >= %(touch_after)s
            THEN GREATEST(accessed_at, %(now)s) ELSE accessed_at END
    WHERE session_id = %(sid)s AND pending::jsonb = %(base_pending)s::jsonb
        AND accessed_at >= %(base_accessed)s AND generation = %(base_generation)s
    RETURNING {columns}
), ins AS (
    INSERT INTO ctxkeep_messages (session_id, seq, record, role, message_id)
    {messages}
)
SELECT true, {columns} FROM upd
UNION ALL
SELECT false, {columns} FROM ctxkeep_sessions
WHERE session_id = %(sid)s AND NOT EXISTS (SELECT 1 FROM upd)
"""

APPEND_SQL = _APPEND.format(
    columns=COLUMNS,
    messages="""SELECT upd.session_id, upd.next_seq - %(n)s + m.i - 1, m.record, m.role,
        m.message_id
    FROM upd, unnest(%(records)b::text[], %(roles)b::text[], %(ids)b::text[])
        WITH ORDINALITY AS m(record, role, message_id, i)""",
)
"""An append of any number of messages (see the comment above)."""

APPEND_ONE_SQL = _APPEND.format(
    columns=COLUMNS,
    messages="""SELECT upd.session_id, upd.next_seq - 1, %(record)s::text, %(role)s::text,
        %(id)s::text FROM upd""",
)
"""An append of one message, :data:`APPEND_SQL` with the record, role and id as scalars: a
list parameter costs psycopg a scan of its items' types and an array dumper for each of the
three (a one-message append is the common one: a chat history's ``add_message``)."""


class PostgresBackend(SQLBackend):
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
    dialect = POSTGRES

    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0
    ) -> None:
        self.db = self._pg = PgClient(
            url, name="ctxkeep-sessions", meta_key=META_KEY, migrations=MIGRATIONS,
            min_size=min_size, max_size=max_size, timeout=timeout,
        )  # fmt: skip
        self.where = self._pg.where
        self._known = KnownStates()

    def append(self, session_id: str, batch: Append) -> list[int]:
        """One statement in one round trip when this process knows the session's state
        (:data:`APPEND_SQL`); a replacement of the newest message, and an append of an id
        already stored, take the shared path (a transaction that locks the row first).
        """
        if batch.replacing:
            self._known.forget(session_id)
            return super().append(session_id, batch)
        texts = batch.encoded()
        roles = [r["role"] for r in batch.records]

        def read() -> SessionInfo | None:
            return self.info(session_id, touch=None, ttl=None)

        def write(base: SessionInfo, pending: tuple[str, ...]) -> Written:
            params = {
                "sid": session_id,
                "n": len(texts),
                "pending": dumps(list(pending)),
                "now": batch.now,
                "touch_after": batch.touch_after,
                "base_pending": dumps(list(base.pending)),
                "base_accessed": base.accessed_at,
                "base_generation": base.generation,
            }
            if len(texts) == 1:
                sql = APPEND_ONE_SQL
                params.update(record=texts[0], role=roles[0], id=batch.records[0].get("id"))
            else:
                sql = APPEND_SQL
                params.update(records=texts, roles=roles, ids=[r.get("id") for r in batch.records])
            rows = self._pg.q("append", sql, params)
            if not rows:
                return None
            info = row_to_info(rows[0][1:])
            if not rows[0][0]:
                return info
            first = info.next_seq - len(texts)
            return list(range(first, info.next_seq)), info

        try:
            return cas_append(session_id, batch, self._known, read, write)
        except StorageError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != _UNIQUE_VIOLATION:
                raise
        # An id of the batch is stored (a retry, or a concurrent append of the same message):
        # the locked transaction decides, after the other one committed.
        self._known.forget(session_id)
        return super().append(session_id, batch)

    @contextmanager
    def snapshot(self, doing: str) -> Iterator[psycopg.Connection[Any]]:
        """A ``REPEATABLE READ READ ONLY`` transaction: every statement sees one snapshot.
        It begins as such (:meth:`~ctxkeep._pg.PgClient.tx`): no ``SET TRANSACTION`` round
        trip after the ``BEGIN``.
        """
        with self._pg.tx(doing, isolation=REPEATABLE_READ, read_only=True) as conn:
            yield conn

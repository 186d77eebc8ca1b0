"""The SQL backend of :class:`~ctxkeep.integrations.langgraph.CtxkeepSaver`: SQLite and PostgreSQL.

:class:`_SQLBackend` is written once, with ``?`` placeholders, over the three tables
``ctxkeep_lg_checkpoints``, ``ctxkeep_lg_blobs`` and ``ctxkeep_lg_writes``;
:class:`_SQLiteBackend` and :class:`_PostgresBackend` give it an engine client (connections,
transactions, driver errors, migrations) and a snapshot read transaction.

A checkpoint's row holds its channel values (schema 2), but the large unchanged ones, blobs
named by its ``blob_channels``: a step is then one ``INSERT`` of the row and a read of the
row and its writes, no blob rows to write, read or join. A row of schema 1 has ``NULL`` there
and every value of it is a blob, read as before.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from itertools import chain
from operator import itemgetter
from typing import Any

from ctxkeep._db import Database, executemany, placeholders
from ctxkeep.integrations.langgraph._saver_common import (
    EMPTY,
    META_KEY,
    NO_BLOBS,
    Accept,
    Typed,
    _Backend,
    _Loaded,
    _Query,
    _Row,
    _Write,
)


def _schema(blob: str, ordered_text: str) -> str:
    return f"""
    CREATE TABLE IF NOT EXISTS ctxkeep_lg_checkpoints (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id {ordered_text} NOT NULL,
        parent_checkpoint_id {ordered_text},
        run_id TEXT,
        type TEXT NOT NULL,
        checkpoint {blob} NOT NULL,
        metadata_type TEXT NOT NULL,
        metadata {blob} NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_lg_checkpoints_run ON ctxkeep_lg_checkpoints (run_id);
    CREATE TABLE IF NOT EXISTS ctxkeep_lg_blobs (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        channel TEXT NOT NULL,
        version TEXT NOT NULL,
        type TEXT NOT NULL,
        blob {blob} NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
    );
    CREATE TABLE IF NOT EXISTS ctxkeep_lg_writes (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id {ordered_text} NOT NULL,
        task_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        type TEXT NOT NULL,
        blob {blob} NOT NULL,
        task_path TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    );
    """


# The checkpoint's row holds its channel values (but large unchanged ones): a row of the first
# layout has NULL there, its values all blobs, and is read as it was.
_INLINE = "ALTER TABLE ctxkeep_lg_checkpoints ADD COLUMN blob_channels TEXT"

# Schema 3: the run index holds only the rows that have a run id (``delete_runs`` asks for
# some, never NULL): a step without one writes no index entry and the file keeps none; and a
# row written from then on holds its checkpoint with an empty ``id`` (the row's
# ``checkpoint_id`` says it; see ``CtxkeepSaver._inline``), which an older ctxkeep, refused by
# the version, would have returned as it is.
_PARTIAL_RUN_INDEX = (
    "DROP INDEX IF EXISTS ctxkeep_lg_checkpoints_run; "
    "CREATE INDEX ctxkeep_lg_checkpoints_run ON ctxkeep_lg_checkpoints (run_id) "
    "WHERE run_id IS NOT NULL"
)

# Position i brings the tables from version i to i + 1. Checkpoint ids are compared bytewise
# (PostgreSQL's "C" collation), as LangGraph orders them.
SQLITE_MIGRATIONS: list[str] = [_schema("BLOB", "TEXT"), _INLINE, _PARTIAL_RUN_INDEX]
POSTGRES_MIGRATIONS: list[str] = [
    _schema("BYTEA", 'TEXT COLLATE "C"'),
    _INLINE,
    _PARTIAL_RUN_INDEX,
]

_CP = "ctxkeep_lg_checkpoints"
_BLOBS = "ctxkeep_lg_blobs"
_WRITES = "ctxkeep_lg_writes"
_CP_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, "
    "metadata_type, metadata, blob_channels"
)
_CP_N = 10
"""The columns of ``_CP_COLS``; a joined write's come after them."""
_CP_UPDATE = (
    "parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id, "
    "type = excluded.type, checkpoint = excluded.checkpoint, "
    "metadata_type = excluded.metadata_type, metadata = excluded.metadata, "
    "blob_channels = excluded.blob_channels"
)
_BLOB_COLS = "thread_id, checkpoint_ns, channel, version, type, blob"
_WRITE_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path"
)
_WRITE_UPDATE = (
    "channel = excluded.channel, type = excluded.type, blob = excluded.blob, "
    "task_path = excluded.task_path"
)
_WRITE_READ_COLS = "task_id, idx, channel, type, blob, task_path"
_JOINED_WRITE_COLS = "w.task_id, w.idx, w.channel, w.type, w.blob, w.task_path"
_LATEST = (
    f"(checkpoint_ns, checkpoint_id) NOT IN (SELECT checkpoint_ns, max(checkpoint_id) FROM {_CP} "
    "WHERE thread_id = ? GROUP BY checkpoint_ns)"
)


_ONE_CP_COLS = (
    "checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata_type, metadata, "
    "blob_channels, NULL"
)
_ONE_WRITE_COLS = "NULL, task_id, type, blob, channel, NULL, task_path, idx"
"""``get_tuple``'s rows, the checkpoint's (``_ONE_CP_COLS``) and its writes'
(``_ONE_WRITE_COLS``, a ``NULL`` id first), in eight columns, each of one type on both sides
(PostgreSQL's ``UNION`` asks it). The checkpoint's columns beside its writes' nulls, and
theirs beside its, were sixteen a row: the ``sqlite3`` module releases and takes the GIL
again for each column it reads, ``NULL`` or not, so a step read 48 columns where it now
reads 24: its ``get_tuple`` 313,000 -> 286,000 instructions (callgrind, bench/peers.py's
step on a thread of 1,000; ``SqliteSaver``'s 257,000)."""


def _row(r: Any) -> _Row:
    """A checkpoint from its columns, ``_CP_COLS``. The named tuples of a read are made with
    ``tuple.__new__`` and every field in order: their own constructor is a Python ``__new__``
    called through the type (with those of ``put`` and ``put_writes``, a step 856,000 ->
    847,000 instructions, callgrind).
    """
    return tuple.__new__(
        _Row, (r[0], r[1], r[2], r[3], r[4], (r[5], bytes(r[6])), (r[7], bytes(r[8])), r[9])
    )


CHUNK = 400
"""Keys (checkpoint ids, or channel and version pairs) read per statement: 802 parameters at
most, far below SQLite's and PostgreSQL's bounds."""


BLOB_ROWS = 150
"""Blobs written per ``INSERT`` of many rows (900 parameters: below SQLite's oldest bound)."""


WRITE_ROWS = 100
"""Pending writes per ``INSERT`` of many rows (900 parameters)."""


def _flat(rows: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    return tuple(
        chain.from_iterable(rows)
    )  # in C: 0.5 us for a step's two writes, a generator 1.6 us


_FIRST = itemgetter(0)


def _grouped(
    writes: dict[tuple[str, str], list[Any]],
) -> dict[tuple[str, str], tuple[list[Any], dict[str, int]]]:
    """Each thread and namespace's writes' rows (checkpoint id first) sorted by checkpoint,
    with where each checkpoint's run of them starts.
    """
    out = {}
    for key, rows in writes.items():
        rows.sort(key=_FIRST)  # in C; the engine's order is the primary key's: already sorted
        starts: dict[str, int] = {}
        last = None
        for i, r in enumerate(rows):
            if r[0] != last:
                last = r[0]
                starts[last] = i
        out[key] = (rows, starts)
    return out


def _marks(n: int) -> str:
    return ", ".join("?" * n)


def _one_blobs_where(
    row: _Row, versions: dict[str, str]
) -> tuple[tuple[int, int], str, tuple[str, ...]]:
    """The condition of one checkpoint's blobs (its channels' versions): the statement's
    shape (channels, distinct versions), its ``WHERE`` text and its parameters. Per channel an
    ``IN`` list (SQLite seeks each in the primary key; see :meth:`_SQLBackend._blob_reads`).
    """
    chs, vers = list(versions), list(dict.fromkeys(versions.values()))
    where = (
        f"thread_id = ? AND checkpoint_ns = ? AND channel IN ({_marks(len(chs))}) "
        f"AND version IN ({_marks(len(vers))})"
    )
    return (len(chs), len(vers)), where, (row.thread_id, row.checkpoint_ns, *chs, *vers)


class _SQLBackend(_Backend):
    """The primitives over the three tables, for an engine client and its placeholder."""

    inline_values = True

    writable_with = True
    """Whether an ``INSERT`` may run inside a ``WITH`` of another (PostgreSQL's data-modifying
    ``WITH``; SQLite has none): a checkpoint and its blobs then go in one statement."""

    def __init__(self, db: Database, param: str) -> None:
        self.db = db
        self.param = param
        # get_tuple's statements, written once, by id and the newest: the checkpoint's row,
        # then its writes' rows, the values read once (a join would repeat them with each
        # write), in the eight columns of _ONE_CP_COLS and _ONE_WRITE_COLS.
        key = "thread_id = ? AND checkpoint_ns = ?"
        newest = f"(SELECT max(checkpoint_id) FROM {_CP} WHERE {key})"
        self._one_sql = tuple(
            self._sql(
                f"SELECT {_ONE_CP_COLS} FROM {_CP} WHERE {key} AND checkpoint_id = {cid} "
                f"UNION ALL SELECT {_ONE_WRITE_COLS} FROM {_WRITES} "
                f"WHERE {key} AND checkpoint_id = {cid}"
            )
            for cid in ("?", newest)
        )
        self._one_blobs_sql: dict[tuple[int, int], str] = {}  # by (channels, versions)
        self._put_blobs_sql: dict[int, str] = {}  # by the number of blobs
        self._put_writes_cache: dict[int, str] = {}  # by the number of writes
        self._put_sql = self._sql(
            f"INSERT INTO {_CP} ({_CP_COLS}) VALUES ({_marks(_CP_N)}) ON CONFLICT "
            f"(thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET {_CP_UPDATE}"
        )

    def _sql(self, sql: str) -> str:
        return placeholders(sql, self.param)

    @abstractmethod
    def _read_tx(self, doing: str) -> AbstractContextManager[Any]:
        """A connection inside one read transaction that sees one snapshot."""

    @abstractmethod
    def _auto(self, doing: str) -> AbstractContextManager[Any]:
        """A connection outside a transaction: each statement is its own (atomic, one
        snapshot), with no ``BEGIN`` or ``COMMIT`` to send.
        """

    def put(self, row: _Row, blobs: dict[str, tuple[str, Typed]]) -> None:
        """The checkpoint row (its values in it) and the blobs of its large unchanged values,
        each written if its version has none yet (``DO NOTHING``: a blob never changes). Alone
        as one statement (no ``BEGIN`` and ``COMMIT`` to send) when it can be: a checkpoint
        without such blobs, a step's usual case; on PostgreSQL up to :data:`BLOB_ROWS` blobs
        written by a data-modifying ``WITH`` of the row's ``INSERT``. Else in one transaction,
        the blobs in statements of up to ``BLOB_ROWS`` rows (their SQL cached by rows).
        """
        cp = (
            row.thread_id,
            row.checkpoint_ns,
            row.checkpoint_id,
            row.parent_id,
            row.run_id,
            *row.checkpoint,
            *row.metadata,
            row.blob_channels,
        )
        t, ns = row.thread_id, row.checkpoint_ns
        values = [(t, ns, ch, ver, *value) for ch, (ver, value) in blobs.items()]
        if not values or (self.writable_with and len(values) <= BLOB_ROWS):
            with self._auto("put a LangGraph checkpoint") as conn:
                if values:
                    sql = f"WITH b AS ({self._put_blobs(len(values))}) {self._put_sql}"
                    conn.execute(sql, (*_flat(values), *cp))
                else:
                    conn.execute(self._put_sql, cp)
            return
        with self.db.tx("put a LangGraph checkpoint") as conn:
            conn.execute(self._put_sql, cp)
            for start in range(0, len(values), BLOB_ROWS):
                chunk = values[start : start + BLOB_ROWS]
                conn.execute(self._put_blobs(len(chunk)), _flat(chunk))

    def _put_blobs(self, n: int) -> str:
        sql = self._put_blobs_sql.get(n)
        if sql is None:
            sql = self._put_blobs_sql[n] = self._sql(
                f"INSERT INTO {_BLOBS} ({_BLOB_COLS}) VALUES "
                + ", ".join([f"({_marks(6)})"] * n)
                + " ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO NOTHING"
            )
        return sql

    def put_writes(self, thread_id: str, ns: str, checkpoint_id: str, writes: list[_Write]) -> None:
        """One ``INSERT`` of many rows whose conflict rule keeps a regular write that exists
        and replaces a special one (``DO UPDATE ... WHERE excluded.idx < 0``); up to
        :data:`WRITE_ROWS` writes (a step's few) run as that one statement alone, atomic
        without a ``BEGIN`` and a ``COMMIT`` around it (a round trip instead of three on
        PostgreSQL), more in one transaction.
        """
        # One row per key (a statement may not touch a row twice): a later special write to
        # the same idx replaces an earlier one, as successive statements would.
        rows: dict[tuple[str, int], tuple[Any, ...]] = {}
        for task_id, idx, channel, (kind, blob), path in writes:  # unpacked: no field lookups
            key = (task_id, idx)
            if idx < 0 or key not in rows:
                rows[key] = (thread_id, ns, checkpoint_id, task_id, idx, channel, kind, blob, path)
        values = list(rows.values())
        if len(values) <= WRITE_ROWS:
            with self._auto("put LangGraph writes") as conn:
                conn.execute(self._put_writes_sql(len(values)), _flat(values))
            return
        with self.db.tx("put LangGraph writes") as conn:
            for start in range(0, len(values), WRITE_ROWS):
                chunk = values[start : start + WRITE_ROWS]
                conn.execute(self._put_writes_sql(len(chunk)), _flat(chunk))

    def _put_writes_sql(self, n: int) -> str:
        sql = self._put_writes_cache.get(n)
        if sql is None:
            sql = self._put_writes_cache[n] = self._sql(
                f"INSERT INTO {_WRITES} ({_WRITE_COLS}) VALUES "
                + ", ".join([f"({_marks(9)})"] * n)
                + " ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) "
                f"DO UPDATE SET {_WRITE_UPDATE} WHERE excluded.idx < 0"
            )
        return sql

    def read(self, query: _Query, accept: Accept) -> Iterable[_Loaded]:
        """The checkpoints, then the blobs and the writes of all of them by chunks of
        :data:`CHUNK` keys (two statements per checkpoint made most of a ``list``); one
        checkpoint's writes joined to it. Sending PostgreSQL a step's statements pipelined
        was measured too: no faster, the commit's flush is the cost.
        """
        one = query.limit == 1 and not query.filtered
        if (
            one
            and query.thread_id is not None
            and query.checkpoint_ns is not None
            and query.before is None
        ):
            return self.read_one(query.thread_id, query.checkpoint_ns, query.checkpoint_id, accept)
        where, params = ["1 = 1"], []
        for column, value in (
            ("thread_id = ?", query.thread_id),
            ("checkpoint_ns = ?", query.checkpoint_ns),
            ("checkpoint_id = ?", query.checkpoint_id),
            ("checkpoint_id < ?", query.before),
        ):
            if value is not None:
                where.append(column)
                params.append(value)
        sql = (
            f"SELECT {_CP_COLS} FROM {_CP} WHERE {' AND '.join(where)} "
            "ORDER BY checkpoint_id DESC, thread_id, checkpoint_ns"
        )
        if query.limit is not None and not query.filtered:
            sql += f" LIMIT {int(query.limit)}"
        # One checkpoint of any thread or namespace: its writes joined to it.
        if one:
            sql = (
                f"WITH c AS ({sql}) SELECT c.*, {_JOINED_WRITE_COLS} FROM c LEFT JOIN {_WRITES} w "
                "ON w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns "
                "AND w.checkpoint_id = c.checkpoint_id"
            )
        # The accepted rows, newest first. A row no refusal can drop (no metadata filter) and
        # whose values are all in it is kept as the engine gave it, its bytes in it: ``accept``
        # decodes it when it is handed over (see _loaded). Any other row is decided on here
        # and kept without its bytes, ``accept``'s answer in ``answers`` at its position.
        picked: list[Any] = []
        answers: dict[int, tuple[dict[str, str], Any]] = {}
        defer = not query.filtered
        joined: list[tuple[Any, ...]] = []
        with self._read_tx("read LangGraph checkpoints") as conn:
            for r in conn.execute(self._sql(sql), tuple(params)):
                if one and r[_CP_N] is not None:
                    joined.append((r[2], *r[_CP_N:]))  # as _write_reads' rows
                if one and picked:
                    continue  # the checkpoint again, with its next write
                if defer and r[9] == "":
                    picked.append(r)
                else:
                    accepted = accept(_row(r))
                    if accepted is None:
                        continue
                    answers[len(picked)] = accepted
                    # without its bytes, built at once (``_replace`` took 3 us)
                    picked.append(
                        tuple.__new__(_Row, (r[0], r[1], r[2], r[3], r[4], EMPTY, EMPTY, r[9]))
                    )
                if not one and query.limit is not None and len(picked) >= query.limit:
                    break
            blob_reads = self._blob_reads(
                conn, [(picked[i], *answer) for i, answer in answers.items()]
            )
            write_reads = [] if one else self._write_reads(conn, picked, ranges=not query.filtered)
            blobs: dict[tuple[str, str, str, str], Typed] = {
                (t, ns, ch, ver): (kind, bytes(b))
                for (t, ns), cur in blob_reads
                for ch, ver, kind, b in cur.fetchall()
            }
            # (thread, namespace) -> its writes' rows as the engine gave them
            writes: dict[tuple[str, str], list[Any]] = {}
            if one and picked:
                writes[picked[0][0], picked[0][1]] = joined
            for key, cur in write_reads:
                found = writes.get(key)
                if found is None:
                    writes[key] = cur.fetchall()
                else:
                    found.extend(cur.fetchall())
        return self._loaded(picked, answers, accept, blobs, _grouped(writes))

    @staticmethod
    def _loaded(
        picked: list[Any],
        answers: dict[int, tuple[dict[str, str], Any]],
        accept: Accept,
        blobs: dict[tuple[str, str, str, str], Typed],
        writes: dict[tuple[str, str], tuple[list[Any], dict[str, int]]],
    ) -> Iterator[_Loaded]:
        """The read checkpoints (``picked`` and ``answers`` as :meth:`read` made them), each
        handed over as it is made and what it was made of let go: the caller turns one into
        its result before the next is made.

        Nothing is kept per checkpoint that the garbage collector goes on counting (a ``list``
        keeps its results, as ``SqliteSaver``'s does, and nothing else of them): a row as the
        engine gave it and a write's row are tuples of text and bytes, which the collector
        stops tracking the first time it meets them, and a checkpoint's writes are a run of
        its thread's sorted rows, found by where the run starts. The row decided on as it
        was read (a ``_Row``, which stays tracked), the answer and its pair, and a list of
        writes per checkpoint, all kept to the end of the read, were four objects more per
        checkpoint that every collection until then traversed: a ``list`` of bench/peers.py's
        thread of 10,000 made the collector traverse 1,802,000 objects, now 1,583,000-1,623,000
        (``SqliteSaver``'s 1,538,000; counted by ``gc.callbacks``), its peak memory the same.
        """
        for position in range(len(picked)):
            r, picked[position] = picked[position], None
            answer = answers.pop(position, None) if answers else None
            if answer is None:  # a row kept with its bytes: decided on now
                row = _row(r)
                answer = accept(row)
                if answer is None:  # never: a row is deferred only where none is refused
                    continue
            else:
                row = r
            versions, decoded = answer
            t, ns, cid = r[0], r[1], r[2]
            if versions:
                values = {ch: blobs.get((t, ns, ch, ver)) for ch, ver in versions.items()}
                loaded = {ch: v for ch, v in values.items() if v is not None}
            else:  # every value in the row (the usual case): no dicts to make
                loaded = NO_BLOBS
            pending = []
            found = writes.get((t, ns))
            if found is not None and (k := found[1].get(cid)) is not None:
                rows = found[0]  # its run from k, each row let go as it is taken
                while k < len(rows) and (w := rows[k]) is not None and w[0] == cid:
                    rows[k] = None
                    k += 1
                    pending.append(
                        tuple.__new__(_Write, (w[1], w[2], w[3], (w[4], bytes(w[5])), w[6]))
                    )
            yield tuple.__new__(_Loaded, (row, decoded, loaded, pending))

    def read_one(
        self, thread_id: str, ns: str, checkpoint_id: str | None, accept: Accept
    ) -> list[_Loaded]:
        """One checkpoint of a thread and namespace (``checkpoint_id``, else the newest),
        what ``get_tuple`` reads: its row and its writes in one statement, then the blobs of
        its large unchanged values, if it has any (statements written once).

        Read outside a transaction, each statement its own snapshot, with no ``BEGIN`` and
        ``COMMIT`` to send (two round trips of four on PostgreSQL). Blobs are never changed
        once written, only deleted with the thread (or pruned): a blob of the checkpoint's
        versions missing then means the thread changed between the statements, or the blob
        was never stored; the checkpoint is then read again inside one read transaction,
        whose answer stands.
        """
        with self._auto("read a LangGraph checkpoint") as conn:
            found = self._read_one(conn, thread_id, ns, checkpoint_id, accept, strict=True)
        if found is not None:
            return found
        with self._read_tx("read a LangGraph checkpoint") as conn:
            again = self._read_one(conn, thread_id, ns, checkpoint_id, accept, strict=False)
        return again or []

    def _read_one(
        self,
        conn: Any,
        thread_id: str,
        ns: str,
        checkpoint_id: str | None,
        accept: Accept,
        *,
        strict: bool,
    ) -> list[_Loaded] | None:
        """:meth:`read_one` on ``conn``; ``None`` if ``strict`` and a blob is missing."""
        by_id, newest = self._one_sql
        if checkpoint_id is None:
            rows = conn.execute(newest, (thread_id, ns) * 4).fetchall()
        else:
            rows = conn.execute(by_id, (thread_id, ns, checkpoint_id) * 2).fetchall()
        found, writes = None, []
        for r in rows:  # the checkpoint's row (its id set), and its writes'
            if r[0] is None:
                writes.append(tuple.__new__(_Write, (r[1], r[7], r[4], (r[2], bytes(r[3])), r[6])))
            else:
                found = r
        if found is None:
            return []
        row = tuple.__new__(
            _Row,
            (
                thread_id,
                ns,
                found[0],
                found[1],
                None,  # the run id: no read uses it
                (found[2], bytes(found[3])),
                (found[4], bytes(found[5])),
                found[6],
            ),
        )
        accepted = accept(row)
        if accepted is None:
            return []
        versions, decoded = accepted
        if not versions:  # every value in the row (a step's usual case)
            return [tuple.__new__(_Loaded, (row, decoded, NO_BLOBS, writes))]
        blobs: dict[str, Typed] = {}
        for _, cur in self._blob_reads(conn, [(row, versions, decoded)]):
            for ch, ver, kind, b in cur.fetchall():
                if versions.get(ch) == ver:
                    blobs[ch] = (kind, bytes(b))
        if strict and len(blobs) < len(versions):
            return None
        return [_Loaded(row, decoded, blobs, writes)]

    def _blob_reads(
        self, conn: Any, picked: list[tuple[_Row, dict[str, str], Any]]
    ) -> list[tuple[tuple[str, str], Any]]:
        """The statements (run, not read) that read the blobs the picked checkpoints need:
        per channel, its versions in an ``IN`` list (SQLite seeks each in the primary key;
        OR-ed (channel, version) pairs took it 6 times as long, a row value
        ``IN (VALUES ...)`` scanned the thread).
        """
        out = []
        if len(picked) == 1:  # one checkpoint: one statement, the few extra pairs unused
            row, versions, _ = picked[0]
            if versions:
                shape, where, params = _one_blobs_where(row, versions)
                sql = self._one_blobs_sql.get(shape)
                if sql is None:
                    sql = self._one_blobs_sql[shape] = self._sql(
                        f"SELECT channel, version, type, blob FROM {_BLOBS} WHERE {where}"
                    )
                out.append(((row.thread_id, row.checkpoint_ns), conn.execute(sql, params)))
            return out
        needed: dict[tuple[str, str, str], dict[str, None]] = {}
        for row, versions, _ in picked:
            for ch, ver in versions.items():
                needed.setdefault((row.thread_id, row.checkpoint_ns, ch), {})[ver] = None
        for (t, ns, ch), wanted in needed.items():
            vers = list(wanted)
            for start in range(0, len(vers), CHUNK):
                chunk = vers[start : start + CHUNK]
                sql = (
                    f"SELECT channel, version, type, blob FROM {_BLOBS} WHERE thread_id = ? "
                    f"AND checkpoint_ns = ? AND channel = ? AND version IN ({_marks(len(chunk))})"
                )
                out.append(((t, ns), conn.execute(self._sql(sql), (t, ns, ch, *chunk))))
        return out

    def _write_reads(
        self, conn: Any, picked: list[Any], *, ranges: bool
    ) -> list[tuple[tuple[str, str], Any]]:
        """The statements (run, not read) that read the picked checkpoints' writes. With
        ``ranges`` (no metadata filter refused a row), the picked checkpoints of a thread and
        namespace are every one between their oldest and newest id (the rows come newest
        first, the first ``limit`` taken): one statement per thread and namespace, its writes
        in that id range (a write of no stored checkpoint there is read and not used), instead
        of :data:`CHUNK` ids at a time in ``IN`` lists.
        """
        ids: dict[tuple[str, str], list[str]] = {}
        for row in picked:  # a row's thread, namespace and id first
            ids.setdefault((row[0], row[1]), []).append(row[2])
        cols = "checkpoint_id, task_id, idx, channel, type, blob, task_path"
        key = f"FROM {_WRITES} WHERE thread_id = ? AND checkpoint_ns = ?"
        out = []
        for (t, ns), cids in ids.items():
            if ranges:
                sql = f"SELECT {cols} {key} AND checkpoint_id BETWEEN ? AND ?"
                out.append(((t, ns), conn.execute(self._sql(sql), (t, ns, cids[-1], cids[0]))))
                continue
            for start in range(0, len(cids), CHUNK):
                chunk = cids[start : start + CHUNK]
                sql = f"SELECT {cols} {key} AND checkpoint_id IN ({_marks(len(chunk))})"
                out.append(((t, ns), conn.execute(self._sql(sql), (t, ns, *chunk))))
        return out

    def delete_thread(self, thread_id: str) -> None:
        with self.db.tx("delete a LangGraph thread") as conn:
            for table in (_CP, _BLOBS, _WRITES):
                conn.execute(self._sql(f"DELETE FROM {table} WHERE thread_id = ?"), (thread_id,))

    def delete_runs(self, run_ids: list[str]) -> None:
        runs = f"run_id IN ({_marks(len(run_ids))})"
        with self.db.tx("delete LangGraph runs") as conn:
            conn.execute(
                self._sql(
                    f"DELETE FROM {_WRITES} WHERE (thread_id, checkpoint_ns, checkpoint_id) "
                    f"IN (SELECT thread_id, checkpoint_ns, checkpoint_id FROM {_CP} WHERE {runs})"
                ),
                tuple(run_ids),
            )
            conn.execute(self._sql(f"DELETE FROM {_CP} WHERE {runs}"), tuple(run_ids))

    def copy_thread(self, source: str, target: str) -> None:
        copies = (
            (_CP, _CP_COLS, "thread_id, checkpoint_ns, checkpoint_id", _CP_UPDATE),
            (
                _BLOBS,
                _BLOB_COLS,
                "thread_id, checkpoint_ns, channel, version",
                "type = excluded.type, blob = excluded.blob",
            ),
            (
                _WRITES,
                _WRITE_COLS,
                "thread_id, checkpoint_ns, checkpoint_id, task_id, idx",
                _WRITE_UPDATE,
            ),
        )
        with self.db.tx("copy a LangGraph thread") as conn:
            for table, cols, key, update in copies:
                rest = cols.split(", ", 1)[1]
                conn.execute(
                    self._sql(
                        f"INSERT INTO {table} ({cols}) SELECT CAST(? AS TEXT), {rest} FROM {table} "
                        f"WHERE thread_id = ? ON CONFLICT ({key}) DO UPDATE SET {update}"
                    ),
                    (target, source),
                )

    def keep_latest(self, thread_id: str, versions: Callable[[Typed], dict[str, str]]) -> None:
        with self.db.tx("prune a LangGraph thread") as conn:
            for table in (_WRITES, _CP):
                conn.execute(
                    self._sql(f"DELETE FROM {table} WHERE thread_id = ? AND {_LATEST}"),
                    (thread_id, thread_id),
                )
            needed = {
                (ns, ch, ver)
                for ns, t, cp in conn.execute(
                    self._sql(
                        f"SELECT checkpoint_ns, type, checkpoint FROM {_CP} WHERE thread_id = ?"
                    ),
                    (thread_id,),
                ).fetchall()
                for ch, ver in versions((t, bytes(cp))).items()
            }
            stored = conn.execute(
                self._sql(
                    f"SELECT checkpoint_ns, channel, version FROM {_BLOBS} WHERE thread_id = ?"
                ),
                (thread_id,),
            ).fetchall()
            unused = [(thread_id, *key) for key in map(tuple, stored) if key not in needed]
            if unused:
                executemany(
                    conn,
                    self._sql(
                        f"DELETE FROM {_BLOBS} WHERE thread_id = ? AND checkpoint_ns = ? "
                        "AND channel = ? AND version = ?"
                    ),
                    unused,
                )

    def close(self) -> None:
        self.db.close()


MMAP_SIZE = 1 << 30
"""Bytes of a SQLite file the saver's connections read through a memory map. A ``list`` reads
whole rows of checkpoints (bench/peers.py's: 36 kB each, nine overflow pages): 8,900
``pread`` calls for a thread of 1,000, each copying a page into SQLite's cache, where a map
reads them in place: CPU of that ``list`` 85 -> 65 ms (medians of 12, alternating; strace:
no ``pread`` left). Address space only; pages in the WAL are read from it as before."""


class _SQLiteBackend(_SQLBackend):
    writable_with = False

    def __init__(self, path: str) -> None:
        from ctxkeep._sqlite import SQLiteClient

        self.client = SQLiteClient(
            path, meta_key=META_KEY, migrations=SQLITE_MIGRATIONS, mmap_size=MMAP_SIZE
        )
        self._autos: dict[str, _SQLiteAuto] = {}
        super().__init__(self.client, "?")

    def _read_tx(self, doing: str) -> AbstractContextManager[Any]:
        return self.client.tx(doing, immediate=False)  # a deferred BEGIN: a WAL snapshot

    def _auto(self, doing: str) -> AbstractContextManager[Any]:
        # one per text, made once: it holds no state of a block (the connection is this
        # thread's), so threads and nested blocks share it
        auto = self._autos.get(doing)
        if auto is None:
            auto = self._autos[doing] = _SQLiteAuto(self.client, doing)
        return auto


class _SQLiteAuto:
    """This thread's SQLite connection (``isolation_level=None``: autocommit) for a block;
    a ``sqlite3`` error raised in it translated by the client's ``errors``, entered only
    then. A plain class: the two nested generator context managers it replaces cost a step
    (three blocks) about 20 µs, a tenth of it (issue 26).
    """

    __slots__ = ("_client", "_doing")

    def __init__(self, client: Any, doing: str) -> None:
        self._client = client
        self._doing = doing

    def __enter__(self) -> Any:
        return self._client.conn()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            with self._client.errors(self._doing):
                raise exc


class _PostgresBackend(_SQLBackend):
    def __init__(self, url: str) -> None:
        from psycopg import IsolationLevel

        from ctxkeep._pg import PgClient

        self._isolation = IsolationLevel.REPEATABLE_READ
        self.client = PgClient(
            url, name="ctxkeep-langgraph", meta_key=META_KEY, migrations=POSTGRES_MIGRATIONS
        )
        super().__init__(self.client, "%s")

    def _read_tx(self, doing: str) -> AbstractContextManager[Any]:
        # the characteristics in the BEGIN itself: no SET TRANSACTION round trip
        return self.client.tx(doing, isolation=self._isolation, read_only=True)

    @contextmanager
    def _auto(self, doing: str) -> Iterator[Any]:
        with self.client.errors(doing), self.client.connection() as conn:
            yield conn  # the pool's connections are autocommit

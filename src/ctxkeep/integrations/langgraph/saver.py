"""A LangGraph checkpointer over ctxkeep's engine clients: SQLite, PostgreSQL and Redis.

:class:`CtxkeepSaver` is a ``BaseCheckpointSaver`` (sync and async) that passes LangGraph's
own conformance suite (``langgraph-checkpoint-conformance``, base and extended capabilities)
on every engine::

    from ctxkeep.integrations.langgraph import CtxkeepSaver

    with CtxkeepSaver("postgresql://localhost/app") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "user-42"}})

What is stored, as LangGraph's own Postgres and SQLite savers store it: a checkpoint without
its channel values, its metadata and its parent's id; each channel value once per
``(thread, namespace, channel, version)`` as a *blob*, so a step that changes one channel
stores one value, not the whole state again; and the pending writes of each checkpoint, keyed
by ``(task_id, idx)``. Every value goes through the saver's ``serde`` (LangGraph's
``JsonPlusSerializer`` by default) as a ``(type, bytes)`` pair. Channel versions are strings
with a random fraction (as ``InMemorySaver`` makes them), so two forks of one thread never
write one blob key with different values.

How the parts fit. The saver validates configs, encodes and decodes values and filters
metadata, free of I/O; a backend (:class:`_SQLBackend` for SQLite and PostgreSQL, written once
with ``?`` placeholders, and :class:`_RedisBackend`) implements a few primitives over encoded
rows: ``put``, ``put_writes``, ``read``, ``delete_thread``, ``delete_runs``, ``copy_thread``
and ``keep_latest``. Connections, transactions, driver-error translation and schema versions are the
engine clients' (``ctxkeep._sqlite``, ``ctxkeep._pg``, ``ctxkeep._redis``): the layout's
version is the ``langgraph`` row of ``ctxkeep_meta`` (the ``langgraph`` field of the Redis
``{prefix}meta`` hash), and a newer one is refused with
:class:`~ctxkeep.errors.SchemaVersionError`.

SQL tables: ``ctxkeep_lg_checkpoints``, ``ctxkeep_lg_blobs`` and ``ctxkeep_lg_writes``. A read
(``get_tuple``, ``list``) runs in one read transaction (a snapshot), a write in one write
transaction. Redis keys, under the URL's ``?prefix=`` (``ctxkeep:`` by default), with each id
percent-encoded so that no id can forge another key:

======================================================  ======  ==================================
key                                                     type    holds
======================================================  ======  ==================================
``langgraph:threads``                                   set     every thread id
``langgraph:thread:{t}:namespaces``                     set     the thread's namespaces
``langgraph:thread:{t}:ns:{n}:checkpoints``             zset    checkpoint ids (score 0, lex order)
``langgraph:thread:{t}:ns:{n}:checkpoint:{id}``         hash    parent, run id, checkpoint, metadata
``langgraph:thread:{t}:ns:{n}:writes:{id}``             hash    ``{task}:{idx}`` → pending write
``langgraph:thread:{t}:ns:{n}:blobs``                   hash    ``{channel}:{version}`` → value
``langgraph:run:{run_id}``                              set     the run's checkpoints
======================================================  ======  ==================================

Bytes are base64 text in Redis (the engine client speaks strings). A Redis write is one
``MULTI``/``EXEC``; a read takes a few round trips and is not a snapshot.

Costs and limits: the ``a*`` methods run the sync ones in a worker thread
(``asyncio.to_thread``; ``alist`` gathers its results there first). ``list`` filters metadata
in Python by equality, after reading the candidate rows. ``delete_for_runs`` leaves the blobs
of deleted checkpoints (other checkpoints may share them) until the thread is pruned or
deleted; ``prune(strategy="keep_latest")`` keeps the newest checkpoint of each namespace and
the blobs it needs, and drops the rest, ancestors included (LangGraph's beta ``DeltaChannel``
would then rebuild from the kept checkpoint alone).
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, unquote, urlparse

from ctxkeep import _check
from ctxkeep._db import Database, executemany, placeholders
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidTypeError,
    MissingDependencyError,
    describe,
)

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
        writes_sort_key,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langgraph", "langgraph") from exc

__all__ = ["CtxkeepSaver"]

META_KEY = "langgraph"
"""The saver's row in ``ctxkeep_meta`` (and field in the Redis meta hash)."""

PRUNE_STRATEGIES = ("keep_latest", "delete")

Typed = tuple[str, bytes]
"""A value as ``serde.dumps_typed`` gives it: ``(type, bytes)``."""

EMPTY: Typed = ("empty", b"")
"""The blob of a channel that has a new version but no value (skipped when read)."""


# -- rows, free of I/O ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Row:
    """One stored checkpoint, encoded."""

    thread_id: str
    """The thread."""
    checkpoint_ns: str
    """The namespace (``""``: the root graph)."""
    checkpoint_id: str
    """The checkpoint's id (ordered: a later checkpoint has a larger id)."""
    parent_id: str | None
    """The id of the checkpoint it continues."""
    run_id: str | None
    """The metadata's ``run_id``, kept apart for ``delete_for_runs``."""
    checkpoint: Typed
    """The checkpoint without its channel values."""
    metadata: Typed
    """The checkpoint's metadata."""


@dataclass(frozen=True, kw_only=True)
class _Write:
    """One pending write, encoded."""

    task_id: str
    """The task that wrote it."""
    idx: int
    """Its position in the task's writes (negative for the special channels)."""
    channel: str
    """The channel written."""
    value: Typed
    """The value."""
    task_path: str = ""
    """The task's path (the first sort key of a super-step's writes)."""


@dataclass(frozen=True, kw_only=True)
class _Query:
    """Which checkpoints a read wants, newest first."""

    thread_id: str | None = None
    """One thread, or every thread."""
    checkpoint_ns: str | None = None
    """One namespace, or every namespace."""
    checkpoint_id: str | None = None
    """One checkpoint."""
    before: str | None = None
    """Only checkpoints with a smaller id."""
    limit: int | None = None
    """At most this many accepted checkpoints."""
    filtered: bool = False
    """Whether ``accept`` may refuse rows (then no row limit is pushed to the engine)."""


@dataclass(frozen=True, kw_only=True)
class _Loaded:
    """A checkpoint row with the blobs and writes it needs."""

    row: _Row
    """The checkpoint."""
    decoded: Any
    """What ``accept`` decoded of the row."""
    blobs: dict[str, Typed]
    """Channel → value, for the checkpoint's channel versions found."""
    writes: list[_Write]
    """Its pending writes, unordered."""


Accept = Callable[[_Row], "tuple[dict[str, str], Any] | None"]
"""Decides on a row: ``None`` skips it, else ``(the channel versions to load with it, what
was decoded of it)``."""


class _Backend(ABC):
    """The storage primitives of one engine, over encoded rows."""

    @abstractmethod
    def put(self, row: _Row, blobs: dict[str, tuple[str, Typed]]) -> None:
        """Store a checkpoint and the blobs of its new versions (channel → (version, value))."""

    @abstractmethod
    def put_writes(self, thread_id: str, ns: str, checkpoint_id: str, writes: list[_Write]) -> None:
        """Store writes: a write with ``idx >= 0`` that exists is kept, a special one replaced."""

    @abstractmethod
    def read(self, query: _Query, accept: Accept) -> list[_Loaded]:
        """The checkpoints ``query`` asks for and ``accept`` takes, newest first, loaded."""

    @abstractmethod
    def delete_thread(self, thread_id: str) -> None:
        """Delete everything of a thread."""

    @abstractmethod
    def delete_runs(self, run_ids: list[str]) -> None:
        """Delete the checkpoints (and their writes) made by these runs."""

    @abstractmethod
    def copy_thread(self, source: str, target: str) -> None:
        """Copy every checkpoint, blob and write of ``source`` to ``target``."""

    @abstractmethod
    def keep_latest(self, thread_id: str, versions: Callable[[Typed], dict[str, str]]) -> None:
        """Keep the newest checkpoint of each namespace of a thread, its writes and the blobs
        it needs (``versions`` reads a stored checkpoint's channel versions); drop the rest.
        """

    @abstractmethod
    def close(self) -> None:
        """Release connections."""


# -- SQLite and PostgreSQL --------------------------------------------------------------------


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


# Position i brings the tables from version i to i + 1. Checkpoint ids are compared bytewise
# (PostgreSQL's "C" collation), as LangGraph orders them.
SQLITE_MIGRATIONS: list[str] = [_schema("BLOB", "TEXT")]
POSTGRES_MIGRATIONS: list[str] = [_schema("BYTEA", 'TEXT COLLATE "C"')]

_CP = "ctxkeep_lg_checkpoints"
_BLOBS = "ctxkeep_lg_blobs"
_WRITES = "ctxkeep_lg_writes"
_CP_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, type, checkpoint, "
    "metadata_type, metadata"
)
_CP_UPDATE = (
    "parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id, "
    "type = excluded.type, checkpoint = excluded.checkpoint, "
    "metadata_type = excluded.metadata_type, metadata = excluded.metadata"
)
_BLOB_COLS = "thread_id, checkpoint_ns, channel, version, type, blob"
_WRITE_COLS = (
    "thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path"
)
_WRITE_UPDATE = (
    "channel = excluded.channel, type = excluded.type, blob = excluded.blob, "
    "task_path = excluded.task_path"
)
_LATEST = (
    f"(checkpoint_ns, checkpoint_id) NOT IN (SELECT checkpoint_ns, max(checkpoint_id) FROM {_CP} "
    "WHERE thread_id = ? GROUP BY checkpoint_ns)"
)


def _marks(n: int) -> str:
    return ", ".join("?" * n)


class _SQLBackend(_Backend):
    """The primitives over the three tables, for an engine client and its placeholder."""

    def __init__(self, db: Database, param: str) -> None:
        self.db = db
        self.param = param

    def _sql(self, sql: str) -> str:
        return placeholders(sql, self.param)

    @abstractmethod
    def _read_tx(self, doing: str) -> AbstractContextManager[Any]:
        """A connection inside one read transaction that sees one snapshot."""

    def put(self, row: _Row, blobs: dict[str, tuple[str, Typed]]) -> None:
        with self.db.tx("put a LangGraph checkpoint") as conn:
            conn.execute(
                self._sql(
                    f"INSERT INTO {_CP} ({_CP_COLS}) VALUES ({_marks(9)}) ON CONFLICT "
                    f"(thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET {_CP_UPDATE}"
                ),
                (
                    row.thread_id,
                    row.checkpoint_ns,
                    row.checkpoint_id,
                    row.parent_id,
                    row.run_id,
                    *row.checkpoint,
                    *row.metadata,
                ),
            )
            if blobs:
                executemany(
                    conn,
                    self._sql(
                        f"INSERT INTO {_BLOBS} ({_BLOB_COLS}) VALUES ({_marks(6)}) "
                        "ON CONFLICT (thread_id, checkpoint_ns, channel, version) "
                        "DO UPDATE SET type = excluded.type, blob = excluded.blob"
                    ),
                    [
                        (row.thread_id, row.checkpoint_ns, ch, ver, *value)
                        for ch, (ver, value) in blobs.items()
                    ],
                )

    def put_writes(self, thread_id: str, ns: str, checkpoint_id: str, writes: list[_Write]) -> None:
        insert = f"INSERT INTO {_WRITES} ({_WRITE_COLS}) VALUES ({_marks(9)}) ON CONFLICT "
        key = "(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)"
        with self.db.tx("put LangGraph writes") as conn:
            for w in writes:
                conflict = f"{key} DO UPDATE SET {_WRITE_UPDATE}" if w.idx < 0 else "DO NOTHING"
                conn.execute(
                    self._sql(insert + conflict),
                    (
                        thread_id,
                        ns,
                        checkpoint_id,
                        w.task_id,
                        w.idx,
                        w.channel,
                        *w.value,
                        w.task_path,
                    ),
                )

    def read(self, query: _Query, accept: Accept) -> list[_Loaded]:
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
        out: list[_Loaded] = []
        with self._read_tx("read LangGraph checkpoints") as conn:
            for r in conn.execute(self._sql(sql), tuple(params)).fetchall():
                row = _Row(
                    thread_id=r[0],
                    checkpoint_ns=r[1],
                    checkpoint_id=r[2],
                    parent_id=r[3],
                    run_id=r[4],
                    checkpoint=(r[5], bytes(r[6])),
                    metadata=(r[7], bytes(r[8])),
                )
                accepted = accept(row)
                if accepted is None:
                    continue
                out.append(self._load(conn, row, *accepted))
                if query.limit is not None and len(out) >= query.limit:
                    break
        return out

    def _load(self, conn: Any, row: _Row, versions: dict[str, str], decoded: Any) -> _Loaded:
        blobs: dict[str, Typed] = {}
        if versions:
            pairs = " OR ".join(["(channel = ? AND version = ?)"] * len(versions))
            found = conn.execute(
                self._sql(
                    f"SELECT channel, type, blob FROM {_BLOBS} "
                    f"WHERE thread_id = ? AND checkpoint_ns = ? AND ({pairs})"
                ),
                (row.thread_id, row.checkpoint_ns, *(x for kv in versions.items() for x in kv)),
            ).fetchall()
            blobs = {ch: (t, bytes(b)) for ch, t, b in found}
        writes = [
            _Write(task_id=r[0], idx=r[1], channel=r[2], value=(r[3], bytes(r[4])), task_path=r[5])
            for r in conn.execute(
                self._sql(
                    f"SELECT task_id, idx, channel, type, blob, task_path FROM {_WRITES} "
                    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
                ),
                (row.thread_id, row.checkpoint_ns, row.checkpoint_id),
            ).fetchall()
        ]
        return _Loaded(row=row, decoded=decoded, blobs=blobs, writes=writes)

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


class _SQLiteBackend(_SQLBackend):
    def __init__(self, path: str) -> None:
        from ctxkeep._sqlite import SQLiteClient

        self.client = SQLiteClient(path, meta_key=META_KEY, migrations=SQLITE_MIGRATIONS)
        super().__init__(self.client, "?")

    def _read_tx(self, doing: str) -> AbstractContextManager[Any]:
        return self.client.tx(doing, immediate=False)  # a deferred BEGIN: a WAL snapshot


class _PostgresBackend(_SQLBackend):
    def __init__(self, url: str) -> None:
        from ctxkeep._pg import PgClient

        self.client = PgClient(
            url, name="ctxkeep-langgraph", meta_key=META_KEY, migrations=POSTGRES_MIGRATIONS
        )
        super().__init__(self.client, "%s")

    @contextmanager
    def _read_tx(self, doing: str) -> Iterator[Any]:
        with self.client.tx(doing) as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn


# -- Redis ------------------------------------------------------------------------------------


def _q(part: str) -> str:
    return quote(part, safe="")


def _b64(value: Typed) -> list[str]:
    return [value[0], base64.b64encode(value[1]).decode("ascii")]


def _unb64(pair: Sequence[str]) -> Typed:
    return (pair[0], base64.b64decode(pair[1], validate=True))


def _redis_write(field: str, value: str) -> _Write:
    task, idx = field.rsplit(":", 1)
    channel, task_path, *typed = json.loads(value)
    return _Write(
        task_id=unquote(task),
        idx=int(idx),
        channel=channel,
        value=_unb64(typed),
        task_path=task_path,
    )


@contextmanager
def _corrupt(what: str) -> Iterator[None]:
    """Refuse a stored record that does not parse, naming it."""
    try:
        yield
    except (KeyError, ValueError, TypeError) as exc:
        raise CorruptRecordError(f"stored {what} is corrupt: {exc!r}") from exc


@dataclass(frozen=True)
class _RedisKeys:
    """The name of every key the saver uses, under one prefix (the one place that knows)."""

    prefix: str

    def threads(self) -> str:
        """Every thread id."""
        return f"{self.prefix}langgraph:threads"

    def namespaces(self, t: str) -> str:
        """A thread's namespaces."""
        return f"{self.prefix}langgraph:thread:{_q(t)}:namespaces"

    def _ns(self, t: str, ns: str) -> str:
        return f"{self.prefix}langgraph:thread:{_q(t)}:ns:{_q(ns)}"

    def index(self, t: str, ns: str) -> str:
        """A namespace's checkpoint ids, a zset in lexical order."""
        return f"{self._ns(t, ns)}:checkpoints"

    def checkpoint(self, t: str, ns: str, c: str) -> str:
        """One checkpoint's hash."""
        return f"{self._ns(t, ns)}:checkpoint:{_q(c)}"

    def writes(self, t: str, ns: str, c: str) -> str:
        """One checkpoint's pending writes."""
        return f"{self._ns(t, ns)}:writes:{_q(c)}"

    def blobs(self, t: str, ns: str) -> str:
        """A namespace's channel values, by ``{channel}:{version}``."""
        return f"{self._ns(t, ns)}:blobs"

    def run(self, run_id: str) -> str:
        """A run's checkpoints, as JSON ``[thread, ns, id]``."""
        return f"{self.prefix}langgraph:run:{_q(run_id)}"


class _RedisBackend(_Backend):
    def __init__(self, url: str) -> None:
        from ctxkeep._redis import RedisClient

        # Version 1 is the layout in the module docstring; its keys appear as threads are saved.
        self.db = RedisClient(url, meta_key=META_KEY, migrations=[lambda client: None])
        self.keys = _RedisKeys(self.db.prefix)

    def _conn(self) -> Any:
        return self.db.conn

    def put(self, row: _Row, blobs: dict[str, tuple[str, Typed]]) -> None:
        k, t, ns = self.keys, row.thread_id, row.checkpoint_ns
        fields = {
            "parent": row.parent_id or "",
            "run_id": row.run_id or "",
            "checkpoint": json.dumps(_b64(row.checkpoint)),
            "metadata": json.dumps(_b64(row.metadata)),
        }
        with self.db.errors(), self._conn().pipeline(transaction=True) as pipe:
            pipe.sadd(k.threads(), t)
            pipe.sadd(k.namespaces(t), ns)
            pipe.zadd(k.index(t, ns), {row.checkpoint_id: 0})
            pipe.delete(k.checkpoint(t, ns, row.checkpoint_id))
            pipe.hset(k.checkpoint(t, ns, row.checkpoint_id), mapping=fields)
            if row.run_id:
                pipe.sadd(k.run(row.run_id), json.dumps([t, ns, row.checkpoint_id]))
            if blobs:
                pipe.hset(
                    k.blobs(t, ns),
                    mapping={
                        f"{_q(ch)}:{_q(ver)}": json.dumps(_b64(v)) for ch, (ver, v) in blobs.items()
                    },
                )
            pipe.execute()

    def put_writes(self, thread_id: str, ns: str, checkpoint_id: str, writes: list[_Write]) -> None:
        key = self.keys.writes(thread_id, ns, checkpoint_id)
        with self.db.errors(), self._conn().pipeline(transaction=True) as pipe:
            for w in writes:
                field = f"{_q(w.task_id)}:{w.idx}"
                value = json.dumps([w.channel, w.task_path, *_b64(w.value)])
                (pipe.hset if w.idx < 0 else pipe.hsetnx)(key, field, value)
            pipe.execute()

    def _candidates(self, query: _Query) -> list[tuple[str, str, str]]:
        """``(thread, ns, id)`` of the checkpoints the query may want, newest first."""
        conn, k = self._conn(), self.keys
        if query.thread_id is not None:
            threads = [query.thread_id]
        else:
            threads = sorted(cast("set[str]", conn.smembers(k.threads())))
        top = "+" if query.before is None else f"({query.before}"
        cap = None if query.filtered else query.limit
        out: list[tuple[str, str, str]] = []
        for t in threads:
            if query.checkpoint_ns is not None:
                spaces = [query.checkpoint_ns]
            else:
                spaces = sorted(cast("set[str]", conn.smembers(k.namespaces(t))))
            for ns in spaces:
                if query.checkpoint_id is not None:
                    if conn.zscore(k.index(t, ns), query.checkpoint_id) is not None:
                        out.append((t, ns, query.checkpoint_id))
                    continue
                if cap is None:
                    ids = conn.zrevrangebylex(k.index(t, ns), top, "-")
                else:
                    ids = conn.zrevrangebylex(k.index(t, ns), top, "-", start=0, num=cap)
                out.extend((t, ns, c) for c in cast("list[str]", ids))
        out.sort(key=lambda x: (x[0], x[1]))  # then newest first, as the SQL engines order
        out.sort(key=lambda x: x[2], reverse=True)
        return out if cap is None else out[:cap]

    def read(self, query: _Query, accept: Accept) -> list[_Loaded]:
        k, out = self.keys, []
        with self.db.errors():
            conn = self._conn()
            for t, ns, c in self._candidates(query):
                h = cast("dict[str, str]", conn.hgetall(k.checkpoint(t, ns, c)))
                if not h:
                    continue  # deleted meanwhile
                with _corrupt(f"checkpoint {c!r}"):
                    row = _Row(
                        thread_id=t,
                        checkpoint_ns=ns,
                        checkpoint_id=c,
                        parent_id=h["parent"] or None,
                        run_id=h["run_id"] or None,
                        checkpoint=_unb64(json.loads(h["checkpoint"])),
                        metadata=_unb64(json.loads(h["metadata"])),
                    )
                accepted = accept(row)
                if accepted is None:
                    continue
                versions, decoded = accepted
                fields = [f"{_q(ch)}:{_q(v)}" for ch, v in versions.items()]
                with conn.pipeline(transaction=True) as pipe:
                    if fields:
                        pipe.hmget(k.blobs(t, ns), fields)
                    pipe.hgetall(k.writes(t, ns, c))
                    got = pipe.execute()
                values, writes = (got[0] if fields else []), got[-1]
                with _corrupt(f"values or writes of checkpoint {c!r}"):
                    blobs = {
                        ch: _unb64(json.loads(v))
                        for ch, v in zip(versions, values, strict=True)
                        if v
                    }
                    out.append(
                        _Loaded(
                            row=row,
                            decoded=decoded,
                            blobs=blobs,
                            writes=[_redis_write(f, v) for f, v in writes.items()],
                        )
                    )
                if query.limit is not None and len(out) >= query.limit:
                    break
        return out

    def _run_entries(self, t: str, ns: str, ids: list[str]) -> list[tuple[str, str]]:
        """The run-index entries ``(run key, member)`` of these checkpoints (one round trip)."""
        if not ids:
            return []
        with self._conn().pipeline(transaction=False) as reads:
            for c in ids:
                reads.hget(self.keys.checkpoint(t, ns, c), "run_id")
            run_ids = reads.execute()
        return [
            (self.keys.run(r), json.dumps([t, ns, c]))
            for c, r in zip(ids, run_ids, strict=True)
            if r
        ]

    def delete_thread(self, thread_id: str) -> None:
        k, t = self.keys, thread_id

        def body(pipe: Any, spaces: set[str]) -> None:
            keys, runs = [k.namespaces(t)], []
            for ns in spaces:
                ids = cast("list[str]", pipe.zrange(k.index(t, ns), 0, -1))
                keys += [k.index(t, ns), k.blobs(t, ns)]
                keys += [x for c in ids for x in (k.checkpoint(t, ns, c), k.writes(t, ns, c))]
                runs += self._run_entries(t, ns, ids)
            pipe.multi()
            pipe.srem(k.threads(), t)
            pipe.delete(*keys)
            for run_key, member in runs:
                pipe.srem(run_key, member)

        self._atomic_on_thread(t, body)

    def _atomic_on_thread(self, thread_id: str, body: Callable[[Any, set[str]], None]) -> None:
        """Run ``body(pipe, namespaces)`` as an optimistic transaction over the thread's
        namespaces and their indexes (a put in any of them starts it over).
        """
        k = self.keys
        while True:
            with self.db.errors():
                spaces = cast("set[str]", self._conn().smembers(k.namespaces(thread_id)))
            watch = [k.namespaces(thread_id), *(k.index(thread_id, ns) for ns in spaces)]

            def checked(pipe: Any, spaces: set[str] = spaces) -> bool:
                if cast("set[str]", pipe.smembers(k.namespaces(thread_id))) != spaces:
                    return False  # a namespace appeared meanwhile: watch it too
                body(pipe, spaces)
                return True

            if self.db.atomic(watch, checked):
                return

    def delete_runs(self, run_ids: list[str]) -> None:
        k = self.keys
        run_keys = [k.run(r) for r in run_ids]

        def body(pipe: Any) -> None:
            doomed = [
                json.loads(m) for key in run_keys for m in cast("set[str]", pipe.smembers(key))
            ]
            pipe.multi()
            for t, ns, c in doomed:
                pipe.zrem(k.index(t, ns), c)
                pipe.delete(k.checkpoint(t, ns, c), k.writes(t, ns, c))
            pipe.delete(*run_keys)

        self.db.atomic(run_keys, body)

    def copy_thread(self, source: str, target: str) -> None:
        k = self.keys
        with self.db.errors():
            conn = self._conn()
            spaces = cast("set[str]", conn.smembers(k.namespaces(source)))
            if not spaces:
                return
            reads: list[tuple[str, list[str], list[Any]]] = []  # (ns, ids, hashes)
            for ns in spaces:
                ids = cast("list[str]", conn.zrange(k.index(source, ns), 0, -1))
                with conn.pipeline(transaction=True) as pipe:
                    pipe.hgetall(k.blobs(source, ns))
                    for c in ids:
                        pipe.hgetall(k.checkpoint(source, ns, c))
                        pipe.hgetall(k.writes(source, ns, c))
                    reads.append((ns, ids, pipe.execute()))
            with conn.pipeline(transaction=True) as pipe:
                pipe.sadd(k.threads(), target)
                pipe.sadd(k.namespaces(target), *spaces)
                for ns, ids, (blobs, *hashes) in reads:
                    if blobs:
                        pipe.hset(k.blobs(target, ns), mapping=blobs)
                    for c, cp, writes in zip(ids, hashes[0::2], hashes[1::2], strict=True):
                        if not cp:
                            continue  # deleted meanwhile
                        pipe.zadd(k.index(target, ns), {c: 0})
                        pipe.delete(k.checkpoint(target, ns, c))
                        pipe.hset(k.checkpoint(target, ns, c), mapping=cp)
                        if writes:
                            pipe.hset(k.writes(target, ns, c), mapping=writes)
                        if cp.get("run_id"):
                            pipe.sadd(k.run(cp["run_id"]), json.dumps([target, ns, c]))
                pipe.execute()

    def keep_latest(self, thread_id: str, versions: Callable[[Typed], dict[str, str]]) -> None:
        k, t = self.keys, thread_id

        def body(pipe: Any, spaces: set[str]) -> None:
            drops: list[tuple[str, list[str], list[str]]] = []  # (ns, ids to drop, blob fields)
            runs: list[tuple[str, str]] = []
            for ns in spaces:
                ids = cast("list[str]", pipe.zrange(k.index(t, ns), 0, -1))
                if not ids:
                    continue
                runs += self._run_entries(t, ns, ids[:-1])
                kept = cast("str | None", pipe.hget(k.checkpoint(t, ns, ids[-1]), "checkpoint"))
                needed = versions(_unb64(json.loads(kept))) if kept else {}
                wanted = {f"{_q(ch)}:{_q(v)}" for ch, v in needed.items()}
                fields = cast("list[str]", pipe.hkeys(k.blobs(t, ns)))
                drops.append((ns, ids[:-1], [f for f in fields if f not in wanted]))
            pipe.multi()
            for ns, ids, fields in drops:
                if ids:
                    pipe.zrem(k.index(t, ns), *ids)
                    pipe.delete(
                        *(x for c in ids for x in (k.checkpoint(t, ns, c), k.writes(t, ns, c)))
                    )
                if fields:
                    pipe.hdel(k.blobs(t, ns), *fields)
            for run_key, member in runs:
                pipe.srem(run_key, member)

        self._atomic_on_thread(t, body)

    def close(self) -> None:
        self.db.close()


# -- opening ------------------------------------------------------------------------------------


def _open_backend(url: str | None) -> _Backend:
    """The backend for a URL (``None``: the embedded default SQLite file)."""
    if url is None:
        from ctxkeep.sessions import default_url

        url = default_url()
    _check.url("url", url)
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
        if path == ":memory:":  # one database per thread: the a* methods would not share it
            raise ConfigError("an in-memory SQLite saver is not shared between threads; use a file")
        return _SQLiteBackend(path)
    if scheme in ("postgresql", "postgres"):
        return _PostgresBackend(url)
    if scheme in ("redis", "rediss", "unix"):
        return _RedisBackend(url)
    hint = " (for a saver in this process only, use LangGraph's InMemorySaver)"
    raise ConfigError(
        f"unsupported LangGraph checkpointer URL {url!r}; use sqlite:///path, "
        "postgresql://... or redis://host:port/db" + (hint if scheme == "memory" else "")
    )


# -- configs and values, free of I/O -------------------------------------------------------------


def _identifier(name: str, value: Any) -> str:
    """An id of a config (a string; a thread id may also be an int or a UUID, kept as text)."""
    if isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be a string, got bool")
    if name in ("thread_id", "run_id") and isinstance(value, int | uuid.UUID):
        value = str(value)
    _check.text(name, value, empty=name == "checkpoint_ns")
    if "\0" in value:
        raise ConfigError(f"{name} must not hold a NUL character: {describe(value)}")
    return cast(str, value)


def _configurable(config: Any, what: str = "config") -> Mapping[str, Any]:
    if not isinstance(config, Mapping):
        raise InvalidTypeError(f"{what} must be a RunnableConfig mapping, got {describe(config)}")
    conf = config.get("configurable")
    if not isinstance(conf, Mapping) or conf.get("thread_id") is None:
        raise ConfigError(
            f"{what} needs a thread id: pass {{'configurable': {{'thread_id': ...}}}}, "
            f"got {describe(config)}"
        )
    return conf


def _ids(name: str, value: Any, item: str) -> list[str]:
    """A sequence of ids (``thread_ids``, ``run_ids``), each checked."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | AbstractSet):
        raise InvalidTypeError(f"{name} must be a sequence of ids, got {describe(value)}")
    return [_identifier(item, v) for v in value]


@dataclass(frozen=True, kw_only=True)
class _Target:
    """What a config names: a thread, a namespace (``None``: any) and maybe one checkpoint."""

    thread_id: str
    """The thread."""
    checkpoint_ns: str | None
    """The namespace, ``None`` for any (only ``list`` asks for that)."""
    checkpoint_id: str | None
    """One checkpoint (for ``put``: the parent of the new one)."""

    @classmethod
    def of(cls, config: Any, *, default_ns: str | None = "", what: str = "config") -> _Target:
        conf = _configurable(config, what)
        ns = conf.get("checkpoint_ns", default_ns)
        cid = conf.get("checkpoint_id") or None
        return cls(
            thread_id=_identifier("thread_id", conf["thread_id"]),
            checkpoint_ns=None if ns is None else _identifier("checkpoint_ns", ns),
            checkpoint_id=None if cid is None else _identifier("checkpoint_id", cid),
        )


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _versions(checkpoint: Mapping[str, Any]) -> dict[str, str]:
    """A checkpoint's channel versions as the text its blobs are keyed by."""
    versions = checkpoint.get("channel_versions") or {}
    return {str(ch): str(v) for ch, v in versions.items()}


# -- the saver ------------------------------------------------------------------------------------


class CtxkeepSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over SQLite, PostgreSQL or Redis (see the module docstring).

    Args:
        url: ``sqlite:///path.db``, ``postgresql://...`` or ``redis://host:port/db`` (with
            ``?prefix=`` for the keys); ``None``: the embedded default SQLite file, as every
            ctxkeep store resolves it (``CTXKEEP_DB`` or the user's data folder).
        serde: how checkpoints, channel values, metadata and writes become bytes (default:
            LangGraph's ``JsonPlusSerializer``).

    Raises:
        ConfigError: an unsupported or malformed URL.
        MissingDependencyError: the engine's extra (``redis``, ``postgres``) is not installed.
        StorageError: the engine does not answer or cannot be set up.
        SchemaVersionError: the store holds LangGraph checkpoints of a newer ctxkeep.

    Configs are LangGraph's: ``{"configurable": {"thread_id", "checkpoint_ns",
    "checkpoint_id"}}``. A config without a thread id raises ``ConfigError``, one of the wrong
    shape ``InvalidTypeError``; a stored value that cannot be decoded raises
    ``CorruptRecordError``.

    """

    def __init__(self, url: str | None = None, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._backend = _open_backend(url)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engine's connections (idempotent)."""
        self._backend.close()

    def __enter__(self) -> CtxkeepSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CtxkeepSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- encoding -------------------------------------------------------------------------

    def _dump(self, value: Any, what: str) -> Typed:
        try:
            return self.serde.dumps_typed(value)
        except (TypeError, ValueError) as exc:
            raise InvalidTypeError(
                f"{what} cannot be serialized by {type(self.serde).__name__}: {exc}"
            ) from exc

    def _load(self, value: Typed, what: str) -> Any:
        try:
            return self.serde.loads_typed(value)
        except Exception as exc:  # any decoder's refusal: the record is corrupt
            raise CorruptRecordError(f"stored {what} cannot be decoded: {exc}") from exc

    def _tuple(self, loaded: _Loaded, checkpoint: Checkpoint, metadata: Any) -> CheckpointTuple:
        row = loaded.row
        values = {
            ch: self._load(v, f"value of channel {ch!r}")
            for ch, v in loaded.blobs.items()
            if v[0] != EMPTY[0]
        }
        writes = sorted(loaded.writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        return CheckpointTuple(
            config=_config(row.thread_id, row.checkpoint_ns, row.checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=(
                _config(row.thread_id, row.checkpoint_ns, row.parent_id) if row.parent_id else None
            ),
            pending_writes=[
                (w.task_id, w.channel, self._load(w.value, f"write to {w.channel!r}"))
                for w in writes
            ],
        )

    def _read(
        self, query: _Query, filter: Mapping[str, Any] | None = None
    ) -> list[CheckpointTuple]:
        if query.limit == 0:
            return []

        def accept(row: _Row) -> tuple[dict[str, str], Any] | None:
            metadata = self._load(row.metadata, "checkpoint metadata")
            if filter and not (
                isinstance(metadata, Mapping)
                and all(k in metadata and metadata[k] == v for k, v in filter.items())
            ):
                return None
            checkpoint = self._load(row.checkpoint, "checkpoint")
            return _versions(checkpoint), (checkpoint, metadata)

        return [self._tuple(x, *x.decoded) for x in self._backend.read(query, accept)]

    # -- the sync interface ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the thread's newest in
        its namespace), with its pending writes in ``writes_sort_key`` order; ``None`` if none.
        """
        target = _Target.of(config)
        found = self._read(
            _Query(
                thread_id=target.thread_id,
                checkpoint_ns=target.checkpoint_ns,
                checkpoint_id=target.checkpoint_id,
                limit=1,
            )
        )
        return found[0] if found else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (every thread if ``None``), of its
        ``checkpoint_ns`` if it has one (else every namespace), whose metadata equals
        ``filter`` on each of its keys, older than ``before``'s checkpoint, at most ``limit``.
        """
        return iter(self._read(self._list_query(config, filter, before, limit), filter))

    def _list_query(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _Query:
        target = None if config is None else _Target.of(config, default_ns=None)
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidTypeError(f"filter must be a mapping, got {describe(filter)}")
        before_id = None
        if before is not None:
            if not isinstance(before, Mapping):
                raise InvalidTypeError(f"before must be a RunnableConfig, got {describe(before)}")
            raw = (
                get_checkpoint_id(before)
                if isinstance(before.get("configurable"), Mapping)
                else None
            )
            before_id = None if raw is None else _identifier("checkpoint_id", raw)
        return _Query(
            thread_id=None if target is None else target.thread_id,
            checkpoint_ns=None if target is None else target.checkpoint_ns,
            checkpoint_id=None if target is None else target.checkpoint_id,
            before=before_id,
            limit=_check.optional_integer("limit", limit, minimum=0),
            filtered=bool(filter),
        )

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (its parent is ``config``'s ``checkpoint_id``) with the values of
        the channels in ``new_versions``; the config that names it.
        """
        target = _Target.of(config)
        if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("id"), str):
            raise InvalidTypeError(
                f"checkpoint must be a Checkpoint dict, got {describe(checkpoint)}"
            )
        if not isinstance(new_versions, Mapping):
            raise InvalidTypeError(f"new_versions must be a mapping, got {describe(new_versions)}")
        cid = _identifier("checkpoint id", checkpoint["id"])
        ns = target.checkpoint_ns or ""
        stripped = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint.get("channel_values") or {}
        blobs = {
            str(ch): (
                str(ver),
                self._dump(values[ch], f"channel {ch!r}") if ch in values else EMPTY,
            )
            for ch, ver in new_versions.items()
        }
        md = get_serializable_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        row = _Row(
            thread_id=target.thread_id,
            checkpoint_ns=ns,
            checkpoint_id=cid,
            parent_id=target.checkpoint_id,
            run_id=None if run_id is None else _identifier("run_id", str(run_id)),
            checkpoint=self._dump(stripped, "checkpoint"),
            metadata=self._dump(md, "metadata"),
        )
        self._backend.put(row, blobs)
        return _config(target.thread_id, ns, cid)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes for the checkpoint ``config`` names: a regular write already
        stored under ``(task_id, idx)`` is kept, a special one (error, interrupt...) replaced.
        """
        target = _Target.of(config)
        if target.checkpoint_id is None:
            raise ConfigError("put_writes needs the config of a checkpoint (a checkpoint_id)")
        task_id = _identifier("task_id", task_id)
        task_path = _identifier("task_path", task_path) if task_path else ""
        rows: list[_Write] = []
        for idx, pair in enumerate(writes):
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise InvalidTypeError(f"writes[{idx}] must be a (channel, value) pair")
            channel = _identifier("channel", pair[0])
            rows.append(
                _Write(
                    task_id=task_id,
                    idx=WRITES_IDX_MAP.get(channel, idx),
                    channel=channel,
                    value=self._dump(pair[1], f"write to {channel!r}"),
                    task_path=task_path,
                )
            )
        if rows:
            ns = target.checkpoint_ns or ""
            self._backend.put_writes(target.thread_id, ns, target.checkpoint_id, rows)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread (nothing if it has none)."""
        self._backend.delete_thread(_identifier("thread_id", thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints made by these runs (their metadata's ``run_id``), with their
        writes, in every thread and namespace.
        """
        ids = _ids("run_ids", run_ids, "run_id")
        if ids:
            self._backend.delete_runs(ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread to another (a checkpoint the
        target already has under the same id is replaced).
        """
        source = _identifier("thread_id", source_thread_id)
        target = _identifier("thread_id", target_thread_id)
        if source != target:
            self._backend.copy_thread(source, target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``"keep_latest"`` keeps the newest checkpoint of each namespace (its
        writes and values), ``"delete"`` deletes the threads.

        Raises:
            ConfigError: an unknown strategy.

        """
        if strategy not in PRUNE_STRATEGIES:
            raise ConfigError(
                f"strategy must be one of {', '.join(PRUNE_STRATEGIES)}, got {strategy!r}"
            )
        ids = _ids("thread_ids", thread_ids, "thread_id")
        for t in ids:
            if strategy == "delete":
                self._backend.delete_thread(t)
            else:
                self._backend.keep_latest(t, lambda c: _versions(self._load(c, "checkpoint")))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The version after ``current``: the next integer with a random fraction, so that two
        forks of one thread never give one channel the same version.
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- the async interface: the sync methods in a worker thread -------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` in a worker thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list`, its results gathered in a worker thread."""
        query = self._list_query(config, filter, before, limit)
        for item in await asyncio.to_thread(self._read, query, filter):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`put` in a worker thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """:meth:`put_writes` in a worker thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`prune` in a worker thread."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

"""The Redis backend of :class:`~ctxkeep.integrations.langgraph.CtxkeepSaver`.

The key layout is drawn in the ``saver`` module's docstring; :class:`_RedisKeys` is the one
place that names the keys. Bytes are stored as base64 text, a write is one ``MULTI``/``EXEC``,
and a delete or prune runs as an optimistic transaction over the thread's indexes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote, unquote

from ctxkeep.errors import CorruptRecordError
from ctxkeep.integrations.langgraph._saver_common import (
    META_KEY,
    Accept,
    Typed,
    _Backend,
    _Loaded,
    _Query,
    _Row,
    _Write,
)


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

        # Version 1 is the layout in saver's module docstring; its keys appear as threads are saved.
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

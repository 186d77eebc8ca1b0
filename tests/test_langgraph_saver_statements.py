"""CtxkeepSaver on SQLite: the statements a LangGraph step sends (counted with SQLite's trace
callback), and the write rules the fewer statements keep on every engine.

A step is ``put`` + ``put_writes`` + ``get_tuple``; each statement the engine runs costs a
call into it (a round trip on PostgreSQL), ``BEGIN`` and ``COMMIT`` included.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from conftest_services import (  # noqa: F401
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.integrations.langgraph import CtxkeepSaver
from test_langgraph_saver import checkpoint, config, new_url, saver  # noqa: F401


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[CtxkeepSaver, list[str]]]:
    """A SQLite saver and the statements its connection runs (from when it is traced)."""
    with CtxkeepSaver(f"sqlite:///{tmp_path / 'lg.db'}") as s:
        ran: list[str] = []
        conn = s._backend.client.conn()  # type: ignore[attr-defined]
        conn.set_trace_callback(ran.append)
        yield s, ran


def _first(s: CtxkeepSaver) -> Any:
    cp = checkpoint(str(uuid.UUID(int=1)), messages=["hi"], step=1)
    return s.put(config("t", checkpoint_ns=""), cp, {"step": 1}, dict(cp["channel_versions"]))


def test_put_writes_of_a_step_is_one_statement(traced: tuple[CtxkeepSaver, list[str]]) -> None:
    s, ran = traced
    cfg = _first(s)
    ran.clear()
    s.put_writes(cfg, [("messages", ["a"]), ("step", 2), ("__interrupt__", "x")], "task-1")
    assert len(ran) == 1 and ran[0].startswith("INSERT INTO ctxkeep_lg_writes")


def test_get_tuple_sends_no_begin_or_commit(traced: tuple[CtxkeepSaver, list[str]]) -> None:
    s, ran = traced
    cfg = _first(s)
    s.put_writes(cfg, [("messages", ["a"])], "task-1")
    ran.clear()
    got = s.get_tuple(cfg)
    assert got is not None and got.checkpoint["channel_values"] == {"messages": ["hi"], "step": 1}
    assert got.pending_writes == [("task-1", "messages", ["a"])]
    # The checkpoint and its writes together (issue 26: was three, then two).
    assert [q.split()[0] for q in ran] == ["SELECT"]


def test_get_tuple_reads_its_rows_in_eight_columns(
    traced: tuple[CtxkeepSaver, list[str]],
) -> None:
    """The checkpoint's row and its writes' share eight columns (issue 26): each row held the
    other's columns as NULLs, sixteen, and the ``sqlite3`` module reads every column it is
    given, a GIL release each; the step's read took 27,000 instructions more (callgrind)."""
    s, ran = traced
    cfg = _first(s)
    s.put_writes(cfg, [("messages", ["a"]), ("step", 2)], "task-1")
    ran.clear()
    got = s.get_tuple(cfg)
    assert got is not None and got.pending_writes == [
        ("task-1", "messages", ["a"]),
        ("task-1", "step", 2),
    ]
    (sql,) = ran
    conn = s._backend.client.conn()  # type: ignore[attr-defined]
    cur = conn.execute(sql)  # the trace gives the statement with its values in it
    rows = cur.fetchall()
    assert len(cur.description) == 8
    assert [r[0] for r in rows] == [cfg["configurable"]["checkpoint_id"], None, None]
    newest = s.get_tuple(config("t", checkpoint_ns=""))  # by the newest: the other statement
    assert newest is not None and newest.pending_writes == got.pending_writes
    assert len(conn.execute(ran[-1]).description) == 8


def test_writes_come_in_langgraph_s_order(saver: CtxkeepSaver) -> None:  # noqa: F811
    """A checkpoint's writes sorted by ``WRITE_ORDER`` (a C key over the stored writes) come
    in the order of LangGraph's ``writes_sort_key``, on every engine."""
    from langgraph.checkpoint.base import writes_sort_key

    from ctxkeep.integrations.langgraph.saver import WRITE_ORDER

    cfg = saver.put(config("t", checkpoint_ns=""), checkpoint("c1"), {}, {})
    tasks = [("b", "p2"), ("a", "p2"), ("c", "p1"), ("d", ""), ("z", "p1")]
    for task_id, path in tasks:
        saver.put_writes(cfg, [("x", f"{task_id}0"), ("y", f"{task_id}1")], task_id, path)
    saver.put_writes(cfg, [("__error__", "boom")], "d", "")
    got = saver.get_tuple(cfg)
    assert got is not None
    written = [(t, p, i, ch) for t, p in tasks for i, ch in enumerate(("x", "y"))]
    written.append(("d", "", -1, "__error__"))
    expected = sorted(written, key=lambda w: writes_sort_key(w[1], w[0], w[2]))
    assert [(t, ch) for t, ch, _ in got.pending_writes] == [(t, ch) for t, _, _, ch in expected]
    probe = type("W", (), {"task_path": "p", "task_id": "t", "idx": 3})()
    assert WRITE_ORDER(probe) == writes_sort_key("p", "t", 3)


def test_a_step_s_put_is_one_statement(traced: tuple[CtxkeepSaver, list[str]]) -> None:
    """The checkpoint's values in its row: no blob rows, no BEGIN and COMMIT around them
    (issue 26: was four statements)."""
    s, ran = traced
    cfg = _first(s)
    ran.clear()
    cp = checkpoint(str(uuid.UUID(int=2)), messages=["hi", "there"], step=2)
    s.put(cfg, cp, {"step": 2}, dict(cp["channel_versions"]))
    assert len(ran) == 1 and ran[0].startswith("INSERT INTO ctxkeep_lg_checkpoints")


def test_a_missing_blob_is_read_again_in_one_snapshot(
    traced: tuple[CtxkeepSaver, list[str]], tmp_path: Path
) -> None:
    """A checkpoint whose large unchanged value (a blob) is gone when its blobs are read, as
    a prune between the two statements would leave it: read again inside a transaction,
    returned without that channel."""
    s, ran = traced
    big = "x" * 5000
    cp = checkpoint(str(uuid.UUID(int=1)), kept=1, big=big)
    cfg = s.put(config("t", checkpoint_ns=""), cp, {}, dict(cp["channel_versions"]))
    cp = checkpoint(str(uuid.UUID(int=2)), kept=2, big=big)
    cp["channel_versions"]["kept"] = "2"
    cfg = s.put(cfg, cp, {}, {"kept": "2"})
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        assert conn.execute("DELETE FROM ctxkeep_lg_blobs").rowcount == 1
    ran.clear()
    got = s.get_tuple(cfg)
    assert got is not None and got.checkpoint["channel_values"] == {"kept": 2}
    assert [q.split()[0] for q in ran].count("BEGIN") == 1


def test_a_sqlite_error_of_a_statement_is_a_storage_error(
    traced: tuple[CtxkeepSaver, list[str]], tmp_path: Path
) -> None:
    """The statements run outside a transaction translate the driver's errors too."""
    from ctxkeep.errors import StorageError

    s, _ = traced
    cfg = _first(s)
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        conn.execute("DROP TABLE ctxkeep_lg_writes")
    with pytest.raises(StorageError, match="put LangGraph writes: no such table"):
        s.put_writes(cfg, [("messages", ["a"])], "task-1")
    with pytest.raises(StorageError, match="read a LangGraph checkpoint: no such table"):
        s.get_tuple(cfg)


def test_a_list_reads_a_thread_s_writes_in_one_statement(
    traced: tuple[CtxkeepSaver, list[str]],
) -> None:
    """An unfiltered list's checkpoints of a thread and namespace are one range of ids: their
    writes come in one statement, not one per 400 ids (issue 26); a write to an id between
    them with no checkpoint of its own is read and left out, and a filtered list still gets
    each checkpoint's own writes."""
    s, ran = traced
    cfg = config("t", checkpoint_ns="")
    for i in range(1, 902):
        cp = checkpoint(str(uuid.UUID(int=2 * i)), step=i)
        cfg = s.put(cfg, cp, {"step": i, "odd": i % 2}, dict(cp["channel_versions"]))
        s.put_writes(cfg, [("step", i), ("messages", [str(i)])], "task-1")
    orphan = config("t", checkpoint_ns="", checkpoint_id=str(uuid.UUID(int=21)))
    s.put_writes(orphan, [("step", -1)], "task-9")
    ran.clear()
    got = list(s.list(config("t")))
    assert len([q for q in ran if "FROM ctxkeep_lg_writes" in q]) == 1
    assert len(got) == 901
    for t in got:
        step = t.metadata["step"]
        assert t.checkpoint["id"] == str(uuid.UUID(int=2 * step))
        assert t.pending_writes == [("task-1", "step", step), ("task-1", "messages", [str(step)])]
    odd = list(s.list(config("t"), filter={"odd": 1}, limit=5))
    assert [t.metadata["step"] for t in odd] == [901, 899, 897, 895, 893]
    assert [t.pending_writes[0][2] for t in odd] == [901, 899, 897, 895, 893]


def _read_calls() -> int:
    """The read system calls this thread has made (``read``, ``pread64``...: Linux's
    ``syscr``)."""
    for line in Path("/proc/thread-self/io").read_text().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise AssertionError("no syscr in /proc/thread-self/io")


@pytest.mark.skipif(not Path("/proc/thread-self/io").exists(), reason="Linux's per-thread I/O")
def test_a_list_reads_the_file_s_pages_through_a_map(tmp_path: Path) -> None:
    """A list of a thread of large checkpoints makes no read system call for their pages
    (memory-mapped: issue 26; each 4 kB page was a ``pread`` before, about 300 here)."""
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    big = "x" * 20_000
    with CtxkeepSaver(url) as s:
        cfg = config("t", checkpoint_ns="")
        for i in range(1, 51):
            cp = checkpoint(str(uuid.UUID(int=i)), messages=[f"{i} {big}"], step=i)
            cfg = s.put(cfg, cp, {"step": i}, dict(cp["channel_versions"]))
    # Closed: the WAL is moved into the file. A new saver, its cache empty, reads the file.
    with CtxkeepSaver(url) as s:
        before = _read_calls()
        got = list(s.list(config("t")))
        reads = _read_calls() - before
    assert [t.checkpoint["channel_values"]["step"] for t in got] == list(range(50, 0, -1))
    assert got[0].checkpoint["channel_values"]["messages"] == [f"50 {big}"]
    assert reads < 10


def test_writes_many_and_special_keep_their_rules(saver: CtxkeepSaver) -> None:  # noqa: F811
    """A regular write stored under (task, idx) is kept; a special one is replaced, the last
    of one call winning; more writes than one statement holds are all stored."""
    cfg = _first(saver)
    saver.put_writes(cfg, [("a", 1), ("__interrupt__", "first"), ("__interrupt__", "last")], "t1")
    saver.put_writes(cfg, [("a", 2), ("__error__", "boom")], "t1")
    saver.put_writes(cfg, [("__error__", "again")], "t1")
    many = [(f"ch{i}", i) for i in range(250)]
    saver.put_writes(cfg, many, "t2")
    got = saver.get_tuple(cfg)
    assert got is not None
    by_task = [(t, ch, v) for t, ch, v in got.pending_writes if t == "t1"]
    assert sorted(by_task, key=repr) == sorted(
        [("t1", "a", 1), ("t1", "__interrupt__", "last"), ("t1", "__error__", "again")], key=repr
    )
    assert [(ch, v) for t, ch, v in got.pending_writes if t == "t2"] == many


_: Callable[..., Any] = new_url  # the fixture, used through ``saver``


class _Counting:
    """A pooled PostgreSQL connection that notes each statement and transaction it runs."""

    def __init__(self, conn: Any, ran: list[str]) -> None:
        self._conn, self._ran = conn, ran

    def execute(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
        self._ran.append(str(sql).split()[0])
        return self._conn.execute(sql, *args, **kwargs)

    def transaction(self) -> Any:
        self._ran.append("BEGIN")
        return self._conn.transaction()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._conn, name, value)


@pytest.mark.postgres
def test_a_postgres_step_is_three_statements_and_no_transaction(
    postgres_schema_factory: Callable[[], str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On PostgreSQL each statement is a round trip: a checkpoint with its values is one
    statement, its writes one, a get_tuple one (the row and its writes); a large unchanged
    value, a blob, is written in the row's statement and read by one more."""
    from contextlib import contextmanager

    with CtxkeepSaver(postgres_schema_factory()) as s:
        client = s._backend.client  # type: ignore[attr-defined]
        ran: list[str] = []
        real = client.connection

        @contextmanager
        def counted(**kwargs: Any) -> Iterator[Any]:
            with real(**kwargs) as conn:
                yield _Counting(conn, ran)

        monkeypatch.setattr(client, "connection", counted)
        cfg = _first(s)
        assert ran == ["INSERT"]
        ran.clear()
        s.put_writes(cfg, [("messages", ["a"]), ("step", 2)], "task-1")
        assert ran == ["INSERT"]
        ran.clear()
        got = s.get_tuple(cfg)
        assert got is not None and len(got.pending_writes) == 2
        assert got.checkpoint["channel_values"] == {"messages": ["hi"], "step": 1}
        assert ran == ["SELECT"]
        big = "x" * 5000
        cp = checkpoint(str(uuid.UUID(int=2)), messages=["hi"], step=2, big=big)
        cfg = s.put(cfg, cp, {}, {"step": "2", "big": "1"})
        cp = checkpoint(str(uuid.UUID(int=3)), messages=["hi"], step=3, big=big)
        ran.clear()
        cfg = s.put(cfg, cp, {}, {"step": "3"})
        assert ran == ["WITH"]
        ran.clear()
        got = s.get_tuple(cfg)
        assert got is not None and got.checkpoint["channel_values"]["big"] == big
        assert ran == ["SELECT", "SELECT"]

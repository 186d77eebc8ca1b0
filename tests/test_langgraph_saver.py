"""CtxkeepSaver: LangGraph's own checkpointer conformance suite on every engine, and a real graph.

The suite (``langgraph-checkpoint-conformance``) makes a fresh saver for each capability: a new
SQLite file, a new Redis key prefix, a new PostgreSQL schema. Every capability, base and
extended, must be detected and pass on SQLite, PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import operator
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

import psycopg
import redis
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.errors import ConfigError, CorruptRecordError, InvalidTypeError, SchemaVersionError
from ctxkeep.integrations.langgraph import CtxkeepSaver

__all__ = [
    "postgres_schema_factory",
    "postgres_url",
    "redis_prefix_factory",
    "redis_url",
]  # fixtures, re-exported for pytest

ENGINES = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("redis", marks=pytest.mark.redis),
]


@pytest.fixture(params=ENGINES)
def new_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """URLs of fresh, empty stores of one engine (removed after the test)."""
    engine: str = request.param
    made = iter(range(1_000_000))
    if engine == "sqlite":
        return lambda: f"sqlite:///{tmp_path / f'lg-{next(made)}.db'}"
    if engine == "postgres":
        factory: Callable[[], str] = request.getfixturevalue("postgres_schema_factory")
        return factory
    url: str = request.getfixturevalue("redis_url")
    prefixes: Callable[[], str] = request.getfixturevalue("redis_prefix_factory")
    return lambda: f"{url}?prefix={prefixes()}"


@pytest.fixture
def saver(new_url: Callable[[], str]) -> Iterator[CtxkeepSaver]:
    with CtxkeepSaver(new_url()) as s:
        yield s


def config(thread_id: str, **more: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **more}}


# -- LangGraph's conformance suite --------------------------------------------------------------


def test_the_conformance_suite_passes_in_full(new_url: Callable[[], str]) -> None:
    @checkpointer_test(name="CtxkeepSaver")
    async def factory() -> AsyncIterator[CtxkeepSaver]:
        saver = CtxkeepSaver(new_url())
        try:
            yield saver
        finally:
            saver.close()

    report = asyncio.run(validate(factory))
    results = report.results
    assert {name for name, r in results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    failures = {name: r.failures for name, r in results.items() if r.passed is not True}
    assert failures == {}
    assert report.conformance_level() == "FULL"
    assert sum(r.tests_passed for r in results.values()) == 81


# -- a real graph -------------------------------------------------------------------------------


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def counting_graph() -> StateGraph[Log]:
    graph = StateGraph(Log)
    graph.add_node("step", lambda state: {"log": [f"step-{len(state['log'])}"]})
    graph.add_edge(START, "step")
    graph.add_edge("step", END)
    return graph


def test_a_graph_resumes_its_thread_from_a_new_saver(new_url: Callable[[], str]) -> None:
    url = new_url()
    with CtxkeepSaver(url) as first:
        graph = counting_graph().compile(checkpointer=first)
        assert graph.invoke({"log": ["a"]}, config("t1"))["log"] == ["a", "step-1"]
    with CtxkeepSaver(url) as second:  # as another process would, after a restart
        graph = counting_graph().compile(checkpointer=second)
        assert graph.invoke({"log": ["b"]}, config("t1"))["log"] == ["a", "step-1", "b", "step-3"]
        assert graph.invoke({"log": ["c"]}, config("t2"))["log"] == ["c", "step-1"]
        history = list(graph.get_state_history(config("t1")))
        assert [h.metadata["step"] for h in history if h.metadata] == [4, 3, 2, 1, 0, -1]


def test_an_interrupted_graph_resumes_with_the_answer_async(saver: CtxkeepSaver) -> None:
    class Chat(TypedDict):
        log: Annotated[list[str], operator.add]

    def ask(state: Chat) -> dict[str, list[str]]:
        answer = interrupt("what next?")
        return {"log": [f"answer:{answer}"]}

    builder = StateGraph(Chat)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    graph = builder.compile(checkpointer=saver)

    async def scenario() -> tuple[Any, Any, Any]:
        paused = await graph.ainvoke({"log": ["hi"]}, config("chat"))
        waiting = await graph.aget_state(config("chat"))
        done = await graph.ainvoke(Command(resume="go"), config("chat"))
        return paused, waiting, done

    paused, waiting, done = asyncio.run(scenario())
    assert [i.value for i in paused["__interrupt__"]] == ["what next?"]
    assert waiting.next == ("ask",)
    assert done["log"] == ["hi", "answer:go"]


def test_a_fork_leaves_the_original_branch_as_it_was(saver: CtxkeepSaver) -> None:
    graph = counting_graph().compile(checkpointer=saver)
    graph.invoke({"log": ["a"]}, config("fork"))
    original = graph.get_state(config("fork"))
    assert original.values["log"] == ["a", "step-1"]
    step0 = next(h for h in graph.get_state_history(config("fork")) if h.metadata["step"] == 0)
    forked = graph.update_state(step0.config, {"log": ["other"]})  # a sibling of `original`
    assert graph.invoke(None, forked)["log"] == ["a", "other", "step-2"]
    # The fork wrote the channel at the same depth: its versions must not reuse the original's.
    assert graph.get_state(original.config).values["log"] == ["a", "step-1"]


def stored(url: str) -> dict[str, int]:
    """How many checkpoints, channel values and writes a store holds, read behind the saver
    (on Redis, ``keys`` counts every key but the schema version's).
    """
    if url.startswith("redis"):
        base, prefix = url.split("?prefix=")
        with closing(redis.Redis.from_url(base, decode_responses=True)) as client:
            keys = [k for k in client.scan_iter(match=f"{prefix}*") if k != f"{prefix}meta"]
            return {
                "checkpoints": sum(":checkpoint:" in k for k in keys),
                "blobs": sum(client.hlen(k) for k in keys if k.endswith(":blobs")),
                "writes": sum(client.hlen(k) for k in keys if ":writes:" in k),
                "keys": len(keys),
            }
    counts = {}
    for table in ("checkpoints", "blobs", "writes"):
        sql = f"SELECT count(*) FROM ctxkeep_lg_{table}"
        if url.startswith("sqlite"):
            with closing(sqlite3.connect(url[len("sqlite:///") :])) as conn:
                counts[table] = conn.execute(sql).fetchone()[0]
        else:
            with psycopg.connect(url) as conn:
                counts[table] = conn.execute(sql).fetchone()[0]
    return counts


SAME = "same " * 500
"""An unchanged value too large for SQL rows to copy (``INLINE_UNCHANGED``): a blob there."""


def blobs_of_chain(url: str) -> int:
    """The blobs a :func:`put_chain` stores: on SQL, y's once (x's and y's first value are in
    their rows); on Redis, each version's value."""
    return 4 if url.startswith("redis") else 1


def put_chain(saver: CtxkeepSaver, thread_id: str, ns: str = "") -> list[Any]:
    """Three checkpoints: x changes at each, y only at the first; a write on each."""
    parent: Any = config(thread_id, checkpoint_ns=ns)
    made = []
    for i in range(3):
        cp = checkpoint(f"c{i}", x=i, y=SAME)
        cp["channel_versions"] = {"x": f"{i + 1}", "y": "1"}
        new = {"x": f"{i + 1}", "y": "1"} if i == 0 else {"x": f"{i + 1}"}
        parent = saver.put(parent, cp, {"step": i, "run_id": f"run-{i}"}, new)
        saver.put_writes(parent, [("x", i), ("__error__", "boom")], f"task-{i}")
        made.append(parent)
    return made


def test_deleting_a_thread_leaves_nothing_behind(new_url: Callable[[], str]) -> None:
    url = new_url()
    with CtxkeepSaver(url) as s:
        put_chain(s, "gone")
        put_chain(s, "gone", ns="child:1")
        put_chain(s, "kept")
        before = stored(url)
        per_chain = blobs_of_chain(url)
        assert (before["checkpoints"], before["blobs"], before["writes"]) == (9, 3 * per_chain, 18)
        s.delete_thread("gone")
        after = stored(url)
        assert (after["checkpoints"], after["blobs"], after["writes"]) == (3, per_chain, 6)
        assert s.get_tuple(config("kept")) is not None
        s.delete_thread("kept")
        assert set(stored(url).values()) == {0}  # on Redis: no set, index or run key either


def test_keep_latest_keeps_only_what_the_newest_checkpoint_needs(
    new_url: Callable[[], str],
) -> None:
    url = new_url()
    with CtxkeepSaver(url) as s:
        made = put_chain(s, "p")
        s.prune(["p"])
        after = stored(url)
        kept_blobs = 1 if blobs_of_chain(url) == 1 else 2  # y's on SQL; x's newest and y's
        assert (after["checkpoints"], after["blobs"], after["writes"]) == (1, kept_blobs, 2)
        latest = s.get_tuple(config("p", checkpoint_ns=""))
        assert latest is not None and latest.config == made[-1]
        assert latest.checkpoint["channel_values"] == {"x": 2, "y": SAME}
        assert latest.pending_writes == [("task-2", "__error__", "boom"), ("task-2", "x", 2)]
        s.delete_for_runs(["run-2"])  # the run index of pruned checkpoints is gone too
        assert s.get_tuple(config("p", checkpoint_ns="")) is None


def _view(t: Any) -> Any:
    """What a read returns of one checkpoint, comparable."""
    return (t.config, t.parent_config, t.checkpoint, t.metadata, t.pending_writes)


@pytest.mark.parametrize("chunk", [1, 2, 400])
def test_a_list_reads_in_bulk_what_each_get_tuple_reads_alone(
    new_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Two threads, two namespaces, channels shared between checkpoints: a list (blobs and
    writes read by chunks of ``chunk`` keys on SQL) returns each checkpoint as its own
    get_tuple does."""
    from ctxkeep.integrations.langgraph import _saver_sql

    monkeypatch.setattr(_saver_sql, "CHUNK", chunk)
    with CtxkeepSaver(new_url()) as s:
        made = [*put_chain(s, "t1"), *put_chain(s, "t1", ns="child:1"), *put_chain(s, "t2")]
        listed = {
            t.config["configurable"]["checkpoint_id"] + str(t.config): t for t in s.list(None)
        }
        assert len(listed) == len(made) == 9
        for cfg in made:
            alone = s.get_tuple(cfg)
            assert alone is not None
            assert _view(listed[cfg["configurable"]["checkpoint_id"] + str(alone.config)]) == _view(
                alone
            )
            assert alone.checkpoint["channel_values"]["y"] == SAME
            assert len(alone.pending_writes) == 2
        assert [_view(t) for t in s.list(config("t1"), limit=2)] == [
            _view(t) for t in list(s.list(config("t1")))[:2]
        ]


@pytest.mark.parametrize("chunk", [1, 400])
def test_a_list_of_rows_holding_their_values_reads_what_get_tuple_reads(
    new_url: Callable[[], str], monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Rows that hold all their values (no blob: decoded as the list hands them over), in two
    threads and two namespaces, with no write, one or three: every list, whole, filtered
    (writes read by chunks of ``chunk`` ids), limited or before a checkpoint, returns each
    checkpoint as its own get_tuple does, newest first, with its writes alone."""
    from ctxkeep.integrations.langgraph import _saver_sql

    monkeypatch.setattr(_saver_sql, "CHUNK", chunk)
    with CtxkeepSaver(new_url()) as s:
        made = []
        for thread, ns in (("t1", ""), ("t1", "child:1"), ("t2", "")):
            parent: Any = config(thread, checkpoint_ns=ns)
            for i in range(5):
                cp = checkpoint(f"c{i}", x=i)
                cp["channel_versions"] = {"x": f"{i + 1}"}
                parent = s.put(parent, cp, {"step": i, "odd": i % 2}, {"x": f"{i + 1}"})
                writes = [(f"w{j}", f"{thread}/{ns}/{i}/{j}") for j in range(i % 3)]
                if writes:
                    s.put_writes(parent, writes, f"task-{i}")
                made.append(parent)

        def alone(t: Any) -> Any:
            found = s.get_tuple(t.config)
            assert found is not None
            assert [w[2] for w in found.pending_writes] == [
                f"{t.config['configurable']['thread_id']}/{t.config['configurable']['checkpoint_ns']}"
                f"/{t.metadata['step']}/{j}"
                for j in range(t.metadata["step"] % 3)
            ]
            return _view(found)

        every = list(s.list(None))
        assert len(every) == len(made) == 15
        assert [_view(t) for t in every] == [alone(t) for t in every]
        ids = [t.config["configurable"]["checkpoint_id"] for t in every]
        assert ids == sorted(ids, reverse=True)
        odd = list(s.list(config("t1"), filter={"odd": 1}, limit=3))
        assert [(t.config["configurable"]["checkpoint_ns"], t.metadata["step"]) for t in odd] == [
            ("", 3),
            ("child:1", 3),
            ("", 1),
        ]
        assert [_view(t) for t in odd] == [alone(t) for t in odd]
        first = list(s.list(config("t2"), limit=2))
        assert [t.metadata["step"] for t in first] == [4, 3]
        before = list(s.list(config("t2"), before=made[-2]))
        assert [t.metadata["step"] for t in before] == [2, 1, 0]
        assert [_view(t) for t in first + before] == [alone(t) for t in first + before]


def test_a_checkpoint_of_many_channels_is_read_back_whole(new_url: Callable[[], str]) -> None:
    """More channels than one blob INSERT holds (``BLOB_ROWS``): every value comes back, by id
    and as the newest, and a later checkpoint that changes one channel keeps the others'."""
    from ctxkeep.integrations.langgraph._saver_sql import BLOB_ROWS

    n = BLOB_ROWS * 2 + 7
    values = {f"ch{i}": {"i": i, "text": "x" * (i % 5)} for i in range(n)}
    with CtxkeepSaver(new_url()) as s:
        first = {**checkpoint(str(uuid.UUID(int=1)), **values)}
        versions = dict(first["channel_versions"])
        cfg1 = s.put(config("many"), first, {"step": 1}, versions)
        second = checkpoint(str(uuid.UUID(int=2)), **{**values, "ch3": "changed"})
        second["channel_versions"] = {**versions, "ch3": "2"}
        cfg2 = s.put(cfg1, second, {"step": 2}, {"ch3": "2"})
        by_id = s.get_tuple(cfg1)
        newest = s.get_tuple(config("many"))
        assert by_id is not None and newest is not None
        assert by_id.checkpoint["channel_values"] == values
        assert newest.config == cfg2
        assert newest.parent_config == cfg1
        assert newest.checkpoint["channel_values"] == {**values, "ch3": "changed"}


# -- schema versions ------------------------------------------------------------------------------


def test_a_store_of_a_newer_schema_is_refused(new_url: Callable[[], str]) -> None:
    url = new_url()
    CtxkeepSaver(url).close()  # creates the tables and records version 1
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url[len("sqlite:///") :])) as conn, conn:
            conn.execute("UPDATE ctxkeep_meta SET value = '99' WHERE key = 'langgraph'")
    elif url.startswith("postgresql"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE ctxkeep_meta SET value = '99' WHERE key = 'langgraph'")
    else:
        base, prefix = url.split("?prefix=")
        with closing(redis.Redis.from_url(base)) as client:
            client.hset(f"{prefix}meta", "langgraph", "99")
    with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
        CtxkeepSaver(url)


def _old_layout(url: str) -> None:
    """Three checkpoints of thread ``old`` as schema 1 stored them (every channel value a blob
    of its version, the checkpoint without values; an ``empty`` blob for a version with no
    value), written behind the saver into tables made at schema 1."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from ctxkeep.integrations.langgraph._saver_sql import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS
    from ctxkeep.integrations.langgraph.saver import META_KEY

    serde = JsonPlusSerializer()
    cps, blobs, writes = [], [], []
    for i in range(3):
        versions = {"x": f"{i + 1}", "y": "1", **({"e": "1"} if i else {})}
        cp = {k: v for k, v in checkpoint(f"c{i}").items() if k != "channel_values"}
        cp["channel_versions"] = versions
        parent = f"c{i - 1}" if i else None
        md = serde.dumps_typed({"step": i})
        cps.append(("old", "", f"c{i}", parent, None, *serde.dumps_typed(cp), *md))
        blobs.append(("old", "", "x", f"{i + 1}", *serde.dumps_typed(i)))
        writes.append(("old", "", f"c{i}", "task", 0, "x", *serde.dumps_typed(i * 10), ""))
    blobs += [("old", "", "y", "1", *serde.dumps_typed(SAME)), ("old", "", "e", "1", "empty", b"")]
    inserts = [
        ("ctxkeep_lg_checkpoints", cps),
        ("ctxkeep_lg_blobs", blobs),
        ("ctxkeep_lg_writes", writes),
    ]
    if url.startswith("sqlite"):
        from ctxkeep._sqlite import SQLiteClient

        path = url[len("sqlite:///") :]
        SQLiteClient(path, meta_key=META_KEY, migrations=SQLITE_MIGRATIONS[:1]).close()
        with closing(sqlite3.connect(path)) as conn, conn:
            for table, rows in inserts:
                conn.executemany(
                    f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows
                )
        return
    from ctxkeep._pg import PgClient

    PgClient(url, name="old", meta_key=META_KEY, migrations=POSTGRES_MIGRATIONS[:1]).close()
    with psycopg.connect(url) as pg:
        for table, rows in inserts:
            pg.cursor().executemany(
                f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(rows[0]))})", rows
            )


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_checkpoints_stored_at_schema_1_read_back_after_the_upgrade(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Schema 2 keeps values in the checkpoint's row; rows of schema 1 (values all blobs)
    read back as they did, and a thread of them goes on in the new layout."""
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
    else:
        url = request.getfixturevalue("postgres_schema_factory")()
    _old_layout(url)
    with CtxkeepSaver(url) as s:
        listed = list(s.list(config("old")))
        assert [t.checkpoint["id"] for t in listed] == ["c2", "c1", "c0"]
        assert [t.checkpoint["channel_values"] for t in listed] == [
            {"x": i, "y": SAME} for i in (2, 1, 0)
        ]
        assert [t.pending_writes for t in listed] == [[("task", "x", i * 10)] for i in (2, 1, 0)]
        assert [t.metadata for t in listed] == [{"step": i} for i in (2, 1, 0)]
        newest = s.get_tuple(config("old"))
        assert newest is not None and _view(newest) == _view(listed[0])
        cp = checkpoint("c3", x=3, y=SAME)
        cp["channel_versions"] = {"x": "4", "y": "1", "e": "1"}
        s.put(newest.config, cp, {"step": 3}, {"x": "4"})
        went_on = s.get_tuple(config("old"))
        assert went_on is not None and went_on.checkpoint["channel_values"] == {"x": 3, "y": SAME}
        assert went_on.parent_config == newest.config
        assert _view(s.get_tuple(listed[2].config)) == _view(listed[2])
    assert stored(url)["blobs"] == 5  # the old ones; y's blob taken as it was


def _sql_rows(url: str, sql: str) -> list[Any]:
    """Rows of a statement run behind the saver on its SQLite file or PostgreSQL schema."""
    if url.startswith("sqlite"):
        with closing(sqlite3.connect(url[len("sqlite:///") :])) as conn:
            return conn.execute(sql).fetchall()
    with psycopg.connect(url) as pg:
        return pg.execute(sql).fetchall()


def _sql_url(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if engine == "sqlite":
        return f"sqlite:///{tmp_path / 'lg.db'}"
    url: str = request.getfixturevalue("postgres_schema_factory")()
    return url


def _run_index(url: str) -> str:
    """The run index's definition."""
    if url.startswith("sqlite"):
        sql = "SELECT sql FROM sqlite_master WHERE name = 'ctxkeep_lg_checkpoints_run'"
    else:
        sql = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ctxkeep_lg_checkpoints_run'"
    (found,) = _sql_rows(url, sql)
    return str(found[0])


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_sql_row_holds_its_checkpoint_id_once(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Schema 3: the row's checkpoint is stored with an empty id (its ``checkpoint_id`` column
    says it) and read back with it, in its place; the run index has no entry for a row
    without a run id."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    url = _sql_url(engine, tmp_path, request)
    with CtxkeepSaver(url) as s:
        cp = checkpoint("c1", x=1)
        cfg = s.put(config("t", checkpoint_ns=""), cp, {"step": 1}, {"x": "1"})
        (raw,) = _sql_rows(url, "SELECT type, checkpoint FROM ctxkeep_lg_checkpoints")
        assert JsonPlusSerializer().loads_typed((raw[0], bytes(raw[1])))["id"] == ""
        got = s.get_tuple(cfg)
        assert got is not None and list(got.checkpoint) == list(cp)
        assert got.checkpoint == cp
        assert [t.checkpoint for t in s.list(config("t"))] == [cp]
    assert "WHERE" in _run_index(url).upper()


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_checkpoints_stored_at_schema_2_read_back_after_the_upgrade(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A row of schema 2 holds its id in its checkpoint: read back as it was; the run index
    is remade partial, and a run's checkpoints are still found by it."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from ctxkeep.integrations.langgraph._saver_sql import POSTGRES_MIGRATIONS, SQLITE_MIGRATIONS
    from ctxkeep.integrations.langgraph.saver import META_KEY

    url = _sql_url(engine, tmp_path, request)
    serde = JsonPlusSerializer()
    rows = [
        (
            *("t", "", f"c{i}", f"c{i - 1}" if i else None, f"run-{i % 2}"),
            *serde.dumps_typed(checkpoint(f"c{i}", x=i)),
            *serde.dumps_typed({"step": i}),
            "",
        )
        for i in range(3)
    ]
    insert = "INSERT INTO ctxkeep_lg_checkpoints VALUES ({})"
    if engine == "sqlite":
        from ctxkeep._sqlite import SQLiteClient

        path = url[len("sqlite:///") :]
        SQLiteClient(path, meta_key=META_KEY, migrations=SQLITE_MIGRATIONS[:2]).close()
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.executemany(insert.format(", ".join("?" * 10)), rows)
    else:
        from ctxkeep._pg import PgClient

        PgClient(url, name="old", meta_key=META_KEY, migrations=POSTGRES_MIGRATIONS[:2]).close()
        with psycopg.connect(url) as pg:
            pg.cursor().executemany(insert.format(", ".join(["%s"] * 10)), rows)
    assert "WHERE" not in _run_index(url).upper()
    with CtxkeepSaver(url) as s:
        assert [t.checkpoint for t in s.list(config("t"))] == [
            checkpoint(f"c{i}", x=i) for i in (2, 1, 0)
        ]
        s.delete_for_runs(["run-1"])
        assert [t.checkpoint["id"] for t in s.list(config("t"))] == ["c2", "c0"]
    assert "WHERE" in _run_index(url).upper()
    meta = "SELECT value FROM ctxkeep_meta WHERE key = 'langgraph'"
    assert _sql_rows(url, meta) == [("3",)]


# -- bad input -------------------------------------------------------------------------------------


@pytest.fixture
def sqlite_saver(tmp_path: Path) -> Iterator[CtxkeepSaver]:
    with CtxkeepSaver(f"sqlite:///{tmp_path / 'lg.db'}") as s:
        yield s


@pytest.mark.parametrize(
    "url", ["memory://", "mysql://localhost/db", "sqlite:///", "sqlite://x", "sqlite:///:memory:"]
)
def test_an_unsupported_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        CtxkeepSaver(url)


def test_no_url_means_the_embedded_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_DB", str(tmp_path / "default.db"))
    with CtxkeepSaver() as s:
        s.put(config("d", checkpoint_ns=""), checkpoint("c1"), {"step": 0}, {})
    assert (tmp_path / "default.db").exists()


def checkpoint(checkpoint_id: str, **values: Any) -> Any:
    return {
        "v": 1,
        "id": checkpoint_id,
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": values,
        "channel_versions": dict.fromkeys(values, "1"),
        "versions_seen": {},
        "updated_channels": None,
    }


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({}, ConfigError),
        ({"configurable": {}}, ConfigError),
        ("thread", InvalidTypeError),
        ({"configurable": {"thread_id": 1.5}}, InvalidTypeError),
        ({"configurable": {"thread_id": True}}, InvalidTypeError),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": 3}}, InvalidTypeError),
        ({"configurable": {"thread_id": "t\x00"}}, ConfigError),
    ],
    ids=[
        "no-configurable",
        "no-thread",
        "not-a-mapping",
        "float-thread",
        "bool-thread",
        "int-ns",
        "nul",
    ],
)
def test_a_malformed_config_gets_a_typed_error(
    sqlite_saver: CtxkeepSaver, bad: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        sqlite_saver.get_tuple(bad)
    with pytest.raises(error):
        sqlite_saver.put(bad, checkpoint("c1"), {}, {})


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        (("t", "n\x00", "c"), "checkpoint_ns"),
        (("t", "", "c\x00"), "checkpoint_id"),
        (("t", "", "\ud800"), "checkpoint_id"),
        (("", "", "c"), "thread_id"),
    ],
    ids=["nul-ns", "nul-id", "surrogate-id", "empty-thread"],
)
def test_a_bad_id_beside_two_good_ones_is_refused_by_name(
    sqlite_saver: CtxkeepSaver, ids: tuple[str, str, str], named: str
) -> None:
    """A config naming a thread, a namespace and a checkpoint (a step's) is checked at once;
    one bad id among them is refused as when each is checked alone, naming it."""
    thread_id, ns, cid = ids
    bad = config(thread_id, checkpoint_ns=ns, checkpoint_id=cid)
    for call in (
        lambda: sqlite_saver.get_tuple(bad),
        lambda: sqlite_saver.put_writes(bad, [("messages", "a")], "task-1"),
        lambda: sqlite_saver.put(bad, checkpoint("c2"), {}, {}),
    ):
        with pytest.raises(ConfigError, match=named):
            call()


def test_an_int_or_uuid_thread_id_is_kept_as_text(sqlite_saver: CtxkeepSaver) -> None:
    thread = uuid.uuid4()
    for given in (7, thread):
        stored = sqlite_saver.put(config(given, checkpoint_ns=""), checkpoint("c1"), {}, {})
        assert stored["configurable"]["thread_id"] == str(given)
        found = sqlite_saver.get_tuple(config(str(given)))
        assert found is not None and found.config == stored


def test_other_bad_arguments_get_typed_errors(sqlite_saver: CtxkeepSaver) -> None:
    with pytest.raises(ConfigError, match="strategy"):
        sqlite_saver.prune(["t"], strategy="keep_some")
    with pytest.raises(InvalidTypeError, match="thread_ids"):
        sqlite_saver.prune("t")
    with pytest.raises(ConfigError, match="checkpoint_id"):
        sqlite_saver.put_writes(config("t", checkpoint_ns=""), [("ch", 1)], "task")
    with pytest.raises(InvalidTypeError, match="writes"):
        sqlite_saver.put_writes(config("t", checkpoint_id="c1"), ["ch"], "task")
    with pytest.raises(ConfigError, match="limit"):
        list(sqlite_saver.list(None, limit=-1))
    with pytest.raises(InvalidTypeError, match="cannot be serialized"):
        sqlite_saver.put(config("t", checkpoint_ns=""), checkpoint("c1", x=object()), {}, {"x": 2})
    assert sqlite_saver.get_tuple(config("t")) is None  # nothing stored


def test_a_corrupt_stored_value_is_refused(sqlite_saver: CtxkeepSaver, tmp_path: Path) -> None:
    first = sqlite_saver.put(
        config("t", checkpoint_ns=""), checkpoint("c1", x=SAME), {}, {"x": "1"}
    )
    stored = sqlite_saver.put(first, checkpoint("c2", x=SAME), {}, {})  # x: a blob
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        conn.execute("UPDATE ctxkeep_lg_blobs SET type = 'msgpack', blob = x'c1'")
    with pytest.raises(CorruptRecordError, match="channel 'x'"):
        sqlite_saver.get_tuple(stored)
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        conn.execute("UPDATE ctxkeep_lg_checkpoints SET type = 'msgpack', checkpoint = x'c1'")
    with pytest.raises(CorruptRecordError, match="checkpoint cannot be decoded"):
        sqlite_saver.get_tuple(first)
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        conn.execute("DELETE FROM ctxkeep_lg_checkpoints")
    third = sqlite_saver.put(config("u", checkpoint_ns=""), checkpoint("c3"), {}, {})
    sqlite_saver.put_writes(third, [("messages", 1)], "task")
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        conn.execute("UPDATE ctxkeep_lg_writes SET type = 'msgpack', blob = x'c1'")
    with pytest.raises(CorruptRecordError, match="write to 'messages' cannot be decoded"):
        sqlite_saver.get_tuple(third)
    with pytest.raises(CorruptRecordError, match="write to 'messages' cannot be decoded"):
        list(sqlite_saver.list(config("u")))
    with closing(sqlite3.connect(tmp_path / "lg.db")) as conn, conn:
        conn.execute(
            "UPDATE ctxkeep_lg_checkpoints SET metadata_type = 'msgpack', metadata = x'c1'"
        )
    with pytest.raises(CorruptRecordError, match="checkpoint metadata cannot be decoded"):
        sqlite_saver.get_tuple(third)

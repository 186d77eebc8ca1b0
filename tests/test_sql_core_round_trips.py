"""Round trips of the SQL session core on PostgreSQL, counted on the wire (libpq's trace of
the protocol: every round trip ends with the server's ``ReadyForQuery``), and the session
policy of a prompt built from its own snapshot's row (issues 26 and 28).

A snapshot read begins as ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY`` (no ``SET
TRANSACTION`` after it), and :meth:`MemoryManager.build_prompt` makes its TTL test and touch
on the row its snapshot read (no read of the row before it).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from _round_trips import pg_wire
from conftest_services import postgres_schema_factory, postgres_url  # noqa: F401
from ctxkeep import MemoryConfig, MemoryManager, Message, SessionNotFoundError
from ctxkeep.prune import TokenPruner
from ctxkeep.sessions.memory import MemoryBackend
from ctxkeep.sessions.sqlite import SQLiteBackend

psycopg = pytest.importorskip("psycopg")

from ctxkeep._pg import REPEATABLE_READ, PgClient  # noqa: E402
from ctxkeep.sessions.postgres import MIGRATIONS, PostgresBackend  # noqa: E402


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def own_pool(url: str) -> str:
    """``url`` with an ``application_name`` of its own: a pool of its own (pools are shared
    per address), so the one connection traced is the only one the backend uses.
    """
    return url + ("&" if "?" in url else "?") + f"application_name=rt_{uuid.uuid4().hex[:8]}"


class Wire:
    """The protocol messages of a backend's one pooled connection, as libpq traces them."""

    def __init__(self, backend: PostgresBackend) -> None:
        self.pool = backend._pg.pool
        self.conn: Any = None

    @contextmanager
    def traced(self) -> Iterator[list[str]]:
        """Trace the connection meanwhile; the list gets the frontend's messages and the
        server's ``ReadyForQuery``, one line each.
        """
        with self.pool.connection() as conn:
            self.conn = conn
        lines: list[str] = []
        with pg_wire(self.pool) as wire:
            yield lines
        lines.extend(rest for way, rest in wire if way == "F" or rest.startswith("ReadyForQuery"))


def round_trips(lines: list[str]) -> int:
    return sum(line.startswith("ReadyForQuery") for line in lines)


@pytest.fixture
def pg(postgres_schema_factory: Callable[[], str]) -> Iterator[tuple[MemoryManager, Wire, Clock]]:  # noqa: F811
    """A manager over PostgreSQL with one pooled connection, traced by the test."""
    clock = Clock()
    backend = PostgresBackend(own_pool(postgres_schema_factory()), min_size=1, max_size=1)
    mem = MemoryManager(backend, MemoryConfig(max_history=None), clock=clock)
    try:
        yield mem, Wire(backend), clock
    finally:
        mem.close()


def test_a_snapshot_begins_repeatable_read_read_only_in_one_statement(pg: Any) -> None:
    mem, wire, _ = pg
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    with wire.traced() as lines:
        snap = mem.backend.read(sid)
    assert snap is not None and [r["content"] for _, r in snap[1]] == ["hi"]
    queries = [line for line in lines if line.startswith("Query")]
    assert queries[0] == 'Query\t "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"'
    assert not any("SET TRANSACTION" in line for line in lines)
    # BEGIN, the session row, the messages, COMMIT
    assert round_trips(lines) == 4


@pytest.mark.parametrize(
    "pruner",
    [None, TokenPruner(10_000, cache_stable=False), TokenPruner(10_000)],
    ids=["whole", "pages", "fold"],
)
def test_a_prompt_build_reads_the_session_row_once(pg: Any, pruner: Any) -> None:
    mem, wire, clock = pg
    sid = mem.create_session("a")
    for i in range(5):
        mem.add_message(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
    mem.build_prompt(sid, pruner=pruner)  # warm: the prompt cache holds the session
    clock.now += 0.1  # within the touch resolution: no access-time write
    with wire.traced() as lines:
        prompt = mem.build_prompt(sid, system="be brief", pruner=pruner)
    assert [m.content for m in prompt.messages] == ["be brief", "m0", "m1", "m2", "m3", "m4"]
    # One statement (the row and the messages since the cached ones: NEWER_SQL, which sees
    # one snapshot by itself) and nothing else: no read of the row outside it, no transaction.
    assert round_trips(lines) == 1, lines
    assert sum("FROM ctxkeep_sessions" in line for line in lines) == 1


def test_a_due_touch_is_one_round_trip_more(pg: Any) -> None:
    mem, wire, clock = pg
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    mem.build_prompt(sid)
    clock.now += 60  # past the touch resolution: the access time is written
    with wire.traced() as lines:
        prompt = mem.build_prompt(sid)
    assert round_trips(lines) == 2, lines
    assert prompt.info.accessed_at == clock.now
    assert mem.backend.info(sid, touch=None, ttl=None).accessed_at == clock.now


def test_the_pooled_connection_begins_as_before_after_a_snapshot(pg: Any) -> None:
    mem, wire, _ = pg
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    with pytest.raises(RuntimeError), mem.backend.snapshot("read") as conn:
        conn.execute("SELECT 1")
        raise RuntimeError("the caller fails inside the snapshot")
    mem.backend.read(sid)
    with wire.traced() as lines:
        mem.add_message(sid, "user", "again")  # a write: its transaction is not read only
        mem.backend.remove_oldest(sid, 1, mem.get_session(sid).generation)
    assert all(q.endswith('"BEGIN"') for q in lines if q.startswith('Query\t "BEGIN'))
    assert wire.conn.isolation_level is None and wire.conn.read_only is None
    assert [m.content for m in mem.get_messages(sid)] == ["again"]


def test_tx_sets_the_connection_back_even_when_the_body_fails(
    postgres_schema_factory: Callable[[], str],  # noqa: F811
) -> None:
    client = PgClient(
        own_pool(postgres_schema_factory()),
        name="t",
        meta_key="sessions",
        migrations=MIGRATIONS,
        max_size=1,
    )
    try:
        with (
            pytest.raises(ZeroDivisionError),
            client.tx("t", isolation=REPEATABLE_READ, read_only=True) as conn,
        ):
            level = conn.execute("SHOW transaction_isolation").fetchone()[0]
            ro = conn.execute("SHOW transaction_read_only").fetchone()[0]
            1 / 0  # noqa: B018
        assert (level, ro) == ("repeatable read", "on")
        with client.tx("t") as conn:
            assert conn.execute("SHOW transaction_isolation").fetchone()[0] == "read committed"
            assert conn.execute("SHOW transaction_read_only").fetchone()[0] == "off"
            assert (conn.isolation_level, conn.read_only) == (None, None)
    finally:
        client.close()


# -- the session policy of build_prompt, on every SQL backend and in process ----------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def manager(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[MemoryManager, Clock]]:
    clock = Clock()
    if request.param == "memory":
        backend: Any = MemoryBackend()
    elif request.param == "sqlite":
        backend = SQLiteBackend(tmp_path / "s.db")
    else:
        factory = request.getfixturevalue("postgres_schema_factory")
        backend = PostgresBackend(factory())
    evicted: list[Any] = []
    mem = MemoryManager(
        backend,
        MemoryConfig(session_ttl=100.0),
        clock=clock,
        on_evict=evicted.append,
    )
    mem.evicted = evicted  # type: ignore[attr-defined]
    try:
        yield mem, clock
    finally:
        mem.close()


class Failing(TokenPruner):
    """A pruner that fails on every prompt (the budget of a real one, exceeded)."""

    def prune_with_report(self, messages: Any) -> Any:
        raise ValueError("over budget")

    def read_prompt(self, *args: Any) -> Any:
        return None


@pytest.mark.parametrize(
    "pruner",
    [None, TokenPruner(10_000, cache_stable=False), TokenPruner(10_000), Failing(10_000)],
    ids=["whole", "pages", "fold", "failing"],
)
def test_a_prompt_of_an_expired_session_reclaims_it(manager: Any, pruner: Any) -> None:
    mem, clock = manager
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    clock.now += 101
    with pytest.raises(SessionNotFoundError):
        mem.build_prompt(sid, pruner=pruner)
    assert not mem.has_session(sid)
    assert [m.content for e in mem.evicted for m in e.messages] == ["hi"]
    assert [m.content for m in mem.archived_messages(sid)] == ["hi"]


@pytest.mark.parametrize(
    "pruner", [None, TokenPruner(10_000, cache_stable=False), TokenPruner(10_000)]
)
def test_a_prompt_is_an_access(manager: Any, pruner: Any) -> None:
    mem, clock = manager
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    for _ in range(3):  # each prompt, 60 s after the last, keeps the session alive
        clock.now += 60
        prompt = mem.build_prompt(sid, pruner=pruner)
        assert prompt.info.accessed_at == clock.now
        assert [m.content for m in prompt.messages] == ["hi"]
    assert mem.has_session(sid) and mem.evicted == []


def test_a_failing_prune_still_touches_the_session(manager: Any) -> None:
    mem, clock = manager
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    clock.now += 60
    with pytest.raises(ValueError, match="over budget"):
        mem.build_prompt(sid, pruner=Failing(10_000))
    clock.now += 60  # 120 s after the add, 60 s after the failed prompt
    assert mem.has_session(sid)


def test_a_prompt_of_no_session_is_not_found(manager: Any) -> None:
    mem, _ = manager
    with pytest.raises(SessionNotFoundError):
        mem.build_prompt("nope", pruner=TokenPruner(10_000))


# -- an append copies what it must, and no more ------------------------------------------------


def test_an_add_keeps_no_link_to_the_callers_message(manager: Any) -> None:
    mem, _ = manager
    sid = mem.create_session("a")
    given = Message("user", [{"type": "text", "text": "hi"}], metadata={"k": [1]}, extra={"x": {}})
    stored = mem.add_messages(sid, [given])[0]
    assert stored.content is not given.content and stored.metadata is not given.metadata
    assert stored.extra is not given.extra
    given.content[0]["text"] = "changed"
    given.metadata["k"].append(2)
    given.extra["x"]["y"] = 1
    mem.add_messages_creating(sid, "a", [given])
    given.metadata["k"].append(3)
    got = mem.get_messages(sid)
    assert [m.content[0]["text"] for m in got] == ["hi", "changed"]
    assert [m.metadata for m in got] == [{"k": [1]}, {"k": [1, 2]}]
    assert [m.extra for m in got] == [{"x": {}}, {"x": {"y": 1}}]


def test_an_add_that_keeps_nothing_deep_copies_nothing(
    manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    mem, _ = manager
    sid = mem.create_session("a")
    nested = {"lc": {"type": "human", "additional_kwargs": {"a": [1, {"b": 2}]}}}
    copies: list[Any] = []
    real = copy.deepcopy

    def counted(x: Any, *args: Any) -> Any:
        copies.append(x)
        return real(x, *args)

    given = [Message("user", f"m{i}", extra=nested) for i in range(3)]
    monkeypatch.setattr(copy, "deepcopy", counted)
    for m in given:
        mem.add_messages_creating(sid, "a", [m])
    monkeypatch.setattr(copy, "deepcopy", real)
    assert copies == []
    assert [m.extra for m in mem.get_messages(sid)] == [nested] * 3


# -- the server's work per append ----------------------------------------------------------------


def test_a_postgres_append_fires_no_trigger_and_a_delete_leaves_no_message(pg: Any) -> None:
    mem, _, _ = pg
    sid = mem.create_session("a")
    mem.add_message(sid, "user", "hi")
    with mem.backend._pg.connection() as conn:
        keys = conn.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' "
            "AND conrelid = 'ctxkeep_messages'::regclass"
        ).fetchall()
        # the insert of a message checks no key (no after-trigger locking the session row)
        assert keys == []
        sql = (
            "EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO ctxkeep_messages "
            "(session_id, seq, record) VALUES (%s, 99, '{}')"
        )
        plan = conn.execute(sql, (sid,)).fetchone()[0][0]
        assert plan.get("Triggers", []) == []
        conn.execute("DELETE FROM ctxkeep_messages WHERE seq = 99")
    mem.add_message(sid, "assistant", "hello")
    assert mem.delete_session(sid)
    with mem.backend._pg.connection() as conn:
        left = conn.execute("SELECT count(*) FROM ctxkeep_messages WHERE session_id = %s", (sid,))
        assert left.fetchone()[0] == 0

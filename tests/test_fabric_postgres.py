"""The PostgreSQL bus and task state, against a real PostgreSQL: what only they do (processes
sharing membership, waking on ``NOTIFY``, dead consumers, a receiver killed with SIGKILL, two
processes racing a compare-and-set, dead letters, exactly-once effects, versions of the
tables) and the service on them. The delivery rules every bus keeps are checked for this bus
too by ``tests/contract/test_bus_contract.py``.

Every test works in its own schema, dropped afterwards. Without PostgreSQL the tests skip with
the reason, unless ``CTXKEEP_REQUIRE_SERVICES=1`` makes that a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _fabric_pg_server import postgres_server_url
from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep import ContextFabric, IPCMessage, StaleTaskStateError
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidMessageError,
    InvalidTypeError,
    SchemaVersionError,
    StorageError,
    UnknownAgentError,
)

if importlib.util.find_spec("psycopg") is None:  # as conftest_services does for the server
    _REASON = "psycopg is not installed: pip install 'ctxkeep[postgres]'"
    if os.environ.get("CTXKEEP_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{_REASON} (CTXKEEP_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(_REASON, allow_module_level=True)

import psycopg

from ctxkeep.fabric.postgres import PostgresBus, PostgresTaskState
from ctxkeep.server.fabric import PostgresFabric
from test_server_api import Api, _key
from test_server_memory_api import make_app, problem

pytestmark = pytest.mark.postgres

__all__ = ["postgres_schema_factory", "postgres_server_url", "postgres_url"]

PROC = Path(__file__).with_name("_fabric_pg_proc.py")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_agents.py"
WAIT = 30.0  # seconds any one step may take before the test gives up

MakeBus = Callable[..., PostgresBus]


class Crash(Exception):
    """Stands in for a process dying inside a handler."""


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def url(postgres_schema_factory: Callable[[], str]) -> str:
    """A fresh schema, dropped after the test."""
    return postgres_schema_factory()


@pytest.fixture
def sql(url: str) -> Iterator[Any]:
    """A plain connection to the test's schema."""
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def make_bus(url: str) -> Iterator[MakeBus]:
    """Buses on the test's schema, one per simulated process (consumer)."""
    made: list[PostgresBus] = []

    def make(consumer: str = "proc-1", **kwargs: Any) -> PostgresBus:
        bus = PostgresBus(url, consumer=consumer, **kwargs)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.close()


def inbox(sql: Any, agent: str) -> list[tuple[Any, ...]]:
    """The agent's inbox rows: (consumer, deliveries), oldest first."""
    return list(
        sql.execute(
            "SELECT consumer, deliveries FROM ctxkeep_bus_inbox WHERE agent_id = %s "
            "ORDER BY entry_id",
            (agent,),
        ).fetchall()
    )


class Proc:
    """A process of ``tests/_fabric_pg_proc.py``, its JSON events read as they come."""

    def __init__(self, log: Path, *args: str) -> None:
        self.log = log
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(PROC), *args], stdout=subprocess.PIPE, stderr=err, text=True
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next(self) -> dict[str, Any]:
        try:
            return self.events.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no event; stderr:\n{self.log.read_text()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# -- state shared between processes -------------------------------------------------------------


def test_membership_and_subscriptions_are_shared_by_every_process(make_bus: MakeBus) -> None:
    here, there = make_bus("host-1"), make_bus("host-2")
    here.register("b", "t")
    here.subscribe("b", "news")
    there.register("a", "t")
    assert there.task_of("b") == "t"
    there.send(IPCMessage(sender="a", topic="news", task_id="t", payload="from host 2"))
    assert [m.payload for m in here.receive("b")] == ["from host 2"]


def test_task_of_an_agent_that_never_joined_is_refused(make_bus: MakeBus) -> None:
    with pytest.raises(UnknownAgentError):
        make_bus().task_of("ghost")


# -- waking on NOTIFY ---------------------------------------------------------------------------


def test_a_waiting_receiver_is_woken_by_notify_not_by_polling(make_bus: MakeBus) -> None:
    """The receiver reads the inbox again only when woken or every ``block_ms``; with
    ``block_ms`` far beyond the receive's timeout, only the sender's ``NOTIFY`` can bring the
    message in before the timeout.
    """
    receiver = make_bus("receiver", block_ms=600_000)
    sender = make_bus("sender")
    receiver.register("b", "t")
    receiver.receive("b", timeout=0.01)  # the listener is up
    timer = threading.Timer(0.3, lambda: sender.send(IPCMessage(sender="a", recipient="b",
                                                                payload="wake")))  # fmt: skip
    started = time.monotonic()
    timer.start()
    try:
        got = receiver.receive("b", timeout=WAIT)
    finally:
        timer.join()
    latency = time.monotonic() - started - 0.3
    assert [m.payload for m in got] == ["wake"], f"woken after {latency:.3f} s"


def test_a_notification_for_another_agent_does_not_hand_over_its_message(
    make_bus: MakeBus,
) -> None:
    receiver = make_bus("receiver", block_ms=600_000)
    sender = make_bus("sender")
    timer = threading.Timer(0.2, lambda: sender.send(IPCMessage(sender="a", recipient="c",
                                                                payload="for c")))  # fmt: skip
    timer.start()
    try:
        assert receiver.receive("b", timeout=0.6) == []
    finally:
        timer.join()
    assert [m.payload for m in receiver.receive("c")] == ["for c"]


def test_a_receiver_whose_listen_connection_dies_is_still_woken(
    make_bus: MakeBus, sql: Any
) -> None:
    """The listener connects again; a message sent while it was away is found when it is back
    (a reconnection wakes every waiting receiver), one sent after is notified.
    """
    receiver = make_bus("receiver", block_ms=600_000)
    sender = make_bus("sender")
    receiver.receive("b", timeout=0.01)  # the listener is up
    (killed,) = sql.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE query = 'LISTEN ctxkeep_bus' AND pid <> pg_backend_pid()"
    ).fetchone()
    assert killed == 1
    for payload in ("while away", "after"):
        timer = threading.Timer(0.1, lambda p=payload: sender.send(
            IPCMessage(sender="a", recipient="b", payload=p)))  # fmt: skip
        timer.start()
        try:
            got = receiver.receive("b", timeout=WAIT)
        finally:
            timer.join()
        assert [m.payload for m in got] == [payload]


# -- acknowledgement and redelivery -------------------------------------------------------------


def test_acked_messages_leave_the_inbox(make_bus: MakeBus, sql: Any) -> None:
    bus = make_bus()
    for n in range(3):
        bus.send(IPCMessage(sender="a", recipient="b", payload=n))
    got = bus.receive("b")
    assert inbox(sql, "b") == [("proc-1", 1)] * 3
    bus.ack("b", [m.id for m in got])
    assert inbox(sql, "b") == []


def test_unacked_messages_of_a_dead_consumer_go_to_another(make_bus: MakeBus) -> None:
    sender = make_bus("sender")
    dying = make_bus("worker-1")
    patient = make_bus("worker-2", claim_idle_ms=60_000)
    rescuer = make_bus("worker-3", claim_idle_ms=100)
    for n in range(3):
        sender.send(IPCMessage(sender="a", recipient="b", payload=n))
    taken = dying.receive("b")
    assert [m.payload for m in taken] == [0, 1, 2]  # ... and worker-1 dies without acking
    assert patient.receive("b") == []  # not idle for 60 s: worker-1 may still be working
    time.sleep(0.25)
    again = rescuer.receive("b")
    assert [m.id for m in again] == [m.id for m in taken]
    rescuer.ack("b", [m.id for m in again])
    time.sleep(0.25)
    assert rescuer.receive("b") == [] and patient.receive("b") == []


def test_a_restarted_consumer_recovers_its_own_pending_messages_at_once(
    make_bus: MakeBus,
) -> None:
    first_life = make_bus("worker-1")
    first_life.send(IPCMessage(sender="a", recipient="b", payload="work"))
    assert len(first_life.receive("b")) == 1  # then the process restarts, same consumer name
    second_life = make_bus("worker-1")
    assert second_life.receive("b") == []  # claim_idle_ms has not passed
    assert second_life.recover("b") == 1
    got = second_life.receive("b")
    assert [m.payload for m in got] == ["work"]
    second_life.ack("b", [m.id for m in got])
    assert second_life.recover("b") == 0
    assert second_life.receive("b") == []


def test_an_ack_through_another_process_settles_the_message(make_bus: MakeBus) -> None:
    one, other = make_bus("worker-1"), make_bus("worker-2", claim_idle_ms=100)
    one.send(IPCMessage(sender="a", recipient="b", payload="x"))
    (got,) = one.receive("b")
    other.ack("b", [got.id])
    time.sleep(0.25)
    assert other.receive("b") == [] and one.recover("b") == 0


def test_a_receiver_killed_with_sigkill_loses_nothing_and_nothing_is_handled_twice(
    make_bus: MakeBus, url: str, tmp_path: Path
) -> None:
    """The worker commits each effect with its handled mark; it is killed right after its
    2nd effect, before acking it, with the rest of its batch received and unacked. Another
    consumer takes the batch over after ``claim_idle_ms``, skips the handled one, and the task
    ends with each effect exactly once.
    """
    sender = make_bus("sender")
    for n in range(1, 5):
        sender.send(IPCMessage(sender="planner", recipient="worker", payload=n, id=f"job-{n}"))
    worker = Proc(tmp_path / "worker.log", "stall", url, "t", "worker-1", "2")
    try:
        assert worker.next() == {"event": "stalled", "n": 2}
        worker.proc.send_signal(signal.SIGKILL)
        assert worker.proc.wait(WAIT) == -signal.SIGKILL
    finally:
        worker.stop()
    state = sender.task_state("t")
    assert state.read()[1] == {"done": [1, 2]}

    rescuer = make_bus("worker-2", claim_idle_ms=200)
    time.sleep(0.3)
    runs: list[Any] = []

    def apply(m: IPCMessage) -> None:
        runs.append(m.payload)
        state.update_with(
            lambda data: {"done": [*data.get("done", []), m.payload]},
            once=rescuer.handled_mark("worker", m.id),
        )

    assert rescuer.handle("worker", apply) == 2
    assert runs == [3, 4]  # job-2 was redelivered and skipped; job-1 had been acked
    assert state.read() == (4, {"done": [1, 2, 3, 4]})
    assert rescuer.receive("worker") == [] and rescuer.recover("worker") == 0


# -- handling once ------------------------------------------------------------------------------


def test_was_handled_tells_what_handle_ran_on(make_bus: MakeBus) -> None:
    bus = make_bus()
    done, waiting = (IPCMessage(sender="a", recipient="b", payload=n) for n in range(2))
    bus.send(done)
    bus.handle("b", lambda m: None)
    bus.send(waiting)
    assert bus.was_handled("b", done.id)
    assert not bus.was_handled("b", waiting.id)


def test_handle_is_idempotent_across_redelivery(make_bus: MakeBus) -> None:
    first = make_bus("worker-1")
    state = first.task_state("t")
    for n in range(3):
        first.send(IPCMessage(sender="a", recipient="b", payload=n, id=f"job-{n}"))

    def apply_then_die(m: IPCMessage) -> None:
        state.update_with(
            lambda data: {"done": [*data.get("done", []), m.payload]},
            once=first.handled_mark("b", m.id),
        )
        if m.payload == 1:
            raise Crash  # after the effect, before the ack

    with pytest.raises(Crash):
        first.handle("b", apply_then_die)
    second = make_bus("worker-2", claim_idle_ms=100)
    runs: list[Any] = []

    def apply(m: IPCMessage) -> None:
        runs.append(m.payload)
        state.update_with(
            lambda data: {"done": [*data.get("done", []), m.payload]},
            once=second.handled_mark("b", m.id),
        )

    time.sleep(0.25)
    assert second.handle("b", apply) == 1
    assert runs == [2]
    assert state.read() == (3, {"done": [0, 1, 2]})
    assert second.receive("b") == []


# -- stored rows no reader could be handed ------------------------------------------------------


def deep_json(depth: int) -> str:
    return '{"x":' * depth + "1" + "}" * depth


def stored_message(payload_json: str) -> str:
    """A message's record as an older ctxkeep stored it, with the payload's JSON as given."""
    head = json.dumps({"sender": "a", "recipient": "b", "id": "poison", "created_at": 1.0})
    return head[:-1] + f', "payload": {payload_json}}}'


POISON_ROWS = {
    "lone-surrogate": (1, stored_message('"\\ud800"')),
    "nested-300": (1, stored_message(deep_json(300))),
    "nested-100000": (1, stored_message(deep_json(100_000))),
    "not-json": (1, "{not json"),
    "newer": (2, stored_message('"from the future"')),
    "another-id": (1, stored_message('"x"').replace('"poison"', '"not the row\'s"')),
}


@pytest.mark.parametrize("poison", POISON_ROWS, ids=list(POISON_ROWS))
def test_a_stored_poison_row_is_dead_lettered_and_the_inbox_flows(
    make_bus: MakeBus, sql: Any, poison: str
) -> None:
    bus = make_bus()
    bus.register("b", "t")
    bus.send(IPCMessage(sender="a", recipient="b", payload="before"))
    version, record = POISON_ROWS[poison]
    sql.execute(
        "INSERT INTO ctxkeep_bus_inbox (agent_id, message_id, version, message) "
        "VALUES ('b', 'poison', %s, %s)",
        (version, record),
    )
    bus.send(IPCMessage(sender="a", recipient="b", payload="after"))

    got = bus.receive("b")
    assert [m.payload for m in got] == ["before", "after"]
    bus.ack("b", [m.id for m in got])
    assert bus.recover("b") == 0 and bus.receive("b") == []

    (letter,) = bus.dead_letters("b")
    reason = "newer" if poison == "newer" else "corrupt bus entry"
    assert reason in letter.reason
    assert letter.record["m"] == record and letter.record["entry_id"]
    assert bus.delete_dead_letters("b", ["0-1", "99999999999999999999", letter.id]) == 1
    assert bus.dead_letters("b") == []


def test_names_postgresql_cannot_hold_are_refused_before_anything_is_stored(
    make_bus: MakeBus, sql: Any
) -> None:
    bus = make_bus()
    with pytest.raises(ConfigError):
        bus.register("a\x00b", "t")
    with pytest.raises(InvalidMessageError):
        bus.send(IPCMessage(sender="a", recipient="b\x00", payload=1))
    with pytest.raises(InvalidTypeError):
        bus.receive(["b"])  # type: ignore[arg-type]
    assert sql.execute("SELECT count(*) FROM ctxkeep_bus_inbox").fetchone() == (0,)


# -- the task state -----------------------------------------------------------------------------


def test_task_state_is_compare_and_set(url: str) -> None:
    mine, theirs = PostgresTaskState(url, "t"), PostgresTaskState(url, "t")
    assert mine.read() == (0, {})
    v1 = mine.update({"decisions": []}, expected_version=0)
    v2 = mine.update({"decisions": ["use postgres"]}, expected_version=v1)
    with pytest.raises(StaleTaskStateError) as info:
        theirs.update({"decisions": ["use sqlite"]}, expected_version=v1)
    assert info.value.current == v2
    assert theirs.read() == (2, {"decisions": ["use postgres"]})
    with pytest.raises(TypeError):
        theirs.update({"bad": {1, 2}}, expected_version=v2)
    assert theirs.read()[0] == v2
    mine.close()
    theirs.close()


def test_a_refused_write_leaves_no_row_behind(url: str, sql: Any) -> None:
    state = PostgresTaskState(url, "t")
    with pytest.raises(StaleTaskStateError):
        state.update({"x": 1}, expected_version=3)
    with pytest.raises(InvalidTypeError, match="nested deeper than"):
        state.update({"x": json.loads(deep_json(300))}, expected_version=0)
    assert sql.execute("SELECT count(*) FROM ctxkeep_fabric_tasks").fetchone() == (0,)
    state.close()


def test_two_processes_racing_a_compare_and_set_exactly_one_wins(
    url: str, sql: Any, tmp_path: Path
) -> None:
    """The test holds the task's row lock until both processes wait on it with the same
    expected version; then it lets go, and they race.
    """
    state = PostgresTaskState(url, "t")
    assert state.update({"goal": "ship"}, expected_version=0) == 1
    procs: list[Proc] = []
    try:
        with sql.transaction():
            sql.execute("SELECT 1 FROM ctxkeep_fabric_tasks WHERE task_id = 't' FOR UPDATE")
            for i in range(2):
                procs.append(Proc(tmp_path / f"cas-{i}.log", "cas", url, "t", "1"))
            assert [p.next()["event"] for p in procs] == ["ready", "ready"]
            deadline = time.monotonic() + WAIT
            while True:  # both wait on the row lock
                with psycopg.connect(url) as watch:  # not the lock holder's: its view of
                    (waiting,) = watch.execute(  # the activity is fixed for its transaction
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE %s",
                        ("%ctxkeep_fabric_tasks%",),
                    ).fetchone()
                if waiting == 2:
                    break
                assert time.monotonic() < deadline, "the processes never waited on the lock"
                time.sleep(0.02)
        outcomes = sorted(p.next()["event"] for p in procs)
    finally:
        for p in procs:
            p.stop()
    assert outcomes == ["stale", "won"]
    version, data = state.read()
    assert version == 2 and data["goal"] == "ship" and data["winner"] > 0
    state.close()


def test_update_with_loses_no_concurrent_write(url: str) -> None:
    def writer(w: int) -> None:
        state = PostgresTaskState(url, "t")
        for i in range(20):
            state.update_with(lambda d, i=i: {"log": [*d.get("log", []), f"{w}:{i}"]})
        state.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = PostgresTaskState(url, "t")
    version, data = state.read()
    assert version == 80
    assert sorted(data["log"]) == sorted(f"{w}:{i}" for w in range(4) for i in range(20))
    state.close()


WRITES_ST = st.lists(
    st.tuples(
        st.sampled_from(["mine", "theirs"]),
        st.dictionaries(st.sampled_from(["goal", "plan", "eta"]), st.integers(0, 9), max_size=2),
        st.integers(-1, 1),
    ),
    max_size=12,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=WRITES_ST)
def test_random_writes_from_two_writers_follow_the_in_process_fabric(
    url: str, writes: list[tuple[str, dict[str, int], int]]
) -> None:
    """Each write is based on the version its writer last saw (plus a skew of -1, 0 or 1): the
    PostgreSQL task state accepts and refuses exactly the writes the in-process fabric does,
    and ends in the same state. (Each example writes a task of its own, so the examples may
    share the test's schema.)
    """
    task = f"t-{uuid.uuid4().hex[:8]}"
    model = ContextFabric()
    model.set_task_context("mine", {}, task_id=task)
    model.set_task_context("theirs", {}, task_id=task)
    states = {w: PostgresTaskState(url, task) for w in ("mine", "theirs")}
    seen = dict.fromkeys(states, 0)
    try:
        for writer, changes, skew in writes:
            expected = max(seen[writer] + skew, 0)
            try:
                want: int | str = model.update_task_context(
                    writer, changes, expected_version=expected
                )
            except StaleTaskStateError:
                want = "stale"
            try:
                got: int | str = states[writer].update(changes, expected_version=expected)
            except StaleTaskStateError:
                got = "stale"
            assert got == want
            seen[writer] = states[writer].read()[0]
        assert states["mine"].read() == (model.task_version(task), model.task_context("mine"))
    finally:
        for state in states.values():
            state.close()


@pytest.mark.parametrize("stored", [deep_json(300), deep_json(100_000), '"\\ud800"', "{not json"])
def test_a_stored_task_state_no_reader_could_be_handed_is_a_corrupt_record(
    url: str, sql: Any, stored: str
) -> None:
    state = PostgresTaskState(url, "t")
    sql.execute("INSERT INTO ctxkeep_fabric_tasks VALUES ('t', 1, 1, %s)", (f'{{"k": {stored}}}',))
    with pytest.raises(CorruptRecordError, match="task state 't'"):
        state.read()
    state.close()


def test_a_task_state_row_of_a_newer_ctxkeep_is_refused(url: str, sql: Any) -> None:
    state = PostgresTaskState(url, "t")
    sql.execute("INSERT INTO ctxkeep_fabric_tasks VALUES ('t', 1, 2, '{}')")
    with pytest.raises(SchemaVersionError, match="newer"):
        state.read()
    state.close()


def test_fabric_tables_of_a_newer_ctxkeep_are_refused(url: str, sql: Any) -> None:
    PostgresTaskState(url, "t").close()
    sql.execute("UPDATE ctxkeep_meta SET value = '2' WHERE key = 'fabric'")
    with pytest.raises(SchemaVersionError, match="fabric schema 2"):
        PostgresBus(url, consumer="c")


def test_an_unreachable_server_is_a_storage_error() -> None:
    with pytest.raises(StorageError):
        PostgresBus("postgresql://127.0.0.1:1/x?connect_timeout=2", consumer="x")


# -- the private layer --------------------------------------------------------------------------


def test_a_private_value_is_in_no_table(make_bus: MakeBus, sql: Any) -> None:
    bus = make_bus()
    fabric = ContextFabric(bus=bus)
    for agent in ("a", "b"):
        fabric.set_task_context(agent, {"goal": "g"}, task_id="t")
        bus.subscribe(agent, "news")
    fabric.set_private("a", "scratch", {"note": "CANARY-5d1c"})
    state = bus.task_state("t")
    state.update_with(lambda data: {"seen_by_a": fabric.task_context("a")})
    fabric.send("a", {"view": fabric.task_context("a")}, topic="news")
    fabric.send("a", {"task": fabric.task_context("a")}, recipient="b")
    got = bus.receive("b")
    assert len(got) == 2
    tables = [r[0] for r in sql.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    ).fetchall()]  # fmt: skip
    for table in tables:
        rows = sql.execute(f"SELECT * FROM {table}").fetchall()
        assert "CANARY-5d1c" not in repr(rows), table


def test_the_two_agent_example_runs_on_the_postgres_bus(make_bus: MakeBus) -> None:
    spec = importlib.util.spec_from_file_location("two_agents_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    on_postgres = example.run(ContextFabric(bus=make_bus("example")))
    in_process = example.run(ContextFabric())
    for key in ("plan", "coder_got", "planner_got", "resume_from"):
        assert on_postgres[key] == in_process[key]
    assert on_postgres["coder_got"] and on_postgres["planner_got"]


# -- the service --------------------------------------------------------------------------------


def test_two_server_processes_on_one_postgresql_share_one_fabric(
    postgres_server_url: str,
) -> None:
    """Two apps over one database stand for two workers: what one does, the other sees."""
    first_app, second_app = make_app(postgres_server_url), make_app(postgres_server_url)
    with TestClient(first_app) as one, TestClient(second_app) as two:
        key = _key(first_app, "acme")
        a, b = Api(one, key), Api(two, key)
        fabric = first_app.state.ctxkeep.stores.fabric("acme")
        assert isinstance(fabric, PostgresFabric)
        for api, agent in ((a, "planner"), (b, "coder")):
            r = api("PUT", f"/v1/fabric/agents/{agent}/task",
                    json={"task_id": "t", "state": {"goal": "ship"}})  # fmt: skip
            assert r.status_code == 200 and r.json()["version"] == 1, r.text
        patch = {"changes": {"eta": 2}, "expected_version": 1}
        assert a("PATCH", "/v1/fabric/agents/planner/task", json=patch).json()["version"] == 2
        problem(b("PATCH", "/v1/fabric/agents/coder/task", json=patch), 409, "stale-task-state")
        assert b("GET", "/v1/fabric/agents/coder/task").json()["state"] == {"goal": "ship",
                                                                           "eta": 2}  # fmt: skip

        assert b("POST", "/v1/fabric/agents/coder/subscriptions", json={"topic": "work"}).is_success
        for n in range(3):
            body = {"sender": "planner", "topic": "work", "payload": n}
            assert a("POST", "/v1/fabric/messages", json=body).status_code == 201
        got = a("POST", "/v1/fabric/agents/coder/messages/receive", json={}).json()["messages"]
        assert [m["payload"] for m in got] == [0, 1, 2]
        assert b("POST", "/v1/fabric/agents/coder/messages/receive", json={}).json() == {
            "messages": []
        }
        assert b("POST", "/v1/fabric/agents/coder/messages/recover").json() == {"pending": 3}
        again = b("POST", "/v1/fabric/agents/coder/messages/receive", json={}).json()["messages"]
        assert [m["id"] for m in again] == [m["id"] for m in got]
        ids = [m["id"] for m in again]
        assert b("POST", "/v1/fabric/agents/coder/messages/ack", json={"ids": ids}).is_success
        assert a("POST", "/v1/fabric/agents/coder/messages/recover").json() == {"pending": 0}
        assert a("POST", "/v1/fabric/agents/coder/messages/receive", json={}).json() == {
            "messages": []
        }


def test_each_tenant_has_a_fabric_of_its_own(postgres_server_url: str) -> None:
    app = make_app(postgres_server_url)
    with TestClient(app) as client:
        acme, beta = Api(client, _key(app, "acme")), Api(client, _key(app, "beta"))
        body = {"task_id": "t", "state": {"secret": "acme's"}}
        assert acme("PUT", "/v1/fabric/agents/a/task", json=body).status_code == 200
        problem(beta("GET", "/v1/fabric/agents/a/task"), 404, "unknown-agent")
        assert beta("PUT", "/v1/fabric/agents/a/task", json={"task_id": "t"}).json()["state"] == {}
        direct = {"sender": "a", "recipient": "b", "payload": "for acme's b"}
        assert acme("POST", "/v1/fabric/messages", json=direct).status_code == 201
        beta("PUT", "/v1/fabric/agents/b/task", json={"task_id": "t"})
        assert beta("POST", "/v1/fabric/agents/b/messages/receive", json={}).json() == {
            "messages": []
        }

"""The Redis Streams bus and the Redis task state, against a real Redis on 127.0.0.1:6379:
what only they do (processes sharing membership, dead consumers, dead letters, exactly-once
effects, versions of their keys). The delivery rules every bus keeps are checked for this bus
too by ``tests/contract/test_bus_contract.py``.

Every test works under its own key prefix and deletes its keys afterwards. Without a Redis the
tests skip with the reason, unless ``CTXKEEP_REQUIRE_SERVICES=1`` makes that a failure.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest_services import redis_prefix_factory, redis_url
from ctxkeep import ContextFabric, IPCMessage, StaleTaskStateError
from ctxkeep.errors import (
    ConfigError,
    InvalidTypeError,
    SchemaVersionError,
    StorageError,
    UnknownAgentError,
)

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

from ctxkeep.fabric.redis_bus import RedisBusKeys, RedisStreamBus  # noqa: E402
from ctxkeep.fabric.redis_state import RedisTaskState  # noqa: E402

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_agents.py"

MakeBus = Callable[..., RedisStreamBus]


class Crash(Exception):
    """Stands in for a process dying inside a handler."""


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def prefix(redis_prefix_factory: Callable[[], str]) -> str:
    """A fresh key prefix; every key under it is deleted after the test."""
    return redis_prefix_factory()


@pytest.fixture
def make_bus(redis_url: str, prefix: str) -> Iterator[MakeBus]:
    """Buses on the test's prefix, one per simulated process (consumer)."""
    made: list[RedisStreamBus] = []

    def make(consumer: str = "proc-1", **kwargs: Any) -> RedisStreamBus:
        bus = RedisStreamBus(redis_url, consumer=consumer, prefix=prefix, **kwargs)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.close()


def test_task_of_an_agent_that_never_joined_is_refused(make_bus: MakeBus) -> None:
    with pytest.raises(UnknownAgentError):
        make_bus().task_of("ghost")


# -- state shared between processes -------------------------------------------------------------


def test_membership_and_subscriptions_are_shared_by_every_process(make_bus: MakeBus) -> None:
    here, there = make_bus("host-1"), make_bus("host-2")
    here.register("b", "t")
    here.subscribe("b", "news")
    there.register("a", "t")
    assert there.task_of("b") == "t"
    there.send(IPCMessage(sender="a", topic="news", task_id="t", payload="from host 2"))
    assert [m.payload for m in here.receive("b")] == ["from host 2"]


def test_colons_in_task_and_topic_names_do_not_collide(make_bus: MakeBus) -> None:
    bus = make_bus()
    bus.register("x", "a:b")
    bus.subscribe("x", "c")
    bus.register("y", "a")
    bus.subscribe("y", "b:c")
    bus.register("s1", "a:b")
    bus.register("s2", "a")
    bus.send(IPCMessage(sender="s1", topic="c", task_id="a:b", payload="for x"))
    bus.send(IPCMessage(sender="s2", topic="b:c", task_id="a", payload="for y"))
    assert [m.payload for m in bus.receive("x")] == ["for x"]
    assert [m.payload for m in bus.receive("y")] == ["for y"]


# -- acknowledgement and redelivery -------------------------------------------------------------


def test_acked_messages_leave_the_inbox(make_bus: MakeBus, client: Any, prefix: str) -> None:
    bus = make_bus()
    for n in range(3):
        bus.send(IPCMessage(sender="a", recipient="b", payload=n))
    got = bus.receive("b")
    inbox = RedisBusKeys(prefix).inbox("b")
    assert client.xpending(inbox, "b")["pending"] == 3
    bus.ack("b", [m.id for m in got])
    assert client.xpending(inbox, "b")["pending"] == 0
    assert client.xlen(inbox) == 0


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


# -- handling once ------------------------------------------------------------------------------


def test_was_handled_tells_what_handle_ran_on(make_bus: MakeBus) -> None:
    bus = make_bus()
    done, waiting = (IPCMessage(sender="a", recipient="b", payload=n) for n in range(2))
    bus.send(done)
    bus.handle("b", lambda m: None)
    bus.send(waiting)
    assert bus.was_handled("b", done.id)
    assert not bus.was_handled("b", waiting.id)


def test_a_failing_handlers_message_goes_to_another_consumer(make_bus: MakeBus) -> None:
    bus = make_bus("worker-1")
    bus.send(IPCMessage(sender="a", recipient="b", payload="job"))

    def dies(m: IPCMessage) -> None:
        raise Crash

    with pytest.raises(Crash):
        bus.handle("b", dies)
    handled: list[Any] = []
    rescuer = make_bus("worker-2", claim_idle_ms=100)
    time.sleep(0.25)
    assert rescuer.handle("b", lambda m: handled.append(m.payload)) == 1
    assert handled == ["job"]


def test_handle_is_idempotent_across_redelivery(
    make_bus: MakeBus, redis_url: str, prefix: str
) -> None:
    """The effect commits with the handled mark, then the consumer dies before acking: the
    consumer that gets the redelivery must not apply it again.
    """
    state = RedisTaskState(redis_url, "t", prefix=prefix)
    first = make_bus("worker-1")
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
    assert runs == [2]  # job-1 was redelivered and skipped
    version, data = state.read()
    assert data == {"done": [0, 1, 2]} and version == 3
    assert second.receive("b") == []
    state.close()


# -- corrupt and future entries -----------------------------------------------------------------


def test_undecodable_entries_go_to_dead_letters(
    make_bus: MakeBus, client: Any, prefix: str
) -> None:
    bus = make_bus()
    bus.register("b", "t")
    keys = RedisBusKeys(prefix)
    client.xadd(keys.inbox("b"), {"v": "1", "m": "{not json"})
    client.xadd(keys.inbox("b"), {"v": "9", "m": "{}"})
    bus.send(IPCMessage(sender="a", recipient="b", payload="good"))
    assert [m.payload for m in bus.receive("b")] == ["good"]
    dead = client.xrange(keys.dead("b"))
    assert [d[1]["m"] for d in dead] == ["{not json", "{}"]
    assert "corrupt" in dead[0][1]["error"] and "newer" in dead[1][1]["error"]
    assert client.xpending(keys.inbox("b"), "b")["pending"] == 1  # only "good" is pending


def test_an_entry_deleted_while_pending_is_dropped_quietly(
    make_bus: MakeBus, client: Any, prefix: str
) -> None:
    bus = make_bus("worker-1")
    bus.send(IPCMessage(sender="a", recipient="b", payload="gone"))
    assert len(bus.receive("b")) == 1
    inbox = RedisBusKeys(prefix).inbox("b")
    client.xdel(inbox, client.xrange(inbox)[0][0])
    assert bus.recover("b") == 1
    assert bus.receive("b") == []
    assert client.xpending(inbox, "b")["pending"] == 0


def test_the_prefix_may_come_with_the_url(redis_url: str, prefix: str) -> None:
    with RedisStreamBus(f"{redis_url}?prefix={prefix}", consumer="c") as bus:
        assert bus.keys.prefix == prefix
        bus.send(IPCMessage(sender="a", recipient="b", payload=1))
    with RedisStreamBus(redis_url, consumer="c", prefix=prefix) as bus:
        assert [m.payload for m in bus.receive("b")] == [1]
    with pytest.raises(ConfigError):
        RedisStreamBus(f"{redis_url}?prefix={prefix}", consumer="c", prefix="other:")
    with pytest.raises(ConfigError):
        RedisStreamBus(redis_url, consumer="")


def test_an_unreachable_server_is_a_storage_error() -> None:
    with pytest.raises(StorageError, match=r"127\.0\.0\.1:1/0"):
        RedisStreamBus("redis://127.0.0.1:1/0", consumer="x")


# -- versions of the keys -----------------------------------------------------------------------


def plant_release_0_1_bus(client: Any, prefix: str) -> IPCMessage:
    """Bus keys as ctxkeep 0.1.0 wrote them (no ``meta`` hash): ``b`` and ``c`` in task ``t``,
    ``c`` subscribed to ``news``, a direct message waiting in ``b``'s inbox.
    """
    waiting = IPCMessage(sender="a", recipient="b", task_id="t", payload={"from": "0.1.0"})
    client.hset(f"{prefix}bus:agents", mapping={"b": '"t"', "c": '"t"'})
    client.sadd(f"{prefix}bus:topics:c", "news")
    client.sadd(f"{prefix}bus:subs:t:news", "c")
    client.xgroup_create(f"{prefix}bus:inbox:b", "b", id="0", mkstream=True)
    client.xadd(f"{prefix}bus:inbox:b", {"v": "1", "m": json.dumps(waiting.to_dict())})
    return waiting


def test_bus_keys_of_the_previous_release_are_read(
    make_bus: MakeBus, client: Any, prefix: str
) -> None:
    waiting = plant_release_0_1_bus(client, prefix)
    bus = make_bus()
    assert bus.receive("b") == [waiting]
    assert bus.task_of("c") == "t"
    bus.send(IPCMessage(sender="b", topic="news", task_id="t", payload="to c"))
    assert [m.payload for m in bus.receive("c")] == ["to c"]
    assert bus.db.stored_version() == 1


def test_bus_keys_of_a_newer_ctxkeep_are_refused(
    make_bus: MakeBus, client: Any, prefix: str
) -> None:
    client.hset(f"{prefix}meta", "bus", 2)
    with pytest.raises(SchemaVersionError, match="bus of a newer ctxkeep"):
        make_bus()


def test_task_state_of_the_previous_release_is_read(
    redis_url: str, prefix: str, client: Any
) -> None:
    client.hset(
        f"{prefix}fabric:task:t",
        mapping={"version": 3, "schema": 1, "data:goal": '"ship"', "data:deps": '["x"]'},
    )
    state = RedisTaskState(redis_url, "t", prefix=prefix)
    assert state.read() == (3, {"goal": "ship", "deps": ["x"]})
    assert state.update({"goal": "shipped"}, expected_version=3) == 4
    assert state.db.stored_version() == 1
    state.close()


def test_task_states_of_a_newer_ctxkeep_are_refused(
    redis_url: str, prefix: str, client: Any
) -> None:
    client.hset(f"{prefix}meta", "fabric", 2)
    with pytest.raises(SchemaVersionError, match="fabric of a newer ctxkeep"):
        RedisTaskState(redis_url, "t", prefix=prefix)


# -- the task state -----------------------------------------------------------------------------


def test_task_state_is_compare_and_set(redis_url: str, prefix: str) -> None:
    mine = RedisTaskState(redis_url, "t", prefix=prefix)
    theirs = RedisTaskState(redis_url, "t", prefix=prefix)
    assert mine.read() == (0, {})
    v1 = mine.update({"decisions": []}, expected_version=0)
    v2 = mine.update({"decisions": ["use redis"]}, expected_version=v1)
    with pytest.raises(StaleTaskStateError) as info:
        theirs.update({"decisions": ["use sqlite"]}, expected_version=v1)
    assert info.value.current == v2
    assert theirs.read() == (2, {"decisions": ["use redis"]})
    with pytest.raises(TypeError):
        theirs.update({"bad": {1, 2}}, expected_version=v2)
    assert theirs.read()[0] == v2
    mine.close()
    theirs.close()


def test_task_state_refuses_malformed_changes_and_writes_nothing(
    redis_url: str, prefix: str
) -> None:
    state = RedisTaskState(redis_url, "t", prefix=prefix)
    with pytest.raises(InvalidTypeError):
        state.update(["decisions"], expected_version=0)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        state.update({"decisions": []}, expected_version="0")  # type: ignore[arg-type]
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(InvalidTypeError):
        state.update({"deep": deep}, expected_version=0)
    with pytest.raises(InvalidTypeError):
        state.update_with("not a function")  # type: ignore[arg-type]
    assert state.read() == (0, {})
    state.close()


def test_the_redis_bus_refuses_malformed_arguments_with_typed_errors(make_bus: MakeBus) -> None:
    bus = make_bus()
    bus.register("a", "t")
    with pytest.raises(InvalidTypeError):
        bus.register("b", ["t"])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.send({"sender": "a", "payload": 1, "recipient": "b"})  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.receive(["a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.receive("a", timeout="long")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.ack("a", 5)  # type: ignore[arg-type]
    with pytest.raises(UnknownAgentError):
        bus.task_of("b")


def test_task_state_update_with_loses_no_concurrent_write(redis_url: str, prefix: str) -> None:
    def writer(w: int) -> None:
        state = RedisTaskState(redis_url, "t", prefix=prefix)
        for i in range(20):
            state.update_with(lambda d, i=i: {"log": [*d.get("log", []), f"{w}:{i}"]})
        state.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = RedisTaskState(redis_url, "t", prefix=prefix)
    version, data = state.read()
    assert version == 80 and sorted(data["log"]) == sorted(
        f"{w}:{i}" for w in range(4) for i in range(20)
    )
    state.close()


def test_a_task_state_hash_of_a_newer_ctxkeep_is_refused(
    redis_url: str, prefix: str, client: Any
) -> None:
    state = RedisTaskState(redis_url, "t", prefix=prefix)
    client.hset(state.key, mapping={"schema": 2, "version": 1})
    with pytest.raises(SchemaVersionError):
        state.read()
    state.close()


# -- the example ----------------------------------------------------------------------------------


def test_the_two_agent_example_runs_on_the_redis_bus(make_bus: MakeBus) -> None:
    spec = importlib.util.spec_from_file_location("two_agents_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    on_redis = example.run(ContextFabric(bus=make_bus("example")))
    in_process = example.run(ContextFabric())
    for key in ("plan", "coder_got", "planner_got", "resume_from"):
        assert on_redis[key] == in_process[key]
    assert on_redis["coder_got"] and on_redis["planner_got"]

"""The Redis Streams bus and the Redis task state, against a real Redis on 127.0.0.1:6379.

Every test works under its own key prefix and deletes its keys afterwards. Without a Redis the
tests skip with the reason, unless ``CTXKEEP_REQUIRE_SERVICES=1`` makes that a failure.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxkeep import ContextFabric, IPCMessage, StaleTaskStateError
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
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

REDIS_URL = os.environ.get("CTXKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "two_agents.py"

MakeBus = Callable[..., RedisStreamBus]


class Crash(Exception):
    """Stands in for a process dying inside a handler."""


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url() -> str:
    """A Redis that answers PING (skip, or fail under CTXKEEP_REQUIRE_SERVICES=1)."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        reason = f"no Redis answers at {REDIS_URL} ({exc}); start redis-server"
        if os.environ.get("CTXKEEP_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (CTXKEEP_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(reason)
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


@pytest.fixture
def prefix(client: Any) -> Iterator[str]:
    """A fresh key prefix; every key under it is deleted after the test."""
    p = f"ctxkeep-test:{uuid.uuid4().hex}:"
    yield p
    keys = list(client.scan_iter(match=f"{p}*", count=500))
    if keys:
        client.delete(*keys)


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


def _fabric_with(bus: RedisStreamBus, *agents: tuple[str, str]) -> ContextFabric:
    fabric = ContextFabric(bus=bus)
    for agent, task in agents:
        fabric.set_task_context(agent, {}, task_id=task)
    return fabric


# -- the delivery rules (as tests/test_fabric.py checks them in process) ------------------------


def test_direct_messages_reach_their_recipient_across_tasks(make_bus: MakeBus) -> None:
    fabric = _fabric_with(make_bus(), ("a", "t1"), ("b", "t2"))
    fabric.send("a", {"hello": "b"}, recipient="b")
    got = fabric.bus.receive("b")
    assert [m.payload for m in got] == [{"hello": "b"}]
    assert (got[0].sender, got[0].recipient, got[0].task_id) == ("a", "b", "t1")


def test_topic_messages_stay_inside_their_task(make_bus: MakeBus) -> None:
    fabric = _fabric_with(make_bus(), ("a", "t1"), ("b", "t1"), ("c", "t2"))
    for agent in ("a", "b", "c"):
        fabric.bus.subscribe(agent, "progress")
    fabric.send("a", {"done": 1}, topic="progress")
    assert [m.payload for m in fabric.bus.receive("b")] == [{"done": 1}]
    assert fabric.bus.receive("a") == []  # not to the sender
    assert fabric.bus.receive("c") == []  # not to another task


def test_payloads_are_copied_and_must_be_json(make_bus: MakeBus) -> None:
    fabric = _fabric_with(make_bus(), ("a", "t"), ("b", "t"))
    payload: dict[str, Any] = {"items": [1], "big": 2**70}
    fabric.send("a", payload, recipient="b")
    payload["items"].append(2)
    msg = fabric.bus.receive("b")[0]
    assert msg.payload == {"items": [1], "big": 2**70}
    msg.payload["items"].append(3)
    with pytest.raises(InvalidMessageError):
        fabric.send("a", {"bad": object()}, recipient="b")
    with pytest.raises(InvalidMessageError):
        IPCMessage(sender="a", payload=1)  # neither recipient nor topic


def test_a_message_keeps_its_id_and_time(make_bus: MakeBus) -> None:
    bus = make_bus()
    sent = IPCMessage(sender="a", recipient="b", payload={"x": 1})
    assert bus.send(sent) == sent.id
    (got,) = bus.receive("b")
    assert got == sent


def test_subscribing_needs_a_task(make_bus: MakeBus) -> None:
    with pytest.raises(UnknownAgentError):
        make_bus().subscribe("ghost", "news")
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


def test_moving_to_another_task_drops_old_subscriptions(make_bus: MakeBus) -> None:
    bus = make_bus()
    bus.register("a", "t1")
    bus.register("b", "t1")
    bus.subscribe("b", "news")
    bus.register("b", "t2")
    bus.send(IPCMessage(sender="a", topic="news", task_id="t1", payload=1))
    assert bus.receive("b") == []
    bus.subscribe("b", "news")
    bus.register("c", "t2")
    bus.send(IPCMessage(sender="c", topic="news", task_id="t2", payload=2))
    assert [m.payload for m in bus.receive("b")] == [2]


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
    for n in range(5):
        bus.send(IPCMessage(sender="a", recipient="b", payload=n))
    first = bus.receive("b", max_messages=2)
    rest = bus.receive("b")
    assert [m.payload for m in first + rest] == [0, 1, 2, 3, 4]
    inbox = RedisBusKeys(prefix).inbox("b")
    assert client.xpending(inbox, "b")["pending"] == 5
    bus.ack("b", [m.id for m in first + rest])
    assert client.xpending(inbox, "b")["pending"] == 0
    assert client.xlen(inbox) == 0
    assert bus.receive("b") == []


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


def test_receive_waits_up_to_the_timeout(make_bus: MakeBus) -> None:
    bus = make_bus(block_ms=50)
    bus.register("b", "t")
    assert bus.receive("b", timeout=0) == []
    assert bus.receive("b", timeout=0.1) == []
    timer = threading.Timer(
        0.2, lambda: bus.send(IPCMessage(sender="a", recipient="b", payload="late"))
    )
    timer.start()
    try:
        got = bus.receive("b", timeout=30)
    finally:
        timer.join()
    assert [m.payload for m in got] == ["late"]


# -- handling once ------------------------------------------------------------------------------


def test_handle_runs_once_per_message_id(make_bus: MakeBus) -> None:
    bus = make_bus()
    msg = IPCMessage(sender="a", recipient="b", payload="once")
    bus.send(msg)
    bus.send(msg)  # a sender retrying after a timeout sends the same id again
    handled: list[Any] = []
    assert bus.handle("b", lambda m: handled.append(m.payload)) == 1
    bus.send(msg)
    assert bus.handle("b", lambda m: handled.append(m.payload)) == 0
    assert handled == ["once"]
    assert bus.was_handled("b", msg.id)


def test_a_handler_that_fails_loses_nothing(make_bus: MakeBus) -> None:
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
    bus = RedisStreamBus("redis://127.0.0.1:1/0", consumer="x")
    try:
        with pytest.raises(StorageError):
            bus.send(IPCMessage(sender="a", recipient="b", payload=1))
    finally:
        bus.close()


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


def test_task_state_of_a_newer_ctxkeep_is_refused(redis_url: str, prefix: str, client: Any) -> None:
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

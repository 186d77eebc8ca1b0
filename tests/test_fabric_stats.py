"""Every bus counts what it holds in one read (``MessageBus.stats``): messages not yet
delivered (depth), delivered and not acked (pending), and dead letters; in process, over
Redis Streams and on PostgreSQL tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.fabric import BusStats, InProcessBus, IPCMessage, MessageBus

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def bus(request: pytest.FixtureRequest) -> Iterator[MessageBus]:
    made: MessageBus
    if request.param == "memory":
        made = InProcessBus()
    elif request.param == "redis":
        from ctxkeep.fabric.redis_bus import RedisStreamBus

        url = request.getfixturevalue("redis_url")
        prefix = request.getfixturevalue("redis_prefix_factory")()
        made = RedisStreamBus(url, consumer="c", prefix=prefix)
    else:
        from ctxkeep.fabric.postgres import PostgresBus

        factory: Callable[[], str] = request.getfixturevalue("postgres_schema_factory")
        made = PostgresBus(factory(), consumer="c")
    yield made
    close = getattr(made, "close", None)
    if close is not None:
        close()


def stats(bus: MessageBus) -> tuple[int, int, int]:
    found = bus.stats()
    assert isinstance(found, BusStats)
    return found.depth, found.pending, found.dead_letters


def test_depth_and_pending_follow_sends_receives_acks_and_recover(bus: MessageBus) -> None:
    for agent in ("a", "b", "c"):
        bus.register(agent, "t")
    bus.subscribe("b", "news")
    bus.subscribe("c", "news")
    assert stats(bus) == (0, 0, 0)
    for n in range(3):
        bus.send(IPCMessage(sender="a", recipient="b", task_id="t", payload={"n": n}))
    bus.send(IPCMessage(sender="a", topic="news", task_id="t", payload="all"))  # to b and c
    assert stats(bus) == (5, 0, 0)  # a topic message counts once per recipient

    got = bus.receive("b", max_messages=2)
    assert len(got) == 2
    assert stats(bus) == (3, 2, 0)
    bus.ack("b", [got[0].id])
    assert stats(bus) == (3, 1, 0)
    assert bus.recover("b") == 1  # put back for replay: still delivered and unacked
    assert stats(bus) == (3, 1, 0)
    again = bus.receive("b", max_messages=10)
    assert again[0].id == got[1].id
    assert stats(bus) == (1, 3, 0)  # c's copy of the topic message waits
    bus.ack("b", [m.id for m in again])
    assert stats(bus) == (1, 0, 0)
    bus.ack("c", [m.id for m in bus.receive("c")])
    assert stats(bus) == (0, 0, 0)
    assert bus.stats().to_dict() == {"depth": 0, "pending": 0, "dead_letters": 0}


@pytest.mark.redis
def test_redis_counts_a_dead_letter_and_not_what_it_moved(
    redis_url: str, redis_prefix_factory: Callable[[], str]
) -> None:
    import redis

    from ctxkeep.fabric.redis_bus import RedisStreamBus

    bus = RedisStreamBus(redis_url, consumer="c", prefix=redis_prefix_factory())
    raw = redis.Redis.from_url(redis_url)
    try:
        bus.register("b", "t")
        raw.xadd(bus.keys.inbox("b"), {"v": "1", "m": "not json"})
        bus.send(IPCMessage(sender="a", recipient="b", task_id="t", payload=1))
        assert stats(bus) == (2, 0, 0)
        assert [m.payload for m in bus.receive("b")] == [1]
        assert stats(bus) == (0, 1, 1)
    finally:
        raw.close()
        bus.close()


@pytest.mark.postgres
def test_postgres_counts_a_dead_letter_and_not_what_it_moved(
    postgres_schema_factory: Callable[[], str],
) -> None:
    import psycopg

    from ctxkeep.fabric.postgres import PostgresBus

    url = postgres_schema_factory()
    bus = PostgresBus(url, consumer="c")
    try:
        bus.register("b", "t")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO ctxkeep_bus_inbox (agent_id, message_id, version, message) "
                "VALUES ('b', 'x', 1, 'not json')"
            )
        bus.send(IPCMessage(sender="a", recipient="b", task_id="t", payload=1))
        assert stats(bus) == (2, 0, 0)
        assert [m.payload for m in bus.receive("b")] == [1]
        assert stats(bus) == (0, 1, 1)
    finally:
        bus.close()

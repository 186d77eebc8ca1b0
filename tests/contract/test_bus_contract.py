"""The message-bus conformance suite against every bus: in process and over Redis Streams."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ctxkeep.fabric.bus import InProcessBus, MessageBus
from ctxkeep.testing.contract import BusContract, MakeBus


class TestInProcessBus(BusContract):
    @pytest.fixture
    def make_bus(self) -> MakeBus:
        return InProcessBus


@pytest.mark.redis
class TestRedisStreamBus(BusContract):
    @pytest.fixture
    def make_bus(
        self, redis_url: str, redis_prefix_factory: Callable[[], str]
    ) -> Iterator[MakeBus]:
        from ctxkeep.fabric.redis_bus import RedisStreamBus

        made: list[RedisStreamBus] = []

        def make() -> MessageBus:
            bus = RedisStreamBus(redis_url, consumer="contract", prefix=redis_prefix_factory())
            made.append(bus)
            return bus

        yield make
        for bus in made:
            bus.close()

"""The message-bus conformance suite against every bus: in process, over Redis Streams and on
PostgreSQL tables.
"""

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


@pytest.mark.postgres
class TestPostgresBus(BusContract):
    @pytest.fixture
    def make_bus(self, postgres_schema_factory: Callable[[], str]) -> Iterator[MakeBus]:
        from ctxkeep.fabric.postgres import PostgresBus

        made: list[PostgresBus] = []

        def make() -> MessageBus:
            bus = PostgresBus(postgres_schema_factory(), consumer="contract")
            made.append(bus)
            return bus

        yield make
        for bus in made:
            bus.close()

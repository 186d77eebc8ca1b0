"""The checkpoint conformance suite against every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

from ctxkeep.checkpoints import open_checkpoints
from ctxkeep.checkpoints.redis import RedisCheckpointStore
from ctxkeep.errors import SchemaVersionError, StorageError
from ctxkeep.testing.contract import CheckpointContract


class TestMemoryCheckpoints(CheckpointContract):
    @pytest.fixture
    def checkpoints(self) -> Iterator[Any]:
        store = open_checkpoints("memory://")
        yield store
        store.close()


class TestSQLiteCheckpoints(CheckpointContract):
    @pytest.fixture
    def checkpoints(self, tmp_path: Path) -> Iterator[Any]:
        store = open_checkpoints(f"sqlite:///{tmp_path}/cp.db")
        yield store
        store.close()


@pytest.mark.redis
class TestRedisCheckpoints(CheckpointContract):
    @pytest.fixture
    def url(self, redis_url: str, redis_prefix_factory: Callable[[], str]) -> str:
        return f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}"

    @pytest.fixture
    def checkpoints(self, url: str) -> Iterator[Any]:
        store = open_checkpoints(url)
        yield store
        store.close()

    def test_keys_live_under_the_prefix(self, url: str, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        assert isinstance(checkpoints, RedisCheckpointStore)
        cid = checkpoints.save("agent-keys", CognitiveState(decision="d"))
        client = redis.Redis.from_url(url.split("?", 1)[0], decode_responses=True)
        try:
            keys = set(client.scan_iter(match=f"{checkpoints.keys.prefix}*"))
        finally:
            client.close()
        assert keys == {
            checkpoints.keys.record(cid),
            checkpoints.keys.index("agent-keys"),
            checkpoints.keys.seq("agent-keys"),
            checkpoints.keys.schema,
        }

    def test_stores_on_one_prefix_share_checkpoints(self, url: str, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        cid = checkpoints.save("agent-shared", CognitiveState(decision="from store 1"))
        with open_checkpoints(url) as other:
            assert other.load(cid).state.decision == "from store 1"
            other.save("agent-shared", CognitiveState(decision="from store 2"))
        latest = checkpoints.latest("agent-shared")
        assert latest.state.decision == "from store 2" and latest.seq == 2

    def test_a_newer_schema_is_refused(self, url: str, checkpoints: Any) -> None:
        client = redis.Redis.from_url(url.split("?", 1)[0], decode_responses=True)
        try:
            client.set(checkpoints.keys.schema, 99)
        finally:
            client.close()
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            open_checkpoints(url)

    def test_an_unreachable_server_is_a_storage_error(self) -> None:
        with pytest.raises(StorageError):
            RedisCheckpointStore("redis://127.0.0.1:1/0")


@pytest.mark.postgres
class TestPostgresCheckpoints(CheckpointContract):
    @pytest.fixture
    def checkpoints(self, postgres_schema_factory: Callable[[], str]) -> Iterator[Any]:
        store = open_checkpoints(postgres_schema_factory())
        yield store
        store.close()

    def test_newer_schema_is_refused(self, postgres_schema_factory: Callable[[], str]) -> None:
        import psycopg

        url = postgres_schema_factory()
        open_checkpoints(url).close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE ctxkeep_meta SET value = '99' WHERE key = 'checkpoints'")
        with pytest.raises(SchemaVersionError):
            open_checkpoints(url)

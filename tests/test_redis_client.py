"""The client every Redis store holds (``ctxkeep._redis.RedisClient``): URL and prefix, error
translation, optimistic transactions, Lua scripts and schema versions, against a real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.errors import ConfigError, SchemaVersionError, StorageError

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

from ctxkeep._redis import (  # noqa: E402
    LuaScript,
    Migration,
    Pipeline,
    RedisClient,
    describe_url,
    split_url,
)

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]

Open = Callable[..., RedisClient]


@pytest.fixture
def prefix(redis_prefix_factory: Callable[[], str]) -> str:
    return redis_prefix_factory()


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    """A plain redis-py client, to look at and plant keys."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def open_client(redis_url: str, prefix: str) -> Iterator[Open]:
    """Clients on the test's prefix (store ``demo`` unless told), closed after the test."""
    made: list[RedisClient] = []

    def open_(migrations: list[Migration] | None = None, **kwargs: Any) -> RedisClient:
        kwargs.setdefault("meta_key", "demo")
        client = RedisClient(
            redis_url,
            prefix=prefix,
            migrations=migrations if migrations is not None else [lambda c: None],
            **kwargs,
        )
        made.append(client)
        return client

    yield open_
    for client in made:
        client.close()


def recording(log: list[int], n: int) -> list[Migration]:
    """``n`` migrations that append their position to ``log``."""
    return [lambda client, i=i: log.append(i) for i in range(n)]


# -- the URL --------------------------------------------------------------------------------------


def test_the_prefix_comes_from_the_url_or_the_code() -> None:
    assert split_url("redis://h:1/0?prefix=p:") == ("redis://h:1/0", "p:")
    assert split_url("redis://h:1/0", "q:") == ("redis://h:1/0", "q:")
    assert split_url("redis://h:1/0") == ("redis://h:1/0", "ctxkeep:")


def test_two_different_prefixes_are_refused() -> None:
    with pytest.raises(ConfigError, match="two key prefixes"):
        split_url("redis://h:1/0?prefix=p:", "q:")


def test_where_names_the_server_but_never_the_password() -> None:
    assert describe_url("redis://user:secret@example.org/2") == "example.org:6379/2"
    assert describe_url("unix:///run/redis.sock") == "/run/redis.sock"


def test_a_stores_own_url_parameters_are_taken_out_for_it(redis_url: str, prefix: str) -> None:
    url = f"{redis_url}?ttl_grace=5&prefix={prefix}"
    with RedisClient(url, meta_key="demo", migrations=[], params=("ttl_grace",)) as client:
        assert client.params == {"ttl_grace": "5"}
        assert client.prefix == prefix
        assert client.conn.ping()  # redis-py never saw ttl_grace


def test_a_url_redis_py_cannot_read_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid Redis URL"):
        RedisClient("ftp://127.0.0.1/0", meta_key="demo", migrations=[])


def test_an_unreachable_server_is_a_storage_error_without_the_password() -> None:
    with pytest.raises(StorageError, match=r"127\.0\.0\.1:1/0") as info:
        RedisClient("redis://user:secret@127.0.0.1:1/0", meta_key="demo", migrations=[])
    assert "secret" not in str(info.value)
    assert isinstance(info.value.__cause__, redis.ConnectionError)


# -- errors and transactions ----------------------------------------------------------------------


def test_redis_errors_become_storage_errors(open_client: Open, prefix: str) -> None:
    client = open_client()
    client.conn.set(f"{prefix}text", "x")
    with pytest.raises(StorageError, match="WRONGTYPE") as info, client.errors():
        client.conn.lpush(f"{prefix}text", "y")
    assert isinstance(info.value.__cause__, redis.ResponseError)


def test_atomic_starts_over_when_a_watched_key_changes(
    open_client: Open, prefix: str, raw: Any
) -> None:
    client = open_client()
    key = f"{prefix}counter"
    raw.set(key, 0)
    attempts: list[int] = []

    def increment(pipe: Pipeline) -> int:
        value = int(pipe.get(key))
        if not attempts:
            raw.set(key, 10)  # another writer gets there first
        attempts.append(value)
        pipe.multi()
        pipe.set(key, value + 1)
        return value + 1

    assert client.atomic([key], increment) == 11
    assert attempts == [0, 10]
    assert raw.get(key) == "11"


def test_a_script_the_server_does_not_know_is_loaded_and_run(raw: Any) -> None:
    # A source of its own: no other test has loaded it, so the first run meets NOSCRIPT.
    script = LuaScript(raw, f"-- {uuid.uuid4().hex}\nreturn {{KEYS[1], ARGV[1], 7}}")
    assert raw.script_exists(script.sha) == [False]
    assert script(["k"], "v") == ["k", "v", 7]
    assert raw.script_exists(script.sha) == [True]
    assert script(["k2"], "w") == ["k2", "w", 7]


# -- schema versions ------------------------------------------------------------------------------


def test_a_fresh_prefix_gets_the_newest_version(open_client: Open, raw: Any) -> None:
    log: list[int] = []
    client = open_client(recording(log, 3))
    assert log == [0, 1, 2]
    assert raw.hgetall(client.meta) == {"demo": "3"}
    assert client.stored_version() == 3


def test_migrations_run_in_order_from_the_stored_version(open_client: Open) -> None:
    open_client(recording([], 1))
    log: list[int] = []
    client = open_client(recording(log, 3))
    assert log == [1, 2]
    assert client.stored_version() == 3


def test_a_current_store_runs_no_migration(open_client: Open) -> None:
    open_client(recording([], 2))
    log: list[int] = []
    open_client(recording(log, 2))
    assert log == []


def test_stores_keep_their_versions_side_by_side(open_client: Open, raw: Any) -> None:
    one = open_client(recording([], 1), meta_key="checkpoints")
    open_client(recording([], 2), meta_key="bus")
    assert raw.hgetall(one.meta) == {"checkpoints": "1", "bus": "2"}


def test_a_newer_version_is_refused_and_nothing_migrates(open_client: Open, raw: Any) -> None:
    client = open_client(recording([], 1))
    raw.hset(client.meta, "demo", 2)
    log: list[int] = []
    with pytest.raises(SchemaVersionError, match="demo of a newer ctxkeep"):
        open_client(recording(log, 1))
    assert log == []
    assert raw.hget(client.meta, "demo") == "2"


def test_a_version_that_is_not_a_number_is_refused(open_client: Open, raw: Any) -> None:
    client = open_client()
    raw.hset(client.meta, "demo", "one")
    with pytest.raises(SchemaVersionError, match="invalid schema version 'one'"):
        open_client()


def test_a_legacy_schema_key_is_adopted(open_client: Open, prefix: str, raw: Any) -> None:
    raw.set(f"{prefix}schema:demo", 1)  # as stores wrote it before the meta hash
    log: list[int] = []
    client = open_client(recording(log, 2), legacy_schema_key=True)
    assert log == [1]
    assert raw.hget(client.meta, "demo") == "2"


def test_the_legacy_key_is_kept_in_step_for_older_releases(
    open_client: Open, prefix: str, raw: Any
) -> None:
    raw.set(f"{prefix}schema:demo", 1)
    client = open_client(recording([], 2), legacy_schema_key=True)
    assert client.legacy_key == f"{prefix}schema:demo"
    assert raw.get(client.legacy_key) == "2"  # a release reading only this key now refuses


def test_a_newer_legacy_version_is_refused(open_client: Open, prefix: str, raw: Any) -> None:
    raw.set(f"{prefix}schema:demo", 5)
    with pytest.raises(SchemaVersionError, match="schema 5"):
        open_client(recording([], 1), legacy_schema_key=True)


def test_a_store_without_a_legacy_key_ignores_one(open_client: Open, prefix: str, raw: Any) -> None:
    raw.set(f"{prefix}schema:demo", 5)
    client = open_client(recording([], 1))
    assert client.stored_version() == 1

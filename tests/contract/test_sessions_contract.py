"""The session conformance suite against every backend."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg
import pytest
import redis

from ctxkeep._redis import split_url
from ctxkeep.errors import SchemaVersionError, StorageError
from ctxkeep.messages import Message
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.postgres import PostgresBackend
from ctxkeep.sessions.redis import RedisBackend
from ctxkeep.testing.contract import MakeMemory, SessionContract


def _manager(url: str, config: MemoryConfig, clock: Any = None) -> MemoryManager:
    # Exactly as a user gets one: the URL's store with the config's limits.
    return open_memory(url, config, clock=clock)


class TestMemoryBackend(SessionContract):
    @pytest.fixture
    def make_memory(self) -> MakeMemory:
        return lambda config, clock=None: _manager("memory://", config, clock)


class TestSQLiteBackend(SessionContract):
    @pytest.fixture
    def make_memory(self, tmp_path: Path) -> MakeMemory:
        counter = iter(range(1000))
        return lambda config, clock=None: _manager(
            f"sqlite:///{tmp_path}/s{next(counter)}.db", config, clock
        )


def _with_query(url: str, **params: str) -> str:
    return url + ("&" if "?" in url else "?") + urlencode(params)


@pytest.mark.redis
class TestRedisBackend(SessionContract):
    @pytest.fixture
    def make_memory(self, redis_url: str, redis_prefix_factory: Callable[[], str]) -> MakeMemory:
        return lambda config, clock=None: _manager(
            _with_query(redis_url, prefix=redis_prefix_factory()), config, clock
        )

    @pytest.fixture
    def url(self, redis_url: str, redis_prefix_factory: Callable[[], str]) -> str:
        return _with_query(redis_url, prefix=redis_prefix_factory())

    def test_sweep_archives_before_redis_reclaims(self, url: str) -> None:
        evicted: list[Any] = []
        mem = open_memory(url, MemoryConfig(session_ttl=0.3, max_sessions=None))
        mem.add_evict_hook(evicted.append)
        try:
            sid = mem.create_session("agent-grace")
            mem.add_message(sid, "user", "remember me")
            time.sleep(0.4)  # idle past the TTL, inside the grace
            assert mem.sweep() == 1
            assert [m.content for e in evicted for m in e.messages] == ["remember me"]
            assert [m.content for m in mem.archived_messages(sid)] == ["remember me"]
        finally:
            mem.close()

    def test_native_ttl_reclaims_keys_and_indexes_forget_them(self, url: str) -> None:
        url = _with_query(url, ttl_grace="0")
        mem = open_memory(url, MemoryConfig(session_ttl=0.3, max_sessions=None))
        backend = mem.backend
        assert isinstance(backend, RedisBackend)
        client = redis.Redis.from_url(_redis_url_of(url), decode_responses=True)
        try:
            sids = [mem.create_session("agent-native", task_id="t") for _ in range(3)]
            mem.add_message(sids[0], "user", "soon gone")
            # The deadline is rounded up to a whole millisecond (PEXPIREAT): 300 ms + 1.
            assert 0 < client.pttl(backend.keys.session(sids[0])) <= 301
            assert 0 < client.pttl(backend.keys.messages(sids[0])) <= 301
            time.sleep(0.5)  # Redis expires the keys by itself; no sweep runs
            assert not client.exists(*[backend.keys.session(s) for s in sids])
            assert backend.count() == 0
            assert backend.list_sessions(agent_id=None, task_id=None, limit=10, offset=0) == []
            assert backend.list_sessions(agent_id=None, task_id="t", limit=10, offset=0) == []
            assert backend.latest_for_agent("agent-native") is None
            assert backend.least_recent(10) == [] and backend.idle_since(1e12) == []
            for index in (backend.keys.created, backend.keys.accessed, backend.keys.expires):
                assert client.zcard(index) == 0
            assert client.zcard(backend.keys.agent("agent-native")) == 0
            assert client.zcard(backend.keys.task("t")) == 0
            assert client.hlen(backend.keys.owners) == 0
        finally:
            client.close()
            mem.close()

    def test_every_access_moves_the_expiry_deadline(self, url: str) -> None:
        # access_resolution=0: every read writes (the default writes past a second)
        mem = open_memory(
            url, MemoryConfig(session_ttl=600, max_sessions=None, access_resolution=0)
        )
        backend = mem.backend
        assert isinstance(backend, RedisBackend)
        client = redis.Redis.from_url(_redis_url_of(url), decode_responses=True)
        try:
            sid = mem.create_session("agent-deadline")
            mem.add_message(sid, "user", "hi")
            accesses: list[Callable[[str], object]] = [
                mem.get_messages,
                mem.get_session,
                lambda s: mem.add_message(s, "user", "x"),
            ]
            for access in accesses:
                for key in backend.keys.own(sid):
                    client.pexpire(key, 5_000)
                access(sid)
                for key in backend.keys.own(sid):
                    assert client.pttl(key) > 500_000
        finally:
            client.close()
            mem.close()

    def test_without_ttl_keys_do_not_expire(self, url: str) -> None:
        with open_memory(url, MemoryConfig(session_ttl=None, max_sessions=None)) as mem:
            backend = mem.backend
            assert isinstance(backend, RedisBackend)
            sid = mem.create_session("agent-forever")
            mem.add_message(sid, "user", "hi")
            client = redis.Redis.from_url(_redis_url_of(url))
            try:
                assert client.pttl(backend.keys.session(sid)) == -1
                assert client.pttl(backend.keys.messages(sid)) == -1
            finally:
                client.close()

    def test_prefixes_isolate_key_spaces(
        self, redis_url: str, redis_prefix_factory: Callable[[], str]
    ) -> None:
        config = MemoryConfig(session_ttl=None, max_sessions=None)
        with (
            open_memory(_with_query(redis_url, prefix=redis_prefix_factory()), config) as a,
            open_memory(_with_query(redis_url, prefix=redis_prefix_factory()), config) as b,
        ):
            sid = a.create_session("agent-x")
            assert not b.has_session(sid) and b.list_sessions() == []
            assert b.get_latest_session_for_agent("agent-x") is None

    def test_keys_written_by_a_newer_ctxkeep_are_refused(self, url: str) -> None:
        RedisBackend(url).close()
        prefix = split_url(url)[1]
        client = redis.Redis.from_url(_redis_url_of(url))
        try:
            client.hset(f"{prefix}meta", "sessions", 99)
        finally:
            client.close()
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            RedisBackend(url)

    def test_keys_of_the_first_release_are_adopted_and_identified(self, url: str) -> None:
        prefix = split_url(url)[1]
        with open_memory(url, MemoryConfig(session_ttl=None)) as mem:
            sid = mem.create_session("agent-old")
            for text in ("a", "b", "c"):
                mem.add_message(sid, "user", text)
        client = redis.Redis.from_url(_redis_url_of(url), decode_responses=True)
        try:  # back to the first release's layout: version key, no generation, seq 1 trimmed
            client.delete(f"{prefix}meta")
            client.set(f"{prefix}schema:sessions", 1)
            client.hdel(f"{prefix}session:{sid}", "generation", "first_seq")
            client.zremrangebyscore(f"{prefix}messages:{sid}", 1, 1)
        finally:
            client.close()
        with open_memory(url, MemoryConfig(session_ttl=None)) as mem:
            info = mem.get_session(sid)
            assert info.first_seq == 2 and len(info.generation) == 32
            assert [m.content for m in mem.build_prompt_messages(sid)] == ["b", "c"]
        client = redis.Redis.from_url(_redis_url_of(url), decode_responses=True)
        try:
            assert client.hget(f"{prefix}meta", "sessions") == "3"
            assert client.get(f"{prefix}schema:sessions") == "3"  # older releases refuse it
            roles = client.zrange(f"{prefix}roles:{sid}", 0, -1)  # migration 3: indexed
            assert roles == ["user:" + str(seq).zfill(len(roles[0]) - 5) for seq in (2, 3)]
        finally:
            client.close()

    def test_message_json_survives_byte_for_byte(self, url: str) -> None:
        _assert_exact_json(url)

    def test_unreachable_server_is_a_storage_error(self) -> None:
        with pytest.raises(StorageError, match="Redis"):
            RedisBackend("redis://127.0.0.1:1/0")


def _redis_url_of(url: str) -> str:
    """The redis-py part of a backend URL (without ``?prefix=`` or ``?ttl_grace=``)."""
    base, _, qs = url.partition("?")
    rest = "&".join(p for p in qs.split("&") if p and not p.startswith("ttl_grace="))
    return split_url(f"{base}?{rest}" if rest else base)[0]


def _assert_exact_json(url: str) -> None:
    meta = {"z": 1, "a": 0.1, "big": 2**53 + 1, "neg": -0.0, "ü": "日本\u2028", "e": 1e-7}
    with open_memory(url, MemoryConfig(session_ttl=None, max_sessions=None)) as mem:
        sid = mem.create_session("agent-json", metadata=meta)
        sent = Message("user", 'tab\t"quote" \\ \U0001f600', metadata=meta)
        mem.add_structured_message(sid, sent)
    with open_memory(url, MemoryConfig(session_ttl=None, max_sessions=None)) as mem:
        back = mem.get_messages(sid)[0]
        info = mem.get_session(sid)
    assert back == sent.replace(id=back.id, created_at=back.created_at)
    assert list(back.metadata) == list(meta) and list(info.metadata) == list(meta)
    assert repr(back.metadata["neg"]) == "-0.0" and back.metadata["big"] == 2**53 + 1
    assert info.metadata == meta


@pytest.mark.postgres
class TestPostgresBackend(SessionContract):
    @pytest.fixture
    def make_memory(self, postgres_schema_factory: Callable[[], str]) -> MakeMemory:
        return lambda config, clock=None: _manager(postgres_schema_factory(), config, clock)

    @pytest.fixture
    def url(self, postgres_schema_factory: Callable[[], str]) -> str:
        return postgres_schema_factory()

    def test_schema_setup_is_idempotent(self, url: str) -> None:
        with open_memory(url) as mem:
            sid = mem.create_session("agent-idem")
            mem.add_message(sid, "user", "kept")
        for _ in range(3):
            with open_memory(url) as mem:
                assert [m.content for m in mem.get_messages(sid)] == ["kept"]

    def test_database_written_by_a_newer_ctxkeep_is_refused(self, url: str) -> None:
        PostgresBackend(url).close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE ctxkeep_meta SET value = '99' WHERE key = 'sessions'")
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            PostgresBackend(url)

    def test_tables_of_the_first_release_are_upgraded_with_their_sessions(self, url: str) -> None:
        from ctxkeep.sessions.postgres import MIGRATIONS
        from ctxkeep.sessions.records import full_record, message_to_record

        record = json.dumps(full_record(message_to_record(Message("user", "kept"))))
        with psycopg.connect(url, autocommit=True) as conn:  # as the first release left it
            conn.execute(MIGRATIONS[0])
            conn.execute("CREATE TABLE ctxkeep_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("INSERT INTO ctxkeep_meta VALUES ('sessions', '1')")
            conn.execute(
                "INSERT INTO ctxkeep_sessions VALUES ('s1', 'a', NULL, '{}', 1, 2, 1, 4, '[]')"
            )
            conn.execute("INSERT INTO ctxkeep_messages VALUES ('s1', 3, %s)", (record,))
        with open_memory(url, MemoryConfig(session_ttl=None)) as mem:
            info = mem.get_session("s1")
            assert info.first_seq == 3 and len(info.generation) == 32
            mem.add_message("s1", "user", "new")
            assert [m.content for m in mem.build_prompt_messages("s1")] == ["kept", "new"]

    def test_message_json_survives_byte_for_byte(self, url: str) -> None:
        _assert_exact_json(url)

    def test_unreachable_server_is_a_storage_error(self) -> None:
        with pytest.raises(StorageError, match="PostgreSQL"):
            PostgresBackend("postgresql://postgres@127.0.0.1:1/postgres", timeout=1)

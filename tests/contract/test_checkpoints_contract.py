"""The checkpoint conformance suite against every backend."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

from ctxkeep._sqlite import SQLiteClient
from ctxkeep.checkpoints import Checkpoint, encode_checkpoint, open_checkpoints
from ctxkeep.checkpoints.redis import RedisCheckpointStore
from ctxkeep.cognition import CognitiveState
from ctxkeep.errors import ConfigError, InvalidTypeError, SchemaVersionError, StorageError
from ctxkeep.testing.contract import CheckpointContract


class MalformedInput:
    """Malformed input on every backend: the base checks it, so each backend answers alike.

    (Candidates for ``ctxkeep.testing.contract.CheckpointContract``.)
    """

    def test_a_huge_history_limit_means_all(self, checkpoints: Any) -> None:
        checkpoints.save("agent-huge", CognitiveState(decision="a"))
        checkpoints.save("agent-huge", CognitiveState(decision="b"))
        history = checkpoints.history("agent-huge", limit=10**30)
        assert [cp.state.decision for cp in history] == ["b", "a"]

    def test_a_zero_history_limit_gives_none(self, checkpoints: Any) -> None:
        checkpoints.save("agent-zero", CognitiveState())
        assert checkpoints.history("agent-zero", limit=0) == []
        with pytest.raises(ConfigError):
            checkpoints.history("agent-zero", limit=-1)

    @pytest.mark.parametrize(
        ("state", "private"),
        [
            (CognitiveState(context="\ud800"), None),
            (None, {"big": 10**30}),
            (None, {"\ud800": 1}),
        ],
        ids=["lone-surrogate", "int-beyond-64-bits", "surrogate-key"],
    )
    def test_a_value_json_cannot_hold_is_refused_and_nothing_stored(
        self, checkpoints: Any, state: Any, private: Any
    ) -> None:
        with pytest.raises(InvalidTypeError, match="cannot be stored as JSON"):
            checkpoints.save("agent-json", state, private=private)
        assert checkpoints.latest("agent-json") is None

    def test_ids_of_the_wrong_type_are_type_errors(self, checkpoints: Any) -> None:
        with pytest.raises(InvalidTypeError):
            checkpoints.save("agent-ids", None, session_id=5)
        with pytest.raises(InvalidTypeError):
            checkpoints.latest(["agent-ids"])
        with pytest.raises(InvalidTypeError):
            checkpoints.load(b"id")
        assert checkpoints.latest("agent-ids") is None


def test_open_checkpoints_refuses_a_url_with_a_control_character() -> None:
    with pytest.raises(ConfigError, match="control character"):
        open_checkpoints("sqlite:///a\x00b.db")


class TestMemoryCheckpoints(CheckpointContract, MalformedInput):
    @pytest.fixture
    def checkpoints(self) -> Iterator[Any]:
        store = open_checkpoints("memory://")
        yield store
        store.close()


def write_old_layout_file(path: Path, checkpoints: list[Checkpoint], *, version: int = 1) -> None:
    """A file as the SQLite checkpoint store wrote it before ``ctxkeep_meta``: the version in
    ``ctxkeep_checkpoint_meta``.
    """
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE ctxkeep_checkpoint_meta (version INTEGER NOT NULL)")
        conn.execute(
            "CREATE TABLE ctxkeep_checkpoints (checkpoint_id TEXT PRIMARY KEY, "
            "agent_id TEXT NOT NULL, seq INTEGER NOT NULL, session_id TEXT, "
            "record TEXT NOT NULL, UNIQUE (agent_id, seq))"
        )
        conn.execute("INSERT INTO ctxkeep_checkpoint_meta VALUES (?)", (version,))
        for cp in checkpoints:
            conn.execute(
                "INSERT INTO ctxkeep_checkpoints (checkpoint_id, agent_id, seq, session_id, "
                "record) VALUES (?, ?, ?, ?, ?)",
                (cp.checkpoint_id, cp.agent_id, cp.seq, cp.session_id, encode_checkpoint(cp)),
            )


OLD_CHECKPOINTS = [
    Checkpoint(
        checkpoint_id=f"old-{seq}",
        agent_id="agent-old",
        state=CognitiveState(decision=f"step {seq}"),
        session_id="s-old",
        created_at=1_700_000_000.0 + seq,
        seq=seq,
    )
    for seq in (1, 2)
]


class TestSQLiteCheckpoints(CheckpointContract, MalformedInput):
    @pytest.fixture
    def checkpoints(self, tmp_path: Path) -> Iterator[Any]:
        store = open_checkpoints(f"sqlite:///{tmp_path}/cp.db")
        yield store
        store.close()

    def test_an_old_layout_file_opens_with_its_checkpoints(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        write_old_layout_file(path, OLD_CHECKPOINTS)
        with open_checkpoints(f"sqlite:///{path}") as store:
            assert store.load("old-1") == OLD_CHECKPOINTS[0]
            assert [cp.checkpoint_id for cp in store.history("agent-old")] == ["old-2", "old-1"]
            store.save("agent-old", CognitiveState(decision="step 3"))
            assert store.latest("agent-old").seq == 3

    def test_an_old_layout_file_is_adopted_at_its_version(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        write_old_layout_file(path, OLD_CHECKPOINTS)
        open_checkpoints(f"sqlite:///{path}").close()
        db = SQLiteClient(path, meta_key="test", migrations=[])
        try:
            assert db.meta("checkpoints") == "1"
        finally:
            db.close()

    def test_an_old_layout_file_of_a_newer_ctxkeep_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        write_old_layout_file(path, OLD_CHECKPOINTS, version=2)
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            open_checkpoints(f"sqlite:///{path}")

    def test_a_newer_schema_is_refused(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path}/cp.db"
        open_checkpoints(url).close()
        db = SQLiteClient(tmp_path / "cp.db", meta_key="test", migrations=[])
        try:
            with db.tx("mark a newer schema") as conn:
                SQLiteClient.set_meta(conn, "checkpoints", "99")
        finally:
            db.close()
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            open_checkpoints(url)


@pytest.mark.redis
class TestRedisCheckpoints(CheckpointContract, MalformedInput):
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
            checkpoints.db.meta,
            checkpoints.db.legacy_key,
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
            client.hset(checkpoints.db.meta, "checkpoints", 99)
        finally:
            client.close()
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            open_checkpoints(url)

    @pytest.fixture
    def release_0_1_prefix(self, url: str) -> Iterator[str]:
        """The test's prefix holding :data:`OLD_CHECKPOINTS` as ctxkeep 0.1.0 wrote them: no
        ``meta`` hash, the version in ``schema:checkpoints``.
        """
        from ctxkeep._redis import split_url

        prefix = split_url(url)[1]
        client = redis.Redis.from_url(url.split("?", 1)[0], decode_responses=True)
        try:
            client.set(f"{prefix}schema:checkpoints", 1)
            for cp in OLD_CHECKPOINTS:
                client.set(f"{prefix}checkpoint:{cp.checkpoint_id}", encode_checkpoint(cp))
                client.zadd(f"{prefix}checkpoints:{cp.agent_id}", {cp.checkpoint_id: cp.seq})
                client.set(f"{prefix}checkpoint-seq:{cp.agent_id}", cp.seq)
            yield prefix
        finally:
            client.close()

    def test_checkpoints_of_release_0_1_are_read(self, url: str, release_0_1_prefix: str) -> None:
        with open_checkpoints(url) as store:
            assert store.load("old-1") == OLD_CHECKPOINTS[0]
            assert [cp.checkpoint_id for cp in store.history("agent-old")] == ["old-2", "old-1"]
            store.save("agent-old", CognitiveState(decision="step 3"))
            assert store.latest("agent-old").seq == 3

    def test_release_0_1_keys_are_adopted_at_their_version(
        self, url: str, release_0_1_prefix: str
    ) -> None:
        with open_checkpoints(url) as store:
            assert store.db.stored_version() == 1
        client = redis.Redis.from_url(url.split("?", 1)[0], decode_responses=True)
        try:
            assert client.hgetall(f"{release_0_1_prefix}meta") == {"checkpoints": "1"}
        finally:
            client.close()

    def test_a_newer_version_in_the_release_0_1_key_is_refused(
        self, url: str, release_0_1_prefix: str
    ) -> None:
        client = redis.Redis.from_url(url.split("?", 1)[0], decode_responses=True)
        try:
            client.set(f"{release_0_1_prefix}schema:checkpoints", 2)
        finally:
            client.close()
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            open_checkpoints(url)

    def test_an_unreachable_server_is_a_storage_error(self) -> None:
        with pytest.raises(StorageError):
            RedisCheckpointStore("redis://127.0.0.1:1/0")


@pytest.mark.postgres
class TestPostgresCheckpoints(CheckpointContract, MalformedInput):
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

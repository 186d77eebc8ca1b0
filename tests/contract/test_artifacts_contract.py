"""The artifact conformance suite against every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis

from ctxkeep._sqlite import SQLiteClient
from ctxkeep.artifacts import ArtifactStore, open_artifacts
from ctxkeep.artifacts.directory import VERSION_FILE
from ctxkeep.errors import StorageError
from ctxkeep.testing.contract import ArtifactContract, PersistentArtifactContract


@pytest.fixture
def opener() -> Iterator[Callable[[str], ArtifactStore]]:
    """``open_artifacts``, closing every store it opened after the test."""
    opened: list[ArtifactStore] = []

    def open_(url: str) -> ArtifactStore:
        opened.append(open_artifacts(url))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


class TestMemoryArtifacts(ArtifactContract):
    @pytest.fixture
    def artifacts(self, opener: Callable[[str], ArtifactStore]) -> ArtifactStore:
        return opener("memory://")


class OnURL:
    """``artifacts`` and ``reopen_artifacts`` as ``open_artifacts`` gives them for ``url``."""

    @pytest.fixture
    def artifacts(self, url: str, opener: Callable[[str], ArtifactStore]) -> ArtifactStore:
        return opener(url)

    @pytest.fixture
    def reopen_artifacts(
        self, url: str, opener: Callable[[str], ArtifactStore]
    ) -> Callable[[], ArtifactStore]:
        return lambda: opener(url)


class TestSQLiteArtifacts(OnURL, PersistentArtifactContract):
    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "artifacts.db"

    @pytest.fixture
    def url(self, path: Path) -> str:
        return f"sqlite:///{path}"

    @pytest.fixture
    def mark_newer_schema(self, path: Path) -> Callable[[], None]:
        def mark() -> None:
            db = SQLiteClient(path, meta_key="test", migrations=[])
            try:
                with db.tx("mark a newer schema") as conn:
                    SQLiteClient.set_meta(conn, "artifacts", "99")
            finally:
                db.close()

        return mark


class TestDirectoryArtifacts(OnURL, PersistentArtifactContract):
    @pytest.fixture
    def path(self, tmp_path: Path) -> Path:
        return tmp_path / "artifacts"

    @pytest.fixture
    def url(self, path: Path) -> str:
        return f"file://{path}"

    @pytest.fixture
    def mark_newer_schema(self, path: Path) -> Callable[[], None]:
        def mark() -> None:
            (path / VERSION_FILE).write_text("99\n", encoding="utf-8")

        return mark


@pytest.mark.redis
class TestRedisArtifacts(OnURL, PersistentArtifactContract):
    @pytest.fixture
    def url(self, redis_url: str, redis_prefix_factory: Callable[[], str]) -> str:
        return f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}"

    @pytest.fixture
    def mark_newer_schema(self, url: str, artifacts: Any) -> Callable[[], None]:
        def mark() -> None:
            client = redis.Redis.from_url(url.split("?", 1)[0])
            try:
                client.hset(artifacts.db.meta, "artifacts", 99)
            finally:
                client.close()

        return mark

    def test_keys_live_under_the_prefix(self, url: str, artifacts: Any) -> None:
        ref = artifacts.put("keyed")
        client = redis.Redis.from_url(url.split("?", 1)[0], decode_responses=True)
        try:
            keys = set(client.scan_iter(match=f"{artifacts.keys.prefix}*"))
        finally:
            client.close()
        assert keys == {artifacts.keys.artifact(ref), artifacts.db.meta}

    def test_an_unreachable_server_is_a_storage_error(self) -> None:
        with pytest.raises(StorageError):
            open_artifacts("redis://127.0.0.1:1/0")


@pytest.mark.postgres
class TestPostgresArtifacts(OnURL, PersistentArtifactContract):
    @pytest.fixture
    def url(self, postgres_schema_factory: Callable[[], str]) -> str:
        return postgres_schema_factory()

    @pytest.fixture
    def mark_newer_schema(self, url: str) -> Callable[[], None]:
        def mark() -> None:
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("UPDATE ctxkeep_meta SET value = '99' WHERE key = 'artifacts'")

        return mark

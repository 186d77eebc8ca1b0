"""The episodic conformance suite against every backend."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxkeep.episodic import open_episodic
from ctxkeep.testing.contract import EpisodicContract


class TestMemoryEpisodic(EpisodicContract):
    @pytest.fixture
    def store(self) -> Iterator[Any]:
        s = open_episodic("memory://", embedder="hash")
        yield s
        s.close()


class TestSQLiteEpisodic(EpisodicContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Any]:
        s = open_episodic(f"sqlite:///{tmp_path}/episodes.db", embedder="hash")
        yield s
        s.close()


@pytest.mark.postgres
class TestPostgresEpisodic(EpisodicContract):
    @pytest.fixture
    def store(self, postgres_schema_factory: Callable[[], str]) -> Iterator[Any]:
        s = open_episodic(postgres_schema_factory(), embedder="hash")
        yield s
        s.close()

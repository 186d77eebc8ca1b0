"""The session conformance suite against every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxkeep.sessions import open_backend
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.memory import SessionMemory
from ctxkeep.testing.contract import MakeMemory, SessionContract


def _manager(url: str, config: MemoryConfig, clock: object = None) -> MemoryManager:
    backend = open_backend(url, config)
    if isinstance(backend, SessionMemory):
        # The store's own sweeper runs on wall-clock time; tests drive the manager's clock.
        backend.close()
        backend = SessionMemory(max_size=None, ttl=None)
    kwargs = {"clock": clock} if clock is not None else {}
    return MemoryManager(backend, config, **kwargs)  # type: ignore[arg-type]


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

"""The session conformance suite through the HTTP service: :class:`RemoteMemory` against a
real uvicorn server on 127.0.0.1, one server per ``make_memory(config, clock)`` call (the
config and clock go to ``create_app``), over a SQLite store: the store a deployed server uses
(the server's manager over memory:// is the same code, checked by the local contract).

The suite's tests of "another process" (another manager over the same store, a store that
drops a session behind the manager's back) reach for ``memory.backend``: the adapter below
hands them the server tenant's own backend, which the server runs in this process, so they
run too (as another writer to the store the service reads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _server import ThreadedServer
from ctxkeep.client import RemoteMemory
from ctxkeep.server import create_app
from ctxkeep.sessions.base import Backend, MemoryConfig
from ctxkeep.testing.contract import MakeMemory, SessionContract

TENANT = "contract"


class _ServedMemory(RemoteMemory):
    """A RemoteMemory that owns its server, and shows the suite the server's store."""

    backend: Backend
    config: MemoryConfig

    def __init__(self, server: ThreadedServer, app: Any, key: str) -> None:
        super().__init__(server.url, key, timeout=30)
        self._server = server
        with app.state.ctxkeep.stores.lease(TENANT) as manager:
            self.backend = manager.backend
            self.config = manager.config

    def close(self) -> None:
        super().close()
        self._server.stop(wait=False)  # joined once the module's tests are done
        _STOPPING.append(self._server)


_STOPPING: list[ThreadedServer] = []


@pytest.fixture(scope="module", autouse=True)
def _join_servers() -> Iterator[None]:
    yield
    for server in _STOPPING:
        server.stop()
    _STOPPING.clear()


def _make_memory(url_for: Callable[[], str]) -> Iterator[MakeMemory]:
    made: list[_ServedMemory] = []

    def make(config: MemoryConfig, clock: Any = None) -> RemoteMemory:
        app = create_app(url_for(), config=config, clock=clock)
        _, key = app.state.ctxkeep.keys.create(TENANT)
        mem = _ServedMemory(ThreadedServer(app).start(), app, key)
        made.append(mem)
        return mem

    yield make
    for mem in made:
        if mem._server not in _STOPPING:
            mem.close()


class TestRemoteOverSQLite(SessionContract):
    @pytest.fixture
    def make_memory(self, tmp_path: Path) -> Iterator[MakeMemory]:
        counter = iter(range(1000))
        yield from _make_memory(lambda: f"sqlite:///{tmp_path}/s{next(counter)}.db")

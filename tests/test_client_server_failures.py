"""A server failure (5xx) reaches a remote client as the typed ctxkeep exception it stands
for, as a 4xx problem does (issue 25): a corrupt stored record is a ``CorruptRecordError``,
stored data of an unknown version a ``SchemaVersionError``, a kind of record the storage does
not offer a ``NotAvailableError``; each is also a :class:`RemoteError` with the status and
the problem, and a storage outage (503) or a bug (500) is a plain :class:`RemoteError` (a
``StorageError``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _server import ThreadedServer
from ctxkeep.client import AsyncRemoteMemory, RemoteMemory, _Calls
from ctxkeep.errors import CorruptRecordError, MissingDependencyError, RemoteError, StorageError
from ctxkeep.server import create_app, problems
from ctxkeep.sessions.sql import SQLBackend

SERVER_FAILURES = [k for k in problems.PROBLEMS if k.status >= 500]


def _response(kind: problems.ProblemKind) -> httpx.Response:
    problem = {"type": kind.type, "title": kind.title, "status": kind.status, "detail": "x"}
    request = httpx.Request("GET", "http://test/v1/stats")
    headers = {"content-type": problems.PROBLEM_CONTENT_TYPE}
    return httpx.Response(kind.status, json=problem, headers=headers, request=request)


@pytest.mark.parametrize("kind", SERVER_FAILURES, ids=lambda k: k.slug)
def test_every_server_failure_of_the_table_is_raised_as_its_typed_error(
    kind: problems.ProblemKind,
) -> None:
    with RemoteMemory("http://test", "key") as mem, pytest.raises(RemoteError) as raised:
        mem._answer(_Calls.session_count(), _response(kind))
    error = raised.value
    assert isinstance(error, StorageError)
    assert error.status == kind.status and error.problem["type"] == kind.type
    # A package the server lacks is not the caller's to install: a plain RemoteError.
    plain = kind.error in (problems.CtxkeepError, StorageError, MissingDependencyError)
    assert (type(error) is RemoteError) == plain, type(error)
    assert kind.error is not None and (plain or isinstance(error, kind.error))


@pytest.fixture
def corrupt_session(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A server on SQLite whose session ``s1`` has a message row that is not JSON: its URL,
    a key and the session id.
    """
    app = create_app(f"sqlite:///{tmp_path}/server.db")
    key = app.state.ctxkeep.keys.create("acme")[1]
    with app.state.ctxkeep.stores.lease("acme") as mem:
        sid = mem.create_session("agent", session_id="s1")
        mem.add_message(sid, "user", "hi")
        backend = mem.backend
        assert isinstance(backend, SQLBackend)
        with backend.db.tx("corrupt a row") as conn:
            conn.execute(backend._sql("UPDATE ctxkeep_messages SET record = ?"), ("{not json",))
        mem.reads.forget_cached(sid)
    server = ThreadedServer(app).start()
    try:
        yield server.url, key, sid
    finally:
        server.stop()


def test_a_corrupt_record_on_the_server_is_a_corrupt_record_error(
    corrupt_session: tuple[str, str, str],
) -> None:
    url, key, sid = corrupt_session
    with RemoteMemory(url, key) as mem:
        with pytest.raises(CorruptRecordError) as raised:
            mem.get_messages(sid)
        assert mem.session_count() == 1  # the client's next request goes through
    assert isinstance(raised.value, RemoteError) and raised.value.status == 500


def test_the_async_client_raises_the_same_typed_error(
    corrupt_session: tuple[str, str, str],
) -> None:
    url, key, sid = corrupt_session

    async def read() -> Any:
        async with AsyncRemoteMemory(url, key) as mem:
            return await mem.get_messages(sid)

    with pytest.raises(CorruptRecordError) as raised:
        asyncio.run(read())
    assert isinstance(raised.value, RemoteError) and raised.value.status == 500

"""Crash and retry: ``ctxkeep serve`` is killed (SIGKILL) with appends in flight, started
again on the same port, and :class:`RemoteMemory` retries (issue 25, items 3 and 4).

Four writer threads append their own messages, one at a time, each with an id of its own; a
message whose request failed is sent again (the client retries by itself, the writer once
more if the client gave up). Afterwards every message stored is stored exactly once, every
acknowledged one is stored, and each writer's messages keep its order. SQLite and PostgreSQL,
20 kills each.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from _cli import ctxkeep_script
from _server import free_port
from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.client import RemoteMemory, RetryPolicy
from ctxkeep.errors import RemoteError
from ctxkeep.server.keys import open_key_registry

__all__ = ["postgres_schema_factory", "postgres_url"]

KILLS = 20
WRITERS = 4
PER_WRITER = 240
"""Appends a writer makes at most: the session stays under the server's 1,000 messages
(``max_history``), so nothing is trimmed into the archive while the servers are killed."""
PATIENT = RetryPolicy(retries=30, backoff=0.05, max_backoff=0.5)  # outlasts a restart


class KilledServer:
    """``ctxkeep serve --db URL`` on one port, killed and started again on it."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        command = [ctxkeep_script(), "serve", "--db", self.db, "--port", str(self.port)]
        proc = subprocess.Popen(
            [*command, "--embedder", "hash"],
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return proc
            except httpx.HTTPError:
                time.sleep(0.05)
        proc.kill()
        proc.wait(timeout=30)
        raise RuntimeError(f"ctxkeep serve did not start on {self.db}")

    def kill_and_restart(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.proc = self._start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _writer(url: str, key: str, sid: str, w: int, stop: threading.Event, acked: list[str]) -> None:
    """Append ``w{w}-{i}`` for i = 0, 1, ... until ``stop`` (at most ``PER_WRITER``); each
    until it is acknowledged.
    """
    with RemoteMemory(url, key, retry=PATIENT, timeout=10) as mem:
        i = 0
        while not stop.is_set() and i < PER_WRITER:
            message_id = f"w{w}-{i}"
            try:
                mem.add_message(sid, "user", f"text of {message_id}", id=message_id)
            except RemoteError:
                continue  # the client gave up: the same message again
            acked.append(message_id)
            i += 1


def _crash_while_appending(db: str) -> None:
    registry = open_key_registry(db)
    _, key = registry.create("crash")
    registry.close()
    server = KilledServer(db)
    try:
        with RemoteMemory(server.url, key, retry=PATIENT) as mem:
            sid = mem.create_session("agent-crash")
        stop = threading.Event()
        acked: list[list[str]] = [[] for _ in range(WRITERS)]
        threads = [
            threading.Thread(target=_writer, args=(server.url, key, sid, w, stop, acked[w]))
            for w in range(WRITERS)
        ]
        for t in threads:
            t.start()
        rng = random.Random(25)
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.05, 0.4))
            server.kill_and_restart()
        stop.set()
        for t in threads:
            t.join(120)
        with RemoteMemory(server.url, key) as mem:
            stored = [m.id for m in mem.get_messages(sid)]
            assert mem.archived_messages(sid) == []  # nothing trimmed
    finally:
        server.stop()
    assert len(stored) == len(set(stored)), "a message was stored twice"
    for w in range(WRITERS):
        mine = [i for i in stored if i is not None and i.startswith(f"w{w}-")]
        assert mine[: len(acked[w])] == acked[w]  # every acknowledged one, in order
        assert len(mine) - len(acked[w]) <= 1  # at most the one in flight at the end
    assert sum(len(a) for a in acked) > KILLS  # appends went on between the kills


@pytest.mark.slow
def test_sqlite_stores_each_retried_append_once_through_server_kills(tmp_path: Path) -> None:
    _crash_while_appending(f"sqlite:///{tmp_path / 'crash.db'}")


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_stores_each_retried_append_once_through_server_kills(
    postgres_schema_factory: Callable[[], str],
) -> None:
    _crash_while_appending(postgres_schema_factory())

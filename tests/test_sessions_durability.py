"""Durability and cross-process atomicity of the session backends, with real processes.

* A writer process appends batches of messages and prints each batch number after its append
  returns; the test kills it with SIGKILL at a random moment, many times over one session.
  Afterwards every printed batch is stored, no batch is stored in part, every record decodes,
  and sequence numbers are gapless. SQLite and PostgreSQL (Redis keeps data in memory; its
  durability depends on the server's persistence settings, see ``ctxkeep.sessions.redis``).
* Four processes append 1,000 messages each to one session at once: none is lost or stored
  twice, each writer's messages keep their order, and sequence numbers are gapless.
"""

from __future__ import annotations

import inspect
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.messages import Message
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

KILL_TRIALS = 50
PREFETCH = 3
WRITERS = 4
PER_WRITER = 1000
UNBOUNDED = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


def batch(b: int) -> list[Message]:
    """The ``b``-th batch a writer appends: 1 to 3 messages of 50 B to 6 kB each."""
    rng = random.Random(b)
    size = 1 + b % 3
    return [
        Message(
            "user",
            f"batch {b} part {j} ünïcode 日本 " + "x" * rng.randrange(50, 6_000),
            metadata={"batch": b, "part": j, "of": size},
        )
        for j in range(size)
    ]


# The writers run this module's ``batch`` without importing the test module (and pytest).
COMMON = "import random\nfrom ctxkeep.messages import Message\n" + inspect.getsource(batch)

KILLED_WRITER = (
    COMMON
    + """
import sys
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig

mem = open_memory(sys.argv[1], MemoryConfig(max_history=None, session_ttl=None, max_sessions=None))
print("ready", flush=True)
sid = sys.stdin.readline().strip()  # the start signal names the session
b = 0
while True:
    mem.add_messages(sid, batch(b))
    print(b, flush=True)
    b += 1
"""
)

CONCURRENT_WRITER = """
import sys
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig

url, sid, w, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
mem = open_memory(url, MemoryConfig(max_history=None, session_ttl=None, max_sessions=None))
print("ready", flush=True)
sys.stdin.readline()  # the start signal: every writer begins at once
for i in range(n):
    mem.add_message(sid, "user", f"{w}:{i}")
mem.close()
print("done", flush=True)
"""


def _spawn(code: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """What the process printed, once it has exited. (Not ``communicate``: it reads the raw
    pipes and would miss what ``readline`` already buffered.)
    """
    assert proc.stdout is not None and proc.stderr is not None
    proc.wait(timeout=timeout)
    with proc.stdout, proc.stderr:
        out, err = proc.stdout.read(), proc.stderr.read()
    if proc.stdin is not None:
        proc.stdin.close()
    return out, err


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        _, err = _finish(proc, 30)
        pytest.fail(f"writer did not start: {line!r}\n{err}")


def _check_stored_batches(mem: MemoryManager, sid: str) -> int:
    """Assert the session holds whole batches 0..B-1, exactly as written, under gapless
    seqs; return B.
    """
    # The row and its messages from one snapshot: the killed writer's last statement may still
    # be running on the server (PostgreSQL finishes and commits an autocommit statement whose
    # client has gone), so separate reads could see it land between them.
    snap = mem.backend.read(sid)
    assert snap is not None
    info, rows = snap
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)), "seqs have a gap"
    assert info.message_count == len(rows) and info.next_seq == len(rows) + 1
    assert info.pending == ()
    stored = mem.get_messages(sid)[: len(rows)]  # every record decodes, or this raises
    b, i = 0, 0
    while i < len(stored):
        expected = batch(b)
        got = stored[i : i + len(expected)]
        assert len(got) == len(expected), f"batch {b} stored in part: {len(got)} messages"
        for g, e in zip(got, expected, strict=True):
            assert (g.role, g.content, g.metadata) == (e.role, e.content, e.metadata)
        i += len(expected)
        b += 1
    return b


def _kill_at_random_moments(url: str) -> None:
    """Run KILL_TRIALS writers, one fresh session each, all on one database; kill each at a
    random moment and check what it left. Writers are started a few trials ahead (they wait
    for their session id), so the trials do not wait for Python to start.
    """
    seed = int(os.environ.get("CTXKEEP_DURABILITY_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    waiting = deque(_spawn(KILLED_WRITER, url, stdin=True) for _ in range(PREFETCH))
    spawned, written = PREFETCH, 0
    try:
        with open_memory(url, UNBOUNDED) as mem:
            for trial in range(KILL_TRIALS):
                proc = waiting.popleft()
                if spawned < KILL_TRIALS:
                    waiting.append(_spawn(KILLED_WRITER, url, stdin=True))
                    spawned += 1
                sid = mem.create_session("agent-killed")
                try:
                    _wait_ready(proc)
                    assert proc.stdin is not None
                    proc.stdin.write(sid + "\n")
                    proc.stdin.flush()
                    time.sleep(rng.uniform(0.02, 0.2))
                finally:
                    proc.send_signal(signal.SIGKILL)
                    out, err = _finish(proc, 30)
                assert proc.returncode == -signal.SIGKILL, err
                printed = [int(line) for line in out.split()]
                where = f"trial {trial}, seed {seed} (set CTXKEEP_DURABILITY_SEED to replay)"
                assert printed == list(range(len(printed))), where
                stored = _check_stored_batches(mem, sid)
                # Every batch whose append returned is there; at most the one in flight beyond.
                assert len(printed) <= stored <= len(printed) + 1, where
                written += stored
    finally:
        for proc in waiting:
            proc.kill()
            _finish(proc, 30)
    assert written > KILL_TRIALS, "the writers hardly wrote anything; the test proves little"


def _append_from_four_processes(url: str) -> None:
    with open_memory(url, UNBOUNDED) as mem:
        sid = mem.create_session("agent-concurrent")
    procs = [
        _spawn(CONCURRENT_WRITER, url, sid, str(w), str(PER_WRITER), stdin=True)
        for w in range(WRITERS)
    ]
    try:
        for p in procs:
            _wait_ready(p)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = _finish(p, 300)
            assert p.returncode == 0 and out.split() == ["done"], err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                _finish(p, 30)
    with open_memory(url, UNBOUNDED) as mem:
        rows = mem.backend.messages(sid)
        total = WRITERS * PER_WRITER
        assert [seq for seq, _ in rows] == list(range(1, total + 1))
        contents = [m.text for m in mem.get_messages(sid)]
        assert sorted(contents) == sorted(
            f"{w}:{i}" for w in range(WRITERS) for i in range(PER_WRITER)
        )
        for w in range(WRITERS):
            assert [c for c in contents if c.startswith(f"{w}:")] == [
                f"{w}:{i}" for i in range(PER_WRITER)
            ]
        info = mem.get_session(sid)
        assert info.next_seq == total + 1 and info.message_count == total


# -- SQLite -----------------------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "durable.db"
    yield f"sqlite:///{path}"
    with sqlite3.connect(path) as conn:  # the file is sound, not just readable
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


def test_sqlite_keeps_every_returned_append_through_sigkill(sqlite_url: str) -> None:
    _kill_at_random_moments(sqlite_url)


def test_sqlite_four_processes_append_without_loss_or_gaps(sqlite_url: str) -> None:
    _append_from_four_processes(sqlite_url)


# -- PostgreSQL -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_keeps_every_returned_append_through_sigkill(
    postgres_schema_factory: Callable[[], str],
) -> None:
    _kill_at_random_moments(postgres_schema_factory())


@pytest.mark.postgres
def test_postgres_four_processes_append_without_loss_or_gaps(
    postgres_schema_factory: Callable[[], str],
) -> None:
    _append_from_four_processes(postgres_schema_factory())


# -- Redis ------------------------------------------------------------------------------------


@pytest.mark.redis
def test_redis_four_processes_append_without_loss_or_gaps(
    redis_url: str, redis_prefix_factory: Callable[[], str]
) -> None:
    prefix = redis_prefix_factory()
    _append_from_four_processes(f"{redis_url}?{urlencode({'prefix': prefix})}")

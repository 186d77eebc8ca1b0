"""Trims under concurrent writers, failures and kills (issue 25: the trim race, item 7).

A CI run lost an acknowledged message: neither live nor archived. The cause: a trim remembered
the session's new first seq (``MemoryManager._first_seqs``) before it had archived and removed
anything, and the next trim in the process read the session from that hint and removed every
row up to its own cut, rows the first trim had read but not yet archived. A first trim that
then failed (or whose process was killed) lost them. Now the archive and the removal are one
step of the backend's (:meth:`~ctxkeep.sessions.base.Backend.remove_oldest` with ``archive``:
one transaction on SQL, one script on Redis) that moves the rows still there up to the cut,
and the hint is remembered once they are moved.

Every test ends with the same check: each acknowledged message is live or archived, exactly
once, and the archive followed by the live messages is in session (seq) order.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.errors import StorageError
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

WRITER = str(Path(__file__).with_name("_trim_writer.py"))
SWEEPER = str(Path(__file__).with_name("_sweeper.py"))
LIMIT = 50


def _config(limit: int = LIMIT) -> MemoryConfig:
    return MemoryConfig(max_history=limit, session_ttl=None, max_sessions=None)


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("postgres", marks=pytest.mark.postgres)])  # fmt: skip
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of each kind that several processes can share."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'trim.db'}"
    if request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix_factory")()
        return f"{request.getfixturevalue('redis_url')}?prefix={prefix}"
    url: str = request.getfixturevalue("postgres_schema_factory")()
    return url


def _check(mem: MemoryManager, sid: str, acked: dict[str, int], in_flight: int = 0) -> None:
    """Every acknowledged message live or archived, once; nothing else but up to
    ``in_flight`` messages whose answer never came; archive then live in seq order.
    """
    live = [str(m.id) for m in mem.get_messages(sid)]
    archived = [str(m.id) for m in mem.archived_messages(sid)]
    assert not set(live) & set(archived), "a message is both live and archived"
    assert len(archived) == len(set(archived)), "a message is archived twice"
    stored = set(live) | set(archived)
    missing = sorted(set(acked) - stored)
    assert not missing, f"acknowledged but neither live nor archived: {missing[:5]}"
    assert len(stored - set(acked)) <= in_flight, sorted(stored - set(acked))
    known = [i for i in archived + live if i in acked]
    assert known == sorted(known, key=acked.__getitem__), "not in session order"
    if not in_flight:  # (an append killed before its trim leaves the session over the limit)
        assert len(live) <= mem.config.max_history  # type: ignore[operator]


def _settled(url: str) -> None:
    """Wait until no statement of a killed process still runs on the store. PostgreSQL runs
    a statement its client sent to its end, a ``COMMIT`` too, and notices the client gone
    only then: a trim sent just before the kill may commit while the check reads the live
    messages and then the archive, in two statements, and the check would see a message in
    both (a read between the removal and its commit). Redis runs a script it received
    whole, before the next command; SQLite's writer dies with its process.
    """
    if not url.startswith("postgres"):
        return
    import psycopg

    from ctxkeep._pg import split_url

    address, _ = split_url(url)
    with psycopg.connect(address, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                "AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
            ).fetchone()
            if busy is not None and busy[0] == 0:
                return
            time.sleep(0.01)
    raise AssertionError("a killed writer's statement still runs on the server after 30 s")


def _writer(url: str, sid: str, name: str, count: int, threads: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, WRITER, url, sid, name, str(count), str(threads), str(LIMIT)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _acked(lines: str) -> dict[str, int]:
    """``{id: seq}`` of the ``{id} {seq}`` lines a writer printed (a cut last line ignored)."""
    found = {}
    for line in lines.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            found[parts[0]] = int(parts[1])
    return found


def test_writers_in_threads_and_processes_lose_nothing_and_archive_in_order(url: str) -> None:
    mem = open_memory(url, _config())
    try:
        sid = mem.create_session("agent-trim-race")
        procs = [_writer(url, sid, f"p{p}", 60, 2) for p in range(2)]
        acked: dict[str, int] = {}
        seq_of: dict[str, int] = {}
        backend, append = mem.backend, mem.backend.append

        def recording_append(session_id: str, batch: Any) -> list[int]:
            seqs: list[int] = append(session_id, batch)
            seq_of.update({r["id"]: s for s, r in zip(seqs, batch.records, strict=True)})
            return seqs

        backend.append = recording_append  # type: ignore[method-assign]

        def local(t: int) -> None:
            for i in range(60):
                mem.add_message(sid, "user", "x", id=f"local-t{t}-{i}")

        threads = [threading.Thread(target=local, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0
            acked.update(_acked(out))
        acked.update(seq_of)
        assert len(acked) == 6 * 60
        _check(mem, sid, acked)
    finally:
        mem.close()


def test_a_trim_that_fails_after_another_trim_ran_loses_nothing(url: str) -> None:
    """The CI loss, step by step: a trim stalls at its first storage write while a later append
    trims, then fails (as if its process were killed there).
    """
    mem = open_memory(url, _config(5))
    backend = mem.backend
    stalled, resume = threading.Event(), threading.Event()
    first = threading.Lock()

    def stall_first(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if first.acquire(blocking=False):  # the first write of any trim, once
                stalled.set()
                resume.wait(30)
                raise StorageError("killed here")
            return real(*args, **kwargs)

        return call

    backend.archive = stall_first(backend.archive)  # type: ignore[method-assign]
    backend.remove_oldest = stall_first(backend.remove_oldest)  # type: ignore[method-assign]
    try:
        sid = mem.create_session("agent-stalled-trim")
        for i in range(5):
            mem.add_message(sid, "user", "x", id=f"m{i}")
        failed: list[BaseException] = []

        def stalling_append() -> None:
            try:
                mem.add_message(sid, "user", "x", id="m5")
            except StorageError as exc:  # stored; its trim failed
                failed.append(exc)

        worker = threading.Thread(target=stalling_append)
        worker.start()
        assert stalled.wait(30)
        for i in range(6, 9):
            mem.add_message(sid, "user", "x", id=f"m{i}")
        resume.set()
        worker.join(30)
        assert failed
        mem.add_message(sid, "user", "x", id="m9")
        _check(mem, sid, {f"m{i}": i for i in range(10)})
    finally:
        resume.set()
        del backend.archive, backend.remove_oldest
        mem.close()


def test_no_message_is_both_live_and_archived_after_kills_mid_trim(url: str) -> None:
    """A writer process trimming on almost every append is killed (SIGKILL) again and again;
    after each kill the session and its archive are checked.
    """
    rng = random.Random(25)
    mem = open_memory(url, _config())
    acked: dict[str, int] = {}
    try:
        sid = mem.create_session("agent-killed-trims")
        for i in range(LIMIT):
            mem.add_message(sid, "user", "x", id=f"seed-{i}")
        acked.update({f"seed-{i}": i + 1 for i in range(LIMIT)})
        for k in range(8):
            proc = _writer(url, sid, f"k{k}", 0, 2)
            assert proc.stdout is not None
            first = proc.stdout.readline()  # it writes: kill it a moment later
            time.sleep(rng.uniform(0.02, 0.15))
            os.kill(proc.pid, signal.SIGKILL)
            acked.update(_acked(first + proc.stdout.read()))  # (what readline buffered too)
            proc.wait(30)
            proc.stdout.close()
            _settled(url)
            # each kill: a message in flight per thread, and a printed line it cut
            _check(mem, sid, acked, in_flight=3 * (k + 1))
        assert len(acked) > 2 * LIMIT  # the writers got past the limit between the kills
    finally:
        mem.close()


def test_no_message_is_both_live_and_archived_after_kills_mid_sweep(url: str) -> None:
    """A process reclaiming idle sessions (each archived, then deleted) is killed (SIGKILL)
    mid-sweep, again and again: every session is then whole and unarchived, or gone and
    archived whole.
    """
    rng = random.Random(7)
    mem = open_memory(url, MemoryConfig(max_history=None, session_ttl=None, max_sessions=None))
    try:
        for k in range(8):
            proc = subprocess.Popen(
                [sys.executable, SWEEPER, url, f"k{k}", "30"], stdout=subprocess.PIPE, text=True
            )
            assert proc.stdout is not None
            stored: dict[str, list[str]] = {}
            for line in proc.stdout:
                if line.strip() == "sweeping":
                    break
                sid, message_id = line.split()
                stored.setdefault(sid, []).append(message_id)
            time.sleep(rng.uniform(0.0, 0.03))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            proc.stdout.close()
            _settled(url)
            assert len(stored) == 30
            for sid, ids in stored.items():
                snap = mem.backend.read(sid)
                live = [] if snap is None else [r["id"] for _, r in snap[1]]
                archived = [m.id for m in mem.archived_messages(sid)]
                assert (live, archived) in ((ids, []), ([], ids)), sid
    finally:
        mem.close()

"""A read writes a session's access time only past ``MemoryConfig.access_resolution`` on a
store where that is a write transaction; in process every read sets it. Writes always do.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from ctxkeep import Message
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
    OrphanToolResultError,
    SessionNotFoundError,
)
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig


def _accessed(mem: object, sid: str) -> float:
    info = mem.backend.info(sid, touch=None, ttl=None)  # type: ignore[attr-defined]
    assert info is not None
    return float(info.accessed_at)


def test_sqlite_read_within_the_resolution_writes_nothing(tmp_path: Path) -> None:
    now = [1_000.0]
    url = f"sqlite:///{tmp_path / 's.db'}"
    with open_memory(url, MemoryConfig(access_resolution=2.0), clock=lambda: now[0]) as mem:
        sid = mem.create_session("a")
        mem.add_message(sid, "user", "hi")
        watcher = sqlite3.connect(tmp_path / "s.db")  # sees other connections' commits
        version = watcher.execute("PRAGMA data_version").fetchone()
        now[0] += 1.5
        mem.get_messages(sid)
        mem.get_session(sid)
        assert _accessed(mem, sid) == 1_000.0
        assert watcher.execute("PRAGMA data_version").fetchone() == version  # no commit
        now[0] += 1.0  # 2.5 s after the last write: past the resolution
        mem.get_messages(sid, limit=1)
        assert _accessed(mem, sid) == 1_002.5
        assert watcher.execute("PRAGMA data_version").fetchone() != version
        watcher.close()
        now[0] += 0.5
        mem.add_message(sid, "assistant", "hello")  # an append, by the same rule: not yet
        assert _accessed(mem, sid) == 1_002.5
        now[0] += 1.5
        mem.add_message(sid, "user", "again")  # 2 s after the last write: past it
        assert _accessed(mem, sid) == 1_004.5


def test_resolution_is_at_most_a_hundredth_of_the_ttl(tmp_path: Path) -> None:
    now = [1_000.0]
    config = MemoryConfig(session_ttl=10.0, access_resolution=5.0)
    assert config.touch_resolution == 0.1
    with open_memory(f"sqlite:///{tmp_path / 's.db'}", config, clock=lambda: now[0]) as mem:
        sid = mem.create_session("a")
        now[0] += 0.2
        mem.get_session(sid)
        assert _accessed(mem, sid) == 1_000.2


def test_zero_resolution_and_the_memory_backend_touch_on_every_read(tmp_path: Path) -> None:
    now = [1_000.0]
    for url, config in (
        (f"sqlite:///{tmp_path / 's.db'}", MemoryConfig(access_resolution=0)),
        ("memory://", MemoryConfig()),
    ):
        with open_memory(url, config, clock=lambda: now[0]) as mem:
            sid = mem.create_session("a")
            now[0] += 0.001
            mem.get_session(sid)
            assert _accessed(mem, sid) == now[0]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "1"])
def test_a_bad_resolution_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="access_resolution"):
        MemoryConfig(access_resolution=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_reads_and_replace_of_a_session_idle_past_its_ttl_reclaim_it(
    tmp_path: Path, url: str
) -> None:
    """The TTL test rides on the read's own snapshot (no read of the row before it)."""
    now = [1_000.0]
    url = f"sqlite:///{tmp_path / 's.db'}" if url == "sqlite" else url
    with open_memory(url, MemoryConfig(session_ttl=60), clock=lambda: now[0]) as mem:
        sids = [mem.create_session("a") for _ in range(4)]
        newest = {sid: mem.add_message(sid, "user", "hi") for sid in sids}
        now[0] += 61
        reads = [
            lambda sid: mem.get_messages(sid),
            lambda sid: mem.get_messages(sid, limit=1),
            lambda sid: mem.reads.decoded(sid),
            lambda sid: mem.replace_newest(sid, [], newest_id=newest[sid].id or ""),
        ]
        for sid, read in zip(sids, reads, strict=True):
            with pytest.raises(SessionNotFoundError):
                read(sid)
            assert mem.backend.info(sid, touch=None, ttl=None) is None  # reclaimed
            assert [m.content for m in mem.archived_messages(sid)] == ["hi"]


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_add_messages_creating_makes_the_session_only_where_there_is_none(
    tmp_path: Path, url: str
) -> None:
    now = [1_000.0]
    url = f"sqlite:///{tmp_path / 's.db'}" if url == "sqlite" else url
    with open_memory(url, MemoryConfig(session_ttl=60), clock=lambda: now[0]) as mem:
        mem.add_messages_creating("s", "agent", [Message("user", "one")])
        mem.add_messages_creating("s", "other-agent", [Message("user", "two")])
        info = mem.get_session("s")
        assert (info.agent_id, info.message_count) == ("agent", 2)
        now[0] += 61  # idle past the TTL: the next add starts a new session
        mem.add_messages_creating("s", "agent-2", [Message("user", "three")])
        assert [m.content for m in mem.get_messages("s")] == ["three"]
        assert mem.get_session("s").agent_id == "agent-2"
        with pytest.raises(InvalidMessageError):  # refused before any I/O: nothing made
            mem.add_messages_creating("t", "agent", [Message("user", "x", id="a\x00b")])
        assert not mem.has_session("t")
        with pytest.raises(OrphanToolResultError):  # refused by the append's own check
            mem.add_messages_creating("s", "agent", [Message("tool", "x", tool_call_id="c")])
        assert [m.content for m in mem.get_messages("s")] == ["three"]

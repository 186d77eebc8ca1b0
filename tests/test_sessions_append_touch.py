"""An append on a SQL store moves the session's access time only past the touch resolution
(``Append.touch_after``), as a read does (issue 26): within it the append's update leaves the
access-time index alone. The TTL test still counts from the time stored.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep import open_memory
from ctxkeep.errors import SessionNotFoundError
from ctxkeep.messages import Message
from ctxkeep.sessions.base import MemoryConfig

__all__ = ["postgres_schema_factory", "postgres_url"]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/touch.db"
    return str(request.getfixturevalue("postgres_schema_factory")())


def _accessed(url: str, sid: str) -> float:
    with open_memory(url) as other:  # another manager: what is stored
        info = other.backend.info(sid, touch=None, ttl=None)
        assert info is not None
        return info.accessed_at


def test_appends_move_the_access_time_past_the_resolution(url: str) -> None:
    now = [1_000.0]
    config = MemoryConfig(access_resolution=2.0, session_ttl=None)
    with open_memory(url, config, clock=lambda: now[0]) as mem:
        sid = mem.create_session("a")
        for step, expected in ((1.0, 1_000.0), (0.5, 1_000.0), (1.0, 1_002.5), (1.9, 1_002.5)):
            now[0] += step
            mem.add_messages(sid, [Message("user", f"at {now[0]}")])
            assert _accessed(url, sid) == expected
        # a replace (a pop's, an Agents SDK join) by the same rule
        now[0] += 0.5  # 2.9 s after 1,002.5
        newest = mem.get_messages(sid, limit=1)[0]
        mem.replace_newest(sid, [Message("user", "replaced")], newest_id=newest.id or "")
        assert _accessed(url, sid) == now[0]
        assert [m.content for m in mem.get_messages(sid)][-1] == "replaced"


def test_resolution_zero_moves_it_on_every_append(url: str) -> None:
    now = [1_000.0]
    with open_memory(url, MemoryConfig(access_resolution=0.0), clock=lambda: now[0]) as mem:
        sid = mem.create_session("a")
        for _ in range(3):
            now[0] += 0.01
            mem.add_message(sid, "user", "hi")
            assert _accessed(url, sid) == now[0]


def test_the_ttl_counts_from_the_time_stored(url: str) -> None:
    now = [1_000.0]
    config = MemoryConfig(session_ttl=1_000.0, access_resolution=5.0)
    with open_memory(url, config, clock=lambda: now[0]) as mem:
        sid = mem.create_session("a")
        now[0] += 9.0  # the resolution is 5 s (a hundredth of the TTL is more): past it
        mem.add_message(sid, "user", "hi")
        assert _accessed(url, sid) == 1_009.0
        now[0] += 4.5  # within it: not moved
        mem.add_message(sid, "user", "again")
        assert _accessed(url, sid) == 1_009.0
        now[0] += 1_000.0 - 4.5 + 0.1  # idle past the TTL from what is stored
        with pytest.raises(SessionNotFoundError):
            mem.add_message(sid, "user", "late")

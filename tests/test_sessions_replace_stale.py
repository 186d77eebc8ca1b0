"""A replace of the newest message that is no longer the newest changes nothing (issue 26):
the SQL backends take the newest message and read it back in one statement, and put it back
by rolling the transaction back when it is not the one the caller read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest_services import (
    STORES,
    fresh_store_url,
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import open_memory
from ctxkeep.errors import SessionChangedError
from ctxkeep.messages import Message, ToolCall
from ctxkeep.sessions.base import MemoryConfig

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path, "replace")


def test_a_stale_replace_changes_nothing(url: str) -> None:
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory(url, config) as mem:
        sid = mem.create_session("a")
        call = ToolCall("c1", "run", "{}")
        mem.add_messages(sid, [Message("user", "q"), Message("assistant", None, tool_calls=[call])])
        older, newest = mem.get_messages(sid)
        before = mem.get_session(sid)
        for stale in (older.id or "", "no-such-id"):
            with pytest.raises(SessionChangedError):
                mem.replace_newest(sid, [Message("user", "x")], newest_id=stale)
        with pytest.raises(SessionChangedError):
            mem._replace(sid, [], newest_seq=1, generation=before.generation)
        after = mem.get_session(sid)
        assert mem.get_messages(sid) == [older, newest]
        assert (after.message_count, after.pending, after.revision, after.next_seq) == (
            before.message_count,
            before.pending,
            before.revision,
            before.next_seq,
        )
        # the newest one, by id: replaced, its call no longer waits
        mem.replace_newest(sid, [Message("assistant", "done")], newest_id=newest.id or "")
        assert [m.content for m in mem.get_messages(sid)] == ["q", "done"]
        info = mem.get_session(sid)
        assert info.pending == () and info.revision == before.revision + 1

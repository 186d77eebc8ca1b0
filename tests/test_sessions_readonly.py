"""Reads on a read-only store (issue 25, item 9): a read updates the session's access time, and
on a store that refuses writes that update is skipped (said in the log once), not an error.

SQLite: the file opened with ``?mode=ro`` (SQLite's own read-only open: the tests may run as
root, whom ``chmod`` does not stop). PostgreSQL: connections whose transactions are read-only
(``default_transaction_read_only``, as a read-only role or a standby gives).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.errors import SessionNotFoundError, StorageError
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig

__all__ = ["postgres_schema_factory", "postgres_url"]


def _fill(url: str) -> str:
    """A session with two messages and one trimmed into the archive; its id."""
    with open_memory(url, MemoryConfig(max_history=2)) as mem:
        sid = mem.create_session("agent-ro", task_id="t")
        for i in range(3):
            mem.add_message(sid, "user", f"m{i}")
    return sid


def _reads_work(url: str, sid: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ctxkeep.sessions.base"):
        mem = open_memory(url, MemoryConfig(access_resolution=0))  # every read tries to touch
        try:
            before = mem.backend.info(sid, touch=None, ttl=None)
            assert [m.content for m in mem.get_messages(sid)] == ["m1", "m2"]
            assert [m.content for m in mem.build_prompt_messages(sid)] == ["m1", "m2"]
            assert mem.get_session(sid).agent_id == "agent-ro"
            assert [s.session_id for s in mem.list_sessions(task_id="t")] == [sid]
            assert mem.get_latest_session_for_agent("agent-ro") == sid
            assert [m.content for m in mem.archived_messages(sid)] == ["m0"]
            assert mem.backend.info(sid, touch=None, ttl=None) == before  # not touched
            with pytest.raises(StorageError):
                mem.add_message(sid, "user", "refused")
        finally:
            mem.close()
    said = [r for r in caplog.records if "read-only" in r.getMessage()]
    assert len(said) == 1  # once, not per read


def test_sqlite_file_opened_read_only_serves_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ro.db"
    sid = _fill(f"sqlite:///{path}")
    _reads_work(f"sqlite:///{path}?mode=ro", sid, caplog)


def test_sqlite_read_only_session_idle_past_its_ttl_reads_as_expired(tmp_path: Path) -> None:
    path = tmp_path / "ro.db"
    sid = _fill(f"sqlite:///{path}")
    later = MemoryConfig(session_ttl=60)
    with open_memory(f"sqlite:///{path}?mode=ro", later, clock=lambda: 4e9) as mem:
        with pytest.raises(SessionNotFoundError):
            mem.get_messages(sid)  # expired: nothing can reclaim it, it is not shown
        assert [s.session_id for s in mem.list_sessions()] == [sid]  # still stored


def test_sqlite_read_only_open_of_an_old_schema_says_to_upgrade_it(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:  # a SQLite file without ctxkeep's tables
        conn.execute("CREATE TABLE other (x)")
    conn.close()
    with pytest.raises(StorageError, match="open it writable once"):
        open_memory(f"sqlite:///{path}?mode=ro")


@pytest.mark.postgres
def test_postgres_read_only_transactions_serve_reads(
    postgres_schema_factory: Callable[[], str], caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres_schema_factory()
    sid = _fill(url)
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query["options"] = query.get("options", "") + " -cdefault_transaction_read_only=on"
    read_only = urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))
    _reads_work(read_only, sid, caplog)

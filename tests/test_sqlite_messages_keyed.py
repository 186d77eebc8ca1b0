"""Schema 10 on SQLite (issue 26): each message keyed by its session's number and its seq
(``session_no * SEQ_SPAN + seq``), the table's own key, where schema 8 kept the ``(session_id,
seq)`` key in an index beside the rows.

An append or a pop then writes pages of the table, the id index and the session row only (no
key index: counted in the WAL, page by page); a file written at schema 9 keeps every session,
message, fold snapshot and archived message, and reads and writes on; session numbers stay
unique and within the key's range; a seq past it is refused, not stored under another
session's key.
"""

from __future__ import annotations

import sqlite3
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from _sqlite_schemas import as_schema
from ctxkeep import MemoryConfig, Message, ToolCall, open_memory
from ctxkeep.errors import StorageError
from ctxkeep.sessions.sql import _MAX_SESSION_NO, SEQ_SPAN
from ctxkeep.sessions.sqlite import MIGRATIONS, SQLiteBackend

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


@contextmanager
def written_pages(path: Path) -> Iterator[Counter[str]]:
    """The pages the block writes to ``path``'s WAL, counted by the b-tree each belongs to
    (``?`` for a page in none, a free one). A reader holds a snapshot meanwhile, so no
    checkpoint restarts the WAL under the count.
    """
    pin = sqlite3.connect(path, isolation_level=None)
    pin.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pin.execute("BEGIN")
    pin.execute("SELECT count(*) FROM sqlite_master").fetchall()
    size = pin.execute("PRAGMA page_size").fetchone()[0]
    wal = Path(str(path) + "-wal")
    start = max(wal.stat().st_size if wal.exists() else 0, 32)
    counts: Counter[str] = Counter()
    yield counts
    data = wal.read_bytes()
    pages = []
    for off in range(start, len(data) - 24 - size + 1, 24 + size):
        pages.append(struct.unpack(">I", data[off : off + 4])[0])
    pin.execute("COMMIT")
    names = dict(pin.execute("SELECT pageno, name FROM dbstat").fetchall())
    pin.close()
    counts.update(names.get(p, "?") for p in pages)


def _agent_turns(n: int) -> list[Message]:
    out = []
    for i in range(n):
        out += [
            Message("user", f"task {i}"),
            Message("assistant", None, tool_calls=[ToolCall(f"c{i}", "run", "{}")]),
            Message("tool", f"output {i} " + "x" * (i % 4 * 700), tool_call_id=f"c{i}"),
            Message("assistant", f"done {i}"),
        ]
    return out


def test_an_append_and_a_pop_write_no_key_index(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_memory(f"sqlite:///{path}?synchronous=full", CONFIG) as mem:
        sid = mem.create_session("agent")
        mem.add_messages(sid, _agent_turns(100))
        with written_pages(path) as added:
            mem.add_message(sid, "assistant", "one more")
        with written_pages(path) as popped:
            mem.pop_message(sid)
    kept = {"ctxkeep_messages", "ctxkeep_messages_id", "ctxkeep_sessions"}
    for pages in (added, popped):
        # Schema 9 wrote a page of sqlite_autoindex_ctxkeep_messages_1 (the (session_id,
        # seq) key's index) on each as well: 5 pages here where there are 4 now. The file's
        # header (page 1, sqlite_schema's) and a free-list page are written too where the
        # write takes or frees a page (records hold their times, so where a leaf splits can
        # move by a byte): seen once under load in a full run.
        assert kept <= set(pages) <= kept | {"sqlite_schema", "?"}, pages


def test_a_schema_9_file_keeps_every_session_message_fold_and_archived_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        sids = [mem.create_session("agent") for _ in range(3)]
        for i, sid in enumerate(sids):
            mem.add_messages(sid, _agent_turns(10 + i))
            mem.backend.put_fold(sid, mem.get_session(sid).generation, "k", f"fold {i}")
        info = mem.get_session(sids[0])
        mem.backend.remove_oldest(sids[0], info.first_seq + 3, info.generation, archive=True)
        mem.delete_session(sids[1])  # a gap in the rows' order
        sids.remove(sids[1])
        sids.append(mem.create_session("agent"))
        mem.add_messages(sids[-1], _agent_turns(3))
    as_schema(path, 9)
    with sqlite3.connect(path) as conn:
        assert (
            "seq_key"
            not in conn.execute(
                "SELECT sql FROM sqlite_master WHERE name = 'ctxkeep_messages'"
            ).fetchone()[0]
        )
        rows = conn.execute(
            "SELECT session_id, seq, record, role, message_id FROM ctxkeep_messages "
            "ORDER BY session_id, seq"
        ).fetchall()
    SQLiteBackend(path).close()  # migrates
    with sqlite3.connect(path) as conn:
        assert (
            conn.execute(
                "SELECT session_id, seq, record, role, message_id FROM ctxkeep_messages "
                "ORDER BY session_id, seq"
            ).fetchall()
            == rows
        )
        numbers = dict(conn.execute("SELECT session_id, session_no FROM ctxkeep_sessions"))
        assert sorted(numbers.values()) == [1, 2, 3]
        keys = conn.execute("SELECT seq_key, session_id, seq FROM ctxkeep_messages").fetchall()
        assert all(k == numbers[s] * SEQ_SPAN + q for k, s, q in keys)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        version = conn.execute("SELECT value FROM ctxkeep_meta WHERE key = 'sessions'")
        assert int(version.fetchone()[0]) == len(MIGRATIONS) == 10
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        for i, sid in enumerate(sids[:2]):
            msgs = mem.get_messages(sid)
            assert [m.content for m in msgs] == [
                m.content for m in _agent_turns(10 + 2 * i)[4 if i == 0 else 0 :]
            ]
            assert mem.backend.get_fold(sid, "k") == f"fold {2 * i}"
        assert len(mem.archived_messages(sids[0])) == 4
        # It reads and writes on: a pop, a retried id (stores nothing), a new message.
        newest = mem.get_messages(sids[2])[-1]
        assert mem.pop_message(sids[2]) == newest
        mem.add_messages(sids[2], [newest])
        assert mem.add_messages(sids[2], [newest]) == [newest]
        assert mem.get_messages(sids[2])[-1] == newest
        assert mem.get_session(sids[2]).message_count == 12
        new = mem.create_session("agent")
        mem.add_message(new, "user", "after the migration")
        assert [m.content for m in mem.get_messages(new)] == ["after the migration"]


def test_session_numbers_stay_unique_past_the_highest(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        first = mem.create_session("agent")
        mem.add_message(first, "user", "first")
        top = mem.create_session("agent")
        mem.add_message(top, "user", "top")
    with sqlite3.connect(path) as conn:  # as if two billion sessions had come and gone
        conn.execute(
            "UPDATE ctxkeep_messages SET seq_key = ? + seq WHERE session_id = ?",
            (_MAX_SESSION_NO * SEQ_SPAN, top),
        )
        conn.execute(
            "UPDATE ctxkeep_sessions SET session_no = ? WHERE session_id = ?",
            (_MAX_SESSION_NO, top),
        )
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        made = [mem.create_session("agent") for _ in range(3)]
        for sid in made:
            mem.add_message(sid, "user", sid)
        mem.add_message(top, "user", "top again")
        for sid in made:
            assert [m.content for m in mem.get_messages(sid)] == [sid]
        assert [m.content for m in mem.get_messages(top)] == ["top", "top again"]
        assert [m.content for m in mem.get_messages(first)] == ["first"]
    with sqlite3.connect(path) as conn:
        numbers = [r[0] for r in conn.execute("SELECT session_no FROM ctxkeep_sessions")]
    assert len(set(numbers)) == 5 and max(numbers) == _MAX_SESSION_NO
    assert max(numbers) * SEQ_SPAN + SEQ_SPAN < 2**63


def test_a_seq_past_the_keys_range_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "kept")
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE ctxkeep_sessions SET next_seq = ?", (SEQ_SPAN,))
    with open_memory(f"sqlite:///{path}", CONFIG) as mem:
        with pytest.raises(StorageError, match="CHECK"):
            mem.add_message(sid, "user", "would be another session's key")
        assert [m.content for m in mem.get_messages(sid)] == ["kept"]

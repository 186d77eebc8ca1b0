"""The Agents SDK session's single add, pop and ``get_items(limit=20)`` on SQLite do the same
work in a session of 10,000 items as in one of 100 (issue 26: ``add_items`` of one item read
1.05x ``SQLiteSession`` at 1,000 and 0.46x at 10,000 in ``bench/peers.py``).

Work is counted, not timed: the SQL statements each operation sends (``set_trace_callback``),
the virtual-machine instructions SQLite runs for them (``set_progress_handler`` at every
instruction: a statement that visits the session's rows, a count, a scan or a read of the whole
history, runs instructions in proportion) and the Python calls in the store's worker thread
(``sys.setprofile`` there). Both sessions hold the same repeated unit, so the newest messages,
and so every count, are the same at either size unless something costs in proportion to the
session.
"""

from __future__ import annotations

import _sqlite3
import asyncio
import ctypes
import sqlite3
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from ctxkeep import MemoryConfig, MemoryManager, open_memory
from ctxkeep.integrations import openai_agents
from ctxkeep.integrations.openai_agents import CtxkeepSession
from ctxkeep.sessions import base as sessions_base

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


def _unit(i: int) -> list[dict[str, Any]]:
    """A turn: the user's message, a function call, its output, the answer."""
    call = f"call_{i}"
    return [
        {"type": "message", "role": "user", "content": f"question {i}"},
        {"type": "function_call", "call_id": call, "name": "ls", "arguments": '{"path": "."}'},
        {"type": "function_call_output", "call_id": call, "output": f"file_{i}.py"},
        {"type": "message", "role": "assistant", "content": f"answer {i}"},
    ]


def _items(n: int) -> list[dict[str, Any]]:
    return [item for i in range(n // 4) for item in _unit(i)]


_LIB = ctypes.CDLL(_sqlite3.__file__)
_LIB.sqlite3_db_filename.restype = ctypes.c_char_p
_LIB.sqlite3_db_filename.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_LIB.sqlite3_db_status.argtypes = [
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.POINTER(ctypes.c_int),
    ctypes.POINTER(ctypes.c_int),
    ctypes.c_int,
]
_CACHE_HIT, _CACHE_MISS = 7, 8  # SQLITE_DBSTATUS_CACHE_HIT / _MISS


def _pages(conn: sqlite3.Connection, path: Path) -> Callable[[], int]:
    """The pages ``conn`` has asked its cache for so far (hits and misses: every b-tree page
    a statement visits, a ``count(*)`` walking the table included, which is one instruction).
    The connection's ``sqlite3 *`` is read from CPython's object, checked by its file name.
    """
    handle = ctypes.c_void_p.from_address(id(conn) + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    name = _LIB.sqlite3_db_filename(handle, b"main") if handle else None
    if name is None or Path(name.decode()) != path:
        pytest.skip("this Python's sqlite3.Connection does not start with its sqlite3 handle")
    cur, high = ctypes.c_int(), ctypes.c_int()

    def pages() -> int:
        total = 0
        for op in (_CACHE_HIT, _CACHE_MISS):
            _LIB.sqlite3_db_status(handle, op, ctypes.byref(cur), ctypes.byref(high), 0)
            total += cur.value
        return total

    return pages


class _Counts:
    """Statements, SQLite instructions, pages visited and Python calls of the worker
    thread, while on.
    """

    def __init__(self, memory: MemoryManager, path: Path) -> None:
        self.on = False
        self.counts: Counter[str] = Counter()
        worker = openai_agents._worker_for(memory)
        assert worker is not None

        def install() -> sqlite3.Connection:
            conn: sqlite3.Connection = memory.backend.db.conn()  # type: ignore[attr-defined]
            conn.set_trace_callback(self._statement)
            conn.set_progress_handler(self._instruction, 1)
            sys.setprofile(self._call)
            return conn

        self.pages = _pages(worker.submit(install).result(), path)
        self.uninstall = lambda: worker.submit(sys.setprofile, None).result()

    def _statement(self, _: str) -> None:
        if self.on:
            self.counts["statements"] += 1

    def _instruction(self) -> int:
        if self.on:
            self.counts["instructions"] += 1
        return 0

    def _call(self, _frame: Any, event: str, _arg: Any) -> None:
        if self.on and event in ("call", "c_call"):
            self.counts["python calls"] += 1

    def of(self, op: Callable[[], Any]) -> dict[str, int]:
        self.counts.clear()
        # Message ids (and Redis op tokens) are made 64 at a time into a pool the whole
        # process shares: a refill inside the counted op is some 68 Python calls, and
        # whether one falls there depends on what earlier tests in this worker took.
        if len(sessions_base._IDS) < 8:
            sessions_base._IDS.append(sessions_base._more_ids())
        before = self.pages()
        self.on = True
        try:
            op()
        finally:
            self.on = False
        self.counts["pages"] = self.pages() - before
        return dict(self.counts)


def _work(tmp_path: Path, size: int, warm: bool) -> dict[str, dict[str, int]]:
    """The counts of each operation on a session of ``size`` items: an add of the next item,
    its pop and a limited read, run twice (the second time counted: the first meets a cold
    cache and a state not yet known), back in the same state each time. ``warm``: the
    whole session read first, so the session holds its items (as ``bench/peers.py``'s order
    leaves it).
    """
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    items = _items(size + 4)
    path = tmp_path / f"{size}.db"
    with open_memory(f"sqlite:///{path}", CONFIG) as memory:
        session = CtxkeepSession("s", memory=memory)
        run(session.add_items(items[:size]))
        if warm:
            run(session.get_items())
        counts = _Counts(memory, path)
        ops: dict[str, Callable[[], Any]] = {
            "add_items, one item": lambda: run(session.add_items([items[size]])),
            "pop_item": lambda: run(session.pop_item()),
            "get_items(limit=20)": lambda: run(session.get_items(limit=20)),
        }
        try:
            for op in ops.values():
                op()
            out = {name: counts.of(op) for name, op in ops.items()}
            assert run(session.get_items()) == items[:size]
        finally:
            counts.uninstall()
            loop.close()
    return out


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "after-a-full-read"])
def test_an_add_a_pop_and_a_limited_read_cost_the_same_at_100_and_10000_items(
    tmp_path: Path, warm: bool
) -> None:
    small, big = _work(tmp_path, 100, warm), _work(tmp_path, 10_000, warm)
    for op, counts in small.items():
        assert counts["statements"] and counts["instructions"] and counts["pages"]
        assert big[op]["statements"] == counts["statements"], op
        assert big[op]["instructions"] == counts["instructions"], op
        # A b-tree one level deeper at 10,000 visits a page more on each descent.
        assert big[op]["pages"] <= counts["pages"] + 2 * counts["statements"], (op, big, small)
        # (a few calls either way: whether the worker's queue was found empty, a path taken)
        assert abs(big[op]["python calls"] - counts["python calls"]) <= 20, (op, big, small)

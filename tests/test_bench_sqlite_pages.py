"""bench/sqlite_pages.py: its WAL reader counts exactly the frames SQLite says it wrote (and
none of an earlier generation left in the file), and a tiny run measures every operation of
each pair. Counts, never timings.
"""

from __future__ import annotations

import importlib.util
import sqlite3
import sys
from pathlib import Path
from types import ModuleType

import pytest

from _bench import BENCH, run


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sqlite_pages", BENCH / "sqlite_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def _frames_in_wal(conn: sqlite3.Connection) -> int:
    """The frames SQLite itself counts in the WAL (a checkpoint that copies none back)."""
    return int(conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1])


def _wal_table(path: Path) -> sqlite3.Connection:
    """A new file in WAL mode, its one table ``t (k, v)`` made, autocommitting."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    return conn


def test_the_frames_counted_are_the_ones_sqlite_wrote(tmp_path: Path) -> None:
    bench = _bench()
    path = tmp_path / "x.db"
    conn = _wal_table(path)
    conn.execute("CREATE INDEX t_v ON t (v)")
    with bench.counting(path, trees=True) as written:
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO t (v) VALUES (?)", [(f"{i:05d}" * 200,) for i in range(30)])
        conn.execute("COMMIT")
        conn.execute("DELETE FROM t WHERE k = 3")
    assert len(written.pages) == _frames_in_wal(conn) > 10
    assert set(written.trees) <= {
        "t/leaf",
        "t/internal",
        "t/overflow",
        "t_v/leaf",
        "t_v/internal",
        "t_v/overflow",
        "sqlite_schema/leaf",
        "(free)",
    }
    assert any(t.startswith("t/") for t in written.trees)
    assert any(t.startswith("t_v/") for t in written.trees)
    conn.close()


def test_frames_of_an_earlier_generation_are_not_counted(tmp_path: Path) -> None:
    bench = _bench()
    path = tmp_path / "x.db"
    conn = _wal_table(path)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t (v) VALUES (?)", [("x" * 3000,) for _ in range(40)])
    conn.execute("COMMIT")
    # A RESTART checkpoint keeps the file's length: the next write starts the WAL over
    # with new salts, and the old frames after it are stale.
    assert conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()[0] == 0
    wal = Path(f"{path}-wal")
    before = wal.stat().st_size
    conn.execute("UPDATE t SET v = 'y' WHERE k = 1")
    assert wal.stat().st_size == before  # the stale frames are still in the file
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    assert len(bench.wal_pages(wal, size)) == _frames_in_wal(conn) < 5
    conn.close()


def test_a_tiny_run_counts_every_operation_of_each_pair(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    pytest.importorskip("langgraph.checkpoint.sqlite")
    out = tmp_path / "pages.json"
    rows, _ = run("sqlite_pages.py", "--sizes", "40", "--states", "2", "--trees", out=out)
    assert [(r["adapter"], r["operation"]) for r in rows] == [
        ("CtxkeepSession", "pop_item"),
        ("CtxkeepSession", "re-add after a pop"),
        ("CtxkeepSession", "fresh add_items (one)"),
        ("CtxkeepSaver", "step (put + put_writes)"),
    ]
    for r in rows:
        assert len(r["ctxkeep"]) == len(r["peer_frames"]) == 2
        assert min(r["ctxkeep"]) >= 1 and min(r["peer_frames"]) >= 1
        assert sum(r["ctxkeep_trees"].values()) == sum(r["ctxkeep"])
    pop = rows[0]["ctxkeep_trees"]
    assert "ctxkeep_messages/leaf" in pop and "ctxkeep_sessions/leaf" in pop

"""bench/agents_pop_split.py: its connections count each statement a pop runs under the kind
SQLite runs it as, only while a pop runs, and a tiny run splits every pop of both sides into
the statements each adapter sends. Counts, never timings.
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
    spec = importlib.util.spec_from_file_location("agents_pop_split", BENCH / "agents_pop_split.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_statements_are_counted_by_kind_and_only_while_timing(tmp_path: Path) -> None:
    bench = _bench()
    conn = sqlite3.connect(tmp_path / "x.db", factory=bench.TimedConnection)
    try:
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")  # not timing: not counted
        bench._TIMING[0] = True
        conn.execute("insert into t (v) values ('a')")
        conn.execute("  INSERT INTO t (v) VALUES (?)", ("b",))
        conn.commit()
        conn.execute("DELETE FROM t WHERE k = 1")
        bench._TIMING[0] = False
        conn.commit()  # not timing: not counted
    finally:
        bench._TIMING[0] = False
        conn.close()
    spent = {kind: int(n) for kind, (_, _, n) in bench._SPENT.items()}
    assert spent == {"INSERT": 2, "commit()": 1, "DELETE": 1}
    assert all(wall >= 0 and cpu >= 0 for wall, cpu, _ in bench._SPENT.values())


def test_a_tiny_run_splits_every_pop_of_both_sides(tmp_path: Path) -> None:
    pytest.importorskip("agents")
    out = tmp_path / "split.json"
    sides, printed = run(
        "agents_pop_split.py", "--size", "40", "--pops", "6", "--warm", "1", "--block", "4", out=out
    )
    assert list(sides) == ["CtxkeepSession", "SQLiteSession"]
    ours = {k: s["per_pop"] for k, s in sides["CtxkeepSession"]["statements"].items()}
    # one write transaction a pop: the take-back and the session row's counters
    assert ours == {"BEGIN": 1, "DELETE": 1, "UPDATE": 1, "COMMIT": 1}
    peer = sides["SQLiteSession"]["statements"]
    assert peer["DELETE"]["per_pop"] == peer["commit()"]["per_pop"] == 1
    for f in sides.values():
        assert 0 < f["wall_p25_ms"] <= f["wall_p50_ms"] <= f["wall_p75_ms"]
    assert "CtxkeepSession: wall p50" in printed

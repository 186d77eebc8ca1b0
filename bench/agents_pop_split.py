"""Where a ``pop_item`` of ``CtxkeepSession`` on SQLite spends its time, beside the SDK's
``SQLiteSession`` (issue 26): each statement's wall and thread CPU, and what is left outside
SQLite (Python, the hop to the worker thread and back).

    python bench/agents_pop_split.py [--size 10000] [--pops 600] [--block 10] [--json out.json]

Both sessions hold the ``size`` items of ``bench/peers.py`` in one folder (ctxkeep's at
``?synchronous=full``, the peer's at its default, full) and are popped in turns in one process
``--block`` pops of one side, then as many of the other (which goes first alternates), each
pop followed by the untimed re-add of the item it took, as ``bench/peers.py`` times
``pop_item`` (in blocks of 10; ``--block 1`` alternates every pop, which leaves neither side's
thread and caches warm from its own previous pop). Every connection either side opens is a
``sqlite3.Connection`` subclass timing its ``execute`` and ``commit`` calls while a pop runs
(``time.perf_counter`` and ``time.thread_time`` of the thread that runs them, so a statement's
CPU is not another thread's): a statement's wall minus its CPU is the time it waited (the
``COMMIT``'s ``fdatasync``, a lock). The first ``--warm`` pops of each side are not counted.

Counts of pages written per pop are ``bench/sqlite_pages.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import agent_items  # the bench's own data

_TIMING = [False]
"""Whether a pop is running: the statements are timed only then."""

_SPENT: defaultdict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
"""Per statement kind (its first word, or ``commit()``): wall, thread CPU, calls, since the
last reset.
"""


class TimedConnection(sqlite3.Connection):
    """A connection that adds each statement's time to :data:`_SPENT` while a pop runs."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if not _TIMING[0]:
            return super().execute(sql, *args)
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return super().execute(sql, *args)
        finally:
            _add(sql.split(None, 1)[0].upper(), t0, c0)

    def commit(self) -> None:
        if not _TIMING[0]:
            return super().commit()
        c0, t0 = time.thread_time(), time.perf_counter()
        try:
            return super().commit()
        finally:
            _add("commit()", t0, c0)


def _add(kind: str, t0: float, c0: float) -> None:
    spent = _SPENT[kind]
    spent[0] += time.perf_counter() - t0
    spent[1] += time.thread_time() - c0
    spent[2] += 1


def _timed_connections() -> None:
    """Every ``sqlite3.connect`` from now on makes a :class:`TimedConnection`."""
    connect = sqlite3.connect

    def timed_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return connect(*args, factory=TimedConnection, **kwargs)  # type: ignore[misc]

    sqlite3.connect = timed_connect  # type: ignore[assignment]


def measure(size: int, pops: int, warm: int, block: int = 10) -> dict[str, Any]:
    """Both sides popped ``pops`` times in turns of ``block`` pops; per side the figures
    printed.
    """
    _timed_connections()
    from agents.memory import SQLiteSession

    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    items = agent_items(size)
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
        sides = {
            "CtxkeepSession": CtxkeepSession(
                "main", f"sqlite:///{folder}/ck.db?synchronous=full", config=config
            ),
            "SQLiteSession": SQLiteSession("main", Path(folder) / "agents.db"),
        }
        walls: dict[str, list[float]] = {name: [] for name in sides}
        cpus: dict[str, list[float]] = {name: [] for name in sides}
        spent: dict[str, defaultdict[str, list[float]]] = {
            name: defaultdict(lambda: [0.0, 0.0, 0.0]) for name in sides
        }
        for session in sides.values():
            run(session.add_items(items))
        try:
            order = list(sides.items())
            for turn, first in enumerate(range(0, warm + pops, block)):
                for name, session in order if turn % 2 else reversed(order):
                    for i in range(first, min(first + block, warm + pops)):
                        _SPENT.clear()
                        _TIMING[0] = True
                        c0, t0 = time.process_time(), time.perf_counter()
                        item = run(session.pop_item())
                        t1, c1 = time.perf_counter(), time.process_time()
                        _TIMING[0] = False
                        if item != items[-1]:
                            raise RuntimeError(f"{name}: pop_item gave {item!r:.200}")
                        run(session.add_items([item]))
                        if i < warm:
                            continue
                        walls[name].append(t1 - t0)
                        cpus[name].append(c1 - c0)
                        for kind, (w, c, n) in _SPENT.items():
                            s = spent[name][kind]
                            s[0] += w
                            s[1] += c
                            s[2] += n
        finally:
            for session in sides.values():
                close = getattr(session, "close", None)
                if close is not None:
                    close()
            loop.close()
        for name in sides:
            w, c = sorted(walls[name]), cpus[name]
            sql_wall = sum(s[0] for s in spent[name].values()) / pops
            out[name] = {
                "wall_p50_ms": statistics.median(w) * 1e3,
                "wall_p25_ms": w[len(w) // 4] * 1e3,
                "wall_p75_ms": w[3 * len(w) // 4] * 1e3,
                "wall_mean_ms": statistics.mean(w) * 1e3,
                "process_cpu_p50_ms": statistics.median(c) * 1e3,
                "outside_sql_mean_ms": (statistics.mean(w) - sql_wall) * 1e3,
                "statements": {
                    kind: {
                        "per_pop": n / pops,
                        "wall_ms": wall / pops * 1e3,
                        "thread_cpu_ms": cpu / pops * 1e3,
                    }
                    for kind, (wall, cpu, n) in spent[name].items()
                },
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=10000, help="items each session holds")
    ap.add_argument("--pops", type=int, default=600, help="pops counted per side")
    ap.add_argument("--warm", type=int, default=20, help="pops not counted first, per side")
    ap.add_argument("--block", type=int, default=10, help="pops of one side before the other's")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    if args.size < 2 or args.pops < 1 or args.warm < 0 or args.block < 1:
        ap.error("--size >= 2, --pops >= 1, --warm >= 0, --block >= 1")
    out = measure(args.size, args.pops, args.warm, args.block)
    print(
        f"SQLite {sqlite3.sqlite_version}; {args.size:,} items; {args.pops} pops a side in "
        f"turns of {args.block}"
    )
    for name, f in out.items():
        print(
            f"{name}: wall p50 {f['wall_p50_ms']:.3f} ms (p25 {f['wall_p25_ms']:.3f}, p75 "
            f"{f['wall_p75_ms']:.3f}; mean {f['wall_mean_ms']:.3f}), process CPU p50 "
            f"{f['process_cpu_p50_ms']:.3f} ms, outside SQLite (mean) "
            f"{f['outside_sql_mean_ms']:.3f} ms"
        )
        for kind, s in f["statements"].items():
            print(
                f"    {kind:<10} x{s['per_pop']:.2f}  wall {s['wall_ms']:.3f} ms  "
                f"thread CPU {s['thread_cpu_ms']:.3f} ms"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

"""The first prompt of a process on a 10,000-message SQLite session, per pruner mode.

    python bench/cold_prompt.py [--messages 10000] [--repeat 5] [--stable-repeat 1] [--after 10]

The session is the demo generator's coding-agent session (as in ``sessions_bench.py``), written
once to a SQLite file. Each run opens the file with a new manager and a new pruner (nothing
cached: the first prompt of a new process) and times ``build_prompt_messages`` (budget 6,000,
``preserve_last_n=6``), side by side in one process, medians:

* ``TokenPruner(cache_stable=False)``: the session read newest first, page by page, until the
  prune provably equals the prune of it all (``ctxkeep.prune.tail``);
* the same pruner under a subclass: the manager reads and decodes every message (what every
  pruner got before paged reads; the floor of a pruner that needs the whole history);
* ``TokenPruner()`` (cache-stable, the default mode) with a fold snapshot stored: the session
  as earlier turns of some process left it (the snapshot of its last cut, ``--after`` messages
  appended since: this session cuts every few tool steps, so about one turn's), read from the
  snapshot's messages on and folded forward (``ctxkeep.prune.snapshots``); each run on a fresh
  copy of that file, so a snapshot a run writes does not help the next;
* the same with no snapshot: a replay of the whole history, every message decoded and its
  tokens counted (``--stable-repeat 0`` skips it: seconds per run);
* ``TokenPruner()`` again, as ``sessions_bench.py``'s "prompt, cold" measures it: the manager's
  cache cleared but the same pruner (with a snapshot stored, read from it again: the pruner's
  fold is keyed on the messages of the manager's earlier read).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctxkeep import MemoryConfig, TokenPruner, get_counter, open_memory
from ctxkeep.demo import demo_session

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


class WholeReadPruner(TokenPruner):
    """``TokenPruner`` under another type: the manager reads every message for it."""


def _session(n: int) -> list[Any]:
    msgs = demo_session(steps=n // 2, seed=11)[:n]
    while msgs[-1].tool_calls:  # end on a whole unit
        msgs.pop()
    return msgs


def _cold(url: str, make_pruner: Callable[[], Any], repeat: int) -> tuple[float, int]:
    times, kept = [], 0
    for _ in range(repeat):
        with open_memory(url, CONFIG) as mem:
            pruner = make_pruner()
            t0 = time.perf_counter()
            kept = len(mem.build_prompt_messages("big", pruner=pruner))
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, kept


def _cold_copies(template: Path, tmp: Path, repeat: int) -> tuple[float, int]:
    """Cold cache-stable prompts, each on a fresh copy of ``template`` (closed, so one file)."""
    times, kept = [], 0
    for i in range(repeat):
        path = tmp / f"copy{i}.db"
        shutil.copy(template, path)
        with open_memory(f"sqlite:///{path}", CONFIG) as mem:
            pruner = TokenPruner(6000, 6)
            t0 = time.perf_counter()
            kept = len(mem.build_prompt_messages("big", pruner=pruner))
            times.append(time.perf_counter() - t0)
        path.unlink()
    return statistics.median(times) * 1000, kept


def _stored_folds(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM ctxkeep_folds").fetchone()[0])


def _drop_folds(path: Path) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM ctxkeep_folds")
    conn.close()


def _warm_pruner(url: str, repeat: int) -> tuple[float, int]:
    pruner = TokenPruner(6000, 6, counter=get_counter())
    times, kept = [], 0
    with open_memory(url, CONFIG) as mem:
        mem.build_prompt_messages("big", pruner=pruner)
        for _ in range(repeat):
            mem._prompt_cache.clear()
            t0 = time.perf_counter()
            kept = len(mem.build_prompt_messages("big", pruner=pruner))
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stable-repeat", type=int, default=1)
    ap.add_argument("--after", type=int, default=10, help="messages appended after the snapshot")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cold.db"
        url = f"sqlite:///{path}"
        msgs = _session(args.messages)
        split = len(msgs) - args.after
        while msgs[split].role == "tool":  # appended whole units
            split -= 1
        with open_memory(url, CONFIG) as mem:
            mem.create_session("bench", session_id="big")
            mem.add_messages("big", msgs[:split])
            # An earlier process's turn: its prompt stores the fold snapshot of its last cut.
            mem.build_prompt_messages("big", pruner=TokenPruner(6000, 6))
            mem.add_messages("big", msgs[split:])
        assert _stored_folds(path) == 1
        template = Path(tmp) / "template.db"
        shutil.copy(path, template)
        whole = Path(tmp) / "whole.db"
        shutil.copy(path, whole)
        _drop_folds(whole)
        rows: list[tuple[str, float, int]] = []
        for name, make in (
            (
                "TokenPruner(cache_stable=False): paged",
                lambda: TokenPruner(6000, 6, cache_stable=False),
            ),
            ("the same, every message read", lambda: WholeReadPruner(6000, 6, cache_stable=False)),
        ):
            rows.append((name, *_cold(url, make, args.repeat)))
        rows.append(
            (
                "TokenPruner() (cache-stable): fold snapshot",
                *_cold_copies(template, Path(tmp), args.repeat),
            )
        )
        if args.stable_repeat:
            rows.append(
                (
                    "the same, no snapshot: whole replay",
                    *_cold_copies(whole, Path(tmp), args.stable_repeat),
                )
            )
        rows.append(
            ("TokenPruner(), same pruner (sessions_bench)", *_warm_pruner(url, args.repeat))
        )
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"first prompt of a process, {len(msgs):,}-message SQLite session, "
        f"{len(msgs) - split} appended after the last fold snapshot (load {load})"
    )
    for name, ms, kept in rows:
        print(f"  {name:<46} {ms:10.1f} ms   ({kept} messages in the prompt)")


if __name__ == "__main__":
    main()

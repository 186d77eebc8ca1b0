"""The first prompt of a process on a 10,000-message SQLite session, per pruner mode.

    python bench/cold_prompt.py [--messages 10000] [--repeat 5] [--stable-repeat 1]

The session is the demo generator's coding-agent session (as in ``sessions_bench.py``), written
once to a SQLite file. Each run opens the file with a new manager and a new pruner (nothing
cached: the first prompt of a new process) and times ``build_prompt_messages`` (budget 6,000,
``preserve_last_n=6``), side by side in one process, medians:

* ``TokenPruner(cache_stable=False)``: the session read newest first, page by page, until the
  prune provably equals the prune of it all (``ctxkeep.sessions.tail``);
* the same pruner under a subclass: the manager reads and decodes every message (what every
  pruner got before paged reads; the floor of a pruner that needs the whole history);
* ``TokenPruner()`` (cache-stable, the default mode): a replay of the whole history, every
  message decoded and its tokens counted (``--stable-repeat 0`` skips it: seconds per run);
* ``TokenPruner()`` again, as ``sessions_bench.py``'s "prompt, cold" measures it: the manager's
  cache cleared but the same pruner, whose fold of the session is reused.
"""

from __future__ import annotations

import argparse
import os
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'cold.db'}"
        msgs = _session(args.messages)
        with open_memory(url, CONFIG) as mem:
            mem.create_session("bench", session_id="big")
            mem.add_messages("big", msgs)
        rows: list[tuple[str, float, int]] = []
        for name, make in (
            (
                "TokenPruner(cache_stable=False): paged",
                lambda: TokenPruner(6000, 6, cache_stable=False),
            ),
            ("the same, every message read", lambda: WholeReadPruner(6000, 6, cache_stable=False)),
        ):
            rows.append((name, *_cold(url, make, args.repeat)))
        if args.stable_repeat:
            rows.append(
                (
                    "TokenPruner() (cache-stable): new pruner",
                    *_cold(url, TokenPruner, args.stable_repeat),
                )
            )
        rows.append(
            ("TokenPruner(), same pruner (sessions_bench)", *_warm_pruner(url, args.repeat))
        )
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"first prompt of a process, {len(msgs):,}-message SQLite session (load {load})")
    for name, ms, kept in rows:
        print(f"  {name:<46} {ms:10.1f} ms   ({kept} messages in the prompt)")


if __name__ == "__main__":
    main()

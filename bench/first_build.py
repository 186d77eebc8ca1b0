"""The first ``ContextBuilder.build`` of a new process beside the fast route, many rounds.

    python bench/first_build.py --messages 10000 --rounds 7
    python bench/first_build.py --messages 100000 --rounds 5 --db /tmp/first_build_100k.db

A session of ``--messages`` messages (``ctxkeep.demo.demo_session``) is written to a SQLite
file once and built once by an 8,192/1,024 builder (that stores its fold snapshot: the state
an agent loop's earlier turns leave); an existing file with such a session is reused. Then each
round starts two new processes, interleaved: one times ``ContextBuilder(...).build(sid)`` and one
``build_prompt_messages(sid, pruner=TokenPruner(7168))`` (the same history budget), each after
``get_counter()`` (the tokenizer load is not in the figure). Prints the median and range of
each in ms. Fewer rows than ``bench/cold_build.py`` (no never-built session, one backend), so
more rounds in the same time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ctxkeep import ContextBuilder, MemoryConfig, open_memory
from ctxkeep.demo import demo_session

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
CHILD = """
import sys, time
from ctxkeep import ContextBuilder, MemoryConfig, TokenPruner, get_counter, open_memory
get_counter()
config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
with open_memory(sys.argv[1], config) as mem:
    t = time.perf_counter()
    if sys.argv[3] == "builder":
        ContextBuilder(mem, max_prompt_tokens=8192, reserve_output_tokens=1024).build(sys.argv[2])
    else:
        mem.build_prompt_messages(sys.argv[2], pruner=TokenPruner(7168))
    print(time.perf_counter() - t)
"""


def _setup(url: str, n: int) -> str:
    with open_memory(url, CONFIG) as mem:
        found = mem.list_sessions(limit=1)
        if found:
            return found[0].session_id
        msgs = demo_session(steps=n // 2, seed=11)[:n]
        while msgs[-1].tool_calls:
            msgs.pop()
        sid = mem.create_session("bench")
        for i in range(0, len(msgs), 1000):
            mem.add_messages(sid, msgs[i : i + 1000])
        t = time.perf_counter()
        ContextBuilder(mem, max_prompt_tokens=8192, reserve_output_tokens=1024).build(sid)
        print(
            f"{len(msgs):,} messages written; the first build (stores the snapshot) "
            f"{time.perf_counter() - t:.1f} s"
        )
        return sid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--db", help="the SQLite file (default: a temporary one)")
    args = ap.parse_args()
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp()) / "first_build.db"
    url = f"sqlite:///{path}"
    sid = _setup(url, args.messages)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    times: dict[str, list[float]] = {"builder": [], "anchor": []}
    for _ in range(args.rounds):
        for which in times:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, url, sid, which],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            times[which].append(float(out.stdout) * 1000)
    print(f"{args.messages:,} messages, {args.rounds} rounds, load {os.getloadavg()[0]:.2f}")
    for which, ms in times.items():
        print(
            f"{which:8} median {statistics.median(ms):6.1f} ms  range {min(ms):.1f}-{max(ms):.1f}"
        )


if __name__ == "__main__":
    main()

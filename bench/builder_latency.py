"""How long ``ContextBuilder.build`` takes per turn, at step 50 and at step 5,000 of a session.

An agent loop stores each step (an assistant tool call and its result), then builds the next
prompt. This benchmark does the same: a session grows to a step, one build runs (the cold one:
no token counts cached, the pruner sees the history for the first time), then ``--turns``
more steps are each stored and built, and those builds are timed (``time.perf_counter``,
garbage collection on). The median and p90 of those are the latency per turn.

Every build composes all layers: a system prompt, the fabric view (task state and a private
scratchpad updated every turn), recall from 1,000 episodes (hash embedder: the dense half of
the search is cheaper than with the default local model, whose embedding of the query adds
its own time), the pruned history and the gate, in a 128k window with 4,096 tokens reserved.
Steps cycle through the real tool steps of ``../shared/data/trajectories`` (as in
``bench/prune_speed.py``; generated ones without it). Sessions keep every message
(``max_history=None``): at step 5,000 the store holds 10,000 messages, ~3M tokens.

Rows: backend (memory://, sqlite:/// in a temporary folder) x pruning mode (the default,
cache-stable, and ``cache_stable=False``) x step.

Usage:
    python bench/builder_latency.py
    python bench/builder_latency.py --steps 50,5000 --turns 21 --backends memory,sqlite
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ctxkeep import (
    ContextBuilder,
    ContextFabric,
    MemoryConfig,
    MemoryManager,
    Message,
    ToolCall,
    open_episodic,
    open_memory,
)
from prune_speed import Unit, source_material

WINDOW = 128_000
RESERVE = 4096
EPISODES = 1000


def steps_of(units: list[Unit]) -> Iterator[list[Message]]:
    """Endless steps: the units cycled, with fresh call ids."""
    call = 0
    k = 0
    while True:
        call_msg, results = units[k % len(units)]
        k += 1
        ids = {}
        calls = []
        for tc in call_msg.tool_calls:
            call += 1
            ids[tc.id] = f"call_{call}"
            calls.append(ToolCall(id=ids[tc.id], name=tc.name, arguments=tc.arguments))
        yield [
            Message("assistant", call_msg.content, tool_calls=calls),
            *(Message("tool", r.content, tool_call_id=ids[r.tool_call_id]) for r in results),
        ]


def make_episodic() -> object:
    store = open_episodic("memory://", embedder="hash")
    topics = ["timezone", "migration", "flaky test", "ORM query", "template", "cache", "admin"]
    store.save_episodes(
        {
            "session_id": f"past-{i // 10}",
            "task_goal": f"fix the {topics[i % len(topics)]} bug",
            "summary": f"Step {i}: traced the {topics[i % len(topics)]} failure to module "
            f"m{i % 37}; the fix was a guard in function f{i % 53}.",
        }
        for i in range(EPISODES)
    )
    return store


def measure(
    mem: MemoryManager,
    step: int,
    turns: int,
    cache_stable: bool | None,
    material: tuple[str, Message, Message, list[Unit]],
    episodic: object,
) -> tuple[float, list[float]]:
    """(cold build seconds, warm per-turn build seconds) at ``step``."""
    _, system, task, units = material
    fabric = ContextFabric()
    fabric.set_task_context("agent", {"goal": task.text[:2000], "repo": "django"}, task_id="t")
    sid = mem.create_session("agent", task_id="t")
    gen = steps_of(units)
    batch = [task.replace()]
    for _ in range(step - 1):
        batch += next(gen)
        if len(batch) > 500:
            mem.add_messages(sid, batch)
            batch = []
    mem.add_messages(sid, batch)
    builder = ContextBuilder(
        mem,
        episodic=episodic,
        fabric=fabric,
        max_prompt_tokens=WINDOW,
        reserve_output_tokens=RESERVE,
        cache_stable=cache_stable,
    )
    t0 = time.perf_counter()
    builder.build(sid, system=system.text)
    cold = time.perf_counter() - t0
    warm = []
    for turn in range(turns):
        mem.add_messages(sid, next(gen))
        fabric.set_private("agent", "scratchpad", f"turn {turn}: checked the next file")
        t0 = time.perf_counter()
        built = builder.build(sid, system=system.text)
        warm.append(time.perf_counter() - t0)
        assert built.report.prompt_tokens <= WINDOW - RESERVE
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default="50,5000", help="steps to time at (comma-separated)")
    parser.add_argument("--turns", type=int, default=21, help="timed turns per step")
    parser.add_argument("--backends", default="memory,sqlite", help="memory and/or sqlite")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    material = source_material()
    episodic = make_episodic()
    console = Console()
    console.print(f"steps from: {material[0]}")
    table = Table(title=f"ContextBuilder.build per turn ({WINDOW:,}-token window, all layers)")
    for col in ("backend", "pruning", "step", "messages", "cold ms", "median ms", "p90 ms"):
        table.add_column(col, justify="left" if col in ("backend", "pruning") else "right")
    config = MemoryConfig(max_history=None, session_ttl=None)
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends.split(","):
            for mode, stable in (("cache-stable (default)", None), ("cache_stable=False", False)):
                for step in steps:
                    url = (
                        "memory://"
                        if backend == "memory"
                        else f"sqlite:///{Path(tmp) / f'{mode[:5]}-{step}.db'}"
                    )
                    with open_memory(url, config) as mem:
                        cold, warm = measure(mem, step, args.turns, stable, material, episodic)
                        n = len(mem.get_messages(mem.list_sessions(limit=1)[0].session_id))
                    ordered = sorted(warm)
                    table.add_row(
                        backend,
                        mode,
                        f"{step:,}",
                        f"{n:,}",
                        f"{cold * 1000:.1f}",
                        f"{statistics.median(warm) * 1000:.2f}",
                        f"{ordered[int(0.9 * (len(ordered) - 1))] * 1000:.2f}",
                    )
    console.print(table)


if __name__ == "__main__":
    main()

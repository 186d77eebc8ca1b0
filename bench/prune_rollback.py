"""A warm cache-stable prune after an edit of the newest messages, against one after an append.

An agent loop does not only append: a retry replaces the newest answer, a regenerated reply
replaces the newest assistant message, an undo pops the last turn. The cache-stable pruner
keeps the fold of the histories it saw (:mod:`ctxkeep.prune.stable`); an append folds the new
messages on, and an edit rolls back to a checkpoint inside the part the histories share and
folds forward from there (before checkpoints, an edit replayed the whole history).

The session is ``bench/prune_speed.py``'s (a system prompt, a task, then tool-call units from
the mini-swe trajectories in ``../shared/data``), held as OpenAI dicts, as most agent loops
hold it. One warm ``TokenPruner(6000, 6, counter)`` (cache-stable, the default) has pruned it
once; then, ``--steps`` times in a row, timed with ``time.perf_counter`` (garbage collection
left on), each a prune of the history as it now is:

* **append**: one tool-call unit (an assistant call and its result) appended;
* **replace newest**: that unit's result replaced by another dict (a retried tool call);
* **pop last turn**: the unit removed again (an undo); the next step appends a new one.

Each step's prompt is checked against a new pruner's (a replay): equal, within budget, valid.
With ``--compare SRC`` the same run goes on in a subprocess with ``SRC`` (another checkout's
``src``, e.g. a ``git worktree`` of the commit before) first on ``sys.path``; the two are
run in alternating rounds (``--rounds``), and the table gives each figure's median over all
steps of all rounds and the range of the rounds' medians.

Usage:
    python bench/prune_rollback.py
    git worktree add /tmp/old <commit> && python bench/prune_rollback.py --compare /tmp/old/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from _common import ENCODING, write_json
from ctxkeep.messages import is_valid_sequence
from ctxkeep.prune import TokenPruner
from ctxkeep.tokens import get_counter
from prune_speed import BUDGET, GOAL_MS, LAST_N, build_session, new_turns, source_material

OPS = ("append", "replace newest", "pop last turn")


def run(messages: int, steps: int, check: bool) -> dict[str, Any]:
    """One round: the timings of every step's prunes (ms), per op, and the checks."""
    counter = get_counter(ENCODING)
    _, system, task, units = source_material()
    history = [m.to_openai() for m in build_session(messages, system, task, units)]
    pruner = TokenPruner(BUDGET, LAST_N, counter)
    pruner.prune(history)
    turns = new_turns(units, 2 * steps, offset=messages)
    times: dict[str, list[float]] = {op: [] for op in OPS}
    mismatches = over = invalid = 0
    for j in range(steps):
        unit = [m.to_openai() for m in turns[2 * j]]
        retry = turns[2 * j + 1][-1].to_openai()
        retry["tool_call_id"] = unit[-1]["tool_call_id"]
        grown = history + unit
        for op, h in zip(OPS, (grown, [*grown[:-1], retry], history), strict=True):
            t0 = time.perf_counter()
            out = pruner.prune(h)
            times[op].append((time.perf_counter() - t0) * 1e3)
            if check:
                mismatches += out != TokenPruner(BUDGET, LAST_N, counter).prune(h)
                over += counter.count_messages(out) > BUDGET
                invalid += not is_valid_sequence(out)
        history = grown if j % 2 else history  # the history grows every other step
    return {
        "times_ms": times,
        "mismatches": mismatches,
        "over_budget": over,
        "invalid": invalid,
    }


def _child(src: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.path.dirname(__file__)]))
    cmd = [
        sys.executable,
        __file__,
        "--round",
        f"--messages={args.messages}",
        f"--steps={args.steps}",
    ]
    if args.no_check:
        cmd.append("--no-check")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=10_000, help="session length (10000)")
    p.add_argument("--steps", type=int, default=30, help="append/replace/pop steps a round (30)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per code base (3)")
    p.add_argument("--compare", metavar="SRC", help="another checkout's src to run beside this")
    p.add_argument("--no-check", action="store_true", help="skip the replay check of each step")
    p.add_argument("--round", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write machine output")
    args = p.parse_args(argv)
    if args.round:
        print(json.dumps(run(args.messages, args.steps, not args.no_check)))
        return 0
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    sources = {"this checkout": os.path.abspath(here)}
    if args.compare:
        sources = {"compared (--compare)": os.path.abspath(args.compare), **sources}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for _ in range(args.rounds):
        for name, src in sources.items():
            rounds[name].append(_child(src, args))
    table = Table(
        title=f"warm cache-stable prune of {args.messages:,} OpenAI dicts after an edit "
        f"(ms; median of {args.rounds} x {args.steps} steps, [range of round medians])"
    )
    table.add_column("code")
    for op in OPS:
        table.add_column(op, justify="right")
    table.add_column("= replay / over / invalid", justify="right")
    payload: dict[str, Any] = {"messages": args.messages, "goal_ms": GOAL_MS, "code": {}}
    for name, results in rounds.items():
        cells = []
        entry: dict[str, Any] = {"source": sources[name]}
        for op in OPS:
            every = [t for r in results for t in r["times_ms"][op]]
            medians = [statistics.median(r["times_ms"][op]) for r in results]
            entry[op] = {
                "median_ms": round(statistics.median(every), 3),
                "round_medians_ms": [round(m, 3) for m in medians],
            }
            cells.append(f"{statistics.median(every):.2f} [{min(medians):.2f}-{max(medians):.2f}]")
        checks = [sum(r[k] for r in results) for k in ("mismatches", "over_budget", "invalid")]
        entry.update(dict(zip(("mismatches", "over_budget", "invalid"), checks, strict=True)))
        payload["code"][name] = entry
        steps = "unchecked" if args.no_check else f"{len(results) * args.steps * len(OPS)} prunes"
        table.add_row(name, *cells, f"{checks[0]} / {checks[1]} / {checks[2]} ({steps})")
    if args.json != "-":
        Console().print(table)
        print(f"goal: <= {GOAL_MS} ms after an edit, the same as after an append")
    if args.json:
        write_json(payload, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

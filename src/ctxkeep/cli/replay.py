"""``ctxkeep replay`` and ``ctxkeep demo``: replay agent runs through the pruner."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from ctxkeep.cli._args import non_negative_int, positive_int
from ctxkeep.cli._io import console as make_console
from ctxkeep.cli._io import parse_messages, read_source
from ctxkeep.cli._stores import TENANT_OPTION, open_sessions, where_flags
from ctxkeep.messages import Message
from ctxkeep.replay import RunStats, ctxkeep_pruner, replay_run, step_prompts
from ctxkeep.tokens import get_counter

REPLAY_HELP = """Replay every assistant step of agent runs through the pruner.

Each FILE is a JSON list of messages, an object with a "messages" list (the format of
../shared/data/trajectories), or JSONL with one message per line. For every assistant
message, the prompt before it is pruned; the table shows tokens unpruned vs sent, prompts
over budget and invalid tool-call sequences (both should be 0).

examples:
  ctxkeep replay run.json
  ctxkeep replay ../shared/data/trajectories/mini-swe-*.json --budget 6000 --last-n 6
  ctxkeep replay run.jsonl --plot tokens.png --json
"""

DEMO_HELP = """Generate a long agent session (file listings, source files, test logs, JSON
API responses, parallel tool calls), store it, and replay it through the pruner.

The session is stored in --db (default: the embedded SQLite file), or with --tenant NAME in
that tenant's store as `ctxkeep serve --db <the same URL>` keeps it, where the API and the
inspector show it to the tenant's keys. memory:// keeps it only while the command runs.

examples:
  ctxkeep demo
  ctxkeep demo --steps 300 --budget 4000 --json
  ctxkeep demo --db sqlite:///agents.db
  ctxkeep demo --tenant acme
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget", type=positive_int, default=6000, help="token budget (default 6000)")
    p.add_argument(
        "--last-n", type=non_negative_int, default=6, help="recent messages to keep (default 6)"
    )
    p.add_argument("--encoding", "-e", default="o200k_base", help="encoding or model name")
    p.add_argument("--plot", metavar="FILE.png", help="draw tokens per step (needs matplotlib)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")


def register(sub: Any) -> None:
    """Add the ``replay`` and ``demo`` commands."""
    p = sub.add_parser(
        "replay",
        help="replay agent runs through the pruner",
        description=REPLAY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    _common(p)
    p.set_defaults(func=run_replay)
    d = sub.add_parser(
        "demo",
        help="generate a long agent session and replay it through the pruner",
        description=DEMO_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument(
        "--steps", type=positive_int, default=120, help="agent steps to generate (default 120)"
    )
    d.add_argument("--seed", type=int, default=7, help="random seed")
    d.add_argument("--db", help="where to store the session (default: the embedded SQLite file)")
    d.add_argument(*TENANT_OPTION.flags, **TENANT_OPTION.kwargs)
    _common(d)
    d.set_defaults(func=run_demo)


def replay_runs(
    runs: list[tuple[str, list[Message]]], args: argparse.Namespace, console: Console
) -> tuple[list[RunStats], RunStats]:
    """Replay each run; returns per-run stats and the total."""
    counter = get_counter(args.encoding)
    steps = sum(len(step_prompts(m)) for _, m in runs)
    stats: list[RunStats] = []
    total = RunStats("total")
    show = not args.json and console.is_terminal
    with Progress(console=console, transient=True, disable=not show) as progress:
        task = progress.add_task("replaying", total=steps)
        for name, msgs in runs:
            pruner = ctxkeep_pruner(args.budget, args.last_n, counter)
            s = replay_run(
                name,
                msgs,
                pruner.prune,
                counter,
                args.budget,
                on_step=lambda: progress.advance(task),
            )
            stats.append(s)
            total.add(s)
    return stats, total


def print_stats(stats: list[RunStats], total: RunStats, args: argparse.Namespace) -> None:
    """The table, or JSON with ``--json``."""
    if args.json:
        print(
            json.dumps(
                {
                    "budget": args.budget,
                    "last_n": args.last_n,
                    "encoding": args.encoding,
                    "runs": [s.to_dict() for s in stats],
                    "total": total.to_dict(),
                },
                indent=2,
            )
        )
        return
    table = Table(
        title=f"pruning replay: budget {args.budget}, last {args.last_n}, {args.encoding}"
    )
    for col in (
        "run",
        "prompts",
        "tokens unpruned",
        "tokens sent",
        "saving",
        "over budget",
        "invalid",
        "compressed",
        "refused",
    ):
        table.add_column(col, justify="left" if col == "run" else "right")

    def row(s: RunStats, **kw: Any) -> None:
        table.add_row(
            s.name,
            f"{s.prompts:,}",
            f"{s.tokens_unpruned:,}",
            f"{s.tokens_sent:,}",
            f"{s.saving:.1%}",
            str(s.over_budget),
            str(s.invalid),
            f"{s.compressed:,}",
            str(s.errors),
            **kw,
        )

    for s in stats:
        row(s)
    if len(stats) > 1:
        table.add_section()
        row(total, style="bold")
    make_console().print(table)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; checked before a replay that will plot, so a
    missing matplotlib stops the command at once, not after the whole replay.

    Raises:
        MissingDependencyError: matplotlib is not installed (the ``plot`` extra).

    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        from ctxkeep.errors import MissingDependencyError

        raise MissingDependencyError("matplotlib", "plot") from exc
    return plt


def plot(stats: list[RunStats], path: str, budget: int) -> None:
    """Tokens per step, unpruned vs sent, for every run in one figure."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    x0 = 0
    for s in stats:
        xs = range(x0, x0 + len(s.per_step))
        ax.plot(xs, [a for a, _ in s.per_step], color="tab:red", lw=1, alpha=0.7)
        ax.plot(xs, [b for _, b in s.per_step], color="tab:blue", lw=1)
        x0 += len(s.per_step)
    ax.axhline(budget, color="black", ls="--", lw=0.8, label=f"budget {budget}")
    ax.plot([], [], color="tab:red", label="unpruned")
    ax.plot([], [], color="tab:blue", label="sent by ctxkeep")
    ax.set_xlabel("step (all runs, in order)")
    ax.set_ylabel("prompt tokens")
    ax.set_yscale("log")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_replay(args: argparse.Namespace) -> int:
    """Replay files."""
    if args.plot:
        pyplot()
    console = Console(stderr=True)
    runs = []
    for f in args.files:
        name, text = read_source(f)
        loaded = parse_messages(name, text, allow_text=False)
        assert loaded.messages is not None
        runs.append((Path(name).stem, loaded.messages))
    stats, total = replay_runs(runs, args, console)
    print_stats(stats, total, args)
    if args.plot:
        plot(stats, args.plot, args.budget)
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """Generate a session and replay it."""
    from ctxkeep.demo import demo_session

    if args.plot:
        pyplot()
    console = Console(stderr=True)
    with open_sessions(args.db, args.tenant, create=True) as mem:
        sid = mem.create_session("demo-agent", task_id="demo", metadata={"seed": args.seed})
        mem.add_messages(sid, demo_session(steps=args.steps, seed=args.seed))
        msgs = mem.get_messages(sid)  # replay what was stored
    stats, total = replay_runs([("demo session", msgs)], args, console)
    print_stats(stats, total, args)
    if not args.json:
        for line in next_step(sid, args.db, args.tenant):
            console.print(line, soft_wrap=True, markup=False, highlight=False)
    if args.plot:
        plot(stats, args.plot, args.budget)
    return 0


def next_step(session_id: str, db: str | None, tenant: str | None) -> list[str]:
    """What the demo says after its table: the command that shows the stored session, with
    the same ``--db`` and ``--tenant``; a ``memory://`` session is gone with the process.
    """
    if db == "memory://":
        return [
            f"session {session_id} was kept in memory:// and is gone with this process; to "
            "look at it afterwards, store it in a file:",
            "  ctxkeep demo --db sqlite:///demo.db",
        ]
    return [
        f"stored as session {session_id}; see it with:",
        f"  ctxkeep sessions show {session_id}{where_flags(db, tenant)}",
    ]

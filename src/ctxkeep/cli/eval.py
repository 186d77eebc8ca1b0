"""``ctxkeep eval recall``: episodic recall on a LoCoMo-format file (in-sample, cross-validated)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ctxkeep.cli._args import add_action
from ctxkeep.cli._io import console as make_console
from ctxkeep.errors import ConfigError

HELP = """Measure how well episodic memory recalls, on your own conversations.

FILE is in LoCoMo's format: a JSON list of records, each with a "conversation" (speaker_a,
speaker_b, session_N lists of turns {speaker, dia_id, text}, session_N_date_time) and "qa"
(question, evidence: the dia_ids that answer it, category). Every turn is saved as an
episode; every question searches its own conversation; recall@k is the share of its
evidence turns among the top k, averaged over the questions, overall and per category.
"""

RECALL_HELP = "run a LoCoMo-format file through a store and print recall@k per category"

GRID_NOTE = """
--cv tries every combination of the --grid values (default: dense_weight=0.5/1/1.5,
session_weight=0/0.75, window=1/2/3: 18 configurations), chooses on all conversations but
one the combination with the best recall@10, and scores the one left out; the pooled
held-out scores (and the same with categories as the folds) are printed below the in-sample
rows, the --config configuration first.
"""

DEFAULT_GRID = ("dense_weight=0.5/1/1.5", "session_weight=0/0.75", "window=1/2/3")
"""What ``--cv`` searches when no ``--grid`` is given."""


def register(sub: Any) -> None:
    """Add the ``eval`` command group."""
    p = sub.add_parser(
        "eval",
        help="measure episodic recall on a LoCoMo-format file",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ss = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    r = add_action(
        ss,
        "recall",
        RECALL_HELP,
        "ctxkeep eval recall locomo10.json",
        "ctxkeep eval recall mine.json --embedder hash --k 5,10",
        "ctxkeep eval recall mine.json --config dense_weight=0.5 --config window=1",
        "ctxkeep eval recall mine.json --cv --grid dense_weight=0.5/1/2 --json out.json",
        "ctxkeep eval recall mine.json --db sqlite:///recall.db --cache vectors.npz",
    )
    r.description = f"{r.description}\n{GRID_NOTE}"
    r.add_argument("file", metavar="FILE.json", help="a LoCoMo-format file")
    r.add_argument(
        "--embedder",
        default="local",
        help="local (default: wordllama), e5-small, openai or hash (tests)",
    )
    r.add_argument("--db", default="memory://", help="memory:// (default) or sqlite:///new-file.db")
    r.add_argument("--k", default="5,10,25,50", help="recall cut-offs (default 5,10,25,50)")
    r.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="set a retrieval knob (a RetrievalConfig field); repeatable",
    )
    r.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KNOB=V1/V2",
        help="values to try for a knob; repeatable (with --cv: what is chosen among)",
    )
    r.add_argument("--cv", action="store_true", help="cross-validate the choice among --grid")
    r.add_argument("--json", metavar="OUT.json", help="also write every figure to this file")
    r.add_argument(
        "--cache", metavar="VECTORS.npz", help="keep the embedder's vectors in this file"
    )
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=run)


def _ks(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--k takes integers joined by commas, got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    """Run the evaluation and print its tables."""
    from ctxkeep.episodic import RetrievalConfig, get_embedder
    from ctxkeep.evaluation.locomo import load_locomo
    from ctxkeep.evaluation.recall import (
        check_ks,
        config_grid,
        config_with,
        cross_validate,
        evaluate,
    )

    ks = check_ks(_ks(args.k))
    base = config_with(RetrievalConfig(), args.config)
    grid_items = args.grid or (list(DEFAULT_GRID) if args.cv else [])
    configs = config_grid(base, grid_items) if grid_items else [base]
    if args.cv and 10 not in ks:
        raise ConfigError("--cv chooses by recall@10: include 10 in --k")
    conversations = load_locomo(args.file)
    embedder: Any = get_embedder(args.embedder)
    cache = None
    if args.cache:
        from ctxkeep.evaluation.vectors import DiskCachedEmbedder

        cache = embedder = DiskCachedEmbedder(embedder, args.cache)
    out = make_console()
    err = make_console(stderr=True)
    show = err.is_terminal and not args.no_progress
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True, disable=not show) as progress:
        tasks: dict[str, Any] = {}

        def on_progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                label = "saving turns" if phase == "ingest" else "asking questions"
                tasks[phase] = progress.add_task(label, total=total)
            progress.update(tasks[phase], completed=done, total=total)

        try:
            runs = evaluate(
                conversations,
                embedder=embedder,
                configs=configs,
                url=args.db,
                ks=ks,
                on_progress=on_progress,
            )
        finally:
            if cache is not None:
                cache.save()
    n_eps = sum(len(c.episodes) for c in conversations)
    title = (
        f"{Path(args.file).name}: {len(conversations)} conversations, {n_eps:,} turns, "
        f"{runs[0].table.questions:,} questions; embedder {embedder.name}, store {args.db}"
    )
    cvs = [cross_validate(runs, by=by) for by in ("conversation", "category")] if args.cv else []
    print_tables(out, title, runs, cvs, configs)
    if args.json:
        Path(args.json).write_text(json.dumps(report(runs, cvs, embedder.name, args), indent=2))
    return 0


def _changed(cfg: Any) -> str:
    """The knobs of ``cfg`` that differ from the default, as ``knob=value``."""
    from ctxkeep.episodic import RetrievalConfig

    default = RetrievalConfig()
    parts = [
        f"{f.name}={getattr(cfg, f.name)}"
        for f in dataclasses.fields(cfg)
        if getattr(cfg, f.name) != getattr(default, f.name)
    ]
    return ", ".join(parts) or "default"


def print_tables(
    out: Console, title: str, runs: list[Any], cvs: list[Any], configs: list[Any]
) -> None:
    """One table: a row per configuration (and per cross-validation), R@k and per category."""
    from ctxkeep.evaluation.locomo import CATEGORIES

    first = runs[0].table
    table = Table(title=title)
    table.add_column("configuration")
    for k in first.ks:
        table.add_column(f"R@{k}", justify="right")
    k_cat = 10 if 10 in first.ks else first.ks[0]
    for c in first.per_category:
        table.add_column(f"{CATEGORIES.get(c, f'category {c}')} R@{k_cat}", justify="right")
    table.add_column("ms/query", justify="right")

    def row(name: str, t: Any, ms: str) -> None:
        table.add_row(
            name,
            *(f"{v:.1f}" for v in t.overall),
            *(f"{t.at(k_cat, c):.1f}" if c in t.per_category else "-" for c in first.per_category),
            ms,
        )

    for r in runs:
        row(_changed(r.config), r.table, f"{r.search_ms:.1f}")
    for cv in cvs:
        chosen = sorted(set(cv.chosen.values()))
        row(
            f"cross-validated by {cv.by} (chose {', '.join(f'#{i + 1}' for i in chosen)})",
            cv.table,
            "",
        )
    out.print(table)
    if cvs:
        out.print("#n: the n-th configuration above.")


def report(
    runs: list[Any], cvs: list[Any], embedder: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Every figure, for ``--json``."""

    def table(t: Any) -> dict[str, Any]:
        return {
            "overall": dict(zip((f"R@{k}" for k in t.ks), t.overall, strict=True)),
            "per_category": {
                str(c): dict(zip((f"R@{k}" for k in t.ks), v, strict=True))
                for c, v in t.per_category.items()
            },
            "questions": t.counts,
        }

    return {
        "file": str(args.file),
        "embedder": embedder,
        "store": args.db,
        "runs": [
            {
                "config": dataclasses.asdict(r.config),
                "table": table(r.table),
                "search_ms": r.search_ms,
                "ingest_s": r.ingest_s,
            }
            for r in runs
        ],
        "cross_validated": [
            {"by": cv.by, "select_k": cv.select_k, "chosen": cv.chosen, "table": table(cv.table)}
            for cv in cvs
        ],
    }

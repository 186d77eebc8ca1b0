"""Episodic recall on LoCoMo, through ctxkeep's own store and search API.

Every dialog turn is an episode (session = the conversation's session, task = the
conversation); each question searches its own conversation's turns (a task_id filter);
recall@k = the fraction of the question's evidence dia_ids in the top k (a question without
evidence counts 1.0), averaged over all 1,986 questions of all categories, as the data README
describes. The layout, the metric and the runs are :mod:`ctxkeep.evaluation` (the same code
as ``ctxkeep eval recall``).

    python bench/locomo_recall.py [--embedder NAME] [--url sqlite:///x.db] [--json out.json]

Embeddings are cached in bench/out/ (keyed by text hash) so reruns skip the slow part.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ctxkeep.episodic import RetrievalConfig, get_embedder
from ctxkeep.evaluation import CATEGORIES, KS, evaluate, load_locomo
from ctxkeep.evaluation.vectors import DiskCachedEmbedder


def data_dir() -> Path:
    env = os.environ.get("CTXKEEP_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    path = root / "locomo" / "locomo10.json"
    if not path.exists():
        sys.exit(f"LoCoMo not found at {path}; set CTXKEEP_SHARED_DATA")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--embedder", default="local")
    ap.add_argument("--json", help="write results here")
    ap.add_argument(
        "--url", default="memory://", help="the episodic store (memory://, sqlite:///...)"
    )
    args = ap.parse_args()
    conversations = load_locomo(data_dir())
    out_dir = Path(__file__).resolve().parent / "out"
    embedder = DiskCachedEmbedder(
        get_embedder(args.embedder), out_dir / f"locomo-{args.embedder}-vectors.npz"
    )
    default = RetrievalConfig()
    alone = replace(default, session_weight=0.0)  # one signal, as it ranks on its own
    modes = {
        "BM25 (windowed, stemmed)": replace(alone, dense_weight=0.0),
        "dense alone": replace(alone, lexical_weight=0.0, smooth=(0.0, 0.0)),
        "dense, session-smoothed": replace(alone, lexical_weight=0.0),
        "hybrid, no session prior": alone,
        "hybrid (default)": default,
    }
    try:
        runs = evaluate(
            conversations, embedder=embedder, configs=list(modes.values()), url=args.url, ks=KS
        )
    finally:
        embedder.save()
    n_turns = sum(len(c.episodes) for c in conversations)
    results: dict[str, dict[str, Any]] = {}
    for mode, run in zip(modes, runs, strict=True):
        results[mode] = {
            "overall": list(run.table.overall),
            "per_category_r10": {
                CATEGORIES.get(c, str(c)): run.table.at(10, c) for c in run.table.per_category
            },
            "questions": run.table.questions,
            "search_ms_mean": run.search_ms,
        }
    table = Table(
        title=f"LoCoMo recall ({n_turns} turns, embedder {embedder.name}, store {args.url})"
    )
    table.add_column("retriever")
    for k in KS:
        table.add_column(f"R@{k}", justify="right")
    for c in CATEGORIES.values():
        table.add_column(f"{c} R@10", justify="right")
    table.add_column("ms/query", justify="right")
    for mode, r in results.items():
        table.add_row(
            mode,
            *(f"{v:.1f}" for v in r["overall"]),
            *(f"{r['per_category_r10'][c]:.1f}" for c in CATEGORIES.values()),
            f"{r['search_ms_mean']:.1f}",
        )
    Console(width=180).print(table)
    ingest_s = runs[0].ingest_s
    print(
        f"ingestion: {n_turns} episodes in {ingest_s:.1f} s ({n_turns / ingest_s:.0f}/s; "
        f"{embedder.computed} texts embedded this run, the rest from the cache)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

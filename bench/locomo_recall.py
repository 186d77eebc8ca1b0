"""Episodic recall on LoCoMo, through ctxkeep's own store and search API.

Every dialog turn is an episode (session = the conversation's session, task = the
conversation); each question searches its own conversation's turns (a task_id filter);
recall@k = the fraction of the question's evidence dia_ids in the top k (a question without
evidence counts 1.0), averaged over all 1,986 questions of all categories, as the data README
describes.

    python bench/locomo_recall.py [--embedder local|hash] [--json out.json]

Embeddings are cached in bench/out/ (keyed by text hash) so reruns skip the slow part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ctxkeep.episodic import get_embedder, open_episodic

KS = (5, 10, 25, 50)
CATS = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def data_dir() -> Path:
    env = os.environ.get("CTXKEEP_SHARED_DATA")
    root = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    path = root / "locomo" / "locomo10.json"
    if not path.exists():
        sys.exit(f"LoCoMo not found at {path}; set CTXKEEP_SHARED_DATA")
    return path


class DiskCachedEmbedder:
    """Caches document and query vectors in an .npz beside the benchmark."""

    def __init__(self, inner: Any, path: Path) -> None:
        self.inner, self.path = inner, path
        self.name, self.dim = inner.name, inner.dim
        self.cache: dict[str, np.ndarray] = {}
        if path.exists():
            with np.load(path) as z:
                self.cache = {k: z[k] for k in z.files}
        self.computed = 0

    def _key(self, kind: str, text: str) -> str:
        return kind + hashlib.sha256(text.encode()).hexdigest()[:32]

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        keys = [self._key("d", t) for t in texts]
        miss = [i for i, k in enumerate(keys) if k not in self.cache]
        if miss:
            vecs = self.inner.embed_documents([texts[i] for i in miss])
            self.computed += len(miss)
            for i, v in zip(miss, vecs, strict=True):
                self.cache[keys[i]] = v
        return np.stack([self.cache[k] for k in keys])

    def embed_query(self, text: str) -> np.ndarray:
        k = self._key("q", text)
        if k not in self.cache:
            self.cache[k] = self.inner.embed_query(text)
            self.computed += 1
        return self.cache[k]

    def save(self) -> None:
        np.savez(self.path, **self.cache)


def turn_text(speaker: str, date: str, turn: dict[str, Any]) -> str:
    text = f"{speaker} ({date}): {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares an image of {turn['blip_caption']}]"
    return text


def conversation_episodes(ci: int, conv: dict[str, Any]) -> list[dict[str, Any]]:
    """Every dialog turn of conversation ``ci`` as an episode, sessions in order."""
    c = conv["conversation"]
    out = []
    n = 1
    while f"session_{n}" in c:
        date = c.get(f"session_{n}_date_time", "")
        for turn in c[f"session_{n}"]:
            out.append(
                {
                    "session_id": f"conv{ci}:session_{n}",
                    "task_id": f"conv{ci}",
                    "task_goal": "",
                    "summary": turn_text(turn["speaker"], date, turn),
                    "metadata": {"dia_id": turn["dia_id"]},
                }
            )
        n += 1
    return out


def evidence_ids(qa: dict[str, Any]) -> list[str]:
    out = []
    for ev in qa.get("evidence") or []:
        for part in str(ev).replace(",", ";").split(";"):
            if part.strip():
                out.append(part.strip())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--embedder", default="local")
    ap.add_argument("--json", help="write results here")
    ap.add_argument(
        "--url", default="memory://", help="the episodic store (memory://, sqlite:///...)"
    )
    args = ap.parse_args()
    convs = json.loads(data_dir().read_text())
    out_dir = Path(__file__).resolve().parent / "out"
    out_dir.mkdir(exist_ok=True)
    embedder = DiskCachedEmbedder(
        get_embedder(args.embedder), out_dir / f"locomo-{args.embedder}-vectors.npz"
    )
    store = open_episodic(args.url, embedder=embedder)
    t0 = time.perf_counter()
    n_turns = 0
    for ci, conv in enumerate(convs):
        batch = conversation_episodes(ci, conv)
        store.save_episodes(batch)
        n_turns += len(batch)
    ingest_s = time.perf_counter() - t0
    modes = {
        "BM25 (windowed, stemmed)": replace(store.config, dense_weight=0.0),
        "dense alone": replace(store.config, lexical_weight=0.0, smooth=(0.0, 0.0)),
        "dense, session-smoothed": replace(store.config, lexical_weight=0.0),
        "hybrid (default)": store.config,
    }
    results: dict[str, dict[str, Any]] = {}
    default_cfg = store.config
    for mode, cfg in modes.items():
        store.config = cfg
        per_cat: dict[int, list[list[float]]] = defaultdict(list)
        allr: list[list[float]] = []
        t1 = time.perf_counter()
        nq = 0
        for ci, conv in enumerate(convs):
            for qa in conv["qa"]:
                ev = evidence_ids(qa)
                hits = store.search(str(qa["question"]), max(KS), filters={"task_id": f"conv{ci}"})
                got = [h.episode.metadata["dia_id"] for h in hits]
                row = [(sum(1 for e in ev if e in got[:k]) / len(ev)) if ev else 1.0 for k in KS]
                allr.append(row)
                per_cat[int(qa["category"])].append(row)
                nq += 1
        search_s = time.perf_counter() - t1
        results[mode] = {
            "overall": [100 * float(np.mean([r[i] for r in allr])) for i in range(len(KS))],
            "per_category_r10": {
                CATS[c]: 100 * float(np.mean([r[1] for r in rows]))
                for c, rows in sorted(per_cat.items())
            },
            "questions": nq,
            "search_ms_mean": 1000 * search_s / nq,
        }
    store.config = default_cfg
    embedder.save()
    table = Table(
        title=f"LoCoMo recall ({n_turns} turns, embedder {embedder.name}, store {store.name})"
    )
    table.add_column("retriever")
    for k in KS:
        table.add_column(f"R@{k}", justify="right")
    for c in CATS.values():
        table.add_column(f"{c} R@10", justify="right")
    table.add_column("ms/query", justify="right")
    for mode, r in results.items():
        table.add_row(
            mode,
            *(f"{v:.1f}" for v in r["overall"]),
            *(f"{r['per_category_r10'][c]:.1f}" for c in CATS.values()),
            f"{r['search_ms_mean']:.1f}",
        )
    Console(width=180).print(table)
    print(
        f"ingestion: {n_turns} episodes in {ingest_s:.1f} s ({n_turns / ingest_s:.0f}/s; "
        f"{embedder.computed} texts embedded this run, the rest from the cache)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

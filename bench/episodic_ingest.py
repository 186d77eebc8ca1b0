"""Episodic ingestion and store-level search at scale, through ctxkeep's own store API.

Two measurements:

* ``embed``: LoCoMo dialog turns saved with ``save_episodes`` (batches of ``--batch``) into
  a fresh store with e5-small (``ctxkeep[embeddings]``, the slowest local embedder):
  episodes per second embedded, stored and indexed, beside the embedder alone on the same
  texts in the same batches (the anchor: what is left is the store's share).
* ``scale``: ``--episodes`` synthetic episodes (Zipf-distributed words from a 20,000-word
  vocabulary, 12-40 words each, sessions of 50) with vectors drawn like e5-small embeddings
  (``episodic_scale.e5like``, handed over by a table embedder so the model's speed does not
  hide the store's) saved into a SQLite store in batches of 1,000: episodes per second
  stored and indexed, overall and over the last tenth (when the index is an HNSW graph).
  Then hybrid ``search`` (top 10), one query at a time: p50 / p99 with the default index
  (an HNSW graph above 20,000 episodes), beside the same file opened with an exact vector
  index (``IndexConfig(kind="exact")``: the dense candidates are the true nearest), and the
  overlap of their top 10. Queries are 6 words of a stored episode with that episode's
  vector plus noise. ``--store memory``: the same with ``memory://``, against a second
  memory store on an exact index, which scores every episode (no candidates).
  ``--db PATH`` keeps the SQLite file (built if absent, reused as it is otherwise), so two
  versions of ctxkeep can be timed on one file (``PYTHONPATH=<worktree>/src``);
  ``--full-reference`` also scores every episode (a memory store on an exact index) and
  reports each store's top-10 overlap with that. Latencies are wall clock and, beside them,
  the process's CPU time (less moved by other work on a shared machine); first with the two
  stores' queries interleaved (the same machine load for both), then each store alone over
  the same queries (no scan of every vector between two searches, as a store in use runs).

Usage:
    python bench/episodic_ingest.py                      # both, 1,000 turns, 100,000 episodes
    python bench/episodic_ingest.py --only embed --turns 2000
    python bench/episodic_ingest.py --only scale --episodes 200000 --json bench/out/ingest.json
    python bench/episodic_ingest.py --only scale --db /tmp/ep100k.db --full-reference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from _common import write_json
from ctxkeep.episodic import E5SmallEmbedder, EpisodicMemoryStore, IndexConfig, open_episodic
from ctxkeep.evaluation.locomo import conversation_episodes
from episodic_scale import DIM, e5like
from locomo_recall import data_dir

K = 10


def locomo_turns(n: int) -> list[dict[str, Any]]:
    """The first ``n`` LoCoMo turns as episodes (as bench/locomo_recall.py saves them)."""
    out: list[dict[str, Any]] = []
    for ci, conv in enumerate(json.loads(data_dir().read_text())):
        out += conversation_episodes(ci, conv)
    return out[:n]


def embed(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    turns = locomo_turns(args.turns)
    texts = [t["summary"] for t in turns]
    model = E5SmallEmbedder()  # uncached: every run embeds every text
    model.embed_documents(texts[:8])  # load the weights
    rows: dict[str, Any] = {"turns": len(turns), "batch": args.batch, "embedder": model.name}
    alone, stored = [], []
    for rep in range(args.repeats):
        t = time.perf_counter()
        for s in range(0, len(texts), args.batch):
            model.embed_documents(texts[s : s + args.batch])
        alone.append(len(texts) / (time.perf_counter() - t))
        with tempfile.TemporaryDirectory(dir=os.environ.get("CTXKEEP_BENCH_TMP")) as d:
            store = open_episodic(f"sqlite:///{d}/episodes.db", embedder=model)
            t = time.perf_counter()
            for s in range(0, len(turns), args.batch):
                store.save_episodes(turns[s : s + args.batch])
            stored.append(len(turns) / (time.perf_counter() - t))
            store.close()
        console.log(f"  embed run {rep}: model {alone[-1]:.1f}/s, store {stored[-1]:.1f}/s")
    rows["model_per_s"] = statistics.median(alone)
    rows["store_per_s"] = statistics.median(stored)
    rows["runs"] = {"model": alone, "store": stored}
    return rows


class TableEmbedder:
    """Hands out vectors registered for texts (a benchmark stand-in for a model)."""

    name = "table-e5like"
    dim = DIM

    def __init__(self) -> None:
        self.table: dict[bytes, np.ndarray] = {}

    @staticmethod
    def _key(text: str) -> bytes:
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def register(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        for t, v in zip(texts, vectors, strict=True):
            self.table[self._key(t)] = v

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[self._key(t)] for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self.table[self._key(text)]


def synthetic(n: int, seed: int) -> tuple[list[dict[str, Any]], np.ndarray]:
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(20_000)]
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.07
    p /= p.sum()
    lengths = rng.integers(12, 41, n)
    words = rng.choice(len(vocab), int(lengths.sum()), p=p)
    out, at = [], 0
    for i, ln in enumerate(lengths.tolist()):
        text = " ".join(vocab[w] for w in words[at : at + ln])
        at += ln
        out.append({"session_id": f"s{i // 50}", "task_goal": "", "summary": f"e{i} {text}"})
    return out, e5like(n, seed)


def scale(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    n = args.episodes
    t = time.perf_counter()
    eps, vecs = synthetic(n, args.seed)
    emb = TableEmbedder()
    emb.register([e["summary"] for e in eps], vecs)
    rng = np.random.default_rng(args.seed + 1)
    picks = rng.choice(n, args.queries, replace=False)
    queries = []
    for i in picks.tolist():
        words = eps[i]["summary"].split()[1:]
        q = " ".join(rng.choice(words, min(6, len(words)), replace=False))
        v = vecs[i] + rng.normal(0, 0.02, DIM).astype(np.float32)
        queries.append(q)
        emb.register([q], (v / np.linalg.norm(v))[None, :])
    console.log(f"scale: {n:,} synthetic episodes in {time.perf_counter() - t:.0f}s")
    out: dict[str, Any] = {"episodes": n, "queries": len(queries)}
    with tempfile.TemporaryDirectory(dir=os.environ.get("CTXKEEP_BENCH_TMP")) as d:
        memory = args.store == "memory"
        path = Path(args.db) if args.db else Path(d) / "episodes.db"
        url = "memory://" if memory else f"sqlite:///{path}"
        if memory or not path.exists():
            store = save_all(open_episodic(url, embedder=emb), eps, console, out)
        else:
            store = open_episodic(url, embedder=emb)
            console.log(f"  reusing {path} ({store.count():,} episodes)")
        out["index"] = type(store.vectors).__name__, store.vectors.approximate
        if memory:  # the reference: a second store on an exact index, every episode scored
            graph = store
            exact = save_all(
                open_episodic(url, embedder=emb, index=IndexConfig(kind="exact")), eps, None, {}
            )
            out["files_bytes"], out["open_s"] = {}, 0.0
        else:
            store.close()
            files = {p.name: p.stat().st_size for p in path.parent.glob(path.name + "*")}
            out["files_bytes"] = files
            graph = open_episodic(url, embedder=emb)
            t = time.perf_counter()
            graph.search(queries[0], 1)
            out["open_s"] = time.perf_counter() - t
            exact = open_episodic(url, embedder=emb, index=IndexConfig(kind="exact"))
        exact.search(queries[0], 1)
        stores = {"hnsw": graph, "exact": exact}
        results: dict[str, list[list[str]]] = {name: [] for name in stores}
        lat: dict[str, list[float]] = {name: [] for name in stores}
        cpu: dict[str, list[float]] = {name: [] for name in stores}
        for q in queries:  # interleaved: both see the same machine load
            for name, st in stores.items():
                b, c = time.perf_counter(), time.process_time()
                hits = st.search(q, K)
                lat[name].append((time.perf_counter() - b) * 1e3)
                cpu[name].append((time.process_time() - c) * 1e3)
                results[name].append([h.episode.summary for h in hits])
        for name in lat:
            out[f"{name}_p50_ms"] = statistics.median(lat[name])
            out[f"{name}_p99_ms"] = float(np.percentile(lat[name], 99))
            out[f"{name}_cpu_p50_ms"] = statistics.median(cpu[name])
            out[f"{name}_cpu_p99_ms"] = float(np.percentile(cpu[name], 99))
        out["top10_overlap"] = overlap(results["hnsw"], results["exact"])
        # The same queries again, one store at a time: a search not interleaved with a scan of
        # every vector (which evicts the other store's data from the CPU caches), as a store
        # in use is searched. Both figures are reported.
        for name, st in stores.items():
            alone = []
            for q in queries:
                b = time.perf_counter()
                st.search(q, K)
                alone.append((time.perf_counter() - b) * 1e3)
            out[f"{name}_alone_p50_ms"] = statistics.median(alone)
            out[f"{name}_alone_p99_ms"] = float(np.percentile(alone, 99))
        found = [
            eps[i]["summary"] in {h.episode.summary for h in graph.search(q, K)}
            for i, q in zip(picks.tolist()[:50], queries[:50], strict=True)
        ]
        out["source_in_top10"] = float(np.mean(found))
        out["load_avg"] = os.getloadavg()
        graph.close()
        exact.close()
    if args.full_reference:
        console.log("  full reference: every episode scored (memory store, exact index)")
        full = save_all(
            open_episodic("memory://", embedder=emb, index=IndexConfig(kind="exact")), eps, None, {}
        )
        ref = [[h.episode.summary for h in full.search(q, K)] for q in queries]
        for name in results:
            out[f"{name}_top10_overlap_full"] = overlap(results[name], ref)
        full.close()
    return out


def save_all(
    store: EpisodicMemoryStore,
    eps: list[dict[str, Any]],
    console: Console | None,
    out: dict[str, Any],
) -> EpisodicMemoryStore:
    """Save ``eps`` in batches of 1,000; ingestion rates into ``out``."""
    n, batch, times = len(eps), 1_000, []
    t = time.perf_counter()
    for s in range(0, n, batch):
        b = time.perf_counter()
        store.save_episodes(eps[s : s + batch])
        times.append(time.perf_counter() - b)
        if console is not None and (s // batch) % 20 == 0:
            console.log(f"  saved {s + batch:,} ({batch / times[-1]:.0f}/s)")
    tail = times[-max(1, len(times) // 10) :]
    out["ingest_per_s"] = n / (time.perf_counter() - t)
    out["ingest_last_tenth_per_s"] = batch * len(tail) / sum(tail)
    return store


def overlap(got: list[list[str]], want: list[list[str]]) -> float:
    """The mean fraction of each reference top 10 found in the other's."""
    return float(np.mean([len(set(a) & set(b)) / K for a, b in zip(got, want, strict=True)]))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--only", choices=["embed", "scale"])
    ap.add_argument("--turns", type=int, default=1_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=100_000)
    ap.add_argument("--store", choices=["sqlite", "memory"], default="sqlite")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--db", help="the SQLite file: built if absent, kept, reused if present")
    ap.add_argument(
        "--full-reference",
        action="store_true",
        help="also score every episode and report the top-10 overlap with that",
    )
    ap.add_argument("--json", help="write the results here (- for stdout)")
    args = ap.parse_args()
    console = Console(stderr=True)
    payload: dict[str, Any] = {"cores": os.cpu_count(), "argv": sys.argv[1:]}
    if args.only in (None, "embed"):
        e = payload["embed"] = embed(args, console)
        table = Table(title=f"Ingestion of {e['turns']:,} LoCoMo turns ({e['embedder']})")
        for c in ("batch", "embedder alone (texts/s)", "save_episodes (episodes/s)", "ratio"):
            table.add_column(c, justify="right")
        table.add_row(
            str(e["batch"]),
            f"{e['model_per_s']:.1f}",
            f"{e['store_per_s']:.1f}",
            f"{e['store_per_s'] / e['model_per_s']:.2f}",
        )
        Console().print(table)
    if args.only in (None, "scale"):
        s = payload["scale"] = scale(args, console)
        table = Table(
            title=f"{args.store} store with {s['episodes']:,} episodes (hybrid search, top 10)"
        )
        for c in ("measure", "value"):
            table.add_column(c)
        if "ingest_per_s" in s:
            table.add_row("ingest (stored + indexed)", f"{s['ingest_per_s']:,.0f} episodes/s")
            table.add_row("ingest, last tenth", f"{s['ingest_last_tenth_per_s']:,.0f} episodes/s")
        table.add_row("open + first search", f"{s['open_s']:.1f} s")
        for name in ("hnsw", "exact"):
            table.add_row(
                f"search p50 / p99, {name} (cpu)",
                f"{s[f'{name}_p50_ms']:.1f} / {s[f'{name}_p99_ms']:.1f} ms "
                f"({s[f'{name}_cpu_p50_ms']:.1f} / {s[f'{name}_cpu_p99_ms']:.1f})",
            )
        for name in ("hnsw", "exact"):
            table.add_row(
                f"search p50 / p99, {name}, each store alone",
                f"{s[f'{name}_alone_p50_ms']:.1f} / {s[f'{name}_alone_p99_ms']:.1f} ms",
            )
        table.add_row("top-10 overlap with exact", f"{s['top10_overlap']:.3f}")
        for name in ("hnsw", "exact"):
            if f"{name}_top10_overlap_full" in s:
                table.add_row(
                    f"top-10 overlap, {name} with every episode scored",
                    f"{s[f'{name}_top10_overlap_full']:.3f}",
                )
        table.add_row("load average (1, 5, 15 min)", " ".join(f"{x:.1f}" for x in s["load_avg"]))
        table.add_row("source episode in top 10", f"{s['source_in_top10']:.2f}")
        table.add_row(
            "files", ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in s["files_bytes"].items())
        )
        Console().print(table)
    if args.json:
        write_json(payload, args.json)


if __name__ == "__main__":
    main()

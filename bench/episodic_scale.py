"""Episodic vector search at scale: exact vs HNSW, latency, recall, ingestion, filters.

For each size (100,000 and 1,000,000 by default) and each data set, one ExactIndex and one
HNSWIndex (faiss, ``ctxkeep[hnsw]``) are filled with the same vectors of dim 384, then
searched with held-out queries drawn the same way:

* ingestion: vectors indexed per second (wall clock; HNSW also per CPU-second, since faiss
  builds on every core and the machine may be shared). Embedding is not included: this
  measures the index only;
* latency: p50 / p99 of one query at a time (``time.perf_counter``, one query thread), for
  exact search and for HNSW at each ``ef`` of the sweep;
* recall@10 of HNSW against exact search (the fraction of the exact top 10 found);
* filtered search: an allowed set of a random fraction of the ids (a boolean mask), p50 and
  recall@10 against exact search over the same ids, at the default ``ef``;
* the index file: save, load and its size.

Data sets (``--data``):

* ``random``: uniformly random unit vectors. They have no neighbourhood structure (the
  nearest of 100,000 is barely closer than any other), the worst case for any graph index.
* ``e5like``: vectors drawn like e5-small sentence embeddings: a Gaussian around a common
  mean of norm 0.91 whose covariance spectrum falls as 1/(j+2) (fitted to e5-small vectors
  of 3,000 LoCoMo turns: participation ratio 78, eigenvalues ~ j^-0.98), in clusters of 4
  (half the variance between clusters), which matches the real vectors' mean pairwise
  cosine (0.84) and median nearest-neighbour cosine after centring (0.56 vs 0.52). On a
  3,000-vector sample it is *harder* for HNSW than the real vectors (faiss M=8, ef=10:
  recall@10 0.64 vs 0.80), so its figures are conservative.

Usage:
    python bench/episodic_scale.py                            # 100k and 1M, e5like
    python bench/episodic_scale.py --sizes 100000 --data random,e5like
    python bench/episodic_scale.py --ef 64,128,256 --m 32 --ef-construction 200
    python bench/episodic_scale.py --crossover                # exact vs HNSW from 5k to 100k
    python bench/episodic_scale.py --libraries --sizes 100000 --m 16 --ef-construction 100
        # faiss vs hnswlib vs usearch, used directly (pip install hnswlib usearch)
    python bench/episodic_scale.py --json bench/out/episodic_scale.json
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from _common import write_json
from ctxkeep.episodic.index import (
    ExactIndex,
    HNSWIndex,
    HNSWParams,
    VectorIndex,
    hnsw_available,
)

DIM = 384
K = 10
GOAL_P50_MS = 5.0
GOAL_RECALL = 0.95
CHUNK = 65_536

# -- data -------------------------------------------------------------------------------------


def random_unit(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, DIM), np.float32)
    for s in range(0, n, CHUNK):
        x = rng.standard_normal((min(CHUNK, n - s), DIM), dtype=np.float32)
        out[s : s + x.shape[0]] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def e5like(n: int, seed: int, per_cluster: int = 4, within: float = 0.5) -> np.ndarray:
    """See the module docstring; the basis and mean are fixed, the draws depend on seed."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(np.random.default_rng(12345).standard_normal((DIM, DIM)))[0]
    lam = 1.0 / (np.arange(1, DIM + 1) + 2.0)
    sd = np.sqrt(lam * 0.165 / lam.sum()).astype(np.float32)  # total variance of e5 vectors
    mean = np.random.default_rng(54321).standard_normal(DIM)
    mean = (mean / np.linalg.norm(mean) * 0.91).astype(np.float32)
    b32 = basis.T.astype(np.float32)
    n_clusters = max(1, n // per_cluster)
    centres = (rng.standard_normal((n_clusters, DIM), dtype=np.float32) * sd) @ b32
    centres *= np.float32(np.sqrt(1 - within))
    out = np.empty((n, DIM), np.float32)
    for s in range(0, n, CHUNK):
        m = min(CHUNK, n - s)
        x = (rng.standard_normal((m, DIM), dtype=np.float32) * sd) @ b32
        x = x * np.float32(np.sqrt(within)) + centres[rng.integers(0, n_clusters, m)] + mean
        out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


DATA: dict[str, Callable[[int, int], np.ndarray]] = {"random": random_unit, "e5like": e5like}


# -- measuring --------------------------------------------------------------------------------


def load() -> float:
    return round(os.getloadavg()[0], 2)


def cpu() -> float:
    return time.process_time()


def latencies(
    index: VectorIndex, queries: np.ndarray, allowed: np.ndarray | None = None
) -> tuple[list[float], list[np.ndarray]]:
    """Milliseconds per ``index.search(q, K, allowed)`` and the ids found, query by query."""
    index.search(queries[0], K, allowed)  # warm
    times, found = [], []
    for q in queries:
        t = time.perf_counter()
        ids, _ = index.search(q, K, allowed)
        times.append((time.perf_counter() - t) * 1e3)
        found.append(ids)
    return times, found


def pct(times: list[float], p: float) -> float:
    return float(np.percentile(times, p))


def recall(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    scores = [
        len(set(g.tolist()) & set(w.tolist())) / max(1, len(w))
        for g, w in zip(got, want, strict=True)
    ]
    return float(np.mean(scores))


def fill(index: VectorIndex, data: np.ndarray) -> tuple[float, float]:
    """Add ``data`` in chunks; returns (wall seconds, process CPU seconds)."""
    t, c = time.perf_counter(), cpu()
    for s in range(0, data.shape[0], CHUNK):
        chunk = data[s : s + CHUNK]
        index.add(np.arange(s, s + chunk.shape[0]), chunk)
    return time.perf_counter() - t, cpu() - c


def run_size(n: int, kind: str, args: argparse.Namespace, console: Console) -> dict[str, Any]:
    """Everything measured at one size on one data set."""
    t = time.perf_counter()
    both = DATA[kind](n + args.queries, args.seed)
    data, queries = both[:n], both[n:]
    del both
    console.log(f"{kind} {n:,}: data in {time.perf_counter() - t:.0f}s (load {load()})")
    out: dict[str, Any] = {"n": n, "data": kind, "dim": DIM, "queries": args.queries, "k": K}

    exact = ExactIndex(DIM)
    wall, _ = fill(exact, data)
    lat, res = latencies(exact, queries)
    truth = res
    out["exact"] = {
        "ingest_per_s": n / wall,
        "p50_ms": statistics.median(lat),
        "p99_ms": pct(lat, 99),
        "load": load(),
    }
    console.log(f"  exact: {n / wall:,.0f}/s, p50 {statistics.median(lat):.1f} ms")

    if not hnsw_available():
        console.log("  faiss not installed: pip install -e '.[hnsw]' for the HNSW rows")
        return out
    params = HNSWParams(m=args.m, ef_construction=args.ef_construction)
    hnsw = HNSWIndex(DIM, params)
    load_before = load()
    wall, cpu_s = fill(hnsw, data)
    out["hnsw_build"] = {
        "m": args.m,
        "ef_construction": args.ef_construction,
        "ingest_per_s": n / wall,
        "ingest_per_cpu_s": n / cpu_s,
        "seconds": wall,
        "load": [load_before, load()],
    }
    console.log(f"  hnsw build: {wall:.0f}s wall, {cpu_s:.0f}s cpu ({n / wall:,.0f}/s)")
    del data
    sweep = []
    for ef in args.ef:
        hnsw.params = replace(params, ef_search=ef)
        lat, res = latencies(hnsw, queries)
        row = {
            "ef": ef,
            "p50_ms": statistics.median(lat),
            "p99_ms": pct(lat, 99),
            "recall": recall(res, truth),
            "load": load(),
        }
        sweep.append(row)
        console.log(f"  ef={ef}: p50 {row['p50_ms']:.2f} ms, recall {row['recall']:.4f}")
    out["hnsw"] = sweep
    # the default ef: the smallest of the sweep that meets the recall goal
    good = [r for r in sweep if r["recall"] >= GOAL_RECALL]
    ef = min((r["ef"] for r in good), default=max(args.ef))
    hnsw.params = replace(params, ef_search=ef)
    out["filtered"] = filtered(exact, hnsw, queries, n, ef, args, console)
    out["file"] = file_figures(hnsw)
    out["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def filtered(
    exact: ExactIndex,
    hnsw: HNSWIndex,
    queries: np.ndarray,
    n: int,
    ef: int,
    args: argparse.Namespace,
    console: Console,
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    qs = queries[: args.filter_queries]
    default = hnsw.params
    for frac in args.fractions:
        mask = rng.random(n) < frac
        allowed = int(mask.sum())
        truth = [exact.search(q, K, mask)[0] for q in qs]
        # both paths, forced, to see where the switch (exact_cost) belongs
        for path, cost in (("exact", float("inf")), ("graph", 0.0)):
            hnsw.params = replace(default, exact_cost=cost)
            lat, res = latencies(hnsw, qs, mask)
            row = {
                "fraction": frac,
                "allowed": allowed,
                "path": path,
                "default_path": default_path(default, allowed, n),
                "ef": ef,
                "p50_ms": statistics.median(lat),
                "p99_ms": pct(lat, 99),
                "recall": recall(res, truth),
            }
            rows.append(row)
            console.log(f"  filter {frac} {path}: p50 {row['p50_ms']:.2f} ms, {row['recall']:.4f}")
    hnsw.params = default
    return rows


def default_path(p: HNSWParams, allowed: int, n: int) -> str:
    """The path HNSWIndex takes by default (its rule, restated)."""
    fetch = math.ceil(p.overfetch * K * n / max(1, allowed))
    exact = allowed <= p.exact_cost * max(p.ef_search, K, fetch) or fetch > n // 2
    return "exact" if exact else "graph"


def file_figures(index: HNSWIndex) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("CTXKEEP_BENCH_TMP")) as d:
        path = Path(d) / "episodes.vidx"
        t = time.perf_counter()
        index.save(path)
        saved = time.perf_counter() - t
        size = path.stat().st_size
        t = time.perf_counter()
        HNSWIndex.load(path, config=None)
        loaded = time.perf_counter() - t
    return {"save_s": saved, "load_s": loaded, "size_mb": size / 2**20}


def crossover(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """Exact vs HNSW latency at small sizes: where the automatic switch should sit."""
    rows = []
    for n in (5_000, 10_000, 20_000, 50_000, 100_000):
        both = e5like(n + args.queries, args.seed)
        data, queries = both[:n], both[n:]
        exact, hnsw = (
            ExactIndex(DIM),
            HNSWIndex(DIM, HNSWParams(m=args.m, ef_construction=args.ef_construction)),
        )
        fill(exact, data)
        wall, _ = fill(hnsw, data)
        e_lat, res = latencies(exact, queries)
        h_lat, h_res = latencies(hnsw, queries)
        rows.append(
            {
                "n": n,
                "exact_p50_ms": statistics.median(e_lat),
                "hnsw_p50_ms": statistics.median(h_lat),
                "hnsw_recall": recall(h_res, res),
                "hnsw_build_s": wall,
                "load": load(),
            }
        )
        console.log(rows[-1])
    return rows


def libraries(args: argparse.Namespace, console: Console) -> list[dict[str, Any]]:
    """The HNSW libraries side by side, used directly (how the index's library was chosen)."""
    import importlib

    n, kind = args.sizes[0], args.data.split(",")[0]
    both = DATA[kind](n + args.queries, args.seed)
    data, queries = both[:n], both[n:]
    truth = [np.argpartition(-(data @ q), K)[:K] for q in queries]
    ids = np.arange(n)
    m, efc = args.m, args.ef_construction

    def faiss_lib() -> tuple[Callable[[int], None], Callable[[np.ndarray], np.ndarray]]:
        faiss = importlib.import_module("faiss")
        index = faiss.IndexHNSWFlat(DIM, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = efc
        index.add(data)

        def set_ef(ef: int) -> None:
            index.hnsw.efSearch = ef

        return set_ef, lambda q: index.search(q[None, :], K)[1][0]

    def hnswlib_lib() -> tuple[Callable[[int], None], Callable[[np.ndarray], np.ndarray]]:
        hnswlib = importlib.import_module("hnswlib")
        index = hnswlib.Index(space="ip", dim=DIM)
        index.init_index(max_elements=n, M=m, ef_construction=efc)
        index.add_items(data, ids)
        return index.set_ef, lambda q: index.knn_query(q, K, num_threads=1)[0][0]

    def usearch_lib(dtype: str) -> Callable[[], Any]:
        def build() -> tuple[Callable[[int], None], Callable[[np.ndarray], np.ndarray]]:
            usearch = importlib.import_module("usearch.index")
            index = usearch.Index(
                ndim=DIM, metric="ip", dtype=dtype, connectivity=m, expansion_add=efc
            )
            index.add(ids, data)

            def set_ef(ef: int) -> None:
                index.expansion_search = ef

            return set_ef, lambda q: index.search(q, K, threads=1).keys

        return build

    builders: dict[str, Callable[[], Any]] = {
        "faiss": faiss_lib,
        "hnswlib": hnswlib_lib,
        "usearch f32": usearch_lib("f32"),
        "usearch f16": usearch_lib("f16"),
        "usearch i8": usearch_lib("i8"),
    }
    rows = []
    for name, build in builders.items():
        t, c = time.perf_counter(), cpu()
        try:
            set_ef, search = build()
        except ImportError:
            console.log(f"{name}: not installed, skipped")
            continue
        wall, cpu_s = time.perf_counter() - t, cpu() - c
        for ef in args.ef:
            set_ef(ef)
            search(queries[0])
            lat, found = [], []
            for q in queries:
                t = time.perf_counter()
                found.append(np.asarray(search(q), np.int64))
                lat.append((time.perf_counter() - t) * 1e3)
            rows.append(
                {
                    "library": name,
                    "n": n,
                    "data": kind,
                    "m": m,
                    "ef_construction": efc,
                    "ef": ef,
                    "build_per_s": n / wall,
                    "build_per_cpu_s": n / cpu_s,
                    "p50_ms": statistics.median(lat),
                    "p99_ms": pct(lat, 99),
                    "recall": recall(found, truth),
                    "load": load(),
                }
            )
            console.log(rows[-1])
    return rows


# -- output -----------------------------------------------------------------------------------


def library_table(rows: list[dict[str, Any]], console: Console) -> None:
    if not rows:
        return
    r0 = rows[0]
    t = Table(
        title=f"HNSW libraries, {r0['data']} n={r0['n']:,}, M={r0['m']}, "
        f"efConstruction={r0['ef_construction']}, one query thread"
    )
    for col in ("library", "build /s", "build /cpu-s", "ef", "p50 ms", "p99 ms", "recall@10"):
        t.add_column(col, justify="left" if col == "library" else "right")
    for r in rows:
        t.add_row(
            r["library"],
            f"{r['build_per_s']:,.0f}",
            f"{r['build_per_cpu_s']:,.0f}",
            str(r["ef"]),
            f"{r['p50_ms']:.2f}",
            f"{r['p99_ms']:.2f}",
            f"{r['recall']:.4f}",
        )
    console.print(t)


def tables(results: list[dict[str, Any]], cross: list[dict[str, Any]], console: Console) -> None:
    for r in results:
        title = f"{r['data']} vectors, n={r['n']:,}, dim {DIM}, {r['queries']} queries, k={K}"
        b = r.get("hnsw_build")
        if b:
            title += f"; HNSW M={b['m']}, efConstruction={b['ef_construction']}"
        t = Table(title=title)
        for col in ("index", "ingest /s", "p50 ms", "p99 ms", "recall@10", "load"):
            t.add_column(col, justify="right" if col != "index" else "left")
        e = r["exact"]
        t.add_row(
            "exact",
            f"{e['ingest_per_s']:,.0f}",
            f"{e['p50_ms']:.2f}",
            f"{e['p99_ms']:.2f}",
            "1",
            str(e["load"]),
        )
        for row in r.get("hnsw", []):
            ok = row["p50_ms"] <= GOAL_P50_MS and row["recall"] >= GOAL_RECALL
            t.add_row(
                f"hnsw ef={row['ef']}" + (" *" if ok else ""),
                f"{b['ingest_per_s']:,.0f} ({b['ingest_per_cpu_s']:,.0f}/cpu-s)",
                f"{row['p50_ms']:.2f}",
                f"{row['p99_ms']:.2f}",
                f"{row['recall']:.4f}",
                str(row["load"]),
            )
        console.print(t)
        if r.get("filtered"):
            f = Table(title=f"filtered search, {title}")
            for col in ("allowed", "path", "ef", "p50 ms", "p99 ms", "recall@10"):
                f.add_column(col, justify="right")
            for row in r["filtered"]:
                chosen = " (default)" if row["path"] == row["default_path"] else ""
                f.add_row(
                    f"{row['fraction']:.1%} ({row['allowed']:,})",
                    row["path"] + chosen,
                    str(row["ef"]),
                    f"{row['p50_ms']:.2f}",
                    f"{row['p99_ms']:.2f}",
                    f"{row['recall']:.4f}",
                )
            console.print(f)
        if r.get("file"):
            fi = r["file"]
            console.print(
                f"index file: {fi['size_mb']:,.0f} MB, save {fi['save_s']:.1f} s, "
                f"load {fi['load_s']:.1f} s; peak RSS {r['max_rss_gb']:.1f} GB"
            )
    if cross:
        c = Table(title=f"exact vs HNSW at small sizes (e5like, ef={HNSWParams().ef_search})")
        for col in ("n", "exact p50 ms", "hnsw p50 ms", "hnsw recall@10", "hnsw build s", "load"):
            c.add_column(col, justify="right")
        for row in cross:
            c.add_row(
                f"{row['n']:,}",
                f"{row['exact_p50_ms']:.2f}",
                f"{row['hnsw_p50_ms']:.2f}",
                f"{row['hnsw_recall']:.4f}",
                f"{row['hnsw_build_s']:.1f}",
                str(row["load"]),
            )
        console.print(c)
    console.print(
        f"* meets the goal (p50 <= {GOAL_P50_MS} ms, recall@10 >= {GOAL_RECALL}). "
        f"{os.cpu_count()} cores; 'load' is the 1-minute load average (other work shares them)."
    )


def ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=ints, default=[100_000, 1_000_000], help="comma-separated")
    ap.add_argument("--data", default="e5like", help="random, e5like or both (comma-separated)")
    ap.add_argument("--queries", type=int, default=300, help="queries per measurement (>= 200)")
    ap.add_argument("--filter-queries", type=int, default=200)
    ap.add_argument(
        "--fractions",
        type=lambda s: [float(x) for x in s.split(",")],
        default=[0.1, 0.03, 0.01, 0.003],
    )
    ap.add_argument("--ef", type=ints, default=[64, 128, 192, 256, 384])
    ap.add_argument("--m", type=int, default=HNSWParams().m)
    ap.add_argument("--ef-construction", type=int, default=HNSWParams().ef_construction)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--crossover", action="store_true", help="also exact vs HNSW from 5k to 100k")
    ap.add_argument(
        "--libraries",
        action="store_true",
        help="instead: faiss, hnswlib and usearch used directly at the first size",
    )
    ap.add_argument("--json", help="write the results here (- for stdout)")
    args = ap.parse_args()
    kinds = [k for k in args.data.split(",") if k]
    if unknown := set(kinds) - DATA.keys():
        sys.exit(f"error: unknown --data {sorted(unknown)}; use {sorted(DATA)}")
    console = Console(stderr=True)
    if args.libraries:
        rows = libraries(args, console)
        library_table(rows, Console())
        if args.json:
            write_json(
                {"libraries": rows, "cores": os.cpu_count(), "argv": sys.argv[1:]}, args.json
            )
        return
    results = [run_size(n, kind, args, console) for kind in kinds for n in args.sizes]
    cross = crossover(args, console) if args.crossover else []
    tables(results, cross, Console())
    if args.json:
        write_json(
            {"results": results, "crossover": cross, "cores": os.cpu_count(), "argv": sys.argv[1:]},
            args.json,
        )


if __name__ == "__main__":
    main()

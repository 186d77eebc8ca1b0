"""Other faiss indexes on the same e5-like vectors, to see whether any beats HNSW-Flat.

Variants (faiss used directly, one query thread, k=10, recall against exact search):

* ``flat``: ``IndexHNSWFlat`` (what ctxkeep uses), swept over ``ef``;
* ``sq8``: ``IndexHNSWSQ`` with 8-bit scalar-quantised vectors, the top ``ef/2`` re-ranked
  with the exact float vectors, swept over ``ef``;
* ``ivf``: ``IndexIVFFlat`` with ``--nlist`` lists (k-means on 64 vectors per list), swept
  over ``nprobe``.

Usage:
    python bench/ann_alternatives.py flat --n 100000 --m 32 --ef-construction 200
    python bench/ann_alternatives.py sq8 --n 100000 --sweep 128,256,512,1024
    python bench/ann_alternatives.py ivf --n 1000000 --nlist 4096 --sweep 16,32,64,128,256
"""

from __future__ import annotations

import argparse
import statistics
import time

import faiss
import numpy as np

from episodic_scale import DIM, e5like

QUERIES = 200


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("variant", choices=["flat", "sq8", "ivf"])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--ef-construction", type=int, default=200)
    ap.add_argument("--nlist", type=int, default=4096)
    ap.add_argument("--sweep", default="64,128,256,512", help="ef (HNSW) or nprobe (IVF) values")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    both = e5like(args.n + QUERIES, args.seed)
    data, queries = both[: args.n], both[args.n :]
    truth = []
    for s in range(0, QUERIES, 50):
        scores = queries[s : s + 50] @ data.T
        truth.extend(np.argsort(-scores, axis=1)[:, :10])
    t = time.perf_counter()
    ip = faiss.METRIC_INNER_PRODUCT
    if args.variant == "ivf":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, args.nlist, ip)
        rng = np.random.default_rng(0)
        index.train(data[rng.choice(args.n, min(args.n, 64 * args.nlist), replace=False)])
    elif args.variant == "sq8":
        index = faiss.IndexHNSWSQ(DIM, faiss.ScalarQuantizer.QT_8bit, args.m, ip)
        index.hnsw.efConstruction = args.ef_construction
        index.train(data[:50_000])
    else:
        index = faiss.IndexHNSWFlat(DIM, args.m, ip)
        index.hnsw.efConstruction = args.ef_construction
    index.add(data)
    build = time.perf_counter() - t
    print(f"{args.variant} n={args.n:,}: built in {build:.0f} s ({args.n / build:,.0f}/s)")
    faiss.omp_set_num_threads(1)
    for value in (int(x) for x in args.sweep.split(",")):
        params: object = None
        k = 10
        if args.variant == "ivf":
            index.nprobe = value
        else:
            params = faiss.SearchParametersHNSW()
            params.efSearch = value  # type: ignore[attr-defined]
            k = 10 if args.variant == "flat" else max(10, value // 2)
        lat, rec = [], []
        for i, q in enumerate(queries):
            t = time.perf_counter()
            _, found = index.search(q[None], k, params=params)
            ids = found[0][found[0] >= 0]
            if args.variant == "sq8":
                ids = ids[np.argsort(-(data[ids] @ q))[:10]]
            lat.append((time.perf_counter() - t) * 1e3)
            rec.append(len(set(ids[:10].tolist()) & set(truth[i].tolist())) / 10)
        knob = "nprobe" if args.variant == "ivf" else "ef"
        print(
            f"  {knob}={value}: p50 {statistics.median(lat):.2f} ms, "
            f"p99 {np.percentile(lat, 99):.2f} ms, recall@10 {np.mean(rec):.3f}"
        )


if __name__ == "__main__":
    main()

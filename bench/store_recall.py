"""Recall@10 and speed of ``CtxkeepStore.search`` with a query: planted facts among fillers.

    python bench/store_recall.py [--sizes 1000,10000] [--engines sqlite,memory,postgres]
                                 [--embedder local] [--pg-url postgresql://...]
                                 [--pg-types halfvec,vector --rounds 3]

Each store holds ``size`` filler items (``bench/peers.py``'s short facts under ten namespaces
of ``("bench", "uN")``) and :data:`PLANTED` facts, each under one of those namespaces, put in
the same batch. Every planted fact has a query that asks for it in other words (most share
one rare word with it, a few none); recall@10 is the share of queries whose fact comes back
in the first 10 of ``store.search(("bench",), query=..., limit=10)``, and each search is
timed (p50 and p95 over every query, three passes). Issue 26 asks the search at 10,000 items
for <= 20 ms p50 on SQLite and PostgreSQL with this recall no lower than before; to compare
with another tree, run this script with that tree's ``src`` first on ``PYTHONPATH``.

``--pg-types halfvec,vector`` compares the types of PostgreSQL's ``embedding`` column on one
store: its column is converted to each type in turns (``--rounds`` times), the HNSW index
rebuilt on that type's cosine operators and the store opened again, so the fillers, the
planted facts and their vectors are the same for both; how an HNSW graph is built moves a
fact in or out on its own, hence the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from peers import store_items

PLANTED = [
    ("I am allergic to penicillin", "which antibiotics should I avoid"),
    ("My daughter's school is Lakeside Elementary", "where does my kid go to school"),
    ("The staging database password rotates every Tuesday", "when do staging credentials change"),
    ("Prefers an aisle seat on long-haul flights", "seating preference for flights"),
    ("Our billing service is owned by the Kestrel team", "who maintains billing"),
    ("Deploys are frozen during the last week of December", "deploy freeze at year end"),
    ("The user's cat is named Miso", "what is my cat called"),
    ("Invoices over 10,000 euros need CFO approval", "approval threshold for large invoices"),
    ("She runs a marathon in Lisbon every October", "which race does she run in autumn"),
    ("The API rate limit is 600 requests per minute", "how many requests per minute allowed"),
    ("Lactose intolerant: no milk in coffee", "dairy restrictions for drinks"),
    ("Office wifi network is called Hummingbird-5G", "name of the office wireless network"),
    ("Quarterly reviews happen in the Orion meeting room", "where are quarterly reviews held"),
    ("He speaks Portuguese and some Japanese", "what languages does he speak"),
    ("Backups are kept for 35 days in cold storage", "backup retention period"),
    ("The mobile app release train leaves every second Thursday", "mobile release schedule"),
    ("Vegetarian, but eats fish on weekends", "dietary preferences for dinner"),
    ("Favourite editor is Helix with a dark theme", "which code editor do they like"),
    ("Parking spot 42 on level B2 is reserved for her", "where can she park"),
    ("Support tickets tagged P1 page the on-call within 5 minutes", "how fast is on-call paged"),
]
"""(fact, query) pairs: the query asks for the fact in other words."""


def build(url: str, size: int, embedder: str) -> Any:
    """A store at ``url`` with ``size`` fillers and the planted facts."""
    from langgraph.store.base import PutOp

    from ctxkeep.integrations.langgraph import CtxkeepStore

    store = CtxkeepStore(url, embedder=embedder)
    ops = [PutOp(ns, key, value) for ns, key, value in store_items(size)]
    ops += [
        PutOp(("bench", f"u{i % 10}"), f"planted{i}", {"text": fact, "kind": "fact", "n": -1})
        for i, (fact, _) in enumerate(PLANTED)
    ]
    store.batch(ops)
    return store


def measure(store: Any, passes: int = 3) -> dict[str, float]:
    """Recall@10 of the planted facts and search times (ms) over ``passes``."""
    found = 0
    took: list[float] = []
    for p in range(passes):
        for i, (_, query) in enumerate(PLANTED):
            start = time.perf_counter()
            hits = store.search(("bench",), query=query, limit=10)
            took.append((time.perf_counter() - start) * 1000)
            if p == 0:
                found += any(h.key == f"planted{i}" for h in hits)
    took.sort()
    return {
        "recall@10": found / len(PLANTED),
        "p50": statistics.median(took),
        "p95": took[int(0.95 * (len(took) - 1))],
    }


def convert(url: str, vtype: str) -> None:
    """Make the ``embedding`` column of the store at ``url`` a ``vtype`` (``halfvec`` or
    ``vector``) and rebuild its HNSW index on that type.
    """
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attname = 'embedding' "
            "AND attrelid = 'ctxkeep_episodes'::regclass"
        ).fetchone()
        dim = int(row[0]) if row else 0
        conn.execute("DROP INDEX IF EXISTS ctxkeep_episodes_hnsw")
        conn.execute(
            f"ALTER TABLE ctxkeep_episodes ALTER COLUMN embedding TYPE {vtype}({dim}) "
            f"USING embedding::{vtype}({dim})"
        )
        conn.execute(
            "CREATE INDEX ctxkeep_episodes_hnsw ON ctxkeep_episodes "
            f"USING hnsw (embedding {vtype}_cosine_ops)"
        )
        conn.execute("ANALYZE ctxkeep_episodes")


def compare_types(url: str, types: list[str], rounds: int, embedder: str) -> None:
    """Recall and speed of one PostgreSQL store with its vectors as each of ``types``, in
    turns (see the module's docstring).
    """
    from ctxkeep.integrations.langgraph import CtxkeepStore

    for r in range(rounds):
        for vtype in types if r % 2 == 0 else types[::-1]:
            convert(url, vtype)
            store = CtxkeepStore(url, embedder=embedder)
            try:
                got = measure(store)
            finally:
                store.close()
            print(
                f"round {r + 1}/{rounds} {vtype:8} recall@10 {got['recall@10']:.2f}  "
                f"search p50 {got['p50']:.2f} ms  p95 {got['p95']:.2f} ms",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--engines", default="sqlite,memory")
    ap.add_argument("--embedder", default="local")
    ap.add_argument("--pg-url", default=None, help="a PostgreSQL server to make databases on")
    ap.add_argument(
        "--pg-types",
        default="",
        help="PostgreSQL only: the embedding column's types to compare on one store, in turns "
        "(halfvec,vector)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --pg-types")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ctxkeep-recall-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            for engine in args.engines.split(","):
                if engine == "sqlite":
                    url = f"sqlite:///{tmp}/{uuid.uuid4().hex[:8]}.db"
                elif engine == "memory":
                    url = "memory://"
                else:
                    import psycopg

                    if not args.pg_url:
                        sys.exit("postgres needs --pg-url")
                    db = f"ckrecall_{uuid.uuid4().hex[:8]}"
                    with psycopg.connect(args.pg_url, autocommit=True) as conn:
                        conn.execute(f"CREATE DATABASE {db}")
                    base, _, query = args.pg_url.partition("?")
                    url = base.rsplit("/", 1)[0] + f"/{db}" + (f"?{query}" if query else "")
                store = build(url, size, args.embedder)
                if engine == "postgres" and args.pg_types:
                    store.close()
                    types = args.pg_types.split(",")
                    print(f"postgres {size:>7,} items, types in turns:", flush=True)
                    compare_types(url, types, args.rounds, args.embedder)
                    continue
                try:
                    got = measure(store)
                finally:
                    store.close()
                print(
                    f"{engine:8} {size:>7,} items  recall@10 {got['recall@10']:.2f}  "
                    f"search p50 {got['p50']:.2f} ms  p95 {got['p95']:.2f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()

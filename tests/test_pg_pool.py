"""One PostgreSQL pool per server for the whole process (issue 28): every store of every tenant
shares it, each under its own ``search_path``, within the configured maximum of connections.

Each test runs in a database of its own, so ``pg_stat_activity`` counts only its connections.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote, urlencode

import pytest

from conftest_services import postgres_database, postgres_url  # noqa: F401
from ctxkeep import _pg
from ctxkeep._pg import PgClient, split_url
from ctxkeep.errors import StorageError

pytestmark = pytest.mark.postgres

psycopg = pytest.importorskip("psycopg")

TENANTS = 64
POOL_MAX = 6


@pytest.fixture
def db(postgres_database: str) -> str:  # noqa: F811
    """The URL of a fresh database on the test server, dropped after the test."""
    return postgres_database


def in_schema(url: str, schema: str) -> str:
    """``url`` with ``search_path`` ``schema`` (created first)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    sep = "&" if "?" in url else "?"
    return url + sep + urlencode({"options": f"-csearch_path={schema}"})


CLIENTS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND backend_type = 'client backend' AND pid <> ALL(%s)"
)
"""The database's client connections but the watch's own: not its autovacuum workers (under
the test's writes one joined the count, 7 with a pool of 6) nor parallel query workers."""


class Watch:
    """Counts the database's client connections (but its own) every few milliseconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.peak = 0
        self._own: list[int] = []
        """The watch's backends: one that has just hung up stays listed a moment."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute(CLIENTS, ([*self._own, conn.info.backend_pid],)).fetchone()
        return int(row[0])

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            self._own.append(conn.info.backend_pid)
            while not self._stop.wait(0.005):
                row = conn.execute(CLIENTS, (self._own,)).fetchone()
                self.peak = max(self.peak, int(row[0]))

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def settled(url: str) -> int:
    """The database's connections once closed ones are gone (a backend leaves
    ``pg_stat_activity`` a moment after its client hung up), waiting up to 5 s.
    """
    watch = Watch(url)
    for _ in range(100):
        if (found := watch.count()) == 0:
            return 0
        threading.Event().wait(0.05)
    return found


def schema_of(client: PgClient) -> str:
    return str(client.q("read the schema", "SELECT current_setting('search_path')")[0][0])


def client(url: str, **kwargs: object) -> PgClient:
    return PgClient(url, name="test", meta_key="pool_test", migrations=[], **kwargs)  # type: ignore[arg-type]


# -- the address -------------------------------------------------------------------------------


def test_urls_that_differ_only_in_their_search_path_share_an_address() -> None:
    base = "postgresql://u@h:5/d?application_name=x"
    plain, no_path = split_url(base)
    for options, path in [
        ("-csearch_path=a", "a"),
        ("-c search_path=a,b", "a,b"),
        ("--search_path=a", "a"),
        ("-cstatement_timeout=5 -csearch_path=a -csearch_path=b", "b"),
    ]:
        address, found = split_url(f"{base}&{urlencode({'options': options}, quote_via=quote)}")
        assert found == path
        if "statement_timeout" in options:  # another setting: another pool
            assert address != plain and "statement_timeout" in address
        else:
            assert address == plain
    assert no_path is None


# -- 40 tenants, one pool ----------------------------------------------------------------------


@pytest.mark.slow
def test_sixty_four_tenants_used_at_once_stay_within_the_pool_and_read_only_their_own(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxkeep.server.keys import PostgresKeyRegistry
    from ctxkeep.server.tenants import TenantStores

    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", str(POOL_MAX))
    tenants = [f"t{i:02d}" for i in range(TENANTS)]
    base = in_schema(db, "ctxkeep")
    registry = PostgresKeyRegistry(base)
    stores = TenantStores(base, registry, max_open=TENANTS, embedder="hash")
    sessions: dict[str, str] = {}
    try:
        with Watch(db) as watch:
            for tenant in tenants:  # open every store of every tenant
                with stores.lease_stores(tenant) as res:
                    sessions[tenant] = res.memory.create_session(f"agent-{tenant}")
                    res.checkpoints()
                    res.episodic()
                    res.fabric().join(f"agent-{tenant}", f"task-{tenant}", {"tenant": tenant})
            assert stores.open_count() == TENANTS

            def work(tenant: str, round_: int) -> None:
                marker = f"marker-{tenant}-{round_}"
                with stores.lease_stores(tenant) as res:
                    res.memory.add_message(sessions[tenant], "user", marker)
                    res.checkpoints().save(f"agent-{tenant}", {"context": marker})
                    res.episodic().save_episode(sessions[tenant], f"goal {tenant}", marker)
                    texts = [m.content for m in res.memory.get_messages(sessions[tenant])]
                    assert all(t.startswith(f"marker-{tenant}-") for t in texts), texts
                    assert marker in texts
                    saved = [c.state.context for c in res.checkpoints().history(f"agent-{tenant}")]
                    assert all(t.startswith(f"marker-{tenant}-") for t in saved), saved
                    assert marker in saved
                    ref = res.artifacts().put(marker)
                    assert res.artifacts().get(ref) == marker
                    fabric = res.fabric()
                    assert fabric.read(f"agent-{tenant}").state == {"tenant": tenant}
                    fabric.send(f"agent-{tenant}", marker, recipient=f"agent-{tenant}", topic=None)
                    hits = res.episodic().search(marker, top_k=50)
                    assert {h.episode.summary.split("-")[1] for h in hits} == {tenant}
                    got = fabric.receive(f"agent-{tenant}", 10)
                    fabric.ack(f"agent-{tenant}", [m.id for m in got])
                    assert {m.payload.split("-")[1] for m in got} <= {tenant}

            jobs = [(t, r) for r in range(3) for t in tenants]
            random.Random(28).shuffle(jobs)  # interleaved: tenants follow each other on a conn
            with ThreadPoolExecutor(16) as pool:
                for future in [pool.submit(work, t, r) for t, r in jobs]:
                    future.result()
        assert 1 <= watch.peak <= POOL_MAX
        assert watch.count() <= POOL_MAX
    finally:
        stores.close()
        registry.close()
    assert settled(db) == 0  # the last client closed the pool


def test_a_client_closed_while_others_run_leaves_them_working(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "3")
    clients = {name: client(in_schema(db, name)) for name in ("a", "b", "c")}
    stop = threading.Event()
    seen: dict[str, set[str]] = {"a": set(), "b": set()}
    failures: list[BaseException] = []

    def run(name: str) -> None:
        try:
            while not stop.is_set():
                seen[name].add(schema_of(clients[name]))
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(name,)) for name in seen]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):
            assert schema_of(clients["c"]) == "c"
        clients["c"].close()
        clients["c"].close()  # again: releases nothing more
        with pytest.raises(StorageError, match="closed"):
            schema_of(clients["c"])
        later = client(in_schema(db, "d"))  # joins the pool the others hold
        assert later.pool is clients["a"].pool
        assert schema_of(later) == "d"
        later.close()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not failures
    assert seen == {"a": {"a"}, "b": {"b"}}
    clients["a"].close()
    assert schema_of(clients["b"]) == "b"
    clients["b"].close()
    assert settled(db) == 0


# -- the maximum -------------------------------------------------------------------------------


def test_the_configured_maximum_bounds_the_pool_under_load(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "2")
    clients = [client(in_schema(db, f"s{i}"), max_size=20) for i in range(8)]
    try:
        assert clients[0].pool.max_size == 2  # the setting, not the largest asked
        with Watch(db) as watch, ThreadPoolExecutor(12) as pool:
            names = list(pool.map(lambda i: schema_of(clients[i % 8]), range(400)))
        assert names == [f"s{i % 8}" for i in range(400)]
        assert 1 <= watch.peak <= 2
    finally:
        for c in clients:
            c.close()


def test_an_explicit_pool_max_comes_before_the_environment(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "2")
    one = client(in_schema(db, "a"), pool_max=5)
    try:
        assert one.pool.max_size == 5
    finally:
        one.close()


def test_without_a_setting_the_pool_is_as_large_as_its_largest_ask(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CTXKEEP_PG_POOL_MAX", raising=False)
    small = client(in_schema(db, "a"), max_size=2)
    large = client(in_schema(db, "b"), max_size=5)
    try:
        assert small.pool is large.pool and small.pool.max_size == 5
    finally:
        small.close()
        large.close()


@pytest.mark.parametrize("bad", ["0x", "-1"])
def test_a_bad_pool_maximum_is_refused(bad: str, db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ctxkeep.errors import ConfigError

    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", bad)
    with pytest.raises(ConfigError, match="CTXKEEP_PG_POOL_MAX"):
        client(db)
    with pytest.raises(ConfigError, match="pool_max"):
        _pg.configured_pool_max(0)


def test_every_store_works_on_a_pool_of_one_connection(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No store takes a second connection while holding one (on a full pool it would wait for
    itself).
    """
    from ctxkeep import IPCMessage, open_checkpoints, open_episodic, open_memory
    from ctxkeep.artifacts import open_artifacts
    from ctxkeep.fabric.postgres import PostgresBus

    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    registry_url = in_schema(db, "ext")
    with psycopg.connect(registry_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA ext")
    url = in_schema(db, "one")
    vector_url = url.replace("search_path%3Done", "search_path%3Done%2Cext")
    with (
        Watch(db) as watch,
        open_memory(url) as mem,
        open_checkpoints(url) as checkpoints,
        open_episodic(vector_url, embedder="hash") as episodic,
        open_artifacts(url) as artifacts,
        PostgresBus(url, consumer="test") as bus,
    ):
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hello")
        assert [m.content for m in mem.get_messages(sid)] == ["hello"]
        checkpoints.save("agent", {"context": "c"}, session_id=sid)
        assert checkpoints.latest("agent") is not None
        episodic.save_episode(sid, "goal", "a summary")
        assert len(episodic.search("summary")) == 1
        ref = artifacts.put("a long tool output")
        assert artifacts.get(ref) == "a long tool output"
        task = bus.task_state("task")
        task.join({"goal": "g"})
        assert task.read() == (1, {"goal": "g"})
        bus.register("agent", "task")
        bus.send(IPCMessage(sender="agent", recipient="agent", payload="p", task_id="task"))
        got = bus.receive("agent")
        bus.ack("agent", [m.id for m in got])
        assert [m.payload for m in got] == ["p"] and bus.receive("agent") == []
    assert watch.peak == 1


# -- the search_path of each connection ------------------------------------------------------


def test_a_client_without_a_search_path_gets_the_default_back(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    plain = client(db)
    tenant = client(in_schema(db, "acme"))
    try:
        default = schema_of(plain)
        assert default != "acme"
        for _ in range(3):
            assert schema_of(tenant) == "acme"
            assert schema_of(plain) == default
    finally:
        plain.close()
        tenant.close()


def test_key_lookups_use_a_tenants_connection_as_it_is(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service looks a key up on every request, on the pool its tenants' stores share:
    the lookup names its table's schema and leaves the connection's ``search_path`` alone, so
    neither it nor the tenant's next statement sets the path again (two round trips a request).
    """
    from ctxkeep.server.keys import PostgresKeyRegistry

    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    registry = PostgresKeyRegistry(in_schema(db, "keys"))
    tenant = client(in_schema(db, "acme"))
    try:
        record, token = registry.create("acme")
        shared = tenant._shared
        assert shared is not None
        for _ in range(3):
            assert schema_of(tenant) == "acme"
            assert registry.authenticate(token) == record
            (conn,) = list(shared.paths)  # one connection: the pool's maximum is 1
            assert shared.paths[conn] == "acme"
        assert registry.authenticate(token + "x") is None
        assert [k.key_id for k in registry.list_keys()] == [record.key_id]
        assert schema_of(tenant) == "acme"
        assert registry.revoke(record.key_id) and registry.authenticate(token) is None
    finally:
        tenant.close()
        registry.close()


def test_a_broken_connection_is_replaced_under_the_clients_search_path(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    a, b = client(in_schema(db, "a")), client(in_schema(db, "b"))
    try:
        assert schema_of(a) == "a"
        kill(db)
        answers = [attempt(lambda: schema_of(b)) for _ in range(2)]
        assert answers[-1] == "b" and set(answers) <= {"b", None}  # at most one failure
        assert schema_of(a) == "a"
    finally:
        a.close()
        b.close()


def test_a_setting_pipelined_with_a_statement_that_fails_is_set_again(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the SET and the statement are one implicit transaction: the failure undoes the SET,
    # so the client must not take it as made
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    c = client(db)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero), c.connection() as conn:
            default = conn.execute("SHOW work_mem").fetchone()[0]
            with conn.pipeline():
                c.set(conn, "work_mem", 4321)
                conn.execute("SELECT 1 / 0")
        with c.connection() as conn:
            assert conn.execute("SHOW work_mem").fetchone()[0] == default
            assert not c.holds(conn, "work_mem", 4321)
            c.set(conn, "work_mem", 4321)
            assert c.holds(conn, "work_mem", 4321)
            assert conn.execute("SHOW work_mem").fetchone()[0] == "4321kB"
    finally:
        c.close()


def kill(url: str) -> None:
    """Terminate every other connection to the database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def attempt(call: Callable[[], str]) -> str | None:
    """``call()``, or None if the server lost its connection."""
    try:
        return call()
    except StorageError:
        return None


def test_a_server_that_does_not_answer_is_refused_with_libpqs_reason() -> None:
    with pytest.raises(StorageError, match=r"cannot connect: .*port 1 failed"):
        client("postgresql://127.0.0.1:1/x")


def test_serve_with_workers_keeps_to_workers_times_its_pool_size(db: str, tmp_path: Path) -> None:
    """``ctxkeep serve --workers 2 --pg-pool-size 2``: whatever the number of tenants, the
    service holds at most 2 x 2 connections (the issue's connection budget)."""
    import signal

    import httpx

    from _server import start_serve
    from ctxkeep.server.keys import open_key_registry

    registry = open_key_registry(db)
    try:
        keys = {f"t{i}": registry.create(f"t{i}")[1] for i in range(8)}
    finally:
        registry.close()
    assert settled(db) == 0
    with (tmp_path / "serve.log").open("w") as err, Watch(db) as watch:
        proc, base = start_serve(
            "--db", db, "--workers", "2", "--pg-pool-size", "2", "--embedder", "hash", stderr=err
        )
        try:

            def work(tenant: str) -> None:
                auth = {"Authorization": f"Bearer {keys[tenant]}"}
                with httpx.Client(base_url=base, headers=auth, timeout=60) as http:
                    made = http.post("/v1/sessions", json={"agent_id": "a"})
                    assert made.status_code == 201, made.text
                    sid = made.json()["session"]["session_id"]
                    for n in range(3):
                        answer = http.post(
                            f"/v1/sessions/{sid}/messages",
                            json={"messages": [{"role": "user", "content": f"{tenant} {n}"}]},
                        )
                        assert answer.status_code == 201, answer.text
                    answer = http.post(f"/v1/sessions/{sid}/prompt", json={})
                    assert answer.status_code == 200, answer.text
                    assert [m["content"] for m in answer.json()["messages"]][-1] == f"{tenant} 2"

            with ThreadPoolExecutor(8) as pool:
                try:
                    list(pool.map(work, [t for t in keys for _ in range(2)]))
                except AssertionError as exc:
                    err.flush()
                    log = (tmp_path / "serve.log").read_text()[-4000:]
                    raise AssertionError(f"{exc}\nthe server's log ends:\n{log}") from exc
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
    assert 1 <= watch.peak <= 4, watch.peak


def test_episodes_save_on_a_connection_the_pool_opened_before_the_episodic_store_was_imported(
    db: str,
) -> None:
    """The vectors' binary dumper must reach connections that a session store of the same
    process opened first (CI lost every episode save of a server whose pool had one: psycopg
    copies its global adapters into a connection as it opens).
    """
    import os
    import subprocess
    import sys

    with psycopg.connect(in_schema(db, "ext"), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA ext")
    url = in_schema(db, "one")
    vector_url = url.replace("search_path%3Done", "search_path%3Done%2Cext")
    script = f"""
import sys
from ctxkeep import open_episodic, open_memory
with open_memory({url!r}) as mem:
    mem.add_message(mem.create_session("agent"), "user", "hello")
    assert "ctxkeep.episodic.postgres" not in sys.modules
    with open_episodic({vector_url!r}, embedder="hash") as episodic:
        episodic.save_episode("s", "goal", "a summary")
        print(len(episodic.search("summary")))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CTXKEEP_PG_POOL_MAX": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1"]


def test_servers_creating_one_tenants_schema_at_once_all_succeed(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers that open one new tenant at the same moment both create its schema (CI's
    ``--workers 2`` run lost a request to ``CREATE SCHEMA IF NOT EXISTS`` racing itself: the
    second creator fails on the catalogue's unique index unless setup is serialized).
    """
    from ctxkeep.server.keys import open_key_registry

    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "8")
    registry = open_key_registry(db)

    def create(n: int, round_: int, start: threading.Barrier) -> str:
        start.wait()
        if n % 2:
            return registry.extension_schema("pg_trgm", f"ext_{round_}")
        registry.create_schema(f"tenant_{round_}")
        return f"tenant_{round_}"

    try:
        for round_ in range(10):
            start = threading.Barrier(6)
            with ThreadPoolExecutor(6) as pool:
                made = list(pool.map(create, range(6), [round_] * 6, [start] * 6))
            assert set(made[0::2]) == {f"tenant_{round_}"}
            assert set(made[1::2]) == {"ext_0"}  # the extension lives in one schema
    finally:
        registry.close()

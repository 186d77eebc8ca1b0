"""``ctxkeep serve`` past one process, and how it stops (issue 28): ``--workers N`` on Redis
and PostgreSQL starts N processes that all answer and whose ``/metrics`` add up; SQLite and ``memory://``
refuse more than one with one line; SIGTERM lets a request in flight finish and exits 0, and
``--graceful-timeout`` bounds the wait.

Every server here is the console script in a subprocess; a request is held in flight by
sending its head and half its body, the rest after the signal (no slow route is needed, and
no timing is asserted).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from anyio import to_thread
from fastapi.testclient import TestClient

from _cli import assert_one_line_error, run_script
from _server import start_serve
from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep.cli.serve import DEFAULT_PG_POOL, default_threads
from ctxkeep.errors import ConfigError
from ctxkeep.server import create_app
from ctxkeep.server.keys import open_key_registry
from ctxkeep.server.workers import SETTINGS_ENV, ServeSettings, worker_app

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

pytest.importorskip(
    "prometheus_client", reason="prometheus-client is not installed: pip install 'ctxkeep[metrics]'"
)
from prometheus_client.parser import text_string_to_metric_families


def _key(url: str, tenant: str = "acme") -> dict[str, str]:
    registry = open_key_registry(url)
    try:
        _, token = registry.create(tenant)
    finally:
        registry.close()
    return {"Authorization": f"Bearer {token}"}


def _pids(log: Path) -> set[int]:
    """The worker pids of the access log lines written so far."""
    found = set()
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == "request":
                found.add(int(record["pid"]))
    return found


def _created(base: str) -> float:
    """``POST /v1/sessions`` answered 201, as ``/metrics`` counts them."""
    answer = httpx.get(f"{base}/metrics", timeout=10)
    assert answer.status_code == 200, answer.text
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "ctxkeep_http_requests_total"
                and labels.get("route") == "/v1/sessions"
                and labels.get("status") == "201"
            ):
                return float(sample.value)
    return 0.0


def _stop(proc: subprocess.Popen[Any]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


# -- --workers ------------------------------------------------------------------------------------


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def shared_store(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh store N workers can share: a Redis key prefix, a PostgreSQL schema."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        return f"{url}?prefix={request.getfixturevalue('redis_prefix_factory')()}"
    return str(request.getfixturevalue("postgres_schema_factory")())


def test_two_workers_both_answer_and_metrics_add_up(shared_store: str, tmp_path: Path) -> None:
    url = shared_store
    auth = _key(url)
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc, base = start_serve(
            "--db", url, "--workers", "2", "--embedder", "hash", "--allow-volatile-redis",
            "--header-timeout", "2", stderr=err,
        )  # fmt: skip
        try:
            created = 0
            # each request on a new connection: the kernel hands connections to either worker
            while len(_pids(log)) < 2 and created < 400:
                answer = httpx.post(f"{base}/v1/sessions", json={"agent_id": "a"}, headers=auth)
                assert answer.status_code == 201, answer.text
                created += 1
            assert len(_pids(log)) == 2, log.read_text()
            # whichever worker answers the scrape, it shows every worker's count
            for _ in range(6):
                assert _created(base) == created
            listed = httpx.get(f"{base}/v1/sessions?limit=1000", headers=auth).json()
            assert len(listed["sessions"]) == created  # one store behind both
            # the workers keep serve's limits: a head that stops is cut off after 2 s
            port = int(base.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=30) as slow:
                slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                assert _response(slow).startswith(b"HTTP/1.1 408 ")
        finally:
            code = _stop(proc)
    assert code == 0
    text = log.read_text()
    assert "2 worker processes" in text
    assert not re.search(r"Traceback", text), text


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
def test_more_than_one_worker_on_sqlite_or_memory_is_refused_in_one_line(
    kind: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'srv.db'}" if kind == "sqlite" else "memory://"
    done = run_script("serve", "--db", url, "--workers", "2")
    assert done.returncode == 2
    assert_one_line_error(
        done.stderr, f"--workers 2 on {kind}", "a single process is the rule", "PostgreSQL or Redis"
    )
    assert not (tmp_path / "srv.db").exists()  # refused before anything is made


def test_a_worker_reads_back_the_settings_serve_left_it(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ServeSettings(
        db="redis://127.0.0.1:6379/0", max_body_bytes=1024, header_timeout=3.5, otel=True, threads=3
    )
    monkeypatch.setenv(SETTINGS_ENV, settings.to_env())
    assert ServeSettings.from_env() == settings


def test_the_worker_factory_outside_serve_says_what_runs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SETTINGS_ENV, raising=False)
    with pytest.raises(ConfigError, match="ctxkeep serve --workers N"):
        worker_app()


# -- graceful shutdown ----------------------------------------------------------------------------


def _held_append(base: str, auth: dict[str, str], sid: str) -> tuple[socket.socket, bytes]:
    """An append whose head and first bytes of body are sent: its socket and the rest."""
    body = json.dumps({"messages": [{"role": "user", "content": "in flight"}]}).encode()
    head = (
        f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: {auth['Authorization']}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    port = int(base.rsplit(":", 1)[1])
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.sendall(head + body[:10])
    return conn, body[10:]


def _response(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _serve_sqlite(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[Any], str, dict[str, str]]:
    url = f"sqlite:///{tmp_path / 'srv.db'}"
    auth = _key(url)
    log = (tmp_path / "serve.log").open("w")
    proc, base = start_serve("--db", url, "--embedder", "hash", *args, stderr=log)
    log.close()  # the child has its own descriptor
    return proc, base, auth


def test_sigterm_lets_a_request_in_flight_finish_and_exits_0(tmp_path: Path) -> None:
    proc, base, auth = _serve_sqlite(tmp_path)
    try:
        made = httpx.post(f"{base}/v1/sessions", json={"agent_id": "a"}, headers=auth)
        sid = made.json()["session"]["session_id"]
        conn, rest = _held_append(base, auth, sid)
        time.sleep(0.5)  # the head is read: the request is in flight
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while True:  # the server stops taking connections ...
            try:
                httpx.get(f"{base}/healthz", timeout=2)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, "the server still accepts connections"
            time.sleep(0.1)
        assert proc.poll() is None  # ... but waits for the request in flight
        conn.sendall(rest)
        answer = _response(conn)
        conn.close()
        assert answer.startswith(b"HTTP/1.1 201 "), answer[:200]
        assert b"in flight" in answer
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    # the append is stored
    from ctxkeep.sessions import open_memory

    with open_memory(f"sqlite:///{tmp_path / 'srv.tenants' / 'acme.db'}") as memory:
        assert [m.content for m in memory.get_messages(sid)] == ["in flight"]


def test_graceful_timeout_bounds_the_wait_for_a_request_that_never_ends(tmp_path: Path) -> None:
    proc, base, auth = _serve_sqlite(tmp_path, "--graceful-timeout", "1")
    try:
        made = httpx.post(f"{base}/v1/sessions", json={"agent_id": "a"}, headers=auth)
        conn, _ = _held_append(base, auth, made.json()["session"]["session_id"])
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        # the body never comes (its own timeout is 60 s): the server gives up after 1 s
        assert proc.wait(timeout=30) == 0
        conn.settimeout(10)
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # closed under the request
            answer = _response(conn)
        assert not answer.startswith(b"HTTP/1.1 2")
        conn.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert "timeout graceful shutdown exceeded" in (tmp_path / "serve.log").read_text()


@pytest.mark.slow
@pytest.mark.redis
def test_sigterm_during_a_load_run_on_two_workers_loses_no_acknowledged_append(
    redis_url: str, redis_prefix_factory: Any, tmp_path: Path
) -> None:
    url = f"{redis_url}?prefix={redis_prefix_factory()}"
    auth = _key(url)
    args = ("--db", url, "--embedder", "hash", "--allow-volatile-redis")
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc, base = start_serve(*args, "--workers", "2", stderr=err)
    sids = [
        httpx.post(f"{base}/v1/sessions", json={"agent_id": f"a{i}"}, headers=auth).json()[
            "session"
        ]["session_id"]
        for i in range(4)
    ]
    acknowledged: dict[str, list[str]] = {sid: [] for sid in sids}
    running = threading.Event()

    def load(sid: str) -> None:
        with httpx.Client(base_url=base, headers=auth, timeout=30) as client:
            for n in range(100_000):
                text = f"{sid} {n}"
                try:
                    answer = client.post(
                        f"/v1/sessions/{sid}/messages",
                        json={"messages": [{"role": "user", "content": text}]},
                    )
                except httpx.TransportError:
                    return  # the server is gone, or closed this connection: stop
                if answer.status_code == 201:
                    acknowledged[sid].append(text)
                    running.set()

    threads = [threading.Thread(target=load, args=(sid,)) for sid in sids]
    for t in threads:
        t.start()
    try:
        assert running.wait(30)
        time.sleep(1)
        code = _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        for t in threads:
            t.join(60)
    assert code == 0
    assert all(acknowledged.values())
    # a new server over the same store has every acknowledged append
    proc, base = start_serve(*args, stderr=subprocess.DEVNULL)
    try:
        for sid, sent in acknowledged.items():
            # beyond max_history the oldest are trimmed to the archive, in order
            kept = [
                m["content"]
                for path in ("archived", "messages")
                for m in httpx.get(f"{base}/v1/sessions/{sid}/{path}", headers=auth).json()[
                    "messages"
                ]
            ]
            assert kept[: len(sent)] == sent
    finally:
        assert _stop(proc) == 0


def _tcp_inodes(port: int) -> tuple[set[int], set[int]]:
    """The inodes of the IPv4 sockets listening on ``port`` and of those accepted on it."""
    listening, accepted = set(), set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) != port:
            continue
        # state 0A: LISTEN; 01: ESTABLISHED
        {"0A": listening, "01": accepted}.get(fields[3], set()).add(int(fields[9]))
    return listening, accepted


def _holders(inodes: set[int]) -> dict[int, set[int]]:
    """Which processes hold which of these socket inodes (by their open files)."""
    held: dict[int, set[int]] = {}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            links = [p.readlink() for p in fd_dir.iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        mine = {int(str(link)[8:-1]) for link in links if str(link).startswith("socket:[")}
        if mine & inodes:
            held[int(fd_dir.parent.name)] = mine & inodes
    return held


@pytest.mark.redis
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_each_worker_listens_on_its_own_socket_and_kept_connections_spread(
    redis_url: str, redis_prefix_factory: Any
) -> None:
    """uvicorn's workers share one listening socket, and clients that keep their connections
    stayed where they landed (39 of 50 on one of 2 workers, measured): each worker listens on
    a socket of its own (``SO_REUSEPORT``), and the kernel spreads connections over them.
    """
    url = f"{redis_url}?prefix={redis_prefix_factory()}"
    proc, base = start_serve(
        "--db", url, "--workers", "2", "--embedder", "hash", "--allow-volatile-redis",
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    port = int(base.rsplit(":", 1)[1])
    held: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:  # the second worker may still be starting
            listening, _ = _tcp_inodes(port)
            by_pid = _holders(listening)
            if len(listening) == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(listening) == 2, listening
        assert len(by_pid) == 2 and all(len(own) == 1 for own in by_pid.values()), by_pid
        for _ in range(40):  # each connection kept open after its answer
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            held.append(conn)
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")  # a small answer: one read
        _, accepted = _tcp_inodes(port)
        per_worker = {pid: len(own) for pid, own in _holders(accepted).items() if pid in by_pid}
        # a hash of 40 addresses over 2 sockets: fewer than 8 on one is a 1-in-20,000 draw
        assert sorted(per_worker) == sorted(by_pid) and min(per_worker.values()) >= 8, per_worker
    finally:
        for conn in held:
            conn.close()
        assert _stop(proc) == 0


# -- --threads ------------------------------------------------------------------------------------


def _threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no thread count for {pid}")


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
def test_each_worker_runs_its_routes_on_at_most_threads_threads(
    postgres_schema_factory: Any, tmp_path: Path
) -> None:
    """``serve --workers 2 --threads 3``: 32 clients appending at once make each worker start
    at most 3 threads for its routes (anyio's default limiter starts up to 40, one per
    request waiting for the worker's one PostgreSQL connection).
    """
    url = str(postgres_schema_factory())
    auth = _key(url)
    log = tmp_path / "serve.log"
    with log.open("w") as err:
        proc, base = start_serve(
            "--db", url, "--workers", "2", "--threads", "3", "--pg-pool-size", "1",
            "--embedder", "hash", stderr=err,
        )  # fmt: skip
    try:
        sid = httpx.post(f"{base}/v1/sessions", json={"agent_id": "a"}, headers=auth).json()[
            "session"
        ]["session_id"]

        def append() -> None:
            answer = httpx.post(
                f"{base}/v1/sessions/{sid}/messages",
                json={"messages": [{"role": "user", "content": "x"}]},
                headers=auth,
                timeout=30,
            )
            assert answer.status_code == 201, answer.text

        # each request on a new connection, until both workers have answered (started, and
        # opened the tenant's stores)
        for _ in range(400):
            append()
            if len(_pids(log)) == 2:
                break
        workers = sorted(_pids(log))
        assert len(workers) == 2
        before = {pid: _threads_of(pid) for pid in workers}
        peak = dict(before)
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                append()

        clients = [threading.Thread(target=load) for _ in range(32)]
        for t in clients:
            t.start()
        try:
            end = time.monotonic() + 4
            while time.monotonic() < end:
                for pid in workers:
                    peak[pid] = max(peak[pid], _threads_of(pid))
                time.sleep(0.05)
        finally:
            stop.set()
            for t in clients:
                t.join(60)
        assert all(peak[pid] - before[pid] <= 3 for pid in workers), (before, peak)
    finally:
        assert _stop(proc) == 0


def test_the_app_sets_its_thread_limiter_as_it_starts() -> None:
    app = create_app("memory://", embedder="hash", threads=5)
    with TestClient(app) as client:
        assert client.portal is not None
        size = client.portal.call(lambda: to_thread.current_default_thread_limiter().total_tokens)
    assert size == 5


def test_serve_threads_default_to_the_postgres_pool_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread beyond a worker's connections only waits for one: on PostgreSQL serve runs as
    many as the pool has (``--pg-pool-size``, which serve leaves in ``CTXKEEP_PG_POOL_MAX``);
    elsewhere anyio's default stands.
    """
    monkeypatch.delenv("CTXKEEP_PG_POOL_MAX", raising=False)
    monkeypatch.setenv("CTXKEEP_CONFIG", "/nonexistent/ctxkeep.toml")
    assert default_threads("postgresql://u@h/db") == DEFAULT_PG_POOL
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "5")
    assert default_threads("postgresql://u@h/db") == 5
    assert default_threads("redis://127.0.0.1:6379/0") is None
    assert default_threads("sqlite:///x.db") is None

"""API keys and tenants: the registry, ``ctxkeep keys`` and ``ctxkeep serve`` (real console
script, real SQLite file, real uvicorn process).
"""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from _cli import assert_one_line_error
from _server import start_serve
from ctxkeep.cli import main
from ctxkeep.cli.serve import DEFAULT_KEEP_ALIVE
from ctxkeep.errors import ConfigError
from ctxkeep.server import create_app
from ctxkeep.server.keys import SQLiteKeyRegistry, open_key_registry


def test_keys_are_random_shown_once_and_stored_only_as_sha256(tmp_path: Path) -> None:
    registry = open_key_registry(f"sqlite:///{tmp_path}/k.db")
    try:
        record, key = registry.create("acme")
        other = registry.create("acme")[1]
        assert isinstance(registry, SQLiteKeyRegistry)
        assert key.startswith(f"ck_{record.key_id}_") and len(key) >= 56 and key != other
        assert record.digest == hashlib.sha256(key.encode()).hexdigest()
        assert registry.authenticate(key) == record
        assert registry.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
        assert registry.authenticate("not a key") is None
    finally:
        registry.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert key.split("_", 2)[2].encode() not in stored  # the secret is nowhere on disk


def test_revoked_keys_are_listed_and_refused() -> None:
    registry = open_key_registry("memory://")
    record, key = registry.create("acme")
    registry.create("globex")
    assert registry.revoke(record.key_id) and not registry.revoke(record.key_id)
    assert not registry.revoke("nope")
    assert registry.authenticate(key) is None
    listed = registry.list_keys("acme")
    assert [(k.key_id, k.revoked_at is not None) for k in listed] == [(record.key_id, True)]
    assert registry.tenants() == ["acme", "globex"]


@pytest.mark.parametrize("name", ["", "Acme", "a-b", "9lives", "x" * 33, "a/b"])
def test_tenant_names_are_plain_identifiers(name: str) -> None:
    with pytest.raises(ConfigError, match="invalid tenant name"):
        open_key_registry("memory://").create(name)


class Ran:
    """What an in-process CLI run printed."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """Run ``ctxkeep ARGS`` in this process (the console script itself runs in the serve test)."""

    def run(*args: str) -> Ran:
        code = main(list(args))
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    return run


def test_keys_cli_creates_lists_and_revokes(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    db = f"sqlite:///{tmp_path}/srv.db"
    made = cli("keys", "create", "--tenant", "acme", "--db", db, "--json")
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["tenant"] == "acme" and created["key"].startswith("ck_")
    app = create_app(db, key_cache_seconds=0.3)
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {created['key']}"}
        assert client.get("/v1/stats", headers=headers).status_code == 200
        listed = cli("keys", "list", "--db", db)
        assert listed.returncode == 0 and created["key_id"] in listed.stdout
        assert "active" in listed.stdout and created["key"] not in listed.stdout
        revoked = cli("keys", "--db", db, "revoke", created["key_id"])
        assert revoked.returncode == 0 and revoked.stdout.strip() == "revoked"
        time.sleep(0.35)  # another process's revoke counts once the server's check expires
        assert client.get("/v1/stats", headers=headers).status_code == 401
    again = cli("keys", "revoke", created["key_id"], "--db", db)
    assert again.returncode == 1 and "no active key" in again.stdout


def test_a_checked_key_is_trusted_for_the_cache_window_without_the_store(tmp_path: Path) -> None:
    """What spares every request its key lookup (issue 28): a key that passed is taken from
    memory for ``cache_seconds``, even after another process revoked it, and read again after.
    """
    db = f"sqlite:///{tmp_path}/k.db"
    served, elsewhere = open_key_registry(db), open_key_registry(db)
    try:
        served.cache_seconds = 0.5
        record, key = served.create("acme")
        assert served.cached(key) is None  # never checked yet
        assert served.authenticate(key) == record and served.cached(key) == record
        assert elsewhere.revoke(record.key_id)  # another process: this one cannot know
        assert served.cached(key) == record
        time.sleep(0.55)
        assert served.cached(key) is None and served.authenticate(key) is None
        assert served.cached(key) is None
    finally:
        served.close()
        elsewhere.close()


def test_a_key_revoked_through_the_server_is_refused_at_once() -> None:
    registry = open_key_registry("memory://")
    registry.cache_seconds = 60
    record, key = registry.create("acme")
    other, other_key = registry.create("acme")
    assert registry.authenticate(key) == record and registry.authenticate(other_key) == other
    assert registry.revoke(record.key_id)
    assert registry.cached(key) is None and registry.authenticate(key) is None
    assert registry.cached(other_key) == other  # only the revoked key is forgotten


def test_failed_checks_and_an_uncached_registry_remember_nothing() -> None:
    registry = open_key_registry("memory://")
    record, key = registry.create("acme")
    assert registry.authenticate(key) == record and registry.cached(key) is None  # cache off
    registry.cache_seconds = 60
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert registry.authenticate(wrong) is None and registry.cached(wrong) is None


def test_the_server_answers_from_its_key_cache_and_refuses_a_bad_window(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/srv.db"
    registry = open_key_registry(db)
    try:
        record, key = registry.create("acme")
        app = create_app(db, key_cache_seconds=60)
        with TestClient(app) as client:
            headers = {"Authorization": f"Bearer {key}"}
            assert client.get("/v1/stats", headers=headers).status_code == 200
            assert registry.revoke(record.key_id)  # not the server's registry
            # Served from memory: the lookup the cache saves is not made.
            assert client.get("/v1/stats", headers=headers).status_code == 200
            assert app.state.ctxkeep.keys.cached(key) == record
    finally:
        registry.close()
    for bad in (-1, float("inf"), "2"):
        with pytest.raises(ConfigError, match="key_cache_seconds"):
            create_app(db, key_cache_seconds=bad)  # type: ignore[arg-type]


def test_keys_cli_refuses_bad_input_in_one_line(tmp_path: Path, cli: Callable[..., Ran]) -> None:
    bad = cli("keys", "create", "--tenant", "Not-Valid", "--db", f"sqlite:///{tmp_path}/k.db")
    assert bad.returncode == 2
    assert_one_line_error(bad.stderr, "invalid tenant name")
    mem = cli("keys", "create", "--tenant", "acme", "--db", "memory://")
    assert mem.returncode == 2
    assert_one_line_error(mem.stderr, "memory://")


def _healthz_on(conn: socket.socket) -> bytes:
    """One ``GET /healthz`` on an open connection: the whole response (by Content-Length)."""
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length")
    )
    while len(body) < length:
        body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


def test_serve_outlasts_http_clients_idle_connections() -> None:
    # uvicorn's own 5 s equals httpx's pool expiry: a call after ~5 s idle could meet the close
    assert httpx.Limits().keepalive_expiry * 2 < DEFAULT_KEEP_ALIVE  # type: ignore[operator]


def test_serve_runs_the_service_and_logs_json_lines(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/srv.db"
    registry = open_key_registry(db)
    _, token = registry.create("acme")
    registry.close()
    key = {"key": token}
    proc, base = start_serve(
        "--db", db, "--keep-alive", "2", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    port = int(base.rsplit(":", 1)[1])
    try:
        headers = {"Authorization": f"Bearer {key['key']}"}
        r = httpx.post(f"{base}/v1/sessions", json={"agent_id": "a"}, headers=headers)
        assert r.status_code == 201
        # --keep-alive: an idle connection stays open that long, then the server closes it
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            assert _healthz_on(conn).startswith(b"HTTP/1.1 200")
            time.sleep(1)
            assert _healthz_on(conn).startswith(b"HTTP/1.1 200")
            time.sleep(3)
            assert conn.recv(4096) == b""  # closed by the server
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    lines = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    posts = [ln for ln in lines if ln.get("method") == "POST"]
    assert len(posts) == 1
    want = {"method": "POST", "path": "/v1/sessions", "status": 201, "tenant": "acme"}
    assert want.items() <= posts[0].items()
    assert key["key"] not in err
    assert (tmp_path / "srv.tenants" / "acme.db").exists()

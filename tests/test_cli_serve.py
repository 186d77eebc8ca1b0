"""``ctxkeep serve`` at startup (issue 27, items 3, 4 and 13): a memory:// server prints a key
that logs in, every server says where it stores and what tenants and keys it found, and a busy
port is one line naming ``--port``.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from _cli import assert_one_line_error, run_script
from _server import free_port, start_serve
from ctxkeep.cli import main
from ctxkeep.cli.serve import startup_lines
from ctxkeep.server.keys import open_key_registry


def test_a_memory_server_prints_a_key_that_logs_in() -> None:
    proc, base = start_serve(
        "--db", "memory://", "--embedder", "hash", stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        head = [proc.stderr.readline() for _ in range(3)]
        assert head[0].startswith("ctxkeep serve: storing in memory://")
        assert "a key for tenant 'demo'" in head[1]
        key = head[2].strip()
        assert key.startswith("ck_")
        answer = httpx.get(f"{base}/v1/sessions", headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
        assert httpx.get(f"{base}/v1/sessions").status_code == 401
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_help_example_on_memory_says_it_prints_a_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "ctxkeep serve --db memory:// --embedder hash" in out
    assert "prints a key for tenant demo" in out


def test_keys_create_on_memory_points_at_the_key_serve_prints(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["keys", "create", "--tenant", "acme", "--db", "memory://"]) == 2
    assert_one_line_error(capsys.readouterr().err, "`ctxkeep serve --db memory://` prints a key")


def test_startup_names_the_store_its_tenants_and_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ctxkeep.db'}"
    registry = open_key_registry(url)
    try:
        assert startup_lines(url, registry, "demo") == [
            f"ctxkeep serve: storing in {url}",
            "0 tenant(s) with 0 active key(s)",
            f"create a key with: ctxkeep keys create --tenant NAME --db {url}",
        ]
        registry.create("acme")
        registry.create("acme")
        revoked, _ = registry.create("zeta")
        registry.revoke(revoked.key_id)
        assert startup_lines(url, registry, "demo") == [
            f"ctxkeep serve: storing in {url}",
            "1 tenant(s) with 2 active key(s): acme",
        ]
    finally:
        registry.close()


def test_a_busy_port_is_one_line_naming_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_script("serve", "--db", "memory://", "--port", str(port))
    assert done.returncode == 2
    assert_one_line_error(done.stderr, f"port {port} on 127.0.0.1 is already in use", "--port")
    assert "Errno" not in done.stderr and done.stdout == ""


def test_an_address_not_of_this_machine_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--db", "memory://", "--host", "nosuchhost.invalid"]) == 2
    assert_one_line_error(capsys.readouterr().err, "cannot listen on --host 'nosuchhost.invalid'")


def test_keys_create_quiet_prints_only_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ctxkeep.db'}"
    assert main(["keys", "create", "--tenant", "acme", "--db", url, "--quiet"]) == 0
    key = capsys.readouterr().out
    assert key.startswith("ck_") and key.count("\n") == 1
    registry = open_key_registry(url)
    try:
        record = registry.authenticate(key.strip())
        assert record is not None and record.tenant == "acme"
    finally:
        registry.close()


def test_the_help_names_workers_shutdown_traces_and_the_probes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for option in ("--workers", "--graceful-timeout", "--otel", "/readyz", "/metrics"):
        assert option in out
    assert "OTEL_TRACES_EXPORTER" in out and "PROMETHEUS_MULTIPROC_DIR" in out


def test_a_graceful_timeout_of_zero_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--db", "memory://", "--graceful-timeout", "0"])
    assert stopped.value.code == 2
    assert "--graceful-timeout: must be more than 0 seconds" in capsys.readouterr().err


def test_otel_with_an_unknown_exporter_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry is not installed")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
    port = str(free_port())
    assert main(["serve", "--db", "memory://", "--otel", "--port", port]) == 2
    assert_one_line_error(capsys.readouterr().err, "OTEL_TRACES_EXPORTER='carrier-pigeon'")


def test_otel_traces_each_request_with_the_configured_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry is not installed")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")  # spans as JSON on stdout
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    proc, base = start_serve(
        "--db", "memory://", "--embedder", "hash", "--otel",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert httpx.get(f"{base}/readyz").status_code == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert '"name": "GET /readyz"' in out
    assert '"http.response.status_code": 200' in out
    assert '"service.name": "ctxkeep"' in out

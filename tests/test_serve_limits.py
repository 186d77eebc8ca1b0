"""Slow and greedy clients: ``ctxkeep serve`` times out request heads and bodies, bounds its
connections, and refuses an append of more messages than its limit (real console script and
uvicorn process for the connection tests; the app in process for the count limit).
"""

from __future__ import annotations

import contextlib
import json
import math
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from _server import start_serve
from ctxkeep.cli import main
from ctxkeep.cli.serve import DEFAULT_MAX_CONNECTIONS
from ctxkeep.errors import ConfigError
from ctxkeep.server import create_app
from ctxkeep.server.app import DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT
from ctxkeep.server.models import DEFAULT_MAX_APPEND_MESSAGES

PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
"""A request head without the blank line that ends it."""


@pytest.fixture
def serve(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """``ctxkeep serve --db memory:// ARGS`` (ARGS: the test's indirect parameter): its base
    URL and port.
    """
    args: tuple[str, ...] = getattr(request, "param", ())
    proc, base = start_serve(
        "--db", "memory://", "--embedder", "hash", *args,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield base, int(base.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_until_closed(conn: socket.socket, within: float = 15) -> bytes:
    """Everything the server sends until it closes the connection (fails after ``within`` s)."""
    conn.settimeout(within)
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def _response(conn: socket.socket) -> bytes:
    """One whole response (head and ``Content-Length`` body) from ``conn``."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def _problem(raw: bytes, status: int, slug: str) -> dict[str, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), raw
    assert b"content-type: application/problem+json" in head.lower(), raw
    problem: dict[str, Any] = json.loads(body)
    assert problem["type"] == f"urn:ctxkeep:problem:{slug}" and problem["status"] == status
    return problem


# -- request heads (slowloris) --------------------------------------------------------------------


@pytest.mark.parametrize("serve", [("--header-timeout", "1")], indirect=True)
def test_connections_that_never_finish_their_headers_are_closed(serve: tuple[str, int]) -> None:
    base, port = serve
    silent = [_connect(port) for _ in range(20)]  # connect, send nothing
    stalled = [_connect(port) for _ in range(40)]  # half a head, then nothing
    trickling = [_connect(port) for _ in range(40)]  # half a head, then a line now and then
    for conn in stalled + trickling:
        conn.sendall(PARTIAL_HEAD)
    assert httpx.get(f"{base}/healthz").status_code == 200  # others are served meanwhile

    still_open = set(trickling)
    deadline = time.monotonic() + 15
    while still_open and time.monotonic() < deadline:
        for conn in still_open:
            with contextlib.suppress(OSError):  # closed by the server: seen below
                conn.sendall(b"X-Slow: 1\r\n")
        readable, _, _ = select.select(list(still_open), [], [], 0.25)
        for conn in readable:
            try:
                if not conn.recv(65536):
                    still_open.discard(conn)
            except ConnectionResetError:
                still_open.discard(conn)
    assert not still_open, f"{len(still_open)} of {len(trickling)} trickling connections open"
    for conn in silent + stalled:
        problem = _problem(_read_until_closed(conn), 408, "request-timeout")
        assert "headers did not arrive within 1 s" in problem["detail"]
    for conn in silent + stalled + trickling:
        conn.close()


@pytest.mark.parametrize("serve", [("--header-timeout", "1")], indirect=True)
def test_a_head_begun_after_a_response_has_the_same_deadline(serve: tuple[str, int]) -> None:
    _, port = serve
    with _connect(port) as conn:
        conn.sendall(PARTIAL_HEAD + b"\r\n")
        assert _response(conn).startswith(b"HTTP/1.1 200")
        conn.sendall(PARTIAL_HEAD)  # the keep-alive timer (75 s) stops here; the deadline runs
        _problem(_read_until_closed(conn), 408, "request-timeout")


# -- request bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize("serve", [("--body-timeout", "1")], indirect=True)
def test_a_body_that_stops_arriving_is_answered_408_and_closed(serve: tuple[str, int]) -> None:
    base, port = serve
    head = (
        b"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    with _connect(port) as conn:
        conn.sendall(head + b'{"agent_id": ')
        problem = _problem(_read_until_closed(conn), 408, "request-timeout")
    assert "body did not arrive within 1 s" in problem["detail"]
    assert httpx.get(f"{base}/healthz").status_code == 200


# -- connections ----------------------------------------------------------------------------------


@pytest.mark.parametrize("serve", [("--max-connections", "3")], indirect=True)
def test_a_request_on_a_connection_over_the_limit_answers_503(serve: tuple[str, int]) -> None:
    base, port = serve
    held = [_connect(port) for _ in range(2)]
    for conn in held:  # a served request each, so each is surely accepted and counted
        conn.sendall(PARTIAL_HEAD + b"\r\n")
        assert _response(conn).startswith(b"HTTP/1.1 200")
    assert httpx.get(f"{base}/healthz").status_code == 503  # the third connection open
    for conn in held:
        conn.close()
    deadline = time.monotonic() + 10
    while httpx.get(f"{base}/healthz").status_code != 200:  # the server sees them go
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- messages per request -------------------------------------------------------------------------


def _user(i: int) -> dict[str, Any]:
    return {"role": "user", "content": f"note {i}"}


def test_an_append_over_the_message_limit_is_refused_and_stores_nothing() -> None:
    app = create_app("memory://", max_append_messages=3, embedder="hash")
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {app.state.ctxkeep.keys.create('acme')[1]}"}
        r = client.post("/v1/sessions", json={"agent_id": "a"}, headers=headers)
        messages = f"/v1/sessions/{r.json()['session']['session_id']}/messages"

        refused = client.post(
            messages, json={"messages": [_user(i) for i in range(4)]}, headers=headers
        )
        assert refused.status_code == 422
        problem = refused.json()
        assert problem["type"] == "urn:ctxkeep:problem:invalid-request"
        assert "4 messages in one request; this server takes at most 3" in problem["detail"]
        assert problem["errors"][0]["type"] == "too_many_messages"
        assert client.get(messages, headers=headers).json()["messages"] == []

        ok = client.post(messages, json={"messages": [_user(i) for i in range(3)]}, headers=headers)
        assert ok.status_code == 201, ok.text
        newest = ok.json()["messages"][-1]["id"]
        replace = {"newest_id": newest, "messages": [_user(i) for i in range(4)]}
        r = client.put(f"{messages}/newest", json=replace, headers=headers)
        assert r.status_code == 422 and "at most 3" in r.json()["detail"]
        stored = client.get(messages, headers=headers).json()["messages"]
        assert [m["content"] for m in stored] == ["note 0", "note 1", "note 2"]


def test_each_app_in_a_process_keeps_its_own_message_limit() -> None:
    small = create_app("memory://", max_append_messages=2, embedder="hash")
    large = create_app("memory://", max_append_messages=5, embedder="hash")
    statuses = []
    for app in (small, large, small):
        with TestClient(app) as client:
            headers = {"Authorization": f"Bearer {app.state.ctxkeep.keys.create('acme')[1]}"}
            r = client.post("/v1/sessions", json={"agent_id": "a"}, headers=headers)
            sid = r.json()["session"]["session_id"]
            body = {"messages": [_user(i) for i in range(4)]}
            statuses.append(
                client.post(f"/v1/sessions/{sid}/messages", json=body, headers=headers).status_code
            )
    assert statuses == [422, 201, 422]


@pytest.mark.parametrize(
    ("setting", "value"),
    [("max_append_messages", 0), ("max_append_messages", 2.5), ("body_timeout", 0),
     ("body_timeout", math.nan), ("body_timeout", math.inf), ("body_timeout", True)],
)  # fmt: skip
def test_a_limit_that_makes_no_sense_is_refused(setting: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=setting):
        create_app("memory://", **{setting: value})


# -- the command line -----------------------------------------------------------------------------


def test_serve_help_shows_each_limit_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for option, default in [
        ("--header-timeout", DEFAULT_HEADER_TIMEOUT),
        ("--body-timeout", DEFAULT_BODY_TIMEOUT),
        ("--max-connections", DEFAULT_MAX_CONNECTIONS),
        ("--max-append-messages", DEFAULT_MAX_APPEND_MESSAGES),
    ]:
        described = text.split(f"{option} {option[2:].upper().replace('-', '_')} ", 1)[1]
        assert f"(default {default})" in described.split(" --", 1)[0], option


@pytest.mark.parametrize(
    "option", ["--header-timeout", "--body-timeout", "--max-connections", "--max-append-messages"]
)
def test_a_limit_of_zero_is_a_usage_error(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", option, "0"])
    assert info.value.code == 2
    assert f"argument {option}: must be a positive integer" in capsys.readouterr().err

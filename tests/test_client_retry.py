"""RemoteMemory through a server that drops connections (issue 25, item 3).

A raw-socket proxy stands between the client and a real ``ctxkeep serve`` application: it
forwards each request and, when told to, closes the client's connection without answering,
either before forwarding (the request never reached the service) or after (the service did
the work and the answer was lost). The client must try again where that is safe (GET, DELETE,
PUT, and appends, which the service stores once per message id) and nowhere else.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest

from _proxy import Proxy
from _server import ThreadedServer
from ctxkeep.client import RemoteMemory, RetryPolicy, _Call
from ctxkeep.errors import ConfigError, RemoteError
from ctxkeep.server import create_app

FAST = RetryPolicy(retries=3, backoff=0.01)


class DroppingProxy(Proxy):
    """Forwards HTTP/1.1 requests to ``upstream``; ``drop_before`` / ``drop_after`` requests
    are answered by closing the connection, before or after forwarding them.
    """

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.drop_before = 0
        self.drop_after = 0
        self.forwarded: list[str] = []  # "METHOD path" of each request the service got
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with conn, reader:
            while request := _read_request(reader):
                method, path, headers, body = request
                if self.drop_before:
                    self.drop_before -= 1
                    return
                status, reason, answer_headers, answer = self._forward(method, path, headers, body)
                self.forwarded.append(f"{method} {path}")
                if self.drop_after:
                    self.drop_after -= 1
                    return
                head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(
                    f"{k}: {v}\r\n" for k, v in answer_headers
                )
                conn.sendall(head.encode() + f"content-length: {len(answer)}\r\n\r\n".encode())
                conn.sendall(answer)

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            upstream.request(method, path, body=body, headers=headers)
            r = upstream.getresponse()
            kept = [(k, v) for k, v in r.getheaders() if k.lower() == "content-type"]
            return r.status, r.reason, kept, r.read()
        finally:
            upstream.close()


def _read_request(reader: BinaryIO) -> tuple[str, str, dict[str, str], bytes] | None:
    """One request from a client connection, or None when the client closed it."""
    line = reader.readline()
    if not line:
        return None
    method, path, _ = line.decode().split(" ", 2)
    headers: dict[str, str] = {}
    while (h := reader.readline().decode()) not in ("\r\n", ""):
        name, _, value = h.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    headers.pop("connection", None)
    return method, path, headers, body


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[DroppingProxy, str]]:
    app = create_app(f"sqlite:///{tmp_path / 'retry.db'}")
    _, key = app.state.ctxkeep.keys.create("retry")
    server = ThreadedServer(app).start()
    p = DroppingProxy(server.url)
    yield p, key
    p.close()
    server.stop()


def test_an_append_whose_answer_was_lost_is_sent_again_and_stored_once(
    proxy: tuple[DroppingProxy, str],
) -> None:
    p, key = proxy
    with RemoteMemory(p.url, key, retry=FAST) as mem:
        sid = mem.create_session("agent")
        p.drop_after = 1
        stored = mem.add_message(sid, "user", "once")
        assert p.forwarded.count(f"POST /v1/sessions/{sid}/messages") == 2
        assert [m.id for m in mem.get_messages(sid)] == [stored.id]


def test_a_get_after_a_dropped_connection_is_sent_again(proxy: tuple[DroppingProxy, str]) -> None:
    p, key = proxy
    with RemoteMemory(p.url, key, retry=FAST) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hi")
        p.drop_before = 1
        assert [m.text for m in mem.get_messages(sid)] == ["hi"]
        p.drop_after = 1
        assert [m.text for m in mem.get_messages(sid)] == ["hi"]


def test_a_create_whose_answer_was_lost_is_not_sent_again(
    proxy: tuple[DroppingProxy, str],
) -> None:
    p, key = proxy
    with RemoteMemory(p.url, key, retry=FAST) as mem:
        p.drop_after = 1
        with pytest.raises(RemoteError):
            mem.create_session("agent", session_id="s-1")
        assert p.forwarded == ["POST /v1/sessions"]
        assert mem.has_session("s-1")  # created once; the caller decides what to do


def test_retries_are_bounded(proxy: tuple[DroppingProxy, str]) -> None:
    p, key = proxy
    with RemoteMemory(p.url, key, retry=RetryPolicy(retries=2, backoff=0.01)) as mem:
        p.drop_before = 3
        with pytest.raises(RemoteError):
            mem.session_count()
        assert p.drop_before == 0 and p.forwarded == []
        assert mem.session_count() == 0  # the next request goes through


def test_a_request_never_sent_is_always_tried_again() -> None:
    never_sent = httpx.ConnectError("refused")
    lost = httpx.ReadError("reset")
    create = _Call("POST", "/v1/sessions", dict)
    policy = RetryPolicy(retries=2, backoff=0.5, max_backoff=0.8)
    assert [policy.delay(create, never_sent, a) for a in range(3)] == [0.5, 0.8, None]
    assert policy.delay(create, lost, 0) is None
    assert policy.delay(_Call("DELETE", "/v1/sessions/x", dict), lost, 0) == 0.5


def test_a_negative_backoff_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(backoff=-1)


def test_a_server_that_does_not_answer_is_named_by_its_url() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with (
        RemoteMemory(url, api_key="k", retry=RetryPolicy(retries=0)) as mem,
        pytest.raises(RemoteError, match=f"at {url}/v1/sessions: GET failed"),
    ):
        mem.list_sessions()

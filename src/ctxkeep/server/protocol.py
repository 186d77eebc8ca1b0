"""Below the app, in the HTTP protocol: :class:`HeaderTimeout`, uvicorn's h11 protocol with a
deadline on request heads (slowloris), and the ``malformed-request`` problem for a request h11
cannot parse. ``ctxkeep serve`` makes every connection with it (:mod:`ctxkeep.cli.serve`,
:mod:`ctxkeep.server.workers`); :mod:`ctxkeep.server.app` re-exports it.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any, ClassVar

from ctxkeep.errors import MissingDependencyError

try:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(exc.name or "uvicorn", "server") from exc

from ctxkeep.server import problems

DEFAULT_HEADER_TIMEOUT = 10
"""Seconds a client has to send a request's head (request line and headers). uvicorn sets no
such limit: connections that never finished their headers were never closed (1,000 of 1,000
still open after 40 s, issue 25), each holding a socket and a place under the connection
limit. HTTP clients send a head in one write; 10 s leaves room for a slow link."""


class HeaderTimeout(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request heads (slowloris).

    uvicorn 0.x has no header timeout, with h11 or httptools: ``timeout_keep_alive`` starts
    only once a response is done, so a new connection, or one that has begun a head and stops,
    is kept forever. Here, while the server waits for a head, one of two timers runs: uvicorn's
    keep-alive timer on a connection idle between requests (nothing of the next request has
    arrived), and this one otherwise, from a connection's opening or from the first byte of a
    head after a response. It stops when the head is complete (the body has its own deadline,
    :class:`~ctxkeep.server.app.RequestLimits`). When it fires, the client gets a 408 problem
    and the connection is closed. It is a deadline, not an idle timeout: a client that sends a
    header line every few seconds is closed all the same.

    A request h11 cannot parse (a byte that is not ASCII in its target, a NUL in a header, a
    head that is not HTTP) is answered, as every other refusal of the service, with a
    problem (400 ``malformed-request``) instead of uvicorn's plain text, and the connection
    closed.

    It reads three attributes of uvicorn's protocol, ``conn`` (the h11 connection),
    ``transport`` and ``timeout_keep_alive_task``, and hooks five methods, all unchanged since
    uvicorn 0.30.
    ``ctxkeep serve`` makes every connection with it (h11 even where httptools is installed):
    ``uvicorn.run(app, http=HeaderTimeout.after(seconds))``.
    """

    header_timeout: ClassVar[float] = DEFAULT_HEADER_TIMEOUT
    """Seconds a request's head may take."""
    _head_timer: asyncio.TimerHandle | None = None

    @classmethod
    def after(cls, seconds: float) -> type[HeaderTimeout]:
        """This protocol with a deadline of ``seconds`` (uvicorn takes a class, not an
        instance).
        """
        return type(cls.__name__, (cls,), {"header_timeout": seconds})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Accept the connection; its first head is due within the deadline."""
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        """Parse what arrived; time the head it begins, or stop timing the head it ends."""
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        """After a response: uvicorn's keep-alive timer, or this one for a pipelined head."""
        super().on_response_complete()
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: no timer outlives it."""
        self._stop_head_timer()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        awaiting = (
            self.conn.their_state is h11.IDLE
            and self.timeout_keep_alive_task is None
            and not self.transport.is_closing()
        )
        if not awaiting:
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def send_400_response(self, msg: str) -> None:
        """Answer a request h11 could not parse with the ``malformed-request`` problem (the
        connection is closed after it).
        """
        detail = (
            "the request is not valid HTTP/1.1 (its request line or a header holds a byte "
            "HTTP does not allow, such as a NUL or, in the target, one that is not ASCII: "
            "percent-encode it)"
        )
        body = json.dumps(problems.http_problem(problems.MALFORMED_REQUEST, detail)).encode()
        headers = [
            (b"content-type", problems.PROBLEM_CONTENT_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        detail = (
            f"the request's headers did not arrive within {self.header_timeout:g} s; send "
            "them without pauses"
        )
        # No request was parsed, so h11 cannot frame a response: the bytes are written as is.
        self.transport.write(_raw_problem(problems.http_problem(problems.REQUEST_TIMEOUT, detail)))
        self.transport.close()


def _raw_problem(problem: dict[str, Any]) -> bytes:
    """A problem as the bytes of an HTTP/1.1 response that closes the connection."""
    body = json.dumps(problem).encode()
    status = int(problem["status"])
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"content-type: {problems.PROBLEM_CONTENT_TYPE}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body

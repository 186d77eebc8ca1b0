"""A threaded TCP proxy on 127.0.0.1 for tests that lose connections on purpose (not collected:
no ``test_`` prefix).

:class:`Proxy` listens on a port of its own and hands each connection it accepts to
:meth:`Proxy.serve` on a thread of its own; a subclass says what serving is.
:class:`ForwardingProxy` serves by copying bytes both ways to an upstream server, a thread a
direction, and asks :meth:`ForwardingProxy.passes` of each chunk: one it refuses closes both
ends in its place. ``tests/test_redis_lost_answer.py`` loses a Redis answer so (raw TCP);
``tests/test_client_retry.py`` serves HTTP requests one by one on the bare :class:`Proxy`.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """Accepts connections on 127.0.0.1 (:attr:`port`), each served by :meth:`serve` on a
    thread of its own, until :meth:`close`.
    """

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop accepting (connections open now run on until either end closes them)."""
        self._listener.close()

    def serve(self, conn: socket.socket) -> None:
        """Serve one accepted connection (a subclass's; this one closes it)."""
        conn.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()


class ForwardingProxy(Proxy):
    """Forwards TCP both ways to ``upstream``; a chunk :meth:`passes` refuses closes the
    connection (both ends) instead of reaching the other side.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        super().__init__()

    def passes(self, data: bytes, *, answer: bool) -> bool:
        """Whether ``data`` goes on: from the client (``answer`` False) or from the server
        (True). This one passes everything.
        """
        return True

    def serve(self, conn: socket.socket) -> None:
        server = socket.create_connection(self.upstream)
        threading.Thread(target=self._pipe, args=(server, conn, True), daemon=True).start()
        self._pipe(conn, server, False)

    def _pipe(self, src: socket.socket, dst: socket.socket, answer: bool) -> None:
        try:
            while (data := src.recv(65536)) and self.passes(data, answer=answer):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

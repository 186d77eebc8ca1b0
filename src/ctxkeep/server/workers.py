"""How ``ctxkeep serve`` makes the application, in its own process or in N worker processes.

:class:`ServeSettings` is what ``serve``'s options say about the app; :func:`build_app` makes
the app from them. With ``--workers 1`` serve calls it and hands uvicorn the app. With
``--workers N`` uvicorn starts N processes with ``multiprocessing``'s spawn, and nothing of
the parent's objects crosses: each worker imports :func:`worker_app` by name and calls it
(an app factory), and it reads the settings back from the environment the parent left them
in (:data:`SETTINGS_ENV`, JSON). The header timeout crosses the same way, in the protocol
class :class:`WorkerHeaderTimeout`, which uvicorn too imports by name (a class made at run
time, as :meth:`~ctxkeep.server.protocol.HeaderTimeout.after` makes, cannot be sent to a spawned
process).

N workers are N copies of the app over one store: every request must get the same answer
from any of them, so the store must be shared and the fabric's task states and bus kept in
it (Redis, PostgreSQL). :func:`check_workers` refuses more than one on SQLite and
``memory://``, where the fabric lives inside a process.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from ctxkeep.errors import ConfigError
from ctxkeep.server import app as server
from ctxkeep.server.models import DEFAULT_MAX_APPEND_MESSAGES
from ctxkeep.server.protocol import DEFAULT_HEADER_TIMEOUT, HeaderTimeout

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.trace import TracerProvider

SETTINGS_ENV = "CTXKEEP_SERVE_SETTINGS"
"""The environment variable the parent leaves a worker's :class:`ServeSettings` in."""

SHARED_SCHEMES = frozenset({"redis", "rediss", "unix", "postgresql", "postgres"})
"""Stores N workers can share: the data and the fabric live in the store, not a process."""


@dataclass(frozen=True, kw_only=True)
class ServeSettings:
    """What ``ctxkeep serve``'s options say about the application."""

    db: str
    """The storage URL."""
    max_body_bytes: int = server.DEFAULT_MAX_BODY_BYTES
    """The largest request body accepted."""
    body_timeout: float = server.DEFAULT_BODY_TIMEOUT
    """Seconds a body may take after its head."""
    max_append_messages: int = DEFAULT_MAX_APPEND_MESSAGES
    """The most messages one request may write."""
    embedder: str = "local"
    """The episodic embedder's name."""
    require_persistent_keys: bool = True
    """Refuse a store that could lose the API keys."""
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    """Seconds a request's head may take."""
    otel: bool = False
    """Trace requests and store calls (:func:`~ctxkeep.server.tracing.provider_from_env`)."""
    threads: int | None = None
    """The most threads running sync routes at once in a process (None: anyio's 40)."""

    def to_env(self) -> str:
        """The settings as :data:`SETTINGS_ENV` holds them."""
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> ServeSettings:
        """The settings the parent left in :data:`SETTINGS_ENV`.

        Raises:
            ConfigError: the variable is not set (the factory was called outside serve).

        """
        raw = os.environ.get(SETTINGS_ENV)
        if not raw:
            raise ConfigError(
                f"{SETTINGS_ENV} is not set: the worker factory runs under `ctxkeep serve "
                "--workers N`, which sets it"
            )
        return cls(**json.loads(raw))


def check_workers(url: str, workers: int) -> None:
    """Refuse more than one worker on a store a single process must own.

    Raises:
        ConfigError: ``workers > 1`` on SQLite or ``memory://``; one line saying why and
            what to use instead.

    """
    if workers <= 1:
        return
    scheme = "memory" if url == "memory://" else urlparse(url).scheme
    if scheme in SHARED_SCHEMES:
        return
    raise ConfigError(
        f"--workers {workers} on {scheme}: a single process is the rule there (the context "
        "fabric's task states and bus live inside the process, and SQLite takes one writer "
        "at a time); serve from PostgreSQL or Redis to run several workers, or drop --workers"
    )


def build_app(settings: ServeSettings, tracer_provider: TracerProvider | None = None) -> FastAPI:
    """The application ``settings`` describe (traced by ``tracer_provider``, if given)."""
    return server.create_app(
        settings.db,
        max_body_bytes=settings.max_body_bytes,
        body_timeout=settings.body_timeout,
        max_append_messages=settings.max_append_messages,
        embedder=settings.embedder,
        require_persistent_keys=settings.require_persistent_keys,
        tracer_provider=tracer_provider,
        threads=settings.threads,
    )


def log_access_to_stderr() -> None:
    """Send the access log to stderr, one JSON line per request (and nowhere else)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger(server.ACCESS_LOGGER)
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False


def worker_app() -> FastAPI:
    """The app of one worker of ``ctxkeep serve --workers N`` (uvicorn's app factory)."""
    settings = ServeSettings.from_env()
    log_access_to_stderr()
    provider = None
    if settings.otel:
        from ctxkeep.server.tracing import provider_from_env

        provider = provider_from_env()
    return build_app(settings, provider)


def _header_timeout_from_env() -> float:
    raw = os.environ.get(SETTINGS_ENV)
    return json.loads(raw)["header_timeout"] if raw else DEFAULT_HEADER_TIMEOUT


class WorkerHeaderTimeout(HeaderTimeout):
    """:class:`~ctxkeep.server.protocol.HeaderTimeout` with the deadline of the settings in
    :data:`SETTINGS_ENV` (read when a worker imports it).
    """

    header_timeout = _header_timeout_from_env()


REUSE_PORT = hasattr(socket, "SO_REUSEPORT")
"""Whether each worker can listen on a socket of its own (Linux, the BSDs, macOS)."""


def bind_own_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT``, for one worker alone.

    uvicorn's workers share the parent's one listening socket, and whichever is woken first
    takes the next connection; clients that keep their connections (every HTTP client pool
    does) stay where they landed. Measured with 50 keep-alive clients on 2 workers, one
    worker held 39 connections and the other 11, so one core worked while the other waited.
    With a socket each, the kernel spreads connections over the workers by a hash of their
    addresses. (It also lets another process of the same user listen on the port: ``serve``
    checks the port first without ``SO_REUSEPORT``, so a second ``serve`` is refused.)
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class OwnSocket:
    """Stands for a listening socket in uvicorn's list of worker sockets: a worker process
    unpickles it as a socket of its own (:func:`bind_own_socket`), so each worker listens on
    its own socket instead of the one the parent would share.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def __reduce__(self) -> tuple[object, tuple[str, int]]:
        return bind_own_socket, (self.host, self.port)


WORKER_APP = f"{__name__}:worker_app"
"""The import string of :func:`worker_app`."""

WORKER_PROTOCOL = f"{__name__}:WorkerHeaderTimeout"
"""The import string of :class:`WorkerHeaderTimeout`."""

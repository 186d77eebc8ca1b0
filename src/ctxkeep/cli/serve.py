"""``ctxkeep serve``: run the HTTP service with uvicorn, in one process or N workers.

Before uvicorn starts, the command checks that the port is free (a busy port is one line
naming ``--port``, not uvicorn's ``[Errno 98]`` and exit 3), and prints where the server
stores and how many tenants and keys it found there; on ``memory://`` (which no other
command can reach) it makes a key and prints it, so a throwaway server can be logged into.
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import signal
import socket
import sys
import tempfile
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ctxkeep.cli._args import finite_float, positive_int
from ctxkeep.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from ctxkeep.server.keys import KeyRegistry
    from ctxkeep.server.workers import ServeSettings

HELP = """Serve session memory, prompt building, artifacts, episodic memory, checkpoints and
the context fabric over HTTP (JSON under /v1, OpenAPI at /openapi.json). No key is needed for
/healthz (liveness: the process answers), /readyz (readiness: the store answers; 503 while it
does not) and /metrics (Prometheus text format, with the extra ctxkeep[metrics]; else 501).

Requests authenticate with `Authorization: Bearer <key>`; create keys with
`ctxkeep keys create --tenant NAME --db <the same URL>`. Each tenant's records live in stores
of their own, derived from --db. Access logs go to stderr, one JSON line per request.
Episodes are kept in SQLite or PostgreSQL: on a redis:// server their routes answer 501.

--db takes a URL (sqlite:///path.db, redis://host:port/db, postgresql://..., or memory:// for a
throwaway server); the default is the embedded SQLite file ($CTXKEEP_DB or the user data
directory). Listen on 127.0.0.1 unless you put TLS and a firewall in front. At startup serve
prints where it stores and how many tenants and keys it found. A memory:// server keeps its
keys inside its own process, where `ctxkeep keys create` cannot reach them: it makes a key
for tenant --tenant (default "demo") and prints it, valid until the server stops.

The CLI reads and writes a tenant's store with --tenant and the server's --db:
`ctxkeep sessions list --tenant acme --db <the same URL>` lists what the API stored for acme.

On redis:// the API keys live in the same Redis as the data (hash <prefix>server:keys): a
Redis with neither AOF nor RDB persistence loses them all on a restart, and every request then
answers 401. serve refuses such a Redis (or one whose persistence it cannot check, or that
evicts any key under memory pressure) unless given --allow-volatile-redis.

Slow and greedy clients are bounded: a request's headers must arrive within --header-timeout
seconds and its body within --body-timeout more (else 408 and the connection is closed), at
most --max-connections connections are open at once (a request beyond: 503), and a body holds
at most --max-body-bytes and --max-append-messages messages (else 413 or 422, nothing stored).

--workers N runs N uvicorn worker processes on one port, over one store: on redis:// and
postgresql:// only (SQLite and memory:// keep the fabric inside one process, and serve refuses
more than one worker there). /metrics then adds up every worker's counts (prometheus-client's
multiprocess mode, in $PROMETHEUS_MULTIPROC_DIR, or a temporary directory serve makes and
removes). On SIGTERM (or Ctrl-C) the server stops accepting connections and lets requests in
flight finish, for at most --graceful-timeout seconds, then exits 0.

Each worker runs the routes that use the store in at most --threads threads at once (default:
on postgresql://, as many as its pool has connections, --pg-pool-size; elsewhere 40): a
request beyond waits for a thread, as it would wait for a connection, without spending CPU.

--otel traces every request and its store calls with OpenTelemetry (the extra ctxkeep[otel]),
configured by the standard variables: OTEL_TRACES_EXPORTER (otlp, the default, needs
opentelemetry-exporter-otlp; console; none), OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME
(default ctxkeep)...; a provider set up already (opentelemetry-instrument) is used as it is.

examples:
  ctxkeep serve
  ctxkeep serve --db sqlite:///srv/ctxkeep.db --port 8765
  ctxkeep serve --db redis://127.0.0.1:6379/0 --host 0.0.0.0 --port 9000
  ctxkeep serve --db memory:// --embedder hash     # prints a key for tenant demo
  ctxkeep serve --header-timeout 5 --max-connections 200 --max-append-messages 500
  ctxkeep serve --db postgresql://ctxkeep@db/ctxkeep --workers 4 --graceful-timeout 20
  OTEL_TRACES_EXPORTER=console ctxkeep serve --otel
"""

DEFAULT_PORT = 8765
DEFAULT_KEEP_ALIVE = 75
"""Seconds uvicorn keeps an idle connection (its own default is 5 s, the same as httpx's pool
expiry: a client that waits about 5 s between calls, an LLM call between two appends, then
sends a request on a connection the server is closing and gets a read error). Longer than any
client's, the client closes first (75 s: nginx's default)."""

DEFAULT_GRACEFUL_TIMEOUT = 30.0
"""Seconds a stopping server waits for requests in flight (gunicorn's default), then cancels
them: long enough for any request the limits allow but a body trickled to its end."""

DEFAULT_MAX_CONNECTIONS = 1000
"""uvicorn's ``limit_concurrency`` (it sets none of its own): a request arriving on a connection
that makes this many open (itself included), or while this many requests are in flight, is
answered 503 (uvicorn's, in plain text). Below the 1,024 open files a process gets by default,
so the server refuses with 503 before the operating system refuses it sockets. Connections
that send no request are closed by the header timeout."""


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0 (argparse ``type``)."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def register(sub: Any) -> None:
    """Add the ``serve`` command."""
    p = sub.add_parser(
        "serve",
        help="run the HTTP service",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", help="storage URL (default: the embedded SQLite file)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port", type=positive_int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    p.add_argument(
        "--max-body-bytes",
        type=positive_int,
        default=None,
        help="largest request body accepted (default 4 MiB)",
    )
    p.add_argument(
        "--max-append-messages",
        type=positive_int,
        default=None,
        help="most messages one request may write (default 1000); more answer 422 and "
        "nothing is stored",
    )
    p.add_argument(
        "--header-timeout",
        type=positive_int,
        default=None,
        help="seconds a request's headers may take to arrive, from the connection's opening "
        "or their first byte (default 10); then 408 and the connection is closed (slowloris)",
    )
    p.add_argument(
        "--body-timeout",
        type=positive_int,
        default=None,
        help="seconds a request's body may take to arrive after its headers (default 60); "
        "then 408 and the connection is closed",
    )
    p.add_argument(
        "--max-connections",
        type=positive_int,
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"most connections open, the new one included, and requests in flight (default "
        f"{DEFAULT_MAX_CONNECTIONS}); a request beyond either answers 503",
    )
    p.add_argument(
        "--keep-alive",
        type=positive_int,
        default=DEFAULT_KEEP_ALIVE,
        help=f"seconds an idle connection is kept open (default {DEFAULT_KEEP_ALIVE}: longer "
        "than HTTP clients keep idle connections, so the client always closes first)",
    )
    p.add_argument(
        "--allow-volatile-redis",
        action="store_true",
        help="serve from a Redis that would lose the API keys and the data on a restart "
        "(no AOF, no RDB snapshots, an allkeys-* eviction policy, or settings it cannot read); "
        "without it serve refuses to start there",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        metavar="N",
        help="worker processes (default 1); more than one on redis:// or postgresql:// only",
    )
    p.add_argument(
        "--pg-pool-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="most connections each worker opens to a PostgreSQL --db, whatever the number of "
        "tenants (default: $CTXKEEP_PG_POOL_MAX, else 8); in all: workers x N",
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        metavar="N",
        help="most requests each worker runs at once in threads (the routes that read and "
        "write the store; default: on a PostgreSQL --db, its pool size per worker, else 40); "
        "more wait for a thread",
    )
    p.add_argument(
        "--graceful-timeout",
        type=positive_seconds,
        default=DEFAULT_GRACEFUL_TIMEOUT,
        metavar="SECONDS",
        help=f"on SIGTERM, how long requests in flight may take to finish before they are "
        f"cancelled (default {DEFAULT_GRACEFUL_TIMEOUT:g})",
    )
    p.add_argument(
        "--otel",
        action="store_true",
        help="trace requests and store calls with OpenTelemetry (ctxkeep[otel]; exporter and "
        "endpoint from the OTEL_* variables)",
    )
    p.add_argument(
        "--embedder",
        default="local",
        help="episodic embedder, as ctxkeep.open_episodic names them: local (default; the "
        "library's local model, on the CPU), openai (text-embedding-3-small, OPENAI_API_KEY) "
        "or hash (tests only: it knows no meaning)",
    )
    p.add_argument(
        "--tenant",
        default=MEMORY_TENANT,
        metavar="NAME",
        help=f"with --db memory://: the tenant of the key made at startup (default "
        f"{MEMORY_TENANT!r})",
    )
    p.set_defaults(func=run)


MEMORY_TENANT = "demo"
"""The tenant of the key a ``memory://`` server makes at startup."""


def check_port(host: str, port: int) -> None:
    """Refuse a port that something already listens on, before the app is built.

    Binds and releases each address ``host`` resolves to, as uvicorn (asyncio) will bind it
    (``SO_REUSEADDR``: a port left in TIME_WAIT is free, one with a listener is not).

    Raises:
        ConfigError: the port is taken, the address is not this machine's, or binding is not
            allowed (a port below 1024 without privileges); one line naming the option.

    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on --host {host!r}: {exc.strerror}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise ConfigError(
                        f"port {port} on {host} is already in use (another server listens "
                        "there): stop it, or serve on another port with --port"
                    ) from None
                if exc.errno == errno.EACCES:
                    raise ConfigError(
                        f"not allowed to listen on port {port} of {host} (ports below 1024 "
                        "need privileges): choose another with --port"
                    ) from None
                raise ConfigError(
                    f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host and "
                    "--port"
                ) from None


DEFAULT_PG_POOL = 8
"""The connections a process opens to a PostgreSQL server when no pool size is configured (the
session store's ``max_size``, the largest any store asks for; :mod:`ctxkeep._pg`)."""


def default_threads(url: str) -> int | None:
    """The threads of a worker's sync routes when ``--threads`` is not given: on PostgreSQL, as
    many as the worker's pool has connections (``--pg-pool-size``, read back from
    ``CTXKEEP_PG_POOL_MAX``, else the config file, else :data:`DEFAULT_PG_POOL`); elsewhere
    None (anyio's 40).

    A route holds a connection for about all of its store work, so a thread beyond the pool
    only waits for one, and while it waits it still takes the GIL to parse and validate its
    request. Measured with ``bench/server_load.py`` on PostgreSQL (50 clients, a pool of 8,
    2 cores), the server's CPU a request, medians of 4 interleaved runs: one worker 4.42 ms
    with 40 threads, 3.41 ms with 8; two workers 4.56 ms and 3.53 ms.
    """
    if urlparse(url).scheme not in ("postgresql", "postgres"):
        return None
    from ctxkeep._pg import configured_pool_max

    return configured_pool_max() or DEFAULT_PG_POOL


def startup_lines(url: str, keys: KeyRegistry, tenant: str) -> list[str]:
    """What serve says before uvicorn's lines: where it stores, its tenants and keys, and on
    ``memory://`` a key it made now (for ``tenant``).
    """
    if url == "memory://":
        _, token = keys.create(tenant)
        return [
            "ctxkeep serve: storing in memory:// (nothing outlives this process)",
            f"a key for tenant {tenant!r}, valid until the server stops "
            "(`ctxkeep keys create` cannot reach a memory:// server):",
            f"  {token}",
        ]
    active = [k for k in keys.list_keys() if k.revoked_at is None]
    tenants = sorted({k.tenant for k in active})
    named = f": {', '.join(tenants[:10])}{', ...' if len(tenants) > 10 else ''}" if tenants else ""
    lines = [
        f"ctxkeep serve: storing in {url}",
        f"{len(tenants)} tenant(s) with {len(active)} active key(s){named}",
    ]
    if not active:
        lines.append(f"create a key with: ctxkeep keys create --tenant NAME --db {url}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Build the app (or have each worker build it) and serve it until stopped."""
    try:
        import uvicorn
    except ImportError as exc:
        raise MissingDependencyError("uvicorn", "server") from exc
    from ctxkeep.server import workers
    from ctxkeep.server.keys import check_tenant
    from ctxkeep.server.protocol import HeaderTimeout
    from ctxkeep.sessions import default_url

    url = args.db or default_url()
    workers.check_workers(url, args.workers)
    if url == "memory://":
        check_tenant(args.tenant)
    check_port(args.host, args.port)
    if args.pg_pool_size is not None:  # the workers inherit it (ctxkeep._pg reads it)
        os.environ["CTXKEEP_PG_POOL_MAX"] = str(args.pg_pool_size)
    threads = args.threads if args.threads is not None else default_threads(url)
    given = {
        "max_body_bytes": args.max_body_bytes,
        "body_timeout": args.body_timeout,
        "max_append_messages": args.max_append_messages,
        "header_timeout": args.header_timeout,
    }
    settings = workers.ServeSettings(
        db=url,
        embedder=args.embedder,
        require_persistent_keys=not args.allow_volatile_redis,
        otel=args.otel,
        threads=threads,
        **{name: value for name, value in given.items() if value is not None},
    )
    provider = _tracer_provider() if args.otel else None
    options: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "access_log": False,
        "log_level": "info",
        "timeout_keep_alive": args.keep_alive,
        "limit_concurrency": args.max_connections,
        "timeout_graceful_shutdown": args.graceful_timeout,
        # uvicorn kills a worker that does not answer its health ping in this time, and a
        # spawned worker answers only once it has imported itself: at the default 5 s, a
        # loaded machine (a CI run) killed every worker while it started, again and again
        "timeout_worker_healthcheck": 60,
    }
    workers.log_access_to_stderr()
    if args.workers == 1:
        app = workers.build_app(settings, provider)
        for line in startup_lines(url, app.state.ctxkeep.keys, args.tenant):
            print(line, file=sys.stderr, flush=True)
        _exit_zero_on_sigterm()
        uvicorn.run(app, http=HeaderTimeout.after(settings.header_timeout), **options)
        return 0
    if provider is not None:  # each worker makes its own; this one only checked the settings
        _shutdown(provider)
    _print_worker_startup(url, settings, args.workers)
    os.environ[workers.SETTINGS_ENV] = settings.to_env()
    made_dir = None
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        made_dir = tempfile.mkdtemp(prefix="ctxkeep-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = made_dir
    try:
        if workers.REUSE_PORT and args.port != 0:
            # uvicorn.run's workers branch, but each worker listens on a socket of its own
            from uvicorn.supervisors import Multiprocess

            config = uvicorn.Config(
                workers.WORKER_APP,
                factory=True,
                workers=args.workers,
                http=workers.WORKER_PROTOCOL,
                **options,
            )
            own = workers.OwnSocket(args.host, args.port)
            Multiprocess(config, sockets=[own]).run()  # type: ignore[list-item]
        else:
            uvicorn.run(
                workers.WORKER_APP,
                factory=True,
                workers=args.workers,
                http=workers.WORKER_PROTOCOL,
                **options,
            )
    finally:
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
    return 0


def _print_worker_startup(url: str, settings: ServeSettings, count: int) -> None:
    """Check the key store as each worker will (refused: one line), and say what serves."""
    from ctxkeep.server.app import refuse_volatile_keys
    from ctxkeep.server.keys import open_key_registry

    keys = open_key_registry(url)
    try:
        if settings.require_persistent_keys:
            refuse_volatile_keys(keys)
        lines = startup_lines(url, keys, MEMORY_TENANT)
    finally:
        keys.close()
    for line in [*lines, f"{count} worker processes"]:
        print(line, file=sys.stderr, flush=True)


def _tracer_provider() -> TracerProvider:
    """The tracer provider of ``--otel`` (its settings checked before anything starts)."""
    from ctxkeep.server.tracing import provider_from_env

    return provider_from_env()


def _shutdown(provider: TracerProvider) -> None:
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        shutdown()


def _exit_zero_on_sigterm() -> None:
    """Make SIGTERM end the process with 0 once uvicorn has let it go.

    uvicorn stops gracefully on SIGTERM, then raises the signal again under the handler it
    found (the default one kills the process: exit -15), so that whoever ran it sees the
    signal. A server asked to stop that stopped cleanly exits 0, as supervisors expect (a
    SIGTERM before uvicorn takes over ends it with 0 too).
    """

    def stopped(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stopped)

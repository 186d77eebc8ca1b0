"""The ASGI application: :func:`create_app`, its middleware, auth and error handling.

Requests pass, outermost first, through:

1. :class:`AccessLog`: one JSON line per request on the ``ctxkeep.server.access`` logger
   (method, path template, status, duration in ms, tenant, process id; never a header, so
   never a key); the request counted for ``/metrics`` (:mod:`ctxkeep.server.metrics`) and,
   when traces are on, its span (:mod:`ctxkeep.server.tracing`);
2. :class:`RequestLimits`: a body over ``max_body_bytes`` is refused with 413 before anything
   parses it, one that takes longer than ``body_timeout`` to arrive with 408, and a request
   that writes more than ``max_append_messages`` messages with 422 (a request's work is
   bounded by its messages, not its bytes alone);
3. FastAPI's routing; the ``/v1`` routes (sessions, messages and prompts in
   :mod:`ctxkeep.server.routes`; artifacts, episodes and checkpoints in
   :mod:`~ctxkeep.server.routes_memory`; task state and the bus in
   :mod:`~ctxkeep.server.routes_fabric`) authenticate with ``Authorization: Bearer <key>``
   and run against the key's tenant's stores only.

Below the app, in the HTTP protocol, :class:`~ctxkeep.server.protocol.HeaderTimeout` closes a
connection whose request head has not arrived within ``header_timeout`` (slowloris);
``ctxkeep serve`` runs uvicorn with it and with a limit on connections
(:mod:`ctxkeep.cli.serve`).

The app imports the routes; the routes never import the app. What both need (the
:class:`~ctxkeep.server.deps.ServerState` on ``app.state.ctxkeep``, the request's record for
the access log, the tenant of an API key) is in :mod:`ctxkeep.server.deps`
(``tests/test_import_layers.py`` keeps the server's modules free of import circles).

Beside the ``/v1`` routes, three need no key: ``/healthz`` (liveness: the process answers,
no storage access), ``/readyz`` (readiness: the store answers a key lookup; 503 while it does
not) and ``/metrics`` (Prometheus' text format; 501 ``missing-dependency`` without the
``metrics`` extra).

Every error is answered as ``application/problem+json`` (:mod:`ctxkeep.server.problems`):
ctxkeep's exceptions with their own type, request validation as ``invalid-request`` (422),
unknown routes 404, a missing or wrong key 401, anything unexpected 500 (logged on
``ctxkeep.server``, with no detail in the response).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ctxkeep.errors import MissingDependencyError

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from ctxkeep.episodic import Embedder
    from ctxkeep.server.metrics import Metrics

try:
    import anyio.to_thread
    from fastapi import APIRouter, FastAPI, Request, Response
    from fastapi.exceptions import RequestValidationError
    from fastapi.openapi.utils import get_openapi
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.routing import Match
    from starlette.types import ASGIApp, Message, Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError(exc.name or "fastapi", "server") from exc

from ctxkeep._version import __version__
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    CtxkeepError,
    SchemaVersionError,
    StorageError,
)
from ctxkeep.server import problems, routes_fabric, routes_memory
from ctxkeep.server.deps import ServerState, Unauthorized, request_info
from ctxkeep.server.inspector import router as inspector_router
from ctxkeep.server.keys import KEY_CACHE_SECONDS, KEY_PREFIX, KeyRegistry, open_key_registry
from ctxkeep.server.models import APPEND_LIMIT, DEFAULT_MAX_APPEND_MESSAGES, Health, Problem
from ctxkeep.server.protocol import DEFAULT_HEADER_TIMEOUT as DEFAULT_HEADER_TIMEOUT
from ctxkeep.server.protocol import HeaderTimeout as HeaderTimeout
from ctxkeep.server.routes import router
from ctxkeep.server.tenants import DEFAULT_MAX_OPEN, TenantStores
from ctxkeep.server.wire import evicted_to_wire
from ctxkeep.sessions import default_url
from ctxkeep.sessions.base import MemoryConfig
from ctxkeep.tokens import get_counter

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""4 MiB: room for a batch of long tool outputs; a bigger body is refused with 413."""

DEFAULT_BODY_TIMEOUT = 60
"""Seconds a request's body has to arrive after its head: the default body limit, 4 MiB, at
70 KB/s; a client that trickles its body (a slow POST) is cut off after that."""

ACCESS_LOGGER = "ctxkeep.server.access"
log = logging.getLogger("ctxkeep.server")
access_log = logging.getLogger(ACCESS_LOGGER)


def problem_response(
    problem: dict[str, Any], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A problem as an ``application/problem+json`` response (a lone surrogate quoted from
    the request escaped: :func:`~ctxkeep.server.problems.utf8_safe`).
    """
    return JSONResponse(
        problems.utf8_safe(problem),
        status_code=int(problem["status"]),
        media_type=problems.PROBLEM_CONTENT_TYPE,
        headers=headers,
    )


# -- middleware ---------------------------------------------------------------------------------


class RequestLimits:
    """Bound a request's work before the app runs: its body's size, the time its body takes to
    arrive, and how many messages it may write.

    * A body over ``max_body_bytes`` is refused with 413 (by its ``Content-Length``, or once that
      many bytes have arrived: a chunked upload is cut off at the limit too).
    * A body that has not all arrived ``body_timeout`` seconds after the request's head is
      refused with 408 and the connection closed: a client that trickles its body (a slow POST)
      holds no connection longer than that. (A head that never ends is the protocol's to
      time out: :class:`HeaderTimeout`.)
    * A request body with more than ``max_append_messages`` messages to write is refused with
      422 by its model (:data:`ctxkeep.server.models.APPEND_LIMIT`, set here per request).

    The body is read here, whole, and replayed to the app.
    """

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, body_timeout: float, max_append_messages: int
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.max_append_messages = max_append_messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body within the limits, then run the app on it (or answer 413 or 408)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await self._refuse(scope, send, self._too_large())
            return
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await self._read(receive)
        except TimeoutError:
            problem = problems.http_problem(
                problems.REQUEST_TIMEOUT,
                f"the request body did not arrive within {self.body_timeout:g} s of its "
                "headers; send it without pauses",
                timeout=self.body_timeout,
            )
            await self._refuse(scope, send, problem)
            return
        if body is None:
            return  # the client went away
        if len(body) > self.max_body_bytes:
            await self._refuse(scope, send, self._too_large())
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        token = APPEND_LIMIT.set(self.max_append_messages)
        try:
            await self.app(scope, replay, send)
        finally:
            APPEND_LIMIT.reset(token)

    async def _read(self, receive: Receive) -> bytes | None:
        """The body, or just over ``max_body_bytes`` of it (None: the client went away)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            chunks.append(chunk)
            if size > self.max_body_bytes or not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self) -> dict[str, Any]:
        return problems.http_problem(
            problems.BODY_TOO_LARGE,
            f"the request body exceeds the server's limit of {self.max_body_bytes} bytes; send "
            "fewer or smaller messages per request",
            limit=self.max_body_bytes,
        )

    async def _refuse(self, scope: Scope, send: Send, problem: dict[str, Any]) -> None:
        response = problem_response(problem, headers={"Connection": "close"})
        await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class AccessLog:
    """One JSON line per request on the ``ctxkeep.server.access`` logger (INFO), the request
    counted in ``metrics`` and traced by ``tracer`` (either None: off).

    Fields: ``method``, ``path`` (the route's template, such as
    ``/v1/sessions/{session_id}``, so no id or other caller data is logged; ``null`` for a
    path no route matches), ``status``, ``duration_ms``, ``tenant`` (``null`` before
    authentication) and ``pid`` (the worker that answered, under ``serve --workers``).
    Headers are never logged, so neither is an API key.

    The metrics count what a successful request recorded in its
    :class:`~ctxkeep.server.deps.RequestInfo` (messages stored, a prompt's build report).
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: Callable[[], list[Any]],
        metrics: Metrics | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.app = app
        self.routes = routes
        self.metrics = metrics
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app and log the request, however it ends."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.tracer is None:
            await self._observed(scope, receive, send, None)
            return
        from ctxkeep.server import tracing

        with tracing.request_span(self.tracer, scope["method"]) as span:
            await self._observed(scope, receive, send, span)

    async def _observed(self, scope: Scope, receive: Receive, send: Send, span: Any) -> None:
        start = time.perf_counter()
        info = request_info(scope)
        method = scope["method"]
        status = 500
        route: str | None = None

        async def sending(message: Message) -> None:
            nonlocal status, route
            if message["type"] == "http.response.start":
                status = int(message["status"])
                route = self._template(scope)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - start
            if route is None:
                route = self._template(scope)
            record = {
                "event": "request",
                "method": method,
                "path": route,
                "status": status,
                "duration_ms": round(seconds * 1000, 3),
                "tenant": info.tenant,
                "pid": os.getpid(),
            }
            access_log.info(json.dumps(record))
            if self.metrics is not None:
                self.metrics.observe_request(method, route, status, seconds)
                if 200 <= status < 300:
                    self.metrics.observe_work(info.appended, info.report)
            if span is not None:
                from ctxkeep.server import tracing

                tracing.finish(span, method, route, status, info.tenant)

    def _template(self, scope: Scope) -> str | None:
        route = scope.get("route")
        path = getattr(route, "path", None)
        if isinstance(path, str):
            return path
        return _match(self.routes(), scope)  # refused before routing (413)


def _match(routes: list[Any], scope: Scope) -> str | None:
    """The template of the route that would take ``scope`` (included routers searched)."""
    for route in routes:
        # An included router keeps its routes in ``routes`` or, in FastAPI 0.165, on
        # ``original_router`` (the app includes its routers with no prefix).
        inner = getattr(route, "routes", None)
        if inner is None:
            inner = getattr(getattr(route, "original_router", None), "routes", None)
        if isinstance(inner, list) and not isinstance(getattr(route, "path", None), str):
            found = _match(inner, scope)
            if found is not None:
                return found
            continue
        path = getattr(route, "path", None)
        if isinstance(path, str) and route.matches(scope)[0] is not Match.NONE:
            return path
    return None


# -- error handlers -----------------------------------------------------------------------------


def _evicted_member(request: Request) -> dict[str, Any]:
    evicted = request_info(request.scope).evicted
    return {"evicted": [evicted_to_wire(e) for e in evicted]} if evicted else {}


STORE_ERRORS = (StorageError, CorruptRecordError, SchemaVersionError)
"""The failures of a store, counted by ``/metrics`` (by their problem's slug)."""


async def _on_ctxkeep_error(request: Request, exc: Exception) -> JSONResponse:
    problem = problems.problem_for(exc)
    metrics: Metrics | None = getattr(request.app.state, "metrics", None)
    if metrics is not None and isinstance(exc, STORE_ERRORS):
        metrics.store_error(problems.kind_of(exc).slug)
    if problem["status"] >= 500 and not isinstance(exc, problems.NotAvailableError):
        log.error("%s %s failed: %r", request.method, request.url.path, exc, exc_info=exc)
    return problem_response({**problem, **_evicted_member(request)})


async def _on_unauthorized(request: Request, exc: Exception) -> JSONResponse:
    problem = problems.http_problem(problems.UNAUTHORIZED, str(exc))
    return problem_response(problem, headers={"WWW-Authenticate": 'Bearer realm="ctxkeep"'})


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "loc": [str(part) for part in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in exc.errors()
    ]
    first = errors[0] if errors else {"loc": [], "msg": "invalid"}
    where = ".".join(first["loc"]) or "the request"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    problem = problems.http_problem(
        problems.INVALID_REQUEST, f"{where}: {first['msg']}{more}", errors=errors
    )
    return problem_response(problem)


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = problems.kind_for_status(exc.status_code)
    detail = exc.detail if isinstance(exc.detail, str) else kind.title
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no route {request.method} {request.url.path}; see /openapi.json"
    return problem_response(problems.http_problem(kind, detail), headers=exc.headers)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed: %r", request.method, request.url.path, exc, exc_info=exc)
    problem = problems.http_problem(
        problems.INTERNAL_ERROR, "the server failed; see the server's log"
    )
    return problem_response(problem)


# -- OpenAPI ------------------------------------------------------------------------------------


def _openapi(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """The OpenAPI document, with error responses as ``application/problem+json``."""

    def build() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        for path in doc.get("paths", {}).values():
            for operation in path.values():
                for status, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if status[0] in "45" and "application/json" in content:
                        content[problems.PROBLEM_CONTENT_TYPE] = content.pop("application/json")
        app.openapi_schema = doc
        return doc

    return build


# -- liveness, readiness, metrics ----------------------------------------------------------------

READY_PROBE = f"{KEY_PREFIX}000000000000_readyz"
"""The key ``/readyz`` looks up: shaped like a key, so the lookup reaches the store (one read
by primary key), and no key's (its secret part is not a key's)."""

_ops = APIRouter()


@_ops.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Problem, "description": "The store does not answer"}},
    tags=["health"],
)
def readyz(request: Request) -> Health | JSONResponse:
    """The server can serve: its store answers a lookup of an API key (no authentication).

    503 ``storage-unavailable`` while the store does not answer; ``/healthz`` answers as long
    as the process does (a load balancer takes a server out of rotation on ``/readyz``, a
    supervisor restarts it on ``/healthz``). A failed probe is one warning line in the log,
    not a traceback per probe while the store is down.
    """
    state: ServerState = request.app.state.ctxkeep
    try:
        state.keys.authenticate(READY_PROBE)
    except StorageError as exc:
        log.warning("not ready: %s", exc)
        problem = problems.problem_for(exc)
        metrics: Metrics | None = request.app.state.metrics
        if metrics is not None:
            metrics.store_error(problem["type"].removeprefix(problems.PROBLEM_TYPE_PREFIX))
        return problem_response(problem)
    return Health(status="ok")


@_ops.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """The service's metrics in Prometheus' text format (no authentication: no tenant's data
    is in them); 501 ``missing-dependency`` without prometheus-client.
    """
    observed: Metrics | None = request.app.state.metrics
    if observed is None:
        raise MissingDependencyError("prometheus-client", "metrics")
    body, content_type = observed.exposition()
    return Response(body, media_type=content_type)


# -- the key store ------------------------------------------------------------------------------


def refuse_volatile_keys(keys: KeyRegistry) -> None:
    """Raise ConfigError, saying what would be lost and how to fix it, if ``keys`` could lose
    the API keys (see :mod:`ctxkeep.server.keys`).
    """
    reason = keys.volatility()
    if reason is None:
        return
    raise ConfigError(
        f"refusing to serve: {reason}. That store holds the tenants' data too: a restart of it "
        "would lose every API key and every tenant's sessions, and every request would then "
        "answer 401 until keys were created again. Turn persistence on (AOF: appendonly yes in "
        "redis.conf, or redis-server --appendonly yes; or RDB snapshots: save 3600 1 300 100 "
        "60 10000; and a maxmemory-policy of noeviction or volatile-*), or serve from "
        "PostgreSQL or SQLite. To serve from it anyway (tests, data you can rebuild), pass "
        "--allow-volatile-redis."
    )


def _check_positive(name: str, value: object, *, whole: bool) -> None:
    """Raise ConfigError unless ``value`` is a positive int (``whole``) or finite number."""
    kinds = (int,) if whole else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ConfigError(f"{name} must be {'an int' if whole else 'a number'}, got {value!r}")
    if not 0 < value < math.inf:
        raise ConfigError(f"{name} must be positive, got {value}")


# -- the app ------------------------------------------------------------------------------------


def _warm_prompt_path() -> None:
    """Build the default encoding and one prompt through the prompt route's steps (the
    builder, the pruner's read, every output format, the report's model) on a ``memory://``
    store, so what a process does once (imports, first calls, the route's models) is done
    at startup: the first ``POST /v1/sessions/{id}/prompt`` of a new server, 10,000 messages
    on SQLite, took 29.2 ms median against 41.7 ms without it on a loaded machine, 29.1
    against 30.4 ms on a quiet one (BENCHMARKS.md, issue 24, session 9).
    """
    from ctxkeep.artifacts import MemoryArtifactStore
    from ctxkeep.builder.budgeted import budgeted_builder
    from ctxkeep.messages import Message, ToolCall
    from ctxkeep.responses import to_responses
    from ctxkeep.server.models import PromptResponse
    from ctxkeep.server.routes import report_out
    from ctxkeep.sessions import open_memory

    get_counter()
    call = ToolCall(id="warm", name="warm", arguments="{}")
    with open_memory("memory://") as memory:
        sid = memory.create_session("warm")
        memory.add_messages(
            sid,
            [
                Message("user", "warm up"),
                Message("assistant", None, tool_calls=[call]),
                Message("tool", "ok " * 400, tool_call_id="warm"),
                Message("user", "and now?"),
            ],
        )
        builder = budgeted_builder(
            memory,
            artifacts=MemoryArtifactStore(),
            max_prompt_tokens=300,
            reserve_output_tokens=50,
            preserve_last_n=1,
            encoding=None,
        )
        built = builder.build(sid, system="warm")
        built.to_anthropic()
        to_responses(built.messages)
        PromptResponse(
            format="openai", messages=built.to_openai(), system=None, report=report_out(built)
        )


def _open_metrics() -> Metrics | None:
    """The app's instruments, or None without prometheus-client (``/metrics`` then says so)."""
    from ctxkeep.server.metrics import open_metrics

    try:
        return open_metrics()
    except MissingDependencyError:
        return None


def create_app(
    db_url: str | None = None,
    *,
    config: MemoryConfig | None = None,
    clock: Callable[[], float] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    max_append_messages: int = DEFAULT_MAX_APPEND_MESSAGES,
    max_open_tenants: int = DEFAULT_MAX_OPEN,
    embedder: str | Embedder = "local",
    require_persistent_keys: bool = False,
    metrics: bool = True,
    tracer_provider: TracerProvider | None = None,
    threads: int | None = None,
    key_cache_seconds: float = KEY_CACHE_SECONDS,
) -> FastAPI:
    """The ctxkeep HTTP service over a storage URL.

    Args:
        db_url: ``memory://``, ``sqlite:///path.db``, ``redis://...`` or ``postgresql://...``
            (default: the embedded SQLite file, as the CLI resolves it). Keys live in it;
            each tenant's sessions in a store derived from it (:mod:`ctxkeep.server.tenants`).
        config: every tenant's session bounds (default: :func:`~ctxkeep.default_memory_config`).
        clock: the time source for TTL and LRU (tests).
        max_body_bytes: the largest request body accepted (larger: 413).
        body_timeout: seconds a request body may take to arrive after its head (longer: 408,
            and the connection is closed).
        max_append_messages: the most messages one request may write (more: 422, nothing
            stored).
        max_open_tenants: tenants' stores kept open at once (least recently used closed).
        embedder: the episodic embedder: ``local`` (the library's default), ``openai``,
            ``hash`` (tests only) or an :class:`~ctxkeep.episodic.Embedder`; made on first
            use of the episodic routes and shared by every tenant.
        require_persistent_keys: refuse a store that could lose the API keys (a Redis with
            neither AOF nor RDB persistence, or one that evicts any key;
            :meth:`~ctxkeep.server.keys.KeyRegistry.volatility`). ``ctxkeep serve`` sets it
            unless given ``--allow-volatile-redis``; tests on a throwaway Redis leave it off.
        metrics: count requests, appends, prompt builds, pruning and store errors for
            ``/metrics`` (:mod:`ctxkeep.server.metrics`; without prometheus-client, or when
            False, ``/metrics`` answers 501).
        tracer_provider: trace every request and its store calls with this OpenTelemetry
            provider (:mod:`ctxkeep.server.tracing`; None: no traces).
        threads: the most threads running sync routes at once, per process (set on anyio's
            default thread limiter as the app starts; None: anyio's 40). A request beyond
            waits for a thread, as it would for a store connection: more threads than the
            store has connections only wait for one, and take the GIL from those that have one
            (``ctxkeep serve --threads``).
        key_cache_seconds: how long a checked API key is trusted without reading the store
            again (0: a read per request); a key revoked by another process (``ctxkeep keys
            revoke``, another worker) is refused here within that time
            (:mod:`ctxkeep.server.keys`).

    Returns:
        The FastAPI application; ``app.state.ctxkeep`` is its :class:`ServerState` (closed
        when the application shuts down).

    Raises:
        ConfigError: an unsupported URL, a bad limit, or (``require_persistent_keys``) a
            store that could lose the keys.
        StorageError: the store cannot be reached.

    """
    _check_positive("max_body_bytes", max_body_bytes, whole=True)
    _check_positive("max_append_messages", max_append_messages, whole=True)
    _check_positive("body_timeout", body_timeout, whole=False)
    if threads is not None:
        _check_positive("threads", threads, whole=True)
    if key_cache_seconds != 0:
        _check_positive("key_cache_seconds", key_cache_seconds, whole=False)
    url = db_url or default_url()
    observed = _open_metrics() if metrics else None
    tracer: Tracer | None = None
    if tracer_provider is not None:
        from ctxkeep.server import tracing

        tracer = tracing.tracer_of(tracer_provider)
    keys = open_key_registry(url)
    keys.cache_seconds = key_cache_seconds
    try:
        if require_persistent_keys:
            refuse_volatile_keys(keys)
        if tracer is None:
            stores = TenantStores(
                url, keys, config=config, clock=clock, max_open=max_open_tenants, embedder=embedder
            )
        else:
            stores = tracing.TracedTenantStores(
                url,
                keys,
                config=config,
                clock=clock,
                max_open=max_open_tenants,
                embedder=embedder,
                tracer=tracer,
            )
    except BaseException:
        keys.close()
        raise
    state = ServerState(url=url, keys=keys, stores=stores, max_body_bytes=max_body_bytes)
    if observed is not None:
        observed.watch_buses(stores.open_fabrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if threads is not None:  # the limiter belongs to the event loop: set it in it
            anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        # The default encoding is built before the first request, not during it (0.4-1 s),
        # and the prompt route's path run once on a throwaway store: the first prompt of a
        # new server then costs its read and prune alone.
        await asyncio.to_thread(_warm_prompt_path)
        yield
        state.close()

    app = FastAPI(
        title="ctxkeep",
        version=__version__,
        description=(
            "Session memory, prompt building, artifacts, episodic memory, checkpoints and "
            "the context fabric for LLM agents, per tenant. Authenticate "
            "with `Authorization: Bearer <key>` (keys from `ctxkeep keys create`). Errors are "
            "RFC 9457 problem details."
        ),
        lifespan=lifespan,
    )
    app.state.ctxkeep = state
    app.state.metrics = observed
    app.include_router(router)
    app.include_router(_ops)
    app.include_router(routes_memory.router)
    app.include_router(routes_fabric.router)
    app.include_router(inspector_router)
    app.add_exception_handler(CtxkeepError, _on_ctxkeep_error)
    app.add_exception_handler(Unauthorized, _on_unauthorized)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_middleware(
        RequestLimits,
        max_body_bytes=max_body_bytes,
        body_timeout=body_timeout,
        max_append_messages=max_append_messages,
    )
    app.add_middleware(AccessLog, routes=lambda: app.routes, metrics=observed, tracer=tracer)
    app.openapi = _openapi(app)  # type: ignore[method-assign]
    return app

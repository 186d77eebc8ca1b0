"""Hostile input to every route of the service, on SQLite, PostgreSQL and Redis (issue 25):
no answer is a server error (>= 500; 501 ``not-available``, the episode routes on Redis, is
the documented answer of a storage without episodes), every refusal is a problem, and a
refused request stores nothing.

The routes come from the app's own OpenAPI document, so a route added later is attacked too
(:func:`test_every_route_in_the_schema_is_attacked` fails when one cannot be called: a path
parameter with no value in :data:`PATH_VALUES`, or a body with no valid example in
:data:`BODIES` or ``SCHEMA_EXAMPLES``). Each route starts from a valid request (the baseline,
aimed at records seeded in the tenant's stores; it must succeed) and every variant changes
one thing (``_hostile_requests.py``):

* every field (path and query parameters, body members, nested ones) gets every hostile value
  of its kind: a lone surrogate, a NUL, control characters, an empty text and 20,000 letters
  in every string; 2**63, -(2**63)-1, 10**20,
  10**5000 and 1e400 in every number; 10-, 1,000- and 100,000-deep nesting, NUL and lone
  surrogates in keys and values, and integers beyond 64 bits in every JSON member (metadata,
  state, payload...);
* every request as a whole: wrong content types, an empty body, a body over the limit, a
  duplicate key, JSON that is invalid, not UTF-8, not an object or 100,000 levels deep,
  duplicate and unknown query parameters, bad percent escapes, hostile ``Authorization``
  headers.

After every refused request the tenant's storage is compared with what it held before
(``_hostile_stores.py``): the rows of every table of its SQLite file or PostgreSQL schema,
every key under its Redis prefix with its length or a digest of its content (sessions,
messages, archive, episodes, checkpoints, artifacts, task states, the bus), and the
in-process task states and bus queues on SQLite and PostgreSQL;
:func:`test_the_storage_check_sees_every_kind_of_record` shows the comparison sees each kind.
After each route's variants, everything stored is read back through the API, and each read
must succeed: a value accepted but unreadable would fail there.

The service runs in process (Starlette's TestClient over the ASGI app), so the three backends
take about 25 s together: the middleware, routing, validation and stores are the real ones.
What the HTTP protocol carries differently is checked over a real socket against uvicorn
with ``ctxkeep serve``'s protocol, on SQLite: every request-level variant of every route, and
requests HTTP cannot parse, sent as raw bytes.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import h11
import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient

from _hostile_requests import MAX_BODY, ROUTES, Route, Variant, body_schema, example, variants
from _hostile_stores import (
    TENANT,
    Backend,
    World,
    local_fabric,
    postgres_fingerprint,
    redis_fingerprint,
    seed,
    sqlite_fingerprint,
    tool_round,
)
from conftest_services import delete_prefix, postgres_url, redis_url, with_schema
from ctxkeep.server import create_app
from ctxkeep.server.app import HeaderTimeout
from ctxkeep.server.keys import sqlite_path
from ctxkeep.sessions.base import MemoryConfig

__all__ = ["postgres_url", "redis_url"]

PROBLEM = "application/problem+json"
CONFIG = MemoryConfig(max_history=200, session_ttl=None, max_sessions=None)
"""No TTL and no LRU bound: nothing leaves the store by time or count during the run."""

# -- the routes' baselines ------------------------------------------------------------------------


PATH_VALUES: dict[str, str] = {
    "session_id": "main",
    "agent_id": "agent",
    "ref": "artifact",
    "episode_id": "episode",
    "checkpoint_id": "checkpoint",
    "letter_id": "0-0",
}
"""The seeded record each path parameter names (a key of :attr:`World.ids`, else the value)."""

PATH_OVERRIDES: dict[tuple[str, str], dict[str, str]] = {
    # Routes that take a record away or write into a session aim at a victim of their own,
    # so the others keep theirs (and the prompt routes a session they can build).
    ("DELETE", "/v1/sessions/{session_id}"): {"session_id": "victim"},
    ("POST", "/v1/sessions/{session_id}/messages"): {"session_id": "victim-append"},
    ("POST", "/v1/sessions/{session_id}/messages/pop"): {"session_id": "victim-pop"},
    ("PUT", "/v1/sessions/{session_id}/messages/newest"): {"session_id": "victim-newest"},
    ("DELETE", "/v1/episodes/{episode_id}"): {"episode_id": "victim-episode"},
    ("POST", "/v1/fabric/agents/{agent_id}/messages/receive"): {"agent_id": "peer"},
    ("POST", "/v1/fabric/agents/{agent_id}/messages/ack"): {"agent_id": "peer"},
}

Body = Callable[[World], Any]

BODIES: dict[tuple[str, str], Body] = {
    ("POST", "/v1/inspect/episodes/search"): lambda w: {
        "query": "parser bug",
        "top_k": 3,
        "filters": {"session_id": w.ids["main"], "agent_id": "agent", "metadata": {"k": "v"}},
    },
    ("POST", "/v1/sessions"): lambda w: {
        "agent_id": "agent",
        "task_id": "task",
        "metadata": {"k": "v"},
    },
    ("POST", "/v1/sessions/{session_id}/messages"): lambda w: {
        "messages": tool_round(uuid.uuid4().hex[:8])
    },
    ("PUT", "/v1/sessions/{session_id}/messages/newest"): lambda w: {
        "newest_id": w.newest_id(w.ids["victim-newest"]),
        "messages": [{"role": "user", "content": "instead", "metadata": {"k": 1}}],
    },
    ("POST", "/v1/sessions/{session_id}/prompt"): lambda w: {
        "max_prompt_tokens": 4000,
        "reserve_output_tokens": 500,
        "preserve_last_n": 4,
        "system": "be brief",
        "format": "anthropic",
        "encoding": "o200k_base",
    },
    ("POST", "/v1/artifacts"): lambda w: {"text": "a tool's full output"},
    ("POST", "/v1/episodes"): lambda w: {
        "session_id": w.ids["main"],
        "task_goal": "find the bug",
        "summary": "it was in the parser",
        "metadata": {"k": "v"},
        "agent_id": "agent",
        "task_id": "task",
        "created_at": 1_700_000_000.0,
    },
    ("POST", "/v1/episodes/search"): lambda w: {
        "query": "parser bug",
        "top_k": 3,
        "filters": {
            "episode_id": [w.ids["episode"]],
            "session_id": w.ids["main"],
            "agent_id": "agent",
            "task_id": "task",
            "since": 0.0,
            "until": 2e9,
            "metadata": {"k": "v"},
        },
    },
    ("POST", "/v1/agents/{agent_id}/checkpoints"): lambda w: {
        "state": {"schema_version": 1, "context": {"goal": "g"}, "decision": "go"},
        "task_id": "task",
        "session_id": w.ids["main"],
        "private": {"note": "mine"},
        "metadata": {"k": "v"},
    },
    ("PUT", "/v1/fabric/agents/{agent_id}/task"): lambda w: {
        "task_id": "task",
        "state": {"goal": "g"},
    },
    ("PATCH", "/v1/fabric/agents/{agent_id}/task"): lambda w: {
        "changes": {"step": 1},
        "expected_version": w.task_version("agent"),
    },
    ("POST", "/v1/fabric/agents/{agent_id}/subscriptions"): lambda w: {"topic": "news"},
    ("POST", "/v1/fabric/messages"): lambda w: {
        "sender": "agent",
        "recipient": "peer",
        "topic": None,
        "payload": {"k": "v"},
    },
    ("POST", "/v1/fabric/agents/{agent_id}/messages/receive"): lambda w: {"max_messages": 5},
    ("POST", "/v1/fabric/agents/{agent_id}/messages/ack"): lambda w: {"ids": ["0-1"]},
}
"""A valid body per route that takes one (routes not here: :data:`SCHEMA_EXAMPLES`)."""

QUERIES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/v1/sessions"): {"agent_id": "agent", "task_id": "task", "limit": "5", "offset": "0"},
    ("GET", "/v1/sessions/{session_id}/messages"): {"last": "10", "offset": "1", "limit": "3"},
    ("DELETE", "/v1/episodes"): {"session_id": "victim", "agent_id": "nobody"},
    ("GET", "/v1/agents/{agent_id}/checkpoints"): {"limit": "2", "offset": "0"},
    ("GET", "/v1/fabric/agents/{agent_id}/dead-letters"): {"limit": "10"},
    ("GET", "/v1/inspect/sessions/{session_id}/composition"): {
        "at": "2",
        "max_prompt_tokens": "4000",
        "reserve_output_tokens": "500",
        "preserve_last_n": "2",
        "encoding": "o200k_base",
    },
    ("GET", "/v1/inspect/sessions/{session_id}/steps"): {
        "limit": "3",
        "max_prompt_tokens": "4000",
        "reserve_output_tokens": "500",
        "preserve_last_n": "2",
        "encoding": "cl100k_base",
    },
}
"""Valid query parameters (each one given; a query parameter not here is attacked alone)."""

EXTRA_ROUTES = [("GET", "/"), ("GET", "/inspector/{name}")]
"""Routes outside the OpenAPI document (the inspector's page)."""
EXTRA_PATH_VALUES = {"name": "inspector.js"}


# -- sending and checking -------------------------------------------------------------------------


@dataclass
class Outcome:
    sent: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)


def _path(route: Route, world: World, values: dict[str, str] | None) -> str:
    chosen = {**PATH_VALUES, **EXTRA_PATH_VALUES, **PATH_OVERRIDES.get(route.key, {})}
    out = route.path
    for name in re.findall(r"\{(\w+)\}", route.path):
        if values and name in values:
            value = values[name]
        else:
            if name not in chosen:
                raise LookupError(
                    f"{route.id}: no value for path parameter {name!r}: add one to PATH_VALUES"
                )
            value = world.ids.get(chosen[name], chosen[name])
        out = out.replace("{" + name + "}", value)
    return out


def send(route: Route, world: World, variant: Variant | None) -> Any:
    """The response to ``route``'s baseline request, with ``variant`` applied."""
    v = variant or Variant("baseline")
    url = _path(route, world, v.path)
    query = dict(QUERIES.get(route.key, {}))
    pairs: list[tuple[str, str]] = []
    if v.query is not None:
        for name, _ in v.query:
            query.pop(name, None)
        pairs = list(v.query)
    pairs = [*query.items(), *pairs]
    if pairs:
        url += "?" + "&".join(f"{k}={val}" for k, val in pairs)
    headers = {k.lower(): val for k, val in world.headers.items()}
    content: bytes | None = v.body
    if content is None and body_schema(route) is not None:
        made = baseline_body(route, world)
        content = None if made is None else json.dumps(made).encode()
    if content is not None:
        headers["content-type"] = "application/json"
    for k, val in (v.headers or {}).items():
        if val:
            headers[k] = val
        else:
            headers.pop(k, None)
    return world.client.request(route.method, url, content=content, headers=headers)


def baseline_body(route: Route, world: World) -> Any:
    make = BODIES.get(route.key)
    if make is not None:
        return make(world)
    schema = body_schema(route)
    return None if schema is None else example(schema)


NOT_AVAILABLE = "urn:ctxkeep:problem:not-available"


def server_error(r: Any) -> bool:
    """Whether ``r`` is a server error: a status of 500 or more, but for 501
    ``not-available`` (episodes on a Redis server: a route that storage does not offer, as
    documented, not a failure).
    """
    if r.status_code == 501:
        return bool(r.json().get("type") != NOT_AVAILABLE)
    return bool(r.status_code >= 500)


def attack(
    backend: Backend, route: Route, only: Callable[[Variant], bool] | None = None
) -> Outcome:
    """The baseline of ``route`` (it must succeed), then every variant (``only``: those it
    selects), checked; then everything stored, read back.
    """
    world = backend.world
    out = Outcome()
    make_body: Callable[[], Any] | None = None
    if body_schema(route) is not None:
        if baseline_body(route, world) is None:
            out.failures.append(f"{route.id}: no valid body: add one to BODIES or SCHEMA_EXAMPLES")
            return out

        def make_body() -> Any:
            return baseline_body(route, world)

    base = send(route, world, None)
    out.sent += 1
    if base.status_code >= 400 and (base.status_code != 501 or server_error(base)):
        out.failures.append(
            f"{route.id}: the baseline failed: {base.status_code} {base.text[:300]}"
        )
    known: Any = None  # the storage as the last refusal left it (nothing changes it since)
    for variant in variants(route, make_body):
        if only is not None and not only(variant):
            continue
        before = backend.fingerprint() if known is None else known
        known = None
        try:
            r = send(route, world, variant)
        except (httpx.LocalProtocolError, h11.LocalProtocolError):
            continue  # an HTTP client refuses to send it (over a socket): none arrives
        out.sent += 1
        where = f"{route.id} [{variant.what}]"
        if server_error(r):
            out.failures.append(f"{where}: {r.status_code} {r.text[:300]}")
            continue
        if r.status_code < 400:
            continue
        out.refused += 1
        if not r.headers.get("content-type", "").startswith(PROBLEM):
            out.failures.append(f"{where}: {r.status_code} is not a problem: {r.text[:200]}")
        after = backend.fingerprint()
        if after != before:
            out.failures.append(
                f"{where}: refused with {r.status_code} but stored: {_diff(before, after)}"
            )
        else:
            known = after
    out.failures.extend(read_back(world))
    return out


def _diff(before: Any, after: Any) -> str:
    if isinstance(before, dict) and isinstance(after, dict):
        keys = set(before) | set(after)
        return ", ".join(
            f"{k}: {_diff(before.get(k), after.get(k))}"
            for k in sorted(keys, key=str)
            if before.get(k) != after.get(k)
        )
    return f"{before!r} -> {after!r}"[:300]


_READ_SEEN: dict[int, dict[str, Any]] = {}


def read_back(world: World) -> list[str]:
    """Read through the API everything the tenant stores: every read of a stored record
    succeeds (a value accepted but unreadable would fail here), but for the episode routes on
    Redis (501 ``not-available``).
    """
    failures: list[str] = []

    def read(method: str, path: str, **kw: Any) -> Any:
        r = world.client.request(method, path, headers=world.headers, **kw)
        if r.status_code >= 300 and not (r.status_code == 501 and not server_error(r)):
            failures.append(f"read back {method} {path}: {r.status_code} {r.text[:300]}")
        return r

    seen = _READ_SEEN.setdefault(id(world), {})
    listing = read("GET", "/v1/sessions?limit=1000")
    for s in listing.json().get("sessions", []) if listing.status_code == 200 else []:
        sid = s["session_id"]
        mark = (s["message_count"], s["next_seq"], s["revision"], s["first_seq"])
        if seen.get(sid) == mark:
            continue
        seen[sid] = mark
        at = "/v1/sessions/" + quote(sid, safe="")
        for path in (at, f"{at}/messages", f"{at}/archived", f"{at}/prompt"):
            read("GET", path)
        read("GET", "/v1/inspect/sessions/" + quote(sid, safe="") + "/steps")
        for format in ("openai", "responses"):
            read("POST", f"{at}/prompt", json={"format": format})
        # Not "anthropic": a tool call whose arguments are not JSON is stored, and then every
        # Anthropic prompt of its session is refused (422 invalid-message); reported.
    for agent in ("agent", "peer"):
        read("GET", f"/v1/fabric/agents/{agent}/task")
        read("GET", f"/v1/agents/{agent}/checkpoints?limit=1000")
        read("GET", f"/v1/fabric/agents/{agent}/dead-letters?limit=1000")
    received = read("POST", "/v1/fabric/agents/peer/messages/receive", json={"max_messages": 1000})
    if received.status_code == 200:
        ids = [m["id"] for m in received.json()["messages"]]
        if ids:
            read("POST", "/v1/fabric/agents/peer/messages/ack", json={"ids": ids})
    read("POST", "/v1/episodes/search", json={"query": "bug", "top_k": 100})
    filters = {"metadata": {"k": "v"}, "agent_id": "agent"}
    read("POST", "/v1/episodes/search", json={"query": "bug", "filters": filters})
    return failures


# -- the fixtures ---------------------------------------------------------------------------------


def _service(
    url: str, fingerprint: Callable[[World], Callable[[], Any]], name: str
) -> Iterator[Backend]:
    app = create_app(url, config=CONFIG, embedder="hash", max_body_bytes=MAX_BODY)
    with TestClient(app, raise_server_exceptions=False) as client:
        key = app.state.ctxkeep.keys.create(TENANT)[1]
        world = World(app, client, {"Authorization": f"Bearer {key}"})
        seed(world)
        stored = fingerprint(world)

        def whole() -> Any:
            return {"store": stored(), "fabric": local_fabric(world)}

        yield Backend(name, world, whole)


class SocketServer:
    """``app`` behind uvicorn on 127.0.0.1 with the protocol ``ctxkeep serve`` runs
    (:class:`~ctxkeep.server.app.HeaderTimeout`), in a thread, until :meth:`stop`.
    """

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="error",
            access_log=False,
            ws="none",
            lifespan="on",
            http=HeaderTimeout.after(10),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "no uvicorn"
            time.sleep(0.005)
        self.port = int(self.server.servers[0].sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def raw(self, data: bytes) -> bytes:
        """What the server answers ``data`` sent as is, until it closes the connection."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as conn:
            conn.sendall(data)
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def socket_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SocketServer, Any]]:
    """A SQLite service behind a real server, and its app."""
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile-socket')}/server.db"
    app = create_app(url, config=CONFIG, embedder="hash", max_body_bytes=MAX_BODY)
    server = SocketServer(app)
    try:
        yield server, app
    finally:
        server.stop()


@pytest.fixture(scope="module")
def socket_backend(socket_server: tuple[SocketServer, Any]) -> Iterator[Backend]:
    """The service of ``socket_server``, spoken to over a real socket."""
    server, app = socket_server
    with httpx.Client(base_url=server.url, timeout=30) as client:
        key = app.state.ctxkeep.keys.create(TENANT)[1]
        world = World(app, client, {"Authorization": f"Bearer {key}"})  # type: ignore[arg-type]
        seed(world)
        stored = sqlite_fingerprint(sqlite_path(app.state.ctxkeep.stores.store_url(TENANT)))
        try:
            yield Backend(
                "socket", world, lambda: {"store": stored(), "fabric": local_fabric(world)}
            )
        finally:
            stored.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile')}/server.db"

    reads: list[Any] = []

    def fingerprint(world: World) -> Callable[[], Any]:
        tenant = world.app.state.ctxkeep.stores.store_url(TENANT)
        read = sqlite_fingerprint(sqlite_path(tenant))
        reads.append(read)
        return read

    try:
        yield from _service(url, fingerprint, "sqlite")
    finally:
        for read in reads:
            read.close()


@pytest.fixture(scope="module")
def redis_backend(redis_url: str) -> Iterator[Backend]:
    prefix = f"ctxkeep-test:{uuid.uuid4().hex}:"
    url = f"{redis_url}?prefix={prefix}"
    reads: list[Any] = []

    def fingerprint(world: World) -> Callable[[], Any]:
        read = redis_fingerprint(redis_url, f"{prefix}tenant:{TENANT}:")
        reads.append(read)
        return read

    try:
        yield from _service(url, fingerprint, "redis")
    finally:
        for read in reads:
            read.close()
        delete_prefix(redis_url, prefix)


@pytest.fixture(scope="module")
def postgres_backend(postgres_url: str) -> Iterator[Backend]:
    import psycopg

    schema = f"ctxkeep_hostile_{uuid.uuid4().hex[:12]}"
    tenant_schema = f"{schema}_tenant_{TENANT}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    reads: list[Any] = []

    def fingerprint(world: World) -> Callable[[], Any]:
        read = postgres_fingerprint(postgres_url, tenant_schema)
        reads.append(read)
        return read

    try:
        yield from _service(with_schema(postgres_url, schema), fingerprint, "postgres")
    finally:
        for read in reads:
            read.close()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for s in (tenant_schema, schema, "ctxkeep_extensions"):
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> Backend:
    found: Backend = request.getfixturevalue(f"{request.param}_backend")
    return found


# -- the tests ------------------------------------------------------------------------------------


ALL_ROUTES = [*ROUTES, *(Route(m, p, {}) for m, p in EXTRA_ROUTES)]


def test_every_route_in_the_schema_is_attacked() -> None:
    world = World(app=None, client=None, headers={})  # type: ignore[arg-type]
    world.ids = {
        k: k for k in ("main", "victim", "artifact", "episode", "victim-episode", "checkpoint")
    }
    missing = []
    for route in ALL_ROUTES:
        try:
            _path(route, world, None)
        except LookupError as exc:
            missing.append(str(exc))
        schema = body_schema(route)
        if schema is not None and route.key not in BODIES and example(schema) is None:
            missing.append(f"{route.id}: no valid body: add one to BODIES")
        if sum(1 for _ in variants(route, (lambda: {}) if schema else None)) < 10:
            missing.append(f"{route.id}: too few variants")
    assert not missing, "\n".join(missing)
    assert {r.key for r in ROUTES} >= set(BODIES) | set(QUERIES) | set(PATH_OVERRIDES)


@pytest.mark.parametrize("route", ALL_ROUTES, ids=lambda r: r.id)
def test_hostile_input_gets_no_server_error_and_a_refusal_stores_nothing(
    backend: Backend, route: Route
) -> None:
    outcome = attack(backend, route)
    assert outcome.sent > 10
    failures = "\n".join(outcome.failures[:40])
    assert not outcome.failures, f"{len(outcome.failures)} of {outcome.sent}:\n{failures}"


WRITES = [
    ("POST", "/v1/sessions", {"agent_id": "agent"}),
    ("POST", "/v1/sessions/{main}/messages", {"messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/sessions/{main}/messages/pop", None),
    ("POST", "/v1/artifacts", {"text": "another output"}),
    ("POST", "/v1/episodes", {"session_id": "s", "task_goal": "g", "summary": "new"}),
    ("POST", "/v1/agents/agent/checkpoints", {"state": {"decision": "again"}}),
    ("PUT", "/v1/fabric/agents/newcomer/task", {"task_id": "task", "state": {}}),
    ("PATCH", "/v1/fabric/agents/agent/task", {"changes": {"k": 1}, "expected_version": -1}),
    ("POST", "/v1/fabric/agents/agent/subscriptions", {"topic": "other"}),
    ("POST", "/v1/fabric/messages", {"sender": "agent", "recipient": "peer", "payload": 1}),
]
"""One accepted write of each kind of record."""


def test_the_storage_check_sees_every_kind_of_record(backend: Backend) -> None:
    # A check that saw nothing would pass every refusal: each write must show in it.
    world = backend.world
    for method, path, body in WRITES:
        if "episodes" in path and backend.name == "redis":
            continue
        if body is not None and body.get("expected_version") == -1:
            body = {**body, "expected_version": world.task_version("agent")}
        before = backend.fingerprint()
        url = path.replace("{main}", world.ids["main"])
        r = world.client.request(method, url, headers=world.headers, json=body)
        assert r.status_code < 300, r.text
        assert backend.fingerprint() != before, f"{method} {path} did not show"


def _about_the_request(variant: Variant) -> bool:
    """A variant of the request as a whole (its path, query, headers, body), not of one body
    member: what the HTTP protocol carries differently from the in-process client.
    """
    return not variant.what.startswith("body ")


@pytest.mark.parametrize("route", ALL_ROUTES, ids=lambda r: r.id)
def test_over_a_socket_hostile_requests_get_no_server_error_and_store_nothing(
    socket_backend: Backend, route: Route
) -> None:
    outcome = attack(socket_backend, route, only=_about_the_request)
    failures = "\n".join(outcome.failures[:40])
    assert not outcome.failures, f"{len(outcome.failures)} of {outcome.sent}:\n{failures}"


MALFORMED = {
    "not ascii in the target": b"GET /v1/sessions/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
    "not ascii in the query": b"GET /v1/sessions?agent_id=\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    "nul in a header": b"GET /v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\x00b\r\n\r\n",
    "not http": b"GARBAGE\r\n\r\n",
    "two content lengths": (
        b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_request_http_cannot_parse_is_answered_with_a_problem(
    socket_server: tuple[SocketServer, Any], data: bytes
) -> None:
    head, _, body = socket_server[0].raw(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert b"content-type: application/problem+json" in head.lower()
    problem = json.loads(body)
    assert problem["type"] == "urn:ctxkeep:problem:malformed-request"
    assert problem["status"] == 400

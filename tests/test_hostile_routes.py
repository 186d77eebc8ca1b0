"""Hostile input to every route of the service, on SQLite, PostgreSQL and Redis (issue 25):
no answer is a server error (>= 500), and a refused request stores nothing.

The routes come from the app's own OpenAPI document, so a route added later is attacked too
(:func:`test_every_route_in_the_schema_is_attacked` fails when one cannot be called: a path
parameter with no value in :data:`PATH_VALUES`, or a body with no valid example in
:data:`BODIES` or :data:`SCHEMA_EXAMPLES`). Each route starts from a valid request (the
baseline, aimed at records seeded in the tenant's stores) and every variant changes one thing:

* every field (path and query parameters, body members, nested ones) gets every hostile value
  of its kind: a lone surrogate and a NUL in every string; 2**63, -(2**63)-1, 10**20,
  10**5000 and 1e400 in every number; 10-, 1,000- and 100,000-deep nesting, NUL and lone
  surrogates in keys and values, and integers beyond 64 bits in every JSON member (metadata,
  state, payload...);
* every request as a whole: wrong content types, an empty body, a body over the limit, a
  duplicate key, JSON that is invalid, not UTF-8, not an object or 100,000 levels deep, and
  duplicate query parameters.

After every refused request (4xx) the tenant's storage is compared with what it held before:
every row of every table of its SQLite file or PostgreSQL schema, every key under its Redis
prefix with its length (sessions, messages, archive, episodes, checkpoints, artifacts, the
task states and the bus on Redis), and the in-process task states and bus queues on SQLite
and PostgreSQL. After each route's variants, everything stored is read back through the API
(sessions, their messages and prompts, task state, inboxes, checkpoints, episodes): a value
accepted but unreadable would answer 500 there.

The service runs in process (Starlette's TestClient over the ASGI app): the middleware, the
routing, the validation and the stores are the real ones; only the socket is left out
(``test_server_api.py`` and ``test_serve_limits.py`` cover the HTTP protocol).
"""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest_services import delete_prefix, postgres_url, redis_url, with_schema
from ctxkeep.server import create_app
from ctxkeep.server.fabric import LocalFabric, RedisFabric
from ctxkeep.server.keys import sqlite_path
from ctxkeep.server.wire import message_from_wire
from ctxkeep.sessions.base import MemoryConfig

__all__ = ["postgres_url", "redis_url"]

TENANT = "hostile"
PROBLEM = "application/problem+json"
MAX_BODY = 4 * 1024 * 1024
CONFIG = MemoryConfig(max_history=200, session_ttl=None, max_sessions=None)
"""No TTL and no LRU bound: nothing leaves the store by time or count during the run."""

# -- hostile values, as JSON text ----------------------------------------------------------------

SURROGATE = '"\\ud800"'
NUL = '"a\\u0000b"'
BIG_INTS = {
    "2**63": str(2**63),
    "-(2**63)-1": str(-(2**63) - 1),
    "10**20": str(10**20),
    "10**5000": "1" + "0" * 5000,
}
"""Integers beyond 64 bits; 10**5000 is also beyond Python's default int parsing (4,300
digits)."""


def deep_object(depth: int) -> str:
    """``{"a": {"a": ... {}}}``, ``depth`` levels deep, as JSON text."""
    return '{"a":' * depth + "{}" + "}" * depth


def deep_array(depth: int) -> str:
    """``[[...[]]]``, ``depth`` levels deep, as JSON text."""
    return "[" * depth + "]" * depth


STRING_KINDS = {
    "surrogate": SURROGATE,
    "nul": NUL,
    "int-2**63": BIG_INTS["2**63"],
    "deep-1000": deep_object(1000),
}
NUMBER_KINDS = {
    **{f"int-{name}": text for name, text in BIG_INTS.items()},
    "1e400": "1e400",
    "surrogate": SURROGATE,
}
JSON_KINDS = {
    "deep-10": deep_object(10),
    "deep-1000": deep_object(1000),
    "deep-100000": deep_object(100_000),
    "nul": '{"a\\u0000b": "c\\u0000d"}',
    "surrogate": '{"\\ud800": ["\\udfff"]}',
    "int-2**63": '{"k": ' + BIG_INTS["2**63"] + "}",
    "int-10**5000": '{"k": ' + BIG_INTS["10**5000"] + "}",
}
"""Values of a JSON member (NUL and lone surrogates in a key and a value at once); a member
that holds a list (content parts, tool calls) gets each in a list."""
URL_TEXT_KINDS = {
    "surrogate": "%ED%A0%80",
    "bad-utf8": "%FF%FE",
    "nul": "a%00b",
    "slash": "a%2Fb",
    "long": "x" * 20_000,
    "int-2**63": BIG_INTS["2**63"],
}
URL_NUMBER_KINDS = {
    **{f"int-{name}": text for name, text in BIG_INTS.items()},
    "surrogate": "%ED%A0%80",
}
"""Values of a path or query parameter (text, or an integer), as they appear in the URL."""

# -- the routes' baselines ------------------------------------------------------------------------


@dataclass
class World:
    """The seeded records a baseline request is aimed at, and the service's store."""

    app: Any
    client: TestClient
    headers: dict[str, str]
    ids: dict[str, str] = field(default_factory=dict)

    def stores(self) -> Any:
        return self.app.state.ctxkeep.stores.lease_stores(TENANT)

    def newest_id(self, session_id: str) -> str:
        with self.stores() as stores:
            if not stores.memory.has_session(session_id):
                return "none"
            messages = stores.memory.get_messages(session_id, limit=1)
        return messages[-1].id if messages else "none"

    def task_version(self, agent_id: str) -> int:
        with self.stores() as stores:
            return stores.fabric().read(agent_id).version


def tool_round(n: str) -> list[dict[str, Any]]:
    """An assistant message calling a tool, and its result: a batch that leaves no call
    waiting, so each accepted append leaves the session open to the next.
    """
    return [
        {
            "role": "assistant",
            "content": "calling",
            "name": "bot",
            "turn_id": "t1",
            "tool_calls": [{"id": f"call-{n}", "name": "lookup", "arguments": "{}"}],
            "event_kind": "step",
            "parent_id": None,
            "artifact_refs": [],
            "metadata": {"k": "v"},
            "extra": {"refusal": None},
            "created_at": "2026-01-01T00:00:00+00:00",
        },
        {"role": "tool", "tool_call_id": f"call-{n}", "content": [{"type": "text", "text": "ok"}]},
    ]


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
    # Routes that take a record away aim at a victim, so the others keep theirs.
    ("DELETE", "/v1/sessions/{session_id}"): {"session_id": "victim"},
    ("POST", "/v1/sessions/{session_id}/messages/pop"): {"session_id": "victim-pop"},
    ("PUT", "/v1/sessions/{session_id}/messages/newest"): {"session_id": "victim-newest"},
    ("DELETE", "/v1/episodes/{episode_id}"): {"episode_id": "victim-episode"},
    ("POST", "/v1/fabric/agents/{agent_id}/messages/receive"): {"agent_id": "peer"},
    ("POST", "/v1/fabric/agents/{agent_id}/messages/ack"): {"agent_id": "peer"},
}

Body = Callable[[World], Any]

BODIES: dict[tuple[str, str], Body] = {
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

SCHEMA_EXAMPLES: dict[str, Any] = {
    "ToolCallIn": {"id": "call-x", "name": "lookup", "arguments": "{}"},
    "FunctionIn": {"name": "lookup", "arguments": "{}"},
}
"""A valid value of a component the baselines leave out, to attack its members too."""

EXTRA_ROUTES = [("GET", "/"), ("GET", "/inspector/{name}")]
"""Routes outside the OpenAPI document (the inspector's page)."""
EXTRA_PATH_VALUES = {"name": "inspector.js"}


# -- the backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    """A service on one backend, seeded, and how to read its tenant's storage whole."""

    name: str
    world: World
    fingerprint: Callable[[], Any]


def _sqlite_fingerprint(path: str) -> Callable[[], Any]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)

    def read() -> Any:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        query = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM \"{t}\"" for t in tables)
        return dict(conn.execute(query).fetchall())

    read.close = conn.close  # type: ignore[attr-defined]
    return read


def _postgres_fingerprint(url: str, schema: str) -> Callable[[], Any]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    # Every table's rows counted in one round trip, by a function of this connection only.
    conn.execute(
        """
        CREATE FUNCTION pg_temp.ctxkeep_counts(s text) RETURNS TABLE(name text, n bigint)
        LANGUAGE plpgsql AS $$
        DECLARE t text;
        BEGIN
            FOR t IN SELECT table_name FROM information_schema.tables
                     WHERE table_schema = s AND table_type = 'BASE TABLE' LOOP
                name := t;
                EXECUTE format('SELECT count(*) FROM %I.%I', s, t) INTO n;
                RETURN NEXT;
            END LOOP;
        END $$
        """
    )
    query = "SELECT name, n FROM pg_temp.ctxkeep_counts(%s)"

    def read() -> Any:
        return dict(conn.execute(query, (schema,)).fetchall())

    read.close = conn.close  # type: ignore[attr-defined]
    return read


def _redis_fingerprint(url: str, prefix: str) -> Callable[[], Any]:
    import redis

    client = redis.Redis.from_url(url)
    sizes = {
        b"string": None,
        b"hash": "HLEN",
        b"zset": "ZCARD",
        b"list": "LLEN",
        b"set": "SCARD",
        b"stream": "XLEN",
    }

    def read() -> Any:
        keys = sorted(client.scan_iter(match=f"{prefix}*", count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.type(key)
        types = pipe.execute()
        pipe = client.pipeline(transaction=False)
        measured = []
        for key, kind in zip(keys, types, strict=True):
            command = sizes.get(kind)
            if command is not None:
                pipe.execute_command(command, key)
                measured.append(key)
        lengths = dict(zip(measured, pipe.execute(), strict=True))
        pipe = client.pipeline(transaction=False)
        streams = [k for k, t in zip(keys, types, strict=True) if t == b"stream"]
        for key in streams:
            pipe.xinfo_groups(key)
        pending = {
            key: sorted((g["name"], g["pending"]) for g in groups)
            for key, groups in zip(streams, pipe.execute(), strict=True)
        }
        return {k: (t, lengths.get(k), pending.get(k)) for k, t in zip(keys, types, strict=True)}

    read.close = client.close  # type: ignore[attr-defined]
    return read


def _local_fabric(world: World) -> Any:
    """The in-process task states and bus of the tenant (SQLite and PostgreSQL servers)."""
    fabric = world.app.state.ctxkeep.stores.fabric(TENANT)
    if not isinstance(fabric, LocalFabric):
        assert isinstance(fabric, RedisFabric)
        return None
    ctx = fabric.fabric
    bus: Any = fabric.bus
    return {
        "tasks": {
            t: (task.version, json.dumps(task.data, sort_keys=True))
            for t, task in ctx._tasks.items()
        },
        "agents": dict(ctx._agent_task),
        "queues": {a: len(q) for a, q in bus._queues.items() if q},
        "pending": {a: len(p) for a, p in bus._pending.items() if p},
        "subscriptions": {f"{k}": sorted(v) for k, v in bus._subs.items() if v},
        "dead": {a: len(d) for a, d in getattr(bus, "_dead", {}).items() if d},
    }


def seed(world: World) -> None:
    """The records the baselines name: sessions ``main`` (with tool calls) and ``victim``, an
    artifact, episodes, a checkpoint, agents ``agent`` and ``peer`` in task ``task``, a
    subscription and a message waiting in ``peer``'s inbox.
    """
    with world.stores() as stores:
        mem = stores.memory
        for name in ("main", "victim", "victim-pop", "victim-newest"):
            sid = mem.create_session(
                "agent", task_id="task", session_id=f"{name}-{uuid.uuid4().hex[:6]}"
            )
            first = [{"role": "user", "content": "look it up"}, *tool_round("seed")]
            mem.add_messages(sid, [message_from_wire(m) for m in first])
            mem.add_messages(sid, [{"role": "user", "content": "and now?"}])
            world.ids[name] = sid
        world.ids["artifact"] = stores.artifacts().put("a full tool output\n" * 50)
        world.ids["checkpoint"] = stores.checkpoints().save(
            "agent", {"decision": "go"}, task_id="task"
        )
        fabric = stores.fabric()
        fabric.join("agent", "task", {"goal": "g"})
        fabric.join("peer", "task", {})
        fabric.subscribe("peer", "news")
        fabric.send("agent", {"hello": "peer"}, recipient="peer", topic=None)
        if not world.app.state.ctxkeep.stores.url.startswith("redis"):
            episodic = stores.episodic()
            world.ids["episode"] = episodic.save_episode(
                world.ids["main"],
                "find the bug",
                "it was in the parser",
                agent_id="agent",
                task_id="task",
            )
            world.ids["victim-episode"] = episodic.save_episode(
                world.ids["victim"], "victim goal", "victim summary", agent_id="agent"
            )
        else:
            world.ids["episode"] = world.ids["victim-episode"] = "no-episodes-on-redis"


# -- the routes and their variants, from the OpenAPI document ----------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    operation: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return (self.method, self.path)

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Variant:
    """One request: the baseline with one thing changed."""

    what: str
    path: dict[str, str] | None = None
    query: list[tuple[str, str]] | None = None
    body: bytes | None = None
    headers: dict[str, str] | None = None


def _schema_doc() -> dict[str, Any]:
    app = create_app("memory://", embedder="hash")
    return app.openapi()


DOC = _schema_doc()
COMPONENTS: dict[str, Any] = DOC["components"]["schemas"]
ROUTES = [
    Route(method.upper(), path, op)
    for path, ops in DOC["paths"].items()
    for method, op in ops.items()
]


def _resolve(schema: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    ref = schema.get("$ref")
    if ref is None:
        return None, schema
    name = ref.rsplit("/", 1)[1]
    return name, COMPONENTS[name]


def _branches(schema: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """The alternatives of a schema (``anyOf``), references resolved, ``null`` left out."""
    name, schema = _resolve(schema)
    alts = schema.get("anyOf") or schema.get("oneOf")
    if not alts:
        return [(name, schema)]
    return [_resolve(a) for a in alts if a.get("type") != "null"]


def _kind(schema: dict[str, Any]) -> str:
    """``json`` (an object, a list or any value), ``number`` or ``string`` (also booleans
    and enums) for the hostile values a member gets.
    """
    types = {b.get("type") for _, b in _branches(schema)}
    if "object" in types or "array" in types or None in types:
        return "json"
    if types & {"integer", "number"}:
        return "number"
    return "string"


def _lists_only(schema: dict[str, Any]) -> bool:
    """A JSON member that takes lists but no objects (content parts, tool calls)."""
    types = {b.get("type") for _, b in _branches(schema)}
    return "array" in types and "object" not in types and None not in types


MARK = "__hostile_value__"


def _encode(body: Any, at: tuple[Any, ...], raw: str) -> bytes:
    """``body`` as JSON text with the member at ``at`` replaced by the JSON text ``raw``."""
    copy = json.loads(json.dumps(body))
    target = copy
    for step in at[:-1]:
        target = target[step]
    target[at[-1]] = MARK
    text = json.dumps(copy)
    assert text.count(f'"{MARK}"') == 1
    return text.replace(f'"{MARK}"', raw).encode()


def _members(
    schema: dict[str, Any], value: Any, at: tuple[Any, ...]
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """Every member of a body (nested ones too): its place, its schema and the object holding
    it in the baseline (members the baseline leaves out are given, from
    :data:`SCHEMA_EXAMPLES`, when they are objects).
    """
    for name, branch in _branches(schema):
        if branch.get("type") == "object" and "properties" in branch:
            if not isinstance(value, dict):
                continue
            for prop, sub in branch["properties"].items():
                yield (*at, prop), sub, value
                inner = value.get(prop)
                if inner is None:
                    inner = _example(sub)
                    if inner is None:
                        continue
                    value = {**value, prop: inner}
                yield from _members(sub, inner, (*at, prop))
        elif branch.get("type") == "array" and "items" in branch:
            items = value if isinstance(value, list) and value else None
            if items is None:
                example = _example(branch["items"])
                if example is None:
                    continue
                items = [example]
            yield from _members(branch["items"], items[0], (*at, 0))
        del name


def _example(schema: dict[str, Any]) -> Any:
    for name, _ in _branches(schema):
        if name in SCHEMA_EXAMPLES:
            return json.loads(json.dumps(SCHEMA_EXAMPLES[name]))
    return None


def _with_member(body: Any, at: tuple[Any, ...], holder: Any) -> Any:
    """``body`` with the objects on the way to ``at`` present (as in the holder)."""
    out = json.loads(json.dumps(body))
    target = out
    for i, step in enumerate(at[:-1]):
        if isinstance(target, list):
            if not target:
                target.append({})
            target = target[step]
            continue
        if step not in target or target[step] is None:
            nxt = at[i + 1]
            target[step] = [] if isinstance(nxt, int) else {}
            if isinstance(nxt, int):
                target[step].append({})
        target = target[step]
    if isinstance(target, dict) and isinstance(holder, dict):
        for k, v in holder.items():
            target.setdefault(k, v)
    return out


def body_schema(route: Route) -> dict[str, Any] | None:
    content = route.operation.get("requestBody", {}).get("content", {})
    return content.get("application/json", {}).get("schema")


def variants(route: Route, body: Any) -> Iterator[Variant]:
    """Every hostile variant of ``route``'s request (``body``: its valid body, or None)."""
    params = route.operation.get("parameters", [])
    for p in params:
        place, name = p["in"], p["name"]
        kinds = URL_NUMBER_KINDS if _kind(p["schema"]) == "number" else URL_TEXT_KINDS
        for kind, text in kinds.items():
            if place == "path":
                yield Variant(f"path {name}={kind}", path={name: text})
            elif place == "query":
                yield Variant(f"query {name}={kind}", query=[(name, text)])
        if place == "query":
            yield Variant(f"query {name} twice", query=[(name, "1"), (name, BIG_INTS["2**63"])])
    schema = body_schema(route)
    if schema is not None and body is not None:
        for at, sub, holder in _members(schema, body, ()):
            where = ".".join(str(s) for s in at)
            kinds = {"json": JSON_KINDS, "number": NUMBER_KINDS, "string": STRING_KINDS}[_kind(sub)]
            base = _with_member(body, at, holder)
            for kind, text in kinds.items():
                raw = f"[{text}]" if _kind(sub) == "json" and _lists_only(sub) else text
                yield Variant(f"body {where}={kind}", body=_encode(base, at, raw))
        text = json.dumps(body)
        first = next(iter(body), None) if isinstance(body, dict) else None
        if first is not None:
            dup = f'{{"{first}": {SURROGATE}, ' + text[1:]
            yield Variant("duplicate key", body=dup.encode())
        yield Variant("text/plain", body=text.encode(), headers={"content-type": "text/plain"})
        yield Variant(
            "form",
            body=b"agent_id=a&messages=1",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        yield Variant(
            "multipart",
            body=b"--x\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--x--\r\n",
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
        yield Variant(
            "utf-16",
            body=text.encode("utf-16"),
            headers={"content-type": "application/json; charset=utf-16"},
        )
        yield Variant("no content type", body=text.encode(), headers={"content-type": ""})
    yield Variant("empty body", body=b"")
    yield Variant("invalid json", body=b'{"a": ')
    yield Variant("not utf-8", body=b'{"a": "\xff\xfe"}')
    yield Variant("json null", body=b"null")
    yield Variant("json array", body=b"[]")
    yield Variant("json string", body=b'"\\ud800"')
    yield Variant("top-level deep-100000", body=deep_object(100_000).encode())
    yield Variant("top-level deep-array-100000", body=deep_array(100_000).encode())
    yield Variant("huge body", body=b'{"a": "' + b"x" * (MAX_BODY + 1) + b'"}')
    yield Variant("huge declared length", body=b"{}", headers={"content-length": str(2**63)})


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
    headers = dict(world.headers)
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
    return None if schema is None else _example(schema)


NOT_AVAILABLE = "urn:ctxkeep:problem:not-available"


def server_error(r: Any) -> bool:
    """Whether ``r`` is a server error: a status of 500 or more, but for 501
    ``not-available`` (episodes on a Redis server: a route that storage does not offer, as
    documented, not a failure).
    """
    if r.status_code == 501:
        return bool(r.json().get("type") != NOT_AVAILABLE)
    return bool(r.status_code >= 500)


def attack(backend: Backend, route: Route) -> Outcome:
    """Every variant of ``route``, checked; then everything stored, read back."""
    world = backend.world
    out = Outcome()
    body = baseline_body(route, world) if body_schema(route) is not None else None
    if body_schema(route) is not None and body is None:
        out.failures.append(f"{route.id}: no valid body: add one to BODIES or SCHEMA_EXAMPLES")
        return out
    base = send(route, world, None)
    out.sent += 1
    if server_error(base):
        out.failures.append(f"baseline: {base.status_code} {base.text[:300]}")
    for variant in variants(route, body):
        before = backend.fingerprint()
        r = send(route, world, variant)
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
    """Read through the API everything the tenant stores; every answer under 500."""
    failures: list[str] = []

    def get(method: str, path: str, **kw: Any) -> Any:
        r = world.client.request(method, path, headers=world.headers, **kw)
        if server_error(r):
            failures.append(f"read back {method} {path}: {r.status_code} {r.text[:300]}")
        return r

    seen = _READ_SEEN.setdefault(id(world), {})
    listing = get("GET", "/v1/sessions?limit=1000")
    if listing.status_code == 200:
        for s in listing.json()["sessions"]:
            sid = s["session_id"]
            mark = (s["message_count"], s["next_seq"], s["revision"], s["first_seq"])
            if seen.get(sid) == mark:
                continue
            seen[sid] = mark
            quoted = (
                sid.replace("%", "%25").replace("/", "%2F").replace("?", "%3F").replace("#", "%23")
            )
            for method, path in (
                ("GET", f"/v1/sessions/{quoted}"),
                ("GET", f"/v1/sessions/{quoted}/messages"),
                ("GET", f"/v1/sessions/{quoted}/archived"),
                ("GET", f"/v1/sessions/{quoted}/prompt"),
                ("GET", f"/v1/inspect/sessions/{quoted}/steps"),
            ):
                get(method, path)
            get("POST", f"/v1/sessions/{quoted}/prompt", json={"format": "responses"})
    for agent in ("agent", "peer"):
        get("GET", f"/v1/fabric/agents/{agent}/task")
        get("GET", f"/v1/agents/{agent}/checkpoints?limit=1000")
        get("GET", f"/v1/fabric/agents/{agent}/dead-letters?limit=1000")
    received = get("POST", "/v1/fabric/agents/peer/messages/receive", json={"max_messages": 1000})
    if received.status_code == 200:
        ids = [m["id"] for m in received.json()["messages"]]
        if ids:
            get("POST", "/v1/fabric/agents/peer/messages/ack", json={"ids": ids})
    get("POST", "/v1/episodes/search", json={"query": "bug", "top_k": 100})
    filters = {"metadata": {"k": "v"}, "agent_id": "agent"}
    get("POST", "/v1/episodes/search", json={"query": "bug", "filters": filters})
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
            return (stored(), _local_fabric(world))

        yield Backend(name, world, whole)


@pytest.fixture(scope="module")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    url = f"sqlite:///{tmp_path_factory.mktemp('hostile')}/server.db"

    reads: list[Any] = []

    def fingerprint(world: World) -> Callable[[], Any]:
        tenant = world.app.state.ctxkeep.stores.store_url(TENANT)
        read = _sqlite_fingerprint(sqlite_path(tenant))
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
        read = _redis_fingerprint(redis_url, f"{prefix}tenant:{TENANT}:")
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
        read = _postgres_fingerprint(postgres_url, tenant_schema)
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
        if schema is not None and route.key not in BODIES and _example(schema) is None:
            missing.append(f"{route.id}: no valid body: add one to BODIES")
        if sum(1 for _ in variants(route, {} if schema else None)) < 10:
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

"""What the hostile-input suite (``test_hostile_routes.py``) aims at and checks: the seeded
records of a tenant, and its storage read whole (every table's rows of its SQLite file or
PostgreSQL schema, every key under its Redis prefix with its length, the in-process task
states and bus), so a refused request can be shown to have stored nothing (not collected).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.testclient import TestClient

from ctxkeep.server.fabric import LocalFabric
from ctxkeep.server.wire import message_from_wire

TENANT = "hostile"


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


# -- the backends ---------------------------------------------------------------------------------


@dataclass
class Backend:
    """A service on one backend, seeded, and how to read its tenant's storage whole."""

    name: str
    world: World
    fingerprint: Callable[[], Any]


def sqlite_fingerprint(path: str) -> Callable[[], Any]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)

    def read() -> Any:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        query = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM \"{t}\"" for t in tables)
        return dict(conn.execute(query).fetchall())

    read.close = conn.close  # type: ignore[attr-defined]
    return read


def postgres_fingerprint(url: str, schema: str) -> Callable[[], Any]:
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
        counts = dict(conn.execute(query, (schema,)).fetchall())
        if "ctxkeep_fabric_tasks" in counts:  # a task-state write adds no row: its version
            counts["task versions"] = conn.execute(
                f'SELECT coalesce(sum(version), 0) FROM "{schema}".ctxkeep_fabric_tasks'
            ).fetchone()[0]
        return counts

    read.close = conn.close  # type: ignore[attr-defined]
    return read


_REDIS_STATE = """
local out = {}
for _, k in ipairs(redis.call('KEYS', ARGV[1])) do
    local t = redis.call('TYPE', k)['ok']
    local v = ''
    if t == 'string' then
        v = redis.sha1hex(redis.call('GET', k))
    elseif t == 'hash' then
        local h, parts = redis.call('HGETALL', k), {}
        for i = 1, #h, 2 do
            if not string.find(h[i], 'access', 1, true) then
                table.insert(parts, h[i] .. '=' .. h[i + 1])
            end
        end
        table.sort(parts)
        v = redis.sha1hex(table.concat(parts, '\\0'))
    elseif t == 'zset' then
        v = tostring(redis.call('ZCARD', k))
    elseif t == 'set' then
        v = tostring(redis.call('SCARD', k))
    elseif t == 'list' then
        v = tostring(redis.call('LLEN', k))
    elseif t == 'stream' then
        v = tostring(redis.call('XLEN', k))
        for _, g in ipairs(redis.call('XINFO', 'GROUPS', k)) do
            for i = 1, #g, 2 do
                if g[i] == 'name' or g[i] == 'pending' then
                    v = v .. ':' .. tostring(g[i + 1])
                end
            end
        end
    end
    table.insert(out, k)
    table.insert(out, t .. ' ' .. v)
end
return out
"""


def redis_fingerprint(url: str, prefix: str) -> Callable[[], Any]:
    """Every key under ``prefix``, read in one script: its type, the length of sets, sorted
    sets, lists and streams (a stream's pending counts too), and a digest of strings and
    hashes (a task state's version, a checkpoint, an artifact), leaving out the access times
    a read moves.
    """
    import redis

    client = redis.Redis.from_url(url)
    script = client.register_script(_REDIS_STATE)

    def read() -> Any:
        flat = script(args=[f"{prefix}*"])
        return dict(zip(flat[::2], flat[1::2], strict=True))

    read.close = client.close  # type: ignore[attr-defined]
    return read


def local_fabric(world: World) -> Any:
    """The in-process task states and bus of the tenant (SQLite and PostgreSQL servers)."""
    fabric = world.app.state.ctxkeep.stores.fabric(TENANT)
    if not isinstance(fabric, LocalFabric):  # Redis Streams or PostgreSQL: in the store
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
        for name in ("main", "victim", "victim-pop", "victim-newest", "victim-append"):
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

"""Poison messages and poison task states (issue 25, items 1 and 2): a value no reader could be
handed is refused before it is stored, with the same typed error on every backend and a 422
through the service; a record already stored that cannot be read is moved to its agent's dead
letters with the reason, readable and deletable, and every good message around it is delivered
exactly once. The refusal at send on each bus is in ``BusContract``; here are the Redis
records corrupted in place (PostgreSQL's: ``tests/test_fabric_postgres.py``), the task states,
and the HTTP routes (memory, SQLite, Redis, PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from _fabric_pg_server import postgres_server_url
from conftest_services import postgres_schema_factory, postgres_url, redis_prefix_factory, redis_url
from ctxkeep import ContextFabric, IPCMessage
from ctxkeep.errors import CorruptRecordError, InvalidTypeError
from ctxkeep.fabric.jsondata import MAX_DEPTH, json_copy
from ctxkeep.server.fabric import LocalFabric, TenantFabric
from test_server_api import Api, _key
from test_server_memory_api import make_app, problem

__all__ = [
    "postgres_schema_factory",
    "postgres_server_url",
    "postgres_url",
    "redis_prefix_factory",
    "redis_url",
]

DEEP_STATE = 600
"""The task state's depth the issue stored on Redis and could not read back."""


def nested(depth: int) -> Any:
    """``depth`` mappings, one inside the other, around a number."""
    value: Any = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def deep_json(depth: int) -> str:
    """The JSON text of :func:`nested` (built as text: the stdlib cannot encode it that deep)."""
    return '{"x":' * depth + "1" + "}" * depth


# -- the rule, written once ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"a": ["ok", "lone \ud800"]}, "v['a'][1]"),
        ({"a": float("nan")}, "v['a']"),
        ({1: "int key"}, "v"),
        ({"a": {1, 2}}, "v['a']"),
        (nested(MAX_DEPTH + 1), "v['x']['x']['x']..."),
    ],
)
def test_json_data_no_reader_could_be_handed_is_refused_naming_where(
    value: Any, where: str
) -> None:
    with pytest.raises(InvalidTypeError) as caught:
        json_copy("v", value)
    assert str(caught.value).startswith(where)


def test_json_data_within_the_rule_is_copied() -> None:
    value = {"deep": nested(MAX_DEPTH - 1), "pair": (1, 2), "big": 2**70}
    copied = json_copy("v", value)
    assert copied == {"deep": nested(MAX_DEPTH - 1), "pair": [1, 2], "big": 2**70}
    assert copied["deep"] is not value["deep"]


# -- Redis: records corrupted in place go to dead letters ---------------------------------------

redis_only = pytest.mark.redis


@pytest.fixture
def prefix(redis_prefix_factory: Callable[[], str]) -> str:
    return redis_prefix_factory()


def stored_entry(payload_json: str) -> dict[str, str]:
    """A stream entry as an older ctxkeep stored it, with the payload's JSON text as given."""
    head = json.dumps({"sender": "a", "recipient": "b", "id": "poison", "created_at": 1.0})
    return {"v": "1", "m": head[:-1] + f', "payload": {payload_json}}}'}


POISON_ENTRIES = {
    "lone-surrogate": stored_entry('"\\ud800"'),
    "nested-300": stored_entry(deep_json(300)),
    "nested-100000": stored_entry(deep_json(100_000)),
    "not-json": {"v": "1", "m": "{not json"},
}


@redis_only
def test_a_stored_entry_that_is_not_utf8_is_dead_lettered_and_the_inbox_flows(
    redis_url: str, prefix: str
) -> None:
    import redis

    from ctxkeep.fabric.redis_bus import RedisStreamBus

    with RedisStreamBus(redis_url, consumer="proc-1", prefix=prefix) as bus:
        bus.register("b", "t")
        bus.send(IPCMessage(sender="a", recipient="b", payload="before"))
        with redis.Redis.from_url(redis_url) as raw:  # bytes in, as no ctxkeep writes them
            raw.xadd(bus.keys.inbox("b"), {b"v": b"1", b"m": b"\xff\xfe"})
        bus.send(IPCMessage(sender="a", recipient="b", payload="after"))
        assert [m.payload for m in bus.receive("b")] == ["before", "after"]
        (letter,) = bus.dead_letters("b")
        assert "not UTF-8" in letter.reason and letter.record["m"] == "\\xff\\xfe"


@redis_only
@pytest.mark.parametrize("poison", POISON_ENTRIES, ids=list(POISON_ENTRIES))
def test_a_stored_poison_entry_is_dead_lettered_and_the_inbox_flows(
    redis_url: str, prefix: str, poison: str
) -> None:
    from ctxkeep.fabric.redis_bus import RedisStreamBus

    with RedisStreamBus(redis_url, consumer="proc-1", prefix=prefix) as bus:
        bus.register("b", "t")
        bus.send(IPCMessage(sender="a", recipient="b", payload="before"))
        bus.db.conn.xadd(bus.keys.inbox("b"), POISON_ENTRIES[poison])  # type: ignore[arg-type]
        bus.send(IPCMessage(sender="a", recipient="b", payload="after"))

        got = bus.receive("b")
        assert [m.payload for m in got] == ["before", "after"]
        bus.ack("b", [m.id for m in got])
        assert bus.recover("b") == 0 and bus.receive("b") == []

        (letter,) = bus.dead_letters("b")
        assert letter.reason.startswith("corrupt bus entry")
        assert letter.record["m"] == POISON_ENTRIES[poison]["m"] and letter.record["entry_id"]
        assert bus.delete_dead_letters("b", ["0-1", "not an id", letter.id]) == 1
        assert bus.dead_letters("b") == []


# -- deep task state: refused on every backend, nothing written ---------------------------------


def redis_fabric(url: str) -> TenantFabric:
    from ctxkeep.server.fabric import RedisFabric

    return RedisFabric(url)


@pytest.fixture(
    params=[
        "local",
        pytest.param("redis", marks=redis_only),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def tenant_fabric(request: pytest.FixtureRequest) -> Iterator[TenantFabric]:
    """The service's task states on each backend: in process (memory, SQLite servers), in
    Redis or in PostgreSQL.
    """
    if request.param == "redis":
        redis = request.getfixturevalue("redis_url")
        fabric = redis_fabric(f"{redis}?prefix={request.getfixturevalue('prefix')}")
    elif request.param == "postgres":
        from ctxkeep.server.fabric import PostgresFabric

        fabric = PostgresFabric(request.getfixturevalue("postgres_schema_factory")())
    else:
        fabric = LocalFabric()
    yield fabric
    fabric.close()


def test_a_deep_task_state_is_refused_on_every_backend_and_nothing_is_written(
    tenant_fabric: TenantFabric,
) -> None:
    with pytest.raises(InvalidTypeError, match="nested deeper than"):
        tenant_fabric.join("a", "t", {"k": nested(DEEP_STATE)})
    tenant_fabric.join("b", "t", {"goal": "g"})
    with pytest.raises(InvalidTypeError, match="nested deeper than"):
        tenant_fabric.update("b", {"k": nested(DEEP_STATE)}, expected_version=1)
    task = tenant_fabric.read("b")
    assert (task.version, task.state) == (1, {"goal": "g"})


@redis_only
def test_redis_task_state_refuses_a_deep_state_and_writes_nothing(
    redis_url: str, prefix: str
) -> None:
    from ctxkeep.fabric.redis_state import RedisTaskState

    state = RedisTaskState(redis_url, "t", prefix=prefix)
    with pytest.raises(InvalidTypeError, match="nested deeper than"):
        state.update({"k": nested(DEEP_STATE)}, expected_version=0)
    with pytest.raises(InvalidTypeError, match="nested deeper than"):
        state.update_with(lambda data: {"k": nested(DEEP_STATE)})
    assert state.read() == (0, {}) and not state.db.conn.exists(state.key)
    state.close()


@redis_only
@pytest.mark.parametrize("stored", [deep_json(300), deep_json(100_000), '"\\ud800"', "{not json"])
def test_a_stored_task_state_no_reader_could_be_handed_is_a_corrupt_record(
    redis_url: str, prefix: str, stored: str
) -> None:
    from ctxkeep.fabric.redis_state import RedisTaskState

    state = RedisTaskState(redis_url, "t", prefix=prefix)
    state.db.conn.hset(state.key, mapping={"version": 1, "schema": 1, "data:k": stored})
    with pytest.raises(CorruptRecordError, match="field 'data:k'"):
        state.read()
    state.close()


def test_the_library_fabric_refuses_a_deep_task_state_with_the_same_error() -> None:
    fabric = ContextFabric()
    with pytest.raises(InvalidTypeError):
        fabric.set_task_context("a", {"k": nested(DEEP_STATE)}, task_id="t")
    assert fabric.task_version("t") == 0


# -- through the service ------------------------------------------------------------------------


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("redis", marks=redis_only),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FastAPI, Api]]:
    """A server on each kind of fabric, and its tenant ``acme``."""
    if request.param == "redis":
        url = f"{request.getfixturevalue('redis_url')}?prefix={request.getfixturevalue('prefix')}"
    elif request.param == "postgres":
        url = request.getfixturevalue("postgres_server_url")
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/srv.db"
    else:
        url = "memory://"
    app = make_app(url)
    with TestClient(app) as client:
        yield app, Api(client, _key(app, "acme"))


def raw(api: Api, method: str, path: str, body: str) -> Any:
    """A request with a JSON body given as text (one the stdlib cannot encode)."""
    headers = {**api.headers, "Content-Type": "application/json"}
    return api.client.request(method, path, content=body.encode(), headers=headers)


def send(api: Api, payload_json: str) -> Any:
    return raw(
        api,
        "POST",
        "/v1/fabric/messages",
        f'{{"sender": "a", "recipient": "b", "payload": {payload_json}}}',
    )


def receive(api: Api) -> list[dict[str, Any]]:
    r = api("POST", "/v1/fabric/agents/b/messages/receive", json={})
    assert r.status_code == 200, r.text
    return list(r.json()["messages"])


def join(api: Api, agent: str) -> None:
    r = api("PUT", f"/v1/fabric/agents/{agent}/task", json={"task_id": "t", "state": {}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "payload", ['"\\ud800"', '{"\\udfff": 1}', deep_json(300)], ids=["surrogate", "key", "deep"]
)
def test_a_poison_message_is_refused_with_422_and_the_inbox_flows(
    server: tuple[FastAPI, Api], payload: str
) -> None:
    _, api = server
    join(api, "a")
    join(api, "b")
    assert send(api, '"before"').status_code == 201
    problem(send(api, payload), 422, "invalid-message")
    assert send(api, '"after"').status_code == 201
    got = receive(api)
    assert [m["payload"] for m in got] == ["before", "after"]
    r = api("POST", "/v1/fabric/agents/b/messages/ack", json={"ids": [m["id"] for m in got]})
    assert r.json() == {"acked": 2}
    assert api("POST", "/v1/fabric/agents/b/messages/recover").json() == {"pending": 0}
    assert receive(api) == []
    assert api("GET", "/v1/fabric/agents/b/dead-letters").json() == {"dead_letters": []}


def test_a_deep_task_state_is_422_through_the_service_and_nothing_is_written(
    server: tuple[FastAPI, Api],
) -> None:
    _, api = server
    deep = deep_json(DEEP_STATE)
    r = raw(api, "PUT", "/v1/fabric/agents/a/task", f'{{"task_id": "t", "state": {deep}}}')
    problem(r, 422, "invalid-type")
    problem(api("GET", "/v1/fabric/agents/a/task"), 404, "unknown-agent")
    join(api, "a")
    r = raw(
        api, "PATCH", "/v1/fabric/agents/a/task", f'{{"changes": {deep}, "expected_version": 0}}'
    )
    problem(r, 422, "invalid-type")
    join(api, "b")  # another agent joins the task as before
    assert api("GET", "/v1/fabric/agents/a/task").json()["version"] == 0


@redis_only
def test_dead_letters_are_listed_and_deleted_through_the_service(
    redis_url: str, prefix: str
) -> None:
    app = make_app(f"{redis_url}?prefix={prefix}")
    with TestClient(app) as client:
        api = Api(client, _key(app, "acme"))
        join(api, "a")
        join(api, "b")
        bus: Any = app.state.ctxkeep.stores.fabric("acme").bus
        assert send(api, '"before"').status_code == 201
        bus.db.conn.xadd(bus.keys.inbox("b"), POISON_ENTRIES["lone-surrogate"])
        assert send(api, '"after"').status_code == 201
        assert [m["payload"] for m in receive(api)] == ["before", "after"]

        (letter,) = api("GET", "/v1/fabric/agents/b/dead-letters").json()["dead_letters"]
        assert "not valid Unicode" in letter["reason"]
        assert letter["record"]["m"] == POISON_ENTRIES["lone-surrogate"]["m"]
        gone = api("DELETE", f"/v1/fabric/agents/b/dead-letters/{letter['id']}")
        assert gone.json() == {"deleted": 1}
        assert api("DELETE", "/v1/fabric/agents/b/dead-letters/nope").json() == {"deleted": 0}
        assert api("GET", "/v1/fabric/agents/b/dead-letters").json() == {"dead_letters": []}
        problem(api("GET", "/v1/fabric/agents/ghost/dead-letters"), 404, "unknown-agent")
        for method, path in (("GET", ""), ("DELETE", f"/{letter['id']}")):
            r = client.request(method, f"/v1/fabric/agents/b/dead-letters{path}")
            problem(r, 401, "unauthorized")

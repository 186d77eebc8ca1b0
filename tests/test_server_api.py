"""The HTTP service: every endpoint, errors as problem details, tenant isolation, the body
limit, access logs and the OpenAPI document (FastAPI's TestClient, real stores).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from _server import ThreadedServer
from conftest_services import postgres_schema_factory, postgres_url, redis_prefix_factory, redis_url
from ctxkeep.client import AsyncRemoteMemory, AuthenticationError, RemoteError, RemoteMemory
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    OrphanToolResultError,
    SessionChangedError,
    SessionNotFoundError,
)
from ctxkeep.server import create_app
from ctxkeep.server.app import ACCESS_LOGGER
from ctxkeep.server.tenants import tenant_url
from ctxkeep.sessions.base import MemoryConfig
from ctxkeep.testing.contract import Clock

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

PROBLEM = "application/problem+json"
CONFIG = MemoryConfig(max_history=6, session_ttl=60, max_sessions=None)


class Api:
    """One tenant's view of the service."""

    def __init__(self, client: TestClient, key: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        return self.client.request(method, path, headers=self.headers, **kw)

    def session(self, agent: str = "agent", **body: Any) -> str:
        r = self("POST", "/v1/sessions", json={"agent_id": agent, **body})
        assert r.status_code == 201, r.text
        return str(r.json()["session"]["session_id"])

    def append(self, sid: str, *messages: dict[str, Any]) -> Any:
        return self("POST", f"/v1/sessions/{sid}/messages", json={"messages": list(messages)})

    def messages(self, sid: str) -> list[dict[str, Any]]:
        r = self("GET", f"/v1/sessions/{sid}/messages")
        assert r.status_code == 200, r.text
        return list(r.json()["messages"])

    def count(self) -> int:
        return int(self("GET", "/v1/stats").json()["sessions"])


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/srv.db"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(url: str, clock: Clock) -> FastAPI:
    return create_app(url, config=CONFIG, clock=clock, max_body_bytes=64 * 1024)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:  # runs the lifespan: the stores are closed after
        yield c


def _key(app: FastAPI, tenant: str) -> str:
    return str(app.state.ctxkeep.keys.create(tenant)[1])


@pytest.fixture
def acme(app: FastAPI, client: TestClient) -> Api:
    return Api(client, _key(app, "acme"))


@pytest.fixture
def globex(app: FastAPI, client: TestClient) -> Api:
    return Api(client, _key(app, "globex"))


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["type"] == f"urn:ctxkeep:problem:{slug}", body
    assert body["status"] == status and body["title"] and body["detail"]
    return body


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(cid: str, style: str = "openai") -> dict[str, Any]:
    tc: dict[str, Any] = (
        {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}
        if style == "openai"
        else {"id": cid, "name": "f", "arguments": "{}"}
    )
    return {"role": "assistant", "content": None, "tool_calls": [tc]}


def result(cid: str, text: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "content": text, "tool_call_id": cid}


# -- health, auth, routing ------------------------------------------------------------------------


def test_healthz_needs_no_key(client: TestClient) -> None:
    r = client.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


V1_ROUTES = [
    ("POST", "/v1/sessions"),
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/x"),
    ("GET", "/v1/sessions/x/exists"),
    ("DELETE", "/v1/sessions/x"),
    ("GET", "/v1/agents/a/latest"),
    ("GET", "/v1/stats"),
    ("POST", "/v1/sweep"),
    ("POST", "/v1/sessions/x/messages"),
    ("GET", "/v1/sessions/x/messages"),
    ("POST", "/v1/sessions/x/messages/pop"),
    ("PUT", "/v1/sessions/x/messages/newest"),
    ("GET", "/v1/sessions/x/archived"),
    ("GET", "/v1/sessions/x/prompt"),
    ("POST", "/v1/sessions/x/prompt"),
]


@pytest.mark.parametrize(("method", "path"), V1_ROUTES)
def test_every_v1_route_needs_a_valid_key(
    app: FastAPI, client: TestClient, method: str, path: str
) -> None:
    missing = client.request(method, path, json={})
    _problem(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    for header in ("Bearer ck_000000000000_nope", "Bearer garbage", "Basic dXNlcjpwYXNz"):
        r = client.request(method, path, json={}, headers={"Authorization": header})
        _problem(r, 401, "unauthorized")


def test_a_revoked_key_is_refused(app: FastAPI, client: TestClient) -> None:
    record, key = app.state.ctxkeep.keys.create("acme")
    api = Api(client, key)
    assert api("GET", "/v1/stats").status_code == 200
    assert app.state.ctxkeep.keys.revoke(record.key_id)
    refused = api("GET", "/v1/stats")
    _problem(refused, 401, "unauthorized")
    # Says where the key was looked for (this server's store) and how to make one there,
    # without naming the store to a client that holds no key.
    detail = refused.json()["detail"]
    assert "not a live key of this server's store" in detail
    assert "ctxkeep serve --db" in detail
    assert str(app.state.ctxkeep.url) not in detail


def test_a_key_with_the_right_id_and_a_wrong_secret_is_refused(
    app: FastAPI, client: TestClient
) -> None:
    record, _ = app.state.ctxkeep.keys.create("acme")
    forged = f"ck_{record.key_id}_{'A' * 43}"
    _problem(Api(client, forged)("GET", "/v1/stats"), 401, "unauthorized")


def test_unknown_route_and_method_are_problems(acme: Api) -> None:
    _problem(acme("GET", "/v1/nope"), 404, "not-found")
    _problem(acme("PATCH", "/v1/sessions"), 405, "method-not-allowed")


# -- sessions -------------------------------------------------------------------------------------


def test_create_get_exists_and_delete_a_session(acme: Api) -> None:
    r = acme("POST", "/v1/sessions", json={"agent_id": "a", "task_id": "t", "metadata": {"k": 1}})
    assert r.status_code == 201
    s = r.json()["session"]
    assert (s["agent_id"], s["task_id"], s["metadata"], s["message_count"]) == (
        "a",
        "t",
        {"k": 1},
        0,
    )
    sid = s["session_id"]
    assert acme("GET", f"/v1/sessions/{sid}").json()["session"]["session_id"] == sid
    assert acme("GET", f"/v1/sessions/{sid}/exists").json()["exists"] is True
    assert acme("DELETE", f"/v1/sessions/{sid}").json()["deleted"] is True
    _problem(acme("DELETE", f"/v1/sessions/{sid}"), 404, "session-not-found")
    _problem(acme("GET", f"/v1/sessions/{sid}"), 404, "session-not-found")
    assert acme("GET", f"/v1/sessions/{sid}/exists").json()["exists"] is False


def test_a_duplicate_session_id_is_a_conflict_and_keeps_the_first(acme: Api) -> None:
    acme.session("a", session_id="dup")
    body = _problem(
        acme("POST", "/v1/sessions", json={"agent_id": "b", "session_id": "dup"}),
        409,
        "session-exists",
    )
    assert body["session_id"] == "dup"
    assert acme("GET", "/v1/sessions/dup").json()["session"]["agent_id"] == "a"


def test_list_sessions_pages_and_filters(acme: Api, clock: Clock) -> None:
    made = []
    for i in range(5):
        clock.advance(1)
        made.append(acme.session("pager", task_id="even" if i % 2 == 0 else "odd"))
    acme.session("other")
    first = acme("GET", "/v1/sessions", params={"agent_id": "pager", "limit": 2}).json()
    assert [s["session_id"] for s in first["sessions"]] == made[::-1][:2]
    assert first["next_offset"] == 2
    last = acme("GET", "/v1/sessions", params={"agent_id": "pager", "limit": 2, "offset": 4})
    assert [s["session_id"] for s in last.json()["sessions"]] == [made[0]]
    assert last.json()["next_offset"] is None
    odd = acme("GET", "/v1/sessions", params={"task_id": "odd"}).json()["sessions"]
    assert {s["session_id"] for s in odd} == {made[1], made[3]}
    _problem(acme("GET", "/v1/sessions", params={"limit": 0}), 422, "invalid-request")


def test_latest_session_per_agent_and_stats(acme: Api, clock: Clock) -> None:
    acme.session("a")
    clock.advance(1)
    newest = acme.session("a")
    assert acme("GET", "/v1/agents/a/latest").json()["session_id"] == newest
    assert acme("GET", "/v1/agents/nobody/latest").json()["session_id"] is None
    assert acme.count() == 2


def test_sweep_reclaims_idle_sessions_and_reports_their_messages(acme: Api, clock: Clock) -> None:
    sid = acme.session()
    acme.append(sid, user("remember me"))
    clock.advance(120)
    r = acme("POST", "/v1/sweep").json()
    assert r["swept"] == 1
    assert [(e["reason"], [m["content"] for m in e["messages"]]) for e in r["evicted"]] == [
        ("ttl", ["remember me"])
    ]
    assert [
        m["content"] for m in acme("GET", f"/v1/sessions/{sid}/archived").json()["messages"]
    ] == ["remember me"]


# -- messages -------------------------------------------------------------------------------------


def test_append_accepts_openai_and_ctxkeep_messages_and_returns_stored_copies(acme: Api) -> None:
    sid = acme.session()
    r = acme.append(
        sid,
        user("go"),
        call("c1"),
        result("c1"),
        call("c2", style="ctxkeep"),
        {**result("c2"), "metadata": {"k": [1, 2.5, None]}, "refusal": None},
    )
    assert r.status_code == 201, r.text
    stored = r.json()["messages"]
    assert all(m["id"] and m["created_at"] for m in stored)
    assert stored[1]["tool_calls"] == [{"id": "c1", "name": "f", "arguments": "{}"}]
    assert stored[4]["metadata"] == {"k": [1, 2.5, None]}
    assert stored[4]["extra"] == {"refusal": None}  # an unmodelled OpenAI key, kept
    assert acme.messages(sid) == stored


def test_messages_page_through_oldest_first(acme: Api) -> None:
    sid = acme.session()
    acme.append(sid, *[user(f"m{i}") for i in range(5)])
    page = acme("GET", f"/v1/sessions/{sid}/messages", params={"offset": 1, "limit": 2}).json()
    assert [m["content"] for m in page["messages"]] == ["m1", "m2"]
    assert (page["total"], page["next_offset"]) == (5, 3)
    tail = acme("GET", f"/v1/sessions/{sid}/messages", params={"last": 2}).json()
    assert [m["content"] for m in tail["messages"]] == ["m3", "m4"]
    assert tail["next_offset"] is None


def test_max_history_trims_are_reported_and_archived(acme: Api) -> None:
    sid = acme.session()
    r = acme.append(sid, *[user(f"m{i}") for i in range(8)])  # max_history is 6
    trimmed = [m["content"] for e in r.json()["evicted"] for m in e["messages"]]
    assert trimmed == ["m0", "m1"]
    assert [m["content"] for m in acme.messages(sid)] == [f"m{i}" for i in range(2, 8)]
    archived = acme("GET", f"/v1/sessions/{sid}/archived").json()["messages"]
    assert [m["content"] for m in archived] == ["m0", "m1"]


def test_pop_takes_back_the_newest_message(acme: Api) -> None:
    sid = acme.session()
    acme.append(sid, user("one"), user("two"))
    assert acme("POST", f"/v1/sessions/{sid}/messages/pop").json()["message"]["content"] == "two"
    assert acme("POST", f"/v1/sessions/{sid}/messages/pop").json()["message"]["content"] == "one"
    assert acme("POST", f"/v1/sessions/{sid}/messages/pop").json()["message"] is None


def test_replace_newest_is_conditional_on_newest_id(acme: Api) -> None:
    sid = acme.session()
    first, second = acme.append(sid, user("one"), user("two")).json()["messages"]
    body = _problem(
        acme(
            "PUT",
            f"/v1/sessions/{sid}/messages/newest",
            json={"newest_id": first["id"], "messages": [user("x")]},
        ),
        409,
        "session-changed",
    )
    assert body["session_id"] == sid
    r = acme(
        "PUT",
        f"/v1/sessions/{sid}/messages/newest",
        json={"newest_id": second["id"], "messages": [user("TWO")]},
    )
    assert r.status_code == 200, r.text
    assert [m["content"] for m in acme.messages(sid)] == ["one", "TWO"]


# -- prompts --------------------------------------------------------------------------------------


def _long_session(api: Api) -> str:
    sid = api.session()
    api.append(sid, user("task"))
    for i in range(2):
        api.append(sid, call(f"p{i}"), result(f"p{i}", "output line\n" * 200))
    api.append(sid, user("and now?"))
    return sid


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "responses"])
def test_prompt_is_built_within_the_budget_in_each_format(acme: Api, fmt: str) -> None:
    sid = _long_session(acme)
    r = acme(
        "POST",
        f"/v1/sessions/{sid}/prompt",
        json={
            "max_prompt_tokens": 600,
            "reserve_output_tokens": 100,
            "preserve_last_n": 2,
            "system": "be brief",
            "format": fmt,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    report = body["report"]
    assert report["prompt_tokens"] <= 500
    assert sum(report["sections"].values()) == report["prompt_tokens"]
    assert report["prune"]["decisions"] and body["format"] == fmt
    if fmt == "anthropic":
        assert body["system"][0]["text"] == "be brief"
        assert body["messages"][0]["role"] == "user"
    elif fmt == "openai":
        assert body["messages"][0] == {"role": "system", "content": "be brief"}
        assert body["system"] is None
    else:
        assert body["messages"][0]["role"] == "system"


def test_prompt_that_cannot_fit_says_by_how_much(acme: Api) -> None:
    sid = acme.session()
    acme.append(sid, user("word " * 400))
    body = _problem(
        acme(
            "POST",
            f"/v1/sessions/{sid}/prompt",
            json={"max_prompt_tokens": 100, "reserve_output_tokens": 10},
        ),
        422,
        "budget-exceeded",
    )
    assert body["budget"] == 90 and body["required"] > 90 and body["blocking"]


def test_prompt_options_out_of_range_are_refused(acme: Api) -> None:
    sid = acme.session()
    acme.append(sid, user("hi"))
    path = f"/v1/sessions/{sid}/prompt"
    opts = {"max_prompt_tokens": 100, "reserve_output_tokens": 100}
    _problem(acme("POST", path, json=opts), 422, "invalid-parameter")
    _problem(acme("POST", path, json={"format": "xml"}), 422, "invalid-request")
    _problem(acme("POST", path, json={"encoding": "no-such"}), 422, "unknown-encoding")


def test_prompt_history_leaves_out_calls_still_waiting(acme: Api) -> None:
    sid = acme.session()
    acme.append(sid, user("go"), call("w"))
    msgs = acme("GET", f"/v1/sessions/{sid}/prompt").json()["messages"]
    assert [m["role"] for m in msgs] == ["user"]


# -- bad input: a problem, and nothing stored -----------------------------------------------------


def _state(api: Api, sid: str) -> tuple[Any, ...]:
    info = api("GET", f"/v1/sessions/{sid}").json()["session"]
    contents = [m["content"] for m in api.messages(sid)]
    return (api.count(), contents, info["next_seq"], info["pending"], info["revision"])


BAD_BODIES: list[tuple[str, str, Any, int, str]] = [
    # (method, path under the session, body, status, problem slug)
    ("POST", "/v1/sessions", {"agent_id": 7}, 422, "invalid-request"),
    ("POST", "/v1/sessions", {"agent_id": ""}, 422, "invalid-request"),
    ("POST", "/v1/sessions", {"agent_id": "a", "oops": 1}, 422, "invalid-request"),
    ("POST", "/v1/sessions", {"agent_id": "a", "session_id": "a/b"}, 422, "invalid-request"),
    ("POST", "/v1/sessions", [], 422, "invalid-request"),
    ("POST", "messages", {"messages": [{"role": "wizard", "content": "x"}]}, 422, "unknown-role"),
    ("POST", "messages", {"messages": [{"role": "user", "content": 42}]}, 422, "invalid-request"),
    ("POST", "messages", {"messages": [{"content": "no role"}]}, 422, "invalid-request"),
    ("POST", "messages", {"messages": [user("ok"), result("ghost")]}, 422, "orphan-tool-result"),
    ("POST", "messages", {"messages": [call("c"), user("early")]}, 422, "missing-tool-result"),
    ("POST", "messages", {"messages": "user: hi"}, 422, "invalid-request"),
    (
        "POST",
        "messages",
        {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
        422,
        "invalid-message",
    ),
    ("PUT", "messages/newest", {"messages": [user("x")]}, 422, "invalid-request"),
    ("PUT", "messages/newest", {"newest_id": "nope", "messages": []}, 409, "session-changed"),
    ("POST", "prompt", {"max_prompt_tokens": "many"}, 422, "invalid-request"),
]


@pytest.mark.parametrize(("method", "where", "body", "status", "slug"), BAD_BODIES)
def test_bad_bodies_are_problems_and_change_nothing(
    acme: Api, method: str, where: str, body: Any, status: int, slug: str
) -> None:
    sid = acme.session()
    acme.append(sid, user("keep me"))
    before = _state(acme, sid)
    path = where if where.startswith("/") else f"/v1/sessions/{sid}/{where}"
    r = acme(method, path, json=body)
    problem = _problem(r, status, slug)
    if slug == "orphan-tool-result":
        assert problem["index"] == 1 and problem["tool_call_id"] == "ghost"
    assert _state(acme, sid) == before


BODY_ROUTES = [
    ("POST", "/v1/sessions"),
    ("POST", "messages"),
    ("PUT", "messages/newest"),
    ("POST", "prompt"),
]


@pytest.mark.parametrize(("method", "where"), BODY_ROUTES)
def test_invalid_json_is_a_problem_and_changes_nothing(acme: Api, method: str, where: str) -> None:
    sid = acme.session()
    acme.append(sid, user("keep me"))
    before = _state(acme, sid)
    path = where if where.startswith("/") else f"/v1/sessions/{sid}/{where}"
    headers = {**acme.headers, "Content-Type": "application/json"}
    r = acme.client.request(method, path, content=b'{"messages": [', headers=headers)
    _problem(r, 422, "invalid-request")
    assert _state(acme, sid) == before


@pytest.mark.parametrize(("method", "where"), BODY_ROUTES)
def test_oversized_bodies_are_refused_before_parsing(acme: Api, method: str, where: str) -> None:
    sid = acme.session()
    acme.append(sid, user("keep me"))
    before = _state(acme, sid)
    path = where if where.startswith("/") else f"/v1/sessions/{sid}/{where}"
    big = json.dumps({"agent_id": "a", "messages": [user("x" * 70_000)]}).encode()
    body = _problem(acme(method, path, content=big), 413, "body-too-large")
    assert body["limit"] == 64 * 1024

    def chunks() -> Iterator[bytes]:  # no Content-Length: cut off as it arrives
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    _problem(acme(method, path, content=chunks()), 413, "body-too-large")
    assert _state(acme, sid) == before


@pytest.mark.parametrize(
    ("method", "where", "body"),
    [
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/messages", {"messages": [user("x")]}),
        ("GET", "/messages", None),
        ("POST", "/messages/pop", None),
        ("PUT", "/messages/newest", {"newest_id": "x", "messages": []}),
        ("GET", "/prompt", None),
        ("POST", "/prompt", {}),
    ],
)
def test_unknown_session_ids_are_404_on_every_route(
    acme: Api, method: str, where: str, body: Any
) -> None:
    _problem(acme(method, f"/v1/sessions/no-such{where}", json=body), 404, "session-not-found")
    assert acme.count() == 0


# -- tenant isolation -----------------------------------------------------------------------------


def _assert_isolated(acme: Api, globex: Api) -> None:
    """Everything acme holds is invisible to globex, on every route."""
    sid = acme.session("shared-agent", task_id="t", session_id="same-id-s1")
    acme.append(sid, *[user(f"m{i}") for i in range(8)])  # some trimmed to the archive
    mine = acme.session("shared-agent")
    assert globex.count() == 0
    assert globex("GET", "/v1/sessions").json()["sessions"] == []
    assert globex("GET", "/v1/sessions", params={"task_id": "t"}).json()["sessions"] == []
    assert globex("GET", "/v1/agents/shared-agent/latest").json()["session_id"] is None
    for other in (sid, mine):
        for method, where, body in [
            ("GET", "", None),
            ("GET", "/messages", None),
            ("POST", "/messages", {"messages": [user("intruder")]}),
            ("POST", "/messages/pop", None),
            ("PUT", "/messages/newest", {"newest_id": "x", "messages": []}),
            ("GET", "/prompt", None),
            ("POST", "/prompt", {}),
            ("DELETE", "", None),
        ]:
            r = globex(method, f"/v1/sessions/{other}{where}", json=body)
            _problem(r, 404, "session-not-found")
        assert globex("GET", f"/v1/sessions/{other}/exists").json()["exists"] is False
        assert globex("GET", f"/v1/sessions/{other}/archived").json()["messages"] == []
    assert globex("POST", "/v1/sweep").json() == {"evicted": [], "swept": 0}
    # globex may use the same ids for its own sessions, which acme never sees.
    theirs = globex.session("shared-agent", session_id="same-id-s1")
    globex.append(theirs, user("globex only"))
    assert [m["content"] for m in globex.messages(theirs)] == ["globex only"]
    assert [m["content"] for m in acme.messages(sid)] == [f"m{i}" for i in range(2, 8)]
    assert acme.count() == 2 and globex.count() == 1
    listed = {s["session_id"] for s in acme("GET", "/v1/sessions").json()["sessions"]}
    assert listed == {sid, mine}


def test_tenants_are_isolated_on_every_route(acme: Api, globex: Api) -> None:
    _assert_isolated(acme, globex)


def _isolation_on(url: str) -> None:
    app = create_app(url, config=CONFIG, max_open_tenants=1)  # managers closed and reopened
    with TestClient(app) as client:
        _assert_isolated(Api(client, _key(app, "acme")), Api(client, _key(app, "globex")))


@pytest.mark.redis
def test_tenants_are_isolated_on_redis(redis_url: str, redis_prefix_factory: Any) -> None:
    _isolation_on(f"{redis_url}?prefix={redis_prefix_factory()}")


@pytest.mark.postgres
def test_tenants_are_isolated_on_postgres(postgres_schema_factory: Callable[[], str]) -> None:
    import psycopg

    url = postgres_schema_factory()
    try:
        _isolation_on(url)
    finally:
        base = url.rsplit("search_path%3D", 1)[1]
        with psycopg.connect(url, autocommit=True) as conn:
            for tenant in ("acme", "globex"):
                conn.execute(f'DROP SCHEMA IF EXISTS "{base}_tenant_{tenant}" CASCADE')


def test_tenant_stores_are_derived_from_the_server_url() -> None:
    assert tenant_url("sqlite:////srv/ck.db", "acme") == "sqlite:////srv/ck.tenants/acme.db"
    assert tenant_url("redis://h:6379/0?prefix=p:", "acme") == (
        "redis://h:6379/0?prefix=p%3Atenant%3Aacme%3A"
    )
    assert tenant_url("redis://h:6379/0", "acme").endswith("prefix=ctxkeep%3Atenant%3Aacme%3A")
    pg = tenant_url("postgresql://u@h/db?options=-csearch_path%3Dbase", "acme")
    assert pg == "postgresql://u@h/db?options=-csearch_path%3Dbase_tenant_acme"
    with pytest.raises(ConfigError, match="invalid tenant name"):
        tenant_url("sqlite:////srv/ck.db", "../escape")


def test_the_pool_of_open_tenant_stores_is_bounded(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path}/srv.db", max_open_tenants=2)
    with TestClient(app) as client:
        apis = [Api(client, _key(app, f"t{i}")) for i in range(4)]
        sids = [api.session() for api in apis]
        for api, sid in zip(apis, sids, strict=True):
            api.append(sid, user(f"for {sid}"))
            assert app.state.ctxkeep.stores.open_count() <= 2
        for api, sid in zip(apis, sids, strict=True):  # reopened from their files
            assert [m["content"] for m in api.messages(sid)] == [f"for {sid}"]
    assert sorted(p.name for p in (tmp_path / "srv.tenants").iterdir() if p.suffix == ".db") == [
        "t0.db",
        "t1.db",
        "t2.db",
        "t3.db",
    ]


# -- access log -----------------------------------------------------------------------------------


def test_access_log_is_one_json_line_per_request_without_the_key(
    acme: Api, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        sid = acme.session()
        acme("GET", f"/v1/sessions/{sid}")
        client.get("/v1/stats")  # no key
        client.get("/healthz")
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    records = [json.loads(line) for line in lines]
    assert [(r["method"], r["path"], r["status"], r["tenant"]) for r in records] == [
        ("POST", "/v1/sessions", 201, "acme"),
        ("GET", "/v1/sessions/{session_id}", 200, "acme"),
        ("GET", "/v1/stats", 401, None),
        ("GET", "/healthz", 200, None),
    ]
    assert all(isinstance(r["duration_ms"], float) and r["duration_ms"] >= 0 for r in records)
    token = acme.headers["Authorization"].split()[1]
    assert all(token not in line and sid not in line for line in lines)


# -- OpenAPI --------------------------------------------------------------------------------------


def test_openapi_declares_problem_responses_and_response_schemas(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert "Problem" in doc["components"]["schemas"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            ok = [s for s in responses if s.startswith("2")]
            assert ok and "$ref" in json.dumps(responses[ok[0]]), (method, path)
            for status, response in responses.items():
                if status[0] in "45":
                    assert list(response["content"]) == [PROBLEM], (method, path, status)
            if path.startswith("/v1"):
                assert {"401", "422"} <= set(responses), (method, path)
                assert op["security"] == [{"HTTPBearer": []}]
            if "requestBody" in op:
                assert "413" in responses, (method, path)


# -- the client on a live server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    app = create_app(f"sqlite:///{tmp_path_factory.mktemp('live')}/srv.db")
    key = _key(app, "acme")
    server = ThreadedServer(app).start()
    yield server.url, key
    server.stop()


def test_remote_memory_maps_problems_to_ctxkeep_errors(live: tuple[str, str]) -> None:
    url, key = live
    with RemoteMemory(url, key) as mem:
        sid = mem.create_session("agent-remote")
        mem.add_message(sid, "user", "go")
        with pytest.raises(OrphanToolResultError) as info:
            mem.add_message(sid, "tool", "r", tool_call_id="ghost")
        assert info.value.index == 0 and info.value.tool_call_id == "ghost"
        with pytest.raises(SessionChangedError):
            mem.replace_newest(sid, [], newest_id="stale")
        with pytest.raises(SessionNotFoundError):
            mem.get_messages("no-such")
        assert mem.delete_session("no-such") is False
        with pytest.raises(BudgetExceededError) as budget:
            mem.add_message(sid, "user", "word " * 400)
            mem.build_prompt(sid, max_prompt_tokens=100, reserve_output_tokens=10)
        assert budget.value.budget == 90


def test_remote_memory_builds_prompts_on_the_server(live: tuple[str, str]) -> None:
    url, key = live
    with RemoteMemory(url, key) as mem:
        sid = mem.create_session("agent-prompt")
        mem.add_messages(sid, [{"role": "user", "content": "hello"}])
        prompt = mem.build_prompt(sid, system="be brief", format="anthropic")
        assert prompt.system is not None and prompt.system[0]["text"] == "be brief"
        assert prompt.report["prompt_tokens"] > 0


def test_remote_memory_refused_key_and_unreachable_server(live: tuple[str, str]) -> None:
    url, _ = live
    with RemoteMemory(url, "ck_000000000000_nope") as mem, pytest.raises(AuthenticationError):
        mem.session_count()
    with (
        RemoteMemory("http://127.0.0.1:9", "k", timeout=2) as mem,
        pytest.raises(RemoteError, match="failed"),
    ):
        mem.session_count()


def test_async_remote_memory_behaves_the_same(live: tuple[str, str]) -> None:
    url, key = live

    async def scenario() -> list[str]:
        async with AsyncRemoteMemory(url, key) as mem:
            sid = await mem.create_session("agent-async", task_id="t")
            await mem.add_message(sid, "user", "hi")
            with pytest.raises(OrphanToolResultError):
                await mem.add_message(sid, "tool", "x", tool_call_id="ghost")
            assert await mem.get_latest_session_for_agent("agent-async") == sid
            listed = await mem.list_sessions(agent_id="agent-async")
            assert [s.session_id for s in listed] == [sid]
            texts = [m.text for m in await mem.get_messages(sid)]
            assert await mem.delete_session(sid)
            assert not await mem.has_session(sid)
            return texts

    assert asyncio.run(scenario()) == ["hi"]

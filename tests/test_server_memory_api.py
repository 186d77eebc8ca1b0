"""The HTTP service's artifacts, episodes, checkpoints and context fabric: every endpoint,
tenant isolation on every route (memory, SQLite, PostgreSQL, Redis), and bad input answered
with a problem that leaves the stores as they were (FastAPI's TestClient, real stores).
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from conftest_services import postgres_schema_factory, postgres_url, redis_prefix_factory, redis_url
from ctxkeep.artifacts import artifact_ref
from ctxkeep.errors import ConfigError, StaleTaskStateError
from ctxkeep.server import create_app
from ctxkeep.server.problems import error_for
from ctxkeep.sessions.base import MemoryConfig
from test_server_api import PROBLEM, Api, _key, call, result, user

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

CONFIG = MemoryConfig(max_history=50, session_ttl=600, max_sessions=None)
LIMIT = 64 * 1024


def problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    """The problem details of ``r``, checked to be of ``slug`` with ``status``."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["type"] == f"urn:ctxkeep:problem:{slug}", body
    assert body["status"] == status and body["title"] and body["detail"]
    return body


def make_app(url: str, **kw: Any) -> FastAPI:
    return create_app(url, config=CONFIG, max_body_bytes=LIMIT, embedder="hash", **kw)


@pytest.fixture(params=["memory", "sqlite"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/srv.db"


@pytest.fixture
def app(url: str) -> FastAPI:
    return make_app(url)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


@pytest.fixture
def acme(app: FastAPI, client: TestClient) -> Api:
    return Api(client, _key(app, "acme"))


def stores(app: FastAPI, tenant: str = "acme") -> Any:
    """The tenant's stores, as the server holds them (to check what is stored)."""
    return app.state.ctxkeep.stores.lease_stores(tenant)


NEW_ROUTES: list[tuple[str, str]] = [
    ("POST", "/v1/artifacts"),
    ("GET", "/v1/artifacts/sha256:" + "0" * 64),
    ("POST", "/v1/episodes"),
    ("POST", "/v1/episodes/search"),
    ("GET", "/v1/episodes/e"),
    ("DELETE", "/v1/episodes/e"),
    ("DELETE", "/v1/episodes?session_id=s"),
    ("POST", "/v1/agents/a/checkpoints"),
    ("GET", "/v1/agents/a/checkpoints"),
    ("GET", "/v1/agents/a/checkpoints/latest"),
    ("GET", "/v1/checkpoints/c"),
    ("PUT", "/v1/fabric/agents/a/task"),
    ("GET", "/v1/fabric/agents/a/task"),
    ("PATCH", "/v1/fabric/agents/a/task"),
    ("POST", "/v1/fabric/agents/a/subscriptions"),
    ("POST", "/v1/fabric/messages"),
    ("POST", "/v1/fabric/agents/a/messages/receive"),
    ("POST", "/v1/fabric/agents/a/messages/ack"),
    ("POST", "/v1/fabric/agents/a/messages/recover"),
]


def test_every_new_route_needs_a_valid_key(client: TestClient) -> None:
    for method, path in NEW_ROUTES:
        for headers in ({}, {"Authorization": "Bearer ck_000000000000_nope"}):
            r = client.request(method, path, json={}, headers=headers)
            problem(r, 401, "unauthorized")
            assert r.headers["www-authenticate"].startswith("Bearer")


def test_the_openapi_document_lists_every_new_route(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    templates = {
        "/v1/artifacts/sha256:" + "0" * 64: "/v1/artifacts/{ref}",
        "/v1/episodes/e": "/v1/episodes/{episode_id}",
        "/v1/episodes?session_id=s": "/v1/episodes",
        "/v1/checkpoints/c": "/v1/checkpoints/{checkpoint_id}",
    }
    for method, path in NEW_ROUTES:
        template = templates.get(path, path.replace("/agents/a/", "/agents/{agent_id}/"))
        assert method.lower() in paths[template], (method, template)


# -- artifacts ------------------------------------------------------------------------------------


def test_an_artifact_is_stored_once_under_its_content_ref_and_read_back(acme: Api) -> None:
    text = "full tool output\n\u00e9\u4e2d\U0001f600 and a NUL \x00 byte"
    r = acme("POST", "/v1/artifacts", json={"text": text})
    assert r.status_code == 201, r.text
    ref = r.json()["ref"]
    assert ref == artifact_ref(text)
    assert acme("POST", "/v1/artifacts", json={"text": text}).json() == {"ref": ref}
    got = acme("GET", f"/v1/artifacts/{ref}")
    assert got.status_code == 200 and got.json() == {"ref": ref, "text": text}


@pytest.mark.parametrize("ref", ["sha256:" + "0" * 64, "sha256:" + "A" * 64, "..etc", "x"])
def test_unknown_or_malformed_artifact_refs_are_404(acme: Api, ref: str) -> None:
    problem(acme("GET", f"/v1/artifacts/{ref}"), 404, "artifact-not-found")


def test_every_artifact_ref_of_a_prompt_report_can_be_fetched(acme: Api) -> None:
    sid = acme.session()
    outputs = [f"output {i} line\n" * 200 for i in range(3)]
    acme.append(sid, user("task"))
    for i, out in enumerate(outputs):
        acme.append(sid, call(f"p{i}"), result(f"p{i}", out))
    acme.append(sid, user("and now?"))
    r = acme(
        "POST",
        f"/v1/sessions/{sid}/prompt",
        json={"max_prompt_tokens": 900, "reserve_output_tokens": 100, "preserve_last_n": 2},
    )
    assert r.status_code == 200, r.text
    refs = [d["artifact_ref"] for d in r.json()["report"]["prune"]["decisions"]]
    fetched = {}
    for ref in filter(None, refs):
        got = acme("GET", f"/v1/artifacts/{ref}")
        assert got.status_code == 200, got.text
        fetched[ref] = got.json()["text"]
    assert fetched and set(fetched.values()) <= set(outputs)
    assert all(artifact_ref(text) == ref for ref, text in fetched.items())


# -- episodes -------------------------------------------------------------------------------------

EPISODES = [
    ("s1", "fix the build", "the linker failed on libfoo; pinned libfoo 1.2", {"lang": "c"}),
    ("s1", "fix the build", "tests passed after the pin", {"lang": "c"}),
    ("s2", "plan a trip", "booked a train to Lyon for the conference", {"lang": "en"}),
    ("s3", "write docs", "documented the retry policy of the client", {"lang": "en"}),
]


def save_episodes(api: Api, agent: str = "agent-1") -> list[dict[str, Any]]:
    out = []
    for i, (sid, goal, summary, meta) in enumerate(EPISODES):
        body = {
            "session_id": sid,
            "task_goal": goal,
            "summary": summary,
            "metadata": meta,
            "agent_id": agent,
            "created_at": 1_700_000_000 + i,
        }
        r = api("POST", "/v1/episodes", json=body)
        assert r.status_code == 201, r.text
        out.append(r.json()["episode"])
    return out


def test_save_get_and_deduplicate_an_episode(acme: Api) -> None:
    saved = save_episodes(acme)
    first = saved[0]
    assert set(first) >= {"id", "session_id", "task_goal", "summary", "created_at", "metadata"}
    assert (first["session_id"], first["metadata"], first["created_at"]) == (
        "s1",
        {"lang": "c"},
        1_700_000_000.0,
    )
    assert acme("GET", f"/v1/episodes/{first['id']}").json() == {"episode": first}
    again = acme(
        "POST",
        "/v1/episodes",
        json={"session_id": "s1", "task_goal": "fix the build", "summary": EPISODES[0][2]},
    )
    assert again.status_code == 201 and again.json()["episode"]["id"] == first["id"]


def test_search_finds_the_relevant_episode_within_filters(acme: Api) -> None:
    saved = save_episodes(acme)
    r = acme("POST", "/v1/episodes/search", json={"query": "linker libfoo pinned"})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert 1 <= len(hits) <= 5 and hits[0]["episode"] == saved[0]
    assert all(isinstance(h["score"], float) for h in hits)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    scoped = acme(
        "POST",
        "/v1/episodes/search",
        json={"query": "linker", "top_k": 10, "filters": {"metadata": {"lang": "en"}}},
    ).json()["hits"]
    assert {h["episode"]["session_id"] for h in scoped} == {"s2", "s3"}
    recent = acme(
        "POST",
        "/v1/episodes/search",
        json={"query": "x", "top_k": 10, "filters": {"since": 1_700_000_002, "session_id": "s3"}},
    ).json()["hits"]
    assert [h["episode"]["id"] for h in recent] == [saved[3]["id"]]


def test_forget_one_episode_or_a_sessions(acme: Api, app: FastAPI) -> None:
    saved = save_episodes(acme)
    one = saved[2]["id"]
    assert acme("DELETE", f"/v1/episodes/{one}").json() == {"deleted": 1}
    problem(acme("GET", f"/v1/episodes/{one}"), 404, "episode-not-found")
    problem(acme("DELETE", f"/v1/episodes/{one}"), 404, "episode-not-found")
    assert acme("DELETE", "/v1/episodes", params={"session_id": "s1"}).json() == {"deleted": 2}
    assert acme("DELETE", "/v1/episodes", params={"agent_id": "nobody"}).json() == {"deleted": 0}
    problem(acme("DELETE", "/v1/episodes"), 422, "invalid-parameter")
    with stores(app) as s:
        assert s.episodic().count() == 1


BAD_SEARCHES: list[dict[str, Any]] = [
    {"query": "x", "filters": {"metadata": "lang"}},
    {"query": "x", "filters": {"since": "yesterday"}},
    {"query": "x", "filters": {"colour": "red"}},
    {"query": "x", "filters": {"session_id": [1, 2]}},
    {"query": "x", "top_k": 0},
    {"query": "x", "top_k": "many"},
    {"query": 42},
    {},
]


def test_bad_searches_are_problems(acme: Api) -> None:
    for body in BAD_SEARCHES:
        problem(acme("POST", "/v1/episodes/search", json=body), 422, "invalid-request")


# -- checkpoints ----------------------------------------------------------------------------------


def test_save_history_latest_and_load_checkpoints(acme: Api) -> None:
    ids = []
    for step in range(3):
        state = {"schema_version": 1, "decision": f"step {step}", "working_memory": {"n": step}}
        r = acme(
            "POST",
            "/v1/agents/planner/checkpoints",
            json={"state": state, "task_id": "t", "metadata": {"step": step}},
        )
        assert r.status_code == 201, r.text
        cp = r.json()["checkpoint"]
        assert (cp["agent_id"], cp["seq"], cp["task_id"]) == ("planner", step + 1, "t")
        ids.append(cp["checkpoint_id"])
    page = acme("GET", "/v1/agents/planner/checkpoints", params={"limit": 2}).json()
    assert [c["checkpoint_id"] for c in page["checkpoints"]] == ids[::-1][:2]
    assert page["next_offset"] == 2
    rest = acme("GET", "/v1/agents/planner/checkpoints", params={"limit": 2, "offset": 2}).json()
    assert [c["checkpoint_id"] for c in rest["checkpoints"]] == [ids[0]]
    assert rest["next_offset"] is None
    latest = acme("GET", "/v1/agents/planner/checkpoints/latest").json()
    assert latest["checkpoint"]["checkpoint_id"] == ids[2]
    assert latest["checkpoint"]["state"]["decision"] == "step 2"
    loaded = acme("GET", f"/v1/checkpoints/{ids[0]}").json()["checkpoint"]
    assert loaded["metadata"] == {"step": 0} and loaded["state"]["working_memory"] == {"n": 0}
    assert acme("GET", "/v1/agents/nobody/checkpoints/latest").json() == {
        "agent_id": "nobody",
        "checkpoint": None,
    }
    assert acme("GET", "/v1/agents/nobody/checkpoints").json()["checkpoints"] == []
    problem(acme("GET", "/v1/checkpoints/no-such"), 404, "checkpoint-not-found")


def test_checkpoint_state_round_trips_tagged_values_and_old_versions_are_upgraded(
    acme: Api,
) -> None:
    tagged = {
        "schema_version": 1,
        "tool_state": {"__ctxkeep__": "tuple", "items": [1, "a"]},
        "observation": {"__ctxkeep__": "bytes", "b64": base64.b64encode(b"\x00\xff").decode()},
    }
    private = {"seen": {"__ctxkeep__": "set", "items": [1, 2]}}
    r = acme("POST", "/v1/agents/a/checkpoints", json={"state": tagged, "private": private})
    assert r.status_code == 201, r.text
    cp = r.json()["checkpoint"]
    assert cp["state"]["tool_state"] == tagged["tool_state"]
    assert cp["state"]["observation"] == tagged["observation"]
    assert cp["private"] == private
    legacy = {"memory": ["fact"], "tools": {"k": 1}}  # version 0: no schema_version
    up = acme("POST", "/v1/agents/a/checkpoints", json={"state": legacy}).json()["checkpoint"]
    assert up["state"]["schema_version"] == 1
    assert (up["state"]["working_memory"], up["state"]["tool_state"]) == (["fact"], {"k": 1})


BAD_CHECKPOINTS: list[tuple[Any, str]] = [
    ({"state": {"schema_version": 99, "decision": "x"}}, "state-schema-version"),
    ({"state": {"schema_version": 1, "mood": "unknown field"}}, "state-schema-version"),
    ({"state": {"schema_version": 1, "tool_state": {"__ctxkeep__": "nope"}}}, "invalid-type"),
    ({"state": {}, "private": {"__ctxkeep__": "bytes", "b64": "!!"}}, "invalid-type"),
    ({"state": "not an object"}, "invalid-request"),
    ({"state": {}, "private": []}, "invalid-request"),
    ({"state": {}, "colour": "red"}, "invalid-request"),
    ({"state": {}, "task_id": ""}, "invalid-request"),
]


def test_bad_checkpoints_are_problems_and_store_nothing(acme: Api, app: FastAPI) -> None:
    for body, slug in BAD_CHECKPOINTS:
        problem(acme("POST", "/v1/agents/a/checkpoints", json=body), 422, slug)
        with stores(app) as s:
            assert s.checkpoints().history("a") == [], body


# -- the fabric -----------------------------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def api(request: pytest.FixtureRequest) -> Iterator[Api]:
    """A tenant of a server whose fabric is in process (memory) or in Redis."""
    if request.param == "redis":
        redis = request.getfixturevalue("redis_url")
        url = f"{redis}?prefix={request.getfixturevalue('redis_prefix_factory')()}"
    else:
        url = "memory://"
    app = make_app(url)
    with TestClient(app) as client:
        yield Api(client, _key(app, "acme"))


def join(api: Api, agent: str, task: str, state: dict[str, Any] | None = None) -> Any:
    return api(
        "PUT", f"/v1/fabric/agents/{agent}/task", json={"task_id": task, "state": state or {}}
    )


def test_task_state_is_joined_read_and_changed_by_compare_and_set(api: Api) -> None:
    r = join(api, "a1", "t1", {"goal": "ship"})
    assert r.status_code == 200, r.text
    assert r.json() == {"agent_id": "a1", "task_id": "t1", "version": 1, "state": {"goal": "ship"}}
    assert join(api, "a2", "t1", {"goal": "ship"}).json()["version"] == 1  # repeats: fine
    stale = problem(join(api, "a3", "t1", {"goal": "other"}), 409, "stale-task-state")
    assert (stale["task_id"], stale["current"]) == ("t1", 1)
    assert isinstance(error_for(stale), StaleTaskStateError)
    problem(api("GET", "/v1/fabric/agents/a3/task"), 404, "unknown-agent")  # refused: not bound
    patched = api(
        "PATCH",
        "/v1/fabric/agents/a2/task",
        json={"changes": {"eta": [1, 2]}, "expected_version": 1},
    )
    assert patched.json()["version"] == 2 and patched.json()["state"] == {
        "goal": "ship",
        "eta": [1, 2],
    }
    assert api("GET", "/v1/fabric/agents/a1/task").json()["state"]["eta"] == [1, 2]
    late = api(
        "PATCH", "/v1/fabric/agents/a1/task", json={"changes": {"x": 1}, "expected_version": 1}
    )
    assert problem(late, 409, "stale-task-state")["expected"] == 1
    assert api("GET", "/v1/fabric/agents/a1/task").json()["version"] == 2


def test_bus_delivers_topics_within_the_task_and_direct_messages_until_acked(
    api: Api,
) -> None:
    for agent, task in (("a", "t"), ("b", "t"), ("c", "t"), ("x", "other")):
        assert join(api, agent, task).status_code == 200
    for agent in ("b", "x"):
        r = api("POST", f"/v1/fabric/agents/{agent}/subscriptions", json={"topic": "news"})
        assert r.status_code == 201 and r.json() == {"agent_id": agent, "topic": "news"}
    sent = api(
        "POST", "/v1/fabric/messages", json={"sender": "a", "topic": "news", "payload": {"n": 1}}
    )
    assert sent.status_code == 201, sent.text
    message = sent.json()["message"]
    assert (message["task_id"], message["payload"]) == ("t", {"n": 1})
    direct = api(
        "POST", "/v1/fabric/messages", json={"sender": "b", "recipient": "a", "payload": [1]}
    )
    assert direct.status_code == 201

    def receive(agent: str) -> list[dict[str, Any]]:
        r = api("POST", f"/v1/fabric/agents/{agent}/messages/receive", json={})
        assert r.status_code == 200, r.text
        return list(r.json()["messages"])

    assert [m["id"] for m in receive("b")] == [message["id"]]
    assert receive("c") == [] and receive("x") == []  # not subscribed / another task
    got = receive("a")
    assert [(m["sender"], m["payload"]) for m in got] == [("b", [1])]
    assert receive("a") == []  # pending, not delivered twice
    assert api("POST", "/v1/fabric/agents/a/messages/recover").json() == {"pending": 1}
    assert [m["id"] for m in receive("a")] == [got[0]["id"]]  # redelivered
    acked = api("POST", "/v1/fabric/agents/a/messages/ack", json={"ids": [got[0]["id"]]})
    assert acked.json() == {"acked": 1}
    assert api("POST", "/v1/fabric/agents/a/messages/recover").json() == {"pending": 0}
    assert receive("a") == []


def test_task_state_that_json_cannot_hold_is_refused_and_changes_nothing(api: Api) -> None:
    headers = {**api.headers, "Content-Type": "application/json"}
    body = b'{"task_id": "t", "state": {"x": NaN}}'
    r = api.client.put("/v1/fabric/agents/a/task", content=body, headers=headers)
    problem(r, 422, "invalid-type")
    problem(api("GET", "/v1/fabric/agents/a/task"), 404, "unknown-agent")
    join(api, "a", "t", {"x": 1})
    body = b'{"changes": {"x": Infinity}, "expected_version": 1}'
    r = api.client.patch("/v1/fabric/agents/a/task", content=body, headers=headers)
    problem(r, 422, "invalid-type")
    assert api("GET", "/v1/fabric/agents/a/task").json()["state"] == {"x": 1}


UNKNOWN_AGENT_ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/v1/fabric/agents/ghost/task", None),
    ("PATCH", "/v1/fabric/agents/ghost/task", {"changes": {}, "expected_version": 0}),
    ("POST", "/v1/fabric/agents/ghost/subscriptions", {"topic": "news"}),
    ("POST", "/v1/fabric/messages", {"sender": "ghost", "recipient": "a", "payload": 1}),
    ("POST", "/v1/fabric/agents/ghost/messages/receive", {}),
    ("POST", "/v1/fabric/agents/ghost/messages/ack", {"ids": ["m"]}),
    ("POST", "/v1/fabric/agents/ghost/messages/recover", None),
]


def test_an_agent_that_joined_no_task_is_404_on_every_fabric_route(acme: Api) -> None:
    for method, path, body in UNKNOWN_AGENT_ROUTES:
        problem(acme(method, path, json=body), 404, "unknown-agent")


MALFORMED_MESSAGES: list[tuple[dict[str, Any], str]] = [
    ({"sender": "a", "recipient": "b", "topic": "t", "payload": 1}, "invalid-message"),
    ({"sender": "a", "payload": 1}, "invalid-message"),
    ({"sender": "a", "recipient": "b"}, "invalid-request"),
    ({"sender": "", "recipient": "b", "payload": 1}, "invalid-request"),
]


def test_malformed_messages_are_problems_and_deliver_nothing(acme: Api) -> None:
    join(acme, "a", "t")
    join(acme, "b", "t")
    acme("POST", "/v1/fabric/agents/b/subscriptions", json={"topic": "t"})
    for body, slug in MALFORMED_MESSAGES:
        problem(acme("POST", "/v1/fabric/messages", json=body), 422, slug)
    assert acme("POST", "/v1/fabric/agents/b/messages/receive", json={}).json()["messages"] == []


# -- bad bodies on every new route: a problem, and nothing stored ---------------------------------

BODY_ROUTES: list[tuple[str, str]] = [
    ("POST", "/v1/artifacts"),
    ("POST", "/v1/episodes"),
    ("POST", "/v1/episodes/search"),
    ("POST", "/v1/agents/a/checkpoints"),
    ("PUT", "/v1/fabric/agents/a/task"),
    ("PATCH", "/v1/fabric/agents/a/task"),
    ("POST", "/v1/fabric/agents/a/subscriptions"),
    ("POST", "/v1/fabric/messages"),
    ("POST", "/v1/fabric/agents/a/messages/receive"),
    ("POST", "/v1/fabric/agents/a/messages/ack"),
]

WRONG_TYPES: dict[str, dict[str, Any]] = {
    "/v1/artifacts": {"text": ["not", "text"]},
    "/v1/episodes": {"session_id": "s", "task_goal": 1, "summary": "x"},
    "/v1/episodes/search": {"query": "x", "filters": []},
    "/v1/agents/a/checkpoints": {"state": {}, "metadata": "m"},
    "PUT /v1/fabric/agents/a/task": {"task_id": 7},
    "PATCH /v1/fabric/agents/a/task": {"changes": {"k": 1}, "expected_version": "one"},
    "/v1/fabric/agents/a/subscriptions": {"topic": None},
    "/v1/fabric/messages": {"sender": "a", "recipient": 5, "payload": 1},
    "/v1/fabric/agents/a/messages/receive": {"max_messages": "all"},
    "/v1/fabric/agents/a/messages/ack": {"ids": "m1"},
}


def snapshot(api: Api, app: FastAPI) -> tuple[Any, ...]:
    """What the tenant holds, as far as the bodies below could change it."""
    with stores(app) as s:
        held = (
            s.episodic().count(),
            [c.checkpoint_id for c in s.checkpoints().history("a")],
            artifact_ref("kept") in s.artifacts(),
            artifact_ref("x" * 70_000) in s.artifacts(),
        )
    task = api("GET", "/v1/fabric/agents/a/task").json()
    pending = api("POST", "/v1/fabric/agents/b/messages/recover").json()
    return (*held, task, pending)


@pytest.fixture
def seeded(acme: Api) -> Api:
    """acme with one of each record: an artifact, an episode, a checkpoint, a task, a bus."""
    acme("POST", "/v1/artifacts", json={"text": "kept"})
    acme("POST", "/v1/episodes", json={"session_id": "s", "task_goal": "g", "summary": "kept"})
    acme("POST", "/v1/agents/a/checkpoints", json={"state": None})
    join(acme, "a", "t", {"k": "v"})
    join(acme, "b", "t")
    return acme


@pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
def test_invalid_json_wrong_types_and_oversized_bodies_are_problems_and_store_nothing(
    seeded: Api, app: FastAPI, method: str, path: str
) -> None:
    api = seeded
    before = snapshot(api, app)
    headers = {**api.headers, "Content-Type": "application/json"}
    for broken in (b'{"text": "x", ', b'{"text": "\xff\xfe"}'):  # cut off; not UTF-8
        r = api.client.request(method, path, content=broken, headers=headers)
        problem(r, 422, "invalid-request")
    wrong = WRONG_TYPES.get(f"{method} {path}", WRONG_TYPES.get(path))
    problem(api(method, path, json=wrong), 422, "invalid-request")
    problem(api(method, path, json=[]), 422, "invalid-request")
    big = json.dumps({"text": "x" * 70_000, "summary": "x" * 70_000}).encode()
    assert problem(api(method, path, content=big), 413, "body-too-large")["limit"] == LIMIT

    def chunks() -> Iterator[bytes]:  # no Content-Length: cut off as it arrives
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    problem(api(method, path, content=chunks()), 413, "body-too-large")
    assert snapshot(api, app) == before


# -- tenant isolation -----------------------------------------------------------------------------


def assert_isolated(app: FastAPI, acme: Api, globex: Api, *, episodes: bool = True) -> None:
    """Nothing acme holds is visible to globex, or changed by it, on any route."""
    ref = acme("POST", "/v1/artifacts", json={"text": "acme's secret output"}).json()["ref"]
    cp = acme("POST", "/v1/agents/shared/checkpoints", json={"state": {"decision": "acme"}})
    cid = cp.json()["checkpoint"]["checkpoint_id"]
    assert join(acme, "shared", "t", {"owner": "acme"}).status_code == 200
    join(acme, "peer", "t")
    acme("POST", "/v1/fabric/agents/peer/subscriptions", json={"topic": "news"})

    problem(globex("GET", f"/v1/artifacts/{ref}"), 404, "artifact-not-found")
    problem(globex("GET", f"/v1/checkpoints/{cid}"), 404, "checkpoint-not-found")
    assert globex("GET", "/v1/agents/shared/checkpoints/latest").json()["checkpoint"] is None
    assert globex("GET", "/v1/agents/shared/checkpoints").json()["checkpoints"] == []
    for method, path, body in UNKNOWN_AGENT_ROUTES:
        problem(globex(method, path.replace("ghost", "shared"), json=body), 404, "unknown-agent")
    # globex's own agents with the same names live in globex's fabric only
    assert join(globex, "shared", "t", {"owner": "globex"}).json()["version"] == 1
    globex("POST", "/v1/fabric/messages", json={"sender": "shared", "topic": "news", "payload": 1})
    globex(
        "POST", "/v1/fabric/messages", json={"sender": "shared", "recipient": "peer", "payload": 2}
    )
    assert acme("POST", "/v1/fabric/agents/peer/messages/receive", json={}).json()["messages"] == []
    assert acme("GET", "/v1/fabric/agents/shared/task").json()["state"] == {"owner": "acme"}
    mine = globex("POST", "/v1/agents/shared/checkpoints", json={"state": None}).json()
    assert mine["checkpoint"]["seq"] == 1
    assert acme("GET", f"/v1/checkpoints/{cid}").json()["checkpoint"]["seq"] == 1
    assert acme("GET", f"/v1/artifacts/{ref}").json()["text"] == "acme's secret output"

    if not episodes:
        for api in (acme, globex):
            r = api("POST", "/v1/episodes/search", json={"query": "x"})
            assert "not available" in problem(r, 501, "not-available")["detail"]
        return
    saved = save_episodes(acme)
    eid = saved[0]["id"]
    problem(globex("GET", f"/v1/episodes/{eid}"), 404, "episode-not-found")
    problem(globex("DELETE", f"/v1/episodes/{eid}"), 404, "episode-not-found")
    for query in ("linker libfoo pinned", "", "trip Lyon train"):
        r = globex("POST", "/v1/episodes/search", json={"query": query, "top_k": 100})
        assert r.status_code == 200 and r.json()["hits"] == []
    for filters in ({"episode_id": eid}, {"session_id": "s1"}, {"agent_id": "agent-1"}):
        r = globex("POST", "/v1/episodes/search", json={"query": "linker", "filters": filters})
        assert r.json()["hits"] == []
    assert globex("DELETE", "/v1/episodes", params={"session_id": "s1"}).json()["deleted"] == 0
    assert globex("DELETE", "/v1/episodes", params={"agent_id": "agent-1"}).json()["deleted"] == 0
    theirs = save_episodes(globex)  # the same content is globex's own episode
    assert {e["id"] for e in theirs}.isdisjoint(e["id"] for e in saved)
    hits = acme("POST", "/v1/episodes/search", json={"query": "linker", "top_k": 100}).json()
    assert {h["episode"]["id"] for h in hits["hits"]} == {e["id"] for e in saved}
    with stores(app, "acme") as s:
        assert s.episodic().count() == len(EPISODES)


def test_tenants_are_isolated_on_every_new_route(app: FastAPI, client: TestClient) -> None:
    assert_isolated(app, Api(client, _key(app, "acme")), Api(client, _key(app, "globex")))


def isolation_on(url: str, *, episodes: bool = True) -> None:
    app = make_app(url, max_open_tenants=1)  # stores closed and reopened between tenants
    with TestClient(app) as client:
        acme, globex = Api(client, _key(app, "acme")), Api(client, _key(app, "globex"))
        assert_isolated(app, acme, globex, episodes=episodes)


@pytest.mark.redis
def test_tenants_are_isolated_on_redis_where_episodes_are_not_available(
    redis_url: str, redis_prefix_factory: Any
) -> None:
    # ttl_grace is the session store's own parameter: the other stores must not choke on it
    isolation_on(f"{redis_url}?prefix={redis_prefix_factory()}&ttl_grace=5", episodes=False)


@pytest.mark.postgres
def test_tenants_are_isolated_on_postgres(postgres_schema_factory: Callable[[], str]) -> None:
    import psycopg

    url = postgres_schema_factory()
    base = url.rsplit("search_path%3D", 1)[1]
    try:
        isolation_on(url)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            for tenant in ("acme", "globex"):
                conn.execute(f'DROP SCHEMA IF EXISTS "{base}_tenant_{tenant}" CASCADE')
            conn.execute("DROP SCHEMA IF EXISTS ctxkeep_extensions CASCADE")


# -- ctxkeep serve --embedder ---------------------------------------------------------------------


def test_serve_takes_the_episodic_embedder_from_the_command_line(tmp_path: Path) -> None:
    from _server import start_serve
    from ctxkeep.server.keys import open_key_registry

    db = f"sqlite:///{tmp_path}/srv.db"
    registry = open_key_registry(db)
    token = registry.create("acme")[1]
    registry.close()
    proc, base = start_serve(
        "--db", db, "--embedder", "hash", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        headers = {"Authorization": f"Bearer {token}"}
        body = {"session_id": "s", "task_goal": "deploy", "summary": "rolled back the canary"}
        saved = httpx.post(f"{base}/v1/episodes", json=body, headers=headers)
        assert saved.status_code == 201, saved.text
        found = httpx.post(
            f"{base}/v1/episodes/search", json={"query": "canary rollback"}, headers=headers
        )
        assert [h["episode"]["id"] for h in found.json()["hits"]] == [saved.json()["episode"]["id"]]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # the tenant's file records the embedder its vectors came from
    from ctxkeep.episodic import open_episodic

    with open_episodic(f"sqlite:///{tmp_path}/srv.tenants/acme.db", embedder="hash") as store:
        assert store.count() == 1


def test_an_unknown_embedder_is_refused_when_the_app_is_made() -> None:
    with pytest.raises(ConfigError, match="unknown embedder 'nope'"):
        create_app("memory://", embedder="nope")


def test_an_embedder_not_installed_is_a_501_naming_its_extra_never_a_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ctxkeep.episodic import embedders
    from ctxkeep.errors import MissingDependencyError

    def missing() -> Any:
        raise MissingDependencyError("wordllama", "static")

    monkeypatch.setitem(embedders.EMBEDDERS, "wordllama", missing)
    app = create_app(f"sqlite:///{tmp_path}/srv.db", config=CONFIG, embedder="local")
    with TestClient(app) as client:
        api = Api(client, _key(app, "acme"))
        body = {"session_id": "s", "task_goal": "g", "summary": "s", "metadata": {}}
        search = {"query": "g"}
        for r in (
            api("POST", "/v1/episodes", json=body),
            api("POST", "/v1/episodes/search", json=search),
        ):
            assert r.status_code == 501, r.text
            problem = r.json()
            assert problem["type"].endswith("missing-dependency")
            assert "wordllama" in problem["detail"] and "ctxkeep[static]" in problem["detail"]
        # The rest of the service works.
        assert api("POST", "/v1/sessions", json={"agent_id": "a"}).status_code == 201

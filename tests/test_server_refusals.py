"""Refusals the hostile-input suite found storing something or failing on PostgreSQL (issue
25), each as a specification: a prompt build refused on the way stores none of the artifacts
it compressed, and an id beyond ``MAX_ID_LENGTH`` is a 422 on every route that takes one.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ctxkeep.server import create_app
from ctxkeep.server.keys import sqlite_path
from ctxkeep.server.models import MAX_ID_LENGTH

PROBLEM = "application/problem+json"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Any]:
    app = create_app(f"sqlite:///{tmp_path}/server.db", embedder="hash")
    with TestClient(app) as client:
        key = app.state.ctxkeep.keys.create("acme")[1]
        client.headers["Authorization"] = f"Bearer {key}"
        yield client, app


def _session_with_long_outputs(client: Any) -> str:
    sid = str(client.post("/v1/sessions", json={"agent_id": "a"}).json()["session"]["session_id"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    for i in range(3):
        call = {"id": f"c{i}", "name": "f", "arguments": "{}"}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "line\n" * 400})
    messages.append({"role": "user", "content": "and now?"})
    r = client.post(f"/v1/sessions/{sid}/messages", json={"messages": messages})
    assert r.status_code == 201, r.text
    return sid


def _artifacts(app: Any) -> int:
    """The artifacts the tenant's SQLite file holds."""
    path = sqlite_path(app.state.ctxkeep.stores.store_url("acme"))
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT count(*) FROM ctxkeep_artifacts").fetchone()[0])


def test_a_refused_prompt_build_stores_none_of_its_compressed_outputs(api: Any) -> None:
    client, app = api
    sid = _session_with_long_outputs(client)
    options = {"max_prompt_tokens": 700, "reserve_output_tokens": 100, "preserve_last_n": 1}
    r = client.post(f"/v1/sessions/{sid}/prompt", json={**options, "system": "rule " * 2000})
    assert r.status_code == 422 and r.json()["type"].endswith("budget-exceeded"), r.text
    assert _artifacts(app) == 0
    r = client.post(f"/v1/sessions/{sid}/prompt", json=options)
    assert r.status_code == 200, r.text
    refs = {d["artifact_ref"] for d in r.json()["report"]["prune"]["decisions"]} - {None}
    assert refs and _artifacts(app) == len(refs)
    for ref in refs:
        assert client.get(f"/v1/artifacts/{ref}").status_code == 200


TOO_LONG = "x" * (MAX_ID_LENGTH + 1)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/sessions", {"agent_id": TOO_LONG}),
        ("POST", "/v1/sessions", {"agent_id": "a", "task_id": TOO_LONG}),
        ("POST", "/v1/sessions", {"agent_id": "a", "session_id": TOO_LONG}),
        ("GET", f"/v1/sessions/{TOO_LONG}", None),
        ("POST", f"/v1/agents/{TOO_LONG}/checkpoints", {"state": None}),
        ("POST", "/v1/agents/a/checkpoints", {"state": None, "task_id": TOO_LONG}),
        ("POST", "/v1/episodes", {"session_id": TOO_LONG, "task_goal": "g", "summary": "s"}),
        ("PUT", f"/v1/fabric/agents/{TOO_LONG}/task", {"task_id": "t"}),
        ("PUT", "/v1/fabric/agents/a/task", {"task_id": TOO_LONG}),
    ],
)
def test_an_id_longer_than_the_limit_is_refused(
    api: Any, method: str, path: str, body: dict[str, Any] | None
) -> None:
    client, _ = api
    r = client.request(method, path, json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith(PROBLEM)


def test_a_message_id_longer_than_the_limit_or_with_nul_is_refused(api: Any) -> None:
    client, _ = api
    sid = client.post("/v1/sessions", json={"agent_id": "a"}).json()["session"]["session_id"]
    for bad in (TOO_LONG, "a\x00b"):
        message = {"role": "user", "content": "hi", "id": bad}
        r = client.post(f"/v1/sessions/{sid}/messages", json={"messages": [message]})
        assert r.status_code == 422 and r.json()["type"].endswith("invalid-message"), r.text
    ok = {"role": "user", "content": "hi", "id": "x" * MAX_ID_LENGTH}
    assert client.post(f"/v1/sessions/{sid}/messages", json={"messages": [ok]}).status_code == 201
    assert client.get(f"/v1/sessions/{sid}/messages").json()["total"] == 1

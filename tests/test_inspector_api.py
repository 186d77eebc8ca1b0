"""The inspector's routes: ``/v1/inspect/...`` (composition, steps, the session's window, the
tenant, the relevant episodes), the page and its files (FastAPI's TestClient, real stores, the
real builder).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from ctxkeep.artifacts import artifact_ref
from ctxkeep.server import create_app
from ctxkeep.server.inspector import CONTENT_SECURITY_POLICY
from ctxkeep.tokens import get_counter

PROBLEM = "application/problem+json"
STATIC = Path(__file__).parents[1] / "src" / "ctxkeep" / "server" / "static"


class Api:
    """One tenant's view of the service."""

    def __init__(self, client: TestClient, key: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        return self.client.request(method, path, headers=self.headers, **kw)

    def ok(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        r = self(method, path, **kw)
        assert r.status_code in (200, 201), r.text
        body: dict[str, Any] = r.json()
        return body

    def session(self, *messages: dict[str, Any], agent: str = "agent") -> str:
        sid = str(
            self.ok("POST", "/v1/sessions", json={"agent_id": agent})["session"]["session_id"]
        )
        if messages:
            self.ok("POST", f"/v1/sessions/{sid}/messages", json={"messages": list(messages)})
        return sid


BOTH = pytest.mark.parametrize("app", ["memory", "sqlite"], indirect=True)
"""Run a test against a server over memory:// and over SQLite (the others: memory:// only)."""


@pytest.fixture
def app(request: pytest.FixtureRequest, tmp_path: Path) -> FastAPI:
    kind = getattr(request, "param", "memory")
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp_path}/srv.db"
    return create_app(url, embedder="hash")


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as c:
        yield c


def _api(app: FastAPI, client: TestClient, tenant: str) -> Api:
    return Api(client, str(app.state.ctxkeep.keys.create(tenant)[1]))


@pytest.fixture
def acme(app: FastAPI, client: TestClient) -> Api:
    return _api(app, client, "acme")


@pytest.fixture
def globex(app: FastAPI, client: TestClient) -> Api:
    return _api(app, client, "globex")


def output(n: int) -> str:
    """A long tool output (about 3,600 tokens): the pruner compresses it once it is old."""
    return "\n".join(
        f"line {i} of file {n}: " + "lorem ipsum dolor sit amet " * 3 for i in range(150)
    )


def history(turns: int = 4) -> list[dict[str, Any]]:
    """A system message, then per turn: a question, a tool call, its long output, an answer."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent."}]
    for t in range(turns):
        out += [
            {"role": "user", "content": f"step {t}: read file {t}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{t}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"n": t})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{t}", "content": output(t)},
            {"role": "assistant", "content": f"file {t} read"},
        ]
    return out


def _problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["type"] == f"urn:ctxkeep:problem:{slug}", body
    return body


def _composition(api: Api, sid: str, **query: Any) -> dict[str, Any]:
    return api.ok("GET", f"/v1/inspect/sessions/{sid}/composition", params=query)


def _steps(api: Api, sid: str, **query: Any) -> dict[str, Any]:
    return api.ok("GET", f"/v1/inspect/sessions/{sid}/steps", params=query)


def _without_session(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "session_id"}


# -- composition ------------------------------------------------------------------------------


@BOTH
def test_composition_of_the_whole_session_is_the_prompt_routes_report(acme: Api) -> None:
    sid = acme.session(*history())
    settings = {"max_prompt_tokens": 6000, "reserve_output_tokens": 500, "preserve_last_n": 4}
    built = acme.ok("POST", f"/v1/sessions/{sid}/prompt", json=settings)
    seen = _composition(acme, sid, **settings)
    assert seen["at"] == seen["total"] == 17
    assert seen["report"] == built["report"]
    assert seen["report"]["prune"]["compressed"] >= 1


def test_composition_before_a_message_is_the_prompt_of_the_history_before_it(acme: Api) -> None:
    messages = history()
    sid = acme.session(*messages)
    at = 10  # the call that answers "step 2": the messages before it only
    seen = _composition(acme, sid, at=at)
    # The same history as a session of its own, built by the prompt route:
    alone = acme.session(*messages[:at])
    built = acme.ok("POST", f"/v1/sessions/{alone}/prompt", json={})
    assert seen["at"] == at and seen["total"] == len(messages)
    assert _without_session(seen["report"]) == _without_session(built["report"])
    assert len(seen["decisions"]) == at


@BOTH
def test_decisions_name_the_stored_messages_and_compressed_ones_resolve(acme: Api) -> None:
    sid = acme.session(*history())
    stored = acme.ok("GET", f"/v1/sessions/{sid}/messages")["messages"]
    seen = _composition(acme, sid)
    assert [d["message_id"] for d in seen["decisions"]] == [m["id"] for m in stored]
    assert [d["role"] for d in seen["decisions"]] == [m["role"] for m in stored]
    compressed = [d for d in seen["decisions"] if d["action"] == "compressed"]
    assert compressed
    for d in compressed:
        full = stored[d["index"]]["content"]
        assert d["artifact_ref"] == artifact_ref(full)
        assert d["tokens_after"] < d["tokens_before"]
        assert d["excerpt"] and d["artifact_ref"] in d["excerpt"] and len(d["excerpt"]) < len(full)
        # The full text is in the tenant's artifacts, where the artifact route reads it:
        assert acme.ok("GET", f"/v1/artifacts/{d['artifact_ref']}")["text"] == full
    assert all(d["excerpt"] is None for d in seen["decisions"] if d["action"] != "compressed")


def test_composition_of_no_messages_is_the_reply_priming(acme: Api) -> None:
    sid = acme.session(*history(1))
    seen = _composition(acme, sid, at=0)
    assert seen["decisions"] == []
    assert seen["report"]["prompt_tokens"] == seen["report"]["sections"]["priming"] > 0


def test_a_call_still_waiting_at_the_end_is_left_out(acme: Api) -> None:
    messages = history(1)[:3]  # system, user, an assistant call with no result yet
    sid = acme.session(*messages)
    seen = _composition(acme, sid)
    assert seen["total"] == 3
    assert [d["role"] for d in seen["decisions"]] == ["system", "user"]


def test_a_prompt_that_cannot_fit_is_refused_with_its_reason(acme: Api) -> None:
    sid = acme.session(
        {"role": "system", "content": "rule " * 400}, {"role": "user", "content": "hi"}
    )
    r = acme(
        "GET",
        f"/v1/inspect/sessions/{sid}/composition",
        params={"max_prompt_tokens": 100, "reserve_output_tokens": 0},
    )
    body = _problem(r, 422, "budget-exceeded")
    assert body["budget"] == 100 and body["required"] > 100


def test_a_cache_stable_prompt_under_its_budget_says_why_it_left_history_out(acme: Api) -> None:
    sid = acme.session(*history(8))
    seen = _composition(acme, sid)  # the prompt route's defaults: 7,168 tokens of prompt
    report, prune = seen["report"], seen["report"]["prune"]
    assert prune["dropped"] == 2 and report["prompt_tokens"] < prune["budget"]
    why, how, saves = seen["explanation"]
    assert why.startswith(
        f"Why are 2 messages left out and {prune['compressed']} tool outputs compressed, "
        f"though the prompt uses only {report['prompt_tokens']:,} of its 7,168 tokens?"
    )
    assert "kept cache-stable" in why and "prompt cache" in why
    assert "low-water mark (5,017 tokens, 70% of the budget)" in how  # floor(0.7 * 7168)
    assert f"low-water mark {5017}" in prune["notes"][-1]  # the pruner's own figure
    stable = prune["stable_prefix_tokens"]
    assert stable and f"first {prune['stable_prefix_messages']} messages" in saves
    assert f"read at least those {stable:,} tokens back from the provider's cache" in saves


def test_a_cache_stable_prompt_near_its_budget_says_the_history_does_not_fit(acme: Api) -> None:
    sid = acme.session(*history(8))
    seen = _composition(acme, sid, max_prompt_tokens=20_000)
    report, prune = seen["report"], seen["report"]["prune"]
    assert report["prompt_tokens"] > int(0.7 * prune["budget"]) and prune["compressed"]
    why = seen["explanation"][0]
    assert why.startswith(
        f"Why are {prune['compressed']} tool outputs compressed? The history does not fit "
        "the prompt's 18,976 tokens, and this prompt is kept cache-stable."
    )


def test_a_prompt_that_keeps_the_whole_history_needs_no_explanation(acme: Api) -> None:
    sid = acme.session(*history(8))
    seen = _composition(acme, sid, max_prompt_tokens=200_000)
    assert seen["report"]["prune"]["dropped"] == seen["report"]["prune"]["compressed"] == 0
    assert seen["explanation"] == []


def test_notes_are_given_once_each_with_their_count(acme: Api) -> None:
    sid = acme.session(*history(8))
    seen = _composition(acme, sid, max_prompt_tokens=6000)
    given = [*seen["report"]["notes"], *seen["report"]["prune"]["notes"]]
    assert len(set(given)) < len(given)  # the pruner notes each output it compresses
    assert [n["text"] for n in seen["notes"]] == list(dict.fromkeys(given))
    assert {n["text"]: n["count"] for n in seen["notes"]} == {t: given.count(t) for t in given}


# -- the window and the tenant -----------------------------------------------------------------


def _window(api: Api, sid: str) -> dict[str, Any]:
    return api.ok("GET", f"/v1/inspect/sessions/{sid}/window")


def _reply(text: str, **metadata: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, "metadata": metadata}


@BOTH
def test_the_window_a_reply_records_is_the_sessions(acme: Api) -> None:
    sid = acme.session(
        {"role": "user", "content": "hi"},
        _reply("one", max_prompt_tokens=32_000, reserve_output_tokens=2_000),
        {"role": "user", "content": "again"},
        _reply("two", max_prompt_tokens=12_000, reserve_output_tokens=1_000, model="qwen3"),
        {"role": "user", "content": "and?"},
        _reply("three"),
    )
    seen = _window(acme, sid)
    assert (seen["max_prompt_tokens"], seen["reserve_output_tokens"]) == (12_000, 1_000)
    assert (seen["source"], seen["message_index"], seen["model"]) == ("recorded", 3, "qwen3")
    assert "Reply #3 records the window" in seen["explanation"]


def test_without_a_recorded_window_the_model_a_reply_names_gives_it(acme: Api) -> None:
    from ctxkeep.llm.models import resolve_limits

    sid = acme.session(
        {"role": "user", "content": "hi"}, _reply("one", model="gpt-4o-2024-08-06", usage=None)
    )
    seen = _window(acme, sid)
    limits = resolve_limits("gpt-4o", context_window=None, max_output_tokens=None)
    assert seen["max_prompt_tokens"] == limits.context_window == 128_000
    assert seen["reserve_output_tokens"] == limits.default_output_tokens
    assert (seen["source"], seen["message_index"]) == ("model", 1)
    assert "gpt-4o-2024-08-06" in seen["explanation"] and "128,000" in seen["explanation"]


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "user", "content": "hi"}, _reply("one", model="a-model-nobody-knows")],
        [{"role": "user", "content": "hi"}, _reply("one", max_prompt_tokens="8k")],
    ],
    ids=["empty", "unknown-model", "not-a-number"],
)
def test_a_session_that_records_no_window_says_so_and_gets_the_defaults(
    acme: Api, messages: list[dict[str, Any]]
) -> None:
    seen = _window(acme, acme.session(*messages))
    assert (seen["max_prompt_tokens"], seen["reserve_output_tokens"]) == (8192, 1024)
    assert seen["source"] == "default" and seen["message_index"] is None
    assert seen["explanation"].startswith("Nothing in this session records the window")


def test_the_tenant_route_names_the_keys_tenant(acme: Api, globex: Api) -> None:
    acme.session()
    acme.session()
    assert acme.ok("GET", "/v1/inspect/tenant") == {"tenant": "acme", "sessions": 2}
    assert globex.ok("GET", "/v1/inspect/tenant") == {"tenant": "globex", "sessions": 0}


# -- episodic search ----------------------------------------------------------------------------


@BOTH
def test_the_inspectors_search_shows_only_what_the_cli_calls_relevant(acme: Api) -> None:
    from ctxkeep.cli.memory import DEFAULT_MIN_SCORE

    for goal, summary in (
        ("fix the rounding bug", "invoice totals were rounded per line"),
        ("deploy the website", "the nginx config changed"),
        ("write the release notes", "listed every change since 1.2"),
    ):
        acme.ok(
            "POST", "/v1/episodes", json={"session_id": "s", "task_goal": goal, "summary": summary}
        )
    query = {"query": "rounding of invoice totals", "top_k": 3}
    ranked = acme.ok("POST", "/v1/episodes/search", json=query)["hits"]
    assert len(ranked) == 3 and min(h["score"] for h in ranked) < 0  # unrelated ones rank too
    shown = acme.ok("POST", "/v1/inspect/episodes/search", json=query)
    relevant = [h for h in ranked if h["lexical"] > 0 and h["score"] >= DEFAULT_MIN_SCORE]
    assert shown["hits"] == relevant
    assert [h["episode"]["task_goal"] for h in shown["hits"]] == ["fix the rounding bug"]
    assert shown["not_relevant"] == 2


def test_the_inspectors_search_takes_the_search_routes_body(acme: Api) -> None:
    r = acme("POST", "/v1/inspect/episodes/search", json={"query": "x", "top_k": 0})
    _problem(r, 422, "invalid-request")
    r = acme("POST", "/v1/inspect/episodes/search", json={"query": "x", "nope": 1})
    _problem(r, 422, "invalid-request")


# -- steps ------------------------------------------------------------------------------------


@BOTH
def test_steps_are_the_model_calls_and_the_next_one(acme: Api) -> None:
    messages = history()
    sid = acme.session(*messages)
    data = _steps(acme, sid)
    calls = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert [s["at"] for s in data["steps"]] == [*calls, len(messages)]
    assert [s["step"] for s in data["steps"]] == list(range(len(calls) + 1))
    assert [s["turn"] for s in data["steps"]] == [1, 1, 2, 2, 3, 3, 4, 4, 4]
    assert data["first_step"] == 0 and data["total"] == len(messages)
    assert data["prompt_budget"] == 8192 - 1024
    # Each step is the composition of its call:
    for step in (data["steps"][3], data["steps"][-1]):
        seen = _composition(acme, sid, at=step["at"])["report"]
        assert step["prompt_tokens"] == seen["prompt_tokens"]
        assert step["sections"] == seen["sections"]
        assert step["history_tokens"] == seen["prune"]["tokens_before"]
        assert (step["kept"], step["compressed"]) == (
            seen["prune"]["kept"],
            seen["prune"]["compressed"],
        )
    history_tokens = [s["history_tokens"] for s in data["steps"]]
    assert history_tokens == sorted(history_tokens)
    assert all(s["prompt_tokens"] <= data["prompt_budget"] for s in data["steps"])
    assert data["steps"][-1]["prompt_tokens"] < data["steps"][-1]["history_tokens"]


def test_steps_count_every_message_exactly(acme: Api) -> None:
    sid = acme.session(*history(2))
    stored = acme.ok("GET", f"/v1/sessions/{sid}/messages")["messages"]
    data = _steps(acme, sid, encoding="cl100k_base")
    counter = get_counter("cl100k_base")
    from ctxkeep.server.wire import message_from_wire

    assert [m["tokens"] for m in data["messages"]] == [
        counter.count_message(message_from_wire(m)) for m in stored
    ]
    assert [m["message_id"] for m in data["messages"]] == [m["id"] for m in stored]
    assert [m["turn"] for m in data["messages"]] == [0, 1, 1, 1, 1, 2, 2, 2, 2]


def test_steps_limit_keeps_the_newest_unchanged(acme: Api) -> None:
    sid = acme.session(*history())
    everything = _steps(acme, sid, max_prompt_tokens=5000)["steps"]
    newest = _steps(acme, sid, max_prompt_tokens=5000, limit=3)
    assert newest["first_step"] == len(everything) - 3
    assert newest["steps"] == everything[-3:]


def test_a_step_where_nothing_fits_reports_why(acme: Api) -> None:
    sid = acme.session(
        {"role": "system", "content": "rule " * 400}, {"role": "user", "content": "hi"}
    )
    data = _steps(acme, sid, max_prompt_tokens=100, reserve_output_tokens=0)
    (step,) = data["steps"]
    assert step["prompt_tokens"] is None and step["sections"] == {}
    assert step["error"] and "100" in step["error"]
    assert step["history_tokens"] > 100


def test_an_empty_session_has_one_step(acme: Api) -> None:
    sid = acme.session()
    data = _steps(acme, sid)
    assert data["messages"] == []
    assert [(s["at"], s["turn"]) for s in data["steps"]] == [(0, 0)]


# -- bad input, isolation, authentication ------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "slug"),
    [
        ({"at": -1}, "invalid-request"),
        ({"at": "x"}, "invalid-request"),
        ({"at": 6}, "invalid-parameter"),
        ({"max_prompt_tokens": 1}, "invalid-request"),
        ({"max_prompt_tokens": 10**12}, "invalid-request"),
        ({"reserve_output_tokens": 8192}, "invalid-parameter"),
        ({"preserve_last_n": -1}, "invalid-request"),
        ({"encoding": "no-such-encoding"}, "unknown-encoding"),
        ({"encoding": ""}, "invalid-request"),
    ],
)
def test_bad_composition_input_is_a_422_problem(
    acme: Api, query: dict[str, Any], slug: str
) -> None:
    sid = acme.session(*history(1))
    _problem(acme("GET", f"/v1/inspect/sessions/{sid}/composition", params=query), 422, slug)


@pytest.mark.parametrize(
    ("query", "slug"),
    [
        ({"limit": 0}, "invalid-request"),
        ({"limit": 1001}, "invalid-request"),
        ({"max_prompt_tokens": 100, "reserve_output_tokens": 100}, "invalid-parameter"),
        ({"encoding": "no-such-encoding"}, "unknown-encoding"),
    ],
)
def test_bad_steps_input_is_a_422_problem(acme: Api, query: dict[str, Any], slug: str) -> None:
    sid = acme.session(*history(1))
    _problem(acme("GET", f"/v1/inspect/sessions/{sid}/steps", params=query), 422, slug)


@BOTH
@pytest.mark.parametrize("route", ["composition", "steps", "window"])
def test_another_tenants_session_is_not_found(acme: Api, globex: Api, route: str) -> None:
    theirs = globex.session(*history(1))
    _problem(acme("GET", f"/v1/inspect/sessions/{theirs}/{route}"), 404, "session-not-found")
    _problem(acme("GET", f"/v1/inspect/sessions/no-such-id/{route}"), 404, "session-not-found")
    assert globex("GET", f"/v1/inspect/sessions/{theirs}/{route}").status_code == 200


@pytest.mark.parametrize("route", ["composition", "steps", "window"])
def test_inspect_routes_need_a_key(acme: Api, client: TestClient, route: str) -> None:
    sid = acme.session()
    _problem(client.get(f"/v1/inspect/sessions/{sid}/{route}"), 401, "unauthorized")
    bad = {"Authorization": "Bearer ck_nope_nope"}
    _problem(client.get(f"/v1/inspect/sessions/{sid}/{route}", headers=bad), 401, "unauthorized")


def test_the_tenant_and_search_routes_need_a_key(client: TestClient) -> None:
    _problem(client.get("/v1/inspect/tenant"), 401, "unauthorized")
    r = client.post("/v1/inspect/episodes/search", json={"query": "x"})
    _problem(r, 401, "unauthorized")


# -- the page ---------------------------------------------------------------------------------


def test_the_page_and_its_files_are_served_under_a_self_only_policy(client: TestClient) -> None:
    for path, kind in (
        ("/", "text/html"),
        ("/inspector/inspector.js", "text/javascript"),
        ("/inspector/inspector.css", "text/css"),
    ):
        r = client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"].startswith(kind)
        assert r.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert r.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'self'" in CONTENT_SECURITY_POLICY
    page = client.get("/").text
    assert '<script src="/inspector/inspector.js"' in page
    assert '<link rel="stylesheet" href="/inspector/inspector.css">' in page


def test_nothing_else_is_served_from_the_inspector(client: TestClient) -> None:
    for name in ("index.html", "nope.js", "..%2Fapp.py", "inspector.py"):
        _problem(client.get(f"/inspector/{name}"), 404, "not-found")


def test_the_front_end_names_no_other_host() -> None:
    for f in STATIC.iterdir():
        text = f.read_text(encoding="utf-8")
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text))
        assert urls <= {"http://www.w3.org/2000/svg"}, (f.name, urls)  # a namespace, not a fetch
        assert "@import" not in text and "url(" not in text, f.name


def test_openapi_documents_the_inspect_routes_but_not_the_page(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/inspect/sessions/{session_id}/composition" in paths
    assert "/v1/inspect/sessions/{session_id}/steps" in paths
    assert "/v1/inspect/sessions/{session_id}/window" in paths
    assert "/v1/inspect/tenant" in paths and "/v1/inspect/episodes/search" in paths
    assert "/" not in paths and not any(p.startswith("/inspector") for p in paths)
    responses = paths["/v1/inspect/sessions/{session_id}/steps"]["get"]["responses"]
    assert PROBLEM in responses["404"]["content"]

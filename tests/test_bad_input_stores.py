"""Bad input that once reached a store and came back as a 5xx (issue 25, item 5), on every
backend (memory, SQLite, Redis, PostgreSQL), through the library and through the service:

* metadata nested 900 deep (a ``RecursionError`` while copying it) is an InvalidMessageError
  (422), and nothing is stored;
* an integer beyond 64 bits (an ``OverflowError`` in SQLite, "bigint out of range" in
  PostgreSQL) is a ConfigError (422);
* a NUL in an id or a filter (which PostgreSQL cannot store: 503) is a ConfigError (422) on
  every backend, and nothing is stored;
* a stored message row that is not JSON is a CorruptRecordError naming the session and seq,
  and the service answers the ``corrupt-record`` problem (500, not a 503 that says "retry").

These are the stores' half of the hostile-input suite; ``test_bad_input_api.py`` feeds bad
values to every public callable in process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from conftest_services import (
    STORES,
    fresh_store_url,
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import CognitiveState, open_checkpoints, open_episodic, open_memory
from ctxkeep._check import MAX_ID_LENGTH
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidFilterError,
    InvalidMessageError,
)
from ctxkeep.messages import Message
from ctxkeep.server import create_app
from ctxkeep.sessions.base import MemoryManager
from ctxkeep.sessions.memory import MemoryBackend
from ctxkeep.sessions.redis import RedisBackend
from ctxkeep.sessions.sql import SQLBackend

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

PROBLEM = "application/problem+json"
BEYOND_64_BITS = [2**63, 10**20]
BROKEN = "{not json"
DAMAGED = [BROKEN, '{"v": 1, "role": "nobody"}', "[1, 2]"]
"""Stored message texts no reader can use: not JSON, JSON of no message, not an object."""


def nested(depth: int) -> dict[str, Any]:
    """``{"a": {"a": ... {}}}``, ``depth`` levels deep."""
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


@pytest.fixture(params=STORES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each backend."""
    return fresh_store_url(request, tmp_path, "bad")


@pytest.fixture
def mem(url: str) -> Iterator[MemoryManager]:
    with open_memory(url) as store:
        yield store


def corrupt(mem: MemoryManager, session_id: str, seq: int, text: str = BROKEN) -> None:
    """Overwrite the stored record of message ``seq`` with ``text``, as a damaged disk or a
    hand edit would (through the backend's own connection).
    """
    backend = mem.backend
    if isinstance(backend, MemoryBackend):
        rows = backend._sessions[session_id].rows
        rows[[s for s, _ in rows].index(seq)] = (seq, text)
    elif isinstance(backend, SQLBackend):
        with backend.db.tx("corrupt a row") as conn:
            conn.execute(
                backend._sql(
                    "UPDATE ctxkeep_messages SET record = ? WHERE session_id = ? AND seq = ?"
                ),
                (text, session_id, seq),
            )
    else:
        assert isinstance(backend, RedisBackend)
        key = backend.keys.messages(session_id)
        backend._client.zremrangebyscore(key, seq, seq)
        backend._client.zadd(key, {f"{seq}:{text}": seq})


def corrupt_session(mem: MemoryManager, session_id: str) -> None:
    """Overwrite a stored session's metadata with text that is not JSON (the in-process
    store keeps sessions as objects, with nothing to decode: the test is skipped there).
    """
    backend = mem.backend
    if isinstance(backend, MemoryBackend):
        pytest.skip("the in-process store decodes no session")
    if isinstance(backend, SQLBackend):
        with backend.db.tx("corrupt a row") as conn:
            conn.execute(
                backend._sql("UPDATE ctxkeep_sessions SET metadata = ? WHERE session_id = ?"),
                (BROKEN, session_id),
            )
    else:
        assert isinstance(backend, RedisBackend)
        backend._client.hset(backend.keys.session(session_id), "metadata", BROKEN)


# -- the library --------------------------------------------------------------------------------


def test_session_metadata_nested_too_deep_is_refused_and_no_session_stored(
    mem: MemoryManager,
) -> None:
    with pytest.raises(InvalidMessageError, match="metadata"):
        mem.create_session("agent", session_id="deep", metadata=nested(900))
    assert not mem.has_session("deep")
    assert mem.list_sessions() == []


def test_message_metadata_nested_too_deep_is_refused_and_nothing_stored(
    mem: MemoryManager,
) -> None:
    sid = mem.create_session("agent")
    with pytest.raises(InvalidMessageError, match="metadata"):
        mem.add_messages(sid, [Message("user", "hi", metadata=nested(900))])
    assert mem.get_messages(sid) == []


@pytest.mark.parametrize("big", BEYOND_64_BITS)
@pytest.mark.parametrize("arg", ["offset", "limit"])
def test_a_session_page_beyond_64_bits_is_a_config_error(
    mem: MemoryManager, arg: str, big: int
) -> None:
    mem.create_session("agent")
    page: dict[str, Any] = {arg: big}
    with pytest.raises(ConfigError, match=arg):
        mem.list_sessions(**page)


@pytest.mark.parametrize("big", BEYOND_64_BITS)
def test_a_message_limit_beyond_64_bits_is_a_config_error(mem: MemoryManager, big: int) -> None:
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "hi")
    with pytest.raises(ConfigError, match="limit"):
        mem.get_messages(sid, limit=big)


@pytest.mark.parametrize("damaged", DAMAGED)
def test_a_corrupt_message_row_is_a_corrupt_record_error_naming_session_and_seq(
    mem: MemoryManager, damaged: str
) -> None:
    sid = mem.create_session("agent", session_id="s1")
    mem.add_messages(sid, [Message("user", "one"), Message("assistant", "two")])
    corrupt(mem, sid, 2, damaged)
    for read in (mem.get_messages, mem.build_prompt_messages):
        with pytest.raises(CorruptRecordError, match=r"session 's1'.*seq 2"):
            read(sid)


def test_a_corrupt_session_row_is_a_corrupt_record_error_naming_the_session(
    mem: MemoryManager,
) -> None:
    sid = mem.create_session("agent", session_id="s1")
    corrupt_session(mem, sid)
    for read in (lambda: mem.get_session(sid), lambda: mem.get_messages(sid)):
        with pytest.raises(CorruptRecordError, match="session 's1'"):
            read()


NUL = "a\x00b"


def _nul_session_calls(mem: MemoryManager, sid: str) -> list[Callable[[], Any]]:
    """Every session entry point given a NUL in an id or a filter."""
    return [
        lambda: mem.create_session(NUL),
        lambda: mem.create_session("agent", task_id=NUL),
        lambda: mem.create_session("agent", session_id=NUL),
        lambda: mem.list_sessions(agent_id=NUL),
        lambda: mem.list_sessions(task_id=NUL),
        lambda: mem.get_latest_session_for_agent(NUL),
        lambda: mem.get_session(sid + "\x00"),
        lambda: mem.get_messages(NUL),
        lambda: mem.add_message(NUL, "user", "hi"),
    ]


def test_a_nul_in_a_session_id_or_filter_is_a_config_error_and_nothing_stored(
    mem: MemoryManager,
) -> None:
    sid = mem.create_session("agent", session_id="s")
    for call in _nul_session_calls(mem, sid):
        with pytest.raises(ConfigError, match="NUL"):
            call()
    assert [s.session_id for s in mem.list_sessions()] == ["s"]
    assert mem.get_messages("s") == []


def test_a_nul_in_a_checkpoint_id_is_a_config_error_and_nothing_stored(url: str) -> None:
    with open_checkpoints(url) as store:
        state = CognitiveState(context={"k": 1})
        for call in (
            lambda: store.save(NUL, state),
            lambda: store.save("agent", state, task_id=NUL),
            lambda: store.save("agent", state, session_id=NUL),
            lambda: store.latest(NUL),
            lambda: store.history(NUL),
            lambda: store.load(NUL),
        ):
            with pytest.raises(ConfigError, match="NUL"):
                call()
        assert store.latest("agent") is None


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def episodes_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh episode store of each backend that keeps episodes (Redis does not)."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/episodes.db"
    make: Callable[[], str] = request.getfixturevalue("postgres_schema_factory")
    return make()


EPISODE: dict[str, Any] = {"session_id": "s", "task_goal": "goal", "summary": "what happened"}


@pytest.mark.parametrize("field", ["session_id", "task_goal", "summary", "agent_id", "task_id"])
def test_a_nul_in_an_episode_field_is_refused_and_nothing_stored(
    episodes_url: str, field: str
) -> None:
    with open_episodic(episodes_url, embedder="hash") as store:
        with pytest.raises(InvalidMessageError, match="NUL"):
            store.save_episodes([{**EPISODE, field: NUL}])
        assert store.count() == 0


def test_a_nul_in_an_episode_id_or_filter_is_refused(episodes_url: str) -> None:
    with open_episodic(episodes_url, embedder="hash") as store:
        store.save_episode(**EPISODE)
        for call in (
            lambda: store.search("goal", filters={"agent_id": NUL}),
            lambda: store.search("goal", filters={"session_id": [NUL]}),
            lambda: store.forget(agent_id=NUL),
        ):
            with pytest.raises(InvalidFilterError, match="NUL"):
                call()
        with pytest.raises(ConfigError, match="NUL"):
            store.get(NUL)
        assert store.count() == 1


def test_a_nul_in_a_search_query_is_searched_like_any_text(episodes_url: str) -> None:
    # A query is free text that no store keeps: a NUL in it is no reason to refuse it.
    with open_episodic(episodes_url, embedder="hash") as store:
        store.save_episode(**EPISODE)
        (hit,) = store.search("goal\x00", top_k=1)
        assert hit.episode.task_goal == "goal"


# -- the service --------------------------------------------------------------------------------


class Api:
    """One tenant of a service on ``url``."""

    def __init__(self, client: TestClient, key: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {key}"}

    def __call__(self, method: str, path: str, **kw: Any) -> Any:
        return self.client.request(method, path, headers=self.headers, **kw)

    def session(self, **body: Any) -> str:
        r = self("POST", "/v1/sessions", json={"agent_id": "agent", **body})
        assert r.status_code == 201, r.text
        return str(r.json()["session"]["session_id"])

    def sessions(self) -> list[dict[str, Any]]:
        r = self("GET", "/v1/sessions")
        assert r.status_code == 200, r.text
        return list(r.json()["sessions"])

    def messages(self, sid: str) -> list[dict[str, Any]]:
        r = self("GET", f"/v1/sessions/{sid}/messages")
        assert r.status_code == 200, r.text
        return list(r.json()["messages"])


TENANT = "acme"


@pytest.fixture
def service(url: str) -> Iterator[tuple[Api, Any]]:
    """The tenant's view of a service on a store of each backend, and the app."""
    app = create_app(url)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            key = app.state.ctxkeep.keys.create(TENANT)[1]
            yield Api(client, key), app
    finally:
        if url.startswith("postgresql"):
            _drop_tenant_schemas(url)


def _drop_tenant_schemas(url: str) -> None:
    """Drop what a service on ``url`` made beside its own schema: the tenant's schema, and
    the schema it installed pgvector in (an extension lives in one schema of a database: left
    there, a later episodic store on another schema of this server would not see its type).
    """
    import psycopg

    base = url.rsplit("search_path%3D", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{base}_tenant_{TENANT}" CASCADE')
        conn.execute("DROP SCHEMA IF EXISTS ctxkeep_extensions CASCADE")


@pytest.fixture
def api(service: tuple[Api, Any]) -> Api:
    return service[0]


def problem(r: Any, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM)
    body: dict[str, Any] = r.json()
    assert body["type"] == f"urn:ctxkeep:problem:{slug}", body
    return body


def test_service_refuses_session_metadata_nested_too_deep_and_stores_nothing(api: Api) -> None:
    r = api("POST", "/v1/sessions", json={"agent_id": "agent", "metadata": nested(900)})
    problem(r, 422, "invalid-message")
    assert api.sessions() == []


def test_service_refuses_message_metadata_nested_too_deep_and_stores_nothing(api: Api) -> None:
    sid = api.session()
    message = {"role": "user", "content": "hi", "metadata": nested(900)}
    r = api("POST", f"/v1/sessions/{sid}/messages", json={"messages": [message]})
    problem(r, 422, "invalid-message")
    assert api.messages(sid) == []


@pytest.mark.parametrize("big", BEYOND_64_BITS)
def test_service_refuses_integers_beyond_64_bits(api: Api, big: int) -> None:
    sid = api.session()
    for path in (
        f"/v1/sessions?offset={big}",
        f"/v1/sessions/{sid}/messages?last={big}",
        f"/v1/sessions/{sid}/messages?offset={big}",
        f"/v1/sessions/{sid}/messages?limit={big}",
    ):
        problem(api("GET", path), 422, "invalid-request")
    for field in ("max_prompt_tokens", "reserve_output_tokens", "preserve_last_n"):
        r = api("POST", f"/v1/sessions/{sid}/prompt", json={field: big})
        problem(r, 422, "invalid-request")
    assert api.messages(sid) == []


@pytest.mark.parametrize("damaged", DAMAGED)
def test_service_answers_a_corrupt_message_row_with_the_corrupt_record_problem(
    service: tuple[Api, Any], damaged: str
) -> None:
    api, app = service
    sid = api.session()
    r = api(
        "POST",
        f"/v1/sessions/{sid}/messages",
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 201, r.text
    with app.state.ctxkeep.stores.lease(TENANT) as mem:
        corrupt(mem, sid, 1, damaged)
        mem.reads.forget_cached(sid)  # the service's cache would answer without a read
    for method, path in (
        ("GET", f"/v1/sessions/{sid}/messages"),
        ("GET", f"/v1/sessions/{sid}/prompt"),
        ("POST", f"/v1/sessions/{sid}/prompt"),
    ):
        body = problem(
            api(method, path, **({"json": {}} if method == "POST" else {})), 500, "corrupt-record"
        )
        assert sid not in body["detail"]  # a 5xx names no stored data; the log does


def test_service_refuses_a_nul_in_an_id_or_filter_and_stores_nothing(api: Api) -> None:
    sid = api.session()
    body: dict[str, Any] = {"state": {"context": {}}}
    for method, path, payload in (
        ("POST", "/v1/sessions", {"agent_id": NUL}),
        ("POST", "/v1/sessions", {"agent_id": "agent", "task_id": NUL}),
        ("POST", "/v1/sessions", {"agent_id": "agent", "session_id": NUL}),
        ("GET", "/v1/sessions?agent_id=a%00b", None),
        ("GET", "/v1/sessions?task_id=a%00b", None),
        ("GET", "/v1/sessions/a%00b", None),
        ("GET", "/v1/sessions/a%00b/messages", None),
        ("POST", "/v1/sessions/a%00b/messages", {"messages": [{"role": "user", "content": "x"}]}),
        ("GET", "/v1/agents/a%00b/latest", None),
        ("POST", "/v1/agents/a%00b/checkpoints", body),
        ("POST", "/v1/agents/agent/checkpoints", {**body, "task_id": NUL}),
        ("POST", "/v1/agents/agent/checkpoints", {**body, "session_id": NUL}),
        ("GET", "/v1/agents/a%00b/checkpoints", None),
        ("GET", "/v1/agents/a%00b/checkpoints/latest", None),
        ("GET", "/v1/checkpoints/a%00b", None),
    ):
        r = api(method, path, **({} if payload is None else {"json": payload}))
        problem(r, 422, "invalid-parameter")
    assert [s["session_id"] for s in api.sessions()] == [sid]
    assert api.messages(sid) == []
    assert api("GET", "/v1/agents/agent/checkpoints").json()["checkpoints"] == []


def test_service_refuses_a_nul_in_an_episode_field_id_or_filter_and_stores_nothing(
    url: str, api: Api
) -> None:
    if url.startswith("redis"):
        pytest.skip("the service keeps no episodes on Redis (501)")
    for method, path, payload, slug in (
        *(("POST", "/v1/episodes", {**EPISODE, f: NUL}, "invalid-message") for f in EPISODE),
        ("POST", "/v1/episodes", {**EPISODE, "agent_id": NUL}, "invalid-message"),
        (
            "POST",
            "/v1/episodes/search",
            {"query": "q", "filters": {"agent_id": NUL}},
            "invalid-filter",
        ),
        ("GET", "/v1/episodes/a%00b", None, "invalid-parameter"),
        ("DELETE", "/v1/episodes/a%00b", None, "invalid-filter"),
        ("DELETE", "/v1/episodes?agent_id=a%00b", None, "invalid-filter"),
    ):
        r = api(method, path, **({} if payload is None else {"json": payload}))
        problem(r, 422, slug)
    r = api("POST", "/v1/episodes/search", json={"query": "goal"})
    assert r.status_code == 200, r.text
    assert r.json()["hits"] == []


@pytest.mark.redis
def test_service_answers_a_corrupt_task_state_with_the_corrupt_record_problem(
    redis_url: str, redis_prefix_factory: Callable[[], str]
) -> None:
    import redis

    prefix = redis_prefix_factory()
    app = create_app(f"{redis_url}?prefix={prefix}")
    with TestClient(app, raise_server_exceptions=False) as client:
        api = Api(client, app.state.ctxkeep.keys.create(TENANT)[1])
        r = api("PUT", "/v1/fabric/agents/a/task", json={"task_id": "t", "state": {"k": 1}})
        assert r.status_code == 200, r.text
        conn = redis.Redis.from_url(redis_url)
        try:
            hashes = [k for k in conn.scan_iter(match=f"{prefix}*") if conn.type(k) == b"hash"]
            (key,) = [k for k in hashes if conn.hexists(k, "data:k")]
            conn.hset(key, "data:k", BROKEN)
        finally:
            conn.close()
        problem(api("GET", "/v1/fabric/agents/a/task"), 500, "corrupt-record")


def test_service_answers_a_corrupt_session_row_with_the_corrupt_record_problem(
    service: tuple[Api, Any],
) -> None:
    api, app = service
    sid = api.session()
    with app.state.ctxkeep.stores.lease(TENANT) as mem:
        corrupt_session(mem, sid)
    for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/messages", "/v1/sessions"):
        problem(api("GET", path), 500, "corrupt-record")


def test_an_id_too_long_or_with_nul_is_refused_where_it_would_be_stored_and_nothing_stored(
    mem: MemoryManager, url: str
) -> None:
    long = "x" * (MAX_ID_LENGTH + 1)
    sid = mem.create_session("agent", session_id="s")
    for call in (
        lambda: mem.create_session(long),
        lambda: mem.create_session("agent", task_id=long),
        lambda: mem.create_session("agent", session_id=long),
    ):
        with pytest.raises(ConfigError, match=f"at most {MAX_ID_LENGTH}"):
            call()
    # A message id: PostgreSQL could not store a NUL nor index a long one; no backend takes it.
    for bad in ("a\x00b", long):
        with pytest.raises(InvalidMessageError, match="id must hold no NUL"):
            mem.add_messages(sid, [Message("user", "first"), Message("user", "hi", id=bad)])
    mem.add_messages(sid, [Message("user", "ok", id="y" * MAX_ID_LENGTH)])  # the bound itself
    assert [s.session_id for s in mem.list_sessions()] == ["s"]
    assert [m.content for m in mem.get_messages(sid)] == ["ok"]
    with open_checkpoints(url) as store:
        for call in (
            lambda: store.save(long, CognitiveState()),
            lambda: store.save("agent", CognitiveState(), task_id=long),
            lambda: store.save("agent", CognitiveState(), session_id=long),
        ):
            with pytest.raises(ConfigError, match=f"at most {MAX_ID_LENGTH}"):
                call()
        assert store.latest("agent") is None

"""CtxkeepSession against the Agents SDK's own SQLiteSession, assertion for assertion.

Every behavioural test runs on the SDK's ``SQLiteSession`` and on ``CtxkeepSession`` over each
store (memory://, a SQLite file, Redis when one answers), so "behaves as SQLiteSession does" is
checked, not asserted. The Runner tests drive the SDK's own ``ScriptedModel``.
"""

from __future__ import annotations

import asyncio
import copy
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message, function_call

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)
from ctxkeep import MemoryConfig, open_memory
from ctxkeep.integrations.openai_agents import CtxkeepSession

__all__ = [
    "postgres_schema_factory",
    "postgres_url",
    "redis_prefix_factory",
    "redis_url",
]  # fixtures, re-exported for pytest

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


KINDS = [
    "sdk-sqlite",
    "ctxkeep-memory",
    "ctxkeep-sqlite",
    pytest.param("ctxkeep-redis", marks=pytest.mark.redis),
    pytest.param("ctxkeep-postgres", marks=pytest.mark.postgres),
]
CTXKEEP_KINDS = [k for k in KINDS if not isinstance(k, str) or k.startswith("ctxkeep")]

Factory = Callable[..., Any]


def _store_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store of ``kind``: Redis keys under a new prefix or a new PostgreSQL schema,
    removed after the test.
    """
    if kind == "ctxkeep-memory":
        return "memory://"
    if kind == "ctxkeep-sqlite":
        return f"sqlite:///{tmp_path / 'ck.db'}"
    if kind == "ctxkeep-postgres":  # a fresh schema, dropped after the test
        schema_url: str = request.getfixturevalue("postgres_schema_factory")()
        return schema_url
    url: str = request.getfixturevalue("redis_url")  # skips when no Redis answers
    prefix: str = request.getfixturevalue("redis_prefix_factory")()
    return f"{url}?prefix={prefix}"


@pytest.fixture(params=KINDS)
def make_session(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Build sessions of one kind; every kind takes (session_id, session_settings=...)."""
    kind: str = request.param
    url = None if kind == "sdk-sqlite" else _store_url(kind, request, tmp_path)
    made: list[Any] = []

    def make(session_id: str = "conv", **kwargs: Any) -> Any:
        s: Any
        if url is None:
            s = SQLiteSession(session_id, tmp_path / "sdk.db", **kwargs)
        else:
            s = CtxkeepSession(session_id, url, **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def reply(text: str, item_id: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def call(call_id: str, name: str = "lookup", args: str = '{"q":"x"}') -> dict[str, Any]:
    return {
        "arguments": args,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": f"fc_{call_id}",
        "status": "completed",
    }


def output(call_id: str, text: str) -> dict[str, Any]:
    return {"call_id": call_id, "output": text, "type": "function_call_output"}


REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "look it up"}],
    "encrypted_content": "gAAAAABo-opaque-blob==",
}

CONVERSATION: list[dict[str, Any]] = [
    user("what is in a and b?"),
    REASONING,
    call("c1"),
    call("c2", args='{"q":"y"}'),
    output("c1", "A holds 1"),
    output("c2", "B holds 2"),
    reply("a has 1, b has 2", "msg_1"),
    {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    reply("you're welcome", "msg_2"),
]


# -- behaviour, side by side ----------------------------------------------------------------


def test_a_new_session_is_empty(make_session: Factory) -> None:
    s = make_session()
    assert run(s.get_items()) == []
    assert run(s.get_items(limit=3)) == []


def test_items_come_back_exactly_as_added_oldest_first(make_session: Factory) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION[:3])))
    run(s.add_items(copy.deepcopy(CONVERSATION[3:])))
    got = run(s.get_items())
    assert got == CONVERSATION
    assert [list(i) for i in got] == [list(i) for i in CONVERSATION]  # key order too


def test_changing_the_items_read_changes_nothing_stored(make_session: Factory) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION)))
    for limit in (None, 4):
        got = run(s.get_items(limit))
        for item in got:
            item["extra"] = 1
            for part in item.get("content") or ():
                if isinstance(part, dict):
                    part["text"] = "changed"
            if isinstance(item.get("summary"), list):
                item["summary"].clear()
        assert run(s.get_items()) == CONVERSATION


def test_limit_gives_the_newest_items_oldest_first(make_session: Factory) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION)))
    for n in range(1, len(CONVERSATION) + 3):
        assert run(s.get_items(limit=n)) == CONVERSATION[-n:], n
    assert run(s.get_items(limit=0)) == []


def test_limit_cuts_inside_a_run_of_parallel_calls(make_session: Factory) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION[:4])))
    assert run(s.get_items(limit=1)) == [CONVERSATION[3]]
    assert run(s.get_items(limit=2)) == CONVERSATION[2:4]


def test_session_settings_limit_is_the_default(make_session: Factory) -> None:
    s = make_session(session_settings=SessionSettings(limit=2))
    run(s.add_items([user("1"), reply("2", "m2"), user("3")]))
    assert run(s.get_items()) == [reply("2", "m2"), user("3")]
    assert run(s.get_items(limit=3)) == [user("1"), reply("2", "m2"), user("3")]


def test_session_settings_accepts_a_dict(make_session: Factory) -> None:
    s = make_session(session_settings={"limit": 1})
    run(s.add_items([user("1"), user("2")]))
    assert run(s.get_items()) == [user("2")]


def test_pop_item_on_an_empty_session_is_none(make_session: Factory) -> None:
    s = make_session()
    assert run(s.pop_item()) is None
    run(s.add_items([user("only")]))
    assert run(s.pop_item()) == user("only")
    assert run(s.pop_item()) is None
    assert run(s.get_items()) == []


def test_pop_item_takes_items_back_newest_first(make_session: Factory) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION)))
    popped = []
    while (item := run(s.pop_item())) is not None:
        popped.append(item)
        assert run(s.get_items()) == CONVERSATION[: len(CONVERSATION) - len(popped)]
    assert popped == CONVERSATION[::-1]


def test_pop_item_then_add_continues_the_history(make_session: Factory) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION[:4])))  # user, reasoning, two waiting calls
    assert run(s.pop_item()) == CONVERSATION[3]
    run(s.add_items([call("c3"), output("c1", "one"), output("c3", "three")]))
    assert run(s.get_items()) == [
        *CONVERSATION[:3],
        call("c3"),
        output("c1", "one"),
        output("c3", "three"),
    ]


def test_items_added_while_calls_wait_continue_the_run(make_session: Factory) -> None:
    s = make_session()
    batches = [[user("go"), call("c1")], [REASONING], [call("c2")], [output("c1", "1")]]
    for batch in batches:
        run(s.add_items(copy.deepcopy(batch)))
    run(s.add_items([output("c2", "2"), reply("ok", "m")]))
    expected = [item for batch in batches for item in batch]
    assert run(s.get_items()) == [*expected, output("c2", "2"), reply("ok", "m")]


def test_clear_session_removes_every_item_and_the_session_stays_usable(
    make_session: Factory,
) -> None:
    s = make_session()
    run(s.add_items(copy.deepcopy(CONVERSATION)))
    run(s.clear_session())
    assert run(s.get_items()) == []
    assert run(s.pop_item()) is None
    run(s.clear_session())  # clearing an empty session is fine
    run(s.add_items([user("again")]))
    assert run(s.get_items()) == [user("again")]


def test_sessions_with_different_ids_do_not_share_items(make_session: Factory) -> None:
    a, b = make_session("a"), make_session("b")
    run(a.add_items([user("for a")]))
    run(b.add_items([user("for b")]))
    assert run(a.get_items()) == [user("for a")]
    run(a.clear_session())
    assert run(b.get_items()) == [user("for b")]


def test_concurrent_add_items_from_many_tasks_loses_nothing(make_session: Factory) -> None:
    s = make_session()

    async def writer(w: int) -> None:
        for i in range(5):
            await s.add_items([user(f"w{w}-{i}a"), user(f"w{w}-{i}b")])

    async def main() -> list[Any]:
        await asyncio.gather(*(writer(w) for w in range(6)))
        return list(await s.get_items())

    got = run(main())
    assert len(got) == 60
    texts = [i["content"] for i in got]
    assert sorted(texts) == sorted(f"w{w}-{i}{p}" for w in range(6) for i in range(5) for p in "ab")
    for w in range(6):  # each batch stays whole and each writer's batches stay in order
        mine = [t for t in texts if t.startswith(f"w{w}-")]
        assert mine == [f"w{w}-{i}{p}" for i in range(5) for p in "ab"]
        for i in range(5):
            k = texts.index(f"w{w}-{i}a")
            assert texts[k + 1] == f"w{w}-{i}b"


# -- ctxkeep only -----------------------------------------------------------------------------


def test_it_is_an_agents_sdk_session() -> None:
    from agents.memory import Session

    s = CtxkeepSession("conv", "memory://")
    assert isinstance(s, Session)
    assert s.session_id == "conv"
    assert s.session_settings == SessionSettings()
    s.close()


def test_importing_ctxkeep_does_not_import_the_agents_sdk() -> None:
    import subprocess

    code = "import sys, ctxkeep; print('agents' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_sdk_raises_an_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from ctxkeep.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "agents.memory.session_settings", None)
    monkeypatch.delitem(sys.modules, "ctxkeep.integrations.openai_agents")
    with pytest.raises(MissingDependencyError, match=r"ctxkeep\[agents\]"):
        importlib.import_module("ctxkeep.integrations.openai_agents")


def test_the_ctxkeep_session_is_created_on_first_add_under_the_agent_id() -> None:
    with open_memory("memory://") as memory:
        s = CtxkeepSession("conv-1", memory=memory, agent_id="support-bot")
        run(s.get_items())
        assert not memory.has_session("conv-1")  # a read creates nothing
        run(s.add_items([user("hi")]))
        assert memory.get_session("conv-1").agent_id == "support-bot"
        run(s.clear_session())
        assert not memory.has_session("conv-1")


def test_max_history_trims_whole_tool_units_and_archives_them() -> None:
    config = MemoryConfig(max_history=3, session_ttl=None)
    s = CtxkeepSession("conv", "memory://", config=config)
    run(s.add_items(copy.deepcopy(CONVERSATION[:6])))  # user | reasoning+2 calls, 2 outputs
    run(s.add_items([reply("done", "m")]))
    # Five messages: user | reasoning + two calls | output | output | reply. The call message
    # and its outputs are one unit of three, which cannot stay beside the reply in three: it
    # goes whole, never leaving an output without its call.
    assert run(s.get_items()) == [reply("done", "m")]
    assert s.memory.archived_messages("conv")
    s.close()


def test_an_expired_session_reads_empty_and_starts_again() -> None:
    now = [1000.0]
    memory = open_memory("memory://", MemoryConfig(session_ttl=60), clock=lambda: now[0])
    s = CtxkeepSession("conv", memory=memory)
    run(s.add_items([user("old")]))
    now[0] += 120
    assert run(s.get_items()) == []
    assert run(s.pop_item()) is None
    run(s.add_items([user("new")]))
    assert run(s.get_items()) == [user("new")]
    memory.close()


def test_two_instances_over_one_sqlite_file_share_the_history(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = CtxkeepSession("conv", url), CtxkeepSession("conv", url)
    run(a.add_items([user("from a")]))
    run(b.add_items([user("from b")]))
    assert run(a.get_items()) == [user("from a"), user("from b")]
    a.close()
    b.close()


def test_the_embedded_default_store_is_used_without_a_url() -> None:
    s, again = CtxkeepSession("conv"), CtxkeepSession("conv")  # the same file, isolated per test
    run(s.add_items([user("hi")]))
    assert run(again.get_items()) == [user("hi")]
    s.close()
    again.close()


# -- the SDK's Runner on CtxkeepSession -------------------------------------------------------


@function_tool
def lookup(city: str) -> str:
    """Look up the weather in a city."""
    return f"sunny in {city}"


def _two_turns(session: Any) -> tuple[list[Any], ScriptedModel]:
    model = ScriptedModel(
        [
            [function_call("lookup", {"city": "Oslo"}, call_id="call_1")],
            [assistant_message("Oslo is sunny.", item_id="msg_a")],
            [
                function_call("lookup", {"city": "Rome"}, call_id="call_2"),
                function_call("lookup", {"city": "Nice"}, call_id="call_3"),
            ],
            [assistant_message("Both sunny.", item_id="msg_b")],
        ]
    )
    agent = Agent(name="weather", instructions="Answer briefly.", model=model, tools=[lookup])
    config = RunConfig(tracing_disabled=True)

    async def main() -> list[Any]:
        first = await Runner.run(agent, "Weather in Oslo?", session=session, run_config=config)
        assert first.final_output == "Oslo is sunny."
        second = await Runner.run(agent, "And Rome and Nice?", session=session, run_config=config)
        assert second.final_output == "Both sunny."
        return list(await session.get_items())

    return run(main()), model


@pytest.mark.parametrize("kind", CTXKEEP_KINDS)
def test_runner_two_turns_with_tool_calls_reads_back_what_it_wrote(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = _store_url(kind, request, tmp_path)
    reference = SQLiteSession("conv", tmp_path / "reference.db")
    ours = CtxkeepSession("conv", url)
    try:
        expected, _ = _two_turns(reference)
        got, model = _two_turns(ours)
        assert got == expected
        assert [i.get("type") for i in got] == [
            None,
            "function_call",
            "function_call_output",
            "message",
            None,
            "function_call",
            "function_call",
            "function_call_output",
            "function_call_output",
            "message",
        ]
        # The second turn's first model call saw the first turn's history, from our session.
        third_call = model.calls[2]
        assert third_call.input[: len(expected[:4])] == expected[:4]
    finally:
        ours.close()
        reference.close()


@pytest.mark.parametrize(
    "kind",
    [
        "ctxkeep-sqlite",
        pytest.param("ctxkeep-redis", marks=pytest.mark.redis),
        pytest.param("ctxkeep-postgres", marks=pytest.mark.postgres),
    ],
)
def test_two_instances_popping_parallel_calls_at_once_lose_and_repeat_nothing(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each pop of a run of calls replaces the message in one transaction: two stores (as
    two processes would have) popping the same session together get every item once."""
    import threading

    url = _store_url(kind, request, tmp_path)
    a, b = CtxkeepSession("conv", url), CtxkeepSession("conv", url)
    calls = [
        {"type": "function_call", "call_id": f"c{k}", "name": "f", "arguments": "{}"}
        for k in range(30)
    ]
    try:
        run(a.add_items([user("go"), *calls]))
        popped: list[Any] = []
        lock = threading.Lock()

        def drain(s: CtxkeepSession) -> None:
            while True:
                item = run(s.pop_item())
                if item is None or item.get("role") == "user":
                    with lock:
                        popped.append(item)
                    return
                with lock:
                    popped.append(item)

        workers = [threading.Thread(target=drain, args=(s,)) for s in (a, b)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        got = [i for i in popped if i is not None and i.get("type") == "function_call"]
        assert sorted(i["call_id"] for i in got) == sorted(c["call_id"] for c in calls)
        assert sum(1 for i in popped if i is not None and i.get("role") == "user") == 1
        assert run(a.get_items()) == []
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("kind", CTXKEEP_KINDS)
def test_a_warm_reader_sees_every_other_writers_change(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """get_items keeps the items it converted between reads (decoding only what it has not
    seen): another instance's adds, pops, clears and the trims past max_history must show
    in its next read exactly as a new instance reads the session.
    """
    import random

    url = _store_url(kind, request, tmp_path)
    config = MemoryConfig(max_history=9)
    # Each instance on its own manager (as in another process), but in process, where the
    # store is the manager's: all on one.
    shared = open_memory(url, config) if url == "memory://" else None

    def session() -> CtxkeepSession:
        if shared is not None:
            return CtxkeepSession("conv", memory=shared)
        return CtxkeepSession("conv", url, config=config)

    reader, writer = session(), session()
    rng = random.Random(7)
    try:
        for step in range(120):
            op = rng.choice(
                ["add", "add", "unit", "pop", "reader-add", "reader-pop", "clear", "read-limit"]
            )
            if op == "add":
                run(writer.add_items([user(f"u{step}")]))
            elif op == "reader-add":  # on the state the reader last saw, the writer's add since
                run(writer.add_items([user(f"u{step}")]))
                run(reader.add_items([user(f"v{step}")]))
            elif op == "unit":
                run(
                    writer.add_items(
                        [
                            {"type": "function_call", "call_id": f"c{step}", "name": "f",
                             "arguments": "{}"},
                            {"type": "function_call_output", "call_id": f"c{step}",
                             "output": f"out{step}"},
                            reply(f"r{step}", f"msg_{step}"),
                        ]
                    )
                )  # fmt: skip
            elif op == "pop":  # an item, and a call it leaves waiting: adds stay valid
                while (popped := run(writer.pop_item())) is not None and popped.get(
                    "type"
                ) == "function_call_output":
                    pass
                tail = run(writer.get_items(1))
                if tail and tail[0].get("type") == "function_call":
                    run(writer.pop_item())
            elif op == "reader-pop":  # the reader's items held may be stale: still exact
                taken = run(reader.pop_item())
                if taken is not None and taken.get("type") == "function_call_output":
                    run(reader.pop_item())  # and its call: adds stay valid
            elif op == "clear":
                run(writer.clear_session())
            fresh = session()
            try:
                want = run(fresh.get_items())
                limit = rng.randint(0, 6)
                assert run(reader.get_items()) == want, (step, op)
                assert run(writer.get_items()) == want, (step, op)
                assert run(reader.get_items(limit)) == (want[-limit:] if limit else [])
            finally:
                fresh.close()
        got = run(reader.get_items())
        if got:  # the items are the caller's: changing them changes no later read
            got[-1]["mutated"] = True
            got.clear()
            assert run(reader.get_items()) == run(writer.get_items())
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("kind", [k for k in CTXKEEP_KINDS if k != "ctxkeep-memory"])
def test_a_pop_after_its_own_add_sees_what_other_writers_did(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # a session that only wrote pops the message it wrote last without reading it first:
    # changed elsewhere (popped and added to, made again), the pop takes the newest all the same
    url = _store_url(kind, request, tmp_path)
    a, b = CtxkeepSession("conv", url), CtxkeepSession("conv", url)
    try:
        run(a.add_items([user("one"), call("c1"), call("c2")]))
        assert run(b.pop_item()) == call("c2")
        run(b.add_items([call("c3")]))  # joins the run of calls: the newest message again
        assert run(a.pop_item()) == call("c3")
        assert run(a.pop_item()) == call("c1")
        run(a.add_items([user("two")]))
        assert run(b.pop_item()) == user("two")
        run(b.add_items([user("three")]))
        assert run(a.pop_item()) == user("three")
        run(a.add_items([user("four")]))
        run(b.clear_session())
        run(b.add_items([user("anew")]))
        assert run(a.pop_item()) == user("anew")
        assert run(a.pop_item()) is None
        assert run(b.get_items()) == []
    finally:
        a.close()
        b.close()

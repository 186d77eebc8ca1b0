"""The adapters' operations on the Redis backend, one round trip each (issue 26): an append, a
pop, a newest-N read and a whole read of the Agents SDK session and the LangChain history are
each one ``EVALSHA`` once the process knows the session (a pop's followed by a ``ZRANGE`` of the
message it leaves newest, in the same write); a pop that finds the session changed by another
process is checked again on the session as it is, and takes the right item.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar
from urllib.parse import urlencode

import pytest

from _frames import frames
from _round_trips import loaded_redis_sends
from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]

T = TypeVar("T")


@pytest.fixture
def url(redis_url: str, redis_prefix_factory: Callable[[], str]) -> str:
    return f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> list[str]:
    """The round trips from now on, the backend's scripts in the server's cache first
    (:func:`_round_trips.loaded_redis_sends`).
    """
    return loaded_redis_sends(monkeypatch, redis_url)


def _config(**limits: Any) -> MemoryConfig:
    # reads write the access time only when it is a minute old: none does in these tests
    return MemoryConfig(
        **{"max_history": None, "max_sessions": None, "access_resolution": 60.0, **limits}
    )


@pytest.fixture(params=[None, 3600.0], ids=["no-ttl", "ttl"])
def config(request: pytest.FixtureRequest) -> MemoryConfig:
    return _config(session_ttl=request.param)


@pytest.fixture
def mem(url: str, config: MemoryConfig) -> Iterator[MemoryManager]:
    with open_memory(url, config) as manager:
        yield manager


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def _item(i: int) -> dict[str, Any]:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"item {i}"}


# -- the Agents SDK session -----------------------------------------------------------------


@pytest.fixture
def agents_session(mem: MemoryManager) -> Any:
    pytest.importorskip("agents")
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    session = CtxkeepSession("conv", memory=mem)
    for i in range(30):
        run(session.add_items([_item(i)]))
    return session


def test_an_agents_sdk_add_is_one_evalsha(agents_session: Any, sent: list[str]) -> None:
    sent.clear()
    run(agents_session.add_items([_item(30)]))
    assert sent == ["EVALSHA"]


POP = "EVALSHA+ZRANGE"
"""A pop: the replace script, then a read of the message it leaves newest (the next pop's
guess), sent as one write."""


def test_agents_sdk_pops_are_one_evalsha_each_and_take_the_newest_items(
    agents_session: Any, sent: list[str]
) -> None:
    run(agents_session.get_items())  # the items held: a pop replaces the newest held
    popped = []
    for _ in range(3):
        sent.clear()
        popped.append(run(agents_session.pop_item()))
        assert sent == [POP]
    assert popped == [_item(29), _item(28), _item(27)]
    sent.clear()
    run(agents_session.add_items([_item(27)]))  # the state after a pop is known
    assert sent == ["EVALSHA"]
    sent.clear()
    assert run(agents_session.pop_item()) == _item(27)
    assert sent == [POP]
    assert run(agents_session.get_items()) == [_item(i) for i in range(27)]


def test_a_pop_after_this_sessions_own_add_is_one_evalsha_without_a_read(
    agents_session: Any, sent: list[str]
) -> None:
    # only written, never read (the Runner's use): the newest message is the one it wrote
    sent.clear()
    assert run(agents_session.pop_item()) == _item(29)
    assert sent == [POP]
    run(
        agents_session.add_items(
            [
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            ]
        )
    )
    sent.clear()  # a message of two items: the pop replaces it by the first, then takes that
    assert run(agents_session.pop_item())["call_id"] == "c2"
    assert run(agents_session.pop_item())["call_id"] == "c1"
    assert sent == ["EVALSHA", POP]  # a replacement (nothing to read after it), then a pop
    assert run(agents_session.get_items()) == [_item(i) for i in range(29)]


def test_a_pop_after_another_writer_follows_its_own_add_takes_the_newest_item(
    url: str, config: MemoryConfig, agents_session: Any
) -> None:
    # the newest message this session wrote is a guess its pop's script checks by seq and
    # generation: taken back and replaced elsewhere, or the session made again, it reads
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    other = CtxkeepSession("conv", url, config=config)
    try:
        assert run(other.pop_item()) == _item(29)
        run(other.add_items([{"role": "user", "content": "from elsewhere"}]))
        assert run(agents_session.pop_item()) == {"role": "user", "content": "from elsewhere"}
        run(agents_session.add_items([_item(29)]))
        run(other.clear_session())
        run(other.add_items([_item(0)]))
        assert run(agents_session.pop_item()) == _item(0)
        assert run(agents_session.pop_item()) is None
    finally:
        other.close()


WHOLE_READ = "MULTI+HGETALL+ZRANGEBYSCORE+EXEC"
"""A whole read: one transaction sent as one write (not a script: its answer would be copied
through Lua)."""


def test_agents_sdk_reads_are_one_round_trip_each(agents_session: Any, sent: list[str]) -> None:
    sent.clear()
    assert run(agents_session.get_items(limit=20)) == [_item(i) for i in range(10, 30)]
    assert run(agents_session.get_items()) == [_item(i) for i in range(30)]
    assert run(agents_session.get_items(limit=20)) == [_item(i) for i in range(10, 30)]
    assert sent == ["EVALSHA", WHOLE_READ, WHOLE_READ]  # the held items checked after the first


def test_a_new_agents_sdk_session_pops_after_one_read(
    url: str, config: MemoryConfig, agents_session: Any, sent: list[str]
) -> None:
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    other = CtxkeepSession("conv", url, config=config)
    try:
        sent.clear()
        assert run(other.pop_item()) == _item(29)
        assert sent == ["EVALSHA", POP]  # the newest message, then the pop
    finally:
        other.close()


def test_a_pop_after_another_process_changed_the_session_takes_the_newest_item(
    url: str, config: MemoryConfig, agents_session: Any, sent: list[str]
) -> None:
    # what this process remembers (the state, the newest message) is a guess the script
    # checks: changed elsewhere, the pop is checked again on the session as it is
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    run(agents_session.get_items())
    other = CtxkeepSession("conv", url, config=config)
    try:
        assert run(other.pop_item()) == _item(29)
        run(other.add_items([{"role": "user", "content": "from elsewhere"}]))
        assert run(agents_session.pop_item()) == {"role": "user", "content": "from elsewhere"}
        assert run(agents_session.pop_item()) == _item(28)
        assert run(other.pop_item()) == _item(27)
        assert run(agents_session.get_items()) == [_item(i) for i in range(27)]
        assert run(other.get_items()) == [_item(i) for i in range(27)]
    finally:
        other.close()


def test_a_pop_whose_newest_message_another_process_took_back_takes_the_one_now_newest(
    url: str, config: MemoryConfig, agents_session: Any, sent: list[str]
) -> None:
    # nothing above the seq it holds and nothing at it: the script's removal finds none,
    # changes nothing and refuses the pop, which is then done on the session as it is
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    run(agents_session.get_items())
    other = CtxkeepSession("conv", url, config=config)
    try:
        assert run(other.pop_item()) == _item(29)
        sent.clear()
        assert run(agents_session.pop_item()) == _item(28)
        # refused on the items held; the newest message read, then the pop done on it
        assert sent == [POP, "EVALSHA", POP]
        assert run(other.get_items()) == [_item(i) for i in range(28)]
    finally:
        other.close()
    info = agents_session.memory.get_session("conv")
    assert (info.message_count, info.next_seq) == (28, 31)


# -- the manager's replace -------------------------------------------------------------------


def test_replace_newest_is_one_evalsha_once_the_newest_message_was_read(
    mem: MemoryManager, sent: list[str]
) -> None:
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "hello")
    newest = mem.add_message(sid, "assistant", "hi")
    sent.clear()
    mem.replace_newest(sid, [{"role": "assistant", "content": "hi there"}], newest_id=newest.id)
    assert sent == ["EVALSHA"]
    assert [m.content for m in mem.get_messages(sid)] == ["hello", "hi there"]


def test_a_replace_keeps_the_pending_calls_as_the_session_holds_them(
    mem: MemoryManager, sent: list[str]
) -> None:
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "what time is it?")
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    mem.add_message(sid, "assistant", None, tool_calls=[call])
    result = mem.add_message(sid, "tool", "12:00", tool_call_id="c1")
    sent.clear()
    mem.replace_newest(sid, [], newest_id=result.id)  # the call waits again
    assert sent == [POP]
    assert mem.get_session(sid).pending == ("c1",)
    fresh = mem.replace_newest(sid, [], newest_id=mem.get_messages(sid, limit=1)[0].id or "")
    assert fresh == [] and mem.get_session(sid).pending == ()
    assert mem.get_session(sid).message_count == 1


# -- the LangChain history -------------------------------------------------------------------


def test_langchain_history_adds_and_reads_are_one_round_trip_each(
    url: str, config: MemoryConfig, mem: MemoryManager, sent: list[str]
) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage

    from ctxkeep.integrations.langchain import CtxkeepChatMessageHistory

    history = CtxkeepChatMessageHistory("chat", memory=mem)
    history.add_message(HumanMessage("hello"))
    sent.clear()
    history.add_message(AIMessage("hi"))
    history.add_message(HumanMessage("how are you?"))
    assert sent == ["EVALSHA"] * 2
    sent.clear()
    assert [m.content for m in history.messages] == ["hello", "hi", "how are you?"]
    assert sent == [WHOLE_READ]
    # a new object, as RunnableWithMessageHistory makes each turn: read, then add
    other = CtxkeepChatMessageHistory("chat", url, config=config)
    try:
        sent.clear()
        assert len(other.messages) == 3
        other.add_message(AIMessage("fine"))
        assert sent == [WHOLE_READ, "EVALSHA"]
    finally:
        other.close()
    assert [m.content for m in history.messages][-1] == "fine"


def test_a_read_that_writes_the_access_time_writes_it_in_one_evalsha(
    url: str, sent: list[str]
) -> None:
    with open_memory(url, _config(session_ttl=3600.0, access_resolution=0.0)) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hello")
        before = mem.get_session(sid).accessed_at
        sent.clear()
        assert [m.content for m in mem.get_messages(sid)] == ["hello"]
        assert sent == [WHOLE_READ, "EVALSHA"]  # the read, then its access
        after = mem.get_session(sid)
        assert after.accessed_at > before
        client = redis.Redis.from_url(url.split("?")[0])
        prefix = url.split("prefix=")[1].replace("%3A", ":")
        try:
            score = client.zscore(f"{prefix}accessed", sid)
            deadline = client.pexpiretime(f"{prefix}session:{sid}")
        finally:
            client.close()
        assert score == after.accessed_at
        assert deadline >= (after.accessed_at + 2 * 3600.0) * 1000 - 1000


# -- what a write's script does on the server --------------------------------------------------


def _raw(url: str) -> tuple[Any, str]:
    """A plain client of the test's Redis and the test's key prefix."""
    prefix = url.split("prefix=")[1].replace("%3A", ":")
    return redis.Redis.from_url(url.split("?")[0], decode_responses=True), prefix


def _hour_ttl(url: str, now: list[float]) -> MemoryManager:
    """Sessions at ``url`` with a one-hour TTL and a one-second touch resolution, on the
    clock ``now[0]``."""
    return open_memory(
        url, _config(session_ttl=3600.0, access_resolution=1.0), clock=lambda: now[0]
    )


def test_writes_within_the_touch_resolution_leave_the_access_and_the_deadline(url: str) -> None:
    # as on SQL (Append.touch_after): a session written many times a second moves its
    # accessed_at, its place in the accessed index and its keys' deadline once a second,
    # which spares an append six of its script's twelve commands
    now = [1_000_000.0]
    config = _config(session_ttl=3600.0, access_resolution=1.0)
    client, prefix = _raw(url)
    with open_memory(url, config, clock=lambda: now[0]) as mem:
        sid = mem.create_session("agent")
        now[0] += 0.25
        mem.add_message(sid, "user", "hello")  # the session's first keys: they get a deadline
        own = [f"{prefix}{kind}:{sid}" for kind in ("session", "messages", "roles", "ids")]
        deadlines = [client.pexpiretime(key) for key in own]
        assert all(d > 0 for d in deadlines) and len(set(deadlines)) == 1
        for _ in range(3):  # 0.25 s after the create, then within 0.75 s
            now[0] += 0.15
            mem.add_message(sid, "assistant", "hi")
            newest = mem.get_messages(sid, limit=1)[0]
            now[0] += 0.05
            mem.replace_newest(sid, [], newest_id=newest.id or "")
        assert client.zscore(f"{prefix}accessed", sid) == 1_000_000.0
        assert mem.get_session(sid).accessed_at == 1_000_000.0
        assert [client.pexpiretime(key) for key in own] == deadlines
        now[0] += 1.0
        time.sleep(0.002)  # the deadline is the wall clock's (in ms) plus the TTL and grace
        mem.add_message(sid, "assistant", "later")
        assert client.zscore(f"{prefix}accessed", sid) == now[0]
        assert mem.get_session(sid).accessed_at == now[0]
        moved = [client.pexpiretime(key) for key in own]
        assert len(set(moved)) == 1 and moved[0] > deadlines[0]
        assert client.zscore(f"{prefix}expires", sid) == moved[0]
    client.close()


@pytest.mark.parametrize(
    ("spelt", "step", "moved"),
    [
        ("5000000.000", 0.5, False),  # the time this process saw, written otherwise
        ("5000000.250", 0.5, False),  # later: another writer moved it
        ("5000000.250", 1.5, True),  # later, and now past the resolution from it
    ],
    ids=["same-time", "moved-by-another", "past-the-resolution"],
)
def test_an_append_on_an_access_time_spelt_otherwise_compares_it_as_a_number(
    url: str, sent: list[str], spelt: str, step: float, moved: bool
) -> None:
    # the append script takes the client's word on whether the access moves only for a hash
    # holding the accessed_at the client saw, as it wrote it; any other text is compared, and
    # the access worked out, as numbers on the server
    now = [5_000_000.0]
    client, prefix = _raw(url)
    with open_memory(url, _config(access_resolution=1.0), clock=lambda: now[0]) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hello")
        client.hset(f"{prefix}session:{sid}", "accessed_at", spelt)
        now[0] += step
        sent.clear()
        mem.add_message(sid, "assistant", "hi")
        assert sent == ["EVALSHA"]  # not refused: the stored time is no earlier than seen
        stored = client.hget(f"{prefix}session:{sid}", "accessed_at")
        assert stored == (repr(now[0]) if moved else spelt)
        assert mem.get_session(sid).accessed_at == float(stored)
        assert client.zscore(f"{prefix}accessed", sid) == (now[0] if moved else 5_000_000.0)
        assert [m.content for m in mem.get_messages(sid)] == ["hello", "hi"]
    client.close()


def _key_names(call: Callable[[], Any]) -> list[str]:
    """The methods of :class:`~ctxkeep.sessions.redis.RedisKeys` that ``call`` runs."""
    from ctxkeep.sessions.redis import RedisKeys

    code = {f.__code__ for f in vars(RedisKeys).values() if callable(f)}
    code |= {p.fget.__code__ for p in vars(RedisKeys).values() if isinstance(p, property)}
    return frames(call, code)


def test_a_write_names_its_script_keys_in_one_call(url: str) -> None:
    # an add, a replacement and a pop each name the six KEYS of their script in one call
    # (before: own, session, messages, roles, ids, accessed, expires: seven calls a write)
    with open_memory(url, _config()) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hello")
        assert _key_names(lambda: mem.add_message(sid, "assistant", "hi")) == ["written"]
        newest = mem.get_messages(sid, limit=1)[0]
        replace = [{"role": "assistant", "content": "hey"}]
        assert _key_names(lambda: mem.replace_newest(sid, replace, newest_id=newest.id or "")) == [
            "written"
        ]
        newest = mem.get_messages(sid, limit=1)[0]
        assert _key_names(lambda: mem.replace_newest(sid, [], newest_id=newest.id or "")) == [
            "written"
        ]
        assert [m.content for m in mem.get_messages(sid)] == ["hello"]


def test_a_write_that_makes_the_keys_again_gives_them_the_deadline(url: str) -> None:
    # a pop of the only message deletes the messages, roles and ids keys; the next write
    # within the touch resolution makes them again, with the session's deadline
    now = [2_000_000.0]
    client, prefix = _raw(url)
    with _hour_ttl(url, now) as mem:
        sid = mem.create_session("agent")
        only = mem.add_message(sid, "user", "hello")
        mem.replace_newest(sid, [], newest_id=only.id or "")
        own = [f"{prefix}{kind}:{sid}" for kind in ("messages", "roles", "ids")]
        assert client.exists(*own) == 0
        now[0] += 0.5
        mem.add_message(sid, "user", "again")
        newest = mem.get_messages(sid, limit=1)[0]
        now[0] += 0.1
        mem.replace_newest(sid, [{"role": "user", "content": "once more"}], newest_id=newest.id)
        assert all(client.pexpiretime(key) > 0 for key in own)
    with open_memory(url, _config(session_ttl=None, access_resolution=1.0)) as mem:
        mem.add_message(sid, "assistant", "no TTL here")  # a touch: the keys persist
        assert [
            client.pexpiretime(f"{prefix}{k}:{sid}")
            for k in ("session", *[o.split(":")[-2] for o in own])
        ] == [-1] * 4
    client.close()


def test_the_keys_a_write_names_are_the_session_keys_and_its_indexes() -> None:
    # written() is the one call a write makes for its KEYS: the same names as own() and the
    # accessed and expires indexes, from the one place they are spelt
    from ctxkeep.sessions.redis import RedisKeys

    keys = RedisKeys("app:")
    assert keys.written("s1") == [*keys.own("s1"), keys.accessed, keys.expires]
    assert keys.own("s1") == (
        keys.session("s1"),
        keys.messages("s1"),
        keys.roles("s1"),
        keys.ids("s1"),
    )
    assert keys.written("s1") == [
        "app:session:s1",
        "app:messages:s1",
        "app:roles:s1",
        "app:ids:s1",
        "app:accessed",
        "app:expires",
    ]


def test_an_add_on_the_common_path_gives_an_ids_hash_without_a_deadline_the_sessions(
    url: str,
) -> None:
    # an add within the touch resolution on the state this process saw takes the script's
    # common path; an ids hash without a deadline (made by a writer that did not set one,
    # here one deleted) gets the session's, as on the general path, and the add is stored
    now = [2_000_000.0]
    client, prefix = _raw(url)
    with _hour_ttl(url, now) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hello")
        ids = f"{prefix}ids:{sid}"
        assert client.pexpiretime(ids) > 0
        client.delete(ids)
        now[0] += 0.1
        mem.add_message(sid, "assistant", "hi")
        assert abs(client.pexpiretime(ids) - client.pexpiretime(f"{prefix}session:{sid}")) < 60_000
        client.persist(ids)
        now[0] += 0.1
        mem.add_message(sid, "user", "again")
        assert abs(client.pexpiretime(ids) - client.pexpiretime(f"{prefix}session:{sid}")) < 60_000
        assert client.hlen(ids) == 2
        assert [m.content for m in mem.get_messages(sid)] == ["hello", "hi", "again"]
    client.close()

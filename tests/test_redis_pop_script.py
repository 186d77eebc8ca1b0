"""A pop on Redis (``replace_newest`` by nothing, the Agents SDK's ``pop_item``) runs its own
script, :data:`~ctxkeep.sessions.redis.POP_SCRIPT` (issue 26): the commands it runs on the
server, seen by ``MONITOR``, and each of its paths kept to what the replace script did: the
newest message checked by ``next_seq`` where it is as it was when that message was seen newest
(else counted), the access time compared as stored (else as a number), the access and the
keys' deadline moved where the manager's touch resolution says.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from _round_trips import load_redis_scripts, loaded_redis_sends
from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.errors import SessionChangedError
from ctxkeep.messages import ToolCall
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]


@pytest.fixture
def prefix(redis_prefix_factory: Callable[[], str]) -> str:
    return redis_prefix_factory()


@pytest.fixture
def url(redis_url: str, prefix: str) -> str:
    return f"{redis_url}?{urlencode({'prefix': prefix})}"


@pytest.fixture
def raw(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def _config(**limits: Any) -> MemoryConfig:
    return MemoryConfig(
        **{"max_history": None, "max_sessions": None, "access_resolution": 60.0, **limits}
    )


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> list[str]:
    """The round trips from now on, the backend's scripts in the server's cache first."""
    return loaded_redis_sends(monkeypatch, redis_url)


class Monitor:
    """The commands the server runs on keys under ``prefix`` (a script's own as ``lua:NAME``,
    a client's as ``NAME``) while the ``with`` block runs, by ``MONITOR``.
    """

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.seen: list[str] = []
        self._client = redis.Redis.from_url(redis_url, decode_responses=True)
        self._ready = threading.Event()
        self._marker = f"{prefix}end-of-monitor"

    def __enter__(self) -> list[str]:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        return self.seen

    def _watch(self) -> None:
        with self._client.monitor() as m:
            self._ready.set()
            for event in m.listen():
                command = event["command"]
                if self._marker in command:
                    return
                if self.prefix not in command:
                    continue
                name = command.split(" ")[0].upper()
                lua = event.get("client_type") == "lua" or event.get("client_address") == "lua"
                self.seen.append(f"lua:{name}" if lua else name)

    def __exit__(self, *exc: Any) -> None:
        marker = redis.Redis.from_url(self.redis_url)
        try:
            marker.echo(self._marker)
        finally:
            marker.close()
        self._thread.join(10)
        self._client.close()


@pytest.fixture(autouse=True)
def _scripts_loaded(redis_url: str) -> None:
    """The scripts in the server's cache before a test watches what a pop runs."""
    load_redis_scripts(redis_url)


def _session(mem: MemoryManager, n: int = 4) -> str:
    sid = mem.create_session("agent")
    for i in range(n):
        mem.add_message(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
    return sid


def _pop(mem: MemoryManager, sid: str) -> None:
    newest = mem.get_messages(sid, limit=1)[0]
    mem.replace_newest(sid, [], newest_id=newest.id or "")


MONITORS = {"HELLO", "CLIENT", "MONITOR", "ECHO", "PING"}
"""What :class:`Monitor`'s own connections send."""

SCRIPT = [
    "EVALSHA",
    "lua:HMGET",
    "lua:ZREMRANGEBYSCORE",
    "lua:ZREM",
    "lua:HGET",
    "lua:HDEL",
    "lua:HSET",
    "ZRANGE",
]
"""A pop of a message seen newest with the session's next seq as it still is: the script's six
commands (no count of the messages above it), then the read of the message it leaves newest."""


def test_a_pop_counts_no_message_above_the_newest_while_next_seq_is_as_seen(
    url: str, redis_url: str, prefix: str
) -> None:
    with open_memory(url, _config()) as mem:
        sid = _session(mem)
        newest = mem.get_messages(sid, limit=1)[0]  # read: seen newest, with next_seq
        with Monitor(redis_url, prefix) as seen:
            mem.replace_newest(sid, [], newest_id=newest.id or "")
        assert seen == SCRIPT
        backend: Any = mem.backend
        top = backend._tops.get(sid)  # the one it left newest: from the ZRANGE after it
        with Monitor(redis_url, prefix) as seen:
            mem._replace(sid, [], newest_seq=top.seq, generation=top.generation)
        assert seen == SCRIPT
        assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1"]


def test_a_pop_after_another_writer_added_and_took_back_counts_and_takes_the_newest(
    url: str, redis_url: str, prefix: str, sent: list[str]
) -> None:
    with open_memory(url, _config()) as mem, open_memory(url, _config()) as other:
        sid = _session(mem)
        newest = mem.get_messages(sid, limit=1)[0]
        added = other.add_message(sid, "user", "elsewhere")  # next_seq moves past it
        other.replace_newest(sid, [], newest_id=added.id or "")
        sent.clear()
        with Monitor(redis_url, prefix) as seen:
            mem.replace_newest(sid, [], newest_id=newest.id or "")
        # still one round trip (the monitor's own commands left out): counted on the server
        assert [c for c in sent if c.split("+")[0] not in MONITORS] == ["EVALSHA+ZRANGE"]
        assert seen == [*SCRIPT[:2], "lua:ZCOUNT", *SCRIPT[2:]]
        assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1", "m2"]


def test_a_pop_after_another_writer_added_is_refused_on_the_message_it_saw(url: str) -> None:
    with open_memory(url, _config()) as mem, open_memory(url, _config()) as other:
        sid = _session(mem)
        newest = mem.get_messages(sid, limit=1)[0]
        other.add_message(sid, "user", "elsewhere")
        backend: Any = mem.backend
        seen = backend._tops.get(sid)
        with pytest.raises(SessionChangedError):  # m3 is no longer the newest: nothing taken
            mem._replace(sid, [], newest_seq=seen.seq, generation=seen.generation)
        assert [m.content for m in other.get_messages(sid)] == ["m0", "m1", "m2", "m3", "elsewhere"]
        mem.replace_newest(sid, [], newest_id=other.get_messages(sid, limit=1)[0].id or "")
        assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1", "m2", "m3"]
        assert newest.content == "m3"


def test_a_pop_of_a_message_another_writer_took_back_is_refused_and_takes_nothing(
    url: str, redis_url: str, prefix: str, raw: Any
) -> None:
    # The other writer's pop leaves next_seq, pending and the access time as this process saw
    # them: only the removal at the seq seen finds that the message is gone.
    with open_memory(url, _config()) as mem, open_memory(url, _config()) as other:
        sid = _session(mem)
        mem.get_messages(sid, limit=1)  # m3 seen newest, with next_seq
        _pop(other, sid)
        backend: Any = mem.backend
        seen = backend._tops.get(sid)
        before = raw.hgetall(f"{prefix}session:{sid}")
        with Monitor(redis_url, prefix) as commands, pytest.raises(SessionChangedError):
            mem._replace(sid, [], newest_seq=seen.seq, generation=seen.generation)
        assert commands[:3] == SCRIPT[:3]  # no count: next_seq as seen
        assert raw.hgetall(f"{prefix}session:{sid}") == before
        assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1", "m2"]
        assert mem.get_session(sid).message_count == 3


def test_a_pop_of_a_tool_result_leaves_its_call_waiting_in_the_hash(
    url: str, redis_url: str, prefix: str, raw: Any
) -> None:
    # pending changes with this pop (the call waits again): the hash is written with it,
    # and a manager that knows nothing of the session reads it from there
    with open_memory(url, _config()) as mem, open_memory(url, _config()) as other:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "weather?")
        mem.add_message(sid, "assistant", None, tool_calls=[ToolCall("c1", "weather", "{}")])
        mem.add_message(sid, "tool", "sunny", tool_call_id="c1")
        before = raw.hget(f"{prefix}session:{sid}", "pending")
        newest = mem.get_messages(sid, limit=1)[0]
        with Monitor(redis_url, prefix) as commands:
            mem.replace_newest(sid, [], newest_id=newest.id or "")
        assert commands[:3] == SCRIPT[:3]  # the script's common case
        assert raw.hget(f"{prefix}session:{sid}", "pending") != before
        assert other.get_session(sid).pending == ("c1",)
        assert [m.role for m in other.get_messages(sid)] == ["user", "assistant"]


def test_a_pop_moves_the_access_its_index_and_the_deadline_past_the_touch_resolution(
    url: str, raw: Any, prefix: str
) -> None:
    now = [3_000_000.0]
    config = _config(session_ttl=3600.0, access_resolution=1.0)
    with open_memory(url, config, clock=lambda: now[0]) as mem:
        sid = _session(mem)
        own = [f"{prefix}{kind}:{sid}" for kind in ("session", "messages", "roles", "ids")]
        before = [raw.pexpiretime(key) for key in own]
        newest = mem.get_messages(sid, limit=1)[0]
        now[0] += 0.5  # within the resolution: left as it was
        mem.replace_newest(sid, [], newest_id=newest.id or "")
        assert raw.hget(f"{prefix}session:{sid}", "accessed_at") == repr(3_000_000.0)
        assert raw.zscore(f"{prefix}accessed", sid) == 3_000_000.0
        now[0] += 2.0  # past it: moved, with the index and the keys' deadline
        newest = mem.get_messages(sid, limit=1)[0]
        mem.replace_newest(sid, [], newest_id=newest.id or "")
        assert raw.hget(f"{prefix}session:{sid}", "accessed_at") == repr(now[0])
        assert raw.zscore(f"{prefix}accessed", sid) == now[0]
        assert mem.get_session(sid).accessed_at == now[0]
        moved = [raw.pexpiretime(key) for key in own]
        assert len(set(moved)) == 1 and moved[0] >= before[0]
        assert raw.zscore(f"{prefix}expires", sid) == moved[0]
        assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1"]


@pytest.mark.parametrize("later", [False, True], ids=["same-time", "moved-by-another"])
def test_a_pop_on_an_access_time_spelt_otherwise_compares_it_as_a_number(
    url: str, raw: Any, prefix: str, sent: list[str], later: bool
) -> None:
    # the hash's accessed_at in another spelling of the time this process saw (or a later
    # one, written by another process): the script compares it as a number, and leaves it
    now = [4_000_000.0]
    with open_memory(url, _config(access_resolution=60.0), clock=lambda: now[0]) as mem:
        sid = _session(mem)
        newest = mem.get_messages(sid, limit=1)[0]
        spelt = "4000000.250" if later else "4000000.000"
        raw.hset(f"{prefix}session:{sid}", "accessed_at", spelt)
        now[0] += 1.0
        sent.clear()
        mem.replace_newest(sid, [], newest_id=newest.id or "")
        assert sent == ["EVALSHA+ZRANGE"]
        assert raw.hget(f"{prefix}session:{sid}", "accessed_at") == spelt
        assert mem.get_session(sid).accessed_at == float(spelt)
        assert [m.content for m in mem.get_messages(sid)] == ["m0", "m1", "m2"]


def test_a_pop_leaves_the_roles_and_ids_indexes_as_its_messages(
    url: str, raw: Any, prefix: str
) -> None:
    with open_memory(url, _config()) as mem:
        sid = _session(mem, 6)
        for _ in range(3):
            _pop(mem, sid)
        held = mem.get_messages(sid)
        assert [m.content for m in held] == ["m0", "m1", "m2"]
        seqs = [int(s) for _, s in raw.zrange(f"{prefix}messages:{sid}", 0, -1, withscores=True)]
        assert seqs == [1, 2, 3]
        roles = raw.zrange(f"{prefix}roles:{sid}", 0, -1)
        rows = list(zip(held, seqs, strict=True))
        assert sorted(roles) == sorted(f"{m.role}:{s:020d}" for m, s in rows)
        ids = raw.hgetall(f"{prefix}ids:{sid}")
        assert ids == {m.id: str(s) for m, s in rows}
        info = mem.get_session(sid)
        assert info.message_count == 3
        assert info.next_seq == 7  # a pop leaves next_seq as it was


def test_an_agents_sdk_pop_and_re_add_run_the_pop_script(
    url: str, redis_url: str, prefix: str
) -> None:
    pytest.importorskip("agents")
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    items = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"item {i}"} for i in range(8)
    ]
    with open_memory(url, _config()) as mem:
        session = CtxkeepSession("conv", memory=mem)
        asyncio.run(session.add_items(items))
        assert asyncio.run(session.get_items()) == items
        for _ in range(3):  # as bench/peers.py times it: a pop, the item put back
            with Monitor(redis_url, prefix) as seen:
                item = asyncio.run(session.pop_item())
            assert item == items[-1]
            assert seen == SCRIPT
            asyncio.run(session.add_items([item]))
        assert asyncio.run(session.get_items()) == items

"""The Redis backend reads a session's newest messages by themselves: ``read_tail`` answers what
the base class cuts from a read of every message (:func:`~ctxkeep.sessions.base.tail_of`),
from the roles index, whatever the session went through (appends of any role, pops,
replacements, trims, an index missing or out of step), and a paged prompt of a long session
reads a few pages, not every message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.demo import demo_session
from ctxkeep.messages import Message, ToolCall
from ctxkeep.prune import TokenPruner
from ctxkeep.sessions import open_memory
from ctxkeep.sessions import redis as redis_sessions
from ctxkeep.sessions.base import MemoryConfig, MemoryManager, tail_of
from ctxkeep.sessions.records import Append, message_to_record
from ctxkeep.sessions.redis import RedisBackend

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]

ROLES = ["system", "developer", "user", "assistant", "tool"]
# Texts that look like what the index or a role match reads: never taken for a role.
TEXTS = [
    "plain",
    '"role":"system"',
    '{"v":1,"role":"user"}',
    "user:00000000000000000001",
    "system",
    "",
]


@pytest.fixture
def url(redis_url: str, redis_prefix_factory: Callable[[], str]) -> str:
    return f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}"


@pytest.fixture
def mem(url: str) -> Iterator[MemoryManager]:
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory(url, config) as manager:
        yield manager


def _message(role: str, text: str, meta_role: bool) -> Message:
    metadata = {"role": "system"} if meta_role else {}
    if role == "tool":
        return Message("tool", text or "out", tool_call_id="c1", metadata=metadata)
    if role == "assistant" and not text:
        return Message("assistant", None, tool_calls=[ToolCall("c1", "run", "{}")])
    return Message(role, text or "x", metadata=metadata)


def _append(backend: RedisBackend, sid: str, messages: list[Message], **how: Any) -> None:
    batch = Append(
        records=[message_to_record(m) for m in messages],
        check=lambda info: (),
        now=time.time(),
        ttl=None,
        **how,
    )
    backend.append(sid, batch)


message = st.builds(_message, st.sampled_from(ROLES), st.sampled_from(TEXTS), st.booleans())
operation = st.one_of(
    st.tuples(st.just("append"), st.lists(message, min_size=1, max_size=4)),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("replace"), st.lists(message, max_size=2)),
    st.tuples(st.just("trim"), st.integers(0, 6)),
    st.tuples(st.just("unindex"), st.none()),  # as written before the index existed
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    operations=st.lists(operation, max_size=40),
    reads=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 12)),
            st.one_of(st.none(), st.integers(-1, 50)),
            st.sets(st.sampled_from(ROLES), max_size=3),
            st.one_of(st.none(), st.sampled_from(ROLES)),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_read_tail_is_the_tail_of_every_message(
    mem: MemoryManager,
    operations: list[tuple[str, Any]],
    reads: list[tuple[int | None, int | None, set[str], str | None]],
) -> None:
    backend = mem.backend
    assert isinstance(backend, RedisBackend)
    sid = mem.create_session("agent-tail")
    generation = mem.get_session(sid).generation
    for op, arg in operations:
        if op == "append":
            _append(backend, sid, arg)
        elif op == "pop":
            backend.pop_newest(sid, generation)
        elif op == "replace":
            rows = backend.messages(sid)
            if rows:
                _append(backend, sid, arg, replaces=rows[-1][0])
        elif op == "unindex":
            backend.db.conn.delete(backend.keys.roles(sid))
        else:
            info = mem.get_session(sid)
            backend.remove_oldest(sid, info.first_seq - 1 + arg, generation)
    for limit, before_seq, roles, newest_role in reads:
        want = backend.read(sid)
        assert want is not None
        got = backend.read_tail(
            sid, limit=limit, before_seq=before_seq, roles=roles, newest_role=newest_role
        )
        expected = tail_of(
            want, limit=limit, before_seq=before_seq, roles=roles, newest_role=newest_role
        )
        assert got == expected
    assert backend.read_tail(sid + "-gone", limit=3) is None


def test_a_session_without_its_index_is_read_whole_and_indexed_again(
    mem: MemoryManager, url: str
) -> None:
    backend = mem.backend
    assert isinstance(backend, RedisBackend)
    sid = mem.create_session("agent-old")
    for i in range(30):
        mem.add_message(sid, ["system", "user", "assistant"][i % 3], f"m{i}")
    client = redis.Redis.from_url(url.partition("?")[0], decode_responses=True)
    try:
        roles = backend.keys.roles(sid)
        assert client.zcard(roles) == 30
        client.delete(roles)  # as a session written before the index existed
        args: dict[str, Any] = {"limit": 4, "roles": ("system",), "newest_role": "user"}
        snap = backend.read(sid)
        assert snap is not None
        assert backend.read_tail(sid, **args) == tail_of(snap, before_seq=None, **args)
        assert client.zcard(roles) == 30  # rebuilt on the way
        client.zrem(roles, client.zrange(roles, 0, 0)[0])  # one entry short: read whole too
        assert backend.read_tail(sid, **args) == tail_of(snap, before_seq=None, **args)
        assert client.zcard(roles) == 30
    finally:
        client.close()


def test_the_index_expires_with_the_session(url: str) -> None:
    config = MemoryConfig(max_history=3, session_ttl=600, max_sessions=None)
    with open_memory(url, config) as mem:
        backend = mem.backend
        assert isinstance(backend, RedisBackend)
        sid = mem.create_session("agent-ttl")
        for i in range(5):  # trimmed to the newest 3: their entries only
            mem.add_message(sid, "user", f"m{i}")
        client = redis.Redis.from_url(url.partition("?")[0], decode_responses=True)
        try:
            roles = backend.keys.roles(sid)
            assert client.zcard(roles) == len(mem.get_messages(sid)) == 3
            assert abs(client.pttl(roles) - client.pttl(backend.keys.messages(sid))) < 5_000
            mem.delete_session(sid)
            assert not client.exists(roles)
        finally:
            client.close()


def test_a_paged_prompt_of_a_long_session_reads_a_few_pages(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory(url, config) as mem:
        sid = mem.create_session("agent-long")
        messages = demo_session(1000)
        for start in range(0, len(messages), 500):
            mem.add_messages(sid, messages[start : start + 500])
        total = mem.get_session(sid).message_count
        assert total > 2000

    class WholePruner(TokenPruner):  # another type: the manager reads every message
        pass

    args: dict[str, Any] = {"max_token_budget": 2000, "cache_stable": False}
    with open_memory(url, config) as whole:
        want = whole.build_prompt_messages(sid, pruner=WholePruner(**args))

    sent: list[str] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def name(command: Any) -> None:
        packed = command if isinstance(command, bytes) else b"".join(command)
        # RESP arrays: "*<n>\r\n$<len>\r\n<NAME>\r\n...", one per command in the send.
        parts = packed.split(b"\r\n")
        found = [parts[i + 2].decode() for i, p in enumerate(parts[:-2]) if p.startswith(b"*")]
        sent.append("+".join(n.upper() for n in found))

    def sending(self: Any, command: Any, check_health: bool = True) -> None:
        name(command)
        send(self, command, check_health)

    from ctxkeep._redis import Direct

    roundtrip = Direct._roundtrip

    def sending_raw(self: Any, conn: Any, packed: bytes, replies: int) -> Any:
        if self.raw:  # sent on the socket itself (ctxkeep._redis.Direct)
            name(packed)
        return roundtrip(self, conn, packed, replies)

    parsed: list[str] = []
    parse = redis_sessions.parse_member

    def counting(session_id: str, member: str) -> Any:
        parsed.append(member)
        return parse(session_id, member)

    with open_memory(url, config) as cold:  # a new process: no cache of the session
        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", sending)
        monkeypatch.setattr(Direct, "_roundtrip", sending_raw)
        monkeypatch.setattr(redis_sessions, "parse_member", counting)
        got = cold.build_prompt_messages(sid, pruner=TokenPruner(**args))
    assert got == want
    assert 0 < len(parsed) < total / 10  # the pages and the marks, not every message
    assert "EVALSHA" in sent and len(sent) < 10, sent  # a few round trips, each a short answer

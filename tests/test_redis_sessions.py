"""What the Redis session backend promises beyond the session contract: an append to a session
this process knows is one round trip (one ``EVALSHA``), whatever the TTL and the messages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from _round_trips import (
    a_session_made_again_is_checked_as_it_now_is,
    appends_in_turn_keep_every_seq,
    known_session_round_trips,
    loaded_redis_sends,
    tool_unit_round_trips,
)
from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.messages import Message
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.redis import RedisBackend, role_member

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]


@pytest.fixture
def url(redis_url: str, redis_prefix_factory: Callable[[], str]) -> str:
    return f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> list[str]:
    """The round trips from now on, the backend's scripts in the server's cache first
    (:func:`_round_trips.loaded_redis_sends`).
    """
    return loaded_redis_sends(monkeypatch, redis_url)


def _open(url: str, **limits: Any) -> MemoryManager:
    config = MemoryConfig(**{"max_history": None, "max_sessions": None, **limits})
    return open_memory(url, config)


@pytest.fixture
def mem(url: str) -> Iterator[MemoryManager]:
    with _open(url, session_ttl=None) as manager:
        yield manager


def test_an_append_to_a_known_session_is_one_evalsha(mem: MemoryManager, sent: list[str]) -> None:
    assert known_session_round_trips(mem, sent) == ["EVALSHA"] * 3


def test_an_append_with_a_ttl_is_one_evalsha(url: str, sent: list[str]) -> None:
    with _open(url, session_ttl=3600.0) as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "hello")
        sent.clear()
        mem.add_message(sid, "assistant", "hi")
        assert sent == ["EVALSHA"]


def test_a_tool_unit_appends_one_message_at_a_time_in_one_round_trip_each(
    mem: MemoryManager, sent: list[str]
) -> None:
    assert tool_unit_round_trips(mem, sent) == ["EVALSHA"] * 3


def test_appends_from_two_managers_in_turn_keep_every_seq(url: str) -> None:
    with _open(url, session_ttl=None) as a, _open(url, session_ttl=None) as b:
        appends_in_turn_keep_every_seq(a, b)


def test_an_append_to_a_session_made_again_elsewhere_is_checked_on_the_new_one(url: str) -> None:
    # the compare-and-set compares the generation: a remembered state of the session deleted
    # meanwhile is not taken for the new one (its first seq would let max_history overflow)
    with (
        _open(url, max_history=5, session_ttl=None) as a,
        _open(url, max_history=5, session_ttl=None) as b,
    ):
        a_session_made_again_is_checked_as_it_now_is(a, b)


def test_the_state_an_append_leaves_is_what_dataclasses_replace_makes() -> None:
    # The append's answer becomes the remembered state by a copy of the base's attributes
    # (sessions.records.info_with), not SessionInfo's __init__: the same object while that
    # __init__ only stores its arguments.
    import dataclasses

    from ctxkeep.sessions.records import SessionInfo, info_with

    base = SessionInfo(
        session_id="s", agent_id="a", created_at=1.0, accessed_at=2.0, pending=("c1",),
        next_seq=4, message_count=3, generation="g", first_seq=1, metadata={"k": 1},
    )  # fmt: skip
    changes = {"pending": (), "accessed_at": 5.0, "next_seq": 6, "message_count": 5}
    made = info_with(base, changes)
    assert made == dataclasses.replace(base, **changes)
    assert type(made) is SessionInfo
    assert made.__dict__ == dataclasses.replace(base, **changes).__dict__
    assert base.next_seq == 4  # the base is left as it was
    assert not hasattr(SessionInfo, "__post_init__")  # else the copy would skip it


def test_an_append_encodes_each_record_once(
    mem: MemoryManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The manager's check encodes each record to JSON; the backend stores that text
    # (Append.texts) rather than encoding the record again.
    from ctxkeep.sessions import records as records_module
    from ctxkeep.sessions import redis as redis_module

    encoded: list[str] = []

    def counting(dumps: Callable[[Any], str]) -> Callable[[Any], str]:
        def wrapped(value: Any) -> str:
            if isinstance(value, dict) and "v" in value and "role" in value:
                encoded.append(value["content"])
            return dumps(value)

        return wrapped

    sid = mem.create_session("a")
    mem.add_message(sid, "user", "warm up")  # the session's state is known: one script call
    monkeypatch.setattr(records_module, "dumps", counting(records_module.dumps))
    monkeypatch.setattr(redis_module, "dumps", counting(redis_module.dumps))
    mem.add_messages(sid, [Message("user", "one"), Message("assistant", "two")])
    assert encoded == ["one", "two"]
    assert [m.content for m in mem.get_messages(sid)] == ["warm up", "one", "two"]


def test_ids_the_manager_made_are_indexed_so_a_retry_stores_nothing(mem: MemoryManager) -> None:
    # An append of ids the manager made does not look them up (none can be held), but
    # still writes them to the ids index: sent again, the stored copies are a retry.
    sid = mem.create_session("a")
    stored = mem.add_messages(sid, [Message("user", "hi"), Message("assistant", "hello")])
    assert mem.add_messages(sid, stored) == stored
    assert [m.text for m in mem.get_messages(sid)] == ["hi", "hello"]


def test_a_replacement_by_messages_given_ids_still_finds_one_held(mem: MemoryManager) -> None:
    # Ids the caller gives are looked up inside the replace, as before: one held elsewhere
    # in the session is a conflict, and nothing changes.
    from ctxkeep.errors import MessageIdConflictError

    sid = mem.create_session("a")
    first, newest = mem.add_messages(sid, [Message("user", "hi"), Message("user", "again")])
    assert newest.id is not None and first.id is not None
    with pytest.raises(MessageIdConflictError):
        mem.replace_newest(sid, [Message("user", "other", id=first.id)], newest_id=newest.id)
    assert [m.text for m in mem.get_messages(sid)] == ["hi", "again"]


def test_an_append_after_another_writers_is_numbered_from_the_stored_seq(url: str) -> None:
    # The client sends each record as its member, numbered from the next seq it last saw; the
    # script keeps that member only where the hash still has that next seq. Here the other
    # manager appended meanwhile (pending as it was, so the compare-and-set lets the append
    # through): every member is numbered again, and stays its score's.
    with _open(url, session_ttl=None) as a, _open(url, session_ttl=None) as b:
        sid = a.create_session("agent")
        a.add_message(sid, "user", "a0")
        b.add_message(sid, "assistant", "b0")  # b now knows next_seq 3
        a.add_messages(sid, [Message("user", "a1"), Message("assistant", "a2")])
        b.add_messages(
            sid, [Message("user", "b1"), Message("assistant", "b2"), Message("user", "b3")]
        )
        a.add_message(sid, "assistant", "a3")  # a's guess is stale too
        want = ["a0", "b0", "a1", "a2", "b1", "b2", "b3", "a3"]
        assert [m.content for m in a.get_messages(sid)] == want
        assert [m.content for m in b.get_messages(sid)] == want
        backend = a.backend
        raw = backend._client.zrange(backend.keys.messages(sid), 0, -1, withscores=True)
        assert [(m.partition(":")[0], int(score)) for m, score in raw] == [
            (str(seq), seq) for seq in range(1, 9)
        ]
        # the roles index entries, which the client sends numbered from its guess too
        roles = backend._client.zrange(backend.keys.roles(sid), 0, -1)
        by_seq = ["user", "assistant", "user", "assistant", "user", "assistant", "user"]
        want_roles = [role_member(r, seq) for seq, r in enumerate([*by_seq, "assistant"], 1)]
        assert sorted(roles) == sorted(want_roles)
        assert a.get_session(sid).next_seq == 9


def test_the_newest_message_a_read_saw_is_decoded_only_when_a_replace_needs_it(
    mem: MemoryManager, sent: list[str]
) -> None:
    # A read of the stored rows (a chat history's, an Agents SDK session's) and a pop keep
    # the session's newest member as its text; the next replace decodes it, still in one
    # round trip (the script, and the read of the member a pop leaves newest) and no read.
    sid = mem.create_session("a")
    mem.add_messages(sid, [Message("user", "x"), Message("assistant", "y")])
    assert [m.content for m in mem.reads.decoding(sid)] == ["x", "y"]
    tops = mem.backend._tops
    assert isinstance(tops._tops[sid], tuple)  # (generation, member): not decoded
    sent.clear()
    mem._replace(sid, [], newest_seq=2)
    assert sent == ["EVALSHA+ZRANGE"]
    assert isinstance(tops._tops[sid], tuple)  # the message now newest, kept as text
    sent.clear()
    mem._replace(sid, [], newest_seq=1)
    assert sent == ["EVALSHA+ZRANGE"]
    assert sid not in tops._tops  # none left
    assert mem.get_messages(sid) == []


def test_the_roles_index_holds_each_message_held_after_pops_and_replaces(
    mem: MemoryManager,
) -> None:
    # A pop takes the newest message's entry off the roles index by name (the client sends
    # it whole): an entry left behind would not show in a read (the index, a size too big,
    # is rebuilt on the next paged read), so the index is checked itself, entry by entry.
    sid = mem.create_session("a")
    roles = ["system", "user", "assistant", "user", "assistant", "user"]
    mem.add_messages(sid, [Message(role, f"m{i}") for i, role in enumerate(roles)])
    backend = mem.backend
    assert isinstance(backend, RedisBackend)

    def index() -> list[str]:
        return sorted(backend._client.zrange(backend.keys.roles(sid), 0, -1))

    assert mem.pop_message(sid) is not None  # the user message at seq 6
    assert mem.pop_message(sid) is not None  # the assistant message at seq 5
    assert index() == sorted(role_member(r, s) for s, r in enumerate(roles[:4], 1))
    newest = mem.get_messages(sid)[-1]
    mem.replace_newest(sid, [Message("assistant", "r")], newest_id=newest.id)
    mem.add_message(sid, "user", "u")
    assert index() == sorted(
        [
            *(role_member(r, s) for s, r in enumerate(roles[:3], 1)),
            role_member("assistant", 7),
            role_member("user", 8),
        ]
    )

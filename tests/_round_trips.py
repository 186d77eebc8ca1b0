"""Append scenarios the round-trip tests of the server backends share, and the count of the
round trips to Redis and to PostgreSQL (not collected)."""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ctxkeep import MemoryManager


def redis_sends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every command sent to Redis from now on, one entry per send (a pipeline's
    commands, sent together, are one entry joined by ``+``): the round trips. Counted where
    they leave: redis-py's connection, and ctxkeep's own sends on its sockets
    (:class:`ctxkeep._redis.Direct`: awaited in the event loop, or read on the socket itself).
    """
    import redis

    from ctxkeep._redis import Direct

    names: list[str] = []

    def name(command: Any) -> None:
        packed = command if isinstance(command, bytes) else b"".join(command)
        # RESP arrays: "*<n>\r\n$<len>\r\n<NAME>\r\n...", one per command in the send.
        parts = packed.split(b"\r\n")
        found = [parts[i + 2].decode() for i, p in enumerate(parts[:-2]) if p.startswith(b"*")]
        names.append("+".join(n.upper() for n in found))

    send = redis.connection.AbstractConnection.send_packed_command

    def counting(self: Any, command: Any, check_health: bool = True) -> None:
        name(command)
        send(self, command, check_health)

    exchange = Direct._exchange

    async def counting_awaited(self: Any, conn: Any, packed: bytes, replies: int) -> Any:
        name(packed)
        return await exchange(self, conn, packed, replies)

    roundtrip = Direct._roundtrip

    def counting_raw(self: Any, conn: Any, packed: bytes, replies: int) -> Any:
        if self.raw:  # else it sends through redis-py's connection, counted there
            name(packed)
        return roundtrip(self, conn, packed, replies)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counting)
    monkeypatch.setattr(Direct, "_exchange", counting_awaited)
    monkeypatch.setattr(Direct, "_roundtrip", counting_raw)
    return names


def load_redis_scripts(redis_url: str) -> None:
    """The session backend's scripts put in the server's cache: a script's first run on a
    server (a new server, ``SCRIPT FLUSH``, a script changed) costs a ``NOSCRIPT`` answer, a
    ``SCRIPT LOAD`` and the send again, once, which is not what a test counting (or watching)
    an operation's round trips counts.
    """
    import redis

    from ctxkeep.sessions import redis as backend

    client = redis.Redis.from_url(redis_url)
    try:
        for name in dir(backend):
            if name.endswith("_SCRIPT"):
                client.script_load(getattr(backend, name))
    finally:
        client.close()


def loaded_redis_sends(monkeypatch: pytest.MonkeyPatch, redis_url: str) -> list[str]:
    """:func:`redis_sends`, the session backend's scripts in the server's cache first
    (:func:`load_redis_scripts`).
    """
    load_redis_scripts(redis_url)
    return redis_sends(monkeypatch)


def known_session_round_trips(mem: MemoryManager, sent: list[str]) -> list[str]:
    """What ``sent`` records while three messages are appended to a session the manager
    already knows (its first append read it).
    """
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "the first append reads the session")
    sent.clear()
    for i in range(3):
        mem.add_message(sid, "user", f"message {i}")
    return list(sent)


def tool_unit_round_trips(mem: MemoryManager, sent: list[str]) -> list[str]:
    """What ``sent`` records while a tool call, its result and the answer are appended one at
    a time to a session the manager already knows.
    """
    sid = mem.create_session("agent")
    mem.add_message(sid, "user", "what time is it?")
    sent.clear()
    call = {"id": "c1", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    mem.add_message(sid, "assistant", None, tool_calls=[call])
    mem.add_message(sid, "tool", "12:00", tool_call_id="c1")
    mem.add_message(sid, "assistant", "noon")
    trips = list(sent)
    assert mem.get_session(sid).pending == ()
    return trips


def appends_in_turn_keep_every_seq(a: MemoryManager, b: MemoryManager) -> None:
    """Two managers on one store append to one session in turn: every message, in order,
    under gapless sequence numbers.
    """
    sid = a.create_session("agent")
    for i in range(6):
        (a if i % 2 == 0 else b).add_message(sid, "user", f"m{i}")
    info = a.get_session(sid)
    assert [m.content for m in a.get_messages(sid)] == [f"m{i}" for i in range(6)]
    assert (info.message_count, info.next_seq) == (6, 7)


def a_session_made_again_is_checked_as_it_now_is(a: MemoryManager, b: MemoryManager) -> None:
    """``a`` knows a session (trimmed far: its first seq is high) that ``b`` deletes and makes
    again under the same id and fills past ``max_history``: ``a``'s next append lands in the
    new session, checked on its state, and leaves at most ``max_history`` messages.
    """
    limit = a.config.max_history
    assert limit is not None and b.config.max_history == limit
    sid = a.create_session("agent", session_id="again")
    for i in range(4 * limit):
        a.add_message(sid, "user", f"old {i}")
    b.delete_session(sid)
    b.create_session("agent", session_id=sid)
    for i in range(2 * limit):
        b.add_message(sid, "user", f"new {i}")
    a.add_message(sid, "user", "from a")
    held = [m.content for m in a.get_messages(sid)]
    assert held == [f"new {i}" for i in range(limit + 1, 2 * limit)] + ["from a"]


@contextmanager
def pg_wire(pool: Any) -> Iterator[list[tuple[str, str]]]:
    """Trace the protocol of ``pool``'s one connection (a pool of one: make it with
    ``CTXKEEP_PG_POOL_MAX=1`` and an ``application_name`` of its own, pools being shared per
    address) meanwhile; the list gets ``(direction, message)`` pairs, as libpq traces them,
    the direction ``F`` (sent) or ``B`` (received).
    """
    import psycopg

    with pool.connection() as conn:
        pgconn = conn.pgconn
    lines: list[tuple[str, str]] = []
    with tempfile.TemporaryFile() as file:
        pgconn.trace(file.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield lines
        finally:
            pgconn.untrace()
            file.seek(0)
            for raw in file.read().decode().splitlines():
                direction, _, rest = [*raw.split("\t", 2), "", ""][:3]
                lines.append((direction, rest))


def pg_waits(lines: list[tuple[str, str]]) -> int:
    """How many times the client of a :func:`pg_wire` trace waited for the server: messages
    sent, then an answer (a pipeline's statements and its sync are one wait). Not counted:
    a flush request alone (psycopg sends one after a pipeline's sync, which asks nothing
    new: it follows the first of the answers when they come quickly), and the pool's ping of
    a connection idle for a while (an empty statement: ``ctxkeep._pg``'s ``ALIVE_BYPASS``),
    which a loaded machine's pauses bring about. Nor is an answer read before the client
    asked for one: in a pipeline the server sends a statement's rows as its buffer fills, with
    no sync yet, and a client slowed by load reads them before it sends the sync; those sent
    messages wait with the sync that follows (a wait needs a ``Sync``, a ``Flush`` or a simple
    ``Query`` among them).
    """
    count = 0
    group: list[str] = []
    for (a, sent), (b, _) in itertools.pairwise(lines):
        if a == "F":
            group.append(sent)
        if a == "F" and b == "B":
            if not any(m.split("\t", 1)[0] in ("Sync", "Flush", "Query") for m in group):
                continue  # nothing asked for yet: rows the server sent on its own
            ping = group[0].startswith(('Parse\t "" "" ', 'Query\t ""'))
            count += not ping and any(m != "Flush" for m in group)
            group = []
    return count

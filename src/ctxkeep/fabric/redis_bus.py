"""The inter-agent bus over Redis Streams, for agent processes on many machines.

:class:`RedisStreamBus` keeps the delivery rules of ``ctxkeep.fabric.bus`` (direct messages
reach their recipient whatever its task; topic messages reach the subscribers of the sender's
task, never the sender, never another task) with every piece of state in Redis, so any number
of processes agree on who belongs to which task and who listens to what.

How it maps onto Redis:

* Each agent has an inbox stream with a consumer group named after the agent. Every process
  serving the agent reads the group as a *consumer* (the ``consumer`` argument), so a message
  goes to one of them. Processes may share one consumer name (``ctxkeep serve``'s workers all
  do): its pending messages are then theirs together, and any of them acks or recovers what
  another received. ``send`` appends a direct message to the recipient's inbox; a
  topic message is fanned out to every subscriber's inbox in one ``MULTI``/``EXEC`` (all or
  none), under ``WATCH`` of the subscriptions so a concurrent (un)subscribe is never half-seen.
* ``receive`` first takes over (``XAUTOCLAIM``) messages that another consumer of the agent
  received but has not acked for ``claim_idle_ms``: that consumer is presumed dead, and its
  messages are redelivered here. Then it reads new messages (``XREADGROUP >``), waiting up to
  ``timeout`` in steps of ``block_ms``. Received messages stay pending until ``ack``
  (``XACK``, then ``XDEL``: an acked message is gone from the inbox). Every receive notes
  which entries it handed out under each message id in Redis (``bus:pending:{agent}``), so an
  ack settles a message by its id in whichever process it lands, in one script with the
  ``XACK``, and :meth:`RedisStreamBus.recover` keeps its replay cursor there too
  (``bus:replay:{agent}``), so the next receive replays whichever process takes it.
* ``handle`` skips messages whose id is already marked handled for the agent, runs the handler
  on the rest, then marks and acks each in one transaction. A message is marked only after its
  handler returned, so a consumer killed mid-handler loses nothing: the message is redelivered
  and handled again. For exactly-once effects, commit the effect *and* the mark together: pass
  :meth:`RedisStreamBus.handled_mark` to ``RedisTaskState.update_with`` (or queue
  :meth:`HandledMark.queue` in your own ``MULTI``); a redelivery then finds the mark and skips.
  Choose ``claim_idle_ms`` longer than any handler runs, or a slow consumer's messages are
  claimed by another one while it still works on them.
* An inbox entry no ctxkeep can decode or deliver (corrupt, written by a newer ctxkeep, or a
  payload :class:`~ctxkeep.fabric.bus.IPCMessage` refuses, stored before that was checked at
  send) is moved by the receive that meets it to the agent's dead-letter stream with the
  reason, in one transaction, so the messages behind it flow; :meth:`RedisStreamBus.dead_letters`
  lists them and :meth:`RedisStreamBus.delete_dead_letters` removes them.
* :meth:`RedisStreamBus.stats` counts the registered agents' messages in one script: an
  inbox's length less its group's pending entries is its depth (an ack deletes its entry).
* ``ctxkeep.fabric.redis_state.RedisTaskState`` is the task's shared state for many processes
  (compare-and-set), which can commit a handled mark together with a change.

Keys (all under the prefix, named by :class:`RedisBusKeys`, free of I/O):

===============================  ======  ========================================================
key                              type    holds
===============================  ======  ========================================================
``bus:inbox:{agent}``            stream  the agent's messages (``v``, ``m``: IPCMessage JSON);
                                         consumer group ``{agent}``, one consumer per process
``bus:agents``                   hash    agent -> its task id (JSON; ``null`` for none)
``bus:topics:{agent}``           set     the topics the agent subscribed to
``bus:subs:{task}:{topic}``      set     the task's agents subscribed to the topic (task
                                         percent-encoded, so a ``:`` in it is unambiguous)
``bus:handled:{agent}``          zset    ids of messages the agent handled, by time; entries
                                         older than ``handled_ttl`` seconds are trimmed
``bus:dead:{agent}``             stream  entries no ctxkeep could decode, with the reason
``bus:pending:{agent}``          hash    message id -> the ids of its inbox entries handed out
                                         and not acked (space-separated; one message id may
                                         have been sent twice); a note whose entry was deleted
                                         while pending stays until that id is acked (harmless)
``bus:replay:{agent}``           hash    consumer -> where its next receive replays its pending
                                         entries from (set by ``recover``, gone when done)
``fabric:task:{task}``           hash    a task's shared state (``redis_state.py``)
``meta``                         hash    field ``bus``: the layout's schema version (field
                                         ``fabric``: the task states')
===============================  ======  ========================================================

The connection, error translation and schema versions are ``ctxkeep._redis.RedisClient``'s;
every stream entry carries its own version too (``v``). The ``pending`` and ``replay`` hashes
came within layout version 1 (created as needed; nothing to migrate): a message an older
ctxkeep handed out is noted by the first receive of this one that takes it again (after
``recover`` or ``claim_idle_ms``), and acks by id from then on.

Multi-key transactions need one Redis node (no Redis Cluster). Durability is the server's:
see ``ctxkeep.sessions.redis``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

from ctxkeep import _check
from ctxkeep._redis import (
    DEFAULT_PREFIX,
    LuaScript,
    Migration,
    Pipeline,
    RedisClient,
    redis,
    translated,
)
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
    SchemaVersionError,
    UnknownAgentError,
)
from ctxkeep.fabric.bus import (
    BusStats,
    DeadLetter,
    IPCMessage,
    check_agent,
    check_ids,
    check_limit,
    check_message,
    check_receive,
)

log = logging.getLogger(__name__)

MESSAGE_VERSION = 1
"""The schema version of a stream entry (field ``v``)."""

# Position i brings the bus keys under a prefix from layout version i to i + 1 (their version
# in ``{prefix}meta``, field ``bus``). Version 1 is the layout in the module docstring; its keys
# are created as agents register and send, so there is nothing to do.
MIGRATIONS: list[Migration] = [
    lambda client: None,
]


# -- the layout and the stored forms, free of I/O ---------------------------------------------


@dataclass(frozen=True)
class RedisBusKeys:
    """The name of every key the bus and the task state use, under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def inbox(self, agent_id: str) -> str:
        """The agent's inbox stream (its consumer group is named ``agent_id``)."""
        return f"{self.prefix}bus:inbox:{agent_id}"

    @property
    def agents(self) -> str:
        """Agent -> task id (JSON)."""
        return f"{self.prefix}bus:agents"

    def topics(self, agent_id: str) -> str:
        """The topics the agent subscribed to."""
        return f"{self.prefix}bus:topics:{agent_id}"

    def subscribers(self, task_id: str, topic: str) -> str:
        """The agents of ``task_id`` subscribed to ``topic``."""
        return f"{self.prefix}bus:subs:{quote(task_id, safe='')}:{topic}"

    def handled(self, agent_id: str) -> str:
        """Ids of messages the agent handled, scored by Unix time."""
        return f"{self.prefix}bus:handled:{agent_id}"

    def dead(self, agent_id: str) -> str:
        """Entries of the agent's inbox that could not be decoded."""
        return f"{self.prefix}bus:dead:{agent_id}"

    def pending(self, agent_id: str) -> str:
        """Message id -> the entry ids of the agent's inbox handed out and not acked."""
        return f"{self.prefix}bus:pending:{agent_id}"

    def replay(self, agent_id: str) -> str:
        """Consumer -> the cursor of its replay of the agent's pending entries."""
        return f"{self.prefix}bus:replay:{agent_id}"

    def task_state(self, task_id: str) -> str:
        """A task's shared state (:class:`RedisTaskState`)."""
        return f"{self.prefix}fabric:task:{task_id}"


def encode_entry(message: IPCMessage) -> dict[str, str]:
    """The stream entry of a message."""
    return {"v": str(MESSAGE_VERSION), "m": json.dumps(message.to_dict(), allow_nan=False)}


def decode_entry(fields: Mapping[str, str]) -> IPCMessage:
    """The message a stream entry holds (a fresh copy).

    Raises:
        SchemaVersionError: an entry written by a newer ctxkeep.
        InvalidMessageError: a corrupt entry.

    """
    try:
        version = int(fields.get("v", "0"))
    except ValueError as exc:
        raise InvalidMessageError(f"corrupt bus entry version {fields.get('v')!r}") from exc
    if version > MESSAGE_VERSION:
        raise SchemaVersionError(
            f"bus entry version {version} is newer than this ctxkeep reads "
            f"({MESSAGE_VERSION}); upgrade ctxkeep"
        )
    try:
        data = json.loads(fields["m"])
        return IPCMessage.from_dict(data)
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        # IPCMessage refuses what no receiver could be handed (a lone surrogate, nesting too
        # deep) as InvalidMessageError (a ValueError): such an entry is corrupt here too
        raise InvalidMessageError(f"corrupt bus entry: {exc}") from exc


_DEAD_REASON = "error"
"""The field of a dead-letter entry that says why it was moved aside."""

_STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}")


def encode_dead(fields: Mapping[str, str], entry_id: str, reason: str) -> dict[str, str]:
    """The dead-letter stream entry of an inbox entry that could not be decoded."""
    return {**fields, _DEAD_REASON: reason, "entry_id": entry_id}


def decode_dead(dead_id: str, fields: Mapping[str, str]) -> DeadLetter:
    """The :class:`~ctxkeep.fabric.bus.DeadLetter` a dead-letter stream entry holds."""
    record = {k: v for k, v in fields.items() if k != _DEAD_REASON}
    return DeadLetter(id=dead_id, reason=fields.get(_DEAD_REASON, ""), record=record)


def stream_ids(ids: list[str]) -> list[str]:
    """The ids that can name a stream entry (``<ms>-<seq>``); no other id names a dead letter,
    and Redis would answer an error for it rather than ignore it.
    """
    return [i for i in ids if _STREAM_ID.fullmatch(i)]


def encode_task(task_id: str | None) -> str:
    """The stored form of an agent's task id."""
    return json.dumps(task_id)


def decode_task(raw: str) -> str | None:
    """The task id an ``agents`` hash value holds."""
    value = json.loads(raw)
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class HandledMark:
    """The mark that says ``agent`` handled ``message_id``, to commit with a handler's effect."""

    key: str
    """The agent's handled-ids zset."""
    message_id: str
    """The message handled."""

    def queue(self, pipe: Pipeline) -> None:
        """Add the mark to ``pipe`` (inside its ``MULTI``)."""
        pipe.zadd(self.key, {self.message_id: time.time()}, nx=True)

    def is_set(self, client: redis.Redis | Pipeline) -> bool:
        """Whether the mark is there (a watching pipeline reads at once)."""
        return client.zscore(self.key, self.message_id) is not None


NOTE_PENDING = """
for i = 1, #ARGV, 2 do
  local have = redis.call('HGET', KEYS[1], ARGV[i])
  if not have then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  elseif not string.find(' ' .. have .. ' ', ' ' .. ARGV[i + 1] .. ' ', 1, true) then
    redis.call('HSET', KEYS[1], ARGV[i], have .. ' ' .. ARGV[i + 1])
  end
end
return 0
"""
"""Note entries handed out: ``KEYS`` the pending hash; ``ARGV`` pairs of message id, entry id."""

SETTLE = """
local entries = {}
for i = 4, #ARGV do
  local have = redis.call('HGET', KEYS[1], ARGV[i])
  if have then
    for e in string.gmatch(have, '%S+') do entries[#entries + 1] = e end
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
  if ARGV[2] ~= '' then redis.call('ZADD', KEYS[3], 'NX', ARGV[2], ARGV[i]) end
end
if ARGV[2] ~= '' then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[3]) end
for i = 1, #entries, 500 do
  local chunk = {unpack(entries, i, math.min(i + 499, #entries))}
  redis.call('XACK', KEYS[2], ARGV[1], unpack(chunk))
  redis.call('XDEL', KEYS[2], unpack(chunk))
end
return #entries
"""
"""Ack and delete the entries noted under message ids, whoever received them, and forget the
notes; with a mark, mark the ids handled and forget old marks, all at once. ``KEYS``: the
pending hash, the inbox, the handled zset; ``ARGV``: the group, the mark's time (empty: no
mark), the time before which marks are forgotten, then the message ids. Returns how many
entries were settled."""

REPLAY = """
local cursor = redis.call('HGET', KEYS[2], ARGV[2])
if not cursor then return false end
local reply = redis.call(
  'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], cursor)
local entries = {}
if reply then entries = reply[1][2] end
if #entries >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], ARGV[2], entries[#entries][1])
else
  redis.call('HDEL', KEYS[2], ARGV[2])
end
return entries
"""
"""Replay a consumer's pending entries from its cursor, and move or drop the cursor, at once
(two processes under one name replaying together get different entries). ``KEYS``: the inbox,
the replay hash; ``ARGV``: the group, the consumer, the count. Returns ``[id, [field, value,
...] or nil]`` entries, or nil when no replay is due."""

STATS = """
local depth, pending, dead = 0, 0, 0
for _, agent in ipairs(redis.call('HKEYS', KEYS[1])) do
  local inbox = ARGV[1] .. agent
  local held = 0
  local summary = redis.pcall('XPENDING', inbox, agent)
  if type(summary) == 'table' and type(summary[1]) == 'number' then held = summary[1] end
  pending = pending + held
  depth = depth + math.max(redis.call('XLEN', inbox) - held, 0)
  dead = dead + redis.call('XLEN', ARGV[2] .. agent)
end
return {depth, pending, dead}
"""
"""Count the messages of every registered agent. ``KEYS``: the agents hash; ``ARGV``: the
inbox keys' and the dead-letter keys' stems (their names without the agent). An inbox holds
its undelivered entries and its group's pending ones (an ack deletes the entry), so its depth
is its length less its pending count. Returns ``[depth, pending, dead letters]``."""

RawFields = dict[bytes, bytes]
"""A stream entry's fields as Redis holds them: bytes, which need not be UTF-8."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entries(response: Any) -> list[tuple[str, RawFields | None]]:
    """The ``(id, fields)`` entries of an ``XREADGROUP`` reply (fields are None for an entry
    deleted while pending).
    """
    if isinstance(response, dict):  # RESP3: {stream: [[entries]]}
        lists = [entries for nested in response.values() for entries in nested]
    else:  # RESP2: [[stream, [entries]]]
        lists = [stream[1] for stream in response or []]
    return [(_text(e[0]), e[1]) for entries in lists for e in entries]


def entry_text(fields: RawFields) -> dict[str, str]:
    """The fields of a stream entry as text.

    Raises:
        InvalidMessageError: a field that is not UTF-8 (no ctxkeep writes one).

    """
    try:
        return {k.decode(): v.decode() for k, v in fields.items()}
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(f"corrupt bus entry: not UTF-8 ({exc})") from exc


def entry_shown(fields: RawFields) -> dict[str, str]:
    r"""The fields of a stream entry as text, bytes that are not UTF-8 escaped (``\xff``), so
    a corrupt entry stays readable among the dead letters.
    """
    return {
        k.decode(errors="backslashreplace"): v.decode(errors="backslashreplace")
        for k, v in fields.items()
    }


# -- the bus ------------------------------------------------------------------------------------


class RedisStreamBus:
    """A :class:`~ctxkeep.fabric.bus.MessageBus` over Redis Streams (see the module docstring).

    Args:
        url: ``redis://[user:password@]host:port/db``, optionally with ``?prefix=...``.
        consumer: this process's name among the consumers of the agents' inboxes (e.g. host
            and pid); a restarted process may reuse its old name or take a new one. Processes
            that share a name share its pending messages: :meth:`recover` in any of them
            replays what another received (``ctxkeep serve``'s workers are one consumer).
        prefix: the key prefix (default: the URL's ``?prefix=``, else ``ctxkeep:``).
        claim_idle_ms: a message received by another consumer and not acked for this long is
            redelivered here (keep it above the longest handler).
        block_ms: the longest single blocking read; ``receive`` waits in steps of this.
        handled_ttl: how long (seconds) handled ids are remembered to skip redeliveries.

    Raises:
        ConfigError: a missing consumer name, a bad setting or URL.
        StorageError: Redis does not answer.
        SchemaVersionError: the prefix holds bus keys written by a newer ctxkeep.

    """

    def __init__(
        self,
        url: str,
        *,
        consumer: str,
        prefix: str | None = None,
        claim_idle_ms: int = 30_000,
        block_ms: int = 1_000,
        handled_ttl: float = 7 * 24 * 3600,
    ) -> None:
        if not isinstance(consumer, str) or not consumer:
            raise ConfigError("RedisStreamBus needs a consumer name (e.g. f'{host}-{pid}')")
        if claim_idle_ms <= 0 or block_ms <= 0 or handled_ttl <= 0:
            raise ConfigError("claim_idle_ms, block_ms and handled_ttl must be positive")
        self.db = RedisClient(url, prefix=prefix, meta_key="bus", migrations=MIGRATIONS)
        # inbox entries are read as bytes and decoded one by one: a connection that decodes
        # replies would fail the whole read on one entry that is not UTF-8, every time
        pool = self.db.conn.connection_pool
        self._reader = redis.Redis(
            connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class,
                **{**pool.connection_kwargs, "decode_responses": False},
            )
        )
        self.keys = RedisBusKeys(self.db.prefix)
        self.where = self.db.where
        self.consumer = consumer
        self.claim_idle_ms = int(claim_idle_ms)
        self.block_ms = int(block_ms)
        self.handled_ttl = float(handled_ttl)
        self._lock = threading.Lock()
        self._groups: set[str] = set()
        self._claim_from: dict[str, str] = {}  # agent -> XAUTOCLAIM cursor (a hint, per process)
        self._note_pending = LuaScript(self.db.conn, NOTE_PENDING)
        self._settle_script = LuaScript(self.db.conn, SETTLE)
        self._replay_script = LuaScript(self._reader, REPLAY)
        self._stats_script = LuaScript(self.db.conn, STATS)

    def close(self) -> None:
        """Close the connection pool."""
        self._reader.close()
        self.db.close()

    def __enter__(self) -> RedisStreamBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- membership ----------------------------------------------------------------------

    @translated
    def register(self, agent_id: str, task_id: str | None) -> None:
        """Make ``agent_id`` a member of ``task_id`` (moving drops its old subscriptions)."""
        check_name("agent_id", agent_id)
        _check.optional_text("task_id", task_id)
        keys = self.keys

        def body(pipe: Pipeline) -> None:
            raw = cast("str | None", pipe.hget(keys.agents, agent_id))
            old = decode_task(raw) if raw is not None else None
            topics = cast("set[str]", pipe.smembers(keys.topics(agent_id)))
            pipe.multi()
            if raw is None or old != task_id:
                if old is not None:
                    for topic in topics:
                        pipe.srem(keys.subscribers(old, topic), agent_id)
                pipe.delete(keys.topics(agent_id))
            pipe.hset(keys.agents, agent_id, encode_task(task_id))

        self.db.atomic([keys.agents, keys.topics(agent_id)], body)
        self._ensure_group(agent_id)

    @translated
    def task_of(self, agent_id: str) -> str | None:
        """The task ``agent_id`` belongs to.

        Raises:
            UnknownAgentError: the agent never registered.

        """
        check_agent(agent_id)
        raw = cast("str | None", self.db.conn.hget(self.keys.agents, agent_id))
        if raw is None:
            raise UnknownAgentError(f"agent {agent_id!r} has not joined a task")
        return decode_task(raw)

    @translated
    def subscribe(self, agent_id: str, topic: str) -> None:
        """Deliver ``topic`` messages of the agent's task to it."""
        check_agent(agent_id)
        check_name("topic", topic)
        keys = self.keys

        def body(pipe: Pipeline) -> None:
            raw = cast("str | None", pipe.hget(keys.agents, agent_id))
            if raw is None:
                raise UnknownAgentError(f"agent {agent_id!r} has not joined a task")
            task_id = decode_task(raw)
            pipe.multi()
            pipe.sadd(keys.topics(agent_id), topic)
            if task_id is not None:
                pipe.sadd(keys.subscribers(task_id, topic), agent_id)

        self.db.atomic([keys.agents], body)

    # -- sending -------------------------------------------------------------------------

    @translated
    def send(self, message: IPCMessage) -> str:
        """Append the message to its recipient's inbox, or to every subscriber's; returns
        its id.
        """
        entry = encode_entry(check_message(message))
        keys = self.keys
        if message.recipient is not None:
            self.db.conn.xadd(keys.inbox(message.recipient), entry)  # type: ignore[arg-type]
            return message.id
        assert message.topic is not None and message.task_id is not None
        subs_key = keys.subscribers(message.task_id, message.topic)

        def body(pipe: Pipeline) -> None:
            members = sorted(cast("set[str]", pipe.smembers(subs_key)) - {message.sender})
            tasks = cast("list[str | None]", pipe.hmget(keys.agents, members)) if members else []
            pipe.multi()
            for agent, raw in zip(members, tasks, strict=True):
                if raw is not None and decode_task(raw) == message.task_id:
                    pipe.xadd(keys.inbox(agent), entry)  # type: ignore[arg-type]

        self.db.atomic([subs_key, keys.agents], body)
        return message.id

    # -- receiving -----------------------------------------------------------------------

    def receive(
        self, agent_id: str, *, max_messages: int = 100, timeout: float = 0
    ) -> list[IPCMessage]:
        """Up to ``max_messages`` for ``agent_id``: first those another consumer left unacked
        for ``claim_idle_ms``, then new ones, waiting up to ``timeout`` s. They stay pending
        (and are redelivered) until acked.
        """
        check_agent(agent_id)
        max_messages, timeout = check_receive(max_messages, timeout)
        return [m for _, m in self._take(agent_id, max_messages, timeout)]

    @translated
    def ack(self, agent_id: str, ids: Iterable[str]) -> None:
        """Mark received messages handled: they leave the inbox for good, whichever process
        of the consumer group received them. Ids not pending are ignored.
        """
        check_agent(agent_id)
        self._settle(agent_id, check_ids(ids), mark=False)

    def handle(
        self,
        agent_id: str,
        handler: Callable[[IPCMessage], None],
        *,
        timeout: float = 0,
        max_messages: int = 100,
    ) -> int:
        """Receive, run ``handler`` on each message not yet handled by this agent, then mark
        and ack it; returns how many the handler ran on.

        An exception from the handler propagates; that message and the rest of the batch stay
        pending and are redelivered (after ``claim_idle_ms``, or at once after
        :meth:`recover`).
        """
        check_agent(agent_id)
        _check.has_method("handler", handler, "__call__", "function")
        max_messages, timeout = check_receive(max_messages, timeout)
        taken = self._take(agent_id, max_messages, timeout)
        if not taken:
            return 0
        seen = self._handled_ids(agent_id, [m.id for _, m in taken])
        n = 0
        for _, message in taken:
            if message.id in seen:
                self._settle_translated(agent_id, [message.id], mark=False)
                continue
            handler(message)
            seen.add(message.id)
            self._settle_translated(agent_id, [message.id], mark=True)
            n += 1
        return n

    def handled_mark(self, agent_id: str, message_id: str) -> HandledMark:
        """The mark :meth:`handle` checks, to commit in the same transaction as an effect."""
        check_agent(agent_id)
        _check.text("message_id", message_id)
        return HandledMark(self.keys.handled(agent_id), message_id)

    @translated
    def was_handled(self, agent_id: str, message_id: str) -> bool:
        """Whether ``agent_id`` has handled ``message_id`` (within ``handled_ttl``)."""
        return self.handled_mark(agent_id, message_id).is_set(self.db.conn)

    @translated
    def recover(self, agent_id: str) -> int:
        """Redeliver this consumer's unacked messages on the next receive of any process under
        its name, without waiting ``claim_idle_ms`` (for a process restarted under its old
        consumer name, or a client of the service after a crash); returns how many there are.
        """
        check_agent(agent_id)
        self._ensure_group(agent_id)
        summary: dict[str, Any] = self.db.conn.xpending(self.keys.inbox(agent_id), agent_id)
        mine = sum(
            int(c["pending"]) for c in summary.get("consumers") or [] if c["name"] == self.consumer
        )
        self.db.conn.hset(self.keys.replay(agent_id), self.consumer, "0")
        return mine

    # -- dead letters --------------------------------------------------------------------

    @translated
    def dead_letters(self, agent_id: str, *, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` entries of the agent's inbox that could not be decoded (moved aside
        by a receive, with the reason), oldest first.
        """
        check_agent(agent_id)
        raw = cast(
            "list[tuple[str, dict[str, str]]]",
            self.db.conn.xrange(self.keys.dead(agent_id), count=check_limit(limit)),
        )
        return [decode_dead(str(dead_id), fields) for dead_id, fields in raw]

    @translated
    def delete_dead_letters(self, agent_id: str, ids: Iterable[str]) -> int:
        """Remove dead letters by id (unknown ids are ignored); returns how many were removed."""
        check_agent(agent_id)
        found = stream_ids(check_ids(ids))
        return int(self.db.conn.xdel(self.keys.dead(agent_id), *found)) if found else 0

    # -- counts --------------------------------------------------------------------------

    @translated
    def stats(self) -> BusStats:
        """The messages of every agent that joined a task under the prefix: undelivered
        (depth), received and not acked (pending) and dead letters, in one script.

        A message sent to an agent that never joined a task waits in an inbox no receive
        reads yet; it is counted once the agent joins (the agents hash is where the bus finds
        inboxes without scanning the keyspace).
        """
        keys = self.keys
        depth, pending, dead = self._stats_script([keys.agents], keys.inbox(""), keys.dead(""))
        return BusStats(depth=int(depth), pending=int(pending), dead_letters=int(dead))

    # -- internals -----------------------------------------------------------------------

    def _ensure_group(self, agent_id: str) -> None:
        """Create the agent's inbox and group (reading from the start), once per process."""
        if agent_id in self._groups:
            return
        try:
            self.db.conn.xgroup_create(self.keys.inbox(agent_id), agent_id, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups.add(agent_id)

    @translated
    def _take(
        self, agent_id: str, max_messages: int, timeout: float
    ) -> list[tuple[str, IPCMessage]]:
        """Receive as :meth:`receive` does, with each message's entry id."""
        if max_messages <= 0:
            return []
        try:
            got = self._read(agent_id, max_messages, timeout)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._groups.discard(agent_id)  # the inbox was deleted under us: start again
            got = self._read(agent_id, max_messages, timeout)
        if got:
            self._note_pending(
                [self.keys.pending(agent_id)], *(x for e, m in got for x in (m.id, e))
            )
        return got

    def _read(
        self, agent_id: str, max_messages: int, timeout: float
    ) -> list[tuple[str, IPCMessage]]:
        self._ensure_group(agent_id)
        deadline = time.monotonic() + max(timeout, 0.0)
        block: int | None = None
        while True:
            got = self._replay(agent_id, max_messages)
            if len(got) < max_messages:
                got += self._claim(agent_id, max_messages - len(got))
            if len(got) < max_messages:
                got += self._new(agent_id, max_messages - len(got), None if got else block)
            left_ms = int((deadline - time.monotonic()) * 1000)
            if got or left_ms <= 0:
                return got
            block = max(1, min(self.block_ms, left_ms))

    def _replay(self, agent_id: str, count: int) -> list[tuple[str, IPCMessage]]:
        """This consumer's pending messages, once, after :meth:`recover` (in any process)."""
        # once done (fewer than ``count`` left), the cursor is gone: what this receive reads
        # next is new, and must not be replayed
        reply: list[Any] | None = self._replay_script(
            [self.keys.inbox(agent_id), self.keys.replay(agent_id)], agent_id, self.consumer, count
        )
        raw = [
            (_text(entry_id), None if not flat else dict(zip(flat[::2], flat[1::2], strict=True)))
            for entry_id, flat in reply or []
        ]
        return self._decode(agent_id, raw)

    def _claim(self, agent_id: str, count: int) -> list[tuple[str, IPCMessage]]:
        """Take over messages other consumers left unacked for ``claim_idle_ms``."""
        with self._lock:
            cursor = self._claim_from.get(agent_id, "0-0")
        reply: list[Any] = self._reader.xautoclaim(
            self.keys.inbox(agent_id),
            agent_id,
            self.consumer,
            self.claim_idle_ms,
            start_id=cursor,
            count=count,
        )
        with self._lock:
            self._claim_from[agent_id] = _text(reply[0])
        return self._decode(agent_id, [(_text(e[0]), e[1]) for e in reply[1]])

    def _new(self, agent_id: str, count: int, block: int | None) -> list[tuple[str, IPCMessage]]:
        """Messages never delivered to any consumer of the agent."""
        raw = _entries(
            self._reader.xreadgroup(
                agent_id, self.consumer, {self.keys.inbox(agent_id): ">"}, count=count, block=block
            )
        )
        return self._decode(agent_id, raw)

    def _decode(
        self, agent_id: str, raw: list[tuple[str, RawFields | None]]
    ) -> list[tuple[str, IPCMessage]]:
        """Decode entries; ack entries deleted while pending, move undecodable ones to the
        agent's dead-letter stream (nothing is lost, nothing blocks the inbox).
        """
        inbox = self.keys.inbox(agent_id)
        out: list[tuple[str, IPCMessage]] = []
        for entry_id, fields in raw:
            if not fields:
                self.db.conn.xack(inbox, agent_id, entry_id)
                continue
            try:
                out.append((entry_id, decode_entry(entry_text(fields))))
            except (InvalidMessageError, SchemaVersionError) as exc:
                dead = self.keys.dead(agent_id)
                log.warning("bus entry %s of %s moved to %s: %s", entry_id, inbox, dead, exc)
                letter = encode_dead(entry_shown(fields), entry_id, str(exc))
                with self.db.conn.pipeline(transaction=True) as pipe:
                    pipe.xadd(dead, letter)  # type: ignore[arg-type]
                    pipe.xack(inbox, agent_id, entry_id)
                    pipe.xdel(inbox, entry_id)
                    pipe.execute()
        return out

    @translated
    def _handled_ids(self, agent_id: str, ids: list[str]) -> set[str]:
        scores: list[float | None] = self.db.conn.zmscore(self.keys.handled(agent_id), ids)
        return {i for i, s in zip(ids, scores, strict=True) if s is not None}

    @translated
    def _settle_translated(self, agent_id: str, ids: list[str], *, mark: bool) -> None:
        self._settle(agent_id, ids, mark=mark)

    def _settle(self, agent_id: str, ids: list[str], *, mark: bool) -> None:
        """Ack (and delete) the entries handed out under ``ids``, by any process; with
        ``mark``, mark them handled in the same script and forget marks older than
        ``handled_ttl``.
        """
        if not ids:
            return
        now = time.time()
        keys = self.keys
        self._settle_script(
            [keys.pending(agent_id), keys.inbox(agent_id), keys.handled(agent_id)],
            agent_id,
            repr(now) if mark else "",
            repr(now - self.handled_ttl),
            *ids,
        )


def check_name(what: str, value: object) -> None:
    """Refuse an empty or non-string name."""
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"{what} must be a non-empty string, got {value!r}")

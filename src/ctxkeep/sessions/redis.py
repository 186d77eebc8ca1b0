"""The Redis session backend (``redis://host:port/db``): shared by many workers, native TTL.

Layout. Every key starts with a prefix (``ctxkeep:`` by default; ``?prefix=`` in the URL
overrides it) and is named by :class:`RedisKeys`, the one place that knows the layout:

========================  ======  ==============================================================
key                       type    holds
========================  ======  ==============================================================
``session:{id}``          hash    agent_id, task_id, metadata, created_at, accessed_at,
                                  message_count, next_seq, pending (JSON where not a number),
                                  generation, first_seq, revision, op (the token of the
                                  last replace or pop, so that one sent again is done once)
``messages:{id}``         zset    ``"{seq}:{record JSON}"`` scored by seq
``roles:{id}``            zset    ``"{role}:{seq, 20 digits}"`` for each message held, all
                                  scored 0: a lexicographic index of the messages by role
``ids:{id}``              hash    message id -> seq, for idempotent appends (an entry counts
                                  only while that seq holds a message with that id)
``agent:{agent_id}``      zset    the agent's session ids by created_at
``task:{task_id}``        zset    the task's session ids by created_at
``created``               zset    every session id by created_at (listing)
``accessed``              zset    every session id by accessed_at (LRU, idle sweeps)
``expires``               zset    ids of sessions with a TTL, by expiry deadline (ms)
``owners``                hash    id -> ``[agent_id, task_id]``, to clean indexes after expiry
``archive:{id}``          list    trimmed and evicted messages (record JSON), oldest first
``archive-ids:{id}``      set     message ids already archived (archiving is idempotent)
``folds:{id}``            hash    fold snapshots by key (:mod:`ctxkeep.prune.snapshots`); its
                                  TTL is the session's when written, deleted with the session
``meta``                  hash    every store's schema version (field ``sessions``)
========================  ======  ==============================================================

TTL. With a ``session_ttl``, a session's own keys (``session:``, ``messages:``, ``roles:``,
``ids:``) get
a deadline ``ttl + grace`` seconds after their last access (``PEXPIREAT``), set on create and
moved on every touch and append, so Redis reclaims idle sessions by itself even if no ctxkeep
process runs. Redis deletes expired keys silently: unlike the manager's :meth:`sweep`, native
expiry calls no ``on_evict`` hook and archives nothing, so the grace (``?ttl_grace=`` seconds,
default: the TTL again) leaves a window in which a sweep, or any access, which treats a session
idle past its TTL as expired, archives it first. The shared indexes do not expire; an id whose
keys are gone is pruned from them lazily, when a query finds it (``expires`` tells
:meth:`RedisBackend.count` which ids to check).

Atomicity. An append is one call of a Lua script (:data:`APPEND_SCRIPT`, ``EVALSHA``): the
manager's check runs on the session's state this process last saw, and the script, atomic on
the server, writes the messages (and their ``roles:`` entries), the hash and the indexes
(``accessed``, ``expires``, the keys' deadline: these three only where ``accessed_at`` moves,
past the manager's touch resolution, as on SQL) only if the hash still has that ``pending`` and
no earlier ``accessed_at``; else it answers the hash as it is, the check runs again on it and
the script is called again (:func:`~ctxkeep.sessions.base.cas_append`). One round trip per
append where four were (a read, ``WATCH``, a read, ``MULTI``/``EXEC``; a ``max_history`` adds
the manager's read of the session for its trim): 2.6x the appends per second on a loaded
two-core machine (``bench/redis_appends.py``). The client's share is kept small too: the script
is sent on a connection held for the scripts, packed by hiredis in one call, without redis-py's
``execute_command`` around it (:class:`~ctxkeep._redis.Direct`: 43 -> 9 us of client CPU a
call), answers its numbers as integers, and its answer is parsed in C (hiredis: the ``redis``
extra brings it). Replacing the newest message (an Agents SDK
``pop_item``, a pop) is one script call the same way (:data:`REPLACE_SCRIPT`): the check runs on
the state and the newest message this process last saw (each read and write remembers them),
and the script takes that message off and writes the replacement only if the session still has
that generation, ``pending``, no earlier ``accessed_at`` and its newest message at that seq (a
seq is not reused within a generation, so it names the message); else it answers them as they
are, and the check runs again. A pop (a replacement by nothing) has a leaner script of its own
(:data:`POP_SCRIPT`: no float parsed where the access time is as this process saw it, and no
count of the messages above the newest where ``next_seq`` is as it was when that message was
seen newest; 168,000 -> 140,000 server instructions a pop), and sends a ``ZRANGE`` of the
message it leaves newest after the script, in the same write: the next pop's guess. Where there
were four round trips
(``WATCH``, two reads, ``MULTI``/``EXEC``), one; ``tests/test_redis_round_trips.py`` counts
them. A whole read
(:meth:`RedisBackend.read`) is one ``MULTI``/``EXEC`` sent as one write (not a script: a
script's answer is copied through Lua, 9 ms of the server's time for 1,000 messages of 3.8 kB
where the read itself takes 0.6), and a read's access one script (:data:`TOUCH_SCRIPT`). Sequence
numbers stay gapless under any number of writers. Multi-key transactions need one Redis node
(no Redis Cluster); Redis 6.2 or newer.
A trim is one script too (:data:`TRIM_SCRIPT`): the messages up to the cut are archived and
removed in one atomic step, so the archive is in seq order under any number of writers, and
no reader sees a message both held and archived.

The newest messages by themselves. A prompt of a long session reads it newest first, a page
at a time (:meth:`RedisBackend.read_tail`), with the older messages of a few roles (the system
messages, the newest user message) as marks. One script (:data:`TAIL_SCRIPT`) answers it at
one instant: the page by score (``ZREVRANGEBYSCORE ... LIMIT``), the marks from ``roles:``
(``ZRANGEBYLEX`` per role, ``ZREVRANGEBYLEX ... LIMIT`` for the newest), each mark by its
score; only what it answers crosses the wire. Every write keeps ``roles:`` in step with
``messages:`` in the same atomic step (the append script, the transactions of a replace, a pop,
a trim, a delete; the same TTL). A session whose index does not hold one entry per message
(written before the index existed, or by a writer that does not keep it) is read whole, as
before, and its index rebuilt on the way (:meth:`RedisBackend._reindex`). Measured on a
loaded two-core machine (``bench/cold_build.py``, see BENCHMARKS.md): the first
``cache_stable=False`` prompt of a new process on a 10,000-message session went from 418-984
ms (medians; every record read and decoded) to 25-37 ms, SQLite's 26-57 ms in the same run.
The other way, a script that walks the older messages and matches their roles server-side,
took 170-270 ms per page there, all of it blocking the server for every other client. The
index costs an append one ``ZADD`` of short members and one ``PEXPIREAT`` inside the script it
already runs (appends per second unchanged within the noise, ``bench/redis_appends.py``), a
trim one ``ZREMRANGEBYLEX`` per role, and about 130 bytes a message.

Durability, honestly. Redis keeps everything in memory; what survives a restart of the Redis
server depends on its persistence settings, not on ctxkeep. With RDB snapshots only, writes
since the last snapshot are lost; with ``appendonly yes`` and ``appendfsync everysec``, up to
about a second of writes; with ``appendfsync always``, nothing acknowledged. The project's own
machines run Redis with ``--save "" --appendonly no``: **nothing survives a Redis restart
there**. A ``maxmemory`` policy that evicts keys (``volatile-*`` evicts exactly the keys that
carry a TTL) also drops sessions without notice. Use Redis for shared, short-lived working
memory; use PostgreSQL or SQLite for history that must outlive the server.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

from ctxkeep._redis import (
    DEFAULT_PREFIX,
    LuaScript,
    Migration,
    Pipeline,
    RedisClient,
    atomic,
    direct,
    redis,
    translated,
)
from ctxkeep.errors import (
    ConfigError,
    SessionChangedError,
    SessionExistsError,
    SessionNotFoundError,
    StorageError,
)
from ctxkeep.messages import ROLES, Message
from ctxkeep.sessions.base import (
    Backend,
    Evicted,
    EvictReason,
    KnownStates,
    Row,
    Snapshot,
    Stored,
    Tail,
    Written,
    _new_id,
    cas_append,
    tail_of,
)
from ctxkeep.sessions.records import (
    Append,
    SessionInfo,
    corrupt_session,
    dumps,
    dumps_record,
    info_with,
    load_record,
    loads,
    new_generation,
    pending_after_pop,
    record_to_message,
    settle_ids,
)

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

T = TypeVar("T")


_SCAN_CHUNK = 200


# -- the layout, free of I/O ------------------------------------------------------------------


_OWN_KINDS = ("session:", "messages:", "roles:", "ids:")
"""The keys of one session that expire with it (:meth:`RedisKeys.own`), in the order of the
scripts' KEYS: ``{prefix}{kind}{session id}``."""
_WRITTEN_INDEXES = ("accessed", "expires")
"""The shared indexes a write of a session moves, after its own keys in the scripts' KEYS."""


@dataclass(frozen=True)
class RedisKeys:
    """The name of every key the backend uses, under one prefix."""

    prefix: str = DEFAULT_PREFIX
    _own: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """Each of :data:`_OWN_KINDS` under the prefix: a session's key is one of these and its
    id (the one place their names are spelt; :meth:`written` is one call, not seven)."""
    _indexes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """Each of :data:`_WRITTEN_INDEXES` under the prefix."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_own", tuple(self.prefix + kind for kind in _OWN_KINDS))
        object.__setattr__(self, "_indexes", tuple(self.prefix + n for n in _WRITTEN_INDEXES))

    def session(self, session_id: str) -> str:
        """The session's hash."""
        return self._own[0] + session_id

    def messages(self, session_id: str) -> str:
        """The session's messages, a zset scored by seq."""
        return self._own[1] + session_id

    def agent(self, agent_id: str) -> str:
        """The agent's sessions by created_at."""
        return f"{self.prefix}agent:{agent_id}"

    def task(self, task_id: str) -> str:
        """The task's sessions by created_at."""
        return f"{self.prefix}task:{task_id}"

    def archive(self, session_id: str) -> str:
        """The session's archived messages."""
        return f"{self.prefix}archive:{session_id}"

    def archive_ids(self, session_id: str) -> str:
        """Ids of the session's archived messages."""
        return f"{self.prefix}archive-ids:{session_id}"

    def roles(self, session_id: str) -> str:
        """The session's messages by role: ``"{role}:{seq, 20 digits}"``, scored 0."""
        return self._own[2] + session_id

    def ids(self, session_id: str) -> str:
        """The session's message ids: id -> seq."""
        return self._own[3] + session_id

    def folds(self, session_id: str) -> str:
        """The session's fold snapshots, a hash by key."""
        return f"{self.prefix}folds:{session_id}"

    @property
    def created(self) -> str:
        """Every session by created_at."""
        return f"{self.prefix}created"

    @property
    def accessed(self) -> str:
        """Every session by accessed_at."""
        return self._indexes[0]

    @property
    def expires(self) -> str:
        """Sessions with a TTL, by deadline in Unix milliseconds."""
        return self._indexes[1]

    @property
    def owners(self) -> str:
        """Session id -> ``[agent_id, task_id]``."""
        return f"{self.prefix}owners"

    def written(self, session_id: str) -> list[str]:
        """The KEYS of the scripts that write a session: its own (:meth:`own`), then the
        accessed and expires indexes; made in one call (an add's seven calls were six too many).
        """
        session, messages, roles, ids = self._own
        return [
            session + session_id,
            messages + session_id,
            roles + session_id,
            ids + session_id,
            *self._indexes,
        ]

    def own(self, session_id: str) -> tuple[str, str, str, str]:
        """The keys that belong to one session and expire with it."""
        session, messages, roles, ids = self._own
        return (session + session_id, messages + session_id, roles + session_id, ids + session_id)


def session_fields(info: SessionInfo) -> dict[FieldT, EncodableT]:
    """The hash fields of a session."""
    fields: dict[FieldT, EncodableT] = {
        "agent_id": info.agent_id,
        "metadata": dumps(info.metadata),
        "created_at": repr(float(info.created_at)),
        "accessed_at": repr(float(info.accessed_at)),
        "message_count": str(info.message_count),
        "next_seq": str(info.next_seq),
        "pending": dumps(list(info.pending)),
        "generation": info.generation,
        "first_seq": str(info.first_seq),
        "revision": str(info.revision),
    }
    if info.task_id is not None:
        fields["task_id"] = info.task_id
    return fields


def session_from_fields(session_id: str, fields: dict[str, str]) -> SessionInfo:
    """The session a hash describes.

    Raises:
        CorruptRecordError: a hash missing fields or holding garbage.

    """
    try:
        return SessionInfo(
            session_id=session_id,
            agent_id=fields["agent_id"],
            task_id=fields.get("task_id"),
            metadata=loads(fields["metadata"]),
            created_at=float(fields["created_at"]),
            accessed_at=float(fields["accessed_at"]),
            message_count=int(fields["message_count"]),
            next_seq=int(fields["next_seq"]),
            pending=tuple(loads(fields["pending"])),
            generation=fields["generation"],
            first_seq=int(fields["first_seq"]),
            revision=int(fields.get("revision", "0")),  # absent before pops existed
        )
    except (KeyError, ValueError, TypeError, RecursionError) as exc:
        raise corrupt_session(session_id, f"Redis hash: {exc!r}") from exc


def message_member(seq: int, record: dict[str, Any]) -> str:
    """The zset member of a stored message (the seq prefix keeps members unique)."""
    return f"{seq}:{dumps(record)}"


INDEXED_ROLES = ("", *sorted(ROLES))
"""Every role a stored message can have (``""``: see :func:`role_of`): a trim removes each
one's entries. Another one's would stay behind, the index would then count more entries than
messages, and the session be read whole and its index rebuilt (see the module docstring)."""

SEQ_DIGITS = 20
"""The width of a seq in ``roles:`` members (zero-padded, so that lexicographic order is seq
order)."""


def role_of(record: dict[str, Any]) -> str:
    """The role a record is indexed under: its ``role``, ``""`` where that is not a string
    (no such record passes :class:`~ctxkeep.messages.Message`; it is indexed all the same, so
    that the index holds one entry per message, and no read asks for role ``""``).
    """
    role = record.get("role")
    return role if isinstance(role, str) else ""


def role_member(role: str, seq: int) -> str:
    """The ``roles:`` member of the message ``seq`` with ``role``."""
    return f"{role}:{seq:0{SEQ_DIGITS}d}"


def _pending_json(pending: tuple[str, ...]) -> str:
    """``pending`` as the hash stores it (JSON), without encoding the common empty one."""
    return dumps(list(pending)) if pending else "[]"


def parse_member(session_id: str, member: str) -> tuple[int, dict[str, Any]]:
    """``(seq, record)`` from a zset member of ``session_id``'s messages.

    Raises:
        CorruptRecordError: a member that is not ``{seq}:{record JSON}``.

    """
    head, _, text = member.partition(":")
    seq = int(head) if head.isdigit() else -1
    return seq, load_record(session_id, seq, text)


class _Top(NamedTuple):
    """A session's newest message as this process last saw it: its generation and seq (which
    name one message: a seq is not reused within a generation) and what a replacement needs of
    its record (id, role, the call it answers, whether it makes calls).

    A named tuple, where a frozen dataclass's ``__init__`` ran four ``object.__setattr__``
    calls: every append makes one (34 -> 10 bytecodes for it, a LangChain add on Redis,
    ``sys.settrace``, hand-run). A member kept undecoded (:meth:`_Tops.put_member`) is a
    plain tuple, never an instance of this class.
    """

    generation: str
    seq: int
    record: dict[str, Any]
    next_seq: int | None = None
    """The session's next seq when this message was seen as its newest (None: not known).
    Every write that adds a message moves next_seq past it, so while the hash still has this
    one (and this generation), no message lies above this one: the pop script's check that it
    is still the newest, without counting the messages above it (:data:`POP_SCRIPT`)."""


def _stub(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of a record that a replacement of it reads (all :class:`_Tops` keeps)."""
    return {
        "id": record.get("id"),
        "role": record.get("role"),
        "tool_call_id": record.get("tool_call_id"),
        "tool_calls": bool(record.get("tool_calls")),
    }


class _Tops:
    """The newest message of each session this process last saw (the newest few thousand
    sessions), what the replace script's compare-and-set checks against: only a guess, which
    the script verifies by generation and seq.

    A message seen as a stored member (a read's newest, the message a pop left newest) is kept
    as that text and decoded only when a replacement asks for it (:meth:`get`): after a pop
    the next write is most often an append, which names a newest message of its own (a pop
    then an add of an Agents SDK session decoded a 3.9 kB record for nothing).
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._tops: dict[str, _Top | tuple[str, str, int | None]] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str) -> _Top | None:
        """The newest message last seen, or None.

        Raises:
            CorruptRecordError: it was kept as a member that is not a record.

        """
        top = self._tops.get(session_id)
        if top is None or isinstance(top, _Top):
            return top
        generation, member, next_seq = top
        seq, record = parse_member(session_id, member)
        found = _Top(generation, seq, _stub(record), next_seq)
        with self._lock:
            if self._tops.get(session_id) is top:  # not replaced meanwhile
                self._tops[session_id] = found
        return found

    def put(
        self,
        session_id: str,
        generation: str,
        seq: int,
        record: dict[str, Any],
        next_seq: int | None = None,
    ) -> None:
        """Remember ``record`` at ``seq`` as the session's newest message (only the fields a
        replacement reads are kept), seen when the session's next seq was ``next_seq``
        (default: ``seq + 1``, as after a write that made it; a hash with that next seq holds
        nothing above ``seq`` whenever it was seen).
        """
        self._keep(
            session_id,
            _Top(generation, seq, _stub(record), seq + 1 if next_seq is None else next_seq),
        )

    def put_member(
        self, session_id: str, generation: str, member: str, next_seq: int | None = None
    ) -> None:
        """Remember the stored ``member`` (``"{seq}:{record JSON}"``) as the session's newest
        message, decoded on the first :meth:`get`, seen when the session's next seq was
        ``next_seq`` (None: not known).
        """
        self._keep(session_id, (generation, member, next_seq))

    def _keep(self, session_id: str, top: _Top | tuple[str, str, int | None]) -> None:
        with self._lock:
            self._tops.pop(session_id, None)
            self._tops[session_id] = top
            while len(self._tops) > self.size:
                self._tops.pop(next(iter(self._tops)))

    def forget(self, session_id: str) -> None:
        """Drop what is known of a session's newest message."""
        with self._lock:
            self._tops.pop(session_id, None)


# -- the append script ------------------------------------------------------------------------

# What an append and a replace share (Lua, put before each script's body). KEYS as theirs
# (session hash, messages zset, roles index, ids hash, accessed index, expires index); ARGV[1]
# the session id, ARGV[2] the base pending (JSON), ARGV[5] now, ARGV[6] the deadline in Unix
# ms ('' for no TTL).
#
# same_pending(stored): whether the hash's pending is the base's (as text first: both are
# the client's compact JSON unless another writer spelt it otherwise; decoded only then).
#
# access(fields, stored, touch_after, fresh, named, moves): the write's access. accessed_at moves
# to now only where it is at least touch_after seconds older (Append.touch_after, the manager's
# touch resolution: as on SQL, a session written many times a second moves once a second;
# ``moves``, where not nil, is that answer as the client worked it out from the same doubles,
# for a hash it saw at the stored accessed_at: no float's text parsed), and
# with it the session's place in the accessed index and its keys' deadline (PEXPIREAT, or
# PERSIST for no TTL): six commands of an append's twelve, which a write that does not move it
# skips. Keys the write may have made get the deadline all the same: with ``fresh`` (the
# session held at most the message taken off, so its messages, roles and ids keys may be new)
# every key; with ``named`` (ids written) and a TTL, the ids hash if it has none (a session of
# records without ids). Appends 'accessed_at' to the hash fields to write when it moves;
# returns the accessed_at the hash holds after the write.
_ACCESS_LUA = """
local function same_pending(stored)
  if stored == ARGV[2] then return true end
  local held, base = cjson.decode(stored), cjson.decode(ARGV[2])
  if #held ~= #base then return false end
  for i = 1, #held do
    if held[i] ~= base[i] then return false end
  end
  return true
end
local function deadline()
  if ARGV[6] == '' then
    for k = 1, 4 do redis.call('PERSIST', KEYS[k]) end
    redis.call('ZREM', KEYS[6], ARGV[1])
  else
    for k = 1, 4 do redis.call('PEXPIREAT', KEYS[k], ARGV[6]) end
    redis.call('ZADD', KEYS[6], ARGV[6], ARGV[1])
  end
end
local function access(fields, stored, touch_after, fresh, named, moves)
  if moves == nil then
    local now, last = tonumber(ARGV[5]), tonumber(stored)
    moves = not (now <= last or now - last < tonumber(touch_after))
  end
  if not moves then
    if fresh then
      deadline()
    elseif named and ARGV[6] ~= '' and redis.call('PTTL', KEYS[4]) == -1 then
      redis.call('PEXPIREAT', KEYS[4], ARGV[6])
    end
    return stored
  end
  fields[#fields + 1] = 'accessed_at'
  fields[#fields + 1] = ARGV[5]
  redis.call('ZADD', KEYS[5], ARGV[5], ARGV[1])
  deadline()
  return ARGV[5]
end
"""

# What the append and the replacement share, on the same KEYS.
#
# held(at, n, skip): the members held under the ids ARGV[at + 1 .. at + n] (idempotency by id:
# the ids hash names a seq whose message has that id; the seq ``skip``, the message a
# replacement takes off, holds none).
#
# store(first, n, record, at): the write's n records at seqs first.. (``record(i, seq)`` gives
# the i-th's member and roles entry, ARGV[at + i] its id, '' for none) added to the messages,
# the roles index and the ids hash, in chunks (unpack() has a stack limit); whether any id was
# written.
_WRITE_LUA = """
local function held(at, n, skip)
  local found = {}
  for i = 1, n do
    local id = ARGV[at + i]
    local seq = id ~= '' and redis.call('HGET', KEYS[4], id)
    if seq and seq ~= skip then
      local m = redis.call('ZRANGEBYSCORE', KEYS[2], seq, seq)[1]
      if m and cjson.decode(string.sub(m, #seq + 2)).id == id then found[#found + 1] = m end
    end
  end
  return found
end
local function store(first, n, record, at)
  local batch, roles, ids, named = {}, {}, {}, false
  for i = 1, n do
    local seq = string.format('%d', first + i - 1)
    local member, role = record(i, seq)
    batch[#batch + 1] = seq
    batch[#batch + 1] = member
    roles[#roles + 1] = '0'
    roles[#roles + 1] = role
    if ARGV[at + i] ~= '' then  -- a record without an id is stored, never matched
      ids[#ids + 1] = ARGV[at + i]
      ids[#ids + 1] = seq
    end
    if #batch >= 1000 or i == n then
      redis.call('ZADD', KEYS[2], unpack(batch))
      redis.call('ZADD', KEYS[3], unpack(roles))
      if #ids > 0 then redis.call('HSET', KEYS[4], unpack(ids)) named = true end
      batch, roles, ids = {}, {}, {}
    end
  end
  return named
end
"""

# take_off(): the index entries of the newest message a replacement or a pop takes off (ARGV[8]
# its seq, ARGV[9] its roles entry, ARGV[10] its id or ''), the message itself taken off by
# the caller; its id's entry only where it still names that seq.
_TAKE_LUA = """
local function take_off()
  redis.call('ZREM', KEYS[3], ARGV[9])
  if ARGV[10] ~= '' and redis.call('HGET', KEYS[4], ARGV[10]) == ARGV[8] then
    redis.call('HDEL', KEYS[4], ARGV[10])
  end
end
local function op_of(token, revision, first)  -- the hash's 'op' a replace or pop leaves
  return token .. ':' .. string.format('%d:%d', revision, first)
end
local function done_before(token, h)  -- h: the hash's fields, 'op' seventh ('Sent again')
  if token == '' or not h[7] or string.sub(h[7], 1, #token + 1) ~= token .. ':' then
    return nil
  end
  local rev, first = string.match(h[7], ':(%d+):(%d+)$')  -- done before: its answer was lost
  if rev == h[6] then return {'ok', tonumber(first), h[4], tonumber(h[2]), tonumber(h[6])} end
  return {'done', tonumber(first)}
end
"""

# One append, in one round trip: a compare-and-set on the session's state (see
# ctxkeep.sessions.base.cas_append). The client ran the manager's check on the state it last saw
# (ARGV[2] pending, ARGV[3] accessed_at, ARGV[7] generation); the script stores the messages
# only if the hash still has that pending, no earlier accessed_at and that generation (a session
# deleted and made again under the same id is another session), else it answers the hash as it
# is, to check again. First of all, idempotency by id: if any of the batch's ids is held (the
# ids hash names a seq whose message has that id), nothing is written and the script answers
# those messages, for the client to decide a retry or a conflict
# (ctxkeep.sessions.records.settle_ids). The access as _ACCESS_LUA says.
# KEYS: session hash, messages zset, roles index, ids hash, accessed index, expires index.
# ARGV: session id, base pending (JSON), base accessed_at, new pending (JSON), now,
#       deadline in Unix ms ("" for no TTL), base generation, touch_after (seconds), '1' where
#       every id was made for this append (Append.fresh_ids: none can be held, the ids are not
#       looked up) else '', the first seq as the client guessed it (its base's next_seq), '1'
#       where the access moves the base's accessed_at to now (now - base >= touch_after, now
#       later) else '', then the records as members ("{seq}:{record JSON}", numbered from the
#       guess), oldest first, then their roles index entries ("{role}:{seq, 20 digits}",
#       numbered alike), then their ids, in the same order.
# A member is stored as it came where the guess holds (the hash's next_seq): building it in Lua
# from the record made a second copy of each record there, a sixth of the script's server CPU
# (2,000 appends of 3.8 kB records, pipelined: 35 -> 29 us); where another writer appended
# meanwhile (the check does not compare next_seq: an append that leaves pending as it was does
# not refuse another), it is numbered again, and so is its index entry. One message on a right
# guess (a chat history's add) takes a path of its own, without Lua tables or formatting of
# its seq, and pending is written only where it changes: 254,000 -> 238,000 instructions of
# the server an add of a LangChain message of 3.9-6.4 kB (callgrind, Redis 7.0, 200 adds, three
# runs each; the rest is the record made a Lua string, 50,000, and the five commands). The
# access time is compared and moved as in POP_SCRIPT: as the hash stores it first, and whether
# the access moves it worked out by the client, so that a hash still at the base's accessed_at
# parses no float's text (glibc's strtod, five of them: 212,000 -> 201,000 instructions of the
# server a right guess's add of a LangChain message, callgrind, Redis 7.0, 200 adds).
# The roles index entry's score goes as the string '0': a Lua number passed to redis.call is
# formatted by snprintf("%.17g"): an add of a 4.4 kB message, median 236,500 -> 234,600 of the
# server's instructions (callgrind, Redis 7.0, 100 adds a run, seven runs each, interleaved).
# That common case (one message, its id made for this append, the hash exactly as the client
# last saw it: the same next_seq, pending, accessed_at and generation as text, a session that
# holds messages, an access that does not move) comes first, before the script's functions are
# made: the same commands in the same order, without the closures, the id lookup, the decoded
# pending and the tables of the general path. Redis's time an EVALSHA of a chat history's add
# (399 adds of the demo chat messages of 3.6 kB, nine rounds interleaved with the script before,
# INFO commandstats, Redis 7.0, loaded two-core machine): 56.6 -> 52.2 us median with
# no TTL, 49.5 -> 44.7 with one (a script of those five commands alone: 34 us).
# Answer: {'ok', first seq, accessed_at, message_count} (the seq and the count as integers, which
# the client takes without parsing), {'stale', the hash's fields and values}, {'found', the
# members held under the batch's ids} or {'missing'}.
APPEND_SCRIPT = (
    """
local h = redis.call('HMGET', KEYS[1], 'next_seq', 'message_count', 'pending', 'accessed_at',
  'generation')
if h[1] and #ARGV == 14 and ARGV[9] == '1' and h[1] == ARGV[10] and h[4] == ARGV[3]
    and ARGV[11] ~= '1' and h[5] == ARGV[7] and h[3] == ARGV[2] and h[2] ~= '0' then
  -- the common case, before the functions below are made: what the general path does for
  -- it, in the same order (see above)
  local total = tonumber(h[2]) + 1
  redis.call('ZADD', KEYS[2], ARGV[10], ARGV[12])
  redis.call('ZADD', KEYS[3], '0', ARGV[13])
  if ARGV[14] ~= '' then
    redis.call('HSET', KEYS[4], ARGV[14], ARGV[10])
    if ARGV[6] ~= '' and redis.call('PTTL', KEYS[4]) == -1 then
      redis.call('PEXPIREAT', KEYS[4], ARGV[6])
    end
  end
  local next_seq = string.format('%d', tonumber(h[1]) + 1)
  local count = string.format('%d', total)
  if h[3] ~= ARGV[4] then
    redis.call('HSET', KEYS[1], 'next_seq', next_seq, 'message_count', count, 'pending', ARGV[4])
  else
    redis.call('HSET', KEYS[1], 'next_seq', next_seq, 'message_count', count)
  end
  return {'ok', tonumber(h[1]), h[4], total}
end
"""
    + _ACCESS_LUA
    + _WRITE_LUA
    + """
if not h[1] then return {'missing'} end
local n = (#ARGV - 11) / 3
local found = held(11 + 2 * n, ARGV[9] == '' and n or 0)  -- ids made for this append: none held
if #found > 0 then return {'found', found} end
local same = h[4] == ARGV[3]
if not (h[5] == ARGV[7] and (same or tonumber(h[4]) >= tonumber(ARGV[3]))
    and same_pending(h[3])) then
  return {'stale', redis.call('HGETALL', KEYS[1])}
end
local first = tonumber(h[1])
local guessed = h[1] == ARGV[10]
local total = tonumber(h[2]) + n
local named = false
if n == 1 and guessed then  -- the common case: stored as they came
  redis.call('ZADD', KEYS[2], ARGV[10], ARGV[12])
  redis.call('ZADD', KEYS[3], '0', ARGV[13])
  if ARGV[14] ~= '' then redis.call('HSET', KEYS[4], ARGV[14], ARGV[10]) named = true end
else
  named = store(first, n, function(i, seq)
    local member, role = ARGV[11 + i], ARGV[11 + n + i]
    if not guessed then  -- numbered from another seq: the record after the client's number
      member = seq .. string.sub(member, string.find(member, ':', 1, true), -1)
      role = string.sub(role, 1, -21) .. string.format('%020d', first + i - 1)
    end
    return member, role
  end, 11 + 2 * n)
end
local fields = {'next_seq', string.format('%d', first + n), 'message_count',
  string.format('%d', total)}
if h[3] ~= ARGV[4] then
  fields[5] = 'pending'
  fields[6] = ARGV[4]
end
local moves  -- the client's answer holds for the base's accessed_at
if same then moves = ARGV[11] == '1' end
local accessed = access(fields, h[4], ARGV[8], h[2] == '0', named, moves)
redis.call('HSET', KEYS[1], unpack(fields))
return {'ok', first, accessed, total}
"""
)


# A replacement of the newest message (or a pop: no records), in one round trip: a
# compare-and-set as the append's (see APPEND_SCRIPT), on the session's state and its newest
# message as this process last saw them. The client ran the manager's check on that state less
# the newest message (ARGV[8], its seq: a seq is never reused within a generation, so the seq
# and the generation name one message); the script takes that message off and stores the
# records in its place only if the hash still has that generation, pending and no earlier
# accessed_at, and the newest message is still at that seq. Else it answers the hash and the
# newest member as they are, to check again. Then idempotency by id, as in the append (the
# message taken off does not count as held). The access as _ACCESS_LUA says.
# The newest message is found by its score (ZCOUNT above it, ZCOUNT at it, ZREMRANGEBYSCORE:
# a member's score is its seq), not read: a 3.9 kB member copied into Lua and back to take it
# off cost more than the rest of a pop (server CPU per pop, pipelined, 2,000 pops of a private
# Redis 7.0 in turns: 31.2 -> 23.6 us, with the newest left taken by rank, ZRANGE -1 -1). A pop
# (no records: no ids to look up before the removal) counts at the seq by the removal itself:
# nothing removed, nothing was changed, and the answer is 'stale' as the ZCOUNT's would be
# (a ZCOUNT less: 5,600 instructions of a pop).
# KEYS: session hash, messages zset, roles index, ids hash, accessed index, expires index.
# ARGV: session id, base pending (JSON), base accessed_at, new pending (JSON), now, deadline in
#       Unix ms ("" for no TTL), base generation, the newest message's seq, its roles index
#       entry ("{role}:{seq, 20 digits}"), its id ("" for none), touch_after (seconds), '1'
#       where every id was made for this write (as in the append) else '', the write's token
#       (see 'Sent again' below; '' for none), then the records (JSON), oldest first, then
#       their roles, then their ids, in the same order.
# The hash's fields are written only where they change (a pop leaves next_seq, and most often
# pending, as they were), and the newest message's index entry comes whole from the client:
# 195,000 -> 189,000 server instructions a pop of a 3.9 kB message, with the ZRANGE after it
# (callgrind, Redis 7.0, 150 pops, three runs of each).
# The message a pop leaves newest (the next pop's guess) is not read here: a member read in a
# script is made a Lua string, which Redis's Lua hashes byte by byte (its luaS_newlstr hashes
# with a step of 1): about 12 instructions a byte (cachegrind: 48,000 for a 3.9 kB string,
# 466,000 for 39 kB), and copied out again; the client sends a
# ZRANGE -1 -1 after the script in the same write instead (not atomic with it: another writer's
# change meanwhile is caught by the next pop's check, as any guess is). With the count above,
# the server's instructions per pop of a 1,200-message session of 3.9 kB records went from
# 229,000-234,000 to 154,000-175,000 (cachegrind, Redis 7.0, 200 pipelined pops, three runs).
# Answer: {'ok', first seq, accessed_at, message_count, revision}, {'stale', the hash's fields
# and values, the newest member or ''}, {'found', the members held under the batch's ids} or
# {'missing'}.
# The client sends its pops (no records) to POP_SCRIPT, below, which does the same leaner; the
# no-records path here stands for any caller of this script that sends none.
# Sent again. A write whose connection drops is sent again as it was (Direct, redis-py's
# retries), though it may have run the first time and only its answer been lost. Run again, a
# replace or a pop would find its own write (the newest message gone, or the replacement
# newest) and answer 'stale': the caller was told the session changed for a write that was
# made, and a pop_item read the session and took a second item. So each replace and pop
# carries a token of its own (random, the same in every send of it), stored in the hash's
# 'op' field by the write with the revision it made and its first seq ("{token}:{revision}:
# {first}"; a pop's first is the next seq); a run that finds its token there writes nothing
# and answers 'ok' from the hash where it is still at that revision (the seqs, count and
# revision as the write left them), else {'done', first}: the write was made, but another
# came after it, so the caller forgets what it knew of the session (no answer describes a
# session that has changed since, and a pop is not taken again). An append needs none: its
# ids find it (APPEND_SCRIPT).
REPLACE_SCRIPT = (
    _ACCESS_LUA
    + _WRITE_LUA
    + _TAKE_LUA
    + """
local h = redis.call('HMGET', KEYS[1], 'next_seq', 'message_count', 'pending', 'accessed_at',
  'generation', 'revision', 'op')
if not h[1] then return {'missing'} end
local n = (#ARGV - 13) / 3
local before = done_before(ARGV[13], h)
if before then return before end
local function stale()
  local top = redis.call('ZRANGE', KEYS[2], -1, -1)[1]
  return {'stale', redis.call('HGETALL', KEYS[1]), top or ''}
end
if not (h[5] == ARGV[7] and tonumber(h[4]) >= tonumber(ARGV[3]) and same_pending(h[3])
    and ARGV[8] ~= '' and redis.call('ZCOUNT', KEYS[2], '(' .. ARGV[8], '+inf') == 0
    and (n == 0 or redis.call('ZCOUNT', KEYS[2], ARGV[8], ARGV[8]) == 1)) then
  return stale()
end
local found = held(13 + 2 * n, ARGV[12] == '' and n or 0, ARGV[8])  -- made for it: none held
if #found > 0 then return {'found', found} end
if redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[8], ARGV[8]) == 0 then
  return stale()  -- (a pop: its count is the check that the seq holds a message)
end
take_off()
local first = tonumber(h[1])
local count = math.max(tonumber(h[2]) - 1, 0) + n
local named = store(first, n, function(i, seq)
  local role = ARGV[13 + n + i] .. ':' .. string.format('%020d', first + i - 1)
  return seq .. ':' .. ARGV[13 + i], role
end, 13 + 2 * n)
local revision = tonumber(h[6] or '0') + 1
local fields = {'message_count', string.format('%d', count), 'revision',
  string.format('%d', revision), 'op', op_of(ARGV[13], revision, first)}
if n > 0 then  -- (a pop leaves next_seq as it is)
  fields[#fields + 1] = 'next_seq'
  fields[#fields + 1] = string.format('%d', first + n)
end
if h[3] ~= ARGV[4] then
  fields[#fields + 1] = 'pending'
  fields[#fields + 1] = ARGV[4]
end
local accessed = access(fields, h[4], ARGV[11], tonumber(h[2]) <= 1, named)
redis.call('HSET', KEYS[1], unpack(fields))
return {'ok', first, accessed, count, revision}
"""
)


# A pop of the newest message (a replacement by nothing: an Agents SDK ``pop_item``), in one round
# trip: REPLACE_SCRIPT's compare-and-set without its records, on the same KEYS and checks (the
# session's generation, pending and no earlier accessed_at; its newest message still at the seq
# this process last saw), leaner. A pop is the call that stands beside the SDK's own RedisSession,
# whose pop is one RPOP: the server's work for it is what this script is made to keep small. The
# access time the client saw is compared as the hash stores it first (both are the repr of one
# float), so in the common case no number is parsed from a float's text (glibc's strtod of a
# 17-digit time costs thousands of instructions; five of them were a tenth of a pop's server
# instructions), and whether the access moves it is worked out by the client, as access() would
# on the server, from the same doubles; a hash whose accessed_at reads otherwise (moved by another
# writer, or written in another spelling) takes access() itself. That nothing lies above the seq
# is checked by the hash's next_seq where it is still the one this process saw with that newest
# message (_Top.next_seq: every write that adds a message moves it), by a count of the messages
# above the seq only where it moved (ZCOUNT: a redis.call less a pop, of seven). No table is made
# but the hash's fields.
# The common case (the hash as the client last saw it: the same next_seq, accessed_at,
# generation and pending as text, no access to move, no earlier send of this pop's token in
# 'op', a session that keeps a message after it) comes first, as the append's does: the same
# commands in the same order, without the six closures the general path makes, the token's
# prefix cut and joined to compare ('op' tested in place, string.find and string.byte) and the
# table of fields. The server's instructions a pop of a 4.4 kB message, its ZRANGE after it
# included (callgrind, Redis 7.0, 100 pops a run, seven runs each, interleaved): median
# 177,700 (174,000-180,500) -> 165,800 (162,000-171,000); a script of the same six commands
# with no check at all takes 160,300-163,500.
# KEYS: session hash, messages zset, roles index, ids hash, accessed index, expires index.
# ARGV: session id, base pending (JSON), base accessed_at, pending after the pop (JSON), now,
#       deadline in Unix ms ("" for no TTL), base generation, the newest message's seq, its roles
#       index entry, its id ("" for none), touch_after (seconds), the session's next seq when that
#       message was seen as its newest ('' for not known), '1' where the access moves the base's
#       accessed_at to now (now - base >= touch_after, now later) else '', the pop's token
#       (as REPLACE_SCRIPT's; '' for none).
# Answer: as REPLACE_SCRIPT's ({'ok', next seq, accessed_at, message_count, revision}, {'stale',
# the hash's fields and values, the newest member or ''} or {'missing'}).
POP_SCRIPT = (
    """
local h = redis.call('HMGET', KEYS[1], 'next_seq', 'message_count', 'pending', 'accessed_at',
  'generation', 'revision', 'op')
local held = h[1] and tonumber(h[2])
if held and held > 1 and h[1] == ARGV[12] and h[4] == ARGV[3] and ARGV[13] ~= '1'
    and h[5] == ARGV[7] and h[3] == ARGV[2]
    and (ARGV[14] == '' or not h[7] or string.find(h[7], ARGV[14], 1, true) ~= 1
      or string.byte(h[7], #ARGV[14] + 1) ~= 58) then
  -- the common case, before the functions below are made: what the general path does for
  -- it, in the same order (see above)
  if redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[8], ARGV[8]) == 0 then
    return {'stale', redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], -1, -1)[1] or ''}
  end
  redis.call('ZREM', KEYS[3], ARGV[9])
  if ARGV[10] ~= '' and redis.call('HGET', KEYS[4], ARGV[10]) == ARGV[8] then
    redis.call('HDEL', KEYS[4], ARGV[10])
  end
  local revision = tonumber(h[6] or '0') + 1
  local first = tonumber(h[1])
  local count, rev = string.format('%d', held - 1), string.format('%d', revision)
  local op = ARGV[14] .. ':' .. string.format('%d:%d', revision, first)
  if h[3] ~= ARGV[4] then
    redis.call('HSET', KEYS[1], 'message_count', count, 'revision', rev, 'op', op,
      'pending', ARGV[4])
  else
    redis.call('HSET', KEYS[1], 'message_count', count, 'revision', rev, 'op', op)
  end
  return {'ok', first, h[4], held - 1, revision}
end
"""
    + _ACCESS_LUA
    + _TAKE_LUA
    + """
if not h[1] then return {'missing'} end
local before = done_before(ARGV[14], h)
if before then return before end
local same = h[4] == ARGV[3]
if not (h[5] == ARGV[7] and (same or tonumber(h[4]) >= tonumber(ARGV[3])) and same_pending(h[3])
    and (h[1] == ARGV[12] or redis.call('ZCOUNT', KEYS[2], '(' .. ARGV[8], '+inf') == 0)
    and redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[8], ARGV[8]) ~= 0) then
  return {'stale', redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], -1, -1)[1] or ''}
end
take_off()
local held = tonumber(h[2])
local count = math.max(held - 1, 0)
local revision = tonumber(h[6] or '0') + 1
local fields = {'message_count', string.format('%d', count), 'revision',
  string.format('%d', revision), 'op', op_of(ARGV[14], revision, tonumber(h[1]))}
if h[3] ~= ARGV[4] then
  fields[7] = 'pending'
  fields[8] = ARGV[4]
end
local accessed = h[4]
if not same then
  accessed = access(fields, h[4], ARGV[11], held <= 1, false)
elseif ARGV[13] == '1' then  -- as access() moves it
  fields[#fields + 1] = 'accessed_at'
  fields[#fields + 1] = ARGV[5]
  redis.call('ZADD', KEYS[5], ARGV[5], ARGV[1])
  deadline()
  accessed = ARGV[5]
elseif held <= 1 then  -- as access() leaves it: the keys the pop may have emptied
  deadline()
end
redis.call('HSET', KEYS[1], unpack(fields))
return {'ok', tonumber(h[1]), accessed, count, revision}
"""
)


# -- the backend ------------------------------------------------------------------------------


def _op_token() -> str:
    """A new token for one replace or pop (see 'Sent again' above :data:`REPLACE_SCRIPT`):
    a message id's random hex (:func:`~ctxkeep.sessions.base._new_id`, made 64 at a time, a
    forked child making its own), where one ``os.urandom`` a pop was a system call each.
    """
    return _new_id()


def _taking(
    session_id: str,
    base: SessionInfo,
    top: _Top,
    pending: tuple[str, ...],
    now: str,
    deadline: str,
) -> tuple[str, ...]:
    """The ARGV :data:`REPLACE_SCRIPT` and :data:`POP_SCRIPT` both open with: the session id,
    the state the write was checked on (``base``: pending, accessed_at), the pending calls
    after it, now, the keys' deadline, and the newest message this process saw (``top``: the
    generation, its seq, its roles index entry and its id).
    """
    return (
        session_id,
        _pending_json(base.pending),
        repr(float(base.accessed_at)),
        _pending_json(pending),
        now,
        deadline,
        base.generation,
        str(top.seq),
        role_member(role_of(top.record), top.seq),
        top.record.get("id") or "",
    )


# A fold snapshot, stored only if the session still has the generation it was taken of; the
# key expires when the session's keys do (as they stand now).
# KEYS: session hash, folds hash. ARGV: generation, key, body.
PUT_FOLD_SCRIPT = """
if redis.call('HGET', KEYS[1], 'generation') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[2], ttl) else redis.call('PERSIST', KEYS[2]) end
return 1
"""


# The newest messages of a session below a seq and the older messages of some roles, at one
# instant (RedisBackend.read_tail): the page by score, the marks from the roles index (one
# ZRANGEBYLEX per role, the newest of newest_role by ZREVRANGEBYLEX ... LIMIT), each mark's
# message by its score. An index that does not hold one entry per message was not kept by
# every writer: the answer is then 'whole' (the caller reads every message).
# KEYS: session hash, messages zset, roles index.
# ARGV: the page's upper bound as a score ('+inf' or '(seq'), the same as an index seq (20
#       digits; all nines for none), limit ('' for every message below the bound),
#       newest_role ('' for none), then the roles.
# Answer: false for no session, {'whole'}, or {'ok', the hash's fields and values, the page's
# members newest first, the marks' members}.
TAIL_SCRIPT = """
local info = redis.call('HGETALL', KEYS[1])
if #info == 0 then return false end
if ARGV[3] == '' then
  return {'ok', info, redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[1], '-inf'), {}}
end
if redis.call('ZCARD', KEYS[3]) ~= redis.call('ZCARD', KEYS[2]) then return {'whole'} end
local limit, floor, page = tonumber(ARGV[3]), ARGV[2], {}
if limit > 0 then
  page = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[1], '-inf', 'LIMIT', 0, limit)
  if #page < limit then return {'ok', info, page, {}} end
  local seq = string.match(page[#page], '^(%d+):')
  floor = string.rep('0', 20 - #seq) .. seq
end
local marks, seen = {}, {}
local function take(entry, role)
  local seq = string.sub(entry, #role + 2)
  local found = redis.call('ZRANGEBYSCORE', KEYS[2], seq, seq)
  if found[1] and not seen[seq] then
    seen[seq] = true
    marks[#marks + 1] = found[1]
  end
  return found[1] ~= nil
end
for i = 5, #ARGV do
  local role = ARGV[i]
  local entries = redis.call('ZRANGEBYLEX', KEYS[3], '[' .. role .. ':',
    '(' .. role .. ':' .. floor)
  for j = 1, #entries do take(entries[j], role) end
end
local role, offset = ARGV[4], 0
while role ~= '' do
  local entries = redis.call('ZREVRANGEBYLEX', KEYS[3], '(' .. role .. ':' .. floor,
    '[' .. role .. ':', 'LIMIT', offset, 8)
  for j = 1, #entries do
    if take(entries[j], role) then return {'ok', info, page, marks} end
  end
  if #entries < 8 then break end
  offset = offset + 8
end
return {'ok', info, page, marks}
"""

# A trim as one step (RedisBackend.remove_oldest): if the session still has the generation, the
# messages up to a seq are read, added to the archive oldest first (with ARGV[3] = '1'; an id
# already in archive-ids is not added again) and removed with their roles and ids entries, and
# the hash's count and first_seq move, all in one script: atomic on the server, so no reader
# sees a message both held and archived, two trims never move one message twice, and a client
# killed mid-trim leaves the session as it was or as it is after.
# KEYS: session hash, messages zset, roles index, ids hash, archive list, archive-ids set.
# ARGV: generation, upto seq, archive ('1' or '0'), then every indexed role (INDEXED_ROLES).
# Answer: the members removed, oldest first ({} when the generation differs).
TRIM_SCRIPT = """
local h = redis.call('HMGET', KEYS[1], 'generation', 'message_count', 'first_seq')
if not h[1] or h[1] ~= ARGV[1] then return {} end
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2])
local records = {}
for i = 1, #gone do
  local seq = string.match(gone[i], '^(%d+):') or ''
  local text = string.sub(gone[i], #seq + 2)
  local ok, record = pcall(cjson.decode, text)
  local id = ok and type(record) == 'table' and record.id
  if type(id) ~= 'string' or id == '' then id = nil end
  if id and redis.call('HGET', KEYS[4], id) == seq then redis.call('HDEL', KEYS[4], id) end
  if ARGV[3] == '1' and not (id and redis.call('SADD', KEYS[6], id) == 0) then
    records[#records + 1] = text
  end
end
if #gone > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[2]) end
local bound = string.rep('0', 20 - #ARGV[2]) .. ARGV[2]
for i = 4, #ARGV do  -- each role's index entries up to the seq
  redis.call('ZREMRANGEBYLEX', KEYS[3], '[' .. ARGV[i] .. ':', '[' .. ARGV[i] .. ':' .. bound)
end
for i = 1, #records, 1000 do  -- unpack() has a stack limit: RPUSH in chunks
  redis.call('RPUSH', KEYS[5], unpack(records, i, math.min(i + 999, #records)))
end
local count = math.max(tonumber(h[2]) - #gone, 0)
local first = math.max(tonumber(h[3]), tonumber(ARGV[2]) + 1)
redis.call('HSET', KEYS[1], 'message_count', string.format('%d', count),
  'first_seq', string.format('%d', first))
return gone
"""

# A read's access (RedisBackend.info with touch): the hash as it was, accessed_at moved forward
# (never back), the session in the accessed index at that time, and its keys' deadline moved
# (or removed, for no TTL), in one step.
# KEYS: session hash, messages zset, roles index, ids hash, accessed index, expires index.
# ARGV: session id, the time of the access, deadline in Unix ms ("" for no TTL).
# Answer: false for no session, or {the hash's fields and values, the accessed_at now stored}.
TOUCH_SCRIPT = """
local info = redis.call('HGETALL', KEYS[1])
if #info == 0 then return false end
local accessed = redis.call('HGET', KEYS[1], 'accessed_at')
if not accessed or tonumber(ARGV[2]) > tonumber(accessed) then accessed = ARGV[2] end
redis.call('HSET', KEYS[1], 'accessed_at', accessed)
redis.call('ZADD', KEYS[5], accessed, ARGV[1])
if ARGV[3] == '' then
  for k = 1, 4 do redis.call('PERSIST', KEYS[k]) end
  redis.call('ZREM', KEYS[6], ARGV[1])
else
  for k = 1, 4 do redis.call('PEXPIREAT', KEYS[k], ARGV[3]) end
  redis.call('ZADD', KEYS[6], ARGV[3], ARGV[1])
end
return {info, accessed}
"""

_NO_SEQ_BOUND = "9" * SEQ_DIGITS
"""Above every seq, as the tail script compares them."""


def _identify_sessions(db: RedisClient) -> None:
    """Migration 2: give every stored session a generation and its ``first_seq``."""
    keys = RedisKeys(db.prefix)
    for key in db.conn.scan_iter(match=keys.session("*"), count=_SCAN_CHUNK):
        sid = cast(str, key)[len(keys.session("")) :]
        oldest = cast(
            "list[tuple[str, float]]", db.conn.zrange(keys.messages(sid), 0, 0, withscores=True)
        )
        next_seq = cast("str | None", db.conn.hget(key, "next_seq")) or "1"
        db.conn.hsetnx(key, "generation", new_generation())
        db.conn.hsetnx(key, "first_seq", str(int(oldest[0][1]) if oldest else int(next_seq)))


def _index_roles(db: RedisClient) -> None:
    """Migration 3: the ``roles:`` index of every stored session (what a paged read of the
    newest messages finds the system and user messages by). A session the index misses is
    still read whole and indexed on its first paged read (the index's size is checked), but
    a release that does not keep the index must not write to the store any more: the version
    makes it refuse the store (a replace of the newest message by one message would leave an
    index of the right size and the wrong role).
    """
    keys = RedisKeys(db.prefix)
    for key in db.conn.scan_iter(match=keys.session("*"), count=_SCAN_CHUNK):
        sid = cast(str, key)[len(keys.session("")) :]
        members = cast("list[str]", db.conn.zrange(keys.messages(sid), 0, -1))
        rows = [parse_member(sid, m) for m in members]
        pipe = db.conn.pipeline(transaction=True)
        pipe.delete(keys.roles(sid))
        if rows:
            pipe.zadd(keys.roles(sid), {role_member(role_of(r), seq): 0 for seq, r in rows})
            ttl = int(db.conn.pttl(keys.session(sid)))
            if ttl > 0:
                pipe.pexpire(keys.roles(sid), ttl)
        pipe.execute()


# Position i brings a key space from layout version i to i + 1. Version 1 is the layout in
# the module docstring; its keys are created as sessions are, so there is nothing to do.
MIGRATIONS: list[Migration] = [lambda db: None, _identify_sessions, _index_roles]
SCHEMA_VERSION = len(MIGRATIONS)


class RedisBackend(Backend):
    """Sessions in Redis, under one key prefix, with native key TTL.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS,
            ``unix:///path.sock``), optionally with ``?prefix=...`` for the keys.

    Raises:
        StorageError: Redis does not answer.
        SchemaVersionError: the prefix holds data written by a newer ctxkeep.

    """

    name = "redis"
    supports_native_ttl = True
    supports_folds = True

    def __init__(self, url: str) -> None:
        self.db = RedisClient(
            url,
            meta_key="sessions",
            migrations=MIGRATIONS,
            legacy_schema_key=True,
            params=("ttl_grace",),
        )
        grace = self.db.params.get("ttl_grace")
        try:
            # Seconds past the TTL before Redis reclaims a session by itself: the window in
            # which MemoryManager.sweep() archives it and calls on_evict hooks first.
            # Default: the TTL again (Redis deadline at 2 x TTL); ?ttl_grace=0 for none.
            self.ttl_grace: float | None = float(grace) if grace is not None else None
        except ValueError:
            self.db.close()
            raise ConfigError(f"ttl_grace must be a number of seconds, got {grace!r}") from None
        self.keys = RedisKeys(self.db.prefix)
        self.where = self.db.where
        self._client = self.db.conn
        self._append_script = LuaScript(self._client, APPEND_SCRIPT)
        self._put_fold_script = LuaScript(self._client, PUT_FOLD_SCRIPT)
        self._tail_script = LuaScript(self._client, TAIL_SCRIPT)
        self._trim_script = LuaScript(self._client, TRIM_SCRIPT)
        self._replace_script = LuaScript(self._client, REPLACE_SCRIPT)
        self._pop_script = LuaScript(self._client, POP_SCRIPT)
        self._direct = direct(self._client)
        self._touch_script = LuaScript(self._client, TOUCH_SCRIPT)
        self._known = KnownStates()
        self._tops = _Tops()

    def _atomic(self, watch: list[str], body: Callable[[Pipeline], T]) -> T:
        return atomic(self._client, watch, body)

    def _deadline_ms(self, ttl: float) -> int:
        """The Unix time in ms at which Redis reclaims a session touched now."""
        grace = ttl if self.ttl_grace is None else self.ttl_grace
        return math.ceil((time.time() + ttl + grace) * 1000)

    def _expire(self, pipe: Pipeline, session_id: str, ttl: float | None) -> None:
        """Queue the session's deadline: ``ttl`` from now, or none."""
        own = self.keys.own(session_id)
        if ttl is None:
            for key in own:
                pipe.persist(key)
            pipe.zrem(self.keys.expires, session_id)
            return
        deadline_ms = self._deadline_ms(ttl)
        for key in own:
            pipe.pexpireat(key, deadline_ms)
        pipe.zadd(self.keys.expires, {session_id: deadline_ms})

    def _hash(self, client: redis.Redis, session_id: str) -> dict[str, str]:
        return cast("dict[str, str]", client.hgetall(self.keys.session(session_id)))

    def _drop(
        self,
        session_id: str,
        *,
        only_if_gone: bool,
        generation: str | None = None,
        archive: bool = False,
    ) -> bool:
        """Delete a session's keys and index entries (only if it has ``generation``, when
        given; with ``archive``, its messages added to its archive in the same transaction);
        with ``only_if_gone``, only prune the index entries of a session whose keys are
        already gone. True if the hash existed (and was deleted, unless only_if_gone).
        """
        keys = self.keys

        def body(pipe: Pipeline) -> bool:
            existed = bool(pipe.exists(keys.session(session_id)))
            if existed and only_if_gone:
                return True
            if generation is not None and (
                pipe.hget(keys.session(session_id), "generation") != generation
            ):
                return False
            owner = cast("str | None", pipe.hget(keys.owners, session_id))
            fresh = self._unarchived(pipe, session_id) if archive and existed else []
            pipe.multi()
            if fresh:
                pipe.rpush(keys.archive(session_id), *[text for _, text in fresh])
                if ids := [i for i, _ in fresh if i]:
                    pipe.sadd(keys.archive_ids(session_id), *ids)
            pipe.delete(*keys.own(session_id), keys.folds(session_id))
            for index in (keys.created, keys.accessed, keys.expires):
                pipe.zrem(index, session_id)
            if owner is not None:
                agent_id, task_id = loads(owner)
                pipe.zrem(keys.agent(agent_id), session_id)
                if task_id is not None:
                    pipe.zrem(keys.task(task_id), session_id)
            pipe.hdel(keys.owners, session_id)
            return existed

        return self._atomic([keys.session(session_id)], body)

    def _unarchived(self, pipe: Pipeline, session_id: str) -> list[tuple[str | None, str]]:
        """The session's messages not in its archive yet, oldest first, as ``(id, record
        JSON)`` (read through ``pipe`` before its ``MULTI``).
        """
        keys = self.keys
        rows: list[tuple[str | None, str]] = []
        for member in cast("list[str]", pipe.zrange(keys.messages(session_id), 0, -1)):
            found = parse_member(session_id, member)[1].get("id")
            text = member.partition(":")[2]
            rows.append((found if isinstance(found, str) and found else None, text))
        named = [i for i, _ in rows if i is not None]
        flags = pipe.smismember(keys.archive_ids(session_id), named) if named else []
        held = {i for i, f in zip(named, cast("list[int]", flags), strict=True) if f}
        out: list[tuple[str | None, str]] = []
        for message_id, text in rows:
            if message_id is not None:
                if message_id in held:
                    continue
                held.add(message_id)
            out.append((message_id, text))
        return out

    def _alive(self, ids: list[str]) -> list[bool]:
        """Whether each id's session hash still exists."""
        if not ids:
            return []
        pipe = self._client.pipeline(transaction=False)
        for sid in ids:
            pipe.exists(self.keys.session(sid))
        return [bool(n) for n in pipe.execute()]

    def _prune(self, ids: list[str]) -> None:
        """Drop the index entries of sessions whose keys are gone."""
        for sid in ids:
            self._drop(sid, only_if_gone=True)

    def _live(self, ids: list[str]) -> list[str]:
        """The ids whose session still exists, in order; the others are pruned."""
        alive = self._alive(ids)
        self._prune([sid for sid, ok in zip(ids, alive, strict=True) if not ok])
        return [sid for sid, ok in zip(ids, alive, strict=True) if ok]

    def _first_live(self, index: str, n: int, *, newest_first: bool) -> list[str]:
        """The first ``n`` live ids of an index; stale ones are pruned after the walk, so
        ranks do not shift under it.
        """
        found: list[str] = []
        stale: list[str] = []
        for chunk in self._walk(index, newest_first=newest_first):
            for sid, ok in zip(chunk, self._alive(chunk), strict=True):
                (found if ok else stale).append(sid)
            if len(found) >= n:
                break
        self._prune(stale)
        return found[:n]

    def _walk(self, index: str, *, newest_first: bool) -> Iterator[list[str]]:
        """An index's ids in chunks, in score order (ties by id)."""
        start = 0
        while True:
            end = start + _SCAN_CHUNK - 1
            if newest_first:
                chunk = cast("list[str]", self._client.zrevrange(index, start, end))
            else:
                chunk = cast("list[str]", self._client.zrange(index, start, end))
            if not chunk:
                return
            yield chunk
            if len(chunk) < _SCAN_CHUNK:
                return
            start += _SCAN_CHUNK

    def _prune_expired(self) -> None:
        """Prune the ids whose deadline (by the server's clock) has passed and whose keys
        Redis has reclaimed.
        """
        seconds, micros = self._client.time()
        now_ms = seconds * 1000 + micros // 1000
        due = cast("list[str]", self._client.zrangebyscore(self.keys.expires, "-inf", now_ms))
        self._live(due)

    # -- primitives --------------------------------------------------------------------

    @translated
    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Write the session hash and its index entries in one transaction."""
        keys, sid = self.keys, info.session_id

        def body(pipe: Pipeline) -> None:
            if pipe.exists(keys.session(sid)):
                raise SessionExistsError(sid)
            pipe.multi()
            pipe.hset(keys.session(sid), mapping=session_fields(info))
            pipe.zadd(keys.created, {sid: info.created_at})
            pipe.zadd(keys.accessed, {sid: info.accessed_at})
            pipe.zadd(keys.agent(info.agent_id), {sid: info.created_at})
            if info.task_id is not None:
                pipe.zadd(keys.task(info.task_id), {sid: info.created_at})
            pipe.hset(keys.owners, sid, dumps([info.agent_id, info.task_id]))
            self._expire(pipe, sid, ttl)

        self._atomic([keys.session(sid)], body)

    @translated
    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """Read the hash; with ``touch``, move ``accessed_at`` forward and the deadline, in
        one script call (:data:`TOUCH_SCRIPT`).
        """
        if touch is None:
            fields = self._hash(self._client, session_id)
            info = session_from_fields(session_id, fields) if fields else None
        else:
            keys = self.keys
            out = self._touch_script(
                keys.written(session_id),
                session_id,
                repr(float(touch)),
                "" if ttl is None else str(self._deadline_ms(ttl)),
            )
            if out is None:
                info = None
            else:
                flat, accessed = out
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                info = replace(session_from_fields(session_id, fields), accessed_at=float(accessed))
        if info is None:
            self._known.forget(session_id)
            self._tops.forget(session_id)
        else:
            self._saw(info, None)
        return info

    @translated
    def append(self, session_id: str, batch: Append) -> list[int]:
        """One round trip when this process knows the session's state: the append script, a
        compare-and-set (:func:`~ctxkeep.sessions.base.cas_append`); a replacement of the
        newest message takes the WATCH path (:meth:`_replace`).
        """
        if batch.replacing:
            return self._replace(session_id, batch)
        keys = self.keys
        script_keys = keys.written(session_id)
        records = batch.encoded()
        now = float(batch.now)
        now_text = repr(now)
        deadline = "" if batch.ttl is None else str(self._deadline_ms(batch.ttl))
        touch_after = float(batch.touch_after)
        touch_text = repr(touch_after)
        fresh = "1" if batch.fresh_ids else ""
        # one record with an id (every message the manager stamps has one): its id, else ""
        single: str = (batch.records[0].get("id") or "") if len(records) == 1 else ""

        def read() -> SessionInfo | None:
            fields = self._hash(self._client, session_id)
            return session_from_fields(session_id, fields) if fields else None

        def write(base: SessionInfo, pending: tuple[str, ...]) -> Written:
            guess = base.next_seq  # the script numbers them again if another writer came
            seen = float(base.accessed_at)
            args = [
                session_id,
                _pending_json(base.pending),
                repr(seen),
                _pending_json(pending),
                now_text,
                deadline,
                base.generation,
                touch_text,
                fresh,
                str(guess),
                # whether access() would move it: the same doubles' arithmetic as in Lua
                "1" if now > seen and now - seen >= touch_after else "",
            ]
            if single:  # a chat history's add: no comprehension's frame for one record
                role = role_of(batch.records[0])
                args += (f"{guess}:{records[0]}", role_member(role, guess), single)
            else:
                args += [f"{guess + i}:{text}" for i, text in enumerate(records)]
                args += [role_member(role_of(r), guess + i) for i, r in enumerate(batch.records)]
                args += [r.get("id") or "" for r in batch.records]
            # Sent again after a dropped connection (Direct), the script may have run the
            # first time and only its answer been lost: the second run looks the ids up even
            # where they were made for this append (a '' for fresh), so it finds the
            # messages stored ('found': the retry that wrote nothing) instead of storing
            # them twice. (Made only then: a list of the arguments rebuilt on every call,
            # and, awaited, the whole command packed a second time.)
            again = None if not fresh else lambda: [*args[:8], "", *args[9:]]
            out = self._append_script(script_keys, *args, again=again)
            if out[0] == "missing":
                return None
            if out[0] == "found":
                settle_ids(session_id, batch.records, [parse_member(session_id, m) for m in out[1]])
                raise StorageError(  # settle_ids raises on any held id, as the script found
                    f"Redis ids index of session {session_id!r} disagrees with its messages"
                )
            if out[0] == "stale":
                flat = out[1]
                fields = dict(zip(flat[::2], flat[1::2], strict=True))
                return session_from_fields(session_id, fields)
            first: int = out[1]
            after = info_with(
                base,
                {
                    "pending": pending,
                    "accessed_at": float(out[2]),
                    "next_seq": first + len(records),
                    "message_count": out[3],
                },
            )
            self._tops.put(session_id, base.generation, after.next_seq - 1, batch.records[-1])
            return list(range(first, first + len(records))), after

        return cas_append(session_id, batch, self._known, read, write)

    def _replace(self, session_id: str, batch: Append) -> list[int]:
        """One round trip when this process knows the session's state and its newest
        message: the replace script, a compare-and-set as the append's (:data:`REPLACE_SCRIPT`).
        Unknown or stale, the script answers them as they are, and the check runs again on
        that (a check refused on a remembered state is believed only on the state as stored).
        A pop (no records) is :meth:`_pop`.
        """
        if not batch.records:
            return self._pop(session_id, batch)
        keys = self.keys
        script_keys = keys.written(session_id)
        records = batch.encoded()
        roles = [role_of(r) for r in batch.records]
        ids = [r.get("id") or "" for r in batch.records]
        now = repr(float(batch.now))
        deadline = "" if batch.ttl is None else str(self._deadline_ms(batch.ttl))
        touch_after = repr(float(batch.touch_after))
        fresh = "1" if batch.fresh_ids else ""

        token = _op_token()  # the same in every send of this write (REPLACE_SCRIPT)

        def send(base: SessionInfo, top: _Top, pending: tuple[str, ...]) -> Any:
            return self._replace_script(
                script_keys,
                *_taking(session_id, base, top, pending, now, deadline),
                touch_after,
                fresh,
                token,
                *records,
                *roles,
                *ids,
            )

        def ask() -> Any:  # nothing to compare: the script answers the session as it is
            blank = ("[]", "0", "[]", now, deadline, "", "", "", "", "", "", "")
            return self._replace_script(script_keys, session_id, *blank)

        info, pending, out = self._take_newest(session_id, batch, ask, send)
        if out[0] == "done":
            return list(range(out[1], out[1] + len(records)))
        if out[0] != "ok":  # 'found': ids this write gives are held by other messages
            self._known.forget(session_id)
            self._tops.forget(session_id)
            settle_ids(session_id, batch.records, [parse_member(session_id, m) for m in out[1]])
            raise StorageError(  # settle_ids raises on any held id, as the script found
                f"Redis ids index of session {session_id!r} disagrees with its messages"
            )
        first: int = out[1]
        after = info_with(
            info,
            {
                "pending": pending,
                "accessed_at": float(out[2]),
                "next_seq": first + len(records),
                "message_count": out[3],
                "revision": out[4],
            },
        )
        self._known.put(after)
        self._tops.put(session_id, after.generation, first + len(records) - 1, batch.records[-1])
        return list(range(first, first + len(records)))

    def _pop(self, session_id: str, batch: Append) -> list[int]:
        """:meth:`_replace` by nothing, a pop: the pop script (:data:`POP_SCRIPT`) on the state
        and the newest message this process last saw, followed in the same write by a
        ``ZRANGE`` of the message it leaves newest (the next pop's guess); unknown or stale,
        the script answers them as they are and the check runs again on that.
        """
        keys = self.keys
        script_keys = keys.written(session_id)
        now = float(batch.now)
        now_text = repr(now)
        deadline = "" if batch.ttl is None else str(self._deadline_ms(batch.ttl))
        touch_after = float(batch.touch_after)
        newest: list[Any] = []  # the member the pop leaves newest, read after it (or none)
        token = _op_token()  # the same in every send of this pop (REPLACE_SCRIPT)

        def send(base: SessionInfo, top: _Top, pending: tuple[str, ...]) -> Any:
            seen = float(base.accessed_at)
            out, answer = self._pop_script.followed(
                script_keys,
                (
                    *_taking(session_id, base, top, pending, now_text, deadline),
                    repr(touch_after),
                    "" if top.next_seq is None else str(top.next_seq),
                    # whether access() would move it: the same doubles' arithmetic as in Lua
                    "1" if now > seen and now - seen >= touch_after else "",
                    token,
                ),
                ("ZRANGE", script_keys[1], -1, -1),
            )
            newest[:] = answer if isinstance(answer, list) else ()  # (an error: not known)
            return out

        def ask() -> Any:  # nothing to compare: the script answers the session as it is
            blank = ("[]", "0", "[]", now_text, deadline, "", "", "", "", "", "", "", "", "")
            return self._pop_script(script_keys, session_id, *blank)

        info, pending, out = self._take_newest(session_id, batch, ask, send)
        if out[0] == "done":
            return []
        after = info_with(
            info,
            {
                "pending": pending,
                "accessed_at": float(out[2]),
                "next_seq": out[1],
                "message_count": out[3],
                "revision": out[4],
            },
        )
        self._known.put(after)
        if newest:
            # read after the script, not with it: a message added meanwhile moved next_seq past
            # the one the script found, so that check fails and the count runs
            self._tops.put_member(session_id, after.generation, newest[0], after.next_seq)
        else:
            self._tops.forget(session_id)
        return []

    def _take_newest(
        self,
        session_id: str,
        batch: Append,
        ask: Callable[[], Any],
        send: Callable[[SessionInfo, _Top, tuple[str, ...]], Any],
    ) -> tuple[SessionInfo, tuple[str, ...], Any]:
        """The compare-and-set a replacement and a pop run: ``batch`` checked on the state and
        the newest message this process last saw, less that message; then ``send(base, top,
        pending)`` runs the script on them. Unknown, refused on a guess or stale, the session
        is taken as the script answers it (``ask()`` where nothing was sent) and the check
        runs again on that (a check refused on the state as stored raises its error). Returns
        the state the batch was checked on, its pending calls after it and the script's
        answer, ``'ok'``, ``'found'`` or ``'done'`` (an earlier send made the write and
        another write came after it: the session is forgotten).

        Raises:
            SessionNotFoundError: the script answered ``'missing'``.

        """
        base, top = self._known.get(session_id), self._tops.get(session_id)
        exact = False
        while True:
            if base is None or top is None or top.generation != base.generation:
                base, top, exact = self._stale(session_id, ask()), self._tops.get(session_id), True
            assert base is not None
            try:
                if top is None or not batch.takes(top.seq, top.record):
                    raise SessionChangedError(session_id)
                info = info_with(
                    base,
                    {
                        "message_count": max(base.message_count - 1, 0),
                        "pending": pending_after_pop(base.pending, top.record),
                        "revision": base.revision + 1,
                    },
                )
                pending = batch.check(info)
            except Exception:
                if exact:
                    raise
                base = None  # a guess refused it: ask the store
                continue
            out = send(base, top, pending)
            if out[0] == "stale":
                base, top, exact = self._stale(session_id, out), self._tops.get(session_id), True
                continue
            if out[0] == "missing":
                self._known.forget(session_id)
                self._tops.forget(session_id)
                raise SessionNotFoundError(f"no session {session_id!r}")
            if out[0] == "done":  # made by an earlier send, another write since: not known
                self._known.forget(session_id)
                self._tops.forget(session_id)
            return info, pending, out

    def _stale(self, session_id: str, answer: list[Any]) -> SessionInfo:
        """The session as a ``'stale'`` answer of the replace script gives it (its newest
        message remembered).

        Raises:
            SessionNotFoundError: the answer is ``'missing'``.

        """
        if answer[0] == "missing":
            self._known.forget(session_id)
            self._tops.forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r}")
        flat = answer[1]
        info = session_from_fields(session_id, dict(zip(flat[::2], flat[1::2], strict=True)))
        self._known.put(info)
        if answer[2]:
            self._tops.put_member(session_id, info.generation, answer[2], info.next_seq)
        else:
            self._tops.forget(session_id)
        return info

    def _whole(self, session_id: str, after_seq: int) -> tuple[dict[str, str], list[str]] | None:
        """The hash's fields and the members after ``after_seq``, in one
        ``MULTI``/``EXEC`` (:meth:`~ctxkeep._redis.Direct.transaction`); None for no session.

        Not a script: a script's answer is copied into Lua strings and out again, which for
        a session of 1,000 messages of 3.8 kB took the server 9.0 ms where ``ZRANGEBYSCORE``
        itself takes 0.6 (commandstats, Redis 7.0); the transaction's whole read took 2.5 ms
        at the client where the script's took 11.
        """
        flat, members = self._direct.transaction(
            ("HGETALL", self.keys.session(session_id)),
            ("ZRANGEBYSCORE", self.keys.messages(session_id), f"({after_seq}", "+inf"),
        )
        if not flat:
            self._known.forget(session_id)
            self._tops.forget(session_id)
            return None
        # redis-py's parser may give HGETALL as a dict already, else as a flat list
        fields = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2], strict=True))
        return fields, members

    @translated
    def read(self, session_id: str, after_seq: int = 0) -> Snapshot | None:
        """The hash and the messages after ``after_seq`` at one instant (:meth:`_whole`).
        What it saw is remembered for the next compare-and-set write.
        """
        out = self._whole(session_id, after_seq)
        if out is None:
            return None
        fields, members = out
        info = session_from_fields(session_id, fields)
        rows: list[Row] = [parse_member(session_id, m) for m in members]
        self._saw(info, rows[-1] if rows else None)
        return info, rows

    @translated
    def read_stored(
        self, session_id: str, after_seq: int = 0
    ) -> tuple[SessionInfo, list[Stored]] | None:
        """:meth:`read`, each message's record as its JSON text, not parsed: the reader parses
        them one at a time (``Backend.read_stored`` says why); the newest is remembered for
        the next replace as its text too (:class:`_Tops`). A member without a seq is parsed at
        once, as :meth:`read` does, so a damaged one fails alike.
        """
        out = self._whole(session_id, after_seq)
        if out is None:
            return None
        fields, members = out
        info = session_from_fields(session_id, fields)
        rows: list[Stored] = []
        for member in members:
            head, _, text = member.partition(":")
            if head.isdigit():
                rows.append((int(head), text))
            else:
                rows.append(parse_member(session_id, member))
        self._known.put(info)
        if members:  # its newest message, decoded when a replacement asks for it
            self._tops.put_member(session_id, info.generation, members[-1], info.next_seq)
        return info, rows

    def _saw(self, info: SessionInfo, newest: Row | None) -> None:
        """Remember the session as a read saw it (and its newest message, when the read
        reached it), for the next compare-and-set write: only a guess, which that write checks.
        """
        self._known.put(info)
        if newest is not None:
            self._tops.put(info.session_id, info.generation, *newest, info.next_seq)

    @translated
    def read_rows(
        self, session_id: str, *, seqs: Collection[int], after_seq: int
    ) -> Snapshot | None:
        """The hash, the messages above ``after_seq`` and those in ``seqs`` (each by its
        score), in one MULTI/EXEC.
        """
        wanted = sorted({s for s in seqs if s <= after_seq})
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(self.keys.session(session_id))
        for seq in wanted:
            pipe.zrangebyscore(self.keys.messages(session_id), seq, seq)
        pipe.zrangebyscore(self.keys.messages(session_id), f"({after_seq}", "+inf")
        fields, *found = pipe.execute()
        if not fields:
            return None
        rows: list[Row] = [parse_member(session_id, m) for members in found for m in members]
        return session_from_fields(session_id, fields), rows

    @translated
    def read_tail(
        self,
        session_id: str,
        *,
        limit: int | None,
        before_seq: int | None = None,
        roles: Collection[str] = (),
        newest_role: str | None = None,
    ) -> Tail | None:
        """The hash, the newest ``limit`` messages below ``before_seq`` and the older marks
        (from the roles index), in one script call (:data:`TAIL_SCRIPT`): only those records
        cross the wire and are parsed. A session whose index is not whole is read whole and
        its index rebuilt (:meth:`_reindex`).
        """
        out = self._tail_script(
            list(self.keys.own(session_id)),
            "+inf" if before_seq is None else f"({before_seq}",
            _NO_SEQ_BOUND if before_seq is None else f"{before_seq:0{SEQ_DIGITS}d}",
            "" if limit is None else str(limit),
            newest_role or "",
            *sorted(set(roles)),
        )
        if out is None:
            return None
        if out[0] == "whole":
            snap = self._reindex(session_id)
            if snap is None:
                return None
            return tail_of(
                snap, limit=limit, before_seq=before_seq, roles=roles, newest_role=newest_role
            )
        _, flat, page, marks = out
        info = session_from_fields(session_id, dict(zip(flat[::2], flat[1::2], strict=True)))
        rows = [parse_member(session_id, m) for m in reversed(page)]
        self._saw(info, rows[-1] if rows and before_seq is None else None)
        return Tail(
            info,
            rows,
            sorted((parse_member(session_id, m) for m in marks), key=lambda row: row[0]),
        )

    def _reindex(self, session_id: str) -> Snapshot | None:
        """Read the session whole and rebuild its roles index from what was read (one entry
        per message, the hash's TTL), in one WATCH/MULTI/EXEC, retried if a write lands
        meanwhile. Returns what was read, or None for no session.
        """
        keys = self.keys

        def body(pipe: Pipeline) -> Snapshot | None:
            fields = self._hash(pipe, session_id)
            if not fields:
                return None
            members = cast("list[str]", pipe.zrange(keys.messages(session_id), 0, -1))
            ttl = int(pipe.pttl(keys.session(session_id)))
            rows: list[Row] = [parse_member(session_id, m) for m in members]
            pipe.multi()
            pipe.delete(keys.roles(session_id))
            if rows:
                pipe.zadd(keys.roles(session_id), {role_member(role_of(r), s): 0 for s, r in rows})
                if ttl > 0:
                    pipe.pexpire(keys.roles(session_id), ttl)
            return session_from_fields(session_id, fields), rows

        return self._atomic([keys.session(session_id), keys.messages(session_id)], body)

    @translated
    def get_fold(self, session_id: str, key: str) -> str | None:
        """The snapshot under ``key``."""
        return cast("str | None", self._client.hget(self.keys.folds(session_id), key))

    @translated
    def put_fold(self, session_id: str, generation: str, key: str, body: str) -> None:
        """Store the snapshot with the session's TTL, if it still has ``generation`` (one
        script call).
        """
        self._put_fold_script(
            [self.keys.session(session_id), self.keys.folds(session_id)], generation, key, body
        )

    @translated
    def remove_oldest(
        self, session_id: str, upto_seq: int, generation: str, *, archive: bool = False
    ) -> list[Row]:
        """Archive (with ``archive``) and remove the messages up to ``upto_seq``, fix the
        count and ``first_seq``, in one script call (:data:`TRIM_SCRIPT`).
        """
        keys = self.keys
        gone = self._trim_script(
            [
                *keys.own(session_id)[:4],
                keys.archive(session_id),
                keys.archive_ids(session_id),
            ],
            generation,
            str(upto_seq),
            "1" if archive else "0",
            *INDEXED_ROLES,
        )
        return [parse_member(session_id, m) for m in gone or []]

    @translated
    def pop_newest(self, session_id: str, generation: str) -> Row | None:
        """WATCH the session, take the newest member off and update the hash, in one
        MULTI/EXEC.
        """
        keys = self.keys

        def body(pipe: Pipeline) -> Row | None:
            fields = self._hash(pipe, session_id)
            if not fields or fields.get("generation") != generation:
                return None
            newest = cast("list[str]", pipe.zrange(keys.messages(session_id), -1, -1))
            if not newest:
                return None
            info = session_from_fields(session_id, fields)
            seq, record = parse_member(session_id, newest[0])
            pipe.multi()
            pipe.zrem(keys.messages(session_id), newest[0])
            pipe.zrem(keys.roles(session_id), role_member(role_of(record), seq))
            pipe.hdel(keys.ids(session_id), str(record.get("id")))
            pipe.hset(
                keys.session(session_id),
                mapping={
                    "message_count": str(max(info.message_count - 1, 0)),
                    "pending": dumps(list(pending_after_pop(info.pending, record))),
                    "revision": str(info.revision + 1),
                },
            )
            return seq, record

        return self._atomic([keys.session(session_id), keys.messages(session_id)], body)

    @translated
    def delete(
        self,
        session_id: str,
        generation: str | None = None,
        *,
        archive: EvictReason | None = None,
    ) -> bool:
        """Delete the session's keys and index entries (its messages archived in the same
        ``MULTI``/``EXEC``, with ``archive``).
        """
        self._known.forget(session_id)
        self._tops.forget(session_id)
        return self._drop(
            session_id, only_if_gone=False, generation=generation, archive=archive is not None
        )

    @translated
    def latest_for_agent(self, agent_id: str) -> str | None:
        """The agent's newest live session."""
        found = self._first_live(self.keys.agent(agent_id), 1, newest_first=True)
        return found[0] if found else None

    @translated
    def count(self) -> int:
        """Sessions stored (expired ones pruned first)."""
        self._prune_expired()
        return int(self._client.zcard(self.keys.created))

    @translated
    def least_recent(self, n: int) -> list[str]:
        """The ``n`` live sessions accessed longest ago."""
        return self._first_live(self.keys.accessed, n, newest_first=False)

    @translated
    def idle_since(self, cutoff: float) -> list[str]:
        """Live sessions last accessed before ``cutoff``."""
        ids = cast(
            "list[str]", self._client.zrangebyscore(self.keys.accessed, "-inf", f"({cutoff!r}")
        )
        return self._live(ids)

    @translated
    def archive(self, evicted: Evicted) -> None:
        """Append evicted messages to the session's archive, once per message id."""
        keys, sid = self.keys, evicted.session_id

        def body(pipe: Pipeline) -> None:
            ids = [m.id for m in evicted.messages if m.id]
            known = set()
            if ids:
                flags = cast("list[int]", pipe.smismember(keys.archive_ids(sid), ids))
                known = {i for i, f in zip(ids, flags, strict=True) if f}
            fresh = []
            for m in evicted.messages:
                if m.id and m.id in known:
                    continue
                if m.id:
                    known.add(m.id)
                fresh.append(m)
            if not fresh:
                return
            pipe.multi()
            pipe.rpush(keys.archive(sid), *[dumps_record(m) for m in fresh])
            fresh_ids = [m.id for m in fresh if m.id]
            if fresh_ids:
                pipe.sadd(keys.archive_ids(sid), *fresh_ids)

        self._atomic([keys.archive_ids(sid)], body)

    @translated
    def archived(self, session_id: str) -> list[Message]:
        """A session's archived messages, oldest first."""
        rows = cast("list[str]", self._client.lrange(self.keys.archive(session_id), 0, -1))
        return [record_to_message(r) for r in rows]

    def close(self) -> None:
        """Close the connection pool."""
        self.db.close()

    @translated
    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """A page, newest first (ties by id, descending), from the narrowest index."""
        keys = self.keys
        if task_id is not None:
            index = keys.task(task_id)
        elif agent_id is not None:
            index = keys.agent(agent_id)
        else:
            index = keys.created
        found: list[SessionInfo] = []
        stale: list[str] = []
        for chunk in self._walk(index, newest_first=True):
            pipe = self._client.pipeline(transaction=False)
            for sid in chunk:
                pipe.hgetall(keys.session(sid))
            for sid, fields in zip(chunk, pipe.execute(), strict=True):
                if not fields:
                    stale.append(sid)
                    continue
                info = session_from_fields(sid, fields)
                if agent_id is None or info.agent_id == agent_id:
                    found.append(info)
            if len(found) >= offset + limit:
                break
        self._prune(stale)  # after the walk, so ranks do not shift under it
        return found[offset : offset + limit]

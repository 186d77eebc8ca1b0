"""Session memory: the interface, the config, and the logic every backend shares.

:class:`MemoryManager` does the work that is the same everywhere: copying, validation,
tool-unit checks, ``max_history`` trimming in whole units, TTL and LRU policy, eviction hooks
and archiving, prompt building. A :class:`Backend` supplies a few storage primitives; the
memory, SQLite, Redis and PostgreSQL backends live beside this module; the primitives and the
types they speak are in :mod:`ctxkeep.sessions.backend` (importable from here too).

Appends are atomic: :meth:`Backend.append` runs the caller's check (which tool calls are
still waiting) inside the backend's transaction, so concurrent writers cannot interleave a
tool result with another message, and sequence numbers stay gapless.

Appends to a server (Redis, PostgreSQL) are one round trip: the check runs on the session's
state last seen and the write is a compare-and-set on it (:func:`cas_append`). A prompt for a
pruner that reads only what it keeps is built from the newest pages of the session
(:meth:`Backend.read_tail`, :mod:`ctxkeep.prune.tail`), not from every record; one for a
cache-stable pruner, from the fold snapshot stored with the session at its last cut and the
messages it names (:meth:`Backend.read_rows`, :mod:`ctxkeep.prune.snapshots`).

Trims and evictions archive and remove in one step of the backend's
(:meth:`Backend.remove_oldest` and :meth:`Backend.delete` with ``archive``): the rows moved
are read inside that step, so concurrent trims (threads of one manager, other processes)
archive each message once and in seq order, no reader sees a message both held and archived,
and a process killed mid-trim leaves no such message. The eviction hooks get what was moved.

Identity: every session gets a random ``generation`` when it is created. The prompt cache is
keyed by it and every read comes with the session's info from the same instant
(:meth:`Backend.read`), so a prompt never shows history its session no longer holds, whether
the session was trimmed, deleted, expired or evicted and created again, by this process or
another.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import threading
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Self, cast

from ctxkeep import _check
from ctxkeep._db import refuses_writes
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    MessageIdConflictError,
    SessionChangedError,
    SessionExistsError,
    SessionNotFoundError,
    StorageError,
)
from ctxkeep.messages import SYSTEM_ROLES, Message, coerce_message
from ctxkeep.sessions.backend import (
    Backend,
    Check,
    Evicted,
    EvictHook,
    EvictReason,
    KnownStates,
    Row,
    Snapshot,
    Stored,
    Tail,
    Written,
    cas_append,
    check_session_id,
    page,
    tail_of,
)
from ctxkeep.sessions.records import (
    AlreadyStored,
    Append,
    SessionInfo,
    advance_pending,
    encoded_record,
    message_to_record,
    new_generation,
    record_to_message,
    trim_point,
)

if TYPE_CHECKING:
    from ctxkeep.prune import PruneReport

_TRIM_SLACK = 16
"""Messages read past the most a trim can remove, to find where the kept history starts (a
tool unit's results); a trim that needs more reads the whole session."""
_TRIM_HEAD_MAX = 256
"""The most messages a trim reads from the head; more and it reads the whole session."""
_NO_SEQ = 2**62
"""Above every sequence number: ``read_rows(..., after_seq=_NO_SEQ)`` reads no tail."""


def newest_user(history: list[Any]) -> Message | None:
    """The newest user message of ``history`` (placeholders of messages not read skipped)."""
    for m in reversed(history):
        if type(m) is Message and m.role == "user":
            return m
    return None


__all__ = [
    "Backend",
    "CachedHistory",
    "Check",
    "EvictHook",
    "EvictReason",
    "Evicted",
    "HistoryReads",
    "KnownStates",
    "MemoryConfig",
    "MemoryManager",
    "Row",
    "SessionPrompt",
    "Snapshot",
    "Stored",
    "Tail",
    "Written",
    "cas_append",
    "check_session_id",
    "default_memory_config",
    "page",
    "tail_of",
]

log = logging.getLogger(__name__)

OnAppend = Callable[[SessionInfo, list[int], list[Message]], None]
"""Told what an append wrote: the session as the append found it (inside its transaction),
the seqs written and the stored messages."""


@dataclass(frozen=True)
class MemoryConfig:
    """Bounds of session memory. ``None`` means unbounded."""

    max_history: int | None = 1000
    """Messages kept per session; older ones are trimmed in whole tool units."""
    session_ttl: float | None = 24 * 3600.0
    """Seconds a session may stay idle (no read or write) before it is reclaimed."""
    max_sessions: int | None = 10_000
    """Sessions kept; beyond it the least recently accessed is evicted."""
    archive_evicted: bool = True
    """Keep trimmed and evicted messages in the backend's archive (for episodic memory)."""
    access_resolution: float = 1.0
    """Seconds: on a store where it is a write (SQL, Redis), a read writes the session's
    access time only when the stored one is at least this old (or a hundredth of
    ``session_ttl``, if less), so reads do not each cost a write transaction (a commit, an
    fsync under ``synchronous=full``). An append on a SQL store moves it by the same rule
    (where it does not, the append's update leaves the access-time index alone: fewer pages a
    SQLite commit writes, a HOT update on PostgreSQL); in process every read and write sets it.
    The TTL and the LRU order are then exact to this resolution; 0 makes every read and write
    set it."""

    def __post_init__(self) -> None:
        for name in ("max_history", "max_sessions"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name} must be a positive int or None, got {v!r}")
        ttl = self.session_ttl
        if ttl is not None and (
            isinstance(ttl, bool)
            or not isinstance(ttl, int | float)
            or not math.isfinite(ttl)
            or ttl <= 0
        ):
            raise ConfigError(f"session_ttl must be a positive number of seconds, got {ttl!r}")
        res = self.access_resolution
        if (
            isinstance(res, bool)
            or not isinstance(res, int | float)
            or not math.isfinite(res)
            or res < 0
        ):
            raise ConfigError(
                f"access_resolution must be a finite number of seconds >= 0, got {res!r}"
            )

    @property
    def touch_resolution(self) -> float:
        """How old a session's stored access time must be for a read to write it:
        ``access_resolution``, or a hundredth of the TTL where that is less.
        """
        ttl = self.session_ttl
        return self.access_resolution if ttl is None else min(self.access_resolution, ttl / 100)


def default_memory_config() -> MemoryConfig:
    """The defaults: 1,000 messages per session, 24 h idle TTL, 10,000 sessions."""
    return MemoryConfig()


def _new_id() -> str:
    """A new message id: the hex of a random version-4 UUID, as ``uuid.uuid4().hex`` gives,
    made without the ``UUID`` object (its checked constructor was some 3 us of a 0.4 ms
    append, the stamp's largest part), from random bytes read :data:`_ID_BATCH` ids at a time
    (one ``getrandom`` system call per id was 0.5 us of an append on an idle core).
    """
    try:
        return _IDS.popleft()
    except IndexError:
        return _more_ids()


_ID_BATCH = 64
_IDS: collections.deque[str] = collections.deque()
"""Ids made and not handed out yet (``popleft`` and ``extend`` are atomic: threads share it).
Emptied in the child of a fork, which must not hand out its parent's."""
os.register_at_fork(after_in_child=_IDS.clear)


def _more_ids() -> str:
    raw = bytearray(os.urandom(16 * _ID_BATCH))
    for i in range(0, len(raw), 16):
        raw[i + 6] = (raw[i + 6] & 0x0F) | 0x40  # version 4
        raw[i + 8] = (raw[i + 8] & 0x3F) | 0x80  # the RFC 4122 variant
    text = raw.hex()
    _IDS.extend(text[i : i + 32] for i in range(32, len(text), 32))
    return text[:32]


def _now() -> float:
    return time.time()


class _Idle(Exception):
    """Raised by an append's check: the session is idle past its TTL."""


@dataclass
class CachedHistory:
    """A session's decoded history, as the prompt cache keeps it: all of it, or (``complete``
    False) every message from ``seqs[0]`` on and the older ``marks`` (a paged read's).
    """

    generation: str
    revision: int
    seqs: list[int]
    messages: list[Message]
    complete: bool = True
    marks: list[tuple[int, Message]] = field(default_factory=list)
    head: list[tuple[int, Message]] | None = None
    """A paged read's conversation head (the messages a pruner keeps in every prompt), with
    their seqs; None where it was not read."""
    fold: Any = None
    """What a prompt reader keeps with the history (opaque here: a cache-stable pruner's
    fold, :mod:`ctxkeep.prune.snapshots`; with ``fold.base > 0`` the messages before it are
    placeholders but for the ones it knows). On a whole read of the same session it is kept
    as ``fold.for_whole_read(first_seq)`` (None: it no longer holds)."""


@dataclass(frozen=True)
class SessionPrompt:
    """A session's prompt as :meth:`MemoryManager.build_prompt` read and pruned it."""

    info: SessionInfo
    """The session at the instant of the read."""
    messages: list[Message]
    """The prompt: the system message given, then the history, pruned (copies)."""
    report: PruneReport | None
    """The pruner's report (None with no pruner, or one that is not a ``TokenPruner``). Its
    indexes are positions in the system message given plus the session's history; messages
    the read did not need (older history a fold snapshot or the newest pages stood for) are
    counted in its ``unread``."""
    newest_user: Message | None
    """The session's newest user message as stored (the prompt may hold it compressed)."""


class MemoryManager:
    """Sessions of messages over one backend, bounded by a :class:`MemoryConfig`.

    The manager is the one owner of session policy: TTL (checked on every access and by
    :meth:`sweep`), LRU beyond ``max_sessions``, ``max_history`` in whole tool units,
    archiving and eviction hooks, and the prompt cache. Use :func:`ctxkeep.open_memory` to
    get one for a URL. It is a context manager.

    Args:
        backend: the storage primitives.
        config: the bounds (default: :func:`default_memory_config`).
        on_evict: called with every batch of trimmed or evicted messages.
        clock: the time source for TTL and LRU (tests and simulations pass their own).

    """

    def __init__(
        self,
        backend: Backend,
        config: MemoryConfig | None = None,
        *,
        on_evict: EvictHook | None = None,
        clock: Callable[[], float] = _now,
    ) -> None:
        self.backend = backend
        self.config = config or default_memory_config()
        self._hooks: list[EvictHook] = [on_evict] if on_evict else []
        self._clock = clock
        # A TTL is handed to a backend only if it expires sessions by itself.
        self._native_ttl = self.config.session_ttl if backend.supports_native_ttl else None
        self._touch_resolution = self.config.touch_resolution if backend.touch_writes else 0.0
        # session id -> its decoded history, keyed by generation; most recently used last.
        self._prompt_cache: dict[str, CachedHistory] = {}
        self._cache_lock = threading.Lock()
        self.prompt_cache_sessions = 64
        # Messages in the first page a paged prompt reads (each further page twice the last).
        self.prompt_page = 64
        # session id -> (generation, a first seq it had): what trims saw, for the next append
        # (a compare-and-set append checks a remembered state, whose first seq can be old).
        self._first_seqs: dict[str, tuple[str, int]] = {}
        self._read_only_logged = False

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the backend."""
        self.backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_evict_hook(self, hook: EvictHook) -> None:
        """Call ``hook`` with every batch of trimmed or evicted messages."""
        self._hooks.append(hook)

    # -- sessions ----------------------------------------------------------------------

    def create_session(
        self,
        agent_id: str,
        *,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> str:
        """Start a session for ``agent_id``; returns its id.

        Beyond ``max_sessions``, the least recently accessed sessions are evicted.

        Raises:
            SessionExistsError: ``session_id`` is in use.
            InvalidMessageError: a bad agent id, task id or metadata.

        """
        meta = self._session_fields(agent_id, task_id, metadata)
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise InvalidMessageError(f"session_id must be a non-empty string, got {session_id!r}")
        _check.optional_ident("session_id", session_id)
        if session_id is not None:
            self.has_session(session_id)  # an expired session under this id is reclaimed first
        info = self._session_info(agent_id, task_id, meta, session_id or uuid.uuid4().hex)
        self.backend.create(info, self._native_ttl)
        self._enforce_max_sessions(keep=info.session_id)
        return info.session_id

    @staticmethod
    def _session_fields(
        agent_id: str, task_id: str | None, metadata: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """A new session's agent id and task id checked; its metadata, checked and copied.

        Raises:
            InvalidMessageError: a bad agent id, task id or metadata.

        """
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidMessageError(f"agent_id must be a non-empty string, got {agent_id!r}")
        if task_id is not None and not isinstance(task_id, str):
            raise InvalidMessageError(f"task_id must be a string, got {task_id!r}")
        _check.ident("agent_id", agent_id)
        _check.optional_ident("task_id", task_id)
        meta = _check.mapping("metadata", metadata)
        message_to_record(Message("user", "", metadata=meta))  # JSON check
        return meta

    def _session_info(
        self, agent_id: str, task_id: str | None, meta: dict[str, Any], session_id: str
    ) -> SessionInfo:
        """The row of a session made now (a new generation), its fields checked."""
        now = self._clock()
        return SessionInfo(
            session_id=session_id,
            agent_id=agent_id,
            task_id=task_id,
            metadata=meta,
            created_at=now,
            accessed_at=now,
            generation=new_generation(),
        )

    def get_session(self, session_id: str) -> SessionInfo:
        """The session's info (counts as an access).

        Raises:
            SessionNotFoundError: unknown or expired.

        """
        return self._live(session_id, touch=True)

    def has_session(self, session_id: str) -> bool:
        """True if the session exists and has not expired (not an access)."""
        try:
            self._live(session_id, touch=False)
        except SessionNotFoundError:
            return False
        return True

    def list_sessions(
        self,
        *,
        agent_id: str | None = None,
        task_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[SessionInfo]:
        """Live sessions, newest first, filtered by agent and/or task, one page at a time."""
        _check.integer("limit", limit, minimum=1)
        _check.integer("offset", offset, minimum=0)
        _check.optional_identifier("agent_id", agent_id)
        _check.optional_identifier("task_id", task_id)
        try:
            self.sweep()
        except StorageError as exc:
            if not self._refused(exc, "reclaiming idle sessions"):
                raise
        return self.backend.list_sessions(
            agent_id=agent_id, task_id=task_id, limit=limit, offset=offset
        )

    def delete_session(self, session_id: str) -> bool:
        """Delete a session; False if there was none (an expired session is none: it is
        reclaimed as by :meth:`sweep`). Its messages are not archived.
        """
        self._forget(session_id)
        if not self.has_session(session_id):
            return False
        return self.backend.delete(session_id)

    def get_latest_session_for_agent(self, agent_id: str) -> str | None:
        """The agent's most recently created live session, or None."""
        sid = self.backend.latest_for_agent(_check.identifier("agent_id", agent_id))
        if sid is not None and not self.has_session(sid):
            return None
        return sid

    def session_count(self) -> int:
        """How many sessions the store holds (idle ones not yet reclaimed included)."""
        return self.backend.count()

    # -- messages ----------------------------------------------------------------------

    def add_messages_creating(
        self,
        session_id: str,
        agent_id: str,
        messages: Iterable[Any],
        *,
        on_append: OnAppend | None = None,
    ) -> None:
        """:meth:`add_messages`, creating the session for ``agent_id`` first where there is
        none (unknown, or expired, evicted or deleted meanwhile): what a framework's own store
        does on an add. One write transaction when the session exists; the session is made
        (once, whichever process is first) only when the append finds none. Returns nothing:
        its callers keep no copy of what they stored; ``on_append(info, seqs, messages)``, if
        given, is told the session as the append found it, the seqs it wrote and the stored
        messages (an adapter keeping the session's items follows its own write with it).

        Raises:
            As :meth:`add_messages`.

        """
        self._add_creating(session_id, agent_id, messages, on_append)

    def _add_creating(
        self,
        session_id: str,
        agent_id: str,
        messages: Iterable[Any],
        on_append: OnAppend | None = None,
        *,
        owned: bool = False,
    ) -> None:
        """:meth:`add_messages_creating`; ``owned``: the caller (an adapter) made the
        ``Message`` objects for this call alone and gives them up: they are stamped (id,
        created_at) in place and stored as they are, not copied.
        """
        batch = list(_check.iterable("messages", messages))
        # Ids the first attempt stamps in place (owned messages that had none) are still
        # made for this call on the next: no append stored them (fresh_ids holds).
        minted = owned
        for m in batch if owned else ():  # (a loop, not all() over a generator: two calls)
            if type(m) is not Message or m.id is not None:
                minted = False
                break

        def creates() -> SessionInfo:
            # The session made inside the append's transaction, where the backend can.
            meta = self._session_fields(agent_id, None, None)
            _check.optional_ident("session_id", session_id)
            return self._session_info(agent_id, None, meta, session_id)

        for _ in range(3):
            try:
                self._append(
                    session_id, batch, on_append, owned=owned, creates=creates, minted=minted
                )
                return
            except SessionNotFoundError:
                with suppress(SessionExistsError):  # another writer made it first
                    self.create_session(agent_id, session_id=session_id)
        raise SessionNotFoundError(f"session {session_id!r} vanished three times while adding")

    def add_message(self, session_id: str, role: str, content: Any, **fields: Any) -> Message:
        """Append one message built from ``role``, ``content`` and any Message fields."""
        return self.add_messages(session_id, [Message(role, content, **fields)])[0]

    def add_structured_message(self, session_id: str, message: Any) -> Message:
        """Append a ``Message`` (or OpenAI dict); returns the stored copy."""
        return self.add_messages(session_id, [message])[0]

    def add_messages(self, session_id: str, messages: Iterable[Any]) -> list[Message]:
        """Append messages atomically (all or none); returns the stored copies.

        Messages get an ``id`` and ``created_at`` if they have none. A tool result must
        answer a call still waiting in the session, and no other message may come while
        calls wait: the stored history is always a valid sequence (but for calls waiting
        at its end).

        Idempotent by message id, so an append whose answer was lost can be sent again: when
        every message's id is in the session already, each with the same message (equal but
        for ``created_at``), the stored copies are returned and nothing is stored. The
        decision is made inside the backend's append transaction
        (:func:`~ctxkeep.sessions.records.settle_ids`), so concurrent retries store once.

        Raises:
            SessionNotFoundError: unknown or expired session.
            OrphanToolResultError / MissingToolResultError: a dangling tool id.
            InvalidMessageError: a malformed message or non-JSON metadata, or one id twice
                in the batch (nothing is stored).
            MessageIdConflictError: an id the session holds with another message, or a
                batch of which only some ids are stored (not a retry; nothing is stored).

        """
        return [m.copy() for m in self._append(session_id, messages)]

    def _append(
        self,
        session_id: str,
        messages: Iterable[Any],
        on_append: OnAppend | None = None,
        *,
        owned: bool = False,
        creates: Callable[[], SessionInfo] | None = None,
        minted: bool = False,
    ) -> list[Message]:
        """:meth:`add_messages`, returning the stored messages themselves (the caller's to
        copy or drop, not to keep: with no ``on_append`` they share content, metadata and
        extra with the messages given; an adapter that drops them pays no copies);
        ``on_append`` is told what was written (not for a retry that wrote nothing).
        ``creates``: the session to make where the append finds none (:attr:`Append.creates`;
        beyond ``max_sessions`` the least recent are evicted after it, as by
        :meth:`create_session`). ``minted``: every message's id was made for this call by an
        earlier attempt of it (stamped in place on owned messages), none stored.
        """
        now = self._clock()
        stamped, fresh = self._stamped(messages, now, owned=owned, kept=on_append is not None)
        minted = minted or fresh
        if not stamped:
            return []
        if len(stamped) == 1:  # a chat history's add: no comprehension's frame for one
            record, text = encoded_record(stamped[0])
            records, texts = [record], [text]
        else:
            encoded = [encoded_record(m) for m in stamped]
            records = [record for record, _ in encoded]
            texts = [text for _, text in encoded]
        session_id = check_session_id(session_id)
        ttl = self.config.session_ttl

        checked: list[SessionInfo] = []  # the state the append was checked on, last
        made: list[SessionInfo] = []  # the sessions the backend was given to make

        def creating() -> SessionInfo:
            made.append(creates())  # type: ignore[misc]  # (only given with creates)
            return made[-1]

        def check(info: SessionInfo) -> tuple[str, ...]:
            # The TTL test rides in the append's own check (no read before it): a session
            # idle past its TTL takes no message; it is reclaimed below, as _live does.
            if ttl is not None and info.accessed_at < now - ttl:
                raise _Idle(session_id)
            pending = advance_pending(info.pending, stamped)
            checked[:] = [info]
            return pending

        batch = Append(
            records=records,
            texts=texts,
            check=check,
            now=now,
            ttl=self._native_ttl,
            fresh_ids=minted,
            touch_after=self._touch_resolution,
            creates=None if creates is None else creating,
        )
        seqs: list[int] = []
        for attempt in range(3):
            try:
                seqs = self.backend.append(session_id, batch)
                break
            except AlreadyStored as retry:
                return [record_to_message(record) for _, record in retry.rows]
            except _Idle:
                # Reclaimed (archived, hooked) here, as on any access, unless another
                # process touched it meanwhile: then the append is tried again.
                self._live(session_id, touch=False)
                if attempt == 2:
                    raise SessionNotFoundError(
                        f"no session {session_id!r} (unknown, deleted or expired)"
                    ) from None
            except SessionNotFoundError:
                self._forget(session_id)
                raise SessionNotFoundError(
                    f"no session {session_id!r} (unknown, deleted or expired)"
                ) from None
        if made and checked and checked[0].generation == made[-1].generation:
            self._enforce_max_sessions(keep=session_id)  # the append made the session
        first = self._first_seq(checked[0]) if checked else 0
        if self._may_exceed(seqs, first):
            self._trim(session_id, first, seqs[-1] if seqs else 0)
        if on_append is not None and checked:
            on_append(checked[0], seqs, stamped)
        return stamped

    def _trim_point_from_head(
        self, session_id: str, limit: int, first_seq: int, newest_seq: int
    ) -> tuple[SessionInfo, list[Row]] | None:
        """The session and the oldest messages to trim (``[]``: none), read from the head
        (``first_seq`` on); None where the head does not settle it (the caller reads all).
        """
        over = newest_seq - first_seq + 1 - limit  # at most this many are over the limit
        if first_seq < 1 or over < 1 or over > _TRIM_HEAD_MAX:
            return None  # a big batch, or a first seq seen long ago: read everything
        # the oldest messages, up to the first that may start the kept history (or a few)
        wanted = range(first_seq, first_seq + over + _TRIM_SLACK)
        snap = self.backend.read_rows(session_id, seqs=wanted, after_seq=_NO_SEQ)
        if snap is None:
            return None
        info, head = snap
        cut = trim_point([r["role"] for _, r in head], limit, held=info.message_count)
        if cut and cut >= len(head):
            return None  # the kept history starts past the messages read
        # A call still waiting is safe: only its results come after it, and the kept
        # history starts at a message that is not a result, so at the call or before it.
        return info, head[:cut]

    def _first_seq(self, info: SessionInfo) -> int:
        """A first seq the session has had (no later than its first seq now): ``info``'s, or
        the later one a trim of the same generation saw.
        """
        seen = self._first_seqs.get(info.session_id)
        if seen is not None and seen[0] == info.generation:
            return max(info.first_seq, seen[1])
        return info.first_seq

    def _saw_first_seq(self, info: SessionInfo, first_seq: int) -> None:
        with self._cache_lock:
            self._first_seqs.pop(info.session_id, None)
            self._first_seqs[info.session_id] = (info.generation, first_seq)
            while len(self._first_seqs) > 4096:
                del self._first_seqs[next(iter(self._first_seqs))]

    def _may_exceed(self, seqs: list[int], first_seq: int) -> bool:
        """Whether an append that got ``seqs``, checked on a state whose oldest message had
        ``first_seq``, may have left more than ``max_history`` messages.

        Every message held has a seq from the session's first_seq to the newest one given, and
        trimming only moves first_seq forward (a state seen before the write has it no later):
        so the span bounds the count, and a session below the limit is not read back. (The
        state checked is of the session written to: a compare-and-set append compares the
        generation too, so a session deleted and made again elsewhere is checked anew.)
        """
        limit = self.config.max_history
        if limit is None:
            return False
        return not seqs or first_seq < 1 or seqs[-1] - first_seq + 1 > limit

    @staticmethod
    def _stamped(
        messages: Iterable[Any], now: float, *, owned: bool = False, kept: bool = True
    ) -> tuple[list[Message], bool]:
        """``messages`` as ``Message`` objects, each with an ``id`` and ``created_at``: copies,
        or, if ``owned`` (the caller made them for this call alone and gives them up), the
        very ``Message`` objects given, stamped in place. With ``kept`` False (nobody keeps
        the stamped messages past the call: their records are made and they are dropped, or
        copied for the caller), a message given is stamped on a shallow copy (its content,
        metadata and extra shared with it, not deep copied: a LangChain message's extra is
        a nest of dicts). Also whether every id was made here (none given: no message can be
        stored under one, :attr:`Append.fresh_ids`).
        """
        stamped: list[Message] = []
        minted = True
        for i, raw in enumerate(_check.iterable("messages", messages)):
            m = coerce_message(raw, index=i)
            if m.id is not None and ("\x00" in m.id or len(m.id) > _check.MAX_ID_LENGTH):
                # PostgreSQL's text holds no NUL and its index no longer id: one rule for all.
                raise InvalidMessageError(
                    f"messages[{i}].id must hold no NUL and at most {_check.MAX_ID_LENGTH} "
                    f"characters, got {len(m.id)}: {m.id[:40]!r}",
                    index=i,
                )
            minted = minted and m.id is None
            if owned and type(m) is Message:
                state = m.__dict__  # (a frozen dataclass: its fields live here)
                if state["id"] is None:
                    state["id"] = _new_id()
                if state["created_at"] is None:
                    state["created_at"] = datetime.fromtimestamp(now, UTC)
                stamped.append(m)
                continue
            if not kept and type(m) is Message:
                state = m.__dict__.copy()
                if state["id"] is None:
                    state["id"] = _new_id()
                if state["created_at"] is None:
                    state["created_at"] = datetime.fromtimestamp(now, UTC)
                stamped.append(Message._unchecked(state))
                continue
            when = m.created_at or datetime.fromtimestamp(now, UTC)
            stamped.append(m._identified(m.id or _new_id(), when))
        return stamped, minted

    def get_messages(self, session_id: str, *, limit: int | None = None) -> list[Message]:
        """The session's messages, oldest first (copies); the newest ``limit`` if given."""
        _check.optional_integer("limit", limit, minimum=0)
        session_id = check_session_id(session_id)
        if limit is not None:
            # The newest messages by themselves: O(limit), whatever the session's length.
            if limit == 0:
                self._live(session_id, touch=True)
                return []
            info, rows = self._newest_rows(session_id, limit)
            self._accessed(session_id, info)
            return [record_to_message(r, session_id=session_id, seq=seq) for seq, r in rows]
        # The decoded-history cache (keyed by generation and revision, trimmed to first_seq)
        # reads only the rows appended since the last read.
        info, history = self._history(session_id)
        self._accessed(session_id, info)
        return [m.copy() for m in history]

    def _newest_rows(self, session_id: str, limit: int) -> tuple[SessionInfo, list[Row]]:
        """The session's info and its newest ``limit`` rows, oldest first, read by
        themselves at one instant.
        """
        tail = self.backend.read_tail(session_id, limit=limit)
        if tail is None:
            self._forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
        return tail.info, tail.rows[-limit:]

    def _accessed(self, session_id: str, info: SessionInfo) -> None:
        """After a read whose snapshot held the session's ``info``: the TTL test and the
        access-time update :meth:`_live` makes, without reading the session's row again.

        Raises:
            SessionNotFoundError: the session was idle past its TTL (it is reclaimed, as by
                any access, unless another process touched it since the read).

        """
        now = self._clock()
        ttl = self.config.session_ttl
        if ttl is not None and info.accessed_at < now - ttl:
            self._live(session_id, touch=True)  # reclaims and raises, or it was touched
        else:
            self._touch(session_id, info, now)

    def pop_message(self, session_id: str) -> Message | None:
        """Take back the session's newest message and return it (None if it holds none).

        A tool result taken back leaves its call waiting again; an assistant message taken
        back takes its calls with it. Not archived: the caller took it back on purpose.

        Raises:
            SessionNotFoundError: unknown or expired session.

        """
        info = self._live(session_id, touch=True)
        row = self.backend.pop_newest(session_id, info.generation)
        return None if row is None else record_to_message(row[1], session_id=session_id, seq=row[0])

    def replace_newest(
        self, session_id: str, messages: Iterable[Any], *, newest_id: str
    ) -> list[Message]:
        """Atomically take back the newest message and append ``messages`` in its place.

        What :meth:`pop_message` then :meth:`add_messages` do, in one transaction: no reader
        sees the session without the newest message, and a crash between the two loses
        nothing. The sequence rules apply to the session as it is without the newest message
        (an assistant message replaced by itself with one more call is valid). ``messages``
        may be empty (a conditional pop).

        Args:
            session_id: the session.
            messages: what takes the newest message's place (``Message`` objects or dicts).
            newest_id: the ``id`` of the message the caller read as the newest; if another
                writer appended or took one back since, nothing changes.

        Returns:
            The stored copies of ``messages``.

        Raises:
            SessionChangedError: the newest message is not ``newest_id`` (or there is none);
                read again and retry.
            SessionNotFoundError: unknown or expired session.
            OrphanToolResultError / MissingToolResultError / InvalidMessageError: as for
                :meth:`add_messages`; nothing changes.

        """
        _check.text("newest_id", newest_id)
        stamped, _ = self._replace(session_id, messages, newest_id=newest_id)
        return [m.copy() for m in stamped]

    def _replace(
        self,
        session_id: str,
        messages: Iterable[Any],
        *,
        newest_id: str | None = None,
        newest_seq: int | None = None,
        generation: str | None = None,
        owned: bool = False,
    ) -> tuple[list[Message], list[int]]:
        """:meth:`replace_newest` of the newest message if it has ``newest_id`` and/or is
        at ``newest_seq`` of the session's ``generation`` (a seq is not reused within a
        generation: the message there is the one the caller read); the stored messages
        themselves (not copies) and their seqs. ``owned``: as for :meth:`_add_creating`.
        """
        if newest_id is None and newest_seq is None:
            raise TypeError("_replace needs newest_id or newest_seq")
        now = self._clock()
        stamped, minted = self._stamped(messages, now, owned=owned)
        session_id = check_session_id(session_id)
        ttl = self.config.session_ttl
        checked: list[SessionInfo] = []

        def check(info: SessionInfo) -> tuple[str, ...]:
            if ttl is not None and info.accessed_at < now - ttl:
                raise _Idle(session_id)  # as in add_messages: no read before the write
            if generation is not None and info.generation != generation:
                raise SessionChangedError(session_id)  # made again since the caller read it
            checked[:] = [info]
            return advance_pending(info.pending, stamped)

        # The newest message is read and compared inside the append's transaction.
        batch = Append(
            records=[message_to_record(m) for m in stamped],
            check=check,
            now=now,
            ttl=self._native_ttl,
            replaces=newest_seq,
            replaces_id=newest_id,
            fresh_ids=minted,
            touch_after=self._touch_resolution,
        )
        try:
            seqs = self.backend.append(session_id, batch)
        except _Idle:
            self._live(session_id, touch=False)  # reclaims it and raises
            raise SessionChangedError(session_id) from None  # touched meanwhile: read again
        except SessionNotFoundError:
            self._forget(session_id)
            raise SessionNotFoundError(
                f"no session {session_id!r} (unknown, deleted or expired)"
            ) from None
        except AlreadyStored as found:
            # Held elsewhere in the session: a retry of this replace would have found
            # another newest message (SessionChangedError), so this is a reused id.
            raise MessageIdConflictError(session_id, found.rows[0][1]["id"]) from None
        # A pop adds nothing to trim; a replace reads the head as an append's trim does.
        first = self._first_seq(checked[0]) if checked else 0
        if seqs and self._may_exceed(seqs, first):
            self._trim(session_id, first, seqs[-1] if seqs else 0)
        return stamped, seqs

    def archived_messages(self, session_id: str) -> list[Message]:
        """Messages trimmed or evicted from a session and kept in the archive."""
        return self.backend.archived(check_session_id(session_id))

    def build_prompt_messages(
        self,
        session_id: str,
        *,
        system: str | Message | None = None,
        pruner: Any = None,
    ) -> list[Message]:
        """The session as a prompt: ``system`` first, then the history, pruned if a
        :class:`~ctxkeep.TokenPruner` is given. Calls still waiting for results are left out.

        The decoded history of recently used sessions is cached in this manager, keyed by the
        session's generation (so a session created again under the same id never shows the
        earlier one's messages), and a turn reads and decodes only the messages added since
        the last one; the pruner's per-message token counts carry over between turns. A
        ``TokenPruner(cache_stable=False)`` reads the newest pages only
        (:mod:`ctxkeep.prune.tail`); a cache-stable one (the default) reads from the fold
        snapshot stored with the session at its last cut (:mod:`ctxkeep.prune.snapshots`),
        storing a new one when its fold cuts. :meth:`build_prompt` gives the report too.
        """
        return self.build_prompt(session_id, system=system, pruner=pruner).messages

    def build_prompt(
        self,
        session_id: str,
        *,
        system: str | Message | None = None,
        pruner: Any = None,
    ) -> SessionPrompt:
        """:meth:`build_prompt_messages` with the pruner's report, the session's info and its
        newest user message, from the same read.

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.
            Whatever the pruner raises (``BudgetExceededError``...).

        """
        if pruner is not None:
            _check.has_method("pruner", pruner, "prune", "TokenPruner")
        prefix: list[Message] = []
        if system is not None:
            if not isinstance(system, str | Message):
                raise InvalidTypeError(
                    f"system must be a string or a Message, got {type(system).__name__}"
                )
            prefix = [system if isinstance(system, Message) else Message("system", system)]
        session_id = check_session_id(session_id)
        now = self._clock()
        # The TTL test and the touch are made on the row the prompt's own snapshot read (no
        # read of the row before it: one round trip fewer per prompt on a server). A session
        # found idle past its TTL is reclaimed and raises, as by _live; one touched or made
        # again meanwhile is read again the way it was before (_live first), as is one whose
        # read or prune failed (the error stands, unless the session had expired).
        try:
            prompt = self._prompt(session_id, prefix, pruner)
        except SessionNotFoundError:
            raise
        except Exception:
            try:
                self._live(session_id, touch=True)  # an expired session: SessionNotFoundError
            except SessionNotFoundError:
                raise
            except StorageError:
                pass
            raise
        info = prompt.info
        ttl = self.config.session_ttl
        if ttl is not None and info.accessed_at < now - ttl:
            self._live(session_id, touch=True)  # reclaims and raises, or touched meanwhile
            return self._prompt(session_id, prefix, pruner)
        touched = self._touch(session_id, info, now)
        if touched is not info and touched.generation == info.generation:
            info = dataclasses.replace(info, accessed_at=max(info.accessed_at, touched.accessed_at))
            prompt = dataclasses.replace(prompt, info=info)
        return prompt

    def _prompt(self, session_id: str, prefix: list[Message], pruner: Any) -> SessionPrompt:
        """:meth:`build_prompt` without the TTL test and the touch (its caller makes them on
        the info read).
        """
        # A pruner that declares how it reads (a TokenPruner: the newest pages, or its fold
        # snapshot) reads through this manager's primitives; None from it: read it all.
        read = getattr(pruner, "read_prompt", None)
        if callable(read):
            found = read(self, session_id, prefix)
            if found is not None:
                return cast("SessionPrompt", found)
        info, history = self._history(session_id)
        if info.pending:
            # The unit still waiting for results is not part of a prompt.
            cut = max(i for i, m in enumerate(history) if m.tool_calls)
            history = history[:cut]
        found_user = newest_user(history)
        msgs = prefix + history
        if pruner is None:
            return SessionPrompt(info, [m.copy() for m in msgs], None, found_user)
        if callable(getattr(pruner, "prune_with_report", None)):
            out, report = pruner.prune_with_report(msgs)
            return SessionPrompt(info, list(out), report, found_user)
        return SessionPrompt(info, list(pruner.prune(msgs)), None, found_user)

    def _read(self, session_id: str, after_seq: int = 0) -> Snapshot:
        snap = self.backend.read(session_id, after_seq)
        if snap is None:
            self._forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
        return snap

    def _history(self, session_id: str) -> tuple[SessionInfo, list[Message]]:
        """The session's info and messages at one instant: the cached decoded messages of
        the same generation that are still held, plus those appended since.
        """
        cached = self._take_cached(session_id)
        prior = cached
        if cached is not None and not cached.complete:
            cached = None  # a paged read's, or a fold snapshot's: read it all
        info, rows = self._read(session_id, cached.seqs[-1] if cached and cached.seqs else 0)
        if cached is not None and (cached.generation, cached.revision) != (
            info.generation,
            info.revision,
        ):
            # Another session under this id, or messages taken back: read it all again.
            cached = None
            info, rows = self._read(session_id)
        if cached is None:
            cached = CachedHistory(info.generation, info.revision, [], [])
        # Trimmed since: drop what the session no longer holds.
        keep = bisect_left(cached.seqs, info.first_seq)
        seqs = cached.seqs[keep:] + [seq for seq, _ in rows]
        msgs = cached.messages[keep:] + [
            record_to_message(r, session_id=session_id, seq=seq) for seq, r in rows
        ]
        fold = None
        if (
            prior is not None
            and prior.fold is not None
            and (prior.generation, prior.revision) == (info.generation, info.revision)
        ):
            fold = prior.fold.for_whole_read(info.first_seq)
        self._keep_cached(
            session_id, CachedHistory(info.generation, info.revision, seqs, msgs, fold=fold)
        )
        return info, list(msgs)

    def _take_cached(self, session_id: str) -> CachedHistory | None:
        """Take the session's entry out of the prompt cache (one reader at a time works on
        an entry; :meth:`_keep_cached` puts it back).
        """
        with self._cache_lock:
            return self._prompt_cache.pop(session_id, None)

    def _keep_cached(self, session_id: str, cached: CachedHistory) -> None:
        """Put a session's entry into the prompt cache as its most recently used, the least
        recently used past :attr:`prompt_cache_sessions` out.
        """
        with self._cache_lock:
            self._prompt_cache.pop(session_id, None)
            self._prompt_cache[session_id] = cached
            while len(self._prompt_cache) > self.prompt_cache_sessions:
                self._prompt_cache.pop(next(iter(self._prompt_cache)))

    @property
    def reads(self) -> HistoryReads:
        """The primitives a prompt reader (:mod:`ctxkeep.prune.read`) reads a session with."""
        return HistoryReads(self)

    def _tail(self, session_id: str, limit: int, before_seq: int | None) -> Tail:
        tail = self.backend.read_tail(
            session_id,
            limit=limit,
            before_seq=before_seq,
            roles=SYSTEM_ROLES,
            newest_role="user",
        )
        if tail is None:
            self._forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
        return tail

    def _forget(self, session_id: str) -> None:
        with self._cache_lock:
            self._prompt_cache.pop(session_id, None)

    # -- policy ------------------------------------------------------------------------

    def sweep(self) -> int:
        """Reclaim sessions idle longer than ``session_ttl``; returns how many."""
        ttl = self.config.session_ttl
        if ttl is None:
            return 0
        cutoff = self._clock() - ttl
        return sum(
            self._evict(sid, "ttl", idle_before=cutoff) for sid in self.backend.idle_since(cutoff)
        )

    def _live(self, session_id: str, *, touch: bool) -> SessionInfo:
        session_id = check_session_id(session_id)
        now = self._clock()
        info = self.backend.info(session_id, touch=None, ttl=None)
        ttl = self.config.session_ttl
        if info is not None and ttl is not None and info.accessed_at < now - ttl:
            try:
                self._evict(session_id, "ttl", idle_before=now - ttl)
            except StorageError as exc:  # a read-only store: expired all the same
                if not self._refused(exc, "reclaiming an expired session"):
                    raise
            # Gone now, unless it was touched (or created again) meanwhile.
            info = self.backend.info(session_id, touch=None, ttl=None)
            if info is not None and info.accessed_at < now - ttl:
                info = None
        if info is None:
            self._forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
        if touch:
            info = self._touch(session_id, info, now)
        return info

    def _touch(self, session_id: str, info: SessionInfo, now: float) -> SessionInfo:
        """The session's access time set to ``now`` (and its native expiry moved) where
        ``info``'s is older than the touch resolution; the session's info after.
        """
        if now - info.accessed_at < self._touch_resolution:
            return info
        try:
            return self.backend.info(session_id, touch=now, ttl=self._native_ttl) or info
        except StorageError as exc:
            if not self._refused(exc, "the access-time update of a read"):
                raise
        return info

    def _refused(self, exc: StorageError, what: str) -> bool:
        """Whether ``exc`` says the store is read-only (a SQLite file opened with
        ``mode=ro``, a read-only PostgreSQL role or standby): then a read's writes (the access
        time, reclaiming what expired) are skipped, and the store is said to be read-only in
        the log once per manager.
        """
        if not refuses_writes(exc):
            return False
        if not self._read_only_logged:
            self._read_only_logged = True
            log.warning(
                "%s store is read-only: %s skipped (reads go on; logged once): %s",
                self.backend.name,
                what,
                exc,
            )
        return True

    def _evict(
        self, session_id: str, reason: EvictReason, idle_before: float | None = None
    ) -> bool:
        """Archive and hook a session's messages, then delete it (if it is still the same
        session and, for a TTL eviction, still idle).
        """
        snap = self.backend.read(session_id)
        self._forget(session_id)
        if snap is None:
            return False
        info, rows = snap
        if idle_before is not None and info.accessed_at >= idle_before:
            return False  # touched meanwhile
        # Archived and deleted in one step of the backend's: never both held and archived.
        archive = reason if self.config.archive_evicted else None
        if not self.backend.delete(session_id, info.generation, archive=archive):
            return False
        self._hook(session_id, info.agent_id, reason, rows)
        return True

    def _hook(self, session_id: str, agent_id: str, reason: EvictReason, rows: list[Row]) -> None:
        """Hand the messages of ``rows`` (just archived or removed) to the eviction hooks."""
        if not rows or not self._hooks:
            return
        msgs = [record_to_message(r, session_id=session_id, seq=seq) for seq, r in rows]
        evicted = Evicted(session_id, agent_id, reason, msgs)
        for hook in self._hooks:
            hook(evicted)

    def _enforce_max_sessions(self, keep: str) -> None:
        cap = self.config.max_sessions
        if cap is None:
            return
        over = self.backend.count() - cap
        if over <= 0:
            return
        for sid in self.backend.least_recent(over + 1):
            if over <= 0:
                break
            if sid != keep and self._evict(sid, "lru"):
                over -= 1

    def _trim(self, session_id: str, first_seq: int = 0, newest_seq: int = 0) -> None:
        """Remove the oldest messages over ``max_history``, in whole units, never the call that
        still waits for results; what goes is archived in the same step
        (:meth:`Backend.remove_oldest`) and handed to the hooks (:class:`Evicted`).

        Given the first seq an append saw (no later than the session's) and the newest it
        wrote, only the oldest messages that can go are read: a session at the limit then
        costs a few rows per append, not all of them.
        """
        limit = self.config.max_history
        assert limit is not None
        found = self._trim_point_from_head(session_id, limit, first_seq, newest_seq)
        if found is None:  # not settled from the head: everything is read
            snap = self.backend.read(session_id)
            if snap is None:
                return
            info, rows = snap
            cut = trim_point([r["role"] for _, r in rows], limit)
            if info.pending and cut > 0:
                # Never trim the call that still waits for results.
                last_call = max(i for i, (_, r) in enumerate(rows) if r.get("tool_calls"))
                cut = min(cut, last_call)
            found = info, rows[:cut]
        info, gone = found
        if not gone:
            self._saw_first_seq(info, info.first_seq)
            return
        # Archive and remove in one step of the backend's, which moves the rows up to the cut
        # that are still there (a concurrent trim's are gone): no message is ever both held
        # and archived, or removed unarchived. The first seq is remembered only once moved: a
        # hint past rows still held would let the next trim cut from there, too far.
        upto = gone[-1][0]
        moved = self.backend.remove_oldest(
            session_id, upto, info.generation, archive=self.config.archive_evicted
        )
        self._saw_first_seq(info, upto + 1)
        self._hook(session_id, info.agent_id, "max_history", moved)


class HistoryReads:
    """What a prompt reader (:mod:`ctxkeep.prune.read`) reads a session with: the storage
    primitives under the manager's session policy (a session gone raises
    :class:`~ctxkeep.SessionNotFoundError` and leaves the prompt cache), and the manager's
    prompt cache. Got from :attr:`MemoryManager.reads`.
    """

    def __init__(self, manager: MemoryManager) -> None:
        self.manager = manager
        self.backend = manager.backend

    @property
    def page(self) -> int:
        """Messages in the first page of a paged read (each further page twice the last)."""
        return self.manager.prompt_page

    def since(self, session_id: str, after_seq: int = 0) -> Snapshot:
        """The session's info and its messages with a seq above ``after_seq``, at one instant.

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.

        """
        return self.manager._read(session_id, after_seq)

    def accessed(self, session_id: str, info: SessionInfo) -> None:
        """After a read by :meth:`since` (or any read whose snapshot held ``info``): the TTL
        test and access-time update a read makes (:meth:`MemoryManager.get_messages`'s).

        Raises:
            SessionNotFoundError: the session was idle past its TTL (it is reclaimed).

        """
        self.manager._accessed(session_id, info)

    def decoded(self, session_id: str) -> list[Message]:
        """The session's messages decoded from its rows for this caller alone (no copies of
        the manager's cache: an adapter that converts and drops them pays the decode only),
        after the TTL check and the access :meth:`MemoryManager.get_session` makes.

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.

        """
        return list(self.decoding(session_id))

    def decoding(self, session_id: str) -> Iterator[Message]:
        """:meth:`decoded` one message at a time: the rows are read (and the TTL check and
        access made) before this returns, each is parsed and decoded only as the iterator
        reaches it, so a caller that converts each message and drops it never holds more
        than one decoded (a whole read of a long session otherwise keeps every record and
        message alive at once, and the garbage collector walks them all, again and again).

        Raises:
            SessionNotFoundError: unknown, deleted or expired session (at once, not when
                iterated).
            CorruptRecordError: when iterated, a stored message that cannot be read.

        """
        session_id = check_session_id(session_id)
        snap = self.backend.read_stored(session_id)
        if snap is None:
            self.manager._forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
        info, rows = snap
        self.accessed(session_id, info)
        first = info.first_seq  # rows a trim has passed but not yet removed are left out
        return (
            record_to_message(r, session_id=session_id, seq=seq) for seq, r in rows if seq >= first
        )

    def newest(self, session_id: str, limit: int, before_seq: int | None) -> Tail:
        """The newest ``limit`` messages below ``before_seq`` (None: the newest of all), with
        the older system messages and the newest older user message as marks.

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.

        """
        return self.manager._tail(session_id, limit, before_seq)

    def seqs(self, session_id: str, seqs: Collection[int]) -> Snapshot:
        """The session's info and its messages with these seqs (those it holds), at one
        instant.

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.

        """
        snap = self.backend.read_rows(session_id, seqs=seqs, after_seq=_NO_SEQ)
        if snap is None:
            self.manager._forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
        return snap

    def take_cached(self, session_id: str) -> CachedHistory | None:
        """Take the session's entry out of the prompt cache (put it back with
        :meth:`keep_cached`): one reader at a time works on an entry.
        """
        return self.manager._take_cached(session_id)

    def keep_cached(self, session_id: str, cached: CachedHistory) -> None:
        """Put a session's entry into the prompt cache, as its most recently used."""
        self.manager._keep_cached(session_id, cached)

    def forget_cached(self, session_id: str) -> None:
        """Drop the session's entry from the prompt cache."""
        self.manager._forget(session_id)

"""The storage side of session memory: what a backend implements and the types it speaks.

A :class:`Backend` supplies a few storage primitives (create, read, append, trim, delete, the
fold snapshots of :mod:`ctxkeep.prune.snapshots`); :class:`~ctxkeep.sessions.base.MemoryManager`
does the shared work over them. The records it stores are I/O-free
(:mod:`ctxkeep.sessions.records`); a :data:`Row` is one stored message and a :data:`Snapshot`
a session with some of its messages, read at one instant. :func:`cas_append` and
:class:`KnownStates` make an append to a server (Redis, PostgreSQL) one round trip.

Everything here is importable from :mod:`ctxkeep.sessions.base` too, where it was first.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ctxkeep import _check
from ctxkeep.errors import SessionNotFoundError
from ctxkeep.messages import Message
from ctxkeep.sessions.records import Append, SessionInfo

EvictReason: TypeAlias = Literal["max_history", "ttl", "lru", "deleted"]


@dataclass(frozen=True)
class Evicted:
    """Messages leaving a session, as passed to ``on_evict`` hooks."""

    session_id: str
    agent_id: str
    reason: EvictReason
    messages: list[Message]


EvictHook: TypeAlias = Callable[[Evicted], None]
Check: TypeAlias = Callable[[SessionInfo], tuple[str, ...]]
Row: TypeAlias = tuple[int, dict[str, Any]]
"""A stored message: ``(seq, record)``."""
Snapshot: TypeAlias = tuple[SessionInfo, list[Row]]
"""A session and some of its messages, read at one instant."""
Stored: TypeAlias = "tuple[int, str | bytes | dict[str, Any]]"
"""A stored message as the backend holds it: ``(seq, its record's JSON text)``, or the record
itself where the backend keeps it parsed (:meth:`Backend.read_stored`)."""


@dataclass(frozen=True)
class Tail:
    """The newest messages of a session and the few older ones a prompt may need, read at one
    instant (:meth:`Backend.read_tail`).
    """

    info: SessionInfo
    rows: list[Row]
    """The newest ``limit`` messages below ``before_seq``, oldest first."""
    marks: list[Row]
    """Older than every row of :attr:`rows` (and below ``before_seq``): each message whose role
    is in ``roles`` and the newest whose role is ``newest_role``, oldest first. A backend that
    cannot tell a stored message's role without decoding it may add it here too: the caller
    filters by the decoded role."""


def tail_of(
    snap: Snapshot,
    *,
    limit: int | None,
    before_seq: int | None,
    roles: Collection[str],
    newest_role: str | None,
) -> Tail:
    """:meth:`Backend.read_tail`'s answer cut from a snapshot of every message (``role`` read
    from the records).
    """
    info, rows = snap
    if before_seq is not None:
        rows = [r for r in rows if r[0] < before_seq]
    split = 0 if limit is None else max(len(rows) - limit, 0)
    older, page = rows[:split], rows[split:]
    marks = [r for r in older if r[1].get("role") in roles]
    newest = next((r for r in reversed(older) if r[1].get("role") == newest_role), None)
    if newest is not None and newest[1].get("role") not in roles:
        marks = sorted([*marks, newest], key=lambda r: r[0])
    return Tail(info, page, marks)


class Backend(ABC):
    """Storage primitives a session backend implements. All methods are thread-safe.

    A backend stores; it decides nothing. TTL, LRU, ``max_history``, archiving and the
    prompt cache belong to :class:`MemoryManager`. A backend that can expire idle sessions by
    itself declares :attr:`supports_native_ttl`; only then does the manager pass it a TTL.
    """

    supports_folds: bool = False
    """True if the store keeps fold snapshots (:meth:`put_fold`, :meth:`get_fold`); without
    them a new process replays a cache-stable prompt from the session's first message."""
    supports_native_ttl: bool = False
    """True if the store expires idle sessions itself (Redis key TTL): the manager then passes
    ``ttl`` to :meth:`create`, :meth:`info` and :meth:`append`, and expects a session to vanish
    without an eviction of its own (the contract checks both)."""
    touch_writes: bool = True
    """True if updating a session's access time is a write transaction of the store (SQL,
    Redis): the manager then writes it on a read only past ``MemoryConfig.access_resolution``.
    False where it costs an attribute store (in process): every read sets it exactly."""
    name: str = "backend"

    @abstractmethod
    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Store a new session.

        Raises:
            SessionExistsError: the id is in use.

        """

    @abstractmethod
    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """The session, or None; with ``touch``, move its ``accessed_at`` forward first."""

    @abstractmethod
    def append(self, session_id: str, batch: Append) -> list[int]:
        """Atomically: run ``batch.check(info)`` (the new pending ids, or it raises), store
        ``batch.records`` under the next sequence numbers, update count, next_seq, pending and
        accessed_at. Returns the sequence numbers given.

        ``check`` depends on ``info.pending`` and ``info.accessed_at`` only, and one that passes
        with an earlier ``accessed_at`` passes with a later one (the manager's does). So a
        backend on a server may run it before the write, on a state of the session it saw
        earlier, and make the write a compare-and-set in one round trip (:func:`cas_append`):
        stored only if ``pending`` is still that state's and ``accessed_at`` no earlier; else
        ``check`` runs again on the state as it is, and a ``check`` that raises on an earlier
        state runs again on the current one before its error counts.

        Raises:
            SessionNotFoundError: an unknown id.

        """

    @abstractmethod
    def read(self, session_id: str, after_seq: int = 0) -> Snapshot | None:
        """The session and its messages with ``seq > after_seq`` (oldest first), read at one
        instant (no write lands between the two); None for an unknown id.
        """

    def read_stored(
        self, session_id: str, after_seq: int = 0
    ) -> tuple[SessionInfo, list[Stored]] | None:
        """:meth:`read`, each message as stored, not parsed: a reader that turns the rows
        into something else one at a time (:meth:`HistoryReads.decoding
        <ctxkeep.sessions.base.HistoryReads.decoding>`) keeps no parsed record alive but the
        one it works on (a 10,000-message read otherwise holds every record at once, and the
        garbage collector walks them all again and again). The default parses them
        (:meth:`read`); a backend that holds JSON text overrides it.
        """
        snap = self.read(session_id, after_seq)
        if snap is None:
            return None
        return snap[0], list(snap[1])

    def read_tail(
        self,
        session_id: str,
        *,
        limit: int | None,
        before_seq: int | None = None,
        roles: Collection[str] = (),
        newest_role: str | None = None,
    ) -> Tail | None:
        """The newest ``limit`` messages below ``before_seq`` (all of them if ``limit`` is None)
        and the older messages :attr:`Tail.marks` names, read at one instant; None for an
        unknown id. A prompt reads a long session this way, newest pages first, and stops once
        its budget is full.

        The default reads every message (:meth:`read`); a backend that can read the newest
        messages by themselves overrides it.
        """
        snap = self.read(session_id)
        if snap is None:
            return None
        return tail_of(
            snap, limit=limit, before_seq=before_seq, roles=roles, newest_role=newest_role
        )

    def read_rows(
        self, session_id: str, *, seqs: Collection[int], after_seq: int
    ) -> Snapshot | None:
        """The session and its messages whose seq is in ``seqs`` or above ``after_seq``
        (oldest first; a seq not held is left out), read at one instant; None for an unknown
        id. A prompt from a fold snapshot reads the messages it names this way.

        The default reads from the smallest seq asked for (:meth:`read`); a backend that can
        read single messages overrides it.
        """
        low = min([after_seq, *(s - 1 for s in seqs)])
        snap = self.read(session_id, low)
        if snap is None:
            return None
        wanted = set(seqs)
        return snap[0], [r for r in snap[1] if r[0] > after_seq or r[0] in wanted]

    def get_fold(self, session_id: str, key: str) -> str | None:
        """The fold snapshot stored for the session under ``key`` (see :attr:`supports_folds`),
        or None. The default keeps none.
        """
        return None

    def put_fold(self, session_id: str, generation: str, key: str, body: str) -> None:  # noqa: B027
        """Store ``body`` as the session's fold snapshot under ``key`` (replacing the one
        there) if the session exists and still has ``generation``; else do nothing. Snapshots
        are deleted with their session. The default keeps none.
        """

    @abstractmethod
    def remove_oldest(
        self, session_id: str, upto_seq: int, generation: str, *, archive: bool = False
    ) -> list[Row]:
        """Atomically, if the session still has ``generation``: remove the messages with
        ``seq <= upto_seq``, move ``first_seq`` past them and, with ``archive``, add them to the
        session's archive (:meth:`archived`) oldest first, under reason ``"max_history"`` (a
        message id already archived is not archived again). One step, as one transaction or
        one script: the rows moved are read inside it, so two concurrent calls never both move
        a row, no reader sees a message both held and archived, and a process killed during
        the call leaves the session as it was or as it is after it. Returns the rows removed,
        oldest first (none that an earlier call removed), for the manager's eviction hooks.
        """

    @abstractmethod
    def pop_newest(self, session_id: str, generation: str) -> Row | None:
        """Atomically remove and return the newest message, if the session still has
        ``generation`` and holds one: ``pending`` follows (:func:`pending_after_pop`),
        ``revision`` goes up by one, ``next_seq`` stays (a sequence number is never reused).
        """

    @abstractmethod
    def delete(
        self,
        session_id: str,
        generation: str | None = None,
        *,
        archive: EvictReason | None = None,
    ) -> bool:
        """Delete a session and its messages (only if it has ``generation``, when given);
        False if nothing was deleted. With ``archive``, its messages go into its archive
        (:meth:`archived`) oldest first under that reason (an id already archived not again)
        in the same step: no reader sees them both held and archived, and a process killed
        during the call leaves both or neither.
        """

    @abstractmethod
    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """Sessions, newest ``created_at`` first."""

    @abstractmethod
    def latest_for_agent(self, agent_id: str) -> str | None:
        """The agent's most recently created session."""

    @abstractmethod
    def count(self) -> int:
        """How many sessions are stored."""

    @abstractmethod
    def least_recent(self, n: int) -> list[str]:
        """The ``n`` sessions with the oldest ``accessed_at``."""

    @abstractmethod
    def idle_since(self, cutoff: float) -> list[str]:
        """Sessions whose ``accessed_at`` is before ``cutoff``."""

    def archive(self, evicted: Evicted) -> None:  # noqa: B027 - optional primitive
        """Keep evicted messages (default: nowhere)."""

    def archived(self, session_id: str) -> list[Message]:
        """Archived messages of a session (default: none)."""
        return []

    def close(self) -> None:  # noqa: B027 - optional primitive
        """Release connections."""

    def messages(self, session_id: str) -> list[Row]:
        """Every stored message of a session, oldest first.

        Raises:
            SessionNotFoundError: an unknown id.

        """
        snap = self.read(session_id)
        if snap is None:
            raise SessionNotFoundError(f"no session {session_id!r}")
        return snap[1]


class KnownStates:
    """The state of each session this process last saw (the newest few thousand sessions):
    what a compare-and-set append (:func:`cas_append`) runs its check on. Only a guess: the
    write verifies it, so a stale or missing entry costs a round trip, never a wrong append.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._states: dict[str, SessionInfo] = {}
        self._lock = threading.Lock()

    def get(self, session_id: str) -> SessionInfo | None:
        """The state last seen, or None."""
        return self._states.get(session_id)

    def put(self, info: SessionInfo) -> None:
        """Remember ``info`` as the session's state (the oldest entry goes beyond ``size``)."""
        with self._lock:
            self._states.pop(info.session_id, None)
            self._states[info.session_id] = info
            while len(self._states) > self.size:
                self._states.pop(next(iter(self._states)))

    def forget(self, session_id: str) -> None:
        """Drop what is known of a session."""
        with self._lock:
            self._states.pop(session_id, None)


Written: TypeAlias = "tuple[list[int], SessionInfo] | SessionInfo | None"
"""What a compare-and-set write answers: ``(seqs, the session after)`` when stored, the session
as it is now when its state was not the one given, None when there is no session."""


def cas_append(
    session_id: str,
    batch: Append,
    known: KnownStates,
    read: Callable[[], SessionInfo | None],
    write: Callable[[SessionInfo, tuple[str, ...]], Written],
) -> list[int]:
    """An append as a compare-and-set: one round trip when ``known`` has the session's state.

    ``batch.check`` runs on the state last seen (or, with none, on one ``read``); ``write(state,
    pending)`` stores the batch with ``pending`` only if the stored ``pending`` still equals
    ``state.pending`` and the stored ``accessed_at`` is not before ``state.accessed_at`` (see
    :meth:`Backend.append` for why that is the check's whole input), all in one atomic step on
    the server. When the state has moved on, the write answers the current one and the check
    runs again on it. A check that raises on a remembered state is run again on a fresh
    ``read`` before its error is believed.

    Raises:
        SessionNotFoundError: no such session.
        Whatever ``batch.check`` raises on the session as stored.

    """
    base = known.get(session_id)
    exact = base is None
    while True:
        if base is None:
            base = read()
            if base is None:
                known.forget(session_id)
                raise SessionNotFoundError(f"no session {session_id!r}")
        try:
            pending = batch.check(base)
        except Exception:
            if exact:
                raise
            base, exact = None, True  # a guess refused it: ask the store
            continue
        out = write(base, pending)
        if out is None:
            known.forget(session_id)
            raise SessionNotFoundError(f"no session {session_id!r}")
        if isinstance(out, SessionInfo):
            base, exact = out, True  # another writer got there first: check again on its state
            known.put(out)
            continue
        seqs, after = out
        known.put(after)
        return seqs


def check_session_id(session_id: Any) -> str:
    """``session_id`` if it is a non-empty string (else SessionNotFoundError: no session has
    it) that is a valid id (else ConfigError, as when a session is created under it).
    """
    if not isinstance(session_id, str) or not session_id:
        raise SessionNotFoundError(f"no session {session_id!r}")
    return _check.identifier("session_id", session_id)


def page(items: Sequence[SessionInfo], limit: int, offset: int) -> list[SessionInfo]:
    """One page of sessions sorted newest first (ties by id, for stable pages)."""
    ordered = sorted(items, key=lambda s: (-s.created_at, s.session_id))
    return ordered[offset : offset + limit]

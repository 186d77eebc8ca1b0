"""In-process sessions (``memory://``): the :class:`MemoryBackend` primitives and
:class:`SessionMemory`, the in-process store with its TTL sweeper.

:class:`MemoryBackend` only stores: sessions in a dict guarded by one lock, records kept as
JSON text so that everything handed out is a fresh copy, fold snapshots beside them. It evicts
nothing by itself.

:class:`SessionMemory` is a :class:`~ctxkeep.sessions.base.MemoryManager` over a
:class:`MemoryBackend` (so LRU beyond ``max_size`` and TTL have one owner, the manager) plus a
daemon sweeper thread that wakes every ``ttl / 2`` seconds and reclaims sessions idle longer
than ``ttl`` through :meth:`MemoryManager.sweep` (archived and hooked like every eviction).
The sweeper stops on :meth:`SessionMemory.close`, when the store is garbage-collected, and at
interpreter exit.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any

from ctxkeep.errors import (
    ConfigError,
    SessionChangedError,
    SessionExistsError,
    SessionNotFoundError,
)
from ctxkeep.messages import Message
from ctxkeep.sessions.base import (
    Backend,
    Evicted,
    EvictHook,
    EvictReason,
    MemoryConfig,
    MemoryManager,
    Row,
    Snapshot,
    Tail,
    page,
)
from ctxkeep.sessions.records import (
    Append,
    SessionInfo,
    dumps,
    load_record,
    loads,
    pending_after_pop,
    record_to_message,
    settle_ids,
)


@dataclass
class _Session:
    info: SessionInfo
    rows: list[tuple[int, str]] = field(default_factory=list)  # (seq, record JSON)
    folds: dict[str, str] = field(default_factory=dict)  # fold snapshots by key
    seqs_by_id: dict[str, int] = field(default_factory=dict)
    """Message id -> seq, for idempotent appends. Added to on append only (trims and pops
    leave entries behind): an entry counts only if its seq is still held with that id."""

    def rows_with_ids(self, rows: list[tuple[int, str]], ids: Collection[str]) -> list[Row]:
        """The rows among ``rows`` (oldest first) whose message has one of ``ids``, decoded."""
        out: list[Row] = []
        for message_id in ids:
            seq = self.seqs_by_id.get(message_id)
            i = -1 if seq is None else bisect_left(rows, seq, key=itemgetter(0))
            if 0 <= i < len(rows) and rows[i][0] == seq:
                record = load_record(self.info.session_id, *rows[i])
                if record.get("id") == message_id:
                    out.append((rows[i][0], record))
        return out


class MemoryBackend(Backend):
    """Session storage in a dict, for one process. Thread-safe; evicts nothing by itself."""

    name = "memory"
    touch_writes = False
    supports_folds = True

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._archive: dict[str, list[Message]] = {}
        self._archived_ids: dict[str, set[str]] = {}
        self._lock = threading.RLock()

    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Store a new session."""
        with self._lock:
            if info.session_id in self._sessions:
                raise SessionExistsError(info.session_id)
            self._sessions[info.session_id] = _Session(
                replace(info, metadata=loads(dumps(info.metadata)))
            )

    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """The session (a copy), touched if asked."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            if touch is not None and touch > s.info.accessed_at:
                s.info = replace(s.info, accessed_at=touch)
            return _copy(s.info)

    def append(self, session_id: str, batch: Append) -> list[int]:
        """Append under the lock."""
        texts = batch.encoded()
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                raise SessionNotFoundError(f"no session {session_id!r}")
            info, rows = s.info, s.rows
            if batch.replacing:
                newest = load_record(session_id, *rows[-1]) if rows else None
                if newest is None or not batch.takes(rows[-1][0], newest):
                    raise SessionChangedError(session_id)
                info = replace(
                    info,
                    pending=pending_after_pop(info.pending, newest),
                    revision=info.revision + 1,
                )
                rows = rows[:-1]
            settle_ids(session_id, batch.records, s.rows_with_ids(rows, batch.message_ids))
            pending = batch.check(info)  # raises before anything changed
            start = info.next_seq
            seqs = list(range(start, start + len(texts)))
            s.rows = rows
            s.rows.extend(zip(seqs, texts, strict=True))
            s.seqs_by_id.update(
                (r["id"], seq) for r, seq in zip(batch.records, seqs, strict=True) if r.get("id")
            )
            s.info = replace(
                info,
                next_seq=start + len(texts),
                message_count=len(s.rows),
                pending=pending,
                accessed_at=max(info.accessed_at, batch.now),
            )
            return seqs

    def read(self, session_id: str, after_seq: int = 0) -> Snapshot | None:
        """The session and its rows after ``after_seq`` (copies), under the lock."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            info = _copy(s.info)
            rows = s.rows if after_seq < info.first_seq else [r for r in s.rows if r[0] > after_seq]
        out: list[Row] = [(seq, load_record(session_id, seq, text)) for seq, text in rows]
        return info, out

    def read_tail(
        self,
        session_id: str,
        *,
        limit: int | None,
        before_seq: int | None = None,
        roles: Collection[str] = (),
        newest_role: str | None = None,
    ) -> Tail | None:
        """The newest ``limit`` rows below ``before_seq``, only those decoded; with marks
        asked for (``roles``, ``newest_role``), the default's read of every row.
        """
        if limit is None or roles or newest_role is not None:
            return super().read_tail(
                session_id,
                limit=limit,
                before_seq=before_seq,
                roles=roles,
                newest_role=newest_role,
            )
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            info = _copy(s.info)
            end = len(s.rows)
            if before_seq is not None:
                end = bisect_left(s.rows, before_seq, key=itemgetter(0))
            page = s.rows[max(0, end - limit) : end] if limit > 0 else []
        return Tail(info, [(seq, load_record(session_id, seq, text)) for seq, text in page], [])

    def read_rows(
        self, session_id: str, *, seqs: Collection[int], after_seq: int
    ) -> Snapshot | None:
        """The session, the rows above ``after_seq`` and those in ``seqs`` (copies), found by
        bisection under the lock.
        """
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            info = _copy(s.info)
            start = bisect_right(s.rows, after_seq, key=itemgetter(0))
            picked = []
            for seq in sorted(set(seqs)):
                i = bisect_left(s.rows, seq, key=itemgetter(0))
                if i < start and s.rows[i][0] == seq:
                    picked.append(s.rows[i])
            picked += s.rows[start:]
        return info, [(seq, load_record(session_id, seq, text)) for seq, text in picked]

    def get_fold(self, session_id: str, key: str) -> str | None:
        """The snapshot under ``key``."""
        with self._lock:
            s = self._sessions.get(session_id)
            return None if s is None else s.folds.get(key)

    def put_fold(self, session_id: str, generation: str, key: str, body: str) -> None:
        """Keep the snapshot with the session (if it still has ``generation``)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is not None and s.info.generation == generation:
                s.folds[key] = body

    def remove_oldest(
        self, session_id: str, upto_seq: int, generation: str, *, archive: bool = False
    ) -> list[Row]:
        """Drop rows up to ``upto_seq`` (archived first, with ``archive``), under the lock."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or s.info.generation != generation:
                return []
            cut = bisect_right(s.rows, upto_seq, key=itemgetter(0))
            gone = [(seq, load_record(session_id, seq, text)) for seq, text in s.rows[:cut]]
            if archive:
                self._keep(
                    session_id,
                    [record_to_message(r, session_id=session_id, seq=seq) for seq, r in gone],
                )
            s.rows = s.rows[cut:]
            s.seqs_by_id = {k: seq for k, seq in s.seqs_by_id.items() if seq > upto_seq}
            s.info = replace(
                s.info,
                message_count=len(s.rows),
                first_seq=max(s.info.first_seq, upto_seq + 1),
            )
            return gone

    def pop_newest(self, session_id: str, generation: str) -> Row | None:
        """Take the last row off, under the lock."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or s.info.generation != generation or not s.rows:
                return None
            seq, text = s.rows[-1]
            record = load_record(session_id, seq, text)  # before the pop: a corrupt row stays
            s.rows.pop()
            s.info = replace(
                s.info,
                message_count=len(s.rows),
                pending=pending_after_pop(s.info.pending, record),
                revision=s.info.revision + 1,
            )
            return seq, record

    def delete(
        self,
        session_id: str,
        generation: str | None = None,
        *,
        archive: EvictReason | None = None,
    ) -> bool:
        """Forget a session (its messages archived first, with ``archive``), under the lock."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None or (generation is not None and s.info.generation != generation):
                return False
            if archive is not None:
                self._keep(
                    session_id,
                    [
                        record_to_message(text, session_id=session_id, seq=seq)
                        for seq, text in s.rows
                    ],
                )
            del self._sessions[session_id]
            return True

    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """One page, newest first."""
        with self._lock:
            infos = [
                _copy(s.info)
                for s in self._sessions.values()
                if (agent_id is None or s.info.agent_id == agent_id)
                and (task_id is None or s.info.task_id == task_id)
            ]
        return page(infos, limit, offset)

    def latest_for_agent(self, agent_id: str) -> str | None:
        """The agent's newest session."""
        found = self.list_sessions(agent_id=agent_id, task_id=None, limit=1, offset=0)
        return found[0].session_id if found else None

    def count(self) -> int:
        """Sessions stored."""
        with self._lock:
            return len(self._sessions)

    def least_recent(self, n: int) -> list[str]:
        """Oldest-accessed ids (ties by id)."""
        with self._lock:
            ordered = sorted(
                self._sessions.values(), key=lambda s: (s.info.accessed_at, s.info.session_id)
            )
            return [s.info.session_id for s in ordered[:n]]

    def idle_since(self, cutoff: float) -> list[str]:
        """Ids idle since before ``cutoff``."""
        with self._lock:
            return [sid for sid, s in self._sessions.items() if s.info.accessed_at < cutoff]

    def archive(self, evicted: Evicted) -> None:
        """Keep evicted messages in memory (once per message id)."""
        with self._lock:
            self._keep(evicted.session_id, [m.copy() for m in evicted.messages])

    def _keep(self, session_id: str, messages: list[Message]) -> None:
        """Add ``messages`` (the caller's to give away) to the archive, but for ids in it
        (under the lock).
        """
        kept = self._archive.setdefault(session_id, [])
        known = self._archived_ids.setdefault(session_id, set())
        for m in messages:
            if m.id and m.id in known:
                continue
            if m.id:
                known.add(m.id)
            kept.append(m)

    def archived(self, session_id: str) -> list[Message]:
        """Copies of a session's archived messages."""
        with self._lock:
            return [m.copy() for m in self._archive.get(session_id, [])]


def _copy(info: SessionInfo) -> SessionInfo:
    return replace(info, metadata=loads(dumps(info.metadata)))


_LIVE: weakref.WeakSet[SessionMemory] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for store in list(_LIVE):
        store.close()


def _sweep_loop(ref: weakref.ref[SessionMemory], stop: threading.Event, every: float) -> None:
    # Holds the store only while sweeping, so an unreferenced store can be collected.
    while not stop.wait(every):
        store = ref()
        if store is None:
            return
        store.sweep()
        del store


class SessionMemory(MemoryManager):
    """In-process sessions: thread-safe, LRU-bounded, swept by TTL.

    A :class:`~ctxkeep.sessions.base.MemoryManager` (the whole session API) over a
    :class:`MemoryBackend`, with a sweeper thread. ``open_memory("memory://", config)``
    returns one.

    Args:
        max_size: sessions kept; beyond it the least recently accessed is evicted
            (``None``: unbounded).
        ttl: seconds a session may stay idle; a sweeper runs every ``ttl / 2``
            (``None``: never expire).
        config: every bound at once (instead of ``max_size`` and ``ttl``); ``max_history`` is
            unbounded when only ``max_size`` and ``ttl`` are given.
        on_evict: called with what is trimmed or evicted (LRU, TTL, ``max_history``).
        clock: the time source for TTL and LRU.

    Raises:
        ConfigError: bad bounds, or both ``config`` and ``max_size``/``ttl``.

    """

    def __init__(
        self,
        max_size: int | None = None,
        ttl: float | None = None,
        *,
        config: MemoryConfig | None = None,
        on_evict: EvictHook | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if config is None:
            config = MemoryConfig(max_history=None, session_ttl=ttl, max_sessions=max_size)
        elif max_size is not None or ttl is not None:
            raise ConfigError("pass either config or max_size/ttl, not both")
        kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
        super().__init__(MemoryBackend(), config, on_evict=on_evict, **kwargs)
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        if config.session_ttl is not None:
            self._sweeper = threading.Thread(
                target=_sweep_loop,
                args=(
                    weakref.ref(self),
                    self._stop,
                    min(config.session_ttl / 2, threading.TIMEOUT_MAX),
                ),
                name="ctxkeep-session-sweeper",
                daemon=True,
            )
            self._sweeper.start()
        _LIVE.add(self)

    @property
    def max_size(self) -> int | None:
        """Sessions kept at most."""
        return self.config.max_sessions

    @property
    def ttl(self) -> float | None:
        """Seconds a session may stay idle."""
        return self.config.session_ttl

    def close(self) -> None:
        """Stop the sweeper (idempotent). The data stays readable."""
        self._stop.set()
        t = self._sweeper
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout=5)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    @property
    def sweeper_running(self) -> bool:
        """True while the sweeper thread runs."""
        return self._sweeper is not None and self._sweeper.is_alive()

    def get(self, session_id: str) -> SessionInfo:
        """The session's info (counts as an access); see :meth:`get_session`."""
        return self.get_session(session_id)

    def count(self) -> int:
        """Sessions held."""
        return self.session_count()

    def __len__(self) -> int:
        return self.session_count()

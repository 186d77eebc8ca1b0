"""The in-process session store (``memory://``): :class:`SessionMemory`.

Sessions live in a dict guarded by one lock. Beyond ``max_size`` sessions the one with the
oldest ``accessed_at`` is evicted; a daemon sweeper thread wakes every ``ttl / 2`` seconds and
reclaims sessions idle longer than ``ttl``. It stops on :meth:`SessionMemory.close` and at
interpreter exit. Everything handed out is a copy.
"""

from __future__ import annotations

import atexit
import copy
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ctxkeep.errors import ConfigError, SessionExistsError, SessionNotFoundError
from ctxkeep.messages import Message
from ctxkeep.sessions.base import Backend, Check, Evicted, page
from ctxkeep.sessions.records import SessionInfo, dumps, loads, record_to_message


@dataclass
class _Session:
    info: SessionInfo
    rows: list[tuple[int, str]] = field(default_factory=list)  # (seq, record JSON)


_LIVE: weakref.WeakSet[SessionMemory] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for store in list(_LIVE):
        store.close()


class SessionMemory(Backend):
    """In-process sessions: thread-safe, LRU-bounded, swept by TTL.

    Args:
        max_size: sessions kept; beyond it the least recently accessed is evicted
            (``None``: unbounded).
        ttl: seconds a session may stay idle; a sweeper runs every ``ttl / 2``
            (``None``: never expire).
        on_evict: called with what the store evicts by itself (LRU, TTL).

    """

    name = "memory"

    def __init__(
        self,
        max_size: int | None = None,
        ttl: float | None = None,
        *,
        on_evict: Callable[[Evicted], None] | None = None,
    ) -> None:
        if max_size is not None and max_size < 1:
            raise ConfigError(f"max_size must be >= 1, got {max_size}")
        if ttl is not None and ttl <= 0:
            raise ConfigError(f"ttl must be > 0, got {ttl}")
        self.max_size = max_size
        self.ttl = ttl
        self.on_evict = on_evict
        self._sessions: dict[str, _Session] = {}
        self._archive: dict[str, list[Message]] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        if ttl is not None:
            self._sweeper = threading.Thread(
                target=self._sweep_loop, name="ctxkeep-session-sweeper", daemon=True
            )
            self._sweeper.start()
        _LIVE.add(self)

    # -- the sweeper -------------------------------------------------------------------

    def _sweep_loop(self) -> None:
        assert self.ttl is not None
        while not self._stop.wait(self.ttl / 2):
            self.sweep_expired()

    def sweep_expired(self, now: float | None = None) -> list[str]:
        """Remove sessions idle longer than ``ttl``; returns their ids."""
        if self.ttl is None:
            return []
        cutoff = (now if now is not None else time.time()) - self.ttl
        gone = []
        for sid in self.idle_since(cutoff):
            self._evict(sid, "ttl")
            gone.append(sid)
        return gone

    def _evict(self, sid: str, reason: Any) -> None:
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return
            msgs = [record_to_message(r) for _, r in s.rows]  # parses the JSON text
            if self.on_evict is not None and msgs:
                self.on_evict(Evicted(sid, s.info.agent_id, reason, msgs))
            del self._sessions[sid]

    def close(self) -> None:
        """Stop the sweeper (idempotent). The data stays readable."""
        self._stop.set()
        t = self._sweeper
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout=5)

    @property
    def sweeper_running(self) -> bool:
        """True while the sweeper thread runs."""
        return self._sweeper is not None and self._sweeper.is_alive()

    # -- primitives --------------------------------------------------------------------

    def create(self, info: SessionInfo, ttl: float | None) -> None:
        """Store a new session, evicting the least recently accessed beyond ``max_size``."""
        with self._lock:
            if info.session_id in self._sessions:
                raise SessionExistsError(info.session_id)
            self._sessions[info.session_id] = _Session(copy.deepcopy(info))
            if self.max_size is not None:
                while len(self._sessions) > self.max_size:
                    victim = min(
                        (
                            s
                            for s in self._sessions.values()
                            if s.info.session_id != info.session_id
                        ),
                        key=lambda s: s.info.accessed_at,
                    )
                    self._evict(victim.info.session_id, "lru")

    def info(
        self, session_id: str, *, touch: float | None, ttl: float | None
    ) -> SessionInfo | None:
        """The session (a copy), touched if asked."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            if touch is not None:
                s.info = replace(s.info, accessed_at=touch)
            return copy.deepcopy(s.info)

    def append(
        self,
        session_id: str,
        records: list[dict[str, Any]],
        check: Check,
        now: float,
        ttl: float | None,
    ) -> list[int]:
        """Append under the lock."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                raise SessionNotFoundError(f"no session {session_id!r}")
            pending = check(s.info)
            start = s.info.next_seq
            seqs = list(range(start, start + len(records)))
            s.rows.extend(zip(seqs, (dumps(r) for r in records), strict=True))
            s.info = replace(
                s.info,
                next_seq=start + len(records),
                message_count=len(s.rows),
                pending=pending,
                accessed_at=now,
            )
            return seqs

    def messages(self, session_id: str) -> list[tuple[int, dict[str, Any]]]:
        """Copies of the stored rows."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                raise SessionNotFoundError(f"no session {session_id!r}")
            rows = list(s.rows)
        return [(seq, loads(text)) for seq, text in rows]

    def messages_after(self, session_id: str, after_seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Rows with ``seq > after_seq`` (copies)."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                raise SessionNotFoundError(f"no session {session_id!r}")
            rows = [r for r in s.rows if r[0] > after_seq]
        return [(seq, loads(text)) for seq, text in rows]

    def remove_oldest(self, session_id: str, upto_seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Drop rows up to ``upto_seq``."""
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return []
            gone = [(seq, loads(t)) for seq, t in s.rows if seq <= upto_seq]
            s.rows = [r for r in s.rows if r[0] > upto_seq]
            s.info = replace(s.info, message_count=len(s.rows))
            return gone

    def delete(self, session_id: str) -> bool:
        """Forget a session."""
        with self._lock:
            return self._sessions.pop(session_id, None) is not None

    def list_sessions(
        self, *, agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> list[SessionInfo]:
        """One page, newest first."""
        with self._lock:
            infos = [
                copy.deepcopy(s.info)
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
        """Oldest-accessed ids."""
        with self._lock:
            ordered = sorted(self._sessions.values(), key=lambda s: s.info.accessed_at)
            return [s.info.session_id for s in ordered[:n]]

    def idle_since(self, cutoff: float) -> list[str]:
        """Ids idle since before ``cutoff``."""
        with self._lock:
            return [sid for sid, s in self._sessions.items() if s.info.accessed_at < cutoff]

    def archive(self, evicted: Evicted) -> None:
        """Keep evicted messages in memory."""
        with self._lock:
            self._archive.setdefault(evicted.session_id, []).extend(
                m.copy() for m in evicted.messages
            )

    def archived(self, session_id: str) -> list[Message]:
        """Copies of a session's archived messages."""
        with self._lock:
            return [m.copy() for m in self._archive.get(session_id, [])]

    # -- conveniences for direct use ---------------------------------------------------

    def get(self, session_id: str) -> SessionInfo:
        """The session's info (a copy; counts as an access)."""
        info = self.info(session_id, touch=time.time(), ttl=self.ttl)
        if info is None:
            raise SessionNotFoundError(f"no session {session_id!r}")
        return info

    def get_messages(self, session_id: str) -> list[Message]:
        """The session's messages (copies; counts as an access)."""
        self.get(session_id)
        return [record_to_message(r) for _, r in self.messages(session_id)]

    def __len__(self) -> int:
        return self.count()

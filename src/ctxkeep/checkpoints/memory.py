"""Checkpoints in process memory (``memory://``)."""

from __future__ import annotations

import threading
from dataclasses import replace

from ctxkeep.checkpoints.base import Checkpoint, CheckpointStore, encode_checkpoint


class MemoryCheckpointStore(CheckpointStore):
    """Checkpoints in dicts, guarded by a lock; stored as JSON so reads are copies."""

    name = "memory"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[str, str] = {}
        self._by_agent: dict[str, list[str]] = {}

    def _put(self, cp: Checkpoint) -> str:
        with self._lock:
            ids = self._by_agent.setdefault(cp.agent_id, [])
            text = encode_checkpoint(replace(cp, seq=len(ids) + 1))
            self._by_id[cp.checkpoint_id] = text
            ids.append(cp.checkpoint_id)
        return cp.checkpoint_id

    def _get(self, checkpoint_id: str) -> str | None:
        with self._lock:
            return self._by_id.get(checkpoint_id)

    def _latest(self, agent_id: str) -> str | None:
        with self._lock:
            ids = self._by_agent.get(agent_id)
            return self._by_id[ids[-1]] if ids else None

    def _history(self, agent_id: str, limit: int) -> list[str]:
        with self._lock:
            ids = self._by_agent.get(agent_id, [])
            return [self._by_id[i] for i in reversed(ids[-limit:])]

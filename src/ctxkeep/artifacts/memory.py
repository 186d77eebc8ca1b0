"""Artifacts in process memory (``memory://``)."""

from __future__ import annotations

import threading

from ctxkeep.artifacts.base import ArtifactStore


class MemoryArtifactStore(ArtifactStore):
    """Artifacts in a dict, for one process."""

    name = "memory"

    def __init__(self) -> None:
        self._data: dict[str, str] = {}
        self._lock = threading.Lock()

    def _put(self, ref: str, text: str) -> None:
        with self._lock:
            self._data.setdefault(ref, text)

    def _get(self, ref: str) -> str | None:
        return self._data.get(ref)

    def __len__(self) -> int:
        return len(self._data)

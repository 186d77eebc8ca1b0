"""Exact search: every query scored against every live vector (numpy)."""

from __future__ import annotations

from typing import IO, Any

import numpy as np

from ctxkeep.episodic.index._base import _gather_dot, _SlotIndex, _SlotMap, _topk, matvec
from ctxkeep.errors import StorageError


class ExactIndex(_SlotIndex):
    """Every query scored against every live vector: exact, O(n·dim) per query."""

    kind = "exact"

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self._vecs = np.zeros((0, dim), np.float32)

    def _append(self, vectors: np.ndarray) -> None:
        n, need = self._nslots, self._nslots + vectors.shape[0]
        if need > self._vecs.shape[0]:
            grown = np.zeros((max(need, 2 * self._vecs.shape[0], 256), self.dim), np.float32)
            grown[:n] = self._vecs[:n]
            self._vecs = grown
        self._vecs[n:need] = vectors

    def _matrix(self) -> np.ndarray:
        return self._vecs[: self._nslots]

    def _erase(self, slots: np.ndarray) -> None:
        super()._erase(slots)
        if self.tombstones > max(1024, self._live):
            self._compact()

    def _compact(self) -> None:
        keep = self._live_slots()
        ids = self._slot_id[keep]
        self._vecs = self._vecs[keep].copy()
        self._slot_id = ids.copy()
        self._nslots = int(keep.size)
        self._slots = _SlotMap()
        self._slots.set(ids, np.arange(keep.size, dtype=np.int64))

    def _search(
        self, q: np.ndarray, k: int, slots: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        n = self._nslots
        if slots is not None and slots.size * 4 < n:
            scores = _gather_dot(self._vecs, slots, q)
            best = _topk(scores, k)
            return slots[best], scores[best]
        scores = matvec(self._vecs[:n], q)
        keep = self._slot_id[:n] >= 0
        if slots is not None:
            keep = np.zeros(n, bool)
            keep[slots] = True
        scores[~keep] = -np.inf
        best = _topk(scores, k)
        return best, scores[best]

    def _write_payload(self, f: IO[bytes]) -> None:
        f.write(np.ascontiguousarray(self._vecs[: self._nslots]).data)

    def _read_payload(self, f: IO[bytes], header: dict[str, Any]) -> None:
        vecs = np.fromfile(f, np.float32, self._nslots * self.dim)
        if vecs.size != self._nslots * self.dim:
            raise StorageError("truncated index file")
        self._vecs = vecs.reshape(self._nslots, self.dim)

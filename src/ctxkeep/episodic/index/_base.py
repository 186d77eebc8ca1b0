"""The index interface and the slot logic the exact and HNSW indexes share.

Ids map to *slots* (matrix rows, faiss labels); removing an id tombstones its slot and
zeroes its vector, so a forgotten episode's vector is gone from memory and from the next
saved file even before the slot is reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar, Self, cast

import numpy as np
import numpy.typing as npt

from ctxkeep.errors import ConfigError, StorageError

if TYPE_CHECKING:
    from ctxkeep.episodic.index.auto import IndexConfig

log = logging.getLogger("ctxkeep.episodic.index")

MAGIC = b"CTXKVIX\x00"
FORMAT_VERSION = 1
_HEADER_LEN = struct.Struct("<I")
_CHUNK = 65_536  # vectors per add() while (re)building

Ids = npt.ArrayLike
"""Ids: a sequence or 1-D array of non-negative integers."""
Allowed = npt.ArrayLike | None
"""An allowed set: ids (int array) or a boolean mask indexed by id; None: every id."""


def _as_ids(ids: Ids) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":  # np.issubdtype took 1.4 us
        raise ConfigError(f"ids must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    out = arr.astype(np.int64, copy=False)
    if int(out.min()) < 0:
        raise ConfigError("ids must be >= 0")
    return out


def _unit(vectors: npt.ArrayLike, dim: int) -> np.ndarray:
    """A float32 copy, rows scaled to length 1 (zero rows stay zero), shape (n, dim)."""
    m = np.array(vectors, dtype=np.float32, ndmin=2, copy=True)
    if m.ndim != 2 or m.shape[1] != dim:
        raise ConfigError(f"vectors must have shape (n, {dim}), got {m.shape}")
    # the squared lengths by einsum, and the elements checked only when a length is not
    # finite (a NaN or inf element makes it so): np.linalg.norm and the check of every
    # element were a third of adding one vector
    norms = np.sqrt(np.einsum("ij,ij->i", m, m))[:, None]
    if not np.isfinite(norms).all() and not np.isfinite(m).all():
        raise ConfigError("vectors must be finite")
    np.divide(m, norms, out=m, where=norms > 0)
    return m


def fingerprint(ids: Ids, salt: str = "") -> str:
    """A checksum of a set of ids (order and repeats ignored) and ``salt``.

    A store passes ``salt`` for what the ids do not say: its embedder's name and anything
    that changes vectors without changing ids (ids must not be reused for other vectors).
    """
    arr = np.unique(_as_ids(ids))
    h = hashlib.sha256(salt.encode("utf-8") + b"\x00")
    h.update(arr.astype("<i8").tobytes())
    return f"{arr.size}:{h.hexdigest()[:32]}"


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest finite scores, best first."""
    finite = int(np.isfinite(scores).sum())
    k = min(k, finite)
    if k <= 0:
        return np.zeros(0, np.int64)
    part = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
    out: np.ndarray = part[np.argsort(-scores[part], kind="stable")]
    return out


_EMPTY = (np.zeros(0, np.int64), np.zeros(0, np.float32))
_BLOCK = 1024  # rows gathered at a time: a reused buffer beats one fresh (page-faulting) copy

SERIAL_ELEMENTS = 131_072
"""The most matrix elements :func:`matvec` hands BLAS in one product: below OpenBLAS's
threshold for threading a matrix-vector product (it stayed on one thread at 262,144, 1,024
rows of 256, and threaded at 2,048 rows). Threaded, the product is memory-bound and gains
little on an idle machine, but its threads wait for cores on a busy one: on the shared 2-core
machine (load 7-15) 10,000 x 256 took 4-21 ms threaded, 0.6-2 ms in blocks, and a
CtxkeepStore search at 10,000 items on SQLite (bench/store_recall.py) went from 24.6 ms p50
to 4.2 ms with BLAS held to one thread."""


def matvec(matrix: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``matrix @ q`` (float32), in blocks of at most :data:`SERIAL_ELEMENTS` elements, each
    of which BLAS runs on one thread.
    """
    n = matrix.shape[0]
    rows = max(64, SERIAL_ELEMENTS // max(1, matrix.shape[1]))
    if n <= rows:
        small: np.ndarray = matrix @ q
        return small
    out = np.empty(n, np.result_type(matrix.dtype, q.dtype))
    for s in range(0, n, rows):
        np.matmul(matrix[s : s + rows], q, out=out[s : s + rows])
    return out


def _gather_dot(matrix: np.ndarray, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``matrix[rows] @ q`` without materialising ``matrix[rows]``."""
    out = np.empty(rows.size, np.float32)
    block = max(64, min(_BLOCK, SERIAL_ELEMENTS // max(1, matrix.shape[1])))  # one thread
    buf = np.empty((min(block, rows.size), matrix.shape[1]), np.float32)
    for s in range(0, rows.size, block):
        part = rows[s : s + block]
        np.take(matrix, part, axis=0, out=buf[: part.size])
        np.dot(buf[: part.size], q, out=out[s : s + part.size])
    return out


class _SlotMap:
    """id -> slot: a dense array while ids are compact (row numbers), a dict otherwise."""

    DENSE_MIN = 1 << 20

    def __init__(self) -> None:
        self._dense: np.ndarray | None = np.full(0, -1, np.int64)
        self._sparse: dict[int, int] = {}

    def get(self, ids: np.ndarray) -> np.ndarray:
        if self._dense is None:
            d = self._sparse
            return np.fromiter((d.get(i, -1) for i in ids.tolist()), np.int64, ids.size)
        out = np.full(ids.size, -1, np.int64)
        inside = ids < self._dense.size
        out[inside] = self._dense[ids[inside]]
        return out

    def set(self, ids: np.ndarray, slots: np.ndarray) -> None:
        if ids.size == 0:
            return
        top = int(ids.max())
        if self._dense is not None and top >= self._dense.size:
            live = int((self._dense >= 0).sum()) + ids.size
            if top >= max(self.DENSE_MIN, 8 * live):  # sparse ids: a dict costs less
                known = np.flatnonzero(self._dense >= 0)
                self._sparse = dict(zip(known.tolist(), self._dense[known].tolist(), strict=True))
                self._dense = None
            else:
                grown = np.full(max(top + 1, 2 * self._dense.size), -1, np.int64)
                grown[: self._dense.size] = self._dense
                self._dense = grown
        if self._dense is None:
            self._sparse.update(zip(ids.tolist(), slots.tolist(), strict=True))
        else:
            self._dense[ids] = slots

    def drop(self, ids: np.ndarray) -> None:
        if self._dense is None:
            for i in ids.tolist():
                self._sparse.pop(i, None)
        else:
            self._dense[ids[ids < self._dense.size]] = -1

    def masked(self, mask: np.ndarray) -> np.ndarray:
        """Slots of the ids whose ``mask[id]`` is true."""
        if self._dense is None:
            return self.get(np.flatnonzero(mask))
        n = min(mask.size, self._dense.size)
        out: np.ndarray = self._dense[:n][mask[:n]]
        return out


# -- the interface ------------------------------------------------------------------------------


class VectorIndex(ABC):
    """Ids to unit vectors, searched by inner product. Thread-safe.

    Vectors are normalised on the way in (zero vectors stay zero); ``add`` replaces the
    vector of an id already present.
    """

    kind: ClassVar[str]
    """``exact``, ``hnsw`` or ``auto`` (files record the kind of the index inside)."""

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ConfigError(f"dim must be >= 1, got {dim}")
        self.dim = dim

    @abstractmethod
    def add(self, ids: Ids, vectors: npt.ArrayLike) -> None:
        """Add (or replace) ``vectors[i]`` under ``ids[i]``; vectors shape (n, dim).

        Raises:
            ConfigError: ids not unique non-negative integers, or vectors of another shape.

        """

    @abstractmethod
    def remove(self, ids: Ids) -> int:
        """Remove ids (absent ones are ignored); returns how many were present."""

    @abstractmethod
    def search(
        self, query: npt.ArrayLike, k: int, allowed: Allowed = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` ids nearest ``query`` and their scores (cosine), best first.

        ``allowed``: only these ids (an int array) or the ids where this boolean mask is
        true; None for all. Fewer than ``k`` come back only if fewer are allowed.
        """

    @abstractmethod
    def __len__(self) -> int:
        """How many ids are indexed."""

    @abstractmethod
    def ids(self) -> np.ndarray:
        """The indexed ids, sorted (int64)."""

    @abstractmethod
    def vectors(self, ids: Ids) -> np.ndarray:
        """The stored (unit) vectors of ``ids``, shape (len(ids), dim); zeros where absent."""

    @property
    def tombstones(self) -> int:
        """Removed slots still held (HNSW keeps them until rebuilt)."""
        return 0

    @property
    def approximate(self) -> bool:
        """Whether search may miss some of the true best (an HNSW graph is searched)."""
        return False

    @abstractmethod
    def save(self, path: str | os.PathLike[str], *, salt: str = "") -> None:
        """Write the index to ``path`` atomically, with the fingerprint of its ids and
        ``salt`` (see :func:`fingerprint`) so a stale file can be detected.
        """

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, config: IndexConfig | None = None) -> Self:
        """The index saved at ``path`` (search knobs from ``config``).

        Raises:
            FileNotFoundError: no file.
            StorageError: not an index file of this kind, or corrupt.
            MissingDependencyError: an HNSW file without faiss installed.

        """
        from ctxkeep.episodic.index.auto import AutoIndex, IndexConfig, _read

        index, _ = _read(Path(path), config or IndexConfig())
        if cls is AutoIndex:
            return cast(Self, AutoIndex(index.dim, config, inner=index))
        if not isinstance(index, cls):
            raise StorageError(f"{path} holds a {index.kind} index, not {cls.__name__}")
        return index


# -- the shared slot logic ----------------------------------------------------------------------


class _SlotIndex(VectorIndex):
    """Ids, slots, tombstones, filters and files; a backend stores and scores vectors."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self._slot_id = np.zeros(0, np.int64)  # slot -> id, -1 once removed
        self._nslots = 0
        self._slots = _SlotMap()
        self._live = 0
        self._lock = threading.RLock()

    # backend primitives
    @abstractmethod
    def _append(self, vectors: np.ndarray) -> None:
        """Store unit vectors in the next slots."""

    @abstractmethod
    def _matrix(self) -> np.ndarray:
        """The stored vectors, one row per slot (a writable view)."""

    def _erase(self, slots: np.ndarray) -> None:
        """Forget the vectors of removed slots."""
        self._matrix()[slots] = 0.0

    @abstractmethod
    def _search(
        self, q: np.ndarray, k: int, slots: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Best ``k`` live slots (only ``slots`` if given: live, unique) and scores."""

    @abstractmethod
    def _write_payload(self, f: IO[bytes]) -> None:
        """Write the vectors (and graph)."""

    @abstractmethod
    def _read_payload(self, f: IO[bytes], header: dict[str, Any]) -> None:
        """Read what :meth:`_write_payload` wrote."""

    def _build_key(self) -> dict[str, Any]:
        return {}

    # the interface
    def add(self, ids: Ids, vectors: npt.ArrayLike) -> None:
        """Add (or replace) vectors; see :meth:`VectorIndex.add`."""
        id_arr = _as_ids(ids)
        vecs = _unit(vectors, self.dim) if id_arr.size else np.zeros((0, self.dim), np.float32)
        if vecs.shape[0] != id_arr.size:
            raise ConfigError(f"{id_arr.size} ids for {vecs.shape[0]} vectors")
        if id_arr.size > 1 and np.unique(id_arr).size != id_arr.size:
            raise ConfigError("ids repeat within one add")
        if not id_arr.size:
            return
        with self._lock:
            old = self._slots.get(id_arr)
            if (old >= 0).any():
                self._kill(old[old >= 0])
            first = self._nslots
            self._append(vecs)
            if self._slot_id.size < first + id_arr.size:
                grown = np.full(max(first + id_arr.size, 2 * self._slot_id.size), -1, np.int64)
                grown[:first] = self._slot_id[:first]
                self._slot_id = grown
            self._slot_id[first : first + id_arr.size] = id_arr
            self._nslots += id_arr.size
            self._slots.set(id_arr, np.arange(first, first + id_arr.size, dtype=np.int64))
            self._live += id_arr.size
            self._changed()

    def remove(self, ids: Ids) -> int:
        """Remove ids; see :meth:`VectorIndex.remove`."""
        id_arr = np.unique(_as_ids(ids))
        with self._lock:
            slots = self._slots.get(id_arr)
            slots = slots[slots >= 0]
            self._kill(slots)
            return int(slots.size)

    def _kill(self, slots: np.ndarray) -> None:
        if not slots.size:
            return
        self._slots.drop(self._slot_id[slots])
        self._slot_id[slots] = -1
        self._live -= int(slots.size)
        self._erase(slots)
        self._changed()

    def _changed(self) -> None:
        """Hook: the slots changed (drop caches)."""

    def search(
        self, query: npt.ArrayLike, k: int, allowed: Allowed = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best ids and scores; see :meth:`VectorIndex.search`."""
        q = _unit(query, self.dim)
        if q.shape[0] != 1:
            raise ConfigError("search takes one query vector")
        with self._lock:
            if k < 1 or not self._live:
                return _EMPTY
            slots = None if allowed is None else self._allowed_slots(allowed)
            if slots is not None and not slots.size:
                return _EMPTY
            found, scores = self._search(q[0], k, slots)
            return self._slot_id[found], scores.astype(np.float32, copy=False)

    def _allowed_slots(self, allowed: npt.ArrayLike) -> np.ndarray:
        arr = np.asarray(allowed)
        if arr.dtype == np.bool_:
            if arr.ndim != 1:
                raise ConfigError("an allowed mask must be 1-D (indexed by id)")
            slots = self._slots.masked(arr)
        else:
            slots = self._slots.get(np.unique(_as_ids(arr)))
        return np.unique(slots[slots >= 0])

    def __len__(self) -> int:
        return self._live

    def ids(self) -> np.ndarray:
        """The indexed ids, sorted."""
        with self._lock:
            live = self._slot_id[: self._nslots]
            return np.sort(live[live >= 0])

    def vectors(self, ids: Ids) -> np.ndarray:
        """The stored vectors of ``ids``; zeros where absent."""
        with self._lock:
            slots = self._slots.get(_as_ids(ids))
            found = slots >= 0
            if found.all():  # one gather, not a zeroed array and a masked one
                # np.take: 2,000 of 100,000 rows of dim 384 in 0.41 ms, indexing 0.58 ms
                out: np.ndarray = np.take(self._matrix(), slots, axis=0)
                return out
            out = np.zeros((slots.size, self.dim), np.float32)
            out[found] = self._matrix()[slots[found]]
            return out

    @property
    def tombstones(self) -> int:
        """Removed slots still held."""
        return self._nslots - self._live

    def _live_slots(self) -> np.ndarray:
        return np.flatnonzero(self._slot_id[: self._nslots] >= 0)

    def save(self, path: str | os.PathLike[str], *, salt: str = "") -> None:
        """Write the index atomically; see :meth:`VectorIndex.save`."""
        target = Path(path)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with self._lock:
            header = {
                "format": FORMAT_VERSION,
                "kind": self.kind,
                "dim": self.dim,
                "count": self._live,
                "slots": self._nslots,
                "fingerprint": fingerprint(self.ids(), salt),
                "salt": salt,
                "build": self._build_key(),
            }
            raw = json.dumps(header, sort_keys=True).encode("utf-8")
            try:
                with open(tmp, "wb") as f:
                    f.write(MAGIC + _HEADER_LEN.pack(len(raw)) + raw)
                    f.write(np.ascontiguousarray(self._slot_id[: self._nslots]).data)
                    self._write_payload(f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)

    def _restore(self, f: IO[bytes], header: dict[str, Any]) -> None:
        n = int(header["slots"])
        slot_id = np.fromfile(f, np.int64, n)
        if slot_id.size != n:
            raise StorageError("truncated index file")
        self._slot_id, self._nslots = slot_id, n
        live = np.flatnonzero(slot_id >= 0)
        self._slots.set(slot_id[live], live.astype(np.int64))
        self._live = int(live.size)
        self._read_payload(f, header)

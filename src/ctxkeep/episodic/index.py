"""Vector indexes for episodic memory: exact search for small stores, HNSW above a threshold.

Every index maps non-negative int64 ids (a store's row numbers or rowids) to L2-normalised
float32 vectors and answers ``search(query, k, allowed)`` with the ``k`` best ids by inner
product (cosine similarity), best first, optionally only among ``allowed`` ids:

* :class:`ExactIndex`: one numpy matrix, every query scored against every live vector.
* :class:`HNSWIndex`: a faiss ``IndexHNSWFlat`` graph (``pip install 'ctxkeep[hnsw]'``).
  Filtered search stays correct: a small allowed set is scored exactly; for a larger one
  the graph is asked for ``2k / (allowed fraction)`` results and the allowed ones kept
  (if fewer than ``k`` are, faiss's id selector makes the graph search collect allowed ids
  only). Which is cheaper is decided by a measured cost model (``HNSWParams.exact_cost``).
* :class:`AutoIndex`: exact until it holds ``hnsw_from`` vectors, then HNSW.
* :func:`open_index`: the index persisted beside a store, loaded if current, brought up to
  date if only some ids changed, rebuilt if missing, unreadable or built differently.

Both implementations share :class:`_SlotIndex`: ids map to *slots* (matrix rows, faiss
labels); removing an id tombstones its slot and zeroes its vector, so a forgotten episode's
vector is gone from memory and from the next saved file even before the slot is reused.

Why faiss: the three libraries used directly on 100,000 vectors of dim 384 drawn like
e5-small embeddings (``bench/episodic_scale.py``'s ``e5like``), M=16, efConstruction=100,
one query thread, two cores shared with other work (reproduce with
``bench/episodic_scale.py --libraries --sizes 100000 --m 16 --ef-construction 100``)::

    library           build (vectors/cpu-s)   ef=256: p50     recall@10
    faiss 1.15        1,051                   1.77 ms         0.913
    hnswlib 0.8       872                     2.32 ms         0.927
    usearch 2.26 f16  664                     3.77 ms         0.928
    usearch 2.26 f32  521                     5.85 ms         0.926
    usearch 2.26 i8   1,086                   3.04 ms         0.695

The three run the same algorithm and reach the same recall per ``ef``; faiss is the fastest
to query (2x usearch at equal recall) and to build, ships wheels, has a native filtered
search (``IDSelectorBitmap``) and a zero-copy view of its float32 vectors (for exact search
over small allowed sets). hnswlib has no wheels (its last release, 2023, compiles from
source); usearch is slower here and has no filtered search in Python; its int8 storage
loses too much recall on embedding-like data. faiss cannot delete from an HNSW graph: ids
are tombstoned (and their vectors zeroed) and the graph is rebuilt by :func:`open_index`
once tombstones outnumber live vectors. On uniformly random unit vectors (no neighbourhood
structure) all three fall alike, to recall@10 ~0.25 at 100,000 (M=16, ef=256).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import math
import os
import struct
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar, Literal, Self, cast

import numpy as np
import numpy.typing as npt

from ctxkeep.errors import ConfigError, MissingDependencyError, StorageError

log = logging.getLogger(__name__)

MAGIC = b"CTXKVIX\x00"
FORMAT_VERSION = 1
_HEADER_LEN = struct.Struct("<I")
_CHUNK = 65_536  # vectors per add() while (re)building

Ids = npt.ArrayLike
"""Ids: a sequence or 1-D array of non-negative integers."""
Allowed = npt.ArrayLike | None
"""An allowed set: ids (int array) or a boolean mask indexed by id; None: every id."""


@dataclass(frozen=True, kw_only=True)
class HNSWParams:
    """HNSW knobs; the defaults meet recall@10 >= 0.95 at 1M vectors (BENCHMARKS.md)."""

    m: int = 48
    """Links per node (HNSW's M): more is better recall, more memory, slower building."""
    ef_construction: int = 128
    """Candidate list while building: more is a better graph, slower building."""
    ef_search: int = 128
    """Candidate list while searching (raised to ``k``): more is better recall, slower."""
    overfetch: float = 2.0
    """A filtered search fetches ``overfetch * k / (allowed fraction)`` from the graph
    and keeps the allowed ones."""
    exact_cost: float = 16.0
    """How many vectors exact search scores in the time the graph search spends per unit
    of ``ef`` (measured); a filtered search is done exactly when that is cheaper."""

    def build_key(self) -> dict[str, int]:
        """The knobs fixed when the graph is built (a file built otherwise is rebuilt)."""
        return {"m": self.m, "ef_construction": self.ef_construction}


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """Which index a store uses."""

    kind: Literal["auto", "exact", "hnsw"] = "auto"
    """``auto``: exact below ``hnsw_from`` vectors, HNSW from there (exact if faiss is
    missing); ``exact``; ``hnsw`` (faiss required)."""
    hnsw_from: int = 20_000
    """``auto`` switches to HNSW at this many vectors: there exact search took 7.8 ms and
    HNSW 1.7 ms (recall@10 0.993); at 5,000 exact took 0.2 ms (BENCHMARKS.md)."""
    hnsw: HNSWParams = field(default_factory=HNSWParams)
    """The HNSW knobs."""


# -- helpers ------------------------------------------------------------------------------------


def _faiss() -> Any:
    try:
        return importlib.import_module("faiss")
    except ImportError as exc:
        raise MissingDependencyError("faiss-cpu", "hnsw") from exc


def hnsw_available() -> bool:
    """Whether faiss (the ``hnsw`` extra) can be imported."""
    try:
        _faiss()
    except MissingDependencyError:
        return False
    return True


def _as_ids(ids: Ids) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.size == 0:
        return np.zeros(0, np.int64)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
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
    if not np.isfinite(m).all():
        raise ConfigError("vectors must be finite")
    norms = np.linalg.norm(m, axis=1, keepdims=True)
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


def _gather_dot(matrix: np.ndarray, rows: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``matrix[rows] @ q`` without materialising ``matrix[rows]``."""
    out = np.empty(rows.size, np.float32)
    buf = np.empty((min(_BLOCK, rows.size), matrix.shape[1]), np.float32)
    for s in range(0, rows.size, _BLOCK):
        part = rows[s : s + _BLOCK]
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
        if np.unique(id_arr).size != id_arr.size:
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
            out = np.zeros((slots.size, self.dim), np.float32)
            found = slots >= 0
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


# -- exact --------------------------------------------------------------------------------------


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
        scores = self._vecs[:n] @ q
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


# -- HNSW (faiss) -------------------------------------------------------------------------------


class HNSWIndex(_SlotIndex):
    """An approximate index: faiss's HNSW graph over float32 vectors (inner product).

    Raises:
        MissingDependencyError: faiss is not installed (``pip install 'ctxkeep[hnsw]'``).

    """

    kind = "hnsw"

    def __init__(self, dim: int, params: HNSWParams | None = None) -> None:
        super().__init__(dim)
        self._faiss = _faiss()
        self.params = params or HNSWParams()
        self._index = self._faiss.IndexHNSWFlat(
            dim, self.params.m, self._faiss.METRIC_INNER_PRODUCT
        )
        self._index.hnsw.efConstruction = self.params.ef_construction
        self._live_bits: np.ndarray | None = None

    def _build_key(self) -> dict[str, Any]:
        return self.params.build_key()

    def _matrix(self) -> np.ndarray:
        """A writable zero-copy view of faiss's vectors (valid until the next add)."""
        n = int(self._index.ntotal)
        if not n:
            return np.zeros((0, self.dim), np.float32)
        flat = self._faiss.downcast_index(self._index.storage)
        view: np.ndarray = self._faiss.rev_swig_ptr(flat.get_xb(), n * self.dim)
        return view.reshape(n, self.dim)

    def _append(self, vectors: np.ndarray) -> None:
        self._index.add(vectors)

    def _changed(self) -> None:
        self._live_bits = None

    def _search(
        self, q: np.ndarray, k: int, slots: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        p = self.params
        ef = max(p.ef_search, k)
        if slots is None:
            return self._graph(q, k, ef, self._live_bitmap() if self.tombstones else None)
        # Over-fetch: the best k allowed are, on average, within the best k / fraction of all.
        fetch = math.ceil(p.overfetch * k * self._live / slots.size)
        if slots.size <= p.exact_cost * max(ef, fetch) or fetch > self._live // 2:
            scores = _gather_dot(self._matrix(), slots, q)
            best = _topk(scores, k)
            return slots[best], scores[best]
        found, scores = self._graph(q, fetch, max(ef, fetch), None)
        pos = np.minimum(np.searchsorted(slots, found), slots.size - 1)
        keep = slots[pos] == found  # slots is sorted
        if int(keep.sum()) >= k:
            return found[keep][:k], scores[keep][:k]
        # Unlucky (the allowed lie away from the query): exact search, or a graph search
        # collecting allowed slots only, which visits about ef / fraction nodes.
        if slots.size <= p.exact_cost * ef * self._live / slots.size:
            scores = _gather_dot(self._matrix(), slots, q)
            best = _topk(scores, k)
            return slots[best], scores[best]
        mask = np.zeros(self._nslots, bool)
        mask[slots] = True
        return self._graph(q, k, ef, np.packbits(mask, bitorder="little"))

    def _graph(
        self, q: np.ndarray, k: int, ef: int, bits: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The graph search; ``bits``: a bitmap of the slots it may return."""
        params = self._faiss.SearchParametersHNSW()
        params.efSearch = ef
        if bits is not None:
            selector = self._faiss.IDSelectorBitmap(self._nslots, self._faiss.swig_ptr(bits))
            params.sel = selector
        dist, lab = self._index.search(q[None, :], k, params=params)
        found = lab[0] >= 0
        return lab[0][found].astype(np.int64), dist[0][found]

    def _live_bitmap(self) -> np.ndarray:
        if self._live_bits is None:
            live = self._slot_id[: self._nslots] >= 0
            self._live_bits = np.packbits(live, bitorder="little")
        return self._live_bits

    def _write_payload(self, f: IO[bytes]) -> None:
        self._faiss.write_index(self._index, self._faiss.PyCallbackIOWriter(f.write))

    def _read_payload(self, f: IO[bytes], header: dict[str, Any]) -> None:
        try:
            index = self._faiss.read_index(self._faiss.PyCallbackIOReader(f.read))
        except RuntimeError as exc:
            raise StorageError(f"corrupt HNSW payload: {exc}") from exc
        # read_index returns the concrete, owning IndexHNSWFlat (downcast_index would hand
        # back a non-owning view of an object about to be freed)
        shape = (int(index.ntotal), int(index.d))
        if not hasattr(index, "hnsw") or shape != (self._nslots, self.dim):
            raise StorageError("HNSW payload does not match its header")
        self._index = index


# -- auto ---------------------------------------------------------------------------------------


class AutoIndex(VectorIndex):
    """Exact below ``config.hnsw_from`` vectors, HNSW from there.

    The switch happens inside the ``add`` that reaches the threshold: it builds the graph
    from the exact index's vectors (5-17 s at 20,000 on two shared cores). It does not
    switch back when the index shrinks; :func:`open_index` rebuilds an exact one then.
    Without faiss it stays exact and logs a warning once, unless ``config.kind`` is
    ``hnsw``.
    """

    kind = "auto"

    def __init__(
        self, dim: int, config: IndexConfig | None = None, *, inner: VectorIndex | None = None
    ) -> None:
        super().__init__(dim)
        self.config = config or IndexConfig()
        if inner is None:
            kind = self.config.kind
            inner = HNSWIndex(dim, self.config.hnsw) if kind == "hnsw" else ExactIndex(dim)
        elif inner.dim != dim:
            raise ConfigError(f"an index of dim {inner.dim} cannot serve dim {dim}")
        self.inner: VectorIndex = inner
        """The index searched now (exact or HNSW)."""
        self._lock = threading.RLock()
        self._warned = False

    def add(self, ids: Ids, vectors: npt.ArrayLike) -> None:
        """Add (or replace) vectors, switching to HNSW at the threshold."""
        with self._lock:
            self.inner.add(ids, vectors)
            self._maybe_promote()

    def _maybe_promote(self) -> None:
        inner = self.inner
        if not isinstance(inner, ExactIndex) or self.config.kind == "exact":
            return
        if len(inner) < self.config.hnsw_from:
            return
        try:
            hnsw = HNSWIndex(self.dim, self.config.hnsw)
        except MissingDependencyError:
            if not self._warned:
                log.warning(
                    "%d vectors are searched exactly: install 'ctxkeep[hnsw]' for faster search",
                    len(inner),
                )
                self._warned = True
            return
        ids = inner.ids()
        for s in range(0, ids.size, _CHUNK):
            chunk = ids[s : s + _CHUNK]
            hnsw.add(chunk, inner.vectors(chunk))
        self.inner = hnsw

    def remove(self, ids: Ids) -> int:
        """Remove ids."""
        with self._lock:
            return self.inner.remove(ids)

    def search(
        self, query: npt.ArrayLike, k: int, allowed: Allowed = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best ids and scores."""
        with self._lock:
            inner = self.inner
        return inner.search(query, k, allowed)

    def __len__(self) -> int:
        return len(self.inner)

    def ids(self) -> np.ndarray:
        """The indexed ids, sorted."""
        return self.inner.ids()

    def vectors(self, ids: Ids) -> np.ndarray:
        """The stored vectors of ``ids``."""
        return self.inner.vectors(ids)

    @property
    def tombstones(self) -> int:
        """Removed slots still held by the index inside."""
        return self.inner.tombstones

    def save(self, path: str | os.PathLike[str], *, salt: str = "") -> None:
        """Save the index inside."""
        with self._lock:
            self.inner.save(path, salt=salt)


def make_index(dim: int, config: IndexConfig | None = None) -> VectorIndex:
    """A new empty index as ``config`` says (default: auto)."""
    config = config or IndexConfig()
    if config.kind == "exact":
        return ExactIndex(dim)
    if config.kind == "hnsw":
        return HNSWIndex(dim, config.hnsw)
    return AutoIndex(dim, config)


# -- files --------------------------------------------------------------------------------------


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of an index file (kind, dim, count, fingerprint, salt, build knobs).

    Raises:
        FileNotFoundError: no file.
        StorageError: not a ctxkeep index file.

    """
    with open(path, "rb") as f:
        return _header(f, Path(path))


def _header(f: IO[bytes], path: Path) -> dict[str, Any]:
    head = f.read(len(MAGIC) + _HEADER_LEN.size)
    if len(head) < len(MAGIC) + _HEADER_LEN.size or not head.startswith(MAGIC):
        raise StorageError(f"{path} is not a ctxkeep vector index: delete it to rebuild")
    (size,) = _HEADER_LEN.unpack(head[len(MAGIC) :])
    try:
        header: dict[str, Any] = json.loads(f.read(size))
    except ValueError as exc:
        raise StorageError(f"{path}: corrupt index header: delete it to rebuild") from exc
    if header.get("format") != FORMAT_VERSION or header.get("kind") not in _KINDS:
        raise StorageError(f"{path}: index format or kind this ctxkeep cannot read")
    return header


def _read(path: Path, config: IndexConfig) -> tuple[_SlotIndex, dict[str, Any]]:
    with open(path, "rb") as f:
        header = _header(f, path)
        dim = int(header["dim"])
        index: _SlotIndex = (
            HNSWIndex(dim, config.hnsw) if header["kind"] == "hnsw" else ExactIndex(dim)
        )
        try:
            index._restore(f, header)
        except (KeyError, ValueError) as exc:
            raise StorageError(f"{path}: corrupt index file: delete it to rebuild") from exc
    return index, header


_KINDS = ("exact", "hnsw")

Status = Literal["loaded", "synced", "rebuilt", "built"]


def open_index(
    path: str | os.PathLike[str],
    dim: int,
    ids: Ids,
    vectors: Callable[[np.ndarray], np.ndarray],
    *,
    config: IndexConfig | None = None,
    salt: str = "",
) -> tuple[VectorIndex, Status]:
    """The index persisted at ``path`` for a store holding ``ids``, made current.

    Args:
        path: the index file beside the store (written back unless ``loaded``).
        dim: vector length.
        ids: every id the store holds now.
        vectors: returns the vectors of the ids it is given (in that order); called in
            chunks, only for ids the file lacks.
        config: which index (default: auto).
        salt: anything besides the ids that must match (the embedder's name).

    Returns:
        The index and what was done: ``loaded`` (the file was current), ``synced`` (only
        ids changed: the missing were added, the gone removed), ``rebuilt`` (the file was
        unreadable, of another salt, dim or build, or of the wrong kind for its size) or
        ``built`` (no file).

    """
    config = config or IndexConfig()
    want = np.unique(_as_ids(ids))
    status: Status = "built"
    index: VectorIndex | None = None
    try:
        loaded, header = _read(Path(path), config)
    except FileNotFoundError:
        pass
    except (StorageError, MissingDependencyError) as exc:
        log.warning("rebuilding the vector index %s: %s", path, exc)
        status = "rebuilt"
    else:
        status = "rebuilt"
        if _fits(loaded, header, dim, salt, config, want.size):
            index = loaded if config.kind != "auto" else AutoIndex(dim, config, inner=loaded)
            if header["fingerprint"] == fingerprint(want, salt):
                return index, "loaded"
            status = "synced"
            have = index.ids()
            index.remove(np.setdiff1d(have, want, assume_unique=True))
            _fill(index, np.setdiff1d(want, have, assume_unique=True), vectors)
            if index.tombstones > len(index):
                index, status = None, "rebuilt"
    if index is None:
        index = make_index(dim, config)
        _fill(index, want, vectors)
    index.save(path, salt=salt)
    return index, status


def _fits(
    index: _SlotIndex, header: dict[str, Any], dim: int, salt: str, config: IndexConfig, n: int
) -> bool:
    """Whether a loaded index can serve ``config`` for ``n`` ids (else: rebuild)."""
    if index.dim != dim or header.get("salt") != salt:
        return False
    if index.kind == "hnsw" and header.get("build") != config.hnsw.build_key():
        return False
    if config.kind in ("exact", "hnsw"):
        return index.kind == config.kind
    if index.kind == "exact":
        return n < config.hnsw_from or not hnsw_available()
    return n >= config.hnsw_from // 2  # a graph is kept down to half the threshold


def _fill(index: VectorIndex, ids: np.ndarray, vectors: Callable[[np.ndarray], np.ndarray]) -> None:
    for s in range(0, ids.size, _CHUNK):
        chunk = ids[s : s + _CHUNK]
        index.add(chunk, vectors(chunk))


__all__ = [
    "Allowed",
    "AutoIndex",
    "ExactIndex",
    "HNSWIndex",
    "HNSWParams",
    "IndexConfig",
    "VectorIndex",
    "fingerprint",
    "hnsw_available",
    "make_index",
    "open_index",
    "read_header",
]

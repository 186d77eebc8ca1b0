"""HNSW search: a faiss ``IndexHNSWFlat`` graph (``pip install 'ctxkeep[hnsw]'``).

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

import importlib
import math
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from ctxkeep.episodic.index._base import _gather_dot, _SlotIndex, _topk, matvec
from ctxkeep.errors import MissingDependencyError, StorageError


@dataclass(frozen=True, kw_only=True)
class HNSWParams:
    """HNSW knobs (BENCHMARKS.md, e5-like vectors of dim 384, one query thread).

    With the defaults, 100,000 vectors are searched at recall@10 0.964 in 2.3 ms. At
    1,000,000 the same graph gives 0.80 at ef=128 (4.0 ms) and 0.92 at ef=384 (10.6 ms):
    raise ``ef_search`` for large stores. The stores ask for 200 candidates, so they search
    with ``ef`` >= 200 anyway.
    """

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

    @property
    def approximate(self) -> bool:
        """True: the graph search is approximate."""
        return True

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
            # A graph search whose ef covers every live vector visits them all (and the
            # tombstones): scoring them exactly is cheaper, and exact.
            if self._live <= ef:
                return self._exact_live(q, k)
            found, scores = self._graph(q, k, ef, self._live_bitmap() if self.tombstones else None)
            return self._enough(q, k, None, found, scores)
        # Over-fetch: the best k allowed are, on average, within the best k / fraction of all.
        fetch = math.ceil(p.overfetch * k * self._live / slots.size)
        if (
            slots.size <= p.exact_cost * max(ef, fetch)
            or fetch > self._live // 2
            or self._live <= ef
        ):
            return self._exact(q, k, slots)
        found, scores = self._graph(q, fetch, max(ef, fetch), None)
        pos = np.minimum(np.searchsorted(slots, found), slots.size - 1)
        keep = slots[pos] == found  # slots is sorted
        if int(keep.sum()) >= k:
            return found[keep][:k], scores[keep][:k]
        # Unlucky (the allowed lie away from the query): exact search, or a graph search
        # collecting allowed slots only, which visits about ef / fraction nodes.
        if slots.size <= p.exact_cost * ef * self._live / slots.size:
            return self._exact(q, k, slots)
        mask = np.zeros(self._nslots, bool)
        mask[slots] = True
        found, scores = self._graph(q, k, ef, np.packbits(mask, bitorder="little"))
        return self._enough(q, k, slots, found, scores)

    def _exact(self, q: np.ndarray, k: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scores = _gather_dot(self._matrix(), slots, q)
        best = _topk(scores, k)
        return slots[best], scores[best]

    def _exact_live(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact search of every live slot: one product over all slots, the removed ones
        (zeroed) kept out by their scores.
        """
        scores = matvec(self._matrix(), q)
        if self.tombstones:
            scores[self._slot_id[: self._nslots] < 0] = -np.inf
        best = _topk(scores, k)  # finite scores only
        return best, scores[best]

    def _enough(
        self,
        q: np.ndarray,
        k: int,
        slots: np.ndarray | None,
        found: np.ndarray,
        scores: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The graph's answer, or an exact one where it found fewer than it could.

        The graph can leave a node unreached (its in-links pruned while it was built, or
        taken by tombstones' zeroed vectors): a search that finds fewer than ``k`` of at
        least ``k`` candidates is done again exactly, so a search never comes back short.
        """
        available = self._live if slots is None else int(slots.size)
        if found.size >= min(k, available):
            return found, scores
        return self._exact_live(q, k) if slots is None else self._exact(q, k, slots)

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

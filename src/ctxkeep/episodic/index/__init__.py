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
"""

from ctxkeep.episodic.index._base import Allowed, Ids, VectorIndex, fingerprint
from ctxkeep.episodic.index.auto import (
    AutoIndex,
    IndexConfig,
    make_index,
    open_index,
    read_header,
    sync_index,
)
from ctxkeep.episodic.index.exact import ExactIndex
from ctxkeep.episodic.index.hnsw import HNSWIndex, HNSWParams, hnsw_available

__all__ = [
    "Allowed",
    "AutoIndex",
    "ExactIndex",
    "HNSWIndex",
    "HNSWParams",
    "Ids",
    "IndexConfig",
    "VectorIndex",
    "fingerprint",
    "hnsw_available",
    "make_index",
    "open_index",
    "read_header",
    "sync_index",
]

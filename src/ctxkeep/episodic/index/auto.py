"""Choosing an index by size (:class:`AutoIndex`) and keeping one beside a store (files)."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import numpy as np
import numpy.typing as npt

from ctxkeep.episodic.index._base import (
    _CHUNK,
    _HEADER_LEN,
    FORMAT_VERSION,
    MAGIC,
    Allowed,
    Ids,
    VectorIndex,
    _as_ids,
    _SlotIndex,
    fingerprint,
)
from ctxkeep.episodic.index.exact import ExactIndex
from ctxkeep.episodic.index.hnsw import HNSWIndex, HNSWParams, hnsw_available
from ctxkeep.errors import ConfigError, MissingDependencyError, StorageError, install_command

log = logging.getLogger("ctxkeep.episodic.index")


@dataclass(frozen=True, kw_only=True)
class IndexConfig:
    """Which index a store uses."""

    kind: Literal["auto", "exact", "hnsw"] = "auto"
    """``auto``: exact below ``hnsw_from`` vectors, HNSW from there (exact if faiss is
    missing); ``exact``; ``hnsw`` (faiss required)."""
    hnsw_from: int = 20_000
    """``auto`` switches to HNSW at this many vectors: there exact search took 3.9 ms and
    HNSW 1.3 ms (recall@10 0.996); at 10,000 exact took 0.7 ms, HNSW 0.9 ms (BENCHMARKS.md)."""
    hnsw: HNSWParams = field(default_factory=HNSWParams)
    """The HNSW knobs."""


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
                    "%d vectors are searched exactly: install the extra ctxkeep[hnsw] for "
                    "faster search (%s)",
                    len(inner),
                    install_command("hnsw"),
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

    @property
    def approximate(self) -> bool:
        """Whether the index inside is approximate (HNSW)."""
        return self.inner.approximate

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
            sync_index(index, want, vectors)
            if index.tombstones > len(index):
                index, status = None, "rebuilt"
    if index is None:
        index = make_index(dim, config)
        _fill(index, want, vectors)
    index.save(path, salt=salt)
    return index, status


def sync_index(
    index: VectorIndex, ids: Ids, vectors: Callable[[np.ndarray], np.ndarray]
) -> tuple[int, int]:
    """Make ``index`` hold exactly ``ids``: the others are removed, the missing added with
    ``vectors`` (called in chunks, only for them). Returns (added, removed).
    """
    want = np.unique(_as_ids(ids))
    have = index.ids()
    gone = np.setdiff1d(have, want, assume_unique=True)
    missing = np.setdiff1d(want, have, assume_unique=True)
    if gone.size:
        index.remove(gone)
    _fill(index, missing, vectors)
    return int(missing.size), int(gone.size)


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

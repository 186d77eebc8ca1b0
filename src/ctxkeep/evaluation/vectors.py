"""A disk cache of an embedder's vectors, so an evaluation embeds each text once.

Embedding is the slow part of an evaluation (e5-small embeds about 20 texts a second here:
LoCoMo's 5,882 turns and 1,986 questions take minutes), and trying several configurations or
mechanisms embeds the same texts again and again. :class:`DiskCachedEmbedder` keeps every
vector it computed in one ``.npz`` file, keyed by the kind (document or query) and a hash of
the text, and hands them back on the next run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ctxkeep.episodic.embedders import Embedder


class DiskCachedEmbedder:
    """An embedder whose document and query vectors are cached in an ``.npz`` file.

    The file is read when the cache is made and written by :meth:`save`; it belongs to one
    embedder (name it after it).
    """

    def __init__(self, inner: Embedder, path: str | Path) -> None:
        self.inner = inner
        """The embedder that computes what the cache lacks."""
        self.path = Path(path)
        """The ``.npz`` file."""
        self.name = inner.name
        self.dim = inner.dim
        self.cache: dict[str, np.ndarray] = {}
        """Vectors by key (``d`` or ``q`` and a hash of the text)."""
        if self.path.exists():
            with np.load(self.path) as z:
                self.cache = {k: z[k] for k in z.files}
        self.computed = 0
        """Texts embedded by the inner embedder since the cache was made."""

    @staticmethod
    def _key(kind: str, text: str) -> str:
        return kind + hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for stored texts; only unseen texts reach the inner embedder."""
        keys = [self._key("d", t) for t in texts]
        miss = [i for i, k in enumerate(keys) if k not in self.cache]
        if miss:
            vecs = self.inner.embed_documents([texts[i] for i in miss])
            self.computed += len(miss)
            for i, v in zip(miss, vecs, strict=True):
                self.cache[keys[i]] = np.asarray(v, np.float32)
        if not keys:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self.cache[k] for k in keys])

    def embed_query(self, text: str) -> np.ndarray:
        """The vector of a query, cached."""
        k = self._key("q", text)
        if k not in self.cache:
            self.cache[k] = np.asarray(self.inner.embed_query(text), np.float32)
            self.computed += 1
        return self.cache[k]

    def save(self) -> None:
        """Write the cache to its file (its folder is made if needed)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp.npz")
        np.savez(tmp, **self.cache)  # type: ignore[arg-type]
        tmp.replace(self.path)

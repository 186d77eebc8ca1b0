"""Episodic memory: past runs recalled by hybrid (lexical + dense) search, injected safely."""

from __future__ import annotations

from ctxkeep import _check
from ctxkeep.episodic.base import (
    Episode,
    EpisodicMemoryStore,
    Hit,
    RetrievalConfig,
    content_key,
)
from ctxkeep.episodic.embedders import (
    CachedEmbedder,
    E5SmallEmbedder,
    Embedder,
    HashEmbedder,
    OpenAIEmbedder,
    WordLlamaEmbedder,
    get_embedder,
)
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.index import HNSWParams, IndexConfig
from ctxkeep.episodic.inject import HEADER, format_prior_context, parse_prior_context
from ctxkeep.episodic.memory import MemoryEpisodicStore
from ctxkeep.errors import ConfigError


def open_episodic(
    url: str | None = None,
    embedder: str | Embedder = "local",
    *,
    config: RetrievalConfig | None = None,
    index: IndexConfig | None = None,
) -> EpisodicMemoryStore:
    """An episodic store for ``url`` (default: the embedded SQLite file) with ``embedder``
    (``local``, ``e5-small``, ``wordllama``, ``openai``, ``hash`` or an :class:`Embedder`;
    see :func:`get_embedder`), retrieval knobs ``config``
    and, for ``memory://`` and ``sqlite:///``, vector index knobs ``index`` (default: exact
    below 20,000 episodes, HNSW from there if ``ctxkeep[hnsw]`` is installed).

    Raises:
        ConfigError: an unsupported URL, or a file made with another embedder.
        InvalidTypeError: ``url`` is not a string or ``embedder`` not a name or an Embedder.

    """
    url = _check.optional_text("url", url)
    if not isinstance(embedder, str):
        _check.has_method("embedder", embedder, "embed_documents", "embedder name or Embedder")
    if url is None:
        from ctxkeep.sessions import default_url

        url = default_url()
    if url == "memory://":
        return MemoryEpisodicStore(embedder, config, index)
    if url.startswith("sqlite:///"):
        from ctxkeep.episodic.sqlite import SQLiteEpisodicStore

        path = url[len("sqlite:///") :].split("?", 1)[0]
        if not path:
            raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
        return SQLiteEpisodicStore(path, embedder, config, index)
    if url.startswith(("postgresql://", "postgres://")):
        from ctxkeep.episodic.postgres import PostgresEpisodicStore

        return PostgresEpisodicStore(url, embedder, config)
    raise ConfigError(
        f"unsupported episodic URL {url!r}; use memory://, sqlite:///path or postgresql://..."
    )


__all__ = [
    "HEADER",
    "CachedEmbedder",
    "E5SmallEmbedder",
    "Embedder",
    "Episode",
    "EpisodeFilter",
    "EpisodicMemoryStore",
    "HNSWParams",
    "HashEmbedder",
    "Hit",
    "IndexConfig",
    "MemoryEpisodicStore",
    "OpenAIEmbedder",
    "RetrievalConfig",
    "WordLlamaEmbedder",
    "content_key",
    "format_prior_context",
    "get_embedder",
    "open_episodic",
    "parse_prior_context",
]

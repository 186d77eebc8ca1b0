"""Episodic memory: past runs recalled by hybrid (lexical + dense) search, injected safely."""

from __future__ import annotations

from ctxkeep.episodic.base import Episode, EpisodicMemoryStore, Hit, RetrievalConfig
from ctxkeep.episodic.embedders import (
    CachedEmbedder,
    E5SmallEmbedder,
    Embedder,
    HashEmbedder,
    OpenAIEmbedder,
    get_embedder,
)
from ctxkeep.episodic.inject import HEADER, format_prior_context, parse_prior_context
from ctxkeep.episodic.memory import MemoryEpisodicStore
from ctxkeep.errors import ConfigError


def open_episodic(
    url: str = "memory://",
    embedder: str | Embedder = "local",
    *,
    config: RetrievalConfig | None = None,
) -> EpisodicMemoryStore:
    """An episodic store for ``url`` with ``embedder`` (``local``, ``openai``, ``hash`` or an
    :class:`Embedder`).

    Raises:
        ConfigError: an unsupported URL.

    """
    if url == "memory://":
        return MemoryEpisodicStore(embedder, config)
    raise ConfigError(f"unsupported episodic URL {url!r}; this version supports memory://")


__all__ = [
    "HEADER",
    "CachedEmbedder",
    "E5SmallEmbedder",
    "Embedder",
    "Episode",
    "EpisodicMemoryStore",
    "HashEmbedder",
    "Hit",
    "MemoryEpisodicStore",
    "OpenAIEmbedder",
    "RetrievalConfig",
    "format_prior_context",
    "get_embedder",
    "open_episodic",
    "parse_prior_context",
]

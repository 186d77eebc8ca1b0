"""Session memory over memory, SQLite, Redis and PostgreSQL.

:func:`open_memory` picks the backend from a URL and returns a :class:`MemoryManager`;
:func:`open_async_memory` returns its async twin.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from ctxkeep.errors import ConfigError, InvalidTypeError
from ctxkeep.sessions.aio import AsyncMemoryManager
from ctxkeep.sessions.base import (
    Backend,
    Evicted,
    EvictHook,
    MemoryConfig,
    MemoryManager,
    default_memory_config,
)
from ctxkeep.sessions.memory import MemoryBackend, SessionMemory
from ctxkeep.sessions.records import SessionInfo


def default_db_path() -> Path:
    """The embedded default database: ``$CTXKEEP_DB``, else ``ctxkeep.db`` in the user's
    data directory.
    """
    env = os.environ.get("CTXKEEP_DB")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("ctxkeep")) / "ctxkeep.db"


def default_url() -> str:
    """``sqlite:///`` + :func:`default_db_path`."""
    return f"sqlite:///{default_db_path()}"


def open_backend(url: str | None, config: MemoryConfig | None = None) -> Backend:
    """The storage primitives for a URL (``None``: the embedded default), without policy:
    use :func:`open_memory` for sessions with TTL, LRU and ``max_history``.

    Raises:
        ConfigError: an unsupported URL.
        MissingDependencyError: the extra for that backend is not installed.

    """
    url = url or default_url()
    if url == "memory://":
        return MemoryBackend()
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        from ctxkeep.sessions.sqlite import SQLiteBackend

        path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
        query = parse_qs(parsed.query)
        sync = query.get("synchronous", ["normal"])[0]
        mode = query.get("mode", ["rw"])[0]
        if mode not in ("ro", "rw"):
            raise ConfigError(f"sqlite URL mode must be ro or rw, got {mode!r}")
        return SQLiteBackend(path, synchronous=sync, read_only=mode == "ro")
    if parsed.scheme in ("redis", "rediss", "unix"):
        from ctxkeep.sessions.redis import RedisBackend

        return RedisBackend(url)
    if parsed.scheme in ("postgresql", "postgres"):
        from ctxkeep.sessions.postgres import PostgresBackend

        return PostgresBackend(url)
    raise ConfigError(
        f"unsupported memory URL {url!r}; use memory://, sqlite:///path, redis://host:port/db "
        "or postgresql://..."
    )


def open_memory(
    url: str | None = None,
    config: MemoryConfig | None = None,
    *,
    on_evict: EvictHook | None = None,
    clock: Callable[[], float] | None = None,
) -> MemoryManager:
    """A :class:`MemoryManager` for ``url`` (default: the embedded SQLite file).

    ``memory://`` gives a :class:`SessionMemory` (the same manager, with a TTL sweeper
    thread). ``clock`` replaces ``time.time`` for TTL and LRU decisions (tests, simulations).
    """
    if url is not None and not isinstance(url, str):
        raise InvalidTypeError(f"url must be a string, got {type(url).__name__}")
    if config is not None and not isinstance(config, MemoryConfig):
        raise InvalidTypeError(f"config must be a MemoryConfig, got {type(config).__name__}")
    if clock is not None and not callable(clock):
        raise InvalidTypeError("clock must be a function returning Unix time")
    config = config or default_memory_config()
    kwargs: dict[str, Any] = {"clock": clock} if clock is not None else {}
    if (url or default_url()) == "memory://":
        return SessionMemory(config=config, on_evict=on_evict, **kwargs)
    return MemoryManager(open_backend(url, config), config, on_evict=on_evict, **kwargs)


def open_async_memory(
    url: str | None = None,
    config: MemoryConfig | None = None,
    *,
    on_evict: EvictHook | None = None,
    clock: Callable[[], float] | None = None,
) -> AsyncMemoryManager:
    """The async twin of :func:`open_memory`."""
    return AsyncMemoryManager(open_memory(url, config, on_evict=on_evict, clock=clock))


__all__ = [
    "AsyncMemoryManager",
    "Backend",
    "EvictHook",
    "Evicted",
    "MemoryBackend",
    "MemoryConfig",
    "MemoryManager",
    "SessionInfo",
    "SessionMemory",
    "default_db_path",
    "default_memory_config",
    "open_async_memory",
    "open_memory",
]

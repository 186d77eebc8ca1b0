"""Checkpoints of agents' cognitive state over memory, SQLite, Redis and PostgreSQL."""

from __future__ import annotations

from urllib.parse import urlparse

from ctxkeep import _check
from ctxkeep.checkpoints.base import (
    Checkpoint,
    CheckpointStore,
    decode_checkpoint,
    encode_checkpoint,
)
from ctxkeep.checkpoints.memory import MemoryCheckpointStore
from ctxkeep.errors import ConfigError


def open_checkpoints(url: str | None = None) -> CheckpointStore:
    """A checkpoint store for ``url`` (default: the embedded SQLite file).

    Raises:
        ConfigError: an unsupported URL.
        InvalidTypeError: ``url`` is not a string (a ``TypeError``).

    """
    if url is None:
        from ctxkeep.sessions import default_url

        url = default_url()
    _check.url("url", url)
    if url == "memory://":
        return MemoryCheckpointStore()
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        from ctxkeep.checkpoints.sqlite import SQLiteCheckpointStore

        path = url[len("sqlite:///") :].split("?", 1)[0]
        if not path:
            raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
        return SQLiteCheckpointStore(path)
    if scheme in ("redis", "rediss", "unix"):
        from ctxkeep.checkpoints.redis import RedisCheckpointStore

        return RedisCheckpointStore(url)
    if scheme in ("postgresql", "postgres"):
        from ctxkeep.checkpoints.postgres import PostgresCheckpointStore

        return PostgresCheckpointStore(url)
    raise ConfigError(
        f"unsupported checkpoint URL {url!r}; use memory://, sqlite:///path, "
        "redis://host:port/db or postgresql://..."
    )


__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "MemoryCheckpointStore",
    "decode_checkpoint",
    "encode_checkpoint",
    "open_checkpoints",
]

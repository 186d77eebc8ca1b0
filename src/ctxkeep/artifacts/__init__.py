"""Artifact stores: where the full text of a compressed tool output lives.

Refs are content addressed (``sha256:<hex>`` of the UTF-8 text), so storing the same output
twice stores it once and a ref always names exactly one text (see :mod:`.base`). Stores:

* :class:`MemoryArtifactStore` (``memory://``): a dict, for one process.
* :class:`SQLiteArtifactStore` (``sqlite:///path.db``): one table in a SQLite file (WAL),
  shared by processes on one machine.
* :class:`DirectoryArtifactStore` (``file:///dir``): one file per artifact, written atomically.
* :class:`~ctxkeep.artifacts.redis.RedisArtifactStore` (``redis://...``, the ``redis`` extra)
  and :class:`~ctxkeep.artifacts.postgres.PostgresArtifactStore` (``postgresql://...``, the
  ``postgres`` extra): shared by workers on many machines.

:func:`open_artifacts` picks one from a URL. :data:`READ_ARTIFACT_TOOL` is a tool definition an
agent can be given so it can read a compressed output back; :func:`read_artifact_tool` answers
its calls.
"""

from __future__ import annotations

from urllib.parse import urlparse

from ctxkeep import _check
from ctxkeep.artifacts.base import REF_PREFIX, ArtifactStore, artifact_ref, check_ref, is_ref
from ctxkeep.artifacts.directory import DirectoryArtifactStore
from ctxkeep.artifacts.memory import MemoryArtifactStore
from ctxkeep.artifacts.sqlite import SQLiteArtifactStore
from ctxkeep.artifacts.tool import READ_ARTIFACT_TOOL, read_artifact_tool
from ctxkeep.errors import ConfigError

_check_ref = check_ref  # the name this module had before it became a package


def open_artifacts(url: str = "memory://") -> ArtifactStore:
    """An artifact store from a URL.

    Args:
        url: ``memory://``, ``sqlite:///path.db``, ``file:///dir``,
            ``redis://host:port/db[?prefix=...]`` (also ``rediss://``, ``unix://``) or
            ``postgresql://...``.

    Raises:
        ConfigError: an unsupported URL.
        MissingDependencyError: the extra for that backend is not installed (an ``ImportError``
            naming it: ``pip install 'ctxkeep[redis]'`` or ``'ctxkeep[postgres]'``).
        InvalidTypeError: ``url`` is not a string (a ``TypeError``).

    """
    _check.url("url", url)
    if url == "memory://":
        return MemoryArtifactStore()
    scheme = urlparse(url).scheme
    if scheme == "sqlite" and url.startswith("sqlite:///"):
        return SQLiteArtifactStore(url[len("sqlite:///") :].split("?", 1)[0] or "ctxkeep.db")
    if scheme == "file":
        return DirectoryArtifactStore(url[len("file://") :])
    if scheme in ("redis", "rediss", "unix"):
        from ctxkeep.artifacts.redis import RedisArtifactStore

        return RedisArtifactStore(url)
    if scheme in ("postgresql", "postgres"):
        from ctxkeep.artifacts.postgres import PostgresArtifactStore

        return PostgresArtifactStore(url)
    raise ConfigError(
        f"unsupported artifact store URL {url!r}; use memory://, sqlite:///path, file:///dir, "
        "redis://host:port/db or postgresql://..."
    )


def as_artifact_store(value: ArtifactStore | str | None) -> ArtifactStore:
    """An artifact store from what a caller passed for one: a store (used as is), an
    :func:`open_artifacts` URL, or None (a new in-memory store).

    Raises:
        InvalidTypeError: anything else (a ``TypeError``).
        ConfigError / MissingDependencyError: as :func:`open_artifacts`, for a URL.

    """
    if value is None:
        return MemoryArtifactStore()
    if isinstance(value, str):
        return open_artifacts(value)
    store: ArtifactStore = _check.instance(
        "artifacts", value, ArtifactStore, "an ArtifactStore or a URL"
    )
    return store


__all__ = [
    "READ_ARTIFACT_TOOL",
    "REF_PREFIX",
    "ArtifactStore",
    "DirectoryArtifactStore",
    "MemoryArtifactStore",
    "SQLiteArtifactStore",
    "artifact_ref",
    "as_artifact_store",
    "check_ref",
    "is_ref",
    "open_artifacts",
    "read_artifact_tool",
]

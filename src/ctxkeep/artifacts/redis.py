"""Artifacts in Redis (``redis://host:port/db``), shared by workers on many machines.

Layout. Every key starts with a prefix (``ctxkeep:`` by default; ``?prefix=`` in the URL or
the ``prefix`` argument overrides it) and is named by :class:`RedisArtifactKeys`:

=========================  ======  ==================================================
key                        type    holds
=========================  ======  ==================================================
``artifact:{sha256 hex}``  string  the artifact's text, exactly (UTF-8)
``meta``                   hash    field ``artifacts``: the layout's schema version
=========================  ======  ==================================================

The connection, error translation and schema versions are ``ctxkeep._redis.RedisClient``'s.

A put is one ``SET ... NX``: atomic and idempotent, the first writer of a text wins and every
later one (of the same text, by construction of the key) changes nothing. One key per artifact
lets an operator expire or evict artifacts one by one.

Durability depends on the server's persistence settings (see ``ctxkeep.sessions.redis``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from ctxkeep._redis import DEFAULT_PREFIX, Migration, RedisClient
from ctxkeep.artifacts.base import REF_PREFIX, ArtifactStore

# Position i brings the key space from layout version i to i + 1. Version 1 is the layout in
# the module docstring; its keys are created as artifacts are stored, so there is nothing to do.
MIGRATIONS: list[Migration] = [
    lambda client: None,
]


@dataclass(frozen=True)
class RedisArtifactKeys:
    """The name of every key the artifact store uses, under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def artifact(self, ref: str) -> str:
        """One artifact's text."""
        return f"{self.prefix}artifact:{ref[len(REF_PREFIX) :]}"


class RedisArtifactStore(ArtifactStore):
    """Artifacts in Redis, under one key prefix.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS,
            ``unix:///path.sock``), optionally with ``?prefix=...`` for the keys.
        prefix: the key prefix (default: the URL's ``?prefix=``, else ``ctxkeep:``).

    Raises:
        ConfigError: a bad URL or prefix.
        StorageError: Redis does not answer.
        SchemaVersionError: the prefix holds artifacts written by a newer ctxkeep.

    """

    name = "redis"

    def __init__(self, url: str, *, prefix: str | None = None) -> None:
        self.db = RedisClient(url, prefix=prefix, meta_key="artifacts", migrations=MIGRATIONS)
        self.keys = RedisArtifactKeys(self.db.prefix)

    @property
    def where(self) -> str:
        """The server and the key prefix."""
        return f"Redis at {self.db.where} under {self.keys.prefix!r}"

    def _put(self, ref: str, text: str) -> None:
        with self.db.errors():
            self.db.conn.set(self.keys.artifact(ref), text, nx=True)

    def _put_many(self, items: dict[str, str]) -> None:
        """Every ``SET NX`` in one pipeline (one round trip)."""
        with self.db.errors():
            pipe = self.db.conn.pipeline(transaction=False)
            for ref, text in items.items():
                pipe.set(self.keys.artifact(ref), text, nx=True)
            pipe.execute()

    def _get(self, ref: str) -> str | None:
        with self.db.errors():
            return cast("str | None", self.db.conn.get(self.keys.artifact(ref)))

    def _has(self, ref: str) -> bool:
        with self.db.errors():
            return bool(self.db.conn.exists(self.keys.artifact(ref)))

    def close(self) -> None:
        """Close the connection pool."""
        self.db.close()

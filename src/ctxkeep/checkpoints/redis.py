"""Checkpoints in Redis (``redis://host:port/db``), shared by processes on many machines.

Layout. Every key starts with a prefix (``ctxkeep:`` by default; ``?prefix=`` in the URL or
the ``prefix`` argument overrides it) and is named by :class:`RedisCheckpointKeys`, the one
place that knows the layout:

============================  ======  ========================================================
key                           type    holds
============================  ======  ========================================================
``checkpoint:{id}``           string  the checkpoint's record (JSON, see ``base.py``)
``checkpoints:{agent_id}``    zset    the agent's checkpoint ids scored by seq
``checkpoint-seq:{agent_id}`` string  the agent's highest seq
``meta``                      hash    field ``checkpoints``: the layout's schema version
``schema:checkpoints``        string  the same version, as releases before ``meta`` kept it
============================  ======  ========================================================

The connection, error translation and schema versions are ``ctxkeep._redis.RedisClient``'s.

Atomicity. A save ``WATCH``-es the agent's seq key, reads it, and writes the seq, the record and
the index entry in one ``MULTI``/``EXEC``; if another writer saved meanwhile, ``EXEC`` fails and
the save is retried with the next seq. Sequence numbers stay gapless and unique under any number
of writers, and a record is never visible without its index entry.

Durability: what survives a restart of the Redis server depends on its persistence settings
(see ``ctxkeep.sessions.redis``); on the project's machines Redis keeps nothing across a
restart. Keep checkpoints that must outlive the server in SQLite or PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

from ctxkeep._redis import DEFAULT_PREFIX, Migration, Pipeline, RedisClient, translated
from ctxkeep.checkpoints.base import Checkpoint, CheckpointStore, encode_checkpoint

# Position i brings the key space from layout version i to i + 1. Version 1 is the layout in
# the module docstring; its keys are created as checkpoints are saved, so there is nothing to do.
MIGRATIONS: list[Migration] = [
    lambda client: None,
]
SCHEMA_VERSION = len(MIGRATIONS)


# -- the layout, free of I/O ------------------------------------------------------------------


@dataclass(frozen=True)
class RedisCheckpointKeys:
    """The name of every key the checkpoint store uses, under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def record(self, checkpoint_id: str) -> str:
        """One checkpoint's JSON record."""
        return f"{self.prefix}checkpoint:{checkpoint_id}"

    def index(self, agent_id: str) -> str:
        """The agent's checkpoint ids, a zset scored by seq."""
        return f"{self.prefix}checkpoints:{agent_id}"

    def seq(self, agent_id: str) -> str:
        """The agent's highest seq."""
        return f"{self.prefix}checkpoint-seq:{agent_id}"


# -- the store --------------------------------------------------------------------------------


class RedisCheckpointStore(CheckpointStore):
    """Checkpoints in Redis, under one key prefix.

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS,
            ``unix:///path.sock``), optionally with ``?prefix=...`` for the keys.
        prefix: the key prefix (default: the URL's ``?prefix=``, else ``ctxkeep:``).

    Raises:
        StorageError: Redis does not answer.
        SchemaVersionError: the prefix holds checkpoints written by a newer ctxkeep.

    """

    name = "redis"

    def __init__(self, url: str, *, prefix: str | None = None) -> None:
        self.db = RedisClient(
            url,
            prefix=prefix,
            meta_key="checkpoints",
            migrations=MIGRATIONS,
            legacy_schema_key=True,
        )
        self.keys = RedisCheckpointKeys(self.db.prefix)
        self.where = self.db.where

    @translated
    def _put(self, cp: Checkpoint) -> str:
        keys = self.keys

        def body(pipe: Pipeline) -> None:
            raw = pipe.get(keys.seq(cp.agent_id))
            seq = int(cast(str, raw)) + 1 if raw is not None else 1
            text = encode_checkpoint(replace(cp, seq=seq))
            pipe.multi()
            pipe.set(keys.seq(cp.agent_id), seq)
            pipe.set(keys.record(cp.checkpoint_id), text)
            pipe.zadd(keys.index(cp.agent_id), {cp.checkpoint_id: seq})

        self.db.atomic([keys.seq(cp.agent_id)], body)
        return cp.checkpoint_id

    @translated
    def _get(self, checkpoint_id: str) -> str | None:
        return cast("str | None", self.db.conn.get(self.keys.record(checkpoint_id)))

    @translated
    def _history(self, agent_id: str, limit: int) -> list[str]:
        if limit <= 0:
            return []
        ids = cast("list[str]", self.db.conn.zrevrange(self.keys.index(agent_id), 0, limit - 1))
        if not ids:
            return []
        texts = cast("list[Any]", self.db.conn.mget([self.keys.record(i) for i in ids]))
        return [t for t in texts if t is not None]

    def _latest(self, agent_id: str) -> str | None:
        texts = self._history(agent_id, 1)
        return texts[0] if texts else None

    def close(self) -> None:
        """Close the connection pool."""
        self.db.close()

"""A task's shared state for agent processes on many machines, in Redis.

:class:`RedisTaskState` is the cross-process counterpart of the fabric's ``TASK_SHARED`` layer:
one hash per task (``{prefix}fabric:task:{task}``, named by
:class:`~ctxkeep.fabric.redis_bus.RedisBusKeys`) holding ``version``, ``schema`` and one
``data:{key}`` field per entry (JSON). Every write bumps the version inside ``WATCH``/``MULTI``:
:meth:`RedisTaskState.update` is compare-and-set and refuses a write based on an old version
(:class:`~ctxkeep.errors.StaleTaskStateError`), like ``ContextFabric.update_task_context``;
:meth:`RedisTaskState.update_with` re-reads and retries instead.

Versions: the layout's version under a prefix is field ``fabric`` of ``{prefix}meta`` (kept by
``ctxkeep._redis.RedisClient``, which owns the connection too); each hash also carries the
version of its own fields (``schema``), so a hash written by a newer ctxkeep is refused even on
a prefix opened by an older one.

Exactly-once handling: ``update_with(change, once=bus.handled_mark(agent, message.id))``
commits the change and the bus's handled mark in one transaction, and writes nothing if the
mark is already set, so a message redelivered after its effect was committed (its consumer died
before acking) is not applied twice, and one redelivered before is applied once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from ctxkeep import _check
from ctxkeep._redis import Migration, Pipeline, RedisClient, translated
from ctxkeep.errors import CorruptRecordError, SchemaVersionError, StaleTaskStateError
from ctxkeep.fabric.jsondata import check_json, json_copy
from ctxkeep.fabric.redis_bus import HandledMark, RedisBusKeys, check_name

if TYPE_CHECKING:
    from redis.typing import EncodableT, FieldT

TASK_STATE_VERSION = 1
"""The schema version of a task-state hash (field ``schema``)."""

# Position i brings the task states under a prefix from layout version i to i + 1 (their
# version in ``{prefix}meta``, field ``fabric``). Version 1 is the layout in the module
# docstring; its hashes are created as tasks are written, so there is nothing to do.
MIGRATIONS: list[Migration] = [
    lambda client: None,
]


class RedisTaskState:
    """A task's shared state for agents in many processes: a Redis hash with a version.

    Writes are compare-and-set: :meth:`update` refuses a write based on an old version
    (:class:`~ctxkeep.errors.StaleTaskStateError`), :meth:`update_with` re-reads and retries.
    Values must be JSON data. Only what is written here is shared; an agent's private layer
    never goes here.

    Args:
        url: the Redis URL (the same server as the bus to commit handled marks with effects).
        task_id: the task.
        prefix: the key prefix (default: the URL's ``?prefix=``, else ``ctxkeep:``).

    Raises:
        StorageError: Redis does not answer.
        SchemaVersionError: the prefix holds task states written by a newer ctxkeep.

    """

    def __init__(self, url: str, task_id: str, *, prefix: str | None = None) -> None:
        check_name("task_id", task_id)
        self.db = RedisClient(url, prefix=prefix, meta_key="fabric", migrations=MIGRATIONS)
        self.keys = RedisBusKeys(self.db.prefix)
        self.where = self.db.where
        self.task_id = task_id
        self.key = self.keys.task_state(task_id)

    def _decode(self, fields: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        schema = int(fields.get("schema", TASK_STATE_VERSION))
        if schema > TASK_STATE_VERSION:
            raise SchemaVersionError(
                f"task state {self.key!r} has schema {schema}, newer than this ctxkeep reads "
                f"({TASK_STATE_VERSION}); upgrade ctxkeep"
            )
        data: dict[str, Any] = {}
        for k, v in fields.items():
            if k.startswith("data:"):
                data[k[5:]] = self._decode_value(k, v)
        return int(fields.get("version", 0)), data

    def _decode_value(self, field: str, text: str) -> Any:
        """One stored value, if it keeps the fabric's rule for JSON data (a state stored before
        the rule was checked at write may not: it is refused by name, never handed on to fail
        in a reader's serializer).
        """
        where = f"task state {self.key!r}, field {field!r}"
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecordError(f"{where} is not JSON: {exc}") from None
        check_json(where, value, error=CorruptRecordError)
        return value

    @staticmethod
    def _encode(changes: Mapping[str, Any]) -> dict[FieldT, EncodableT]:
        """The hash fields of ``changes``, checked by the fabric's one rule for JSON data
        before anything is written (a state Redis stores but no reader can be handed, such as
        one nested 600 deep, would answer every later read with an error).
        """
        data = json_copy("changes", _check.mapping("changes", changes))
        out: dict[FieldT, EncodableT] = {}
        for k, v in data.items():
            _check.text("a task state key", k)
            out[f"data:{k}"] = json.dumps(v)
        return out

    @translated
    def read(self) -> tuple[int, dict[str, Any]]:
        """``(version, a copy of the state)``; version 0 for a task never written.

        Raises:
            CorruptRecordError: a stored value that is not JSON data the fabric can deliver.
            SchemaVersionError: a state written by a newer ctxkeep.

        """
        return self._decode(cast("dict[str, str]", self.db.conn.hgetall(self.key)))

    def _write(self, pipe: Pipeline, version: int, encoded: dict[FieldT, EncodableT]) -> int:
        fields: dict[FieldT, EncodableT] = {
            **encoded,
            "version": version + 1,
            "schema": TASK_STATE_VERSION,
        }
        pipe.multi()
        pipe.hset(self.key, mapping=fields)
        return version + 1

    @translated
    def update(self, changes: Mapping[str, Any], *, expected_version: int) -> int:
        """Merge ``changes`` only if the state is still at ``expected_version``.

        Returns:
            The new version.

        Raises:
            StaleTaskStateError: someone wrote since ``expected_version`` was read.
            InvalidTypeError: ``changes`` is not a mapping with string keys, a value is not
                JSON data (:func:`~ctxkeep.fabric.jsondata.json_copy`: also a lone surrogate or
                nesting deeper than ``MAX_DEPTH``), or ``expected_version`` is not an int (a
                ``TypeError``; nothing is written).

        """
        encoded = self._encode(changes)
        _check.integer("expected_version", expected_version, minimum=0)

        def body(pipe: Pipeline) -> int:
            version, _ = self._decode(cast("dict[str, str]", pipe.hgetall(self.key)))
            if version != expected_version:
                raise StaleTaskStateError(self.task_id, expected_version, version)
            return self._write(pipe, version, encoded)

        return self.db.atomic([self.key], body)

    @translated
    def update_with(
        self,
        change: Callable[[dict[str, Any]], Mapping[str, Any] | None],
        *,
        once: HandledMark | None = None,
    ) -> int | None:
        """Read, compute ``change(state)``, and write it unless someone wrote meanwhile, in
        which case start over (so ``change`` may run more than once: keep it pure). With
        ``once``, the mark is committed with the change, and if it is already set nothing is
        written (the message was handled before).

        Returns:
            The new version, or None if nothing was written.

        """
        _check.has_method("change", change, "__call__", "function")
        _check.instance("once", once, (HandledMark, type(None)), "a HandledMark or None")

        def body(pipe: Pipeline) -> int | None:
            if once is not None and once.is_set(pipe):
                return None
            version, data = self._decode(cast("dict[str, str]", pipe.hgetall(self.key)))
            changes = change(data)
            if not changes and once is None:
                return None
            new = self._write(pipe, version, self._encode(changes or {}))
            if once is not None:
                once.queue(pipe)
            return new

        watch = [self.key] if once is None else [self.key, once.key]
        return self.db.atomic(watch, body)

    def close(self) -> None:
        """Close the connection pool."""
        self.db.close()

"""A task's shared state on PostgreSQL, for agent processes on many machines.

:class:`PostgresTaskState` is the PostgreSQL counterpart of ``ctxkeep.fabric.redis_state``:
one row of ``ctxkeep_fabric_tasks`` per task (see ``ctxkeep.fabric.postgres_sql``) with a
version; every write locks the row (``SELECT ... FOR UPDATE``) and bumps the version, so
:meth:`PostgresTaskState.update` is compare-and-set (a write based on an old version is refused
with :class:`~ctxkeep.errors.StaleTaskStateError`; of two racing writers exactly one wins) and
:meth:`PostgresTaskState.update_with` reads and writes under the lock instead.

Exactly-once handling: ``update_with(change, once=bus.handled_mark(agent, message.id))``
commits the change and the bus's handled mark (:class:`PgHandledMark`) in one transaction, and
writes nothing if the mark is already set.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxkeep import _check
from ctxkeep._pg import PgClient
from ctxkeep.errors import CorruptRecordError, SchemaVersionError, StaleTaskStateError
from ctxkeep.fabric.jsondata import check_json, json_copy
from ctxkeep.fabric.postgres_sql import META_KEY, MIGRATIONS, TASK_STATE_VERSION, check_name


@dataclass(frozen=True)
class PgHandledMark:
    """The mark that says ``agent_id`` handled ``message_id``, to commit with an effect in
    the same transaction (:meth:`PostgresTaskState.update_with`).
    """

    agent_id: str
    """The agent."""
    message_id: str
    """The message handled."""

    def set(self, conn: Any) -> bool:
        """Set the mark in ``conn``'s transaction; False if it was already set (then the
        caller writes nothing). A concurrent setter of the same mark waits for this
        transaction and then finds it set.
        """
        cur = conn.execute(
            "INSERT INTO ctxkeep_bus_handled (agent_id, message_id, handled_at) "
            "VALUES (%s, %s, clock_timestamp()) ON CONFLICT DO NOTHING",
            (self.agent_id, self.message_id),
        )
        return bool(cur.rowcount)

    def is_set(self, conn: Any) -> bool:
        """Whether the mark is there."""
        row = conn.execute(
            "SELECT 1 FROM ctxkeep_bus_handled WHERE agent_id = %s AND message_id = %s",
            (self.agent_id, self.message_id),
        ).fetchone()
        return row is not None


class PostgresTaskState:
    """A task's shared state for agents in many processes: a row with a version.

    Writes are compare-and-set: :meth:`update` refuses a write based on an old version
    (:class:`~ctxkeep.errors.StaleTaskStateError`), :meth:`update_with` reads and writes under
    the row's lock. Values must be JSON data. Only what is written here is shared; an agent's
    private layer never goes here.

    Args:
        url: a libpq URI (the same schema as the bus, to commit handled marks with effects).
        task_id: the task.
        db: a client to share (:meth:`PostgresBus.task_state` passes the bus's; it is not
            closed by :meth:`close`); by default the state opens its own.

    Raises:
        StorageError: PostgreSQL does not answer.
        SchemaVersionError: the schema holds fabric tables of a newer ctxkeep.

    """

    def __init__(self, url: str, task_id: str, *, db: PgClient | None = None) -> None:
        check_name("task_id", task_id)
        self.task_id = task_id
        self._owned = db is None
        self.db = db if db is not None else PgClient(
            url, name="ctxkeep-fabric", meta_key=META_KEY, migrations=MIGRATIONS, max_size=2
        )  # fmt: skip
        self.where = self.db.where

    def close(self) -> None:
        """Close the connection pool (if this state opened it)."""
        if self._owned:
            self.db.close()

    # -- the stored form -----------------------------------------------------------------

    def _decode(self, row: tuple[int, int, str] | None) -> tuple[int, dict[str, Any]]:
        if row is None:
            return 0, {}
        version, schema, text = row
        where = f"task state {self.task_id!r}"
        if schema > TASK_STATE_VERSION:
            raise SchemaVersionError(
                f"{where} has schema {schema}, newer than this ctxkeep reads "
                f"({TASK_STATE_VERSION}); upgrade ctxkeep"
            )
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecordError(f"{where} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise CorruptRecordError(f"{where} is not a JSON object")
        for key, value in data.items():
            check_json(f"{where}, key {key!r}", value, error=CorruptRecordError)
        return int(version), data

    @staticmethod
    def _encode(name: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``changes``, checked by the fabric's one rule for JSON data before
        anything is written.
        """
        return json_copy(name, _check.mapping(name, changes))  # type: ignore[no-any-return]

    def _locked(self, conn: Any) -> tuple[int, dict[str, Any]]:
        """The state, its row locked until the transaction ends (created at version 0 if the
        task has none; rolled back with the transaction if nothing is written).
        """
        conn.execute(
            "INSERT INTO ctxkeep_fabric_tasks (task_id, version, schema_version, data) "
            "VALUES (%s, 0, %s, '{}') ON CONFLICT (task_id) DO NOTHING",
            (self.task_id, TASK_STATE_VERSION),
        )
        row = conn.execute(
            "SELECT version, schema_version, data FROM ctxkeep_fabric_tasks "
            "WHERE task_id = %s FOR UPDATE",
            (self.task_id,),
        ).fetchone()
        return self._decode(row)

    def _write(self, conn: Any, version: int, data: dict[str, Any]) -> int:
        conn.execute(
            "UPDATE ctxkeep_fabric_tasks SET version = %s, schema_version = %s, data = %s "
            "WHERE task_id = %s",
            (version + 1, TASK_STATE_VERSION, json.dumps(data, allow_nan=False), self.task_id),
        )
        return version + 1

    # -- reads and writes ----------------------------------------------------------------

    def read(self) -> tuple[int, dict[str, Any]]:
        """``(version, a copy of the state)``; version 0 for a task never written.

        Raises:
            CorruptRecordError: a stored value that is not JSON data the fabric can deliver.
            SchemaVersionError: a state written by a newer ctxkeep.

        """
        rows = self.db.q(
            "read a task state",
            "SELECT version, schema_version, data FROM ctxkeep_fabric_tasks WHERE task_id = %s",
            (self.task_id,),
        )
        return self._decode(rows[0] if rows else None)

    def update(self, changes: Mapping[str, Any], *, expected_version: int) -> int:
        """Merge ``changes`` only if the state is still at ``expected_version``.

        Returns:
            The new version.

        Raises:
            StaleTaskStateError: someone wrote since ``expected_version`` was read.
            InvalidTypeError: ``changes`` is not a mapping with string keys, a value is not
                JSON data, or ``expected_version`` is not an int (nothing is written).

        """
        data = self._encode("changes", changes)
        _check.integer("expected_version", expected_version, minimum=0)
        with self.db.tx("update a task state") as conn:
            version, current = self._locked(conn)
            if version != expected_version:
                raise StaleTaskStateError(self.task_id, expected_version, version)
            return self._write(conn, version, {**current, **data})

    def update_with(
        self,
        change: Callable[[dict[str, Any]], Mapping[str, Any] | None],
        *,
        once: PgHandledMark | None = None,
    ) -> int | None:
        """Read under the row's lock, compute ``change(state)`` and write it. With ``once``,
        the mark is committed with the change, and if it is already set nothing is written
        (the message was handled before). Keep ``change`` pure.

        Returns:
            The new version, or None if nothing was written.

        """
        _check.has_method("change", change, "__call__", "function")
        _check.instance("once", once, (PgHandledMark, type(None)), "a PgHandledMark or None")
        with self.db.tx("update a task state") as conn:
            if once is not None and not once.set(conn):
                return None
            version, current = self._locked(conn)
            changes = change(current)
            if not changes and once is None:
                return None
            data = self._encode("changes", changes or {})
            return self._write(conn, version, {**current, **data})

    def join(self, state: Mapping[str, Any]) -> int:
        """The rule of ``ContextFabric.set_task_context`` for a joining agent: a task never
        written starts from ``state`` (version 1; 0 if ``state`` is empty); joining an
        existing task may only repeat what it holds. Returns the task's version.

        Raises:
            StaleTaskStateError: the task exists and ``state`` would change it.

        """
        data = self._encode("state", state)
        with self.db.tx("join a task") as conn:
            version, current = self._locked(conn)
            if all(k in current and current[k] == v for k, v in data.items()):
                return version
            if version != 0:
                raise StaleTaskStateError(self.task_id, 0, version)
            return self._write(conn, version, {**current, **data})

"""A tenant's context fabric behind the service: task-shared state and the inter-agent bus.

The routes (:mod:`ctxkeep.server.routes_fabric`) speak to a :class:`TenantFabric`, one per
tenant, which is one of three things depending on the server's storage URL:

* :class:`LocalFabric` (``memory://``, ``sqlite:///``): the library's
  :class:`~ctxkeep.ContextFabric` with its :class:`~ctxkeep.InProcessBus`, held by the server
  process. Task state and queued messages live as long as that process: they are neither
  durable nor shared by several server processes (ctxkeep has no task-state or bus store on
  SQLite), so a SQLite server is one process.
* :class:`RedisFabric` (``redis://``): :class:`~ctxkeep.fabric.redis_state.RedisTaskState`
  and :class:`~ctxkeep.fabric.redis_bus.RedisStreamBus` under the tenant's key prefix, shared
  by every server process.
* :class:`PostgresFabric` (``postgresql://``):
  :class:`~ctxkeep.fabric.postgres_state.PostgresTaskState` and
  :class:`~ctxkeep.fabric.postgres.PostgresBus` in the tenant's schema, shared by every server
  process.

On Redis and PostgreSQL every server process is one consumer of the agents' inboxes
(:data:`SERVICE_CONSUMER`): a message a client received is pending for the service, not for
the worker that answered the receive, so an ack or a ``recover`` settles or replays it
whichever worker takes it, and N processes behind a load balancer answer as one.

All three give the same answers through the same checks: an agent joins a task (a new task starts
from the state given; joining an existing one may only repeat what it holds), reads the
task's shared state with its version, changes it by compare-and-set
(:class:`~ctxkeep.errors.StaleTaskStateError` when someone wrote since), subscribes to topics,
sends, receives (messages stay pending until acked) and acks, and reads and deletes its dead
letters (stored messages that could not be delivered, moved aside so the rest flow). An agent
that has joined no task is unknown (:class:`~ctxkeep.errors.UnknownAgentError`) to every call
but join and send's ``recipient``. An agent's private layer never crosses the service.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ctxkeep import _check
from ctxkeep.errors import StaleTaskStateError, UnknownAgentError
from ctxkeep.fabric import ContextFabric, IPCMessage
from ctxkeep.fabric.bus import DeadLetter, MessageBus
from ctxkeep.fabric.jsondata import json_copy

if TYPE_CHECKING:
    from ctxkeep.fabric.postgres import PostgresBus
    from ctxkeep.fabric.redis_bus import RedisStreamBus
    from ctxkeep.fabric.redis_state import RedisTaskState


@dataclass(frozen=True)
class TaskState:
    """A task's shared state as one agent sees it."""

    task_id: str
    """The task."""
    version: int
    """The state's version (0: never written)."""
    state: dict[str, Any]
    """A copy of the state."""


def _thaw(value: Any) -> Any:
    """Plain JSON data from a :func:`~ctxkeep.fabric.freeze` snapshot."""
    if isinstance(value, Mapping | MappingProxyType):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_thaw(v) for v in value]
    return value


def json_state(name: str, mapping: Any) -> dict[str, Any]:
    """``mapping`` (a task state or changes) if it is a mapping of strings to JSON data that
    every backend stores and every response can carry
    (:func:`~ctxkeep.fabric.jsondata.json_copy`), copied.

    Raises:
        InvalidTypeError: anything else (nothing is stored).

    """
    copied: dict[str, Any] = json_copy(name, _check.mapping(name, mapping))
    return copied


def _unknown(agent_id: str) -> UnknownAgentError:
    return UnknownAgentError(
        f"agent {agent_id!r} has joined no task; join one first "
        "(PUT /v1/fabric/agents/{agent_id}/task)"
    )


class TenantFabric(ABC):
    """One tenant's task states and bus (see the module docstring)."""

    @abstractmethod
    def join(self, agent_id: str, task_id: str, state: Mapping[str, Any]) -> TaskState:
        """Bind ``agent_id`` to ``task_id``; a new task starts from ``state``.

        Raises:
            StaleTaskStateError: the task exists and ``state`` would change it.

        """

    @abstractmethod
    def read(self, agent_id: str) -> TaskState:
        """The shared state of the agent's task.

        Raises:
            UnknownAgentError: the agent has joined no task.

        """

    @abstractmethod
    def update(self, agent_id: str, changes: Mapping[str, Any], expected_version: int) -> TaskState:
        """Merge ``changes`` into the agent's task state if it is still at
        ``expected_version``.

        Raises:
            StaleTaskStateError: someone wrote since.
            UnknownAgentError: the agent has joined no task.

        """

    bus: MessageBus
    """The tenant's bus (every bus method below checks the agent has joined a task first)."""

    @abstractmethod
    def _task(self, agent_id: str) -> str:
        """The agent's task id.

        Raises:
            UnknownAgentError: the agent has joined no task.

        """

    def subscribe(self, agent_id: str, topic: str) -> None:
        """Deliver ``topic`` messages of the agent's task to it."""
        self._task(agent_id)
        self.bus.subscribe(agent_id, topic)

    def send(
        self, sender: str, payload: Any, *, recipient: str | None, topic: str | None
    ) -> IPCMessage:
        """Send from ``sender`` (within its task); returns the message sent."""
        message = IPCMessage(
            sender=sender,
            payload=payload,
            task_id=self._task(sender),
            recipient=recipient,
            topic=topic,
        )
        self.bus.send(message)
        return message

    def receive(self, agent_id: str, max_messages: int) -> list[IPCMessage]:
        """Up to ``max_messages`` for the agent, pending until acked (no waiting)."""
        self._task(agent_id)
        return self.bus.receive(agent_id, max_messages=max_messages)

    def ack(self, agent_id: str, ids: Sequence[str]) -> None:
        """Mark received messages handled (ids not pending are ignored)."""
        self._task(agent_id)
        self.bus.ack(agent_id, ids)

    def recover(self, agent_id: str) -> int:
        """Deliver the agent's unacked messages again, first; returns how many there are."""
        self._task(agent_id)
        return self.bus.recover(agent_id)

    def dead_letters(self, agent_id: str, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` of the agent's stored messages that could not be delivered."""
        self._task(agent_id)
        return self.bus.dead_letters(agent_id, limit=limit)

    def delete_dead_letters(self, agent_id: str, ids: Sequence[str]) -> int:
        """Remove the agent's dead letters by id; returns how many were removed."""
        self._task(agent_id)
        return self.bus.delete_dead_letters(agent_id, ids)

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections."""


class LocalFabric(TenantFabric):
    """A :class:`~ctxkeep.ContextFabric` in this process."""

    def __init__(self) -> None:
        self.fabric = ContextFabric()
        self.bus = self.fabric.bus

    def join(self, agent_id: str, task_id: str, state: Mapping[str, Any]) -> TaskState:
        """See :meth:`TenantFabric.join`."""
        self.fabric.set_task_context(agent_id, json_state("state", state), task_id=task_id)
        return self.read(agent_id)

    def read(self, agent_id: str) -> TaskState:
        """See :meth:`TenantFabric.read`."""
        view = self.fabric.context_view(agent_id)  # one consistent snapshot
        if view.task_id is None:
            raise _unknown(agent_id)
        return TaskState(view.task_id, view.task_version, _thaw(view.task))

    def update(self, agent_id: str, changes: Mapping[str, Any], expected_version: int) -> TaskState:
        """See :meth:`TenantFabric.update`."""
        data = json_state("changes", changes)
        self._task(agent_id)
        self.fabric.update_task_context(agent_id, data, expected_version=expected_version)
        return self.read(agent_id)

    def _task(self, agent_id: str) -> str:
        try:
            return self.fabric.task_id_of(agent_id)
        except UnknownAgentError:
            raise _unknown(agent_id) from None


SERVICE_CONSUMER = "ctxkeep-serve"
"""The one consumer name of every server process on a Redis or PostgreSQL fabric: a client's
messages are pending for the service, not for the worker that happened to answer its receive,
so any worker's ack settles them and any worker's ``recover`` puts them back (a worker killed
mid-request leaves nothing behind either: its messages are pending, and are claimed after
``claim_idle_ms``)."""


class _SharedFabric(TenantFabric):
    """A fabric kept in the store (Redis, PostgreSQL): the bus knows each agent's task."""

    bus: Any
    """A RedisStreamBus or PostgresBus (each has ``task_of`` and ``close``)."""

    def _task(self, agent_id: str) -> str:
        try:
            task_id: str | None = self.bus.task_of(agent_id)
        except UnknownAgentError:
            raise _unknown(agent_id) from None
        if task_id is None:
            raise _unknown(agent_id)
        return task_id

    def close(self) -> None:
        """Close the bus's connections."""
        self.bus.close()


class RedisFabric(_SharedFabric):
    """Task states and a Redis Streams bus under one tenant's key prefix.

    Args:
        url: the tenant's Redis URL (its ``?prefix=`` is the tenant's).
        consumer: this process's name among the inboxes' consumers (default: the one every
            server process shares, :data:`SERVICE_CONSUMER`).

    """

    def __init__(self, url: str, *, consumer: str = SERVICE_CONSUMER) -> None:
        from ctxkeep.fabric.redis_bus import RedisStreamBus

        self.url = url
        self.bus: RedisStreamBus = RedisStreamBus(url, consumer=consumer)

    @contextmanager
    def _state(self, task_id: str) -> Iterator[RedisTaskState]:
        from ctxkeep.fabric.redis_state import RedisTaskState

        state = RedisTaskState(self.url, task_id)
        try:
            yield state
        finally:
            state.close()

    def join(self, agent_id: str, task_id: str, state: Mapping[str, Any]) -> TaskState:
        """See :meth:`TenantFabric.join` (the task is written before the agent is bound)."""
        _check.text("agent_id", agent_id)
        _check.text("task_id", task_id)
        data = json_state("state", state)
        with self._state(task_id) as task:
            version, current = task.read()
            if any(k not in current or current[k] != v for k, v in data.items()):
                if version != 0:
                    raise StaleTaskStateError(task_id, 0, version)
                task.update(data, expected_version=0)  # a racing first writer: stale
        self.bus.register(agent_id, task_id)
        return self.read(agent_id)

    def read(self, agent_id: str) -> TaskState:
        """See :meth:`TenantFabric.read`."""
        task_id = self._task(agent_id)
        with self._state(task_id) as task:
            version, data = task.read()
        return TaskState(task_id, version, data)

    def update(self, agent_id: str, changes: Mapping[str, Any], expected_version: int) -> TaskState:
        """See :meth:`TenantFabric.update`."""
        task_id = self._task(agent_id)
        with self._state(task_id) as task:
            task.update(changes, expected_version=expected_version)
            version, data = task.read()
        return TaskState(task_id, version, data)


class PostgresFabric(_SharedFabric):
    """Task states and a bus on PostgreSQL tables in one tenant's schema, over one pool.

    Args:
        url: the tenant's PostgreSQL URL (its ``search_path`` is the tenant's schema, which
            must exist).
        consumer: this process's name among the inboxes' consumers (default: the one every
            server process shares, :data:`SERVICE_CONSUMER`).

    """

    def __init__(self, url: str, *, consumer: str = SERVICE_CONSUMER) -> None:
        from ctxkeep.fabric.postgres import PostgresBus

        self.bus: PostgresBus = PostgresBus(url, consumer=consumer)

    def join(self, agent_id: str, task_id: str, state: Mapping[str, Any]) -> TaskState:
        """See :meth:`TenantFabric.join` (the task is written before the agent is bound)."""
        _check.text("agent_id", agent_id)
        _check.text("task_id", task_id)
        self.bus.task_state(task_id).join(json_state("state", state))
        self.bus.register(agent_id, task_id)
        return self.read(agent_id)

    def read(self, agent_id: str) -> TaskState:
        """See :meth:`TenantFabric.read`."""
        task_id = self._task(agent_id)
        version, data = self.bus.task_state(task_id).read()
        return TaskState(task_id, version, data)

    def update(self, agent_id: str, changes: Mapping[str, Any], expected_version: int) -> TaskState:
        """See :meth:`TenantFabric.update`."""
        data = json_state("changes", changes)
        task_id = self._task(agent_id)
        task = self.bus.task_state(task_id)
        task.update(data, expected_version=expected_version)
        version, current = task.read()
        return TaskState(task_id, version, current)


__all__ = [
    "SERVICE_CONSUMER",
    "LocalFabric",
    "PostgresFabric",
    "RedisFabric",
    "TaskState",
    "TenantFabric",
    "json_state",
]

"""The context fabric: who sees what.

Three layers (:class:`ContextLayer`):

* ``TASK_SHARED``: the task's goal, constraints, artifacts, decisions, dependencies: every
  agent of the task reads it; writes go through a versioned compare-and-set, so a stale write
  is refused (:class:`~ctxkeep.errors.StaleTaskStateError`), never silently lost.
* ``AGENT_PRIVATE``: an agent's reasoning notes, observations, hypotheses, scratchpad. It
  never leaves its agent: no task view, no other agent's view, no bus message, no other
  agent's checkpoint holds it.
* ``IPC``: messages between agents, through :attr:`ContextFabric.bus`.

Everything crosses the boundary as a copy: what a caller passes in is copied, what the fabric
returns can be mutated freely, and :meth:`ContextFabric.context_view` is a read-only snapshot
(mutating it raises ``TypeError``).

Every public method checks its arguments before it changes anything: agent and task ids are
non-empty strings, state is a mapping with string keys, a value that cannot be copied is
refused, so malformed input raises a typed :class:`~ctxkeep.errors.CtxkeepError` (such as
:class:`~ctxkeep.errors.InvalidTypeError`, also a ``TypeError``) and leaves the fabric as it
was. The checks live here, in front of every bus, so a Redis bus gets the same answers.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from ctxkeep import _check
from ctxkeep.cognition import CognitiveState, decode_cognitive_state, encode_cognitive_state
from ctxkeep.errors import ConfigError, StaleTaskStateError, UnknownAgentError, describe
from ctxkeep.fabric.bus import InProcessBus, IPCMessage, MessageBus

DEFAULT_TASK = "default"


class ContextLayer(StrEnum):
    """The three layers of an agent's context."""

    TASK_SHARED = "task_shared"
    AGENT_PRIVATE = "agent_private"
    IPC = "ipc"


def freeze(value: Any) -> Any:
    """A deep read-only copy: mappings become ``MappingProxyType``, lists tuples, sets
    frozensets.
    """
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(freeze(v) for v in value)
    return copy.deepcopy(value)


@dataclass(frozen=True)
class ContextView:
    """A read-only snapshot of what one agent sees: its task's shared state and its own
    private layer, kept apart.
    """

    agent_id: str
    """Whose view this is."""
    task_id: str | None
    """The agent's task."""
    task_version: int
    """The task state's version at the snapshot."""
    task: Mapping[str, Any]
    """The shared task state (read-only)."""
    private: Mapping[str, Any]
    """This agent's private layer (read-only)."""

    def layer(self, layer: ContextLayer) -> Mapping[str, Any]:
        """One layer of the view (IPC has no state here: use the bus)."""
        if layer == ContextLayer.TASK_SHARED:
            return self.task
        if layer == ContextLayer.AGENT_PRIVATE:
            return self.private
        if layer == ContextLayer.IPC:
            raise ConfigError("the IPC layer has no snapshot; receive messages from fabric.bus")
        raise ConfigError(f"no context layer {describe(layer)}; use a ContextLayer")


@dataclass
class _Task:
    version: int
    data: dict[str, Any]


class ContextFabric:
    """Task-shared state, agent-private scratchpads and the inter-agent bus for many agents.

    Args:
        bus: the message bus (default: an :class:`~ctxkeep.fabric.bus.InProcessBus`).

    """

    def __init__(self, *, bus: MessageBus | None = None) -> None:
        self.bus: MessageBus = bus if bus is not None else InProcessBus()
        self._lock = threading.RLock()
        self._tasks: dict[str, _Task] = {}
        self._agent_task: dict[str, str] = {}
        self._private: dict[str, dict[str, Any]] = {}
        self._cognitive: dict[str, CognitiveState] = {}

    # -- task-shared ---------------------------------------------------------------------

    def set_task_context(
        self, agent_id: str, mapping: Mapping[str, Any], *, task_id: str | None = None
    ) -> int:
        """Bind ``agent_id`` to a task; a new task starts from a copy of ``mapping``.

        The task is ``task_id``, else ``mapping["task_id"]``, else ``"default"``. Joining an
        existing task never overwrites its shared state: ``mapping`` may only repeat what the
        task already holds (or be empty); changes go through :meth:`update_task_context`.
        ``mapping`` is copied, never mutated.

        Returns:
            The version of the task's shared state.

        Raises:
            StaleTaskStateError: the task exists and ``mapping`` would change it.
            InvalidTypeError: an id that is not a string, a ``mapping`` that is not a mapping
                with string keys or cannot be copied (a ``TypeError``; nothing changes).
            ConfigError: an empty id (a ``ValueError``).

        """
        _check.text("agent_id", agent_id)
        data = _check.deep_copy("mapping", _check.mapping("mapping", mapping))
        tid = _check.optional_text("task_id", task_id) or _check.text(
            "mapping['task_id']", data.get("task_id") or DEFAULT_TASK
        )
        with self._lock:
            task = self._tasks.get(tid)
            if task is None:
                task = self._tasks[tid] = _Task(version=1 if data else 0, data=data)
            elif any(k not in task.data or task.data[k] != v for k, v in data.items()):
                raise StaleTaskStateError(tid, 0, task.version)
            self._agent_task[agent_id] = tid
            self._private.setdefault(agent_id, {})
            self.bus.register(agent_id, tid)
            return task.version

    def task_id_of(self, agent_id: str) -> str:
        """The task ``agent_id`` belongs to.

        Raises:
            UnknownAgentError: the agent has joined no task.
            InvalidTypeError: ``agent_id`` is not a string.

        """
        _check.text("agent_id", agent_id)
        with self._lock:
            try:
                return self._agent_task[agent_id]
            except KeyError:
                raise UnknownAgentError(
                    f"agent {agent_id!r} has joined no task; call set_task_context first"
                ) from None

    def task_context(self, agent_id: str) -> dict[str, Any]:
        """A copy of the shared state of the agent's task."""
        with self._lock:
            return copy.deepcopy(self._tasks[self.task_id_of(agent_id)].data)

    def task_version(self, task_id: str) -> int:
        """The version of a task's shared state (0 if it has none)."""
        _check.text("task_id", task_id)
        with self._lock:
            task = self._tasks.get(task_id)
            return task.version if task else 0

    def update_task_context(
        self, agent_id: str, changes: Mapping[str, Any], *, expected_version: int
    ) -> int:
        """Compare-and-set: apply ``changes`` only if the task is still at
        ``expected_version``.

        Returns:
            The new version.

        Raises:
            StaleTaskStateError: someone wrote since ``expected_version`` was read.
            UnknownAgentError: the agent has joined no task.
            InvalidTypeError: ``changes`` is not a mapping with string keys or cannot be
                copied, or ``expected_version`` is not an int (nothing changes).

        """
        _check.text("agent_id", agent_id)
        data = _check.deep_copy("changes", _check.mapping("changes", changes))
        _check.integer("expected_version", expected_version, minimum=0)
        with self._lock:
            tid = self.task_id_of(agent_id)
            task = self._tasks[tid]
            if task.version != expected_version:
                raise StaleTaskStateError(tid, expected_version, task.version)
            task.data.update(data)
            task.version += 1
            return task.version

    def agents(self, task_id: str) -> list[str]:
        """The agents bound to a task."""
        _check.text("task_id", task_id)
        with self._lock:
            return sorted(a for a, t in self._agent_task.items() if t == task_id)

    # -- agent-private -------------------------------------------------------------------

    def set_private(self, agent_id: str, key: str, value: Any) -> None:
        """Put a copy of ``value`` under ``key`` in the agent's private layer.

        Raises:
            InvalidTypeError: ``agent_id`` or ``key`` is not a string, or ``value`` cannot be
                copied (a ``TypeError``; nothing changes).

        """
        _check.text("agent_id", agent_id)
        _check.text("key", key, empty=True)
        v = _check.deep_copy("value", value)
        with self._lock:
            self._private.setdefault(agent_id, {})[key] = v

    def private(self, agent_id: str) -> dict[str, Any]:
        """A copy of the agent's private layer (empty if it has none)."""
        _check.text("agent_id", agent_id)
        with self._lock:
            return copy.deepcopy(self._private.get(agent_id, {}))

    def clear_private(self, agent_id: str) -> None:
        """Empty the agent's private layer."""
        _check.text("agent_id", agent_id)
        with self._lock:
            self._private[agent_id] = {}

    # -- views ---------------------------------------------------------------------------

    def context_view(self, agent_id: str) -> ContextView:
        """A read-only snapshot of the agent's task state and its own private layer."""
        _check.text("agent_id", agent_id)
        with self._lock:
            tid = self._agent_task.get(agent_id)
            task = self._tasks.get(tid) if tid is not None else None
            return ContextView(
                agent_id=agent_id,
                task_id=tid,
                task_version=task.version if task else 0,
                task=freeze(task.data if task else {}),
                private=freeze(self._private.get(agent_id, {})),
            )

    # -- IPC -----------------------------------------------------------------------------

    def send(
        self,
        sender: str,
        payload: Any,
        *,
        recipient: str | None = None,
        topic: str | None = None,
    ) -> str:
        """Send a message from ``sender`` (within its task); returns the message id.

        Raises:
            UnknownAgentError: ``sender`` has joined no task.
            InvalidMessageError: a payload that is not JSON data, or not exactly one of
                ``recipient`` and ``topic``.
            InvalidTypeError: an id that is not a string.

        """
        tid = self.task_id_of(sender)
        return self.bus.send(
            IPCMessage(
                sender=sender, payload=payload, task_id=tid, recipient=recipient, topic=topic
            )
        )

    # -- cognition -----------------------------------------------------------------------

    def set_cognitive_state(
        self, agent_id: str, state: CognitiveState | Mapping[str, Any] | None
    ) -> None:
        """Store a copy of the agent's cognitive state, upgraded from older versions.

        Raises:
            CognitiveStateSchemaVersionError: a state newer than this ctxkeep.
            InvalidTypeError: ``agent_id`` is not a string, ``state`` is not a
                CognitiveState, a mapping or None, or holds a value with no faithful JSON
                form, which no checkpoint could hold (nothing changes).

        """
        _check.text("agent_id", agent_id)
        _check.instance(
            "state", state, (CognitiveState, Mapping, type(None)), "a CognitiveState or a mapping"
        )
        decoded = decode_cognitive_state(state)
        encode_cognitive_state(decoded)  # refuse now what no checkpoint could hold
        with self._lock:
            self._cognitive[agent_id] = decoded

    def cognitive_state(self, agent_id: str) -> CognitiveState:
        """A copy of the agent's cognitive state (empty if none was set)."""
        _check.text("agent_id", agent_id)
        with self._lock:
            st = self._cognitive.get(agent_id)
            return st.copy() if st is not None else CognitiveState()

    def checkpoint_cognitive(self, agent_id: str) -> CognitiveState:
        """A copy of the agent's cognitive state, for a checkpoint."""
        return self.cognitive_state(agent_id)

    def save_checkpoint(self, agent_id: str, store: Any, *, session_id: str | None = None) -> str:
        """Save the agent's cognitive state and private layer to a checkpoint store.

        Only this agent's own private layer goes into its record. Returns the checkpoint id.
        """
        _check.text("agent_id", agent_id)
        _check.has_method("store", store, "save", "CheckpointStore")
        _check.optional_text("session_id", session_id)
        with self._lock:
            tid = self._agent_task.get(agent_id)
            state = self.cognitive_state(agent_id)
            private = self.private(agent_id)
        return str(store.save(agent_id, state, task_id=tid, session_id=session_id, private=private))

    def restore_checkpoint(
        self, agent_id: str, store: Any, checkpoint_id: str | None = None
    ) -> bool:
        """Restore the agent's cognitive state and private layer from its latest (or the
        given) checkpoint; False if there is none.
        """
        _check.text("agent_id", agent_id)
        _check.has_method("store", store, "latest", "CheckpointStore")
        _check.optional_text("checkpoint_id", checkpoint_id)
        cp = store.load(checkpoint_id) if checkpoint_id else store.latest(agent_id)
        if cp is None:
            return False
        if cp.agent_id != agent_id:
            raise UnknownAgentError(f"checkpoint {cp.checkpoint_id} belongs to {cp.agent_id!r}")
        with self._lock:
            self._cognitive[agent_id] = cp.state.copy()
            self._private[agent_id] = copy.deepcopy(cp.private)
            if cp.task_id is not None and agent_id not in self._agent_task:
                self._agent_task[agent_id] = cp.task_id
                self._tasks.setdefault(cp.task_id, _Task(0, {}))
                self.bus.register(agent_id, cp.task_id)
        return True

"""The inter-agent message bus (the IPC layer): messages between agents, never their secrets.

:class:`IPCMessage` carries a JSON payload from a sender to one recipient or to a topic of
its task. Delivery rules, the same on every bus:

* a message addressed to a ``recipient`` reaches that agent, whatever its task;
* a message to a ``topic`` reaches every agent of the same task subscribed to that topic,
  except the sender; agents of other tasks never see it.

Delivery is at least once: :meth:`MessageBus.receive` hands out messages that stay pending
until :meth:`MessageBus.ack`, and :meth:`MessageBus.recover` (after a crash) delivers the
pending ones again, first; :meth:`MessageBus.handle` runs a handler at most once per message
id and acks, so a redelivered message is not handled twice. Messages to one agent arrive in
the order they were sent. Payloads are copied (through JSON) at send and at receive.

No message may block an inbox: a payload no receiver could be handed (a lone surrogate,
nesting deeper than :data:`~ctxkeep.fabric.jsondata.MAX_DEPTH`) is refused when the
:class:`IPCMessage` is made, before any bus stores it; a stored one that cannot be read (a
corrupt record, one from an older ctxkeep) is moved to the agent's dead letters
(:class:`DeadLetter`, :meth:`MessageBus.dead_letters`) with the reason, and the rest flow.
``ctxkeep.testing.contract.BusContract`` checks the delivery rules and the refusal of poison
payloads on every bus.

:meth:`MessageBus.stats` counts what a bus holds, in one read (:class:`BusStats`): messages
stored and not yet delivered (its depth), delivered and not acked (pending), and dead letters;
``ctxkeep serve`` shows them per tenant in ``/metrics``.

:class:`InProcessBus` serves agents in one process; ``ctxkeep.fabric.redis_bus`` serves
processes on many machines over Redis Streams.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from ctxkeep import _check
from ctxkeep.errors import InvalidMessageError, UnknownAgentError
from ctxkeep.fabric.jsondata import json_copy


@dataclass(frozen=True, kw_only=True)
class IPCMessage:
    """A message from one agent to another, or to a topic of its task.

    Every bus takes these, so the checks live here, once: ids are non-empty strings, the
    payload is JSON data every bus and the service can deliver
    (:func:`~ctxkeep.fabric.jsondata.json_copy`), ``created_at`` a finite number. A malformed
    field raises a typed error (:class:`~ctxkeep.errors.InvalidMessageError`, or
    :class:`~ctxkeep.errors.InvalidTypeError` for a wrong type).
    """

    sender: str
    """The sending agent."""
    payload: Any
    """JSON data (copied on send and on receive)."""
    task_id: str | None = None
    """The task the message belongs to (topic messages stay inside it)."""
    recipient: str | None = None
    """The one agent this message is for, if addressed directly."""
    topic: str | None = None
    """The topic it is published to, if not addressed directly."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Unique id; handlers use it to handle a redelivered message once."""
    created_at: float = field(default_factory=time.time)
    """Unix time of sending."""

    def __post_init__(self) -> None:
        if self.sender is None or self.sender == "":
            raise InvalidMessageError("an IPC message needs a sender")
        _check.text("sender", self.sender)
        for name in ("task_id", "recipient", "topic"):
            _check.optional_text(name, getattr(self, name))
        _check.text("id", self.id)
        object.__setattr__(self, "created_at", _check.number("created_at", self.created_at))
        if (self.recipient is None) == (self.topic is None):
            raise InvalidMessageError("an IPC message needs exactly one of recipient or topic")
        if self.topic is not None and self.task_id is None:
            raise InvalidMessageError("a topic message needs a task_id")
        # checked here, before any bus stores it: a payload no receiver could be handed (a
        # lone surrogate, nesting too deep) would block the recipient's inbox
        object.__setattr__(
            self, "payload", json_copy("payload", self.payload, error=InvalidMessageError)
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the payload is JSON data already)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IPCMessage:
        """The inverse of :meth:`to_dict`.

        Raises:
            InvalidMessageError: unknown fields, or a missing sender or payload.
            InvalidTypeError: ``d`` is not a mapping, or a field has the wrong type.

        """
        d = _check.mapping("d", d)
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise InvalidMessageError(f"an IPC message has no fields {sorted(unknown)}")
        missing = {"sender", "payload"} - set(d)
        if missing:
            raise InvalidMessageError(f"an IPC message needs {sorted(missing)}")
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class DeadLetter:
    """A stored message that could not be decoded or delivered, moved aside from its agent's
    inbox so the messages behind it flow (a receive that failed on it every time would block
    the inbox for good). Read them with ``bus.dead_letters(agent)``, remove them with
    ``bus.delete_dead_letters(agent, ids)``.
    """

    id: str
    """Its id in the agent's dead-letter list (what ``delete_dead_letters`` takes)."""
    reason: str
    """Why it could not be delivered."""
    record: dict[str, str]
    """The stored record as it was found (a Redis stream entry's fields, with ``entry_id``,
    its id in the inbox)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"id": self.id, "reason": self.reason, "record": dict(self.record)}


@dataclass(frozen=True, kw_only=True)
class BusStats:
    """What a bus holds, counted in one read (:meth:`MessageBus.stats`). A message sent to a
    topic counts once per recipient, as each holds its own copy.
    """

    depth: int
    """Messages stored and not yet delivered to any receiver."""
    pending: int
    """Messages delivered (received) and not acked yet: each is delivered again after
    ``recover`` or, on the Redis and PostgreSQL buses, after ``claim_idle_ms``."""
    dead_letters: int
    """Stored messages that could not be delivered, moved aside (:class:`DeadLetter`)."""

    def to_dict(self) -> dict[str, int]:
        """JSON-ready form."""
        return {"depth": self.depth, "pending": self.pending, "dead_letters": self.dead_letters}


# -- the argument checks every bus makes, written once -----------------------------------------


def check_agent(agent_id: Any, name: str = "agent_id") -> str:
    """``agent_id`` if it is a non-empty string of valid Unicode (else a typed error)."""
    return _check.text(name, agent_id)


def check_message(message: Any) -> IPCMessage:
    """``message`` if it is an :class:`IPCMessage` (which checked its own fields)."""
    return _check.instance("message", message, IPCMessage, "an IPCMessage")  # type: ignore[no-any-return]


def check_receive(max_messages: Any, timeout: Any) -> tuple[int, float]:
    """``(max_messages, timeout)`` of a receive: an int and a finite number of seconds."""
    return _check.integer("max_messages", max_messages), max(_check.number("timeout", timeout), 0.0)


def check_ids(ids: Any) -> list[str]:
    """The message ids to ack, as a list of strings."""
    out = _check.iterable("ids", ids)
    for i in out:
        _check.text("a message id", i)
    return out


def check_limit(limit: Any) -> int:
    """How many dead letters to list at most: an int of at least 1."""
    return _check.integer("limit", limit, minimum=1)


@runtime_checkable
class MessageBus(Protocol):
    """What every bus offers."""

    def register(self, agent_id: str, task_id: str | None) -> None:
        """Make ``agent_id`` known, as a member of ``task_id``."""
        ...

    def subscribe(self, agent_id: str, topic: str) -> None:
        """Deliver ``topic`` messages of the agent's task to it."""
        ...

    def send(self, message: IPCMessage) -> str:
        """Deliver ``message``; returns its id."""
        ...

    def receive(
        self, agent_id: str, *, max_messages: int = 100, timeout: float = 0
    ) -> list[IPCMessage]:
        """Messages for ``agent_id`` (pending until acked); waits up to ``timeout`` s."""
        ...

    def ack(self, agent_id: str, ids: Iterable[str]) -> None:
        """Mark messages handled; they are not delivered again."""
        ...

    def recover(self, agent_id: str) -> int:
        """Deliver the messages this process received for ``agent_id`` and did not ack again,
        first, on the next receive (after a crash); returns how many there are.
        """
        ...

    def handle(
        self, agent_id: str, handler: Callable[[IPCMessage], None], *, timeout: float = 0
    ) -> int:
        """Receive, run ``handler`` once per message id, ack; returns how many were handled."""
        ...

    def dead_letters(self, agent_id: str, *, limit: int = 100) -> list[DeadLetter]:
        """The agent's stored messages that could not be delivered, oldest first."""
        ...

    def delete_dead_letters(self, agent_id: str, ids: Iterable[str]) -> int:
        """Remove dead letters by id (unknown ids are ignored); returns how many were removed."""
        ...

    def stats(self) -> BusStats:
        """How many messages the bus holds for all its agents, undelivered, pending and dead
        (one read of the store).
        """
        ...


class InProcessBus:
    """A bus for agents in one process (thread-safe)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tasks: dict[str, str | None] = {}
        self._subs: dict[tuple[str | None, str], set[str]] = defaultdict(set)
        self._queues: dict[str, deque[IPCMessage]] = defaultdict(deque)
        self._pending: dict[str, dict[str, IPCMessage]] = defaultdict(dict)  # by receive order
        self._replay: dict[str, deque[str]] = defaultdict(deque)  # ids recover() put back
        self._handled: dict[str, set[str]] = defaultdict(set)

    def register(self, agent_id: str, task_id: str | None) -> None:
        """Make the agent known as a member of ``task_id``."""
        check_agent(agent_id)
        _check.optional_text("task_id", task_id)
        with self._cond:
            old = self._tasks.get(agent_id)
            if old != task_id:
                for key, members in self._subs.items():
                    if key[0] == old:
                        members.discard(agent_id)
            self._tasks[agent_id] = task_id

    def subscribe(self, agent_id: str, topic: str) -> None:
        """Subscribe the agent to a topic of its task."""
        check_agent(agent_id)
        _check.text("topic", topic)
        with self._cond:
            if agent_id not in self._tasks:
                raise UnknownAgentError(f"agent {agent_id!r} has not joined a task")
            self._subs[(self._tasks[agent_id], topic)].add(agent_id)

    def send(self, message: IPCMessage) -> str:
        """Queue the message for its recipient or the topic's subscribers."""
        check_message(message)
        with self._cond:
            if message.recipient is not None:
                targets = {message.recipient}
            else:
                assert message.topic is not None
                targets = set(self._subs.get((message.task_id, message.topic), ())) - {
                    message.sender
                }
                targets = {a for a in targets if self._tasks.get(a) == message.task_id}
            for agent in targets:
                self._queues[agent].append(message)
            self._cond.notify_all()
        return message.id

    def receive(
        self, agent_id: str, *, max_messages: int = 100, timeout: float = 0
    ) -> list[IPCMessage]:
        """Take up to ``max_messages``, those :meth:`recover` put back first; they stay pending
        until acked.
        """
        check_agent(agent_id)
        max_messages, timeout = check_receive(max_messages, timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            q, replay = self._queues[agent_id], self._replay[agent_id]
            pending = self._pending[agent_id]

            def ready() -> bool:
                while replay and replay[0] not in pending:  # acked since recover()
                    replay.popleft()
                return bool(q or replay)

            while not ready() and timeout > 0:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    break
            out: list[IPCMessage] = []
            while ready() and replay and len(out) < max_messages:
                out.append(IPCMessage.from_dict(pending[replay.popleft()].to_dict()))
            while q and len(out) < max_messages:
                m = q.popleft()
                pending[m.id] = m
                out.append(IPCMessage.from_dict(m.to_dict()))
            return out

    def ack(self, agent_id: str, ids: Iterable[str]) -> None:
        """Forget handled messages."""
        check_agent(agent_id)
        ids = check_ids(ids)
        with self._cond:
            for i in ids:
                self._pending[agent_id].pop(i, None)

    def recover(self, agent_id: str) -> int:
        """Deliver every unacked message again, first (after a crash); returns how many are
        unacked.
        """
        check_agent(agent_id)
        with self._cond:
            pending = self._pending[agent_id]
            self._replay[agent_id] = deque(pending)
            self._cond.notify_all()
            return len(pending)

    def handle(
        self, agent_id: str, handler: Callable[[IPCMessage], None], *, timeout: float = 0
    ) -> int:
        """Run ``handler`` once per message id, then ack."""
        _check.has_method("handler", handler, "__call__", "function")
        n = 0
        for m in self.receive(agent_id, timeout=timeout):
            if m.id not in self._handled[agent_id]:
                handler(m)
                self._handled[agent_id].add(m.id)
                n += 1
            self.ack(agent_id, [m.id])
        return n

    def dead_letters(self, agent_id: str, *, limit: int = 100) -> list[DeadLetter]:
        """Always none: this bus stores only :class:`IPCMessage` objects, each checked when it
        was made and copied out as it is, so nothing it holds can fail to be delivered (a
        poison payload is refused at send).
        """
        check_agent(agent_id)
        check_limit(limit)
        return []

    def delete_dead_letters(self, agent_id: str, ids: Iterable[str]) -> int:
        """Nothing to remove (see :meth:`dead_letters`); returns 0."""
        check_agent(agent_id)
        check_ids(ids)
        return 0

    def stats(self) -> BusStats:
        """The messages queued (depth) and received but not acked (pending) for every agent;
        no dead letters (see :meth:`dead_letters`).
        """
        with self._cond:
            depth = sum(len(q) for q in self._queues.values())
            pending = sum(len(p) for p in self._pending.values())
        return BusStats(depth=depth, pending=pending, dead_letters=0)

"""The message-bus conformance suite: :class:`BusContract`.

What every :class:`~ctxkeep.fabric.bus.MessageBus` promises, whatever carries its messages:
direct messages reach their recipient in any task; topic messages reach the subscribers of the
sender's task, never the sender, never another task; messages to one agent arrive in the order
they were sent; payloads are JSON copies on the way in and on the way out; a received message
stays pending until acked and :meth:`~ctxkeep.fabric.bus.MessageBus.recover` delivers it again,
first; ``handle`` runs a handler once per message id; and the fabric's private layer never
travels on the bus. A stateful test drives random traffic against a plain model of these rules.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from ctxkeep.errors import InvalidMessageError, UnknownAgentError
from ctxkeep.fabric.bus import IPCMessage, MessageBus
from ctxkeep.fabric.core import ContextFabric
from ctxkeep.fabric.jsondata import MAX_DEPTH

MakeBus = Callable[[], MessageBus]
"""Returns a fresh, empty bus on each call (the fixture closes what it made after the test)."""


def _joined(bus: MessageBus, *members: tuple[str, str]) -> MessageBus:
    """``bus`` with each ``(agent, task)`` registered."""
    for agent, task in members:
        bus.register(agent, task)
    return bus


def _direct(sender: str, recipient: str, payload: Any) -> IPCMessage:
    return IPCMessage(sender=sender, recipient=recipient, payload=payload)


def _payloads(messages: list[IPCMessage]) -> list[Any]:
    return [m.payload for m in messages]


def _nested(depth: int) -> Any:
    """``depth`` lists, one inside the other, around a number."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


class Crash(Exception):
    """Stands in for a process dying inside a handler."""


class BusContract:
    """Behaviours every message bus must show.

    Provide a ``make_bus`` fixture: a callable returning a fresh, empty bus each time it is
    called (see :data:`MakeBus`), closing what it made when the test ends.
    """

    @pytest.fixture
    def make_bus(self) -> MakeBus:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    # -- direct messages -------------------------------------------------------------------

    def test_a_direct_message_reaches_its_recipient_in_another_task(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t1"), ("b", "t2"))
        bus.send(IPCMessage(sender="a", recipient="b", task_id="t1", payload={"hello": "b"}))
        assert _payloads(bus.receive("b")) == [{"hello": "b"}]

    def test_a_received_message_equals_the_one_sent(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        sent = IPCMessage(sender="a", recipient="b", task_id="t", payload={"x": 1})
        assert bus.send(sent) == sent.id
        assert bus.receive("b") == [sent]

    def test_messages_to_one_agent_arrive_in_sending_order(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        for n in range(10):
            bus.send(_direct("a", "b", n))
        assert _payloads(bus.receive("b")) == list(range(10))

    def test_max_messages_splits_a_delivery_without_loss_or_reordering(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        for n in range(5):
            bus.send(_direct("a", "b", n))
        first = bus.receive("b", max_messages=2)
        assert _payloads(first) == [0, 1]
        assert _payloads(bus.receive("b")) == [2, 3, 4]

    def test_an_agent_with_no_messages_receives_none(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("b", "t"))
        assert bus.receive("b") == []

    # -- topics ----------------------------------------------------------------------------

    def test_a_topic_message_reaches_every_subscriber_of_the_task(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"), ("c", "t"))
        bus.subscribe("b", "news")
        bus.subscribe("c", "news")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t", payload="hi"))
        assert _payloads(bus.receive("b")) == ["hi"]
        assert _payloads(bus.receive("c")) == ["hi"]

    def test_a_topic_message_never_returns_to_its_sender(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.subscribe("a", "news")
        bus.subscribe("b", "news")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t", payload="hi"))
        assert bus.receive("a") == []
        assert _payloads(bus.receive("b")) == ["hi"]

    def test_a_topic_message_never_reaches_another_task(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t1"), ("b", "t1"), ("c", "t2"))
        bus.subscribe("b", "news")
        bus.subscribe("c", "news")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t1", payload="hi"))
        assert bus.receive("c") == []
        assert _payloads(bus.receive("b")) == ["hi"]

    def test_a_topic_message_skips_members_not_subscribed_to_it(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"), ("c", "t"))
        bus.subscribe("b", "news")
        bus.subscribe("c", "other")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t", payload="hi"))
        assert bus.receive("c") == []
        assert _payloads(bus.receive("b")) == ["hi"]

    def test_moving_to_another_task_drops_old_subscriptions(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t1"), ("b", "t1"), ("c", "t2"))
        bus.subscribe("b", "news")
        bus.register("b", "t2")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t1", payload="old task"))
        bus.send(IPCMessage(sender="c", topic="news", task_id="t2", payload="not subscribed"))
        assert bus.receive("b") == []
        bus.subscribe("b", "news")
        bus.send(IPCMessage(sender="c", topic="news", task_id="t2", payload="new task"))
        assert _payloads(bus.receive("b")) == ["new task"]

    def test_registering_again_in_the_same_task_keeps_subscriptions(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.subscribe("b", "news")
        bus.register("b", "t")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t", payload="still here"))
        assert _payloads(bus.receive("b")) == ["still here"]

    def test_subscribing_an_agent_that_never_joined_is_refused(self, make_bus: MakeBus) -> None:
        with pytest.raises(UnknownAgentError):
            make_bus().subscribe("ghost", "news")

    # -- copies ----------------------------------------------------------------------------

    def test_a_payload_changed_after_sending_arrives_as_sent(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        payload: dict[str, Any] = {"items": [1]}
        bus.send(_direct("a", "b", payload))
        payload["items"].append(2)
        assert _payloads(bus.receive("b")) == [{"items": [1]}]

    def test_each_recipient_gets_its_own_copy(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"), ("c", "t"))
        bus.subscribe("b", "news")
        bus.subscribe("c", "news")
        bus.send(IPCMessage(sender="a", topic="news", task_id="t", payload={"items": [1]}))
        (for_b,) = bus.receive("b")
        for_b.payload["items"].append("changed by b")
        assert _payloads(bus.receive("c")) == [{"items": [1]}]

    def test_a_redelivered_payload_is_unchanged_by_the_first_reader(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", {"items": [1]}))
        (first,) = bus.receive("b")
        first.payload["items"].append("changed")
        bus.recover("b")
        assert _payloads(bus.receive("b")) == [{"items": [1]}]

    def test_any_json_payload_round_trips(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        payload = {
            "big": 2**70,
            "float": 0.1,
            "text": "ünïcode 日本 \u2028",
            "nested": [{"a": None, "b": True}, []],
        }
        bus.send(_direct("a", "b", payload))
        assert _payloads(bus.receive("b")) == [payload]

    def test_a_payload_that_is_not_json_is_refused_and_nothing_is_sent(
        self, make_bus: MakeBus
    ) -> None:
        fabric = ContextFabric(bus=make_bus())
        fabric.set_task_context("a", {}, task_id="t")
        fabric.set_task_context("b", {}, task_id="t")
        with pytest.raises(InvalidMessageError):
            fabric.send("a", {"bad": object()}, recipient="b")
        assert fabric.bus.receive("b") == []

    # -- poison messages -------------------------------------------------------------------

    @pytest.mark.parametrize(
        "poison",
        [
            pytest.param({"text": "lone \ud800 surrogate"}, id="lone-surrogate"),
            pytest.param({"\udfff": 1}, id="lone-surrogate-key"),
            pytest.param(_nested(300), id="nested-300"),
            pytest.param(_nested(100_000), id="nested-100000"),
        ],
    )
    def test_a_poison_payload_is_refused_and_the_inbox_flows(
        self, make_bus: MakeBus, poison: Any
    ) -> None:
        """A payload no receiver could be handed is refused at send, stores nothing, and every
        good message before and after it is delivered exactly once.
        """
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", "before"))
        with pytest.raises(InvalidMessageError):
            bus.send(_direct("a", "b", poison))
        bus.send(_direct("a", "b", "after"))
        got = bus.receive("b")
        assert _payloads(got) == ["before", "after"]
        bus.ack("b", [m.id for m in got])
        assert bus.recover("b") == 0
        assert bus.receive("b") == []

    def test_the_deepest_payload_allowed_round_trips(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", _nested(MAX_DEPTH)))
        assert _payloads(bus.receive("b")) == [_nested(MAX_DEPTH)]

    # -- waiting ---------------------------------------------------------------------------

    def test_receive_returns_nothing_when_nothing_comes_within_the_timeout(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("b", "t"))
        assert bus.receive("b", timeout=0.1) == []

    def test_receive_waits_for_a_message_sent_meanwhile(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        timer = threading.Timer(0.2, lambda: bus.send(_direct("a", "b", "late")))
        timer.start()
        try:
            got = bus.receive("b", timeout=30)
        finally:
            timer.join()
        assert _payloads(got) == ["late"]

    # -- acknowledgement and redelivery ----------------------------------------------------

    def test_recover_delivers_unacked_messages_again_first(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", "first"))
        bus.receive("b")  # ... and the agent crashes before acking
        bus.send(_direct("a", "b", "second"))
        assert bus.recover("b") == 1
        assert _payloads(bus.receive("b")) == ["first", "second"]

    def test_a_message_first_delivered_after_a_recovery_is_not_delivered_twice(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", "old"))
        bus.receive("b")
        bus.recover("b")
        bus.send(_direct("a", "b", "new"))
        assert _payloads(bus.receive("b")) == ["old", "new"]
        assert bus.receive("b") == []

    def test_acked_messages_are_not_delivered_again(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", "done"))
        bus.ack("b", [m.id for m in bus.receive("b")])
        assert bus.recover("b") == 0
        assert bus.receive("b") == []

    def test_handle_runs_the_handler_once_per_message_id(self, make_bus: MakeBus) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        message = _direct("a", "b", "once")
        bus.send(message)
        bus.send(message)  # a sender retrying after a timeout sends the same id again
        handled: list[Any] = []
        assert bus.handle("b", lambda m: handled.append(m.payload)) == 1
        bus.send(message)
        assert bus.handle("b", lambda m: handled.append(m.payload)) == 0
        assert handled == ["once"]

    def test_a_handled_message_delivered_again_is_not_handled_again(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", {"n": 1}))
        assert len(bus.receive("b")) == 1  # received, but the agent crashes before acking
        assert bus.recover("b") == 1
        handled: list[Any] = []
        assert bus.handle("b", lambda m: handled.append(m.payload)) == 1
        bus.recover("b")
        assert bus.handle("b", lambda m: handled.append(m.payload)) == 0
        assert handled == [{"n": 1}]

    def test_a_handler_that_fails_leaves_its_message_to_be_delivered_again(
        self, make_bus: MakeBus
    ) -> None:
        bus = _joined(make_bus(), ("a", "t"), ("b", "t"))
        bus.send(_direct("a", "b", "job"))

        def dies(m: IPCMessage) -> None:
            raise Crash

        with pytest.raises(Crash):
            bus.handle("b", dies)
        assert bus.recover("b") == 1
        handled: list[Any] = []
        assert bus.handle("b", lambda m: handled.append(m.payload)) == 1
        assert handled == ["job"]

    # -- the fabric over the bus -----------------------------------------------------------

    def test_a_private_value_never_travels_on_the_bus(self, make_bus: MakeBus) -> None:
        fabric = ContextFabric(bus=make_bus())
        for agent in ("a", "b"):
            fabric.set_task_context(agent, {"goal": "g"}, task_id="t")
            fabric.bus.subscribe(agent, "news")
        fabric.set_private("a", "scratch", {"note": "CANARY-7f3e"})
        fabric.send("a", {"view": fabric.task_context("a")}, recipient="b")
        fabric.send("a", {"view": fabric.task_context("a")}, topic="news")
        got = fabric.bus.receive("b")
        assert len(got) == 2
        assert not any("CANARY-7f3e" in json.dumps(m.to_dict()) for m in got)

    def test_random_traffic_follows_the_delivery_rules(self, make_bus: MakeBus) -> None:
        class Machine(_BusMachine):
            new_bus = staticmethod(make_bus)

        run_state_machine_as_test(
            Machine, settings=settings(max_examples=50, stateful_step_count=30, deadline=None)
        )


AGENTS = ["alpha", "beta", "gamma"]
TASKS = ["t1", "t2"]
TOPICS = ["news", "done"]
CANARY = "CANARY-{agent}-{n}-7f3e"


class _BusMachine(RuleBasedStateMachine):
    """Agents of a fabric over the bus join and leave tasks, subscribe, send, publish, receive
    (acking or not), crash and recover, and keep private notes; every delivery is checked
    against a plain model of the rules, and no private note may ever be received.
    """

    new_bus: MakeBus
    """Where the fabric's bus comes from (a fresh, empty one per run)."""

    @initialize()
    def setup(self) -> None:
        self.fabric = ContextFabric(bus=self.new_bus())
        self.bus = self.fabric.bus
        self.task: dict[str, str] = {}
        self.subs: dict[str, set[str]] = {a: set() for a in AGENTS}
        self.queue: dict[str, list[str]] = {a: [] for a in AGENTS}  # never delivered
        self.pending: dict[str, list[str]] = {a: [] for a in AGENTS}  # delivered, not acked
        self.replay: dict[str, list[str]] = {a: [] for a in AGENTS}  # put back by recover
        self.canaries: list[str] = []
        self.sent = 0
        for i, agent in enumerate(AGENTS):
            self.join(agent, TASKS[i % 2])

    @rule(agent=st.sampled_from(AGENTS), task=st.sampled_from(TASKS))
    def join(self, agent: str, task: str) -> None:
        self.fabric.set_task_context(agent, {}, task_id=task)
        if self.task.get(agent) != task:
            self.subs[agent] = set()
        self.task[agent] = task

    @rule(agent=st.sampled_from(AGENTS), topic=st.sampled_from(TOPICS))
    def subscribe(self, agent: str, topic: str) -> None:
        self.bus.subscribe(agent, topic)
        self.subs[agent].add(topic)

    @rule(agent=st.sampled_from(AGENTS))
    def keep_a_private_note(self, agent: str) -> None:
        canary = CANARY.format(agent=agent, n=len(self.canaries))
        self.canaries.append(canary)
        self.fabric.set_private(agent, "scratch", {"note": canary})

    def _payload(self, agent: str) -> dict[str, Any]:
        self.sent += 1
        return {"n": self.sent, "view": self.fabric.task_context(agent)}

    @rule(agent=st.sampled_from(AGENTS), other=st.sampled_from(AGENTS))
    def send_direct(self, agent: str, other: str) -> None:
        mid = self.fabric.send(agent, self._payload(agent), recipient=other)
        self.queue[other].append(mid)

    @rule(agent=st.sampled_from(AGENTS), topic=st.sampled_from(TOPICS))
    def publish(self, agent: str, topic: str) -> None:
        mid = self.fabric.send(agent, self._payload(agent), topic=topic)
        task = self.task[agent]
        for other in AGENTS:
            if other != agent and self.task[other] == task and topic in self.subs[other]:
                self.queue[other].append(mid)

    def _expect(self, agent: str, n: int) -> list[str]:
        """Take the next ``n`` ids the model delivers to ``agent``."""
        replay, queue = self.replay[agent], self.queue[agent]
        taken = (replay + queue)[:n]
        from_queue = taken[len(replay[:n]) :]
        del replay[: len(taken) - len(from_queue)]
        del queue[: len(from_queue)]
        self.pending[agent].extend(from_queue)
        return taken

    def _acked(self, agent: str, ids: list[str]) -> None:
        self.pending[agent] = [i for i in self.pending[agent] if i not in ids]

    def _check(self, got: list[IPCMessage]) -> None:
        for message in got:
            blob = json.dumps(message.to_dict())
            assert not [c for c in self.canaries if c in blob], "a private note on the bus"

    @rule(agent=st.sampled_from(AGENTS), n=st.integers(1, 4), ack=st.booleans())
    def receive(self, agent: str, n: int, ack: bool) -> None:
        got = self.bus.receive(agent, max_messages=n)
        assert [m.id for m in got] == self._expect(agent, n)
        self._check(got)
        if ack:
            self.bus.ack(agent, [m.id for m in got])
            self._acked(agent, [m.id for m in got])

    @rule(agent=st.sampled_from(AGENTS))
    def handle(self, agent: str) -> None:
        seen: list[IPCMessage] = []
        assert self.bus.handle(agent, seen.append) == len(seen)
        assert [m.id for m in seen] == self._expect(agent, 100)
        self._check(seen)
        self._acked(agent, [m.id for m in seen])

    @rule(agent=st.sampled_from(AGENTS))
    def crash_and_recover(self, agent: str) -> None:
        assert self.bus.recover(agent) == len(self.pending[agent])
        self.replay[agent] = list(self.pending[agent])

"""The context fabric: task-shared state, private layers that never leak, messages."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from ctxkeep import (
    CognitiveState,
    ContextFabric,
    ContextLayer,
    IPCMessage,
    StaleTaskStateError,
    open_checkpoints,
)
from ctxkeep.errors import (
    CognitiveStateSchemaVersionError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    UnknownAgentError,
)
from ctxkeep.fabric import InProcessBus

# -- task-shared -------------------------------------------------------------------------


def test_task_context_is_copied_in_and_out() -> None:
    fabric = ContextFabric()
    mine = {"goal": "ship", "constraints": ["tests pass"]}
    fabric.set_task_context("a", mine, task_id="t")
    mine["constraints"].append("changed by caller")
    got = fabric.task_context("a")
    assert got == {"goal": "ship", "constraints": ["tests pass"]}
    got["goal"] = "changed by reader"
    assert fabric.task_context("a")["goal"] == "ship"


def test_agents_of_a_task_share_its_state() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    fabric.set_task_context("b", {}, task_id="t")
    assert fabric.task_context("b") == {"goal": "g"}
    assert fabric.agents("t") == ["a", "b"]


def test_joining_a_task_never_overwrites_its_state() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    assert fabric.set_task_context("b", {"goal": "g"}, task_id="t") == 1  # same: fine
    with pytest.raises(StaleTaskStateError):
        fabric.set_task_context("c", {"goal": "other"}, task_id="t")
    assert fabric.task_context("a") == {"goal": "g"}


def test_stale_write_is_refused_not_lost() -> None:
    fabric = ContextFabric()
    v = fabric.set_task_context("a", {"decisions": []}, task_id="t")
    fabric.set_task_context("b", {}, task_id="t")
    v2 = fabric.update_task_context("a", {"decisions": ["use sqlite"]}, expected_version=v)
    with pytest.raises(StaleTaskStateError) as info:
        fabric.update_task_context("b", {"decisions": ["use redis"]}, expected_version=v)
    assert info.value.current == v2
    assert fabric.task_context("a")["decisions"] == ["use sqlite"]
    fabric.update_task_context("b", {"decisions": ["use sqlite", "use redis"]}, expected_version=v2)
    assert fabric.task_version("t") == v2 + 1


def test_unknown_agent_is_a_lookup_error() -> None:
    with pytest.raises(LookupError):
        ContextFabric().task_context("ghost")
    with pytest.raises(UnknownAgentError):
        ContextFabric().send("ghost", {"x": 1}, recipient="a")


# -- private -------------------------------------------------------------------------------


def test_private_is_copied_and_per_agent() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    fabric.set_task_context("b", {}, task_id="t")
    note = {"hypothesis": ["h1"]}
    fabric.set_private("a", "scratch", note)
    note["hypothesis"].append("h2")
    assert fabric.private("a") == {"scratch": {"hypothesis": ["h1"]}}
    assert fabric.private("b") == {}
    assert "scratch" not in fabric.task_context("b")


def test_context_view_is_read_only_and_keeps_layers_apart() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g", "deps": ["x"]}, task_id="t")
    fabric.set_private("a", "scratch", {"idea": [1]})
    view = fabric.context_view("a")
    assert view.layer(ContextLayer.TASK_SHARED)["goal"] == "g"
    assert view.layer(ContextLayer.AGENT_PRIVATE)["scratch"]["idea"] == (1,)
    with pytest.raises(TypeError):
        view.task["goal"] = "changed"  # type: ignore[index]
    with pytest.raises(TypeError):
        view.private["scratch"]["idea"] = 2  # type: ignore[index]
    with pytest.raises(AttributeError):
        view.task["deps"].append("y")  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        view.layer(ContextLayer.IPC)


# -- cognition -----------------------------------------------------------------------------


def test_set_cognitive_state_upgrades_legacy_and_checkpoint_copies() -> None:
    fabric = ContextFabric()
    fabric.set_cognitive_state("a", {"memory": {"m": 1}})
    cp = fabric.checkpoint_cognitive("a")
    assert cp.working_memory == {"m": 1} and cp.schema_version == 1
    cp.working_memory["m"] = 2
    assert fabric.checkpoint_cognitive("a").working_memory == {"m": 1}
    with pytest.raises(CognitiveStateSchemaVersionError):
        fabric.set_cognitive_state("a", {"schema_version": 99})


def test_checkpoint_and_restore_through_a_store(tmp_path: Path) -> None:
    store = open_checkpoints(f"sqlite:///{tmp_path}/cp.db")
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    fabric.set_private("a", "scratch", ["mine"])
    fabric.set_cognitive_state("a", CognitiveState(decision="step 3"))
    fabric.save_checkpoint("a", store, session_id="s-1")
    fresh = ContextFabric()
    assert fresh.restore_checkpoint("a", store)
    assert fresh.cognitive_state("a").decision == "step 3"
    assert fresh.private("a") == {"scratch": ["mine"]}
    assert fresh.task_id_of("a") == "t"
    assert store.latest_session_for_agent("a") == "s-1"
    assert not fresh.restore_checkpoint("nobody", store)


# -- messages ---------------------------------------------------------------------------------
# The delivery rules of the bus are the contract's (tests/contract/test_bus_contract.py).


def test_an_ipc_message_needs_exactly_one_of_recipient_or_topic() -> None:
    with pytest.raises(InvalidMessageError):
        IPCMessage(sender="a", payload=1)
    with pytest.raises(InvalidMessageError):
        IPCMessage(sender="a", payload=1, recipient="b", topic="news", task_id="t")


def test_a_topic_message_needs_a_task() -> None:
    with pytest.raises(InvalidMessageError):
        IPCMessage(sender="a", payload=1, topic="news")


def test_an_ipc_message_refuses_a_field_of_the_wrong_type() -> None:
    with pytest.raises(InvalidTypeError):
        IPCMessage(sender="a", payload=1, recipient=["b"])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        IPCMessage(sender="a", payload=1, recipient="b", created_at="now")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        IPCMessage.from_dict({"sender": "a", "payload": 1, "recipient": "b", "bogus": 1})


def test_the_in_process_bus_refuses_malformed_arguments_with_typed_errors() -> None:
    bus = InProcessBus()
    bus.register("a", "t")
    with pytest.raises(InvalidTypeError):
        bus.send({"sender": "a", "payload": 1, "recipient": "b"})  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.receive(["a"])  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.receive("a", max_messages="all")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.ack("a", 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        bus.subscribe("a", ["news"])  # type: ignore[arg-type]


# -- malformed input: typed errors, nothing changed -----------------------------------------


def test_a_value_that_cannot_be_copied_is_refused_and_nothing_changes() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    with pytest.raises(InvalidTypeError):
        fabric.set_private("a", "lock", threading.Lock())
    with pytest.raises(InvalidTypeError):
        fabric.update_task_context("a", {"lock": threading.Lock()}, expected_version=1)
    with pytest.raises(InvalidTypeError):
        fabric.set_task_context("b", {"lock": threading.Lock()}, task_id="t2")
    assert fabric.private("a") == {}
    assert fabric.task_context("a") == {"goal": "g"} and fabric.task_version("t") == 1
    assert fabric.agents("t2") == []


def test_a_task_id_in_the_mapping_must_be_a_string() -> None:
    with pytest.raises(InvalidTypeError):
        ContextFabric().set_task_context("a", {"task_id": 5})


def test_an_expected_version_that_is_not_an_int_is_a_type_error_not_a_stale_write() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    with pytest.raises(InvalidTypeError):
        fabric.update_task_context("a", {"x": 1}, expected_version="1")  # type: ignore[arg-type]
    assert fabric.task_version("t") == 1


def test_a_cognitive_state_no_checkpoint_could_hold_is_refused_when_set() -> None:
    fabric = ContextFabric()
    fabric.set_cognitive_state("a", CognitiveState(decision="go"))
    with pytest.raises(InvalidTypeError):
        fabric.set_cognitive_state("a", {"schema_version": 1, "context": {"obj": object()}})
    assert fabric.cognitive_state("a").decision == "go"


def test_an_unknown_context_layer_is_a_config_error() -> None:
    fabric = ContextFabric()
    fabric.set_task_context("a", {"goal": "g"}, task_id="t")
    view = fabric.context_view("a")
    assert view.layer("task_shared") == view.task  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        view.layer("scratchpad")  # type: ignore[arg-type]


# -- the state machine: private never leaks --------------------------------------------------

AGENTS = ["alpha", "beta", "gamma"]
TASKS = ["t1", "t2"]


class FabricMachine(RuleBasedStateMachine):
    """Random operations by several agents; every private value carries a unique canary."""

    canaries = Bundle("canaries")

    @initialize()
    def setup(self) -> None:
        self.fabric = ContextFabric()
        self.store = open_checkpoints("memory://")
        self.owner: dict[str, str] = {}  # canary -> owning agent
        self.counter = 0
        self.seen_messages: list[IPCMessage] = []
        for i, agent in enumerate(AGENTS):
            self.fabric.set_task_context(agent, {"goal": f"g{i % 2}"}, task_id=TASKS[i % 2])
            self.fabric.bus.subscribe(agent, "news")

    def _canary(self, agent: str) -> str:
        self.counter += 1
        c = f"CANARY-{agent}-{self.counter}-7f3e"
        self.owner[c] = agent
        return c

    @rule(agent=st.sampled_from(AGENTS), key=st.sampled_from(["scratch", "hypothesis", "obs"]))
    def set_private(self, agent: str, key: str) -> None:
        self.fabric.set_private(agent, key, {"note": self._canary(agent), "list": [1, 2]})

    @rule(agent=st.sampled_from(AGENTS), value=st.text(max_size=10))
    def update_task(self, agent: str, value: str) -> None:
        tid = self.fabric.task_id_of(agent)
        version = self.fabric.task_version(tid)
        # agents write what they see in the task, never their scratchpad
        visible = self.fabric.context_view(agent).task
        self.fabric.update_task_context(
            agent, {"decision": value, "seen": len(visible)}, expected_version=version
        )

    @rule(agent=st.sampled_from(AGENTS), other=st.sampled_from(AGENTS), text=st.text(max_size=8))
    def send_direct(self, agent: str, other: str, text: str) -> None:
        self.fabric.send(
            agent, {"text": text, "task": self.fabric.task_context(agent)}, recipient=other
        )

    @rule(agent=st.sampled_from(AGENTS))
    def publish(self, agent: str) -> None:
        self.fabric.send(agent, {"update": self.fabric.task_context(agent)}, topic="news")

    @rule(agent=st.sampled_from(AGENTS))
    def receive(self, agent: str) -> None:
        self.seen_messages.extend(self.fabric.bus.receive(agent))

    @rule(agent=st.sampled_from(AGENTS))
    def think(self, agent: str) -> None:
        self.fabric.set_cognitive_state(
            agent, CognitiveState(working_memory={"thought": self._canary(agent)})
        )

    @rule(agent=st.sampled_from(AGENTS))
    def checkpoint(self, agent: str) -> None:
        self.fabric.save_checkpoint(agent, self.store)

    @rule(agent=st.sampled_from(AGENTS))
    def restore(self, agent: str) -> None:
        self.fabric.restore_checkpoint(agent, self.store)

    def _leaks(self, blob: str, allowed_owner: str | None) -> list[str]:
        return [c for c, owner in self.owner.items() if c in blob and owner != allowed_owner]

    @invariant()
    def no_canary_outside_its_agent(self) -> None:
        if not hasattr(self, "fabric"):
            return
        for task in TASKS:
            members = self.fabric.agents(task)
            if members:
                state = json.dumps(self.fabric.task_context(members[0]))
                assert not self._leaks(state, None), "private value in task state"
        for agent in AGENTS:
            view = self.fabric.context_view(agent)
            task_blob = json.dumps(dict(view.task), default=str)
            assert not self._leaks(task_blob, None), "private value in a task view"
            private_blob = repr(view.private)
            assert not self._leaks(private_blob, agent), "another agent's private value"
            for cp in self.store.history(agent, limit=100):
                blob = repr(cp.private) + repr(cp.state)
                assert not self._leaks(blob, agent), "another agent's value in a checkpoint"
        for m in self.seen_messages:
            assert not self._leaks(json.dumps(m.to_dict()), None), "private value on the bus"


FabricMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_private_never_leaks = FabricMachine.TestCase

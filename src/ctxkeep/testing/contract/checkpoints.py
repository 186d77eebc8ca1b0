"""The checkpoint conformance suite: :class:`CheckpointContract`."""

from __future__ import annotations

import threading
from typing import Any

import pytest


class CheckpointContract:
    """Behaviours every :class:`~ctxkeep.checkpoints.CheckpointStore` must show.

    Provide a ``checkpoints`` fixture yielding a fresh, empty store.
    """

    @pytest.fixture
    def checkpoints(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def test_latest_is_the_newest_save(self, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        assert checkpoints.latest("agent-cp") is None
        for step in range(3):
            checkpoints.save("agent-cp", CognitiveState(decision={"step": step}))
        latest = checkpoints.latest("agent-cp")
        assert latest.state.decision == {"step": 2}
        assert latest.seq == 3

    def test_history_is_newest_first_and_per_agent(self, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        for step in range(4):
            checkpoints.save("agent-h", CognitiveState(decision=step))
            checkpoints.save("agent-other", CognitiveState(decision=-step))
        history = checkpoints.history("agent-h", limit=3)
        assert [cp.state.decision for cp in history] == [3, 2, 1]
        assert all(cp.agent_id == "agent-h" for cp in history)

    def test_load_by_id_round_trips_everything(self, checkpoints: Any) -> None:
        from datetime import UTC, datetime

        from ctxkeep.cognition import CognitiveState

        state = CognitiveState(
            context={"goal": "ship", "tags": {"a", "b"}},
            observation=("ok", 200),
            working_memory={"raw": b"\x00\xff", "when": datetime(2026, 1, 1, tzinfo=UTC)},
            decision="merge",
            tool_state={"cursor": 42},
            checkpoint={"step": 7},
        )
        cid = checkpoints.save(
            "agent-load",
            state,
            task_id="t",
            session_id="s",
            private={"scratch": ["x"]},
            metadata={"k": 1},
        )
        cp = checkpoints.load(cid)
        assert cp.state == state
        assert (cp.task_id, cp.session_id) == ("t", "s")
        assert cp.private == {"scratch": ["x"]} and cp.metadata == {"k": 1}

    def test_unknown_id_is_a_lookup_error(self, checkpoints: Any) -> None:
        with pytest.raises(LookupError):
            checkpoints.load("no-such-checkpoint")

    def test_returned_checkpoints_are_copies(self, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        private = {"notes": ["a"]}
        checkpoints.save("agent-copy", CognitiveState(working_memory={"m": [1]}), private=private)
        private["notes"].append("b")
        cp = checkpoints.latest("agent-copy")
        cp.state.working_memory["m"].append(2)
        cp.private["notes"].append("c")
        again = checkpoints.latest("agent-copy")
        assert again.state.working_memory == {"m": [1]} and again.private == {"notes": ["a"]}

    def test_unencodable_state_is_refused_and_nothing_stored(self, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        with pytest.raises(TypeError):
            checkpoints.save("agent-bad", CognitiveState(context={"obj": object()}))
        assert checkpoints.latest("agent-bad") is None

    def test_latest_session_comes_from_checkpoints(self, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        checkpoints.save("agent-s", CognitiveState(), session_id="s1")
        checkpoints.save("agent-s", CognitiveState(), session_id="s2")
        checkpoints.save("agent-s", CognitiveState())
        assert checkpoints.latest_session_for_agent("agent-s") == "s2"
        assert checkpoints.latest_session_for_agent("agent-none") is None

    def test_legacy_state_is_upgraded_on_save(self, checkpoints: Any) -> None:
        cid = checkpoints.save("agent-legacy", {"memory": {"m": 1}, "tools": {"t": 2}})
        cp = checkpoints.load(cid)
        assert cp.state.working_memory == {"m": 1} and cp.state.tool_state == {"t": 2}

    def test_concurrent_saves_get_distinct_sequence_numbers(self, checkpoints: Any) -> None:
        from ctxkeep.cognition import CognitiveState

        def writer(w: int) -> None:
            for i in range(10):
                checkpoints.save("agent-conc", CognitiveState(decision=f"{w}:{i}"))

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        history = checkpoints.history("agent-conc", limit=100)
        assert sorted(cp.seq for cp in history) == list(range(1, 41))

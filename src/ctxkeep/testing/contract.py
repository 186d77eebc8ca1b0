"""The conformance suite every session backend must pass, importable by third parties.

Subclass :class:`SessionContract` in a test module and provide a ``make_memory`` fixture: a
callable taking a :class:`~ctxkeep.MemoryConfig` (and an optional ``clock``) and returning a
fresh, empty :class:`~ctxkeep.MemoryManager` on your backend::

    import pytest
    from ctxkeep.testing.contract import SessionContract

    class TestMyBackend(SessionContract):
        @pytest.fixture
        def make_memory(self, tmp_path):
            def make(config, clock=None):
                return MemoryManager(MyBackend(...), config, **({"clock": clock} if clock else {}))
            return make

Every test uses its own sessions and cleans up through the manager.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from ctxkeep.episodic import (
    RetrievalConfig,
    format_prior_context,
    open_episodic,
    parse_prior_context,
)
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
    MissingToolResultError,
    OrphanToolResultError,
    SessionNotFoundError,
)
from ctxkeep.messages import Message, ToolCall, validate_sequence
from ctxkeep.sessions.aio import AsyncMemoryManager
from ctxkeep.sessions.base import Evicted, MemoryConfig, MemoryManager

MakeMemory = Callable[..., MemoryManager]


class Clock:
    """A settable clock for TTL and LRU tests."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


def full_message(i: int) -> Message:
    """A message with every field set."""
    return Message(
        "assistant",
        [{"type": "text", "text": f"step {i} ünïcode 日本"}],
        name="planner",
        turn_id=f"turn-{i}",
        tool_calls=[ToolCall(id=f"call-{i}", name="search", arguments='{"q": "x", "n": 1}')],
        event_kind="action",
        parent_id=f"parent-{i}",
        id=f"msg-{i}",
        artifact_refs=["sha256:" + "a" * 64],
        metadata={"k": [1, 2.5, None, True, "s"], "nested": {"a": {"b": "c"}}},
        extra={"refusal": None},
        created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    )


def tool_unit(i: int, n: int = 1) -> list[Message]:
    """An assistant call with ``n`` parallel calls and their results."""
    calls = [ToolCall(id=f"u{i}-{k}", name="f", arguments="{}") for k in range(n)]
    return [
        Message("assistant", None, tool_calls=calls),
        *[Message("tool", f"result {i}-{k}", tool_call_id=c.id) for k, c in enumerate(calls)],
    ]


class SessionContract:
    """Behaviours every :class:`MemoryManager` backend must show."""

    @pytest.fixture
    def make_memory(self) -> MakeMemory:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @pytest.fixture
    def memory(self, make_memory: MakeMemory) -> Any:
        mem = make_memory(MemoryConfig(max_history=None, session_ttl=None, max_sessions=None))
        yield mem
        mem.close()

    # -- basics --------------------------------------------------------------------------

    def test_messages_come_back_in_order(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-order")
        for i in range(20):
            memory.add_message(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
        assert [m.content for m in memory.get_messages(sid)] == [f"m{i}" for i in range(20)]

    def test_every_field_round_trips(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-fields")
        original = full_message(1)
        memory.add_structured_message(sid, original)
        memory.add_message(sid, "tool", "done", tool_call_id="call-1")
        back = memory.get_messages(sid)
        assert back[0] == original
        assert back[0].created_at == original.created_at
        assert back[1].tool_call_id == "call-1"

    def test_ids_and_timestamps_are_assigned(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-ids")
        stored = memory.add_message(sid, "user", "hi")
        assert stored.id and stored.created_at is not None
        assert memory.get_messages(sid)[0].id == stored.id

    def test_returned_messages_are_copies(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-copies")
        meta: dict[str, Any] = {"list": [1]}
        sent = Message("user", [{"type": "text", "text": "hi"}], metadata=meta)
        memory.add_structured_message(sid, sent)
        meta["list"].append(2)  # the caller's dict
        got = memory.get_messages(sid)
        got[0].metadata["list"].append(3)
        got[0].content[0]["text"] = "changed"  # type: ignore[index]
        again = memory.get_messages(sid)[0]
        assert again.metadata == {"list": [1]}
        assert again.text == "hi"

    def test_session_metadata_round_trips(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-meta", task_id="t-1", metadata={"a": [1, {"b": 2}]})
        info = memory.get_session(sid)
        assert info.agent_id == "agent-meta" and info.task_id == "t-1"
        assert info.metadata == {"a": [1, {"b": 2}]}

    def test_sequence_numbers_are_gapless(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-seq")
        for i in range(5):
            memory.add_message(sid, "user", str(i))
        memory.add_messages(sid, [Message("user", "a"), Message("assistant", "b")])
        info = memory.get_session(sid)
        assert info.next_seq == 8 and info.message_count == 7

    # -- bad input -----------------------------------------------------------------------

    def test_unknown_session_is_a_typed_error(self, memory: MemoryManager) -> None:
        with pytest.raises(SessionNotFoundError):
            memory.get_messages("no-such-session")
        with pytest.raises(SessionNotFoundError):
            memory.add_message("no-such-session", "user", "hi")
        with pytest.raises(LookupError):
            memory.get_session("no-such-session")

    def test_invalid_message_leaves_the_session_unchanged(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-bad")
        memory.add_message(sid, "user", "keep me")
        with pytest.raises(InvalidMessageError):
            memory.add_structured_message(sid, {"role": "wizard", "content": "x"})
        with pytest.raises(InvalidMessageError):
            memory.add_structured_message(sid, {"role": "user", "content": 42})
        with pytest.raises(InvalidMessageError):
            memory.add_message(sid, "user", "x", metadata={"when": datetime.now(UTC)})
        assert [m.content for m in memory.get_messages(sid)] == ["keep me"]

    def test_dangling_tool_id_is_refused_and_nothing_is_stored(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-dangling")
        memory.add_message(sid, "user", "go")
        with pytest.raises(OrphanToolResultError):
            memory.add_message(sid, "tool", "r", tool_call_id="ghost")
        batch = [*tool_unit(1)[:1], Message("user", "interrupt")]
        with pytest.raises(MissingToolResultError):
            memory.add_messages(sid, batch)
        assert [m.content for m in memory.get_messages(sid)] == ["go"]
        assert memory.get_session(sid).next_seq == 2

    def test_tool_results_may_arrive_later(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-later")
        memory.add_message(sid, "user", "go")
        unit = tool_unit(1, n=2)
        memory.add_structured_message(sid, unit[0])
        assert memory.get_session(sid).pending == ("u1-0", "u1-1")
        prompt = memory.build_prompt_messages(sid)
        assert [m.role for m in prompt] == ["user"]  # the waiting call is left out
        memory.add_messages(sid, unit[2:0:-1])  # results in reverse order
        validate_sequence(memory.get_messages(sid))
        assert memory.get_session(sid).pending == ()

    # -- bounds --------------------------------------------------------------------------

    def test_max_history_trims_whole_tool_units(self, make_memory: MakeMemory) -> None:
        evicted: list[Evicted] = []
        mem = make_memory(MemoryConfig(max_history=4, session_ttl=None, max_sessions=None))
        mem.add_evict_hook(evicted.append)
        try:
            sid = mem.create_session("agent-trim")
            mem.add_message(sid, "user", "task")
            for i in range(5):
                mem.add_messages(sid, tool_unit(i, n=2))  # 3 messages each
            history = mem.get_messages(sid)
            assert len(history) <= 4
            assert history[0].role != "tool"
            validate_sequence(history)
            trimmed = [m for e in evicted for m in e.messages]
            assert trimmed and all(e.reason == "max_history" for e in evicted)
            assert len(trimmed) + len(history) == 16
            assert [m.id for m in mem.archived_messages(sid)] == [m.id for m in trimmed]
        finally:
            mem.close()

    def test_ttl_expires_idle_sessions(self, make_memory: MakeMemory) -> None:
        clock = Clock()
        evicted: list[Evicted] = []
        mem = make_memory(MemoryConfig(session_ttl=60, max_sessions=None), clock=clock)
        mem.add_evict_hook(evicted.append)
        try:
            idle = mem.create_session("agent-ttl")
            mem.add_message(idle, "user", "old news")
            busy = mem.create_session("agent-ttl")
            clock.advance(40)
            mem.add_message(busy, "user", "still here")
            clock.advance(40)  # idle: 80 s without access; busy: 40 s
            assert mem.sweep() >= 1
            assert not mem.has_session(idle)
            assert mem.has_session(busy)
            with pytest.raises(SessionNotFoundError):
                mem.get_messages(idle)
            assert any(e.reason == "ttl" and e.session_id == idle for e in evicted)
        finally:
            mem.close()

    def test_reading_a_session_keeps_it_alive(self, make_memory: MakeMemory) -> None:
        clock = Clock()
        mem = make_memory(MemoryConfig(session_ttl=60, max_sessions=None), clock=clock)
        try:
            sid = mem.create_session("agent-alive")
            for _ in range(5):
                clock.advance(50)
                mem.get_messages(sid)
            assert mem.has_session(sid)
        finally:
            mem.close()

    def test_lru_evicts_the_least_recently_accessed(self, make_memory: MakeMemory) -> None:
        clock = Clock()
        mem = make_memory(MemoryConfig(session_ttl=None, max_sessions=3), clock=clock)
        try:
            ids = []
            for i in range(3):
                clock.advance(1)
                ids.append(mem.create_session(f"agent-lru-{i}"))
            clock.advance(1)
            mem.get_messages(ids[0])  # ids[1] is now the least recently accessed
            clock.advance(1)
            newest = mem.create_session("agent-lru-3")
            assert not mem.has_session(ids[1])
            assert all(mem.has_session(s) for s in (ids[0], ids[2], newest))
        finally:
            mem.close()

    # -- queries -------------------------------------------------------------------------

    def test_latest_session_per_agent(self, make_memory: MakeMemory) -> None:
        clock = Clock()
        mem = make_memory(MemoryConfig(session_ttl=None, max_sessions=None), clock=clock)
        try:
            first = mem.create_session("agent-latest")
            clock.advance(1)
            second = mem.create_session("agent-latest")
            clock.advance(1)
            mem.create_session("agent-other")
            assert mem.get_latest_session_for_agent("agent-latest") == second
            mem.delete_session(second)
            assert mem.get_latest_session_for_agent("agent-latest") == first
            assert mem.get_latest_session_for_agent("agent-nobody") is None
        finally:
            mem.close()

    def test_list_sessions_paginates_by_agent_and_task(self, make_memory: MakeMemory) -> None:
        clock = Clock()
        mem = make_memory(MemoryConfig(session_ttl=None, max_sessions=None), clock=clock)
        try:
            made = []
            for i in range(7):
                clock.advance(1)
                made.append(mem.create_session("agent-page", task_id="even" if i % 2 else "odd"))
            pages = [mem.list_sessions(agent_id="agent-page", limit=3, offset=o) for o in (0, 3, 6)]
            got = [s.session_id for p in pages for s in p]
            assert got == made[::-1]
            assert [len(p) for p in pages] == [3, 3, 1]
            odd = mem.list_sessions(task_id="odd", limit=50)
            assert {s.session_id for s in odd} == set(made[0::2])
        finally:
            mem.close()

    def test_delete_removes_the_session(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-delete")
        memory.add_message(sid, "user", "bye")
        assert memory.delete_session(sid) is True
        assert memory.delete_session(sid) is False
        with pytest.raises(SessionNotFoundError):
            memory.get_messages(sid)

    def test_build_prompt_messages_prunes_to_budget(self, memory: MemoryManager) -> None:
        from ctxkeep.prune import TokenPruner
        from ctxkeep.tokens import get_counter

        sid = memory.create_session("agent-prompt")
        memory.add_message(sid, "user", "task")
        for i in range(30):
            calls = [ToolCall(id=f"p{i}", name="bash", arguments="{}")]
            memory.add_messages(
                sid,
                [
                    Message("assistant", f"step {i}", tool_calls=calls),
                    Message("tool", "output line\n" * 300, tool_call_id=f"p{i}"),
                ],
            )
        counter = get_counter()
        prompt = memory.build_prompt_messages(
            sid, system="be careful", pruner=TokenPruner(3000, 6, counter=counter)
        )
        assert prompt[0].role == "system" and prompt[0].content == "be careful"
        assert counter.count_messages(prompt) <= 3000
        validate_sequence(prompt)

    def test_prompt_follows_appends_and_trims(self, make_memory: MakeMemory) -> None:
        mem = make_memory(MemoryConfig(max_history=6, session_ttl=None, max_sessions=None))
        try:
            sid = mem.create_session("agent-prompt-cache")
            for i in range(4):
                mem.add_message(sid, "user", f"u{i}")
            assert [m.content for m in mem.build_prompt_messages(sid)] == ["u0", "u1", "u2", "u3"]
            mem.add_message(sid, "user", "u4")
            assert [m.content for m in mem.build_prompt_messages(sid)][-1] == "u4"
            for i in range(5, 9):  # past max_history: the oldest are trimmed
                mem.add_message(sid, "user", f"u{i}")
            got = [m.content for m in mem.build_prompt_messages(sid)]
            assert (
                got == [m.content for m in mem.get_messages(sid)] == [f"u{i}" for i in range(3, 9)]
            )
            prompt = mem.build_prompt_messages(sid)
            prompt[0].metadata["x"] = 1  # type: ignore[index]
            assert mem.build_prompt_messages(sid)[0].metadata == {}
            mem.delete_session(sid)
            sid2 = mem.create_session("agent-prompt-cache", session_id=sid)
            mem.add_message(sid2, "user", "fresh")
            assert [m.content for m in mem.build_prompt_messages(sid2)] == ["fresh"]
        finally:
            mem.close()

    # -- concurrency ---------------------------------------------------------------------

    def test_concurrent_appends_lose_nothing(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-threads")
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                for i in range(50):
                    memory.add_message(sid, "user", f"{w}:{i}")
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        contents = [m.text for m in memory.get_messages(sid)]
        assert sorted(contents) == sorted(f"{w}:{i}" for w in range(4) for i in range(50))
        for w in range(4):  # each writer's messages in its own order
            mine = [c for c in contents if c.startswith(f"{w}:")]
            assert mine == [f"{w}:{i}" for i in range(50)]
        assert memory.get_session(sid).next_seq == 201

    # -- async twin ----------------------------------------------------------------------

    def test_async_twin_behaves_the_same(self, memory: MemoryManager) -> None:
        amem = AsyncMemoryManager(memory)

        async def scenario() -> list[Message]:
            sid = await amem.create_session("agent-async", task_id="t")
            await amem.add_message(sid, "user", "hi")
            await amem.add_messages(sid, tool_unit(1))
            with pytest.raises(OrphanToolResultError):
                await amem.add_message(sid, "tool", "x", tool_call_id="ghost")
            assert await amem.get_latest_session_for_agent("agent-async") == sid
            assert [s.session_id for s in await amem.list_sessions(agent_id="agent-async")] == [sid]
            msgs = await amem.get_messages(sid)
            assert await amem.delete_session(sid)
            return msgs

        msgs = asyncio.run(scenario())
        assert [m.role for m in msgs] == ["user", "assistant", "tool"]


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


EPISODE_FACTS = [
    "Caroline went to an LGBTQ support group on 7 May 2023",
    "Melanie painted a sunrise over the lake last year",
    "Caroline is researching adoption agencies",
    "Melanie ran a charity race for mental health",
    "The team fixed the invoice rounding bug by rounding once per invoice",
]


class EpisodicContract:
    """Behaviours every :class:`~ctxkeep.episodic.EpisodicMemoryStore` must show.

    Provide a ``store`` fixture yielding a fresh, empty store with the ``hash`` embedder.
    """

    @pytest.fixture
    def store(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @staticmethod
    def _fill(store: Any) -> list[str]:
        return [
            store.save_episode(
                f"s{i % 2}", "", text, agent_id=f"agent{i % 2}", task_id="t", metadata={"i": i}
            )
            for i, text in enumerate(EPISODE_FACTS)
        ]

    def test_search_finds_by_words(self, store: Any) -> None:
        self._fill(store)
        hits = store.search("what did Melanie paint?", top_k=2)
        assert "painted a sunrise" in hits[0].episode.summary
        assert hits[0].score >= hits[1].score

    def test_exact_duplicates_are_stored_once(self, store: Any) -> None:
        a = store.save_episode("s", "goal", "same text")
        b = store.save_episode("s", "goal", "same text")
        ids = store.save_episodes(
            [{"session_id": "s", "task_goal": "goal", "summary": "same text"}] * 3
        )
        assert a == b == ids[0] == ids[2]
        assert store.count() == 1

    def test_filters_by_agent_session_task_time_and_metadata(self, store: Any) -> None:
        self._fill(store)
        assert store.count({"agent_id": "agent1"}) == 2
        assert store.count({"session_id": "s0"}) == 3
        assert store.count({"task_id": "t"}) == 5
        assert store.count({"metadata": {"i": 4}}) == 1
        assert store.count({"since": 0, "until": 1}) == 0
        hits = store.search("Caroline", top_k=5, filters={"agent_id": "agent1"})
        assert all(h.episode.agent_id == "agent1" for h in hits)

    def test_forget_removes_from_every_index(self, store: Any) -> None:
        ids = self._fill(store)
        assert store.forget(episode_id=ids[1]) == 1
        assert all(h.episode.episode_id != ids[1] for h in store.search("painted sunrise lake", 5))
        assert store.forget(session_id="s0") == 3
        assert store.count() == 1
        assert store.forget(agent_id="agent1") == 1
        assert store.count() == 0 and store.search("anything", 3) == []
        with pytest.raises(ConfigError):
            store.forget()

    def test_returned_episodes_are_copies(self, store: Any) -> None:
        eid = store.save_episode("s", "g", "text", metadata={"k": [1]})
        store.get(eid).metadata["k"].append(2)
        assert store.get(eid).metadata == {"k": [1]}

    def test_bad_episodes_are_refused_and_nothing_is_stored(self, store: Any) -> None:
        with pytest.raises(InvalidMessageError):
            store.save_episodes([{"session_id": "s", "task_goal": "g", "summary": "ok"}, {"x": 1}])
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", "t", metadata={"bad": object()})
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", 42)
        assert store.count() == 0

    def test_neighbour_window_lets_a_turn_be_found_by_its_context(self, store: Any) -> None:
        # the answer turn shares no word with the question; its neighbour does
        s = store
        s.save_episode("chat", "", "Where did you travel for the kayak trip?")
        s.save_episode("chat", "", "To Norway, in the fjords!")
        s.save_episode("other", "", "Unrelated turn about cooking pasta")
        hits = s.search("kayak trip", top_k=3)
        assert {h.episode.summary for h in hits[:2]} >= {"To Norway, in the fjords!"}
        narrow = open_episodic("memory://", embedder="hash", config=RetrievalConfig(window=0))
        narrow.save_episode("chat", "", "Where did you travel for the kayak trip?")
        narrow.save_episode("chat", "", "To Norway, in the fjords!")
        lexical = narrow.search("kayak trip", top_k=2)
        assert lexical[0].episode.summary.startswith("Where")

    def test_search_relevant_context_returns_texts(self, store: Any) -> None:
        self._fill(store)
        texts = store.search_relevant_context("adoption", top_k=1)
        assert texts == ["Caroline is researching adoption agencies"]

    def test_search_hits_format_with_provenance(self, store: Any) -> None:
        self._fill(store)
        block = format_prior_context(store.search("Caroline adoption", top_k=2))
        _, items = parse_prior_context(block)
        assert items[0].session in ("s0", "s1") and items[0].score
        assert "UTC" in items[0].date

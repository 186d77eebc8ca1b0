"""The session conformance suite: :class:`SessionContract`."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from ctxkeep.errors import (
    InvalidMessageError,
    MessageIdConflictError,
    MissingToolResultError,
    OrphanToolResultError,
    SessionChangedError,
    SessionExistsError,
    SessionNotFoundError,
)
from ctxkeep.messages import FIELDS, Message, ToolCall, validate_sequence
from ctxkeep.sessions.aio import AsyncMemoryManager
from ctxkeep.sessions.base import Evicted, MemoryConfig, MemoryManager, default_memory_config
from ctxkeep.testing.contract._common import Clock, MakeMemory, full_message, tool_unit


def _texts(messages: list[Message]) -> list[Any]:
    return [m.content for m in messages]


class SessionContract:
    """Behaviours every :class:`MemoryManager` backend must show."""

    @pytest.fixture
    def make_memory(self) -> MakeMemory:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @pytest.fixture
    def memory(self, make_memory: MakeMemory) -> Any:
        mem = make_memory(default_memory_config())  # the limits a user gets by default
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

    def test_a_stored_record_leaves_out_the_fields_at_their_default(
        self, memory: MemoryManager
    ) -> None:
        # A record holds v, the role and each field that differs from its default (shorter
        # rows: fewer pages a write); a field left out reads back as its default, and an
        # empty string or list is not a default None.
        sid = memory.create_session("agent-compact")
        memory.add_message(sid, "user", "hi")
        memory.add_structured_message(sid, full_message(2))
        memory.add_message(sid, "tool", "", tool_call_id="call-2")
        memory.add_structured_message(sid, Message("assistant", [], name=""))
        got = memory.backend.read(sid)
        assert got is not None
        keys = [list(record) for _, record in got[1]]
        assert keys == [
            ["v", "role", "content", "id", "created_at"],
            ["v", *(name for name in FIELDS if name != "tool_call_id")],  # (an assistant's)
            ["v", "role", "content", "tool_call_id", "id", "created_at"],
            ["v", "role", "content", "name", "id", "created_at"],
        ]
        back = memory.get_messages(sid)
        assert back[0] == Message("user", "hi", id=back[0].id, created_at=back[0].created_at)
        assert back[1] == full_message(2)
        assert (back[2].content, back[3].content, back[3].name) == ("", [], "")

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

    # -- identity: a prompt never shows history its session no longer holds ---------------

    def test_prompt_after_lru_eviction_and_recreate_shows_only_the_new_history(
        self, make_memory: MakeMemory
    ) -> None:
        clock = Clock()
        mem = make_memory(MemoryConfig(max_sessions=1), clock=clock)
        try:
            mem.create_session("a", session_id="x")
            mem.add_message("x", "user", "old secret")
            mem.build_prompt_messages("x")
            clock.advance(1)
            mem.create_session("b")  # evicts x
            assert not mem.has_session("x")
            mem.create_session("a", session_id="x")
            mem.add_message("x", "user", "new")
            assert _texts(mem.build_prompt_messages("x")) == ["new"]
            assert _texts(mem.get_messages("x")) == ["new"]
        finally:
            mem.close()

    @pytest.mark.parametrize("swept", [True, False])
    def test_prompt_after_ttl_expiry_and_recreate_shows_only_the_new_history(
        self, make_memory: MakeMemory, swept: bool
    ) -> None:
        clock = Clock()
        mem = make_memory(MemoryConfig(session_ttl=60), clock=clock)
        try:
            mem.create_session("a", session_id="x")
            mem.add_message("x", "user", "old secret")
            mem.build_prompt_messages("x")
            clock.advance(120)
            if swept:
                assert mem.sweep() == 1
            mem.create_session("a", session_id="x")  # expired: the id is free again
            mem.add_message("x", "user", "new")
            assert _texts(mem.build_prompt_messages("x")) == ["new"]
        finally:
            mem.close()

    def test_prompt_after_delete_and_recreate_shows_only_the_new_history(
        self, memory: MemoryManager
    ) -> None:
        memory.create_session("a", session_id="x")
        memory.add_message("x", "user", "old secret")
        memory.build_prompt_messages("x")
        assert memory.delete_session("x")
        memory.create_session("a", session_id="x")
        memory.add_message("x", "user", "new")
        assert _texts(memory.build_prompt_messages("x")) == ["new"]

    def test_prompt_after_the_store_drops_a_session_silently_shows_only_the_new_history(
        self, memory: MemoryManager
    ) -> None:
        memory.create_session("a", session_id="x")
        memory.add_message("x", "user", "old secret")
        memory.build_prompt_messages("x")
        memory.backend.delete("x")  # as native expiry does, behind the manager's back
        memory.create_session("a", session_id="x")
        memory.add_message("x", "user", "new")
        assert _texts(memory.build_prompt_messages("x")) == ["new"]

    def test_prompt_after_another_manager_recreates_the_session_shows_only_the_new_history(
        self, memory: MemoryManager
    ) -> None:
        other = MemoryManager(memory.backend, memory.config)  # another process, same store
        memory.create_session("a", session_id="x")
        memory.add_message("x", "user", "old secret")
        memory.build_prompt_messages("x")
        other.delete_session("x")
        other.create_session("a", session_id="x")
        other.add_message("x", "user", "new")
        assert _texts(memory.build_prompt_messages("x")) == ["new"]

    def test_prompt_after_another_manager_trims_shows_what_the_session_holds(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("a")
        for i in range(4):
            memory.add_message(sid, "user", f"m{i}")
        assert len(memory.build_prompt_messages(sid)) == 4
        other = MemoryManager(memory.backend, MemoryConfig(max_history=2))
        other.add_message(sid, "user", "m4")  # trims m0..m2 away
        assert _texts(memory.build_prompt_messages(sid)) == ["m3", "m4"]
        assert _texts(memory.get_messages(sid)) == ["m3", "m4"]

    def test_generation_changes_when_a_session_is_created_again(
        self, memory: MemoryManager
    ) -> None:
        memory.create_session("a", session_id="x")
        first = memory.get_session("x").generation
        memory.delete_session("x")
        memory.create_session("a", session_id="x")
        assert first and memory.get_session("x").generation not in ("", first)

    # -- taking messages back (pop) ----------------------------------------------------------

    def test_pop_takes_back_the_newest_message(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-pop")
        for text in ("one", "two", "three"):
            memory.add_message(sid, "user", text)
        popped = memory.pop_message(sid)
        assert popped is not None and popped.content == "three"
        assert _texts(memory.get_messages(sid)) == ["one", "two"]
        memory.add_message(sid, "user", "four")
        assert _texts(memory.get_messages(sid)) == ["one", "two", "four"]
        info = memory.get_session(sid)
        assert info.message_count == 3 and info.revision == 1

    def test_pop_of_an_empty_session_returns_none(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-pop-empty")
        assert memory.pop_message(sid) is None
        memory.add_message(sid, "user", "only")
        assert memory.pop_message(sid) is not None
        assert memory.pop_message(sid) is None
        assert memory.get_messages(sid) == []

    def test_pop_of_unknown_session_is_a_typed_error(self, memory: MemoryManager) -> None:
        with pytest.raises(SessionNotFoundError):
            memory.pop_message("no-such-session")

    def test_pop_of_a_tool_result_leaves_its_call_waiting_again(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-pop-tool")
        memory.add_message(sid, "user", "go")
        memory.add_messages(sid, tool_unit(1, n=2))
        popped = memory.pop_message(sid)
        assert popped is not None and popped.role == "tool"
        assert memory.get_session(sid).pending == (popped.tool_call_id,)
        assert [m.role for m in memory.build_prompt_messages(sid)] == ["user"]
        with pytest.raises(MissingToolResultError):
            memory.add_message(sid, "user", "too early")
        memory.add_structured_message(sid, popped)
        assert memory.get_session(sid).pending == ()

    def test_pop_of_a_tool_call_takes_its_calls_with_it(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-pop-call")
        memory.add_message(sid, "user", "go")
        memory.add_messages(sid, tool_unit(1, n=2)[:1])  # the call, results still to come
        popped = memory.pop_message(sid)
        assert popped is not None and popped.tool_calls
        assert memory.get_session(sid).pending == ()
        memory.add_message(sid, "user", "never mind")
        validate_sequence(memory.get_messages(sid))

    def test_prompt_after_another_manager_pops_shows_what_the_session_holds(
        self, memory: MemoryManager
    ) -> None:
        other = MemoryManager(memory.backend, memory.config)
        sid = memory.create_session("agent-pop-other")
        for text in ("a", "b"):
            memory.add_message(sid, "user", text)
        assert _texts(memory.build_prompt_messages(sid)) == ["a", "b"]
        other.pop_message(sid)
        other.add_message(sid, "user", "c")
        assert _texts(memory.build_prompt_messages(sid)) == ["a", "c"]

    # -- replacing the newest message atomically -------------------------------------------

    def test_replace_newest_swaps_the_newest_message_in_one_step(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-replace")
        memory.add_message(sid, "user", "go")
        call = memory.add_messages(sid, tool_unit(1, n=2)[:1])[0]
        assert memory.get_session(sid).pending == ("u1-0", "u1-1")
        assert _texts(memory.build_prompt_messages(sid)) == ["go"]  # cached; calls wait
        # The same message with one more call: valid on the session without the newest.
        more = call.replace(id=None, tool_calls=[*call.tool_calls, ToolCall("u1-2", "f", "{}")])
        stored = memory.replace_newest(sid, [more], newest_id=call.id or "")
        assert memory.get_session(sid).pending == ("u1-0", "u1-1", "u1-2")
        got = memory.get_messages(sid)
        assert [m.id for m in got][-1] == stored[0].id != call.id
        assert [tc.id for tc in got[-1].tool_calls] == ["u1-0", "u1-1", "u1-2"]
        assert memory.get_session(sid).message_count == 2
        # The cached prompt sees the swap (the revision moved).
        memory.add_messages(
            sid, [Message("tool", f"r{k}", tool_call_id=f"u1-{k}") for k in range(3)]
        )
        prompt = memory.build_prompt_messages(sid)
        assert [len(m.tool_calls) for m in prompt] == [0, 3, 0, 0, 0]
        validate_sequence(prompt)

    def test_replace_newest_based_on_a_stale_read_changes_nothing(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-replace-stale")
        first = memory.add_message(sid, "user", "one")
        memory.add_message(sid, "user", "two")
        with pytest.raises(SessionChangedError):
            memory.replace_newest(sid, [Message("user", "x")], newest_id=first.id or "")
        assert _texts(memory.get_messages(sid)) == ["one", "two"]
        empty = memory.create_session("agent-replace-empty")
        with pytest.raises(SessionChangedError):
            memory.replace_newest(empty, [], newest_id="nothing")
        with pytest.raises(SessionNotFoundError):
            memory.replace_newest("no-such-session", [], newest_id="x")

    def test_an_invalid_replacement_changes_nothing(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-replace-invalid")
        memory.add_message(sid, "user", "go")
        unit = memory.add_messages(sid, tool_unit(1, n=1))
        before = memory.get_session(sid)
        orphan = Message("tool", "r", tool_call_id="nobody")
        with pytest.raises(OrphanToolResultError):
            memory.replace_newest(sid, [orphan], newest_id=unit[-1].id or "")
        assert [m.id for m in memory.get_messages(sid)][-1] == unit[-1].id
        after = memory.get_session(sid)
        assert (after.pending, after.revision, after.message_count) == (
            before.pending,
            before.revision,
            before.message_count,
        )

    def test_replace_newest_with_nothing_is_a_conditional_pop(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-replace-pop")
        memory.add_message(sid, "user", "one")
        memory.add_message(sid, "user", "two")
        popped = memory.pop_message(sid)  # leaves a gap in the sequence numbers
        assert popped is not None
        three = memory.add_message(sid, "user", "three")
        assert memory.replace_newest(sid, [], newest_id=three.id or "") == []
        assert _texts(memory.get_messages(sid)) == ["one"]
        assert memory.get_session(sid).revision == 2

    def test_duplicate_session_id_is_a_typed_error(self, memory: MemoryManager) -> None:
        memory.create_session("a", session_id="dup")
        memory.add_message("dup", "user", "kept")
        with pytest.raises(SessionExistsError, match="already exists"):
            memory.create_session("b", session_id="dup")
        assert _texts(memory.get_messages("dup")) == ["kept"]
        assert memory.get_session("dup").agent_id == "a"

    def test_native_ttl_reclaims_idle_sessions_without_a_sweep(
        self, make_memory: MakeMemory
    ) -> None:
        mem = make_memory(MemoryConfig(session_ttl=0.2))
        try:
            if not mem.backend.supports_native_ttl:
                pytest.skip(f"{mem.backend.name} does not declare supports_native_ttl")
            sid = mem.create_session("a")
            mem.add_message(sid, "user", "soon gone")
            deadline = time.monotonic() + 10
            while mem.backend.info(sid, touch=None, ttl=None) is not None:
                assert time.monotonic() < deadline, "the store never expired the session"
                time.sleep(0.05)
            assert not mem.has_session(sid)
        finally:
            mem.close()

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

    def test_remove_oldest_archives_and_removes_in_one_step(self, memory: MemoryManager) -> None:
        backend = memory.backend
        sid = memory.create_session("agent-move")
        for i in range(10):
            memory.add_message(sid, "user", f"m{i}", id=f"m{i}")
        generation = memory.get_session(sid).generation
        moved = backend.remove_oldest(sid, 4, generation, archive=True)
        assert [(seq, r["id"]) for seq, r in moved] == [(i + 1, f"m{i}") for i in range(4)]
        assert [m.id for m in memory.archived_messages(sid)] == ["m0", "m1", "m2", "m3"]
        assert [m.id for m in memory.get_messages(sid)] == [f"m{i}" for i in range(4, 10)]
        info = memory.get_session(sid)
        assert (info.first_seq, info.message_count) == (5, 6)
        assert backend.remove_oldest(sid, 4, generation, archive=True) == []  # moved already
        assert backend.remove_oldest(sid, 8, "another generation", archive=True) == []
        assert [seq for seq, _ in backend.remove_oldest(sid, 6, generation)] == [5, 6]
        assert len(memory.archived_messages(sid)) == 4  # without archive: removed only
        assert [m.id for m in memory.get_messages(sid)] == ["m6", "m7", "m8", "m9"]

    def test_delete_with_archive_archives_and_deletes_in_one_step(
        self, memory: MemoryManager
    ) -> None:
        backend = memory.backend
        sid = memory.create_session("agent-evict-step")
        for i in range(3):
            memory.add_message(sid, "user", f"m{i}", id=f"m{i}")
        generation = memory.get_session(sid).generation
        assert not backend.delete(sid, "another generation", archive="lru")
        assert memory.archived_messages(sid) == []
        assert backend.delete(sid, generation, archive="lru")
        assert not memory.has_session(sid)
        assert [m.id for m in memory.archived_messages(sid)] == ["m0", "m1", "m2"]
        kept = memory.create_session("agent-evict-step", session_id="kept")
        memory.add_message(kept, "user", "x")
        assert backend.delete(kept)  # without archive: deleted only
        assert memory.archived_messages(kept) == []

    def test_concurrent_trims_archive_each_message_once_in_session_order(
        self, make_memory: MakeMemory
    ) -> None:
        """Writers past ``max_history`` at once: every message ends live or archived, once,
        the archive in seq order, and the hooks get exactly what was archived (issue 25).
        """
        mem = make_memory(MemoryConfig(max_history=20, session_ttl=None, max_sessions=None))
        hooked: list[str] = []
        mem.add_evict_hook(lambda e: hooked.extend(str(m.id) for m in e.messages))
        seq_of: dict[str, int] = {}
        backend, append = mem.backend, mem.backend.append

        def recording_append(session_id: str, batch: Any) -> list[int]:
            seqs: list[int] = append(session_id, batch)
            seq_of.update({r["id"]: s for s, r in zip(seqs, batch.records, strict=True)})
            return seqs

        backend.append = recording_append  # type: ignore[method-assign]
        errors: list[BaseException] = []
        try:
            sid = mem.create_session("agent-trim-race")

            def writer(w: int) -> None:
                try:
                    for i in range(40):
                        mem.add_message(sid, "user", f"{w}:{i}", id=f"w{w}-{i}")
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            live = [str(m.id) for m in mem.get_messages(sid)]
            archived = [str(m.id) for m in mem.archived_messages(sid)]
        finally:
            del backend.append
            mem.close()
        assert not errors
        assert sorted(live + archived) == sorted(f"w{w}-{i}" for w in range(4) for i in range(40))
        assert len(live) <= 20
        assert archived + live == sorted(archived + live, key=seq_of.__getitem__)
        assert sorted(hooked) == sorted(archived)

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

    def test_append_to_a_session_idle_past_its_ttl_is_refused_and_reclaims_it(
        self, make_memory: MakeMemory
    ) -> None:
        clock = Clock()
        evicted: list[Evicted] = []
        mem = make_memory(MemoryConfig(session_ttl=60, max_sessions=None), clock=clock)
        mem.add_evict_hook(evicted.append)
        try:
            sid = mem.create_session("agent-ttl-append")
            mem.add_message(sid, "user", "old news")
            clock.advance(61)
            with pytest.raises(SessionNotFoundError):
                mem.add_message(sid, "user", "too late")
            assert not mem.has_session(sid)
            assert [(e.reason, _texts(e.messages)) for e in evicted] == [("ttl", ["old news"])]
        finally:
            mem.close()

    # -- appends check the session as stored ---------------------------------------------

    def test_append_after_a_pop_is_checked_against_the_call_waiting_again(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-cas")
        memory.add_messages(sid, tool_unit(1))
        memory.add_message(sid, "assistant", "done")
        memory.pop_message(sid)
        memory.pop_message(sid)  # the tool result: its call waits again
        with pytest.raises(MissingToolResultError):
            memory.add_message(sid, "user", "next")
        assert [m.role for m in memory.get_messages(sid)] == ["assistant"]
        memory.add_message(sid, "tool", "again", tool_call_id="u1-0")
        memory.add_message(sid, "user", "next")
        assert [m.role for m in memory.get_messages(sid)] == ["assistant", "tool", "user"]

    def test_append_after_a_pop_of_a_call_is_checked_against_no_call_waiting(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-cas")
        memory.add_message(sid, "user", "go")
        memory.add_message(
            sid, "assistant", None, tool_calls=[ToolCall("c1", "f", "{}")]
        )  # waits for c1
        memory.pop_message(sid)  # takes the call back: nothing waits
        memory.add_message(sid, "user", "again")
        with pytest.raises(OrphanToolResultError):
            memory.add_message(sid, "tool", "late", tool_call_id="c1")
        assert _texts(memory.get_messages(sid)) == ["go", "again"]
        assert memory.get_session(sid).next_seq == 4  # a taken back seq is never reused

    def test_appends_of_two_managers_interleave_with_every_check_kept(
        self, memory: MemoryManager
    ) -> None:
        other = MemoryManager(memory.backend, memory.config)  # another process, same store
        sid = memory.create_session("agent-two")
        memory.add_message(sid, "user", "q")
        other.add_message(sid, "assistant", None, tool_calls=[ToolCall("c1", "f", "{}")])
        with pytest.raises(MissingToolResultError):
            memory.add_message(sid, "user", "interrupt")
        memory.add_message(sid, "tool", "r1", tool_call_id="c1")
        with pytest.raises(OrphanToolResultError):
            other.add_message(sid, "tool", "r1 again", tool_call_id="c1")
        other.add_message(sid, "user", "thanks")
        assert [m.role for m in memory.get_messages(sid)] == ["user", "assistant", "tool", "user"]
        assert memory.get_session(sid).next_seq == 5

    # -- the newest messages, read by themselves -----------------------------------------

    def test_read_tail_gives_the_newest_page_and_the_older_system_and_user_messages(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-tail")
        memory.add_message(sid, "system", "rules")
        memory.add_message(sid, "user", "u1")
        memory.add_message(sid, "developer", "more rules")
        memory.add_message(sid, "user", "u2")
        for i in range(6):
            memory.add_message(sid, "assistant", f"a{i}")
        backend = memory.backend
        roles = ("developer", "system")
        tail = backend.read_tail(sid, limit=3, roles=roles, newest_role="user")
        assert tail is not None
        assert tail.info.session_id == sid and tail.info.next_seq == 11
        assert [r[1]["content"] for r in tail.rows] == ["a3", "a4", "a5"]
        assert [seq for seq, _ in tail.rows] == [8, 9, 10]
        marks = {r[1]["content"] for r in tail.marks}
        assert {"rules", "more rules", "u2"} <= marks and "u1" not in marks
        assert [seq for seq, _ in tail.marks] == sorted(seq for seq, _ in tail.marks)
        older = backend.read_tail(sid, limit=4, before_seq=8, roles=roles, newest_role="user")
        assert older is not None
        assert [r[1]["content"] for r in older.rows] == ["u2", "a0", "a1", "a2"]
        assert {"rules", "more rules", "u1"} <= {r[1]["content"] for r in older.marks}
        every = backend.read_tail(sid, limit=None, before_seq=3)
        assert every is not None and [r[1]["content"] for r in every.rows] == ["rules", "u1"]
        assert backend.read_tail("no-such-session", limit=3) is None

    def test_paged_prompt_is_the_prompt_of_the_whole_session(self, memory: MemoryManager) -> None:
        from ctxkeep.prune import TokenPruner

        class WholePruner(TokenPruner):  # another type: the manager reads every message
            pass

        sid = memory.create_session("agent-pages")
        memory.add_message(sid, "system", "You are terse.")
        for i in range(40):
            memory.add_message(sid, "user", f"question {i} " + "word " * (i % 7) * 20)
            memory.add_messages(sid, tool_unit(i, n=1 + i % 3))
            memory.add_message(sid, "assistant", f"answer {i} " + "word " * (i % 5) * 30)
        memory.prompt_page = 4  # small pages: many of them
        args: dict[str, Any] = {"max_token_budget": 1500, "preserve_last_n": 4}
        paged = memory.build_prompt_messages(sid, pruner=TokenPruner(**args, cache_stable=False))
        whole = MemoryManager(memory.backend, memory.config).build_prompt_messages(
            sid, pruner=WholePruner(**args, cache_stable=False)
        )
        assert paged == whole
        assert paged[0].content == "You are terse." and len(paged) < 100
        memory.add_message(sid, "user", "one more " * 50)  # a turn on the paged cache
        paged = memory.build_prompt_messages(sid, pruner=TokenPruner(**args, cache_stable=False))
        whole = MemoryManager(memory.backend, memory.config).build_prompt_messages(
            sid, pruner=WholePruner(**args, cache_stable=False)
        )
        assert paged == whole

    # -- fold snapshots: the first cache-stable prompt of a process -----------------------

    def test_read_rows_gives_the_named_messages_and_every_newer_one(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-rows")
        for i in range(10):
            memory.add_message(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
        backend = memory.backend
        got = backend.read_rows(sid, seqs=[2, 5, 8, 40], after_seq=7)
        assert got is not None
        info, rows = got
        assert info.session_id == sid and info.next_seq == 11
        assert [seq for seq, _ in rows] == [2, 5, 8, 9, 10]
        assert [r["content"] for _, r in rows] == ["m1", "m4", "m7", "m8", "m9"]
        got = backend.read_rows(sid, seqs=[], after_seq=0)
        assert got is not None and [seq for seq, _ in got[1]] == list(range(1, 11))
        assert backend.read_rows("no-such-session", seqs=[1], after_seq=0) is None

    def test_read_after_a_seq_gives_the_row_and_only_the_newer_messages(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-after")
        for i in range(6):
            memory.add_message(sid, "user" if i % 2 == 0 else "assistant", f"m{i}")
        backend = memory.backend
        for after, expected in ((0, [1, 2, 3, 4, 5, 6]), (4, [5, 6]), (6, []), (99, [])):
            got = backend.read(sid, after)
            assert got is not None
            info, rows = got
            assert info.session_id == sid and info.next_seq == 7 and info.message_count == 6
            assert info.agent_id == "agent-after"
            assert [seq for seq, _ in rows] == expected
            assert [r["content"] for _, r in rows] == [f"m{s - 1}" for s in expected]
        assert backend.read("no-such-session", 3) is None
        empty = memory.create_session("agent-after")  # a row without messages
        got = backend.read(empty, 3)
        assert got is not None and got[1] == [] and got[0].message_count == 0

    def test_fold_snapshots_are_kept_per_key_for_one_generation_and_deleted_with_it(
        self, memory: MemoryManager
    ) -> None:
        backend = memory.backend
        if not backend.supports_folds:
            pytest.skip("the backend keeps no fold snapshots")
        sid = memory.create_session("agent-folds")
        gen = memory.get_session(sid).generation
        assert backend.get_fold(sid, "k1") is None
        backend.put_fold(sid, gen, "k1", '{"a": 1}')
        backend.put_fold(sid, gen, "k2", '{"b": 2}')
        backend.put_fold(sid, gen, "k1", '{"a": 3}')  # replaced
        assert backend.get_fold(sid, "k1") == '{"a": 3}'
        assert backend.get_fold(sid, "k2") == '{"b": 2}'
        backend.put_fold(sid, "another-generation", "k1", "stale")  # not this session's
        backend.put_fold("no-such-session", gen, "k1", "lost")
        assert backend.get_fold(sid, "k1") == '{"a": 3}'
        assert backend.get_fold("no-such-session", "k1") is None
        memory.delete_session(sid)
        memory.create_session("agent-folds", session_id=sid)  # the same id, created again
        assert backend.get_fold(sid, "k1") is None and backend.get_fold(sid, "k2") is None

    def test_cold_cache_stable_prompt_from_a_snapshot_is_the_whole_replay(
        self, memory: MemoryManager
    ) -> None:
        from ctxkeep.prune import TokenPruner

        class WholePruner(TokenPruner):  # another type: every message read, replayed whole
            pass

        sid = memory.create_session("agent-fold")
        memory.add_message(sid, "system", "You are terse.")
        args: dict[str, Any] = {"max_token_budget": 1200, "preserve_last_n": 4}
        for i in range(40):
            memory.add_message(sid, "user", f"question {i} " + "word " * (i % 7) * 20)
            memory.add_messages(sid, tool_unit(i, n=1 + i % 3))
            memory.add_message(sid, "assistant", f"answer {i} " + "word " * (i % 5) * 30)
            if i % 3 == 0:  # turns of a process: the fold stored at its cuts
                memory.build_prompt_messages(sid, pruner=TokenPruner(**args))
        memory.add_message(sid, "user", "one more " * 40)
        cold = MemoryManager(memory.backend, memory.config)  # a new process
        got = cold.build_prompt_messages(sid, pruner=TokenPruner(**args))
        whole = MemoryManager(memory.backend, memory.config).build_prompt_messages(
            sid, pruner=WholePruner(**args)
        )
        assert got == whole
        cached = cold._prompt_cache[sid]
        if memory.backend.supports_folds and isinstance(memory, MemoryManager):
            # The turns above stored the fold (a remote manager's service prunes on its side).
            assert cached.fold is not None and cached.fold.base > 0  # read from the snapshot

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

    # -- idempotent appends by message id ------------------------------------------------

    def test_an_append_sent_again_returns_the_stored_message_and_stores_nothing(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-retry")
        first = memory.add_message(sid, "user", "once", id="m-1")
        again = memory.add_structured_message(sid, Message("user", "once", id="m-1"))
        assert again == first and again.created_at == first.created_at
        assert [m.id for m in memory.get_messages(sid)] == ["m-1"]
        assert memory.get_session(sid).next_seq == 2

    def test_a_batch_sent_again_stores_nothing_even_after_its_tool_calls_were_answered(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-retry-batch")
        unit = memory.add_messages(sid, tool_unit(1, n=2))
        memory.add_message(sid, "user", "next")
        assert memory.add_messages(sid, unit) == unit  # its results would now be orphans
        assert memory.add_messages(sid, unit[:1]) == unit[:1]
        assert len(memory.get_messages(sid)) == 4

    def test_another_message_under_a_stored_id_is_a_conflict_and_stores_nothing(
        self, memory: MemoryManager
    ) -> None:
        sid = memory.create_session("agent-conflict")
        memory.add_message(sid, "user", "first", id="m-1")
        with pytest.raises(MessageIdConflictError) as caught:
            memory.add_message(sid, "user", "second", id="m-1")
        assert (caught.value.session_id, caught.value.message_id) == (sid, "m-1")
        with pytest.raises(MessageIdConflictError):  # a stored id beside a new one
            memory.add_messages(sid, [Message("user", "first", id="m-1"), Message("user", "x")])
        assert _texts(memory.get_messages(sid)) == ["first"]

    def test_a_batch_repeating_an_id_is_refused_whole(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-twice")
        with pytest.raises(InvalidMessageError) as caught:
            memory.add_messages(sid, [Message("user", "a", id="m"), Message("user", "a", id="m")])
        assert caught.value.index == 1
        assert memory.get_messages(sid) == []

    def test_an_id_trimmed_or_popped_away_may_be_appended_again(
        self, make_memory: MakeMemory
    ) -> None:
        mem = make_memory(MemoryConfig(max_history=2, session_ttl=None, max_sessions=None))
        try:
            sid = mem.create_session("agent-reuse")
            for i in range(4):
                mem.add_message(sid, "user", f"m{i}", id=f"m{i}")
            mem.add_message(sid, "user", "m0 again", id="m0")  # m0 was trimmed away
            popped = mem.pop_message(sid)
            assert popped is not None and popped.id == "m0"
            mem.add_message(sid, "user", "m0 once more", id="m0")
            assert _texts(mem.get_messages(sid)) == ["m3", "m0 once more"]
        finally:
            mem.close()

    def test_concurrent_retries_of_one_append_store_it_once(self, memory: MemoryManager) -> None:
        sid = memory.create_session("agent-racing-retries")
        results: list[Message] = []
        errors: list[BaseException] = []

        def sender() -> None:
            try:
                for i in range(20):
                    results.append(memory.add_message(sid, "user", f"m{i}", id=f"m{i}"))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=sender) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        stored = memory.get_messages(sid)
        assert sorted(str(m.id) for m in stored) == sorted(f"m{i}" for i in range(20))
        by_id = {m.id: m for m in stored}
        assert all(by_id[r.id] == r for r in results)

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

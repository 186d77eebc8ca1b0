"""A re-created session's prompt shows only its own history (issue 10's reproduction)."""

from __future__ import annotations

from pathlib import Path

import ctxkeep
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.memory import SessionMemory
from ctxkeep.testing.contract import Clock


def _contents(msgs: list[ctxkeep.Message]) -> list[object]:
    return [m.content for m in msgs]


def test_prompt_after_lru_eviction_and_recreate_shows_only_the_new_history() -> None:
    mem = ctxkeep.open_memory("memory://", ctxkeep.MemoryConfig(max_sessions=1))
    try:
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "old secret")
        mem.build_prompt_messages("x")
        mem.create_session("b")  # evicts x
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "new")
        assert _contents(mem.build_prompt_messages("x")) == ["new"]
        assert _contents(mem.build_prompt_messages("x")) == _contents(mem.get_messages("x"))
    finally:
        mem.close()


def test_prompt_after_ttl_expiry_and_recreate_shows_only_the_new_history() -> None:
    clock = Clock()
    mem = MemoryManager(SessionMemory(), MemoryConfig(session_ttl=60), clock=clock)
    try:
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "old secret")
        mem.build_prompt_messages("x")
        clock.advance(120)
        assert mem.sweep() == 1
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "new")
        assert _contents(mem.build_prompt_messages("x")) == ["new"]
    finally:
        mem.close()


def test_prompt_after_store_silently_drops_a_session_shows_only_the_new_history(
    tmp_path: Path,
) -> None:
    mem = ctxkeep.open_memory(f"sqlite:///{tmp_path}/s.db", MemoryConfig(session_ttl=None))
    try:
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "old secret")
        mem.build_prompt_messages("x")
        mem.backend.delete("x")  # as a store's own expiry would, behind the manager's back
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "new")
        assert _contents(mem.build_prompt_messages("x")) == ["new"]
    finally:
        mem.close()


def test_duplicate_session_id_is_a_typed_error(tmp_path: Path) -> None:
    import pytest

    for url in ("memory://", f"sqlite:///{tmp_path}/d.db"):
        mem = ctxkeep.open_memory(url)
        try:
            mem.create_session("a", session_id="dup")
            with pytest.raises(ctxkeep.SessionExistsError, match="already exists"):
                mem.create_session("a", session_id="dup")
        finally:
            mem.close()

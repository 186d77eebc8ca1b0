"""Issue 10's reproduction, word for word: an evicted session's words never reach the prompt
of a new session under its id. (Every backend runs the same cases in the session contract.)
"""

from __future__ import annotations

import ctxkeep


def test_issue_snippet_prompt_equals_the_stored_history() -> None:
    mem = ctxkeep.open_memory("memory://", ctxkeep.MemoryConfig(max_sessions=1))
    try:
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "old secret")
        mem.build_prompt_messages("x")
        mem.create_session("b")  # evicts x (LRU)
        mem.create_session("a", session_id="x")
        mem.add_message("x", "user", "new")
        prompt = [m.content for m in mem.build_prompt_messages("x")]
        assert prompt == [m.content for m in mem.get_messages("x")] == ["new"]
    finally:
        mem.close()

"""Anthropic extended thinking: thinking blocks go back to Anthropic exactly as they came.

Anthropic requires the ``thinking`` blocks (with their ``signature``) and ``redacted_thinking``
blocks (with their ``data``) of a tool-use turn to be sent back unchanged. ctxkeep keeps them as
content parts of the assistant message they came with, so they round-trip through ``Message``,
every session store and the pruner, and are left out of what goes to OpenAI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic.types
import openai.types.chat
import pytest
from pydantic import TypeAdapter

from ctxkeep import (
    InvalidMessageError,
    Message,
    TokenPruner,
    ToolCall,
    from_anthropic,
    get_counter,
    open_memory,
    to_anthropic,
    to_openai,
    validate_sequence,
)

ANTHROPIC_MESSAGE = TypeAdapter(anthropic.types.MessageParam)
OPENAI_MESSAGE = TypeAdapter(openai.types.chat.ChatCompletionMessageParam)
COUNTER = get_counter("o200k_base")

THINKING = {
    "type": "thinking",
    "thinking": "The user wants the files listed. I should run ls in the repository root.",
    "signature": "EqQBCkYIBRgCKkBsZ2lnbmF0dXJlLWJ5dGVzLWZyb20tYW50aHJvcGlj+/==",
}
REDACTED = {
    "type": "redacted_thinking",
    "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4m",
}


def tool_turn(n: int = 1, *, text: str | None = "I'll list the directory.") -> dict[str, Any]:
    """An assistant tool-use turn as Anthropic returns it with extended thinking on."""
    blocks: list[dict[str, Any]] = [
        {**THINKING, "thinking": f"{THINKING['thinking']} (step {n})"},
        {**REDACTED, "data": f"{REDACTED['data']}{n}"},
    ]
    if text is not None:
        blocks.append({"type": "text", "text": text})
    blocks.append(
        {"type": "tool_use", "id": f"toolu_{n:02d}", "name": "bash", "input": {"command": "ls"}}
    )
    return {"role": "assistant", "content": blocks}


def tool_results(n: int = 1, output: str = "README.md\nsrc") -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n:02d}", "content": output}],
    }


def conversation() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "List the files."},
        tool_turn(1),
        tool_results(1),
        {"role": "assistant", "content": [THINKING, {"type": "text", "text": "Two files."}]},
    ]


def validated(d: dict[str, Any]) -> list[Any]:
    """The blocks of ``d`` as the anthropic SDK's own param types read them (every block)."""
    return list(ANTHROPIC_MESSAGE.validate_python(d)["content"])


# -- Anthropic round trip -----------------------------------------------------------------------


def test_thinking_blocks_round_trip_byte_for_byte_through_message() -> None:
    original = conversation()
    payload = to_anthropic(from_anthropic(original))
    assert json.dumps(payload.messages) == json.dumps(original)


def test_round_tripped_thinking_turns_validate_against_the_anthropic_sdk_types() -> None:
    payload = to_anthropic(from_anthropic(conversation()))
    for d in payload.messages:
        validated(d)
    kinds = [b["type"] for b in payload.messages[1]["content"]]
    assert kinds == ["thinking", "redacted_thinking", "text", "tool_use"]


def test_thinking_blocks_are_content_parts_of_their_assistant_message_in_order() -> None:
    msgs = from_anthropic(conversation())
    turn = msgs[1]
    assert turn.role == "assistant"
    assert [tc.id for tc in turn.tool_calls] == ["toolu_01"]
    assert isinstance(turn.content, list)
    assert [p["type"] for p in turn.content] == ["thinking", "redacted_thinking", "text"]
    assert turn.text == "I'll list the directory."  # thinking is not the message's text


def test_a_tool_turn_of_only_thinking_round_trips() -> None:
    original = [{"role": "user", "content": "go"}, tool_turn(1, text=None), tool_results(1)]
    assert json.dumps(to_anthropic(from_anthropic(original)).messages) == json.dumps(original)


def test_every_key_of_a_thinking_block_is_kept() -> None:
    block = {**THINKING, "cache_control": {"type": "ephemeral"}}
    original = [{"role": "assistant", "content": [block, {"type": "text", "text": "ok"}]}]
    assert to_anthropic(from_anthropic(original)).messages == original


def test_a_block_after_a_tool_use_keeps_its_place() -> None:
    # Interleaved thinking can put reasoning between tool calls of one turn.
    turn = {
        "role": "assistant",
        "content": [
            THINKING,
            {"type": "tool_use", "id": "toolu_a", "name": "bash", "input": {"command": "ls"}},
            REDACTED,
            {"type": "tool_use", "id": "toolu_b", "name": "bash", "input": {"command": "pwd"}},
        ],
    }
    results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "a"},
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "b"},
        ],
    }
    original = [{"role": "user", "content": "go"}, turn, results]
    payload = to_anthropic(from_anthropic(original))
    assert json.dumps(payload.messages) == json.dumps(original)
    validated(payload.messages[1])


# -- OpenAI --------------------------------------------------------------------------------------


def test_to_openai_leaves_thinking_blocks_out() -> None:
    out = to_openai(from_anthropic(conversation()))
    assert out[1]["content"] == [{"type": "text", "text": "I'll list the directory."}]
    assert out[3]["content"] == [{"type": "text", "text": "Two files."}]
    assert "thinking" not in json.dumps(out)
    for d in out:
        OPENAI_MESSAGE.validate_python(d)


def test_a_tool_turn_of_only_thinking_goes_to_openai_with_null_content() -> None:
    msgs = from_anthropic([{"role": "user", "content": "go"}, tool_turn(1, text=None)])
    d = msgs[1].to_openai()
    assert d["content"] is None
    assert [tc["id"] for tc in d["tool_calls"]] == ["toolu_01"]


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [
        {"type": "thinking", "thinking": "no signature"},
        {"type": "thinking", "signature": "no text"},
        {"type": "thinking", "thinking": 5, "signature": "s"},
        {"type": "redacted_thinking"},
        {"type": "redacted_thinking", "data": None},
    ],
)
def test_a_malformed_thinking_block_is_refused_naming_the_message(block: dict[str, Any]) -> None:
    with pytest.raises(InvalidMessageError, match=r"message 1: .*thinking"):
        from_anthropic(
            [{"role": "user", "content": "go"}, {"role": "assistant", "content": [block]}]
        )


def test_thinking_blocks_belong_to_assistant_messages() -> None:
    with pytest.raises(InvalidMessageError, match=r"message 0: .*assistant"):
        from_anthropic([{"role": "user", "content": [THINKING]}])
    with pytest.raises(InvalidMessageError, match="assistant"):
        Message("user", [THINKING])


# -- token counting ------------------------------------------------------------------------------


def _assistant(parts: list[dict[str, Any]]) -> Message:
    return Message("assistant", [*parts, {"type": "text", "text": "done"}])


def test_thinking_text_counts_as_text_and_its_signature_does_not() -> None:
    bare = COUNTER.count_message(_assistant([]))
    with_thinking = COUNTER.count_message(_assistant([THINKING]))
    assert with_thinking == bare + COUNTER.count_text(THINKING["thinking"])
    resigned = _assistant([{**THINKING, "signature": THINKING["signature"] * 10}])
    assert COUNTER.count_message(resigned) == with_thinking


def test_redacted_thinking_counts_its_data() -> None:
    bare = COUNTER.count_message(_assistant([]))
    redacted = COUNTER.count_message(_assistant([REDACTED]))
    assert redacted == bare + COUNTER.count_text(REDACTED["data"])


# -- stores --------------------------------------------------------------------------------------


def test_thinking_blocks_survive_the_memory_store() -> None:
    original = conversation()
    with open_memory("memory://") as mem:
        sid = mem.create_session("agent")
        for m in from_anthropic(original):
            mem.add_structured_message(sid, m)
        back = mem.get_messages(sid)
    assert json.dumps(to_anthropic(back).messages) == json.dumps(original)


def test_thinking_blocks_survive_the_sqlite_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    original = conversation()
    with open_memory(url) as mem:
        sid = mem.create_session("agent")
        for m in from_anthropic(original):
            mem.add_structured_message(sid, m)
    with open_memory(url) as mem:  # a new manager reads the stored records, not a cache
        back = mem.get_messages(sid)
    assert json.dumps(to_anthropic(back).messages) == json.dumps(original)


# -- pruning -------------------------------------------------------------------------------------


def _long_thinking_history(steps: int = 20) -> list[Message]:
    anthropic_msgs: list[dict[str, Any]] = [{"role": "user", "content": "Do the task."}]
    for n in range(1, steps + 1):
        anthropic_msgs.append(tool_turn(n, text=f"step {n}"))
        anthropic_msgs.append(tool_results(n, f"line {n} of output\n" * 300))
    anthropic_msgs.append({"role": "user", "content": "Now summarise."})
    msgs = [Message("system", "You are an agent."), *from_anthropic(anthropic_msgs)]
    return [m.replace(id=f"m{i}") for i, m in enumerate(msgs)]


def test_a_pruned_history_keeps_each_kept_turns_thinking_blocks_unchanged() -> None:
    history = _long_thinking_history()
    by_id = {m.id: m for m in history}
    out, report = TokenPruner(6000, 4, counter=COUNTER).prune_with_report(history)
    validate_sequence(out)
    assert report.count("compressed") > 0  # old tool outputs were compressed
    assert report.count("dropped") > 0  # and old turns dropped
    kept_turns = [m for m in out if m.role == "assistant" and m.tool_calls]
    assert len(kept_turns) >= 2
    for m in kept_turns:
        assert m.content == by_id[m.id].content
        assert isinstance(m.content, list)
        assert [p["type"] for p in m.content][:2] == ["thinking", "redacted_thinking"]
    # and they still go back to Anthropic as the SDK accepts them
    for d in to_anthropic(out).messages:
        validated(d)


def test_a_turns_thinking_is_kept_or_dropped_with_its_tool_calls() -> None:
    history = _long_thinking_history()
    for budget in (1500, 3000, 6000, 20_000):
        out = TokenPruner(budget, 2, counter=COUNTER).prune(history)
        for m in out:
            has_thinking = isinstance(m.content, list) and any(
                p["type"] == "thinking" for p in m.content
            )
            assert has_thinking == bool(m.role == "assistant" and m.tool_calls)


def test_an_assistant_turn_with_thinking_and_calls_is_one_unit_with_its_results() -> None:
    calls = [ToolCall("toolu_x", "bash", '{"command": "ls"}')]
    turn = Message("assistant", [THINKING], tool_calls=calls)
    history = [
        Message("user", "go"),
        turn,
        Message("tool", "out", tool_call_id="toolu_x"),
        Message("user", "next"),
    ]
    out = TokenPruner(100_000, 6, counter=COUNTER).prune(history)
    assert out[1].content == [THINKING]
    assert out[2].tool_call_id == "toolu_x"

"""Responses API input items to and from Messages (ctxkeep.responses): lossless for every item
type the openai SDK defines, valid against the SDK's own ``ResponseInputItemParam``, and safe
to prune (a call keeps its output, a reasoning item the call it precedes)."""

from __future__ import annotations

import json
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("openai")
from openai.types.responses import ResponseInputItemParam
from pydantic import TypeAdapter

from _llm_servers import materialise
from ctxkeep import (
    BudgetExceededError,
    InvalidMessageError,
    Message,
    TokenPruner,
    ToolCall,
    from_openai,
    from_responses,
    open_memory,
    to_responses,
    validate_sequence,
)
from ctxkeep.responses import CARRIER_KIND, RESPONSES_KEY

ITEM = TypeAdapter(ResponseInputItemParam)


def assert_valid_items(items: list[dict[str, Any]]) -> None:
    """Each item validates against the SDK's own input item type and has no key it lacks."""
    for item in items:
        assert materialise(ITEM.validate_python(item)) == item


EXAMPLES: dict[str, dict[str, Any]] = {
    "message": {"role": "user", "content": "What is in a.txt?"},
    "message (typed, parts)": {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
            {"type": "input_file", "file_id": "file_1"},
        ],
        "status": "completed",
    },
    "message (developer)": {"type": "message", "role": "developer", "content": "Be brief."},
    "message (assistant output)": {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []},
            {"type": "refusal", "refusal": "no"},
        ],
        "phase": "final_answer",
    },
    "file_search_call": {
        "id": "fs_1",
        "type": "file_search_call",
        "status": "completed",
        "queries": ["q"],
        "results": [{"file_id": "f", "filename": "a.txt", "score": 0.5, "text": "t"}],
    },
    "computer_call": {
        "id": "cu_1",
        "type": "computer_call",
        "call_id": "cc_1",
        "action": {"type": "click", "button": "left", "x": 1, "y": 2},
        "pending_safety_checks": [],
        "status": "completed",
    },
    "computer_call_output": {
        "type": "computer_call_output",
        "call_id": "cc_1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAA"},
    },
    "web_search_call": {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "weather"},
    },
    "function_call": {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "read_file",
        "arguments": '{"path": "a.txt"}',
        "status": "completed",
    },
    "function_call_output": {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "hello",
    },
    "tool_search_call": {"type": "tool_search_call", "arguments": {"q": "x"}},
    "tool_search_output": {"type": "tool_search_output", "tools": []},
    "additional_tools": {"type": "additional_tools", "tools": [], "role": "developer"},
    "configuration_update": {"type": "configuration_update"},
    "reasoning": {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "thinking"}],
        "encrypted_content": "gAAAAABencrypted==",
    },
    "compaction": {"type": "compaction", "encrypted_content": "gAAAcompact"},
    "image_generation_call": {
        "id": "ig_1",
        "type": "image_generation_call",
        "status": "completed",
        "result": "AAAA",
    },
    "code_interpreter_call": {
        "id": "ci_1",
        "type": "code_interpreter_call",
        "code": "print(1)",
        "container_id": "cntr_1",
        "outputs": [{"type": "logs", "logs": "1"}],
        "status": "completed",
    },
    "local_shell_call": {
        "id": "ls_1",
        "type": "local_shell_call",
        "call_id": "lsc_1",
        "action": {"type": "exec", "command": ["ls"], "env": {}},
        "status": "completed",
    },
    "local_shell_call_output": {"type": "local_shell_call_output", "id": "lsc_1", "output": "a"},
    "shell_call": {
        "type": "shell_call",
        "call_id": "sh_1",
        "action": {"commands": ["ls"]},
    },
    "shell_call_output": {
        "type": "shell_call_output",
        "call_id": "sh_1",
        "output": [{"stdout": "a", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    },
    "apply_patch_call": {
        "type": "apply_patch_call",
        "call_id": "ap_1",
        "status": "completed",
        "operation": {"type": "delete_file", "path": "a.txt"},
    },
    "apply_patch_call_output": {
        "type": "apply_patch_call_output",
        "call_id": "ap_1",
        "status": "completed",
    },
    "mcp_list_tools": {
        "id": "ml_1",
        "type": "mcp_list_tools",
        "server_label": "srv",
        "tools": [{"name": "t", "input_schema": {}}],
    },
    "mcp_approval_request": {
        "id": "mr_1",
        "type": "mcp_approval_request",
        "server_label": "srv",
        "name": "t",
        "arguments": "{}",
    },
    "mcp_approval_response": {
        "type": "mcp_approval_response",
        "approval_request_id": "mr_1",
        "approve": True,
    },
    "mcp_call": {
        "id": "mc_1",
        "type": "mcp_call",
        "server_label": "srv",
        "name": "t",
        "arguments": "{}",
        "output": "ok",
    },
    "custom_tool_call_output": {
        "type": "custom_tool_call_output",
        "call_id": "ct_1",
        "output": "done",
    },
    "custom_tool_call": {
        "type": "custom_tool_call",
        "call_id": "ct_1",
        "name": "patch",
        "input": "*** Begin",
    },
    "compaction_trigger": {"type": "compaction_trigger"},
    "item_reference": {"type": "item_reference", "id": "msg_0"},
    "program": {
        "type": "program",
        "id": "pg_1",
        "call_id": "pgc_1",
        "code": "x = 1",
        "fingerprint": "fp",
    },
    "program_output": {
        "type": "program_output",
        "id": "po_1",
        "call_id": "pgc_1",
        "result": "1",
        "status": "completed",
    },
}


def _sdk_item_types() -> set[str]:
    kinds: set[str] = set()
    for member in typing.get_args(ResponseInputItemParam):
        hint = typing.get_type_hints(member)["type"]
        kinds.update(a for a in typing.get_args(hint) if isinstance(a, str))
        kinds.update(a for arg in typing.get_args(hint) for a in typing.get_args(arg))
    return kinds


def test_the_examples_cover_every_item_type_the_sdk_defines() -> None:
    covered = {item.get("type", "message") for item in EXAMPLES.values()}
    assert _sdk_item_types() <= covered


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_example_is_a_valid_sdk_item(name: str) -> None:
    assert_valid_items([EXAMPLES[name]])


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_item_type_alone_comes_back_exactly(name: str) -> None:
    items = [EXAMPLES[name]]
    assert to_responses(from_responses(items)) == items


def test_a_history_of_every_item_type_comes_back_byte_for_byte() -> None:
    items = list(EXAMPLES.values())
    out = to_responses(from_responses(items))
    assert out == items
    assert json.dumps(out) == json.dumps(items)  # key order too
    assert_valid_items(out)


def test_from_responses_copies_its_input() -> None:
    items = [dict(EXAMPLES["reasoning"]), dict(EXAMPLES["message (typed, parts)"])]
    before = json.dumps(items)
    msgs = from_responses(items)
    items[0]["summary"].append({"type": "summary_text", "text": "changed"})
    items[1]["content"][0]["text"] = "changed"
    assert json.dumps(to_responses(msgs)) == before


# -- what is modelled -----------------------------------------------------------------------

REASONING = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "gAAA=="}
TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You read files."},
    {"role": "user", "content": "Read a.txt and b.txt"},
    REASONING,
    {"type": "function_call", "id": "fc_a", "call_id": "c_a", "name": "read", "arguments": "{}"},
    {"type": "function_call", "id": "fc_b", "call_id": "c_b", "name": "read", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c_b", "output": "B"},
    {
        "type": "function_call_output",
        "call_id": "c_a",
        "output": [{"type": "input_text", "text": "A"}],
    },
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "A and B", "annotations": []}],
    },
]


def test_messages_and_calls_become_messages_the_validator_accepts() -> None:
    msgs = from_responses(TURN)
    assert [m.role for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert msgs[2].tool_calls == (
        ToolCall(id="c_a", name="read", arguments="{}"),
        ToolCall(id="c_b", name="read", arguments="{}"),
    )
    assert [m.tool_call_id for m in msgs[3:5]] == ["c_b", "c_a"]
    assert msgs[4].content == [{"type": "input_text", "text": "A"}]
    assert msgs[5].content == TURN[-1]["content"]
    assert validate_sequence(msgs) == msgs


def test_a_reasoning_item_rides_with_the_call_it_precedes() -> None:
    msgs = from_responses(TURN)
    entries = msgs[2].metadata[RESPONSES_KEY]
    assert entries[0] == {"item": REASONING}
    assert [next(iter(e)) for e in entries] == ["item", "c", "c"]


def test_unmodelled_items_after_the_last_message_ride_with_it() -> None:
    items = [*TURN, EXAMPLES["item_reference"]]
    msgs = from_responses(items)
    assert msgs[-1].metadata[RESPONSES_KEY][-1] == {"item": EXAMPLES["item_reference"]}
    assert to_responses(msgs) == items


def test_only_unmodelled_items_make_one_carrier_message() -> None:
    items = [REASONING, EXAMPLES["web_search_call"]]
    [carrier] = from_responses(items)
    assert carrier.event_kind == CARRIER_KIND
    assert validate_sequence([Message("user", "hi"), carrier])
    assert to_responses([carrier]) == items


def test_an_item_between_two_calls_stays_inside_the_run() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        REASONING,
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
    ]
    msgs = from_responses(items)
    assert len(msgs[1].tool_calls) == 2
    validate_sequence(msgs)
    assert to_responses(msgs) == items


def test_the_round_trip_survives_a_session_store() -> None:
    with open_memory("memory://") as mem:
        sid = mem.create_session("agent")
        for m in from_responses(TURN):
            mem.add_structured_message(sid, m)
        assert to_responses(mem.get_messages(sid)) == TURN


def test_a_changed_output_is_sent_with_its_other_fields() -> None:
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "long", "id": "fco_1"},
    ]
    msgs = from_responses(items)
    msgs[2] = msgs[2].replace(content="short")
    assert to_responses(msgs)[2] == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": "short",
        "id": "fco_1",
    }


# -- from Chat Completions ------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "You read files."},
    {"role": "developer", "content": "Be brief."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        ],
    },
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "hello"},
    {"role": "assistant", "content": [{"type": "text", "text": "It says hello."}]},
]


def test_chat_messages_become_responses_items() -> None:
    items = to_responses(from_openai(CHAT))
    assert items == [
        {"type": "message", "role": "system", "content": "You read files."},
        {"type": "message", "role": "developer", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
            ],
        },
        {"type": "message", "role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "hello"},
        {"type": "message", "role": "assistant", "content": "It says hello."},
    ]
    assert_valid_items(items)


def test_chat_items_read_back_as_a_valid_history_with_the_same_text_and_calls() -> None:
    # An assistant turn with text and calls reads back as two assistant messages (the
    # message item, then the run of calls): a valid sequence with the same content.
    msgs = validate_sequence(from_responses(to_responses(CHAT)))
    assert [m.text for m in msgs] == [
        "You read files.",
        "Be brief.",
        "What is this?",
        "Let me look.",
        "",
        "hello",
        "It says hello.",
    ]
    assert msgs[4].tool_calls == (ToolCall("call_1", "read", "{}"),)


def test_an_assistant_turn_with_only_calls_sends_no_empty_message() -> None:
    msgs = [
        Message("user", "go"),
        Message("assistant", None, tool_calls=[ToolCall("c", "f", "{}")]),
    ]
    assert [i["type"] for i in to_responses(msgs)] == ["message", "function_call"]


# -- pruning --------------------------------------------------------------------------------


def _long_history(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "system", "content": "You read files."}]
    for t in range(turns):
        items.append({"role": "user", "content": f"Read file {t}"})
        items.append(
            {"id": f"rs_{t}", "type": "reasoning", "summary": [], "encrypted_content": f"E{t}"}
        )
        for k in range(2):
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{t}_{k}",
                    "call_id": f"c_{t}_{k}",
                    "name": "read",
                    "arguments": json.dumps({"path": f"{t}-{k}.txt"}),
                    "status": "completed",
                }
            )
        for k in range(2):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": f"c_{t}_{k}",
                    "output": " ".join(f"line {n} of file {t}-{k}" for n in range(150)),
                }
            )
        items.append({"id": f"rs_{t}b", "type": "reasoning", "summary": []})
        items.append(
            {
                "id": f"msg_{t}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"done {t}", "annotations": []}],
            }
        )
    items.append({"role": "user", "content": "Now summarise."})
    return items


def assert_pairs_and_reasoning_intact(out: list[dict[str, Any]], original: list[Any]) -> None:
    follower = {
        item["id"]: original[i + 1]
        for i, item in enumerate(original)
        if item.get("type") == "reasoning"
    }
    called = {i["call_id"] for i in out if i.get("type") == "function_call"}
    answered = [i["call_id"] for i in out if i.get("type") == "function_call_output"]
    assert sorted(called) == sorted(answered)
    for i, item in enumerate(out):
        if item.get("type") == "reasoning":
            assert out[i + 1] == follower[item["id"]] or (
                out[i + 1].get("call_id") == follower[item["id"]].get("call_id")
                and out[i + 1]["type"] == follower[item["id"]]["type"]
            )


@pytest.mark.parametrize("budget", [600, 1500, 4000, 20_000])
def test_pruned_histories_stay_valid_responses_input(budget: int) -> None:
    items = _long_history(8)
    pruned = TokenPruner(max_token_budget=budget, preserve_last_n=4).prune(from_responses(items))
    validate_sequence(pruned)
    out = to_responses(pruned)
    assert_valid_items(out)
    assert_pairs_and_reasoning_intact(out, items)
    assert out[0] == items[0] and out[-1] == items[-1]


def test_a_compressed_output_keeps_its_call_and_fields() -> None:
    items = _long_history(6)
    pruned = TokenPruner(max_token_budget=2500, preserve_last_n=2).prune(from_responses(items))
    out = to_responses(pruned)
    compressed = [
        i for i in out if i.get("type") == "function_call_output" and "omitted" in i["output"]
    ]
    assert compressed
    assert_valid_items(out)
    assert_pairs_and_reasoning_intact(out, items)


def test_an_unpruned_history_comes_back_exactly() -> None:
    items = _long_history(2)
    pruned = TokenPruner(max_token_budget=100_000, preserve_last_n=100).prune(from_responses(items))
    assert to_responses(pruned) == items


# -- properties -----------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8"), max_size=20)
_ids = st.text("abcdefghij0123456789", min_size=1, max_size=6)
_status = st.sampled_from(["completed", "incomplete", "in_progress"])


@st.composite
def _message_item(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "system", "developer", "assistant"]))
    if role == "assistant" and draw(st.booleans()):
        return {
            "id": "msg_" + draw(_ids),
            "type": "message",
            "role": "assistant",
            "status": draw(_status),
            "content": [{"type": "output_text", "text": draw(_text), "annotations": []}],
        }
    content: Any = draw(
        st.one_of(
            _text.filter(bool),
            st.lists(st.builds(lambda t: {"type": "input_text", "text": t}, _text), min_size=1),
        )
    )
    if role == "assistant":
        content = content if isinstance(content, str) else "x"
    item: dict[str, Any] = {"role": role, "content": content}
    if draw(st.booleans()):
        item = {"type": "message", **item}
    return item


@st.composite
def _tool_turn(draw: st.DrawFn, n: int) -> list[dict[str, Any]]:
    ids = [f"call_{n}_{k}" for k in range(draw(st.integers(1, 3)))]
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"id": f"rs_{n}", "type": "reasoning", "summary": [], "encrypted_content": "E"})
    for cid in ids:
        call: dict[str, Any] = {
            "type": "function_call",
            "call_id": cid,
            "name": draw(st.sampled_from(["read", "ls"])),
            "arguments": draw(st.sampled_from(["{}", '{"p": 1}', "not json"])),
        }
        if draw(st.booleans()):
            call["id"] = "fc_" + cid
            call["status"] = draw(_status)
        out.append(call)
    for cid in draw(st.permutations(ids)):
        output: Any = draw(
            st.one_of(
                _text,
                # An empty part list is a valid SDK item but no valid ctxkeep tool result.
                st.lists(st.builds(lambda t: {"type": "input_text", "text": t}, _text), min_size=1),
            )
        )
        out.append({"type": "function_call_output", "call_id": cid, "output": output})
    if draw(st.booleans()):
        out.append({"type": "item_reference", "id": "ref_" + str(n)})
    return out


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            items.append(draw(_message_item()))
        else:
            items.extend(draw(_tool_turn(n)))
    return items


@given(histories())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_histories_round_trip_exactly_and_validate(items: list[dict[str, Any]]) -> None:
    msgs = from_responses(items)
    out = to_responses(msgs)
    assert json.dumps(out) == json.dumps(items)
    assert_valid_items(out)
    validate_sequence(msgs)


@given(histories(), st.integers(50, 3000))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_pruning_random_histories_keeps_calls_and_reasoning_together(
    items: list[dict[str, Any]], budget: int
) -> None:
    items = [*items, {"role": "user", "content": "now"}]
    pruner = TokenPruner(max_token_budget=budget, preserve_last_n=2)
    try:
        pruned = pruner.prune(from_responses(items))
    except BudgetExceededError:
        return  # system messages and the newest user message alone exceed the budget
    out = to_responses(pruned)
    assert_valid_items(out)
    assert_pairs_and_reasoning_intact(out, items)


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("items", "index", "says"),
    [
        ([{"role": "user", "content": "ok"}, "junk"], 1, "must be an object"),
        ([{"content": "no role or type"}], 0, "'type'"),
        ([{"role": "tool", "content": "x"}], 0, "role"),
        ([{"type": "message", "role": "user"}], 0, "content"),
        ([{"role": "user", "content": {"not": "parts"}}], 0, "content"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], 0, "call_id"),
        ([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}], 0, "arguments"),
        ([{"type": "function_call_output", "call_id": "c"}], 0, "output"),
        ([{"type": "function_call_output", "call_id": "", "output": "x"}], 0, "call_id"),
        ([{"type": "function_call_output", "call_id": "c", "output": [1]}], 0, "output"),
        ([{"type": 3}], 0, "'type'"),
    ],
)
def test_malformed_items_raise_naming_the_item(items: list[Any], index: int, says: str) -> None:
    with pytest.raises(InvalidMessageError, match=says) as info:
        from_responses(items)
    assert info.value.index == index


def test_a_string_is_not_a_list_of_items() -> None:
    with pytest.raises(InvalidMessageError, match="list of Responses input items"):
        from_responses("hello")


def test_malformed_carried_items_raise_naming_the_message() -> None:
    bad = Message("user", "hi", metadata={RESPONSES_KEY: [{"self": "junk"}]})
    with pytest.raises(InvalidMessageError, match="malformed") as info:
        to_responses([Message("user", "ok"), bad])
    assert info.value.index == 1

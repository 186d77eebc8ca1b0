"""Messages: lossless provider round trips, SDK-valid payloads, sequence checks, typed errors."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import anthropic.types
import openai.types.chat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from ctxkeep import (
    CtxkeepError,
    InvalidMessageError,
    Message,
    MessageError,
    MissingToolResultError,
    OrphanToolResultError,
    ToolCall,
    UnknownRoleError,
    coerce_messages,
    from_anthropic,
    get_counter,
    is_valid_sequence,
    open_memory,
    to_anthropic,
    to_openai,
    validate_sequence,
)

OPENAI_MESSAGE = TypeAdapter(openai.types.chat.ChatCompletionMessageParam)
ANTHROPIC_MESSAGE = TypeAdapter(anthropic.types.MessageParam)
ANTHROPIC_SYSTEM = TypeAdapter(list[anthropic.types.TextBlockParam])


def call(id: str, name: str = "bash", arguments: str = '{"command": "ls"}') -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant_calling(*ids: str, content: str | None = None) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [call(i) for i in ids]}


def tool_result(id: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id, "content": content}


def user(content: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


def anthropic_expressible(m: Message) -> Message:
    """``m`` without what Anthropic's format cannot carry.

    Two things are lost on the way through Anthropic's Messages format, as ``to_anthropic``
    documents: a tool result's ``name`` (a ``tool_result`` block has none), and the
    difference between ``""`` and ``None`` as the text of an assistant turn that calls tools
    (either way there is no text block).
    """
    if m.role == "tool" and m.name is not None:
        return m.replace(name=None)
    if m.role == "assistant" and m.tool_calls and m.content == "":
        return m.replace(content=None)
    return m


def first_unanswered_call(messages: list[dict[str, Any]]) -> tuple[int, str] | None:
    """An independent check: the first assistant call not answered before the next turn."""
    pending: dict[str, int] = {}
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            pending.pop(m["tool_call_id"], None)
            continue
        if pending:
            call_id, index = next(iter(pending.items()))
            return index, call_id
        for tc in m.get("tool_calls") or []:
            pending[tc["id"]] = i
    if pending:
        call_id, index = next(iter(pending.items()))
        return index, call_id
    return None


# -- real trajectories ------------------------------------------------------------------------


def test_openai_round_trip_is_exact_on_every_trajectory_message(
    trajectory: Path, trajectory_messages: list[dict[str, Any]]
) -> None:
    for d in trajectory_messages:
        assert Message.from_openai(d).to_openai() == d


def test_to_openai_validates_against_the_openai_sdk_types(
    trajectory: Path, trajectory_messages: list[dict[str, Any]]
) -> None:
    for d in to_openai(trajectory_messages):
        OPENAI_MESSAGE.validate_python(d)


def test_to_anthropic_validates_against_the_anthropic_sdk_types(
    trajectory: Path, trajectory_messages: list[dict[str, Any]]
) -> None:
    payload = to_anthropic(trajectory_messages)
    ANTHROPIC_SYSTEM.validate_python(payload.system)
    for d in payload.messages:
        ANTHROPIC_MESSAGE.validate_python(d)


def test_from_anthropic_gives_back_the_same_messages(
    trajectory: Path, trajectory_messages: list[dict[str, Any]]
) -> None:
    # Normalised exactly for what Anthropic's format cannot carry: see anthropic_expressible.
    original = [anthropic_expressible(m) for m in coerce_messages(trajectory_messages)]
    payload = to_anthropic(trajectory_messages)
    assert from_anthropic(payload.messages, payload.system) == original


def test_validate_sequence_agrees_with_an_independent_check_on_every_trajectory(
    trajectory: Path, trajectory_messages: list[dict[str, Any]]
) -> None:
    # The mini-swe-* files end some turns with a bash call answered by a *user* message
    # (a timeout, a format error, the final diff): OpenAI refuses those, and so must we.
    problem = first_unanswered_call(trajectory_messages)
    if problem is None:
        assert len(validate_sequence(trajectory_messages)) == len(trajectory_messages)
        return
    index, call_id = problem
    with pytest.raises(MissingToolResultError) as info:
        validate_sequence(trajectory_messages)
    assert (info.value.index, info.value.tool_call_id) == (index, call_id)


# -- round trips of crafted messages -------------------------------------------------------------

IMAGE_PARTS: list[dict[str, Any]] = [
    {"type": "text", "text": "What is in these images?"},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQSkZJRg=="}},
]


def test_content_part_lists_round_trip_through_openai() -> None:
    d = {"role": "user", "content": IMAGE_PARTS}
    assert Message.from_openai(d).to_openai() == d
    OPENAI_MESSAGE.validate_python(d)


def test_content_part_lists_round_trip_through_anthropic() -> None:
    m = Message("user", IMAGE_PARTS)
    payload = to_anthropic([m])
    ANTHROPIC_MESSAGE.validate_python(payload.messages[0])
    assert from_anthropic(payload.messages) == [m]


def test_a_single_text_part_list_round_trips_through_anthropic() -> None:
    m = Message("user", [{"type": "text", "text": "just one part"}])
    payload = to_anthropic([m])
    assert from_anthropic(payload.messages) == [m]


def test_unmodelled_provider_keys_round_trip_through_extra() -> None:
    d = {"role": "assistant", "content": "Sure.", "refusal": None, "annotations": []}
    m = Message.from_openai(d)
    assert m.extra == {"refusal": None, "annotations": []}
    assert m.to_openai() == d


def test_from_openai_copies_its_input() -> None:
    parts = [{"type": "text", "text": "original"}]
    m = Message.from_openai({"role": "user", "content": parts})
    parts[0]["text"] = "changed"
    assert m.text == "original"


def test_to_openai_returns_a_fresh_dict() -> None:
    m = Message("user", [{"type": "text", "text": "original"}])
    m.to_openai()["content"][0]["text"] = "changed"
    assert m.text == "original"


def test_system_messages_become_anthropic_system_blocks() -> None:
    payload = to_anthropic([{"role": "system", "content": "Be brief."}, user("hi")])
    assert payload.system == [{"type": "text", "text": "Be brief."}]
    assert payload.messages == [{"role": "user", "content": "hi"}]
    assert payload.kwargs() == {"system": payload.system, "messages": payload.messages}


def test_consecutive_tool_results_merge_into_one_anthropic_user_turn() -> None:
    msgs = [
        user("list and count"),
        assistant_calling("call_1", "call_2", content="Running both."),
        tool_result("call_1", "a.py b.py"),
        tool_result("call_2", "2"),
        {"role": "assistant", "content": "Two files."},
    ]
    payload = to_anthropic(msgs)
    assert [d["role"] for d in payload.messages] == ["user", "assistant", "user", "assistant"]
    merged = payload.messages[2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in merged] == [
        ("tool_result", "call_1"),
        ("tool_result", "call_2"),
    ]
    assert payload.messages[1]["content"][1] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "bash",
        "input": {"command": "ls"},
    }
    for d in payload.messages:
        ANTHROPIC_MESSAGE.validate_python(d)
    assert from_anthropic(payload.messages) == coerce_messages(msgs)


def test_a_tool_error_round_trips_through_anthropic_as_is_error() -> None:
    msgs = [
        Message("assistant", None, tool_calls=[ToolCall("call_1", "bash", "{}")]),
        Message("tool", "command not found", tool_call_id="call_1", metadata={"is_error": True}),
    ]
    payload = to_anthropic(msgs)
    assert payload.messages[1]["content"][0]["is_error"] is True
    assert from_anthropic(payload.messages) == msgs


def test_tool_call_arguments_compare_as_json() -> None:
    assert ToolCall("c", "f", '{"a":1,"b":2}') == ToolCall("c", "f", '{"b": 2, "a": 1}')
    assert ToolCall("c", "f", '{"a":1}') != ToolCall("c", "f", '{"a":2}')


def test_a_system_message_alone_is_not_an_anthropic_message() -> None:
    with pytest.raises(InvalidMessageError, match="system"):
        Message("system", "Be brief.").to_anthropic()


def test_tool_arguments_that_are_not_a_json_object_cannot_go_to_anthropic() -> None:
    msgs = [assistant_calling("call_1"), tool_result("call_1")]
    msgs[0]["tool_calls"][0]["function"]["arguments"] = '{"truncated": '
    with pytest.raises(InvalidMessageError, match="call_1"):
        to_anthropic(msgs)


# -- sequence validation ---------------------------------------------------------------------


def test_a_tool_result_without_its_call_is_an_orphan() -> None:
    with pytest.raises(OrphanToolResultError) as info:
        validate_sequence([user(), tool_result("call_x")])
    assert (info.value.index, info.value.tool_call_id) == (1, "call_x")
    assert "message 1" in str(info.value)
    assert "call_x" in str(info.value)


def test_a_tool_result_after_the_next_user_turn_is_an_orphan() -> None:
    msgs = [user(), assistant_calling("call_1"), user("wait"), tool_result("call_1")]
    with pytest.raises(MissingToolResultError):
        validate_sequence(msgs)
    with pytest.raises(OrphanToolResultError) as info:
        validate_sequence([msgs[0], msgs[2], msgs[3]])
    assert (info.value.index, info.value.tool_call_id) == (2, "call_1")


def test_a_second_result_for_the_same_call_is_an_orphan() -> None:
    msgs = [user(), assistant_calling("call_1"), tool_result("call_1"), tool_result("call_1")]
    with pytest.raises(OrphanToolResultError) as info:
        validate_sequence(msgs)
    assert (info.value.index, info.value.tool_call_id) == (3, "call_1")


def test_a_call_without_all_its_results_names_the_call_and_its_message() -> None:
    msgs = [user(), assistant_calling("call_1", "call_2"), tool_result("call_1"), user("next")]
    with pytest.raises(MissingToolResultError) as info:
        validate_sequence(msgs)
    assert (info.value.index, info.value.tool_call_id) == (1, "call_2")
    assert "message 1" in str(info.value)
    assert "call_2" in str(info.value)


def test_a_call_left_pending_at_the_end_is_missing_its_result() -> None:
    msgs = [user(), assistant_calling("call_1")]
    with pytest.raises(MissingToolResultError) as info:
        validate_sequence(msgs)
    assert (info.value.index, info.value.tool_call_id) == (1, "call_1")


def test_allow_pending_accepts_a_trailing_call_awaiting_its_results() -> None:
    assert len(validate_sequence([user(), assistant_calling("call_1")], allow_pending=True)) == 2


def test_tool_results_may_come_in_any_order() -> None:
    msgs = [assistant_calling("a", "b", "c"), tool_result("c"), tool_result("a"), tool_result("b")]
    assert len(validate_sequence(msgs)) == 4


def test_duplicate_call_ids_in_one_message_are_rejected() -> None:
    with pytest.raises(InvalidMessageError, match="duplicate"):
        validate_sequence([assistant_calling("a", "a"), tool_result("a")])


def test_validate_sequence_names_the_index_of_an_unknown_role() -> None:
    with pytest.raises(UnknownRoleError) as info:
        validate_sequence([user(), {"role": "function", "content": "x"}])
    assert info.value.index == 1
    assert "message 1" in str(info.value)


def test_is_valid_sequence_is_false_for_an_invalid_sequence() -> None:
    assert is_valid_sequence([user(), assistant_calling("a"), tool_result("a")])
    assert not is_valid_sequence([tool_result("a")])
    assert not is_valid_sequence([{"role": "nobody"}])


# -- malformed input ---------------------------------------------------------------------------

MALFORMED: dict[str, tuple[Any, str]] = {
    "unknown_role": ({"role": "wizard", "content": "hi"}, "wizard"),
    "role_not_a_string": ({"role": 1, "content": "hi"}, "role"),
    "no_role": ({"content": "hi"}, "role"),
    "tool_without_tool_call_id": ({"role": "tool", "content": "ok"}, "tool_call_id"),
    "tool_with_empty_tool_call_id": ({"role": "tool", "content": "", "tool_call_id": ""}, "id"),
    "arguments_not_a_string": (
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
            ],
        },
        "arguments",
    ),
    "tool_call_without_function": (
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        "function",
    ),
    "tool_call_without_id": (
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        "id",
    ),
    "tool_call_not_an_object": ({"role": "assistant", "tool_calls": ["c1"]}, "tool call"),
    "tool_calls_a_string": ({"role": "assistant", "tool_calls": "c1"}, "tool_calls"),
    "tool_calls_a_number": ({"role": "assistant", "tool_calls": 5}, "tool_calls"),
    "tool_calls_an_object": ({"role": "assistant", "tool_calls": call("c1")}, "tool_calls"),
    "tool_calls_on_a_user": ({"role": "user", "content": "x", "tool_calls": [call("c")]}, "user"),
    "content_an_int": ({"role": "user", "content": 42}, "content"),
    "content_a_dict": ({"role": "user", "content": {"text": "hi"}}, "content"),
    "content_part_not_an_object": ({"role": "user", "content": ["hi"]}, "content part"),
    "content_part_without_type": ({"role": "user", "content": [{"text": "hi"}]}, "type"),
    "text_part_without_text": ({"role": "user", "content": [{"type": "text"}]}, "text"),
    "image_url_a_string": (
        {"role": "user", "content": [{"type": "image_url", "image_url": "https://x/y.png"}]},
        "image_url",
    ),
    "name_not_a_string": ({"role": "user", "content": "hi", "name": 7}, "name"),
    "tool_call_id_on_a_user": ({"role": "user", "content": "hi", "tool_call_id": "c"}, "user"),
    "not_a_dict": ("hello", "object"),
    "none": (None, "object"),
    "a_list": ([{"role": "user", "content": "hi"}], "object"),
}


@pytest.mark.parametrize(("bad", "named"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_messages_raise_a_typed_error_naming_the_problem(bad: Any, named: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        Message.from_openai(bad)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, CtxkeepError)
    assert named in str(info.value)


@pytest.mark.parametrize(("bad", "named"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_messages_in_a_list_are_named_by_index(bad: Any, named: str) -> None:
    with pytest.raises(InvalidMessageError) as info:
        coerce_messages([user(), user(), bad])
    assert info.value.index == 2
    assert str(info.value).startswith("message 2: ")


def test_an_unknown_role_is_an_unknown_role_error() -> None:
    with pytest.raises(UnknownRoleError, match="'wizard'"):
        Message("wizard", "hi")


@pytest.mark.parametrize("not_a_list", ["hello", {"role": "user"}, 5, None])
def test_a_message_list_that_is_not_a_list_is_rejected(not_a_list: Any) -> None:
    with pytest.raises(InvalidMessageError, match="list of messages"):
        coerce_messages(not_a_list)


ANTHROPIC_MALFORMED: dict[str, list[Any]] = {
    "not_a_dict": ["hello"],
    "system_role": [{"role": "system", "content": "x"}],
    "content_an_int": [{"role": "user", "content": 5}],
    "block_not_a_dict": [{"role": "user", "content": ["text"]}],
    "block_without_type": [{"role": "user", "content": [{"text": "x"}]}],
    "tool_use_without_id": [
        {"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}
    ],
    "tool_use_without_name": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}
    ],
    "tool_result_without_id": [
        {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}
    ],
    "unknown_block": [{"role": "user", "content": [{"type": "hologram"}]}],
    "image_without_source": [{"role": "user", "content": [{"type": "image", "source": "x"}]}],
    "tool_result_content_an_int": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
    ],
    "tool_result_block_not_a_dict": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [1]}]}
    ],
}


@pytest.mark.parametrize("system", [5, {"type": "text", "text": "x"}, ["be brief"]])
def test_a_malformed_anthropic_system_raises_a_typed_error(system: Any) -> None:
    with pytest.raises(InvalidMessageError, match=r"system|block"):
        from_anthropic([], system)


@pytest.mark.parametrize("bad", list(ANTHROPIC_MALFORMED.values()), ids=list(ANTHROPIC_MALFORMED))
def test_malformed_anthropic_messages_raise_a_typed_error(bad: list[Any]) -> None:
    with pytest.raises(InvalidMessageError):
        from_anthropic(bad)


# -- properties ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
ids = st.sampled_from(["call_1", "call_2", "call_3"])
PNG_HEADER = base64.b64encode(
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x04\x00\x00\x00\x02\x00"
)
image_urls = st.sampled_from(
    [
        "https://example.com/a.png",
        "data:image/png;base64," + PNG_HEADER.decode(),
        "data:image/png;base64,!!not base64!!",
        "data:image/jpeg;base64,/9j/",
        "data:,",
        "data:image/webp;base64,UklGRg==",
    ]
) | st.text(max_size=10)


def mutated(valid: st.SearchStrategy[dict[str, Any]], keys: list[str]) -> st.SearchStrategy[Any]:
    """Mostly-valid dicts, one in four with one key replaced by arbitrary JSON."""
    broken = st.builds(lambda d, k, v: {**d, k: v}, valid, st.sampled_from(keys), json_values)
    return st.one_of(valid, valid, valid, broken)


arguments_json = st.dictionaries(st.text(max_size=4), json_values, max_size=2).map(json.dumps)
tool_call = mutated(
    st.fixed_dictionaries(
        {
            "id": ids,
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.text(max_size=5), "arguments": arguments_json | st.text(max_size=6)}
            ),
        }
    ),
    ["id", "function"],
)
content_part = mutated(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)})
    | st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries(
                {"url": image_urls},
                optional={"detail": st.sampled_from(["low", "high", "auto"]) | json_values},
            ),
        }
    )
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["input_audio", "refusal", "file"])},
        optional={"refusal": st.text(max_size=5), "input_audio": json_values},
    ),
    ["type", "text", "image_url"],
)
content = st.none() | st.text(max_size=10) | st.lists(content_part, max_size=3)
valid_message = (
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user"]), "content": content},
        optional={"name": st.text(max_size=5)},
    )
    | st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": content},
        optional={"tool_calls": st.lists(tool_call, max_size=3), "refusal": json_values},
    )
    | st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": ids, "content": content})
)
MESSAGE_KEYS = ["role", "content", "name", "tool_calls", "tool_call_id"]
broken_message = st.builds(
    lambda d, k, v: {**d, k: v}, valid_message, st.sampled_from(MESSAGE_KEYS), json_values
)
# Mostly valid messages, so that lists get past the first message and reach every converter.
garbage_message = st.one_of(
    valid_message, valid_message, valid_message, valid_message, broken_message, json_values
)


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(garbage_message, max_size=6))
def test_validate_sequence_raises_only_ctxkeep_errors_on_garbage(messages: list[Any]) -> None:
    with contextlib.suppress(MessageError):
        validate_sequence(messages)


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(garbage_message, max_size=6))
def test_conversions_and_counting_raise_only_ctxkeep_errors_on_garbage(
    messages: list[Any],
) -> None:
    try:
        msgs = coerce_messages(messages)
    except MessageError:
        return
    assert [Message.from_openai(m.to_openai()) for m in msgs] == msgs
    get_counter("o200k_base").count_messages(msgs)
    try:
        payload = to_anthropic(msgs)
    except MessageError:
        return
    json.dumps(payload.messages)
    from_anthropic(payload.messages, payload.system)


tool_names = st.sampled_from(["bash", "read_file", "search"])
arguments = st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(), max_size=3)


@st.composite
def valid_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid OpenAI histories: user turns, assistant replies, tool calls with all results."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": draw(st.text(max_size=20))}]
    n = 0
    for _ in range(draw(st.integers(0, 5))):
        msgs.append(user(draw(st.text(max_size=20))))
        for _ in range(draw(st.integers(0, 2))):
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                n += 1
                calls.append(call(f"call_{n}", draw(tool_names), json.dumps(draw(arguments))))
            msgs.append({"role": "assistant", "content": draw(st.text(max_size=10)) or None})
            msgs[-1]["tool_calls"] = calls
            for c in draw(st.permutations(calls)):
                msgs.append(tool_result(c["id"], draw(st.text(max_size=20))))
        msgs.append({"role": "assistant", "content": draw(st.text(max_size=20))})
    return msgs


@settings(max_examples=100, deadline=None)
@given(history=valid_histories())
def test_valid_histories_round_trip_through_both_providers(history: list[dict[str, Any]]) -> None:
    msgs = validate_sequence(history)
    assert to_openai(msgs) == history
    payload = to_anthropic(msgs)
    for d in payload.messages:
        ANTHROPIC_MESSAGE.validate_python(d)
    assert from_anthropic(payload.messages, payload.system) == [
        anthropic_expressible(m) for m in msgs
    ]


def test_a_copy_shares_nothing_mutable_with_its_message() -> None:
    m = Message("user", [{"type": "text", "text": "hi"}], metadata={"k": [1]}, extra={"x": {}})
    c = m.copy()
    assert c == m and c is not m and c.__dict__ is not m.__dict__
    c.metadata["k"].append(2)  # type: ignore[attr-defined]
    c.extra["x"]["y"] = 1  # type: ignore[index]
    c.content[0]["text"] = "changed"  # type: ignore[index]
    assert m.metadata == {"k": [1]} and m.extra == {"x": {}} and m.text == "hi"
    plain = Message("user", "hi")
    c = plain.copy()
    assert c.metadata is not plain.metadata and c.extra is not plain.extra


def test_a_copy_carries_token_counts_but_no_other_cache() -> None:
    m = Message("user", "hello there")
    counter = get_counter()
    n = counter.count_message(m)
    m.__dict__["_ctxkeep_compressed"] = {"key": m}
    c = m.copy()
    assert c.__dict__["_tokens"] == m.__dict__["_tokens"]
    assert c.__dict__["_tokens"] is not m.__dict__["_tokens"]
    assert "_ctxkeep_compressed" not in c.__dict__
    assert counter.count_message(c) == n and c == m


def test_tool_calls_none_means_none() -> None:
    # OpenAI's own messages carry "tool_calls": null; None is no calls, as for a dict.
    assert Message("assistant", "hi", tool_calls=None).tool_calls == ()
    assert Message.from_openai({"role": "assistant", "content": "hi", "tool_calls": None}) == (
        Message("assistant", "hi")
    )
    with open_memory("memory://") as mem:
        sid = mem.create_session("agent")
        mem.add_message(sid, "user", "x", tool_calls=None)
        assert mem.get_messages(sid)[0].tool_calls == ()

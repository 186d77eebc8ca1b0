"""Malformed histories and settings through the pruner and the converters (issue 11).

The pruner's output always passes ``validate_sequence``: with ``repair`` (the default) damage is
repaired and reported, without it a typed error names the problem and the message.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    Message,
    MessageError,
    TokenPruner,
    ToolCall,
    from_anthropic,
    get_counter,
    is_valid_sequence,
    validate_sequence,
)

COUNTER = get_counter("o200k_base")


def _call(id: str, command: str = "ls") -> ToolCall:
    return ToolCall(id, "bash", f'{{"command": "{command}"}}')


def duplicate_id_history() -> list[Message]:
    """One assistant message with two calls sharing the id ``c1``, each answered."""
    return [
        Message("system", "s"),
        Message("user", "q"),
        Message("assistant", None, tool_calls=[_call("c1", "ls"), _call("c1", "pwd")]),
        Message("tool", "listing", tool_call_id="c1"),
        Message("tool", "/work", tool_call_id="c1"),
        Message("user", "next"),
    ]


# -- duplicate tool call ids --------------------------------------------------------------------


def test_duplicate_tool_call_ids_are_made_distinct_in_the_call_and_its_result() -> None:
    out = TokenPruner(100_000, 6, counter=COUNTER).prune(duplicate_id_history())
    validate_sequence(out)
    calls = out[2].tool_calls
    assert [tc.id for tc in calls] == ["c1", "c1_2"]
    assert [tc.parsed_arguments()["command"] for tc in calls] == ["ls", "pwd"]
    # the k-th result answers the k-th call, as in the input order
    assert [(m.tool_call_id, m.content) for m in out[3:5]] == [
        ("c1", "listing"),
        ("c1_2", "/work"),
    ]


def test_duplicate_tool_call_ids_repair_is_reported() -> None:
    history = duplicate_id_history()
    _, report = TokenPruner(100_000, 6, counter=COUNTER).prune_with_report(history)
    assert any("duplicate tool call id" in note and "c1_2" in note for note in report.notes)
    # the report describes the input as given
    assert [d.action for d in report.decisions] == ["kept"] * len(history)


def test_duplicate_tool_call_ids_repair_leaves_the_input_untouched() -> None:
    history = duplicate_id_history()
    TokenPruner(100_000, 6, counter=COUNTER).prune(history)
    assert [tc.id for tc in history[2].tool_calls] == ["c1", "c1"]
    assert history[4].tool_call_id == "c1"


def test_a_generated_id_never_collides_with_an_existing_one() -> None:
    history = [
        Message("user", "q"),
        Message("assistant", None, tool_calls=[_call("c1"), _call("c1_2"), _call("c1")]),
        Message("tool", "a", tool_call_id="c1"),
        Message("tool", "b", tool_call_id="c1_2"),
        Message("tool", "c", tool_call_id="c1"),
    ]
    out = TokenPruner(100_000, 6, counter=COUNTER).prune(history)
    validate_sequence(out)
    assert [tc.id for tc in out[1].tool_calls] == ["c1", "c1_2", "c1_3"]
    assert [m.tool_call_id for m in out[2:]] == ["c1", "c1_2", "c1_3"]


def test_a_duplicate_call_with_one_result_gets_a_synthetic_result() -> None:
    history = [
        Message("user", "q"),
        Message("assistant", None, tool_calls=[_call("c1"), _call("c1")]),
        Message("tool", "only one", tool_call_id="c1"),
        Message("user", "next"),
    ]
    out, report = TokenPruner(100_000, 6, counter=COUNTER).prune_with_report(history)
    validate_sequence(out)
    assert [m.tool_call_id for m in out if m.role == "tool"] == ["c1", "c1_2"]
    assert out[3].event_kind == "synthetic_tool_result"
    assert any("synthetic" in note for note in report.notes)


def test_duplicate_tool_call_ids_without_repair_raise_saying_so() -> None:
    with pytest.raises(InvalidMessageError, match="duplicate tool call id 'c1'") as info:
        TokenPruner(100_000, 6, counter=COUNTER, repair=False).prune(duplicate_id_history())
    assert info.value.index == 2


# -- messages with no content -------------------------------------------------------------------


def test_a_user_message_with_no_content_is_dropped_and_reported() -> None:
    history = [Message("system", "s"), Message("user", None)]
    out, report = TokenPruner(6000, 6, counter=COUNTER).prune_with_report(history)
    validate_sequence(out)
    assert out == [Message("system", "s")]
    assert report.decisions[1].action == "dropped"
    assert report.decisions[1].reason == "message with no content"
    assert any("no content" in note for note in report.notes)


def test_a_message_with_no_content_without_repair_is_a_typed_error_naming_it() -> None:
    history = [Message("system", "s"), Message("user", None)]
    with pytest.raises(InvalidMessageError, match="message 1: a user message needs content"):
        TokenPruner(6000, 6, counter=COUNTER, repair=False).prune(history)


def test_the_newest_user_message_with_content_is_the_one_pinned() -> None:
    history = [
        Message("user", "the real question"),
        Message("assistant", "an answer " * 200),
        Message("user", []),
    ]
    out = TokenPruner(60, 0, counter=COUNTER).prune(history)
    validate_sequence(out)
    assert out == [Message("user", "the real question")]


@pytest.mark.parametrize("role", ["system", "developer", "assistant"])
def test_other_messages_with_no_content_are_dropped(role: str) -> None:
    history = [Message(role, None), Message("user", "q"), Message(role, [])]
    out = TokenPruner(6000, 6, counter=COUNTER).prune(history)
    validate_sequence(out)
    assert out == [Message("user", "q")]


def test_a_tool_result_with_no_content_gets_an_empty_text() -> None:
    history = [
        Message("user", "q"),
        Message("assistant", None, tool_calls=[_call("c1")]),
        Message("tool", None, tool_call_id="c1"),
    ]
    out, report = TokenPruner(6000, 6, counter=COUNTER).prune_with_report(history)
    validate_sequence(out)
    assert out[2].content == ""
    assert any("no content" in note for note in report.notes)
    assert history[2].content is None


def test_an_assistant_message_with_tool_calls_needs_no_content() -> None:
    history = [
        Message("user", "q"),
        Message("assistant", None, tool_calls=[_call("c1")]),
        Message("tool", "ok", tool_call_id="c1"),
    ]
    out, report = TokenPruner(6000, 6, counter=COUNTER, repair=False).prune_with_report(history)
    assert out == history
    assert report.notes == []


@pytest.mark.parametrize("content", [None, []])
def test_validate_sequence_refuses_a_message_with_no_content(content: Any) -> None:
    assert not is_valid_sequence([Message("user", content)])
    with pytest.raises(InvalidMessageError, match="message 0: a user message needs content"):
        validate_sequence([Message("user", content)])


# -- constructor settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("param", "bad"),
    [
        ("max_token_budget", 0),
        ("max_token_budget", -5),
        ("max_token_budget", 1.5),
        ("preserve_last_n", -1),
        ("preserve_last_n", "6"),
        ("preserve_last_n", True),
        ("counter", "o200k_base"),
        ("counter", object()),
        ("artifacts", {}),
        ("artifacts", "memory://"),
        ("compress_threshold", -5),
        ("compress_threshold", math.inf),
        ("compress_threshold", "256"),
        ("excerpt_tokens", -1),
        ("excerpt_tokens", 2.5),
        ("excerpt_tokens", None),
        ("summarizer", lambda messages: "a summary"),
        ("summarizer", "summarize"),
        ("summary_max_tokens", -5),
        ("summary_max_tokens", None),
        ("repair", "yes"),
        ("repair", None),
        ("compress_oversized_user", 1),
    ],
)
def test_a_nonsensical_setting_is_a_config_error_naming_the_parameter(param: str, bad: Any) -> None:
    with pytest.raises(ConfigError, match=param):
        TokenPruner(**{param: bad})


def test_summary_room_larger_than_the_budget_is_a_config_error() -> None:
    class Summarizer:
        def summarize(self, messages: list[Message]) -> str:
            return "summary"

    with pytest.raises(ConfigError, match="summary_max_tokens"):
        TokenPruner(300, summarizer=Summarizer(), summary_max_tokens=400)
    TokenPruner(300, summarizer=Summarizer(), summary_max_tokens=300)


def test_the_documented_settings_are_accepted() -> None:
    pruner = TokenPruner(1, 0, compress_threshold=0, excerpt_tokens=0, summary_max_tokens=0)
    assert (pruner.compress_threshold, pruner.excerpt_tokens) == (0, 0)
    assert TokenPruner(compress_threshold=None).compress_threshold is None


def test_compress_takes_a_message_or_an_openai_dict_only() -> None:
    pruner = TokenPruner(counter=COUNTER)
    out = pruner.compress({"role": "tool", "tool_call_id": "c1", "content": "x" * 5000})
    assert out.artifact_refs
    with pytest.raises(InvalidMessageError):
        pruner.compress(object())  # type: ignore[arg-type]


# -- from_anthropic -----------------------------------------------------------------------------


def _anthropic_tool_use(tool_input: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": tool_input}],
        },
    ]


@pytest.mark.parametrize(
    "tool_input",
    [{"when": object()}, {"raw": b"\x00"}, {"x": math.nan}, {"x": {1, 2}}],
    ids=["object", "bytes", "nan", "set"],
)
def test_a_tool_use_input_that_is_not_json_is_a_typed_error_naming_the_message(
    tool_input: Any,
) -> None:
    with pytest.raises(InvalidMessageError, match="message 1: tool_use 't1'") as info:
        from_anthropic(_anthropic_tool_use(tool_input))
    assert info.value.index == 1


@pytest.mark.parametrize("tool_input", [["ls"], "ls", 5])
def test_a_tool_use_input_that_is_not_an_object_is_a_typed_error(tool_input: Any) -> None:
    with pytest.raises(InvalidMessageError, match=r"message 1: .* must be an object"):
        from_anthropic(_anthropic_tool_use(tool_input))


def test_a_tool_use_with_a_non_string_id_names_the_message() -> None:
    bad = _anthropic_tool_use({})
    bad[1]["content"][0]["id"] = 5
    with pytest.raises(InvalidMessageError, match="message 1: "):
        from_anthropic(bad)


# -- any damage -----------------------------------------------------------------------------------

_texts = st.one_of(
    st.none(), st.just([]), st.text(max_size=30), st.text(min_size=200, max_size=900)
)


@st.composite
def damaged_histories(draw: st.DrawFn) -> list[Message]:
    """Histories with every kind of damage: shared ids, missing and stray results, no content."""
    msgs: list[Message] = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["system", "user", "assistant", "tools", "tools", "stray"]))
        if kind in ("system", "user", "assistant"):
            msgs.append(Message(kind, draw(_texts)))
        elif kind == "stray":
            msgs.append(Message("tool", draw(_texts), tool_call_id=draw(st.sampled_from("abc"))))
        else:
            ids = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4))
            msgs.append(Message("assistant", draw(_texts), tool_calls=[_call(i) for i in ids]))
            answers = draw(st.lists(st.sampled_from(["a", "b", "c"]), max_size=5))
            msgs.extend(Message("tool", draw(_texts), tool_call_id=i) for i in answers)
    return msgs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=damaged_histories(), budget=st.integers(50, 3000), last_n=st.integers(0, 6))
def test_the_pruner_output_always_passes_validate_sequence(
    history: list[Message], budget: int, last_n: int
) -> None:
    pruner = TokenPruner(budget, last_n, counter=COUNTER)
    try:
        out = pruner.prune(history)
    except BudgetExceededError:
        return
    validate_sequence(out)
    assert COUNTER.count_messages(out) <= budget


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=damaged_histories(), budget=st.integers(50, 3000), last_n=st.integers(0, 6))
def test_without_repair_the_pruner_output_is_valid_or_a_typed_error(
    history: list[Message], budget: int, last_n: int
) -> None:
    pruner = TokenPruner(budget, last_n, counter=COUNTER, repair=False)
    try:
        out = pruner.prune(history)
    except (MessageError, BudgetExceededError):
        return
    validate_sequence(out)


@pytest.mark.parametrize("messages", [None, 5, "hello", {"role": "user", "content": "hi"}])
def test_from_anthropic_of_something_that_is_not_a_list_is_a_typed_error(messages: Any) -> None:
    with pytest.raises(InvalidMessageError, match="expected a list of Anthropic messages"):
        from_anthropic(messages)

"""Pruning OpenAI dicts: read lazily, each dict's message reused only while the dict is unchanged.

The pruner reads a dict only where it looks and keeps the message it made under the dict's
identity with a snapshot of its content (:mod:`ctxkeep.prune.inputs`); these tests hold it to
giving exactly what pruning the coerced messages gives, to seeing every change to a dict, and
to refusing a malformed dict it reads.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep import (
    InvalidMessageError,
    Message,
    TokenPruner,
    ToolCall,
    coerce_messages,
    get_counter,
    validate_sequence,
)
from ctxkeep.errors import CorruptRecordError, UnknownRoleError
from ctxkeep.sessions.records import (
    dumps_record,
    full_record,
    message_to_record,
    record_to_message,
)

COUNTER = get_counter("o200k_base")

_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
)
_big = st.builds(lambda s, n: (s or "x") * n, _text, st.integers(1, 300))


@st.composite
def dict_histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Random OpenAI histories: parallel tool calls, system messages in odd places, content
    parts, names and provider keys ctxkeep passes through.
    """
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": "system", "content": draw(_text) or "sys"})
    call = 0
    for _ in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["user", "parts", "assistant", "tools", "tools", "system"]))
        if kind == "user":
            d: dict[str, Any] = {"role": "user", "content": draw(st.one_of(_text, _big))}
            if draw(st.booleans()):
                d["name"] = "alice"
            out.append(d)
        elif kind == "parts":
            out.append({"role": "user", "content": [{"type": "text", "text": draw(_big)}]})
        elif kind == "assistant":
            out.append({"role": "assistant", "content": draw(_text), "refusal": None})
        elif kind == "system":
            out.append({"role": "system", "content": draw(_text)})
        else:
            calls = []
            for _ in range(draw(st.integers(1, 3))):
                call += 1
                calls.append(
                    {
                        "id": f"c{call}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": json.dumps({"n": call})},
                    }
                )
            out.append(
                {
                    "role": "assistant",
                    "content": draw(st.one_of(st.none(), _text)),
                    "tool_calls": calls,
                }
            )
            results = [
                {"role": "tool", "tool_call_id": c["id"], "content": draw(st.one_of(_text, _big))}
                for c in calls
            ]
            out.extend(draw(st.permutations(results)))
    if not any(d["role"] == "user" for d in out):
        out.insert(0, {"role": "user", "content": "go"})
    return out


def _payload(msgs: list[Message]) -> list[dict[str, Any]]:
    return [m.to_openai() for m in msgs]


def _pruners(budget: int, last_n: int, cache_stable: bool) -> tuple[TokenPruner, TokenPruner]:
    def make() -> TokenPruner:
        return TokenPruner(budget, last_n, COUNTER, cache_stable=cache_stable)

    return make(), make()


def _same_prune(pruner: TokenPruner, reference: TokenPruner, dicts: list[dict[str, Any]]) -> None:
    """``pruner`` on the dicts gives exactly what ``reference`` gives on their messages."""
    try:
        expected, expected_report = reference.prune_with_report(coerce_messages(dicts))
    except Exception as exc:  # the same refusal, then
        with pytest.raises(type(exc)):
            pruner.prune_with_report(dicts)
        return
    out, report = pruner.prune_with_report(dicts)
    assert out == expected
    assert report.tokens_after == expected_report.tokens_after
    assert report.sections == expected_report.sections
    assert [(d.action, d.tokens_before, d.tokens_after) for d in report.decisions] == [
        (d.action, d.tokens_before, d.tokens_after) for d in expected_report.decisions
    ]
    validate_sequence(out)
    assert COUNTER.count_messages(out) <= pruner.max_token_budget


# -- the same prompt as the coerced messages ---------------------------------------------------


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=dict_histories(),
    more=dict_histories(),
    budget=st.integers(60, 2500),
    last_n=st.integers(0, 6),
    cache_stable=st.booleans(),
)
def test_pruning_dicts_gives_what_pruning_their_messages_gives(
    history: list[dict[str, Any]],
    more: list[dict[str, Any]],
    budget: int,
    last_n: int,
    cache_stable: bool,
) -> None:
    before = json.dumps(history)
    pruner, reference = _pruners(budget, last_n, cache_stable)
    _same_prune(pruner, reference, history)
    _same_prune(pruner, reference, history)  # warm: the messages read before are reused
    # The history grows (the new turn's call ids renamed so they stay distinct).
    grown = history + json.loads(json.dumps(more).replace('"c', '"n'))
    _same_prune(pruner, reference, grown)
    assert json.dumps(history) == before  # the input is untouched


def test_a_prune_of_dicts_reads_only_what_it_keeps() -> None:
    history: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "go"}]
    for i in range(200):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        history.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i} " * 40})
    history[5] = {"role": "assistant", "content": 42}  # malformed, old: never read
    pruner = TokenPruner(600, 4, COUNTER, cache_stable=False)
    out = pruner.prune(history)
    validate_sequence(out)
    assert len(pruner._reader._read) < 40


# -- a changed dict is read again --------------------------------------------------------------


def _history() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
        {"role": "user", "content": "second", "extra_key": 1},
    ]


MUTATIONS = {
    "content replaced": lambda h: h[1].__setitem__("content", "changed"),
    "content part changed in place": lambda h: (
        h[1].__setitem__("content", [{"type": "text", "text": "parts"}])
        or h[1]["content"][0].__setitem__("text", "changed in place")
    ),
    "tool arguments changed in place": lambda h: h[2]["tool_calls"][0]["function"].__setitem__(
        "arguments", '{"a": 2}'
    ),
    "role changed": lambda h: h[1].__setitem__("role", "system"),
    "key added": lambda h: h[3].__setitem__("name", "tool-name"),
    "key removed": lambda h: h[4].pop("extra_key"),
    "1 becomes True": lambda h: h[4].__setitem__("extra_key", True),
    "1 becomes 1.0": lambda h: h[4].__setitem__("extra_key", 1.0),
}


@pytest.mark.parametrize("cache_stable", [False, True])
@pytest.mark.parametrize("mutation", list(MUTATIONS), ids=list(MUTATIONS))
def test_a_dict_changed_between_two_prunes_is_read_again(mutation: str, cache_stable: bool) -> None:
    history = _history()
    pruner = TokenPruner(5000, 2, COUNTER, cache_stable=cache_stable)
    pruner.prune(history)
    MUTATIONS[mutation](history)
    out = pruner.prune(history)
    fresh = TokenPruner(5000, 2, COUNTER, cache_stable=cache_stable).prune(coerce_messages(history))
    assert out == fresh
    assert [m.to_openai() for m in out] == [m.to_openai() for m in fresh]
    assert COUNTER.count_messages(out) == COUNTER.count_messages(fresh)


def test_a_changed_dict_is_counted_again() -> None:
    history = _history()
    pruner = TokenPruner(5000, 2, COUNTER, cache_stable=False)
    _, before = pruner.prune_with_report(history)
    history[3]["content"] = "a much longer result " * 50
    _, after = pruner.prune_with_report(history)
    assert after.tokens_after == COUNTER.count_messages(coerce_messages(history))
    assert after.tokens_after > before.tokens_after


def test_a_dict_object_reused_for_other_content_is_not_taken_for_the_old_one() -> None:
    history = _history()
    pruner = TokenPruner(5000, 2, COUNTER)
    pruner.prune(history)
    history[4].clear()
    history[4].update({"role": "user", "content": "a new question"})
    assert pruner.prune(history)[-1].content == "a new question"


# -- malformed dicts ---------------------------------------------------------------------------


@pytest.mark.parametrize("cache_stable", [False, True])
@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"role": "robot", "content": "x"}, UnknownRoleError),
        ({"role": ["user"], "content": "x"}, InvalidMessageError),
        ({"role": "user", "content": {"no": object()}}, InvalidMessageError),
        ({"content": "no role"}, InvalidMessageError),
        ({"role": "tool", "content": "no id"}, InvalidMessageError),
    ],
)
def test_a_malformed_dict_the_pruner_reads_raises(
    bad: dict[str, Any], error: type[Exception], cache_stable: bool
) -> None:
    history = [*_history(), bad]
    pruner = TokenPruner(5000, 2, COUNTER, cache_stable=cache_stable)
    with pytest.raises(error) as info:
        pruner.prune(history)
    assert getattr(info.value, "index", None) == len(history) - 1


def test_a_dict_made_malformed_after_a_prune_raises_when_read_again() -> None:
    history = _history()
    pruner = TokenPruner(5000, 2, COUNTER)
    pruner.prune(history)
    history[4]["content"] = 7
    with pytest.raises(InvalidMessageError):
        pruner.prune(history)


def test_an_iterator_is_read_once_whichever_mode_plans() -> None:
    call = ToolCall("c1", "f", "{}")
    # A system message after a call still waiting: the cache-stable mode hands over to the
    # default mode, which must see the same messages.
    msgs = [
        Message("user", "go"),
        Message("assistant", None, tool_calls=[call]),
        Message("system", "late"),
    ]
    pruner = TokenPruner(5000, 2, COUNTER)
    assert pruner.prune(iter([m.to_openai() for m in msgs])) == pruner.prune(msgs)


# -- the record decoder ------------------------------------------------------------------------

_opt = st.one_of(st.none(), _text)


@st.composite
def stored_messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    content: Any = draw(st.one_of(_text, st.none()))
    if draw(st.booleans()):
        content = [{"type": "text", "text": draw(_text)}]
    calls = []
    if role == "assistant":
        calls = [
            ToolCall(f"id{i}{draw(_text)}", draw(_text), draw(_text))
            for i in range(draw(st.integers(0, 2)))
        ]
    json_values = st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), _text),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
        max_leaves=6,
    )
    return Message(
        role,
        content,
        name=draw(_opt),
        turn_id=draw(_opt),
        tool_call_id=("t" + draw(_text)) if role == "tool" else None,
        tool_calls=calls,
        event_kind=draw(_opt),
        parent_id=draw(_opt),
        id=draw(_opt),
        artifact_refs=draw(st.lists(_text, max_size=2)),
        metadata=draw(st.dictionaries(_text, json_values, max_size=3)),
        extra=draw(st.dictionaries(_text, json_values, max_size=2)),
        created_at=draw(st.one_of(st.none(), st.just(datetime(2025, 1, 2, 3, 4, 5, 6, UTC)))),
    )


@settings(max_examples=200, deadline=None)
@given(m=stored_messages())
def test_the_record_decoder_round_trips_every_field(m: Message) -> None:
    back = record_to_message(dumps_record(m))
    assert back == m
    for name in ("tool_calls", "artifact_refs"):
        assert type(getattr(back, name)) is tuple
    assert back.tool_calls == m.tool_calls
    assert [type(tc) for tc in back.tool_calls] == [ToolCall] * len(m.tool_calls)
    assert back.to_openai() == m.to_openai()
    assert COUNTER.count_message(back) == COUNTER.count_message(m)
    # a decoded message is a message like any other: copies and replaces validate the same
    assert back.copy() == m
    assert back.replace(id="x").id == "x"


@pytest.mark.parametrize(
    "corrupt",
    [
        {"name": 5},
        {"role": "robot"},
        {"role": 3},
        {"tool_call_id": None, "role": "tool"},
        {"tool_call_id": "", "role": "tool"},
        {"tool_call_id": "x"},  # on a user message
        {"tool_calls": [{"id": "", "name": "f", "arguments": "{}"}], "role": "assistant"},
        {"tool_calls": [{"id": "c", "name": "f", "arguments": {}}], "role": "assistant"},
        {"tool_calls": [{"id": "c", "name": "f"}], "role": "assistant"},
        {"tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]},  # on a user message
        {"artifact_refs": [1]},
        {"artifact_refs": "ref"},
        {"metadata": [1]},
        {"extra": "x"},
        {"created_at": "not a date"},
        {"created_at": 5},
        {"content": 5},
        {"content": [{"no": "type"}]},
        {"turn_id": ["t"]},
    ],
)
def test_a_corrupt_record_raises_and_never_makes_an_invalid_message(
    corrupt: dict[str, Any],
) -> None:
    record = {**message_to_record(Message("user", "hi")), **corrupt}
    with pytest.raises(CorruptRecordError):
        record_to_message(json.dumps(record))


def test_a_record_with_an_unknown_key_takes_the_checked_path() -> None:
    # in place of a field: as many keys as a full record
    record = {**full_record(message_to_record(Message("user", "hi", id="m1"))), "future": 1}
    del record["event_kind"]
    assert record_to_message(record) == Message("user", "hi", id="m1")
    # beside the fields a compact record has
    record = {**message_to_record(Message("user", "hi", id="m1")), "future": 1}
    assert record_to_message(record) == Message("user", "hi", id="m1")


def test_decoding_leaves_the_record_as_it_was() -> None:
    record = message_to_record(Message("assistant", "x", tool_calls=[ToolCall("c", "f", "{}")]))
    before = json.dumps(record)
    record_to_message(record)
    assert json.dumps(record) == before


def test_a_copy_is_deep_and_keeps_token_counts() -> None:
    m = Message("user", [{"type": "text", "text": "hi"}], metadata={"k": [1]}, extra={"x": {}})
    n = COUNTER.count_message(m)
    twin = m.copy()
    assert twin == m
    assert twin.content is not m.content and twin.metadata is not m.metadata
    assert twin.metadata["k"] is not m.metadata["k"] and twin.extra is not m.extra
    assert twin.__dict__["_tokens"] == m.__dict__["_tokens"]
    assert twin.__dict__["_tokens"] is not m.__dict__["_tokens"]
    assert COUNTER.count_message(twin) == n


def test_a_record_dict_holding_tuples_never_makes_an_invalid_message() -> None:
    # JSON gives lists; a caller's dict may hold tuples, which the fast path does not take
    record = message_to_record(Message("assistant", "x", tool_calls=[ToolCall("c", "f", "{}")]))
    record["tool_calls"] = tuple(record["tool_calls"])
    record["artifact_refs"] = ("a",)
    m = record_to_message(record)
    assert m.tool_calls == (ToolCall("c", "f", "{}"),) and m.artifact_refs == ("a",)
    assert type(m.tool_calls[0]) is ToolCall

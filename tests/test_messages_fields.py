"""Every field of ``Message`` reaches every form derived from its fields.

The stored record (``sessions/records.py``), the wire form (``server/wire.py``), the service's
request and response models (``server/models.py``), :meth:`Message.replace` and
:meth:`Message.copy` are derived from ``dataclasses.fields(Message)``. These tests give each
field a value other than its default and check that it survives each of them, so a field added
to ``Message`` fails here until it has a sample (and then passes without touching the forms,
or shows which one cannot carry it).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from ctxkeep.errors import CorruptRecordError
from ctxkeep.messages import FIELDS, Message, ToolCall
from ctxkeep.server.models import MessageIn, MessageOut
from ctxkeep.server.wire import MESSAGE_FIELDS, message_from_wire, message_to_wire
from ctxkeep.sessions import records
from ctxkeep.sessions.records import dumps, message_to_record, record_to_message

SAMPLES: dict[str, Any] = {
    "role": "assistant",
    "content": [{"type": "text", "text": "calling"}],
    "name": "planner",
    "turn_id": "turn-7",
    "tool_call_id": None,  # an assistant message has none; see the tool message below
    "tool_calls": (ToolCall("c1", "grep", '{"pattern": "x"}'),),
    "event_kind": "decision",
    "parent_id": "m-6",
    "id": "m-7",
    "artifact_refs": ("art-1",),
    "metadata": {"model": "m", "nested": [1, {"k": None}]},
    "extra": {"refusal": None, "audio": {"id": "a1"}},
    "created_at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC),
}
"""A value other than the default for every field (one message holds them all)."""


def _sample() -> Message:
    return Message(**SAMPLES)


def _tool_sample() -> Message:
    return Message("tool", "out", tool_call_id="c1", id="m-8")


def _messages() -> list[Message]:
    return [_sample(), _tool_sample()]


def test_every_field_has_a_sample() -> None:
    assert set(SAMPLES) == set(FIELDS), "give the new Message field a sample value in SAMPLES"


@pytest.mark.parametrize("name", FIELDS)
def test_the_sample_differs_from_the_default(name: str) -> None:
    if name == "tool_call_id":
        assert _tool_sample().tool_call_id != Message("assistant", "").tool_call_id
        return
    f = next(f for f in dataclasses.fields(Message) if f.name == name)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return  # required: no default to differ from
    default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
    assert SAMPLES[name] != default


def test_the_constructor_signature_type_checkers_see_lists_every_field_in_order() -> None:
    # Message declares, under TYPE_CHECKING only, the __init__ signature type checkers see
    # (wider parameter types than the fields'); at run time the dataclass generates it.
    tree = ast.parse(inspect.getsource(Message))
    stubs = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "__init__"
    ]
    assert len(stubs) == 1
    params = [a.arg for a in (*stubs[0].args.args, *stubs[0].args.kwonlyargs)]
    assert params == ["self", *FIELDS]
    positional = [a.arg for a in stubs[0].args.args]
    generated = inspect.signature(Message).parameters
    assert positional[1:] == [
        p.name for p in generated.values() if p.kind is p.POSITIONAL_OR_KEYWORD
    ]


def test_role_and_content_are_positional_the_rest_keyword_only() -> None:
    m = Message("user", "hi", name="n")
    assert (m.role, m.content, m.name) == ("user", "hi", "n")
    with pytest.raises(TypeError):
        Message("user", "hi", "n")  # type: ignore[misc]


def _default(name: str) -> Any:
    f = next(f for f in dataclasses.fields(Message) if f.name == name)
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


@pytest.mark.parametrize("m", _messages(), ids=["assistant", "tool"])
def test_every_field_survives_the_stored_record(m: Message) -> None:
    record = message_to_record(m)
    # v, the role, and each field not at its default, in order (the assistant sample sets
    # every field but the tool message's call id)
    assert list(record) == ["v", "role", *(n for n in FIELDS[1:] if getattr(m, n) != _default(n))]
    back = record_to_message(dumps(record))
    for name in FIELDS:
        assert getattr(back, name) == getattr(m, name), name
    assert back == m


@pytest.mark.parametrize("m", _messages(), ids=["assistant", "tool"])
def test_every_field_survives_the_wire_form(m: Message) -> None:
    assert MESSAGE_FIELDS == FIELDS
    wire = message_to_wire(m)
    assert list(wire) == list(FIELDS)
    assert message_from_wire(wire) == m


def test_the_wire_form_has_every_field_where_the_stored_record_leaves_defaults_out() -> None:
    # The service's responses declare every member required (MessageOut): its clients, of
    # any version, read them all.
    m = Message("user", "hi")
    assert list(message_to_record(m)) == ["v", "role", "content"]
    assert message_to_wire(m) == {
        **dict.fromkeys(FIELDS),
        **_EMPTY,
        "role": "user",
        "content": "hi",
    }
    assert list(message_to_wire(m)) == list(FIELDS)


_EMPTY: dict[str, Any] = {"tool_calls": [], "artifact_refs": [], "metadata": {}, "extra": {}}


@pytest.mark.parametrize("m", _messages(), ids=["assistant", "tool"])
def test_every_field_survives_the_service_models(m: Message) -> None:
    assert list(MessageIn.model_fields) == list(FIELDS)
    assert list(MessageOut.model_fields) == list(FIELDS)
    wire = message_to_wire(m)
    out = MessageOut.model_validate(wire).model_dump(mode="json")
    assert message_from_wire(out) == m
    sent = MessageIn.model_validate(wire).model_dump(exclude_unset=True)
    assert message_from_wire(sent) == m


def test_only_the_role_is_required_in_a_request() -> None:
    assert [n for n, f in MessageIn.model_fields.items() if f.is_required()] == ["role"]
    assert all(f.is_required() for f in MessageOut.model_fields.values())


@pytest.mark.parametrize("name", [n for n in FIELDS if n != "role"])
def test_replace_changes_one_field_and_keeps_every_other(name: str) -> None:
    base = (
        Message("assistant", "x")
        if name != "tool_call_id"
        else Message("tool", "x", tool_call_id="c0")
    )
    value = SAMPLES[name] if name != "tool_call_id" else "c1"
    changed = base.replace(**{name: value})
    assert getattr(changed, name) == value
    for other in FIELDS:
        if other != name:
            assert getattr(changed, other) == getattr(base, other), other


def test_copy_carries_every_field() -> None:
    m = _sample()
    c = m.copy()
    assert c == m
    assert all(getattr(c, n) == getattr(m, n) for n in FIELDS)
    assert c.metadata is not m.metadata
    assert c.content is not m.content


def test_the_fast_record_decoder_checks_every_field() -> None:
    assert records.FAST_PATH, (
        "record_to_message's fast path does not check a field of Message: add it to "
        "_decode_current and _FAST_CHECKS in sessions/records.py"
    )


BAD_VALUES: list[Any] = [None, 1, 1.5, True, "s", "", [], ["s"], [1], {}, {"a": 1}]
LEFT_OUT: Any = object()
"""In place of a value: the field is taken out of the record."""


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize(
    "value", [*BAD_VALUES, LEFT_OUT], ids=lambda v: "left out" if v is LEFT_OUT else repr(v)
)
@pytest.mark.parametrize("shape", ["compact", "full"])
def test_the_fast_record_decoder_accepts_what_the_checked_one_accepts(
    name: str, value: Any, shape: str
) -> None:
    # The fast decoder takes a current record's values without copies, checking their types
    # itself; whatever JSON a record holds in a field, or none, it must agree with the
    # checked path (which builds the message through Message's own checks), on a record
    # without its defaults as on one with every field. A key the record does not have sends
    # the same record down the checked path.
    for m in _messages():
        record = message_to_record(m)
        if shape == "full":
            record = records.full_record(record)
        if value is LEFT_OUT:
            record.pop(name, None)
        else:
            record[name] = value
        try:
            expected: Message | None = record_to_message(dumps({**record, "unknown": 0}))
        except CorruptRecordError:
            expected = None
        if expected is None:
            with pytest.raises(CorruptRecordError):
                record_to_message(dumps(record))
        else:
            assert record_to_message(dumps(record)) == expected


def test_content_parts_take_the_fast_path_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Responses and Anthropic messages hold lists of parts: decoding them without the checked
    # path's second pass (the list is the caller's, fresh from JSON) keeps reads of such
    # sessions as fast as of plain text; the parts are still checked as Message checks them.
    m = Message("assistant", [{"type": "output_text", "text": "hi"}, {"type": "refusal"}])
    record = json.loads(dumps(message_to_record(m)))
    checked = records._state_from_record
    monkeypatch.setattr(records, "_state_from_record", None)  # the checked path fails
    decoded = record_to_message(record)
    assert decoded == m
    assert decoded.content is record["content"]  # taken as is
    monkeypatch.setattr(records, "_state_from_record", checked)
    bad = json.loads(dumps(message_to_record(m)))
    bad["content"] = [{"type": "text", "text": 1}]
    with pytest.raises(CorruptRecordError, match="text"):
        record_to_message(bad)

"""The stored record format: the same messages are written as the same text, and every text
written before stays readable, by this ctxkeep and by an older one.

The full texts below were written by ctxkeep before ``Message`` was rebuilt on its dataclass
fields (commit ae07a8f) and by every release up to the compact records: ``v`` and every field.
A record now leaves out each field at its default (the compact texts); every reader of version
1 takes a field a record lacks as its default, so the version stays 1.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from ctxkeep.errors import CorruptRecordError, MessageIdConflictError
from ctxkeep.messages import Message, ToolCall
from ctxkeep.sessions import records
from ctxkeep.sessions.records import (
    AlreadyStored,
    dumps_record,
    full_record,
    message_to_record,
    record_to_message,
    settle_ids,
)

STORED = [
    (
        Message(
            "user",
            "fix the test",
            turn_id="t1",
            id="m1",
            created_at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        ),
        '{"v":1,"role":"user","content":"fix the test","name":null,"turn_id":"t1",'
        '"tool_call_id":null,"tool_calls":[],"event_kind":null,"parent_id":null,"id":"m1",'
        '"artifact_refs":[],"metadata":{},"extra":{},'
        '"created_at":"2026-01-02T03:04:05.678901+00:00"}',
    ),
    (
        Message(
            "assistant",
            [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "text", "text": "run it"},
            ],
            tool_calls=[ToolCall("c1", "bash", '{"cmd": "ls"}')],
            metadata={"model": "m", "n": [1, {"k": None}]},
            parent_id="m1",
            id="m2",
        ),
        '{"v":1,"role":"assistant","content":[{"type":"thinking","thinking":"hm",'
        '"signature":"sig"},{"type":"text","text":"run it"}],"name":null,"turn_id":null,'
        '"tool_call_id":null,"tool_calls":[{"id":"c1","name":"bash",'
        '"arguments":"{\\"cmd\\": \\"ls\\"}"}],"event_kind":null,"parent_id":"m1","id":"m2",'
        '"artifact_refs":[],"metadata":{"model":"m","n":[1,{"k":null}]},"extra":{},'
        '"created_at":null}',
    ),
    (
        Message(
            "tool",
            "a.py\nb.py",
            tool_call_id="c1",
            event_kind="observation",
            artifact_refs=["art_1", "art_2"],
            extra={"x": 1.5},
            created_at=datetime(2026, 1, 2, 3, 4, 6, tzinfo=timezone(timedelta(hours=2))),
        ),
        '{"v":1,"role":"tool","content":"a.py\\nb.py","name":null,"turn_id":null,'
        '"tool_call_id":"c1","tool_calls":[],"event_kind":"observation","parent_id":null,'
        '"id":null,"artifact_refs":["art_1","art_2"],"metadata":{},"extra":{"x":1.5},'
        '"created_at":"2026-01-02T03:04:06+02:00"}',
    ),
    (
        Message("system", "be brief", name="ops"),
        '{"v":1,"role":"system","content":"be brief","name":"ops","turn_id":null,'
        '"tool_call_id":null,"tool_calls":[],"event_kind":null,"parent_id":null,"id":null,'
        '"artifact_refs":[],"metadata":{},"extra":{},"created_at":null}',
    ),
]


COMPACT = [
    '{"v":1,"role":"user","content":"fix the test","turn_id":"t1","id":"m1",'
    '"created_at":"2026-01-02T03:04:05.678901+00:00"}',
    '{"v":1,"role":"assistant","content":[{"type":"thinking","thinking":"hm",'
    '"signature":"sig"},{"type":"text","text":"run it"}],"tool_calls":[{"id":"c1",'
    '"name":"bash","arguments":"{\\"cmd\\": \\"ls\\"}"}],"parent_id":"m1","id":"m2",'
    '"metadata":{"model":"m","n":[1,{"k":null}]}}',
    '{"v":1,"role":"tool","content":"a.py\\nb.py","tool_call_id":"c1",'
    '"event_kind":"observation","artifact_refs":["art_1","art_2"],"extra":{"x":1.5},'
    '"created_at":"2026-01-02T03:04:06+02:00"}',
    '{"v":1,"role":"system","content":"be brief","name":"ops"}',
]
"""What this ctxkeep writes for the messages of :data:`STORED`, in the same order."""
CASES = [(m, full, compact) for (m, full), compact in zip(STORED, COMPACT, strict=True)]
IDS = ["user", "assistant", "tool", "system"]


@pytest.mark.parametrize(("message", "full", "compact"), CASES, ids=IDS)
def test_a_message_is_stored_without_its_defaults(
    message: Message, full: str, compact: str
) -> None:
    assert dumps_record(message) == compact
    assert len(compact) < len(full)


@pytest.mark.parametrize(("message", "full", "compact"), CASES, ids=IDS)
def test_a_record_written_before_reads_back_as_the_same_message(
    message: Message, full: str, compact: str
) -> None:
    back = record_to_message(full)
    assert back == message
    assert dumps_record(back) == compact


@pytest.mark.parametrize(("message", "full", "compact"), CASES, ids=IDS)
def test_both_shapes_take_the_fast_path(
    message: Message, full: str, compact: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records, "_state_from_record", None)  # the checked path fails
    assert record_to_message(full) == message
    assert record_to_message(compact) == message


@pytest.mark.parametrize(("message", "full", "compact"), CASES, ids=IDS)
def test_the_full_shape_is_the_compact_record_with_its_defaults(
    message: Message, full: str, compact: str
) -> None:
    expanded = full_record(json.loads(compact))
    assert expanded == json.loads(full)
    assert list(expanded) == list(json.loads(full))


@pytest.mark.parametrize(("message", "full", "compact"), CASES, ids=IDS)
def test_the_checked_path_older_readers_take_reads_the_compact_text(
    message: Message, full: str, compact: str
) -> None:
    # A reader before the compact records decodes a record on its fast path only where it
    # has every field (it counts the keys); any other record goes down the checked path,
    # which takes a field a record lacks as its default. That path is this one, unchanged.
    state = records._state_from_record(json.loads(compact))
    assert Message._from_owned(state) == message


@pytest.mark.parametrize(
    "text",
    [
        '{"v":1}',  # no role
        '{"v":1,"role":"tool","content":"x"}',  # a tool result left without its call id
        '{"v":1,"role":"user","content":"x","tool_calls":[{"id":"c","name":"f","arguments":"{}"}]}',
        '{"v":1,"role":"assistant","tool_calls":"c"}',
        '{"v":1,"role":"assistant","artifact_refs":[1]}',
        '{"v":1,"role":"user","metadata":[1]}',
        '{"v":1,"role":"user","extra":"x"}',
        '{"v":1,"role":"user","created_at":"yesterday"}',
        '{"v":1,"role":"user","name":5}',
        '{"v":1,"role":"robot"}',
        '{"v":1,"role":"user","content":5,"future":1}',
    ],
)
def test_a_damaged_compact_record_is_a_corrupt_record(text: str) -> None:
    with pytest.raises(CorruptRecordError, match="seq 7"):
        record_to_message(text, session_id="s", seq=7)


@pytest.mark.parametrize(("message", "full", "compact"), CASES, ids=IDS)
def test_a_retry_finds_its_message_stored_in_either_shape(
    message: Message, full: str, compact: str
) -> None:
    # An append sent again (by this ctxkeep) of a message an older one stored: the same
    # message, not another one under its id.
    new = message_to_record(message.replace(id="m-9"))
    for text in (full, compact):
        stored = {**json.loads(text), "id": "m-9"}
        with pytest.raises(AlreadyStored):
            settle_ids("s", [new], [(1, stored)])
        other = message_to_record(message.replace(id="m-9", event_kind="other"))
        with pytest.raises(MessageIdConflictError):
            settle_ids("s", [other], [(1, stored)])

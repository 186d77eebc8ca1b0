"""The stored record format does not change: records written before stay readable, and the
same messages are written as the same text.

The texts below were written by ctxkeep before ``Message`` was rebuilt on its dataclass fields
(commit ae07a8f); every backend stores this text.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from ctxkeep.messages import Message, ToolCall
from ctxkeep.sessions.records import dumps_record, record_to_message

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


@pytest.mark.parametrize(("message", "text"), STORED, ids=["user", "assistant", "tool", "system"])
def test_a_message_is_stored_as_the_same_text_as_before(message: Message, text: str) -> None:
    assert dumps_record(message) == text


@pytest.mark.parametrize(("message", "text"), STORED, ids=["user", "assistant", "tool", "system"])
def test_a_record_written_before_reads_back_as_the_same_message(
    message: Message, text: str
) -> None:
    back = record_to_message(text)
    assert back == message
    assert dumps_record(back) == text

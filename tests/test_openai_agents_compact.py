"""What a CtxkeepSession writes to give each item back: nothing for a plain item (the item
:func:`~ctxkeep.to_responses` makes of its message anyway), the item's other fields and key
order for any other; and records written with entries for plain items (before they were
left out) read back the same.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ctxkeep import MemoryConfig, Message, ToolCall
from ctxkeep.errors import InvalidMessageError
from ctxkeep.integrations._items import owned_from_responses
from ctxkeep.integrations.openai_agents import CtxkeepSession
from ctxkeep.responses import RESPONSES_KEY, from_responses, to_responses
from ctxkeep.sessions.records import dumps_record, record_to_message

UNBOUNDED = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)

PLAIN: list[dict[str, Any]] = [
    {"type": "message", "role": "system", "content": "You read files."},
    {"type": "message", "role": "user", "content": "What is in a.txt?"},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "And this?"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
        ],
    },
    {"type": "message", "role": "assistant", "content": "Reading it."},
    {"type": "function_call", "call_id": "c1", "name": "read", "arguments": '{"p": "a.txt"}'},
    {"type": "function_call", "call_id": "c2", "name": "ls", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "hello"},
    {
        "type": "function_call_output",
        "call_id": "c2",
        "output": [{"type": "input_text", "text": "a.txt"}],
    },
    {"type": "message", "role": "assistant", "content": ""},
]
"""One of each plain shape: the items ``to_responses`` makes of Chat messages."""

UNUSUAL: list[dict[str, Any]] = [
    {"role": "user", "content": "an easy message, no type"},
    {"content": "the SDK's key order", "role": "user"},
    {"type": None, "role": "user", "content": "an explicit null type"},
    {"type": "message", "role": "user", "content": "an id", "id": "msg_1"},
    {"role": "assistant", "type": "message", "content": "keys out of order"},
    {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "parts", "annotations": []}],
    },
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "t"}]},
    {"type": "message", "role": "assistant", "content": []},
    {"type": "message", "role": "user", "content": [{"type": "text", "text": "a Chat part"}]},
    {"arguments": "{}", "call_id": "c3", "name": "ls", "type": "function_call", "id": "fc_3"},
    {"type": "function_call", "call_id": "c4", "name": "ls", "arguments": "{}", "status": "x"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E"},
    {"type": "function_call", "call_id": "c5", "name": "ls", "arguments": "{}"},
    {"call_id": "c3", "output": "the SDK's order", "type": "function_call_output"},
    {"type": "function_call_output", "call_id": "c4", "output": [{"type": "text", "text": "t"}]},
    {"type": "function_call_output", "call_id": "c5", "output": "x"},
    {"type": "item_reference", "id": "ref_1"},
]
"""Items the plain conversion would change: each keeps entries saying how to give it back."""


def _records(path: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT record FROM ctxkeep_messages ORDER BY seq").fetchall()
    return [json.loads(r[0]) for r in rows]


def test_a_stored_record_of_each_plain_item_carries_no_conversion_metadata(
    tmp_path: Path,
) -> None:
    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/a.db", config=UNBOUNDED)
    asyncio.run(session.add_items(PLAIN))
    records = _records(tmp_path / "a.db")
    assert len(records) == 8  # the two calls are one message
    assert all(RESPONSES_KEY not in json.dumps(r) for r in records)
    assert [m.metadata for m in session.memory.get_messages("s")] == [{}] * 8
    assert asyncio.run(session.get_items()) == PLAIN
    fresh = CtxkeepSession("s", f"sqlite:///{tmp_path}/a.db", config=UNBOUNDED)
    assert json.dumps(asyncio.run(fresh.get_items())) == json.dumps(PLAIN)
    session.close()
    fresh.close()


def test_plain_items_become_messages_without_metadata() -> None:
    for convert in (from_responses, owned_from_responses):
        msgs = convert(PLAIN)
        assert [m.metadata for m in msgs] == [{}] * 8
        assert msgs[4].tool_calls == (
            ToolCall("c1", "read", '{"p": "a.txt"}'),
            ToolCall("c2", "ls", "{}"),
        )
        assert json.dumps(to_responses(msgs)) == json.dumps(PLAIN)


def test_every_unusual_item_keeps_entries_and_comes_back_exactly(tmp_path: Path) -> None:
    msgs = from_responses(UNUSUAL)
    assert all(RESPONSES_KEY in m.metadata for m in msgs)
    assert json.dumps(to_responses(msgs)) == json.dumps(UNUSUAL)
    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/a.db", config=UNBOUNDED)
    asyncio.run(session.add_items(UNUSUAL))
    fresh = CtxkeepSession("s", f"sqlite:///{tmp_path}/a.db", config=UNBOUNDED)
    assert json.dumps(asyncio.run(fresh.get_items())) == json.dumps(UNUSUAL)
    popped = [asyncio.run(fresh.pop_item()) for _ in UNUSUAL]
    assert json.dumps(popped[::-1]) == json.dumps(UNUSUAL)
    session.close()
    fresh.close()


def test_an_unusual_item_is_kept_in_its_key_order_with_0_for_what_the_message_holds() -> None:
    # The SDK's own shapes: an easy input message, a model's message and call, an output.
    items = [
        {"content": "hi", "role": "user"},
        {
            "id": "msg_1",
            "content": [{"annotations": [], "text": "ok", "type": "output_text"}],
            "role": "assistant",
            "status": "completed",
            "type": "message",
        },
        {
            "arguments": "{}",
            "call_id": "c1",
            "name": "ls",
            "type": "function_call",
            "id": "fc_1",
            "status": "completed",
        },
        {"call_id": "c1", "output": "a.txt", "type": "function_call_output"},
    ]
    msgs = owned_from_responses(items)
    assert [m.metadata[RESPONSES_KEY] for m in msgs] == [
        [{"s": {"content": 0, "role": 0}}],
        [{"s": {"id": "msg_1", "content": 0, "role": 0, "status": "completed", "type": "message"}}],
        [
            {
                "c": {
                    "arguments": 0,
                    "call_id": 0,
                    "name": 0,
                    "type": "function_call",
                    "id": "fc_1",
                    "status": "completed",
                }
            }
        ],
        [{"s": {"call_id": 0, "output": 0, "type": "function_call_output"}}],
    ]
    assert json.dumps(to_responses(msgs)) == json.dumps(items)


def test_a_plain_call_in_a_run_with_an_unusual_one_keeps_its_entry() -> None:
    # A run's entries map to its calls in order: one call with entries needs them all.
    run = [PLAIN[4], UNUSUAL[10]]
    [message] = from_responses(run)
    assert message.metadata[RESPONSES_KEY] == [
        {"c": {"type": "function_call", "call_id": 0, "name": 0, "arguments": 0}},
        {"c": {"type": "function_call", "call_id": 0, "name": 0, "arguments": 0, "status": "x"}},
    ]
    assert json.dumps(to_responses([message])) == json.dumps(run)


@pytest.mark.parametrize("entry", [{"s": "junk"}, {"c": ["junk"]}, {"s": None}])
def test_a_malformed_compact_entry_raises_naming_the_message(entry: dict[str, Any]) -> None:
    [message] = from_responses([UNUSUAL[9]])
    bad = message.replace(metadata={RESPONSES_KEY: [entry]})
    with pytest.raises(InvalidMessageError, match="malformed") as info:
        to_responses([Message("user", "ok"), bad])
    assert info.value.index == 1


_PARTS = st.sampled_from(
    [
        {"type": "input_text", "text": "t"},
        {"type": "output_text", "text": "t", "annotations": []},
        {"type": "text", "text": "t"},
        {"type": "refusal", "refusal": "no"},
        {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "file", "file": {"file_id": "f1"}},
        {"type": "input_file", "file_id": "f1"},
        {"type": "thinking", "thinking": "hm", "signature": "s"},
    ]
)
_CONTENT = st.one_of(st.text(max_size=5), st.lists(_PARTS, max_size=3))


@st.composite
def _near_plain(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A message or a call and its output, with plain keys, some left out or added, in any
    order, and any content parts."""
    if draw(st.booleans()):
        role = draw(st.sampled_from(["user", "system", "developer", "assistant"]))
        fields = {"type": "message", "role": role, "content": draw(_CONTENT)}
        if fields["content"] == [] and role == "assistant":
            fields["content"] = ""
        items = [fields]
    else:
        call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
        output = draw(st.one_of(st.text(max_size=5), st.lists(_PARTS, min_size=1, max_size=3)))
        items = [call, {"type": "function_call_output", "call_id": "c", "output": output}]
    out = []
    for item in items:
        if draw(st.booleans()):
            item = {**item, "id": "x"}
        if draw(st.booleans()) and item["type"] == "message":
            del item["type"]
        if draw(st.booleans()):
            item = {k: item[k] for k in draw(st.permutations(list(item)))}
        out.append(item)
    return out


@given(_near_plain())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_items_near_the_plain_shapes_come_back_exactly(items: list[dict[str, Any]]) -> None:
    try:
        from_responses(items)
    except InvalidMessageError:  # (thinking parts outside an assistant message)
        assume(False)
    for msgs in (from_responses(items), owned_from_responses(items)):
        assert json.dumps(to_responses(msgs)) == json.dumps(items)
        # Stored and read back: the metadata as a record keeps it.
        again = [record_to_message(json.loads(dumps_record(m))) for m in msgs]
        assert json.dumps(to_responses(again)) == json.dumps(items)


# -- records written before entries were compact ---------------------------------------------

_SELF = '{"self":{"order":["type","role","content"],"fields":{"type":"message"}}}'
_CALL = '{"call":{"order":["type","call_id","name","arguments"],"fields":{"type":"function_call"}}}'
_OUT = '{"self":{"order":["type","call_id","output"],"fields":{"type":"function_call_output"}}}'
WRITTEN_BEFORE = {
    "plain": json.loads(
        f"[[{_SELF}],[{_SELF}],[{_SELF}],[{_SELF}],[{_CALL},{_CALL}],[{_OUT}],[{_OUT}],[{_SELF}]]"
    ),
    "unusual": json.loads(
        "["
        '[{"self":{"order":["role","content"],"fields":{}}}],'
        '[{"self":{"order":["content","role"],"fields":{}}}],'
        '[{"self":{"order":["type","role","content"],"fields":{"type":null}}}],'
        '[{"self":{"order":["type","role","content","id"],"fields":{"type":"message","id":"msg_1"}}}],'
        '[{"self":{"order":["role","type","content"],"fields":{"type":"message"}}}],'
        '[{"self":{"order":["id","type","role","status","content"],'
        '"fields":{"id":"msg_2","type":"message","status":"completed"}}}],'
        f"[{_SELF}],[{_SELF}],[{_SELF}],"
        '[{"call":{"order":["arguments","call_id","name","type","id"],'
        '"fields":{"type":"function_call","id":"fc_3"}}},'
        '{"call":{"order":["type","call_id","name","arguments","status"],'
        '"fields":{"type":"function_call","status":"x"}}},'
        '{"item":{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"E"}},'
        f"{_CALL}],"
        '[{"self":{"order":["call_id","output","type"],"fields":{"type":"function_call_output"}}}],'
        f"[{_OUT}],"
        f'[{_OUT},{{"item":{{"type":"item_reference","id":"ref_1"}}}}]'
        "]"
    ),
}
"""The metadata of PLAIN's and UNUSUAL's messages as ctxkeep wrote it before (main at
969d2bf, printed by its ``from_responses``)."""


def _written_before(items: list[dict[str, Any]], name: str) -> list[Message]:
    return [
        m.replace(metadata={RESPONSES_KEY: entries})
        for m, entries in zip(from_responses(items), WRITTEN_BEFORE[name], strict=True)
    ]


@pytest.mark.parametrize(("items", "name"), [(PLAIN, "plain"), (UNUSUAL, "unusual")])
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_records_written_before_read_back_the_same(
    items: list[dict[str, Any]], name: str, store: str, tmp_path: Path
) -> None:
    old = _written_before(items, name)
    assert json.dumps(to_responses(old)) == json.dumps(items)
    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path}/old.db"
    session = CtxkeepSession("s", url, config=UNBOUNDED)
    session.memory.create_session("agents-sdk", session_id="s")
    session.memory.add_messages("s", old)
    if store == "sqlite":
        assert all(RESPONSES_KEY in r["metadata"] for r in _records(tmp_path / "old.db"))
    assert json.dumps(asyncio.run(session.get_items())) == json.dumps(items)
    assert json.dumps(asyncio.run(session.get_items(limit=3))) == json.dumps(items[-3:])
    assert asyncio.run(session.pop_item()) == items[-1]
    left = to_responses(session.memory.get_messages("s"))
    assert json.dumps(left) == json.dumps(items[:-1])
    # A batch added after them joins the newest message where it continues it.
    asyncio.run(session.add_items([items[-1]]))
    assert json.dumps(asyncio.run(session.get_items())) == json.dumps(items)
    session.close()

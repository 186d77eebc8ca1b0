"""CtxkeepSession's own conversion of the items it stores (``owned_from_responses``): the same
messages and errors as ``from_responses``, each message made and checked once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import ctxkeep.messages as messages_module
from ctxkeep import MemoryConfig
from ctxkeep.errors import InvalidMessageError
from ctxkeep.integrations._items import owned_from_responses
from ctxkeep.integrations.openai_agents import CtxkeepSession
from ctxkeep.responses import from_responses, to_responses
from test_responses import EXAMPLES, _long_history, histories


def _same(items: list[Any]) -> None:
    want, got = from_responses(items), owned_from_responses(items)
    assert got == want
    assert json.dumps(to_responses(got)) == json.dumps(to_responses(want))


def test_every_item_type_gives_the_messages_from_responses_gives() -> None:
    _same(list(EXAMPLES.values()))
    for item in EXAMPLES.values():
        _same([item])
    _same(_long_history(3))
    _same([{"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "E"}])
    _same([])


@given(histories())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_histories_give_the_same_messages(items: list[dict[str, Any]]) -> None:
    _same(items)


def test_the_messages_share_nothing_with_the_items() -> None:
    items = [dict(EXAMPLES["reasoning"]), dict(EXAMPLES["message (typed, parts)"])]
    before = json.dumps(items)
    msgs = owned_from_responses(items)
    items[0]["summary"].append({"type": "summary_text", "text": "changed"})
    items[1]["content"][0]["text"] = "changed"
    assert json.dumps(to_responses(msgs)) == before


@pytest.mark.parametrize(
    "items",
    [
        [{"role": "user", "content": "ok"}, "junk"],
        [{"content": "no role or type"}],
        [{"role": "tool", "content": "x"}],
        [{"type": "message", "role": "user"}],
        [{"role": "user", "content": {"not": "parts"}}],
        [{"type": "function_call", "name": "f", "arguments": "{}"}],
        [{"type": "function_call_output", "call_id": "", "output": "x"}],
        [{"type": "function_call_output", "call_id": "c", "output": [1]}],
        "hello",
    ],
)
def test_malformed_items_raise_the_same_error(items: Any) -> None:
    with pytest.raises(InvalidMessageError) as want:
        from_responses(items)
    with pytest.raises(InvalidMessageError) as got:
        owned_from_responses(items)
    assert (str(got.value), got.value.index) == (str(want.value), want.value.index)


def test_add_items_checks_each_message_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # from_responses checked (and deep-copied) every message twice: once made, once more
    # for its metadata. A session stores what it converted: once is enough.
    session = CtxkeepSession(
        "s",
        f"sqlite:///{tmp_path}/ck.db",
        config=MemoryConfig(max_history=None, session_ttl=None, max_sessions=None),
    )
    items = _long_history(2)
    asyncio.run(session.add_items(items[:1]))  # the session exists
    n_messages = len(from_responses(items[1:]))
    # (a run of calls holds its place by one placeholder made at import, not one made and
    # checked per run)
    calls: list[int] = []
    real = messages_module._normalise

    def counted(state: dict[str, Any], *, owned: bool) -> None:
        calls.append(1)
        real(state, owned=owned)

    monkeypatch.setattr(messages_module, "_normalise", counted)
    asyncio.run(session.add_items(items[1:]))
    monkeypatch.undo()
    assert len(calls) == n_messages  # from_responses: 2 x n_messages
    assert asyncio.run(session.get_items()) == items
    session.close()


def test_a_run_continued_in_another_add_keeps_the_items_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A call added while another of its run waits joins the newest message (a replace);
    # the items held follow that write, so the next read decodes nothing again (it read
    # the whole session again: the replace changed the session's revision).
    import ctxkeep.integrations._items as items_module

    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/ck.db")
    history = [{"role": "user", "content": f"question {i}"} for i in range(50)]
    asyncio.run(session.add_items(history))
    assert asyncio.run(session.get_items()) == history  # held
    calls = [
        {"type": "function_call", "call_id": f"c{k}", "name": "read", "arguments": "{}"}
        for k in range(2)
    ]
    asyncio.run(session.add_items(calls[:1]))
    decoded: list[int] = []
    real = items_module.record_to_message

    def counted(*args: Any, **kwargs: Any) -> Any:
        decoded.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(items_module, "record_to_message", counted)
    asyncio.run(session.add_items(calls[1:]))  # joins the first call's message
    assert asyncio.run(session.get_items()) == history + calls
    assert decoded == []
    monkeypatch.undo()
    # Popped back one by one, through the same held items.
    assert asyncio.run(session.pop_item()) == calls[1]
    assert asyncio.run(session.pop_item()) == calls[0]
    assert asyncio.run(session.get_items()) == history
    session.close()


def _unconverted(session: CtxkeepSession, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the messages ``session``'s items convert back to items from here on."""
    converted: list[int] = []
    real = session._items.convert

    def counted(message: Any) -> Any:
        converted.append(1)
        return real(message)

    monkeypatch.setattr(session._items, "convert", counted)
    return converted


def test_pops_after_adds_give_back_the_items_without_converting_them_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Runner writes and pops without reading: the items the newest message was made of
    # are kept with it (copies), so a pop gives back the newest item, and the next pop the
    # one before (a message of several items: a reasoning item carried, a run of calls),
    # converting no message back; the session then reads as the items left.
    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/ck.db")
    first = [{"role": "user", "content": "question"}]
    batch = [
        dict(EXAMPLES["reasoning"]),
        *(
            {"type": "function_call", "call_id": f"c{k}", "name": "read", "arguments": "{}"}
            for k in range(2)
        ),
    ]
    asyncio.run(session.add_items(first))
    asyncio.run(session.add_items(batch))
    converted = _unconverted(session, monkeypatch)
    assert asyncio.run(session.pop_item()) == batch[2]
    assert asyncio.run(session.pop_item()) == batch[1]
    assert asyncio.run(session.pop_item()) == batch[0]
    assert converted == []
    assert asyncio.run(session.pop_item()) == first[0]
    assert asyncio.run(session.get_items()) == []
    session.close()


def test_a_popped_item_shares_nothing_with_the_items_added(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The items kept with the newest message are copies: the caller changing what it added
    # changes neither what a pop gives back nor the history; changing what a pop gave back
    # changes neither the next pop's item nor what was added.
    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/ck.db")
    items = [dict(EXAMPLES["reasoning"]), dict(EXAMPLES["message (typed, parts)"])]
    before = json.loads(json.dumps(items))
    asyncio.run(session.add_items(items))
    converted = _unconverted(session, monkeypatch)
    items[0]["summary"].append({"type": "summary_text", "text": "changed"})
    items[1]["content"][0]["text"] = "changed"
    popped = asyncio.run(session.pop_item())
    assert popped == before[1]
    popped["content"][0]["text"] = "changed again"
    assert asyncio.run(session.pop_item()) == before[0]
    assert converted == []
    assert items[1]["content"][0]["text"] == "changed"
    asyncio.run(session.add_items(before))
    assert asyncio.run(session.get_items()) == before
    session.close()


def test_a_pop_after_a_batch_joined_to_the_newest_message_gives_back_the_items(
    tmp_path: Path,
) -> None:
    # A call added while another of its run waits joins the newest message: the items kept
    # follow the join, and the pops give back the batch's items, not the caller's objects.
    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/ck.db")
    calls = [
        {"type": "function_call", "call_id": f"c{k}", "name": "read", "arguments": "{}"}
        for k in range(2)
    ]
    asyncio.run(session.add_items(calls[:1]))
    added = [dict(calls[1])]
    asyncio.run(session.add_items(added))
    popped = asyncio.run(session.pop_item())
    assert popped == calls[1] and popped is not added[0]
    assert asyncio.run(session.pop_item()) == calls[0]
    assert asyncio.run(session.get_items()) == []
    session.close()

"""``Row.item`` builds LangGraph's ``Item`` and ``SearchItem`` without their constructors
(setting the slots ``ITEM_SLOTS`` names): these tests hold that list to LangGraph's classes,
so an upgrade that adds a slot or changes what the constructors store fails here, not in a
user's code reading an unset attribute.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")
from langgraph.store.base import Item, SearchItem

from ctxkeep.integrations.langgraph._store_items import ITEM_SLOTS, Row, _stamp, search_items


def _slots(cls: type) -> set[str]:
    return {s for c in cls.__mro__ for s in getattr(c, "__slots__", ())}


@pytest.mark.parametrize("cls", [Item, SearchItem])
def test_item_slots_are_every_slot_of_langgraphs_class(cls: type[Item]) -> None:
    assert set(ITEM_SLOTS[cls]) == _slots(cls)
    assert "__dict__" not in _slots(cls)  # no attribute beyond the slots to set


ROW = Row("bench.u1", "k1", '{"text": "window seat", "n": [1, 2]}', 1.7e9, 1.7e9 + 5)


def _fields(item: Item) -> dict[str, object]:
    return {s: getattr(item, s) for s in _slots(type(item))}


def test_a_row_item_equals_the_constructors() -> None:
    built = ROW.item()
    made = Item(
        value={"text": "window seat", "n": [1, 2]},
        key="k1",
        namespace=("bench", "u1"),
        created_at=_stamp(1.7e9),
        updated_at=_stamp(1.7e9 + 5),
    )
    assert type(built) is Item
    assert _fields(built) == _fields(made)
    assert built == made


def test_a_row_search_item_equals_the_constructors() -> None:
    built = ROW.item(0.25, search=True)
    made = SearchItem(
        ("bench", "u1"),
        "k1",
        {"text": "window seat", "n": [1, 2]},
        _stamp(1.7e9),
        _stamp(1.7e9 + 5),
        0.25,
    )
    assert type(built) is SearchItem
    assert _fields(built) == _fields(made)
    assert built.dict() == made.dict()


def test_each_item_holds_a_value_of_its_own() -> None:
    a, b = ROW.item(), ROW.item(0.5, search=True)
    a.value["n"].append(3)
    assert b.value == {"text": "window seat", "n": [1, 2]}
    assert ROW.item().value == {"text": "window seat", "n": [1, 2]}


def test_search_items_equal_each_rows_item_each_value_its_own() -> None:
    other = ROW._replace(namespace="bench.u2", key="k2", updated_at=1.7e9 + 9)
    found = [(ROW, 0.5), (other, None), (ROW, None)]
    built = search_items(found)
    assert [type(i) for i in built] == [SearchItem] * 3
    assert [_fields(i) for i in built] == [_fields(r.item(s, search=True)) for r, s in found]
    built[0].value["n"].append(3)
    assert built[2].value == {"text": "window seat", "n": [1, 2]}


def test_the_datetimes_kept_are_each_times_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime

    from ctxkeep.integrations.langgraph import _store_items

    monkeypatch.setattr(_store_items, "STAMPS", 3)
    monkeypatch.setattr(_store_items, "_STAMPS", {})
    for i in range(10):
        at = 1.7e9 + i + 0.25
        assert _stamp(at) == datetime.fromtimestamp(at, UTC) and _stamp(at) is _stamp(at)
        assert 1 <= len(_store_items._STAMPS) <= 3
    rows = [ROW._replace(created_at=1.7e9 + i, updated_at=1.7e9 + i + 0.5) for i in range(10)]
    built = search_items([(row, None) for row in rows])
    assert [(i.created_at, i.updated_at) for i in built] == [
        (datetime.fromtimestamp(r.created_at, UTC), datetime.fromtimestamp(r.updated_at, UTC))
        for r in rows
    ]

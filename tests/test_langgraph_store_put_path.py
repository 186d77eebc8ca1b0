"""The short path of ``CtxkeepStore.put`` on ``memory://`` with ``index=False``: a new item into
a namespace the store has checked is its row appended, with the checks of the full path, its
copy of the value, and the order searches read; counted in Python frames, not timed.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from typing import Any

import pytest

pytest.importorskip("langgraph")
from langgraph.store.base import InvalidNamespaceError
from langgraph.store.memory import InMemoryStore

from _frames import frames
from ctxkeep.errors import ConfigError, InvalidTypeError
from ctxkeep.integrations.langgraph import CtxkeepStore


def test_a_put_of_a_new_item_runs_three_python_functions() -> None:
    with CtxkeepStore("memory://", index=False) as store:
        store.put(("u", "facts"), "k0", {"text": "first"})  # the namespace checked once
        value = {"text": "user 1 likes tea", "kind": "task", "n": 1}
        # put, the JSON text of the value, the row appended (before: put, _check_put, _put,
        # _value_text, _plain_text, write, _append, _bound: eight)
        ran = frames(functools.partial(store.put, ("u", "facts"), "k1", value))
        assert ran == ["put", "_plain_text", "append"]
        assert store.get(("u", "facts"), "k1").value == value  # type: ignore[union-attr]


def test_the_stored_value_is_a_copy_of_the_callers() -> None:
    with CtxkeepStore("memory://", index=False) as store:
        store.put(("u",), "a", {"x": 1})
        value: dict[str, Any] = {"x": [1, 2], "y": {"z": "w"}}
        store.put(("u",), "b", value)
        value["x"].append(3)
        value["y"]["z"] = "changed"
        value["new"] = True
        got = store.get(("u",), "b")
        assert got is not None and got.value == {"x": [1, 2], "y": {"z": "w"}}
        got.value["x"].append(9)
        assert store.get(("u",), "b").value == {"x": [1, 2], "y": {"z": "w"}}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"x": math.nan}, ConfigError),
        ({"x": [1, math.inf]}, ConfigError),
        ({"x": {1, 2}}, InvalidTypeError),
        ({1: "x"}, InvalidTypeError),
        ({"x": 2**70}, ConfigError),
        ({"x": "\ud800"}, ConfigError),
        (["not", "a", "mapping"], InvalidTypeError),
    ],
)
def test_a_known_namespace_does_not_let_a_bad_value_in(value: Any, error: type) -> None:
    with CtxkeepStore("memory://", index=False) as store:
        store.put(("u",), "a", {"x": 1})
        with pytest.raises(error):
            store.put(("u",), "b", value)
        assert store.get(("u",), "b") is None
        assert [i.key for i in store.search(("u",))] == ["a"]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.put(("u",), "b", {}, index="text"), InvalidTypeError),
        (lambda s: s.put(("u",), "b", {}, index=["text", 1]), InvalidTypeError),
        (lambda s: s.put(("u",), "b", {}, ttl=-1), ConfigError),
        (lambda s: s.put(("u",), "\ud800", {}), ConfigError),
        (lambda s: s.put(("u", ["x"]), "b", {}), InvalidNamespaceError),
        (lambda s: s.put(("u.v",), "b", {}), InvalidNamespaceError),
    ],
)
def test_a_known_namespace_does_not_let_a_bad_put_in(call: Any, error: type) -> None:
    with CtxkeepStore("memory://", index=False) as store:
        store.put(("u",), "a", {"x": 1})
        with pytest.raises(error):
            call(store)
        assert [i.key for i in store.search(("u",))] == ["a"]


def test_what_the_full_path_takes_is_taken_alike() -> None:
    """Values and keys the short path leaves to the full one are stored as the full one
    stores them, beside ``InMemoryStore``.
    """
    peer = InMemoryStore()
    with CtxkeepStore("memory://", index=False) as store:
        for side in (store, peer):
            side.put(("u",), "a", {"x": 1})
            side.put(("u",), "b", OrderedDict(y=2))  # not a dict: the checked path
            side.put(("u",), "c", {"t": (1, 2)})  # a tuple: a list, as JSON keeps it
            side.put(("u",), "ключ", {"x": 3})  # a key beyond ASCII
            side.put(("u",), 7, {"x": 4})  # type: ignore[arg-type]  # str(key), as BaseStore
            side.put(("u",), "d", {"x": 5}, index=["x"])  # ignored without an index
            side.put(("u",), "a", {"x": 6})  # over a stored item
        ours = {i.key: i.value for i in store.search(("u",), limit=20)}
        theirs = {i.key: i.value for i in peer.search(("u",), limit=20)}
        assert ours == {**theirs, "c": {"t": [1, 2]}}
        assert theirs["c"] == {"t": (1, 2)}  # InMemoryStore keeps the caller's tuple


def test_puts_after_the_newest_items_were_deleted_are_found_in_order() -> None:
    """A put newer than every row sets its namespace's bounds (the time after which no row
    under it was updated); a bound left above it by deleted rows is lowered to it, and the
    search of every prefix still finds every row, newest first.
    """
    now = [1000.0]
    with CtxkeepStore("memory://", index=False, clock=lambda: now[0]) as store:
        for i in range(40):
            now[0] += 1
            store.put(("a", "x"), f"k{i}", {"i": i})
        for i in range(20, 40):  # the newest twenty deleted: their runs emptied, compacted
            store.delete(("a", "x"), f"k{i}")
        now[0] = 1025.5  # older than the deleted rows, newer than every stored one
        store.put(("a", "x"), "new", {"i": 99})
        store.put(("a", "y"), "other", {"i": 100})  # the same time: by namespace, then key
        now[0] = 1010.5  # the clock moved back: the full path puts it in its place
        store.put(("a", "x"), "back", {"i": 98})
        expect = ["new"] + [f"k{i}" for i in range(19, 9, -1)] + ["back"]
        expect += [f"k{i}" for i in range(9, -1, -1)]
        assert [i.key for i in store.search(("a", "x"), limit=100)] == expect
        assert [i.key for i in store.search(("a",), limit=3)] == ["new", "other", "k19"]
        assert [i.key for i in store.search(("a", "y"))] == ["other"]

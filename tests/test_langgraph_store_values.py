"""A store value's JSON text: the one-call path (``_plain_text``) takes exactly what the
checked path (``_json_value``) takes as it is, writes the same text, and leaves every refusal
to the checked path, with its typed error.
"""

from __future__ import annotations

import datetime
import enum
import math
from collections import OrderedDict
from typing import Any

import pytest

pytest.importorskip("langgraph")
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkeep.errors import ConfigError, InvalidTypeError
from ctxkeep.integrations.langgraph import _store_filters
from ctxkeep.integrations.langgraph._store_filters import _json_value, _plain_text, _value_text
from ctxkeep.sessions.records import dumps

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def _checked(value: Any) -> str:
    return dumps(_json_value("value", value))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), JSON, max_size=5))
def test_plain_values_give_the_checked_paths_text(value: dict[str, Any]) -> None:
    fast = _plain_text(value)
    assert fast is None or fast == _checked(value)
    assert _value_text(value) == _checked(value)
    assert fast is not None  # plain data takes the one call, nulls and all


class Colour(enum.IntEnum):
    RED = 1


def _nested(depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"x": math.nan}, ConfigError),
        ({"x": [1, math.inf]}, ConfigError),
        ({"x": None, "y": {"z": [None, -math.inf]}}, ConfigError),
        ({"x": datetime.datetime(2026, 1, 1)}, InvalidTypeError),
        ({"x": {1: "a"}}, InvalidTypeError),
        ({"x": {"y", "z"}}, InvalidTypeError),
        ({"x": "\ud800"}, ConfigError),
        ({"x": 2**70}, ConfigError),
        (_nested(202), ConfigError),
    ],
)
def test_what_the_checked_path_refuses_is_refused_alike(value: Any, error: type) -> None:
    assert _plain_text(value) is None
    with pytest.raises(error):
        _value_text(value)


@pytest.mark.parametrize(
    "value",
    [
        {"x": (1, 2)},
        {"x": Colour.RED},
        OrderedDict(x=1),
        {"x": None},
        _nested(150),
        {"x": [[1]] * 300},
    ],
)
def test_what_the_checked_path_converts_is_stored_alike(value: Any) -> None:
    assert _value_text(value) == _checked(value)


def test_without_orjson_the_checked_path_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_store_filters, "_orjson", None)
    assert _plain_text({"x": 1}) is None
    assert _value_text({"x": (1,)}) == '{"x":[1]}'

r"""The one rule for the fabric's JSON data (message payloads, task states), free of I/O.

A value the fabric accepts must come back out of every place that holds it: the in-process
bus, a Redis stream entry or task-state hash, and the service's JSON responses. Python's
``json`` module is laxer than those: it writes a lone surrogate (``"\ud800"``) as an escape
and reads it back, and it nests as deep as the interpreter's recursion limit, while the
service's response serializer (pydantic-core) fails on both: a lone surrogate is no UTF-8, and
it stops at 254 nested levels. A payload accepted under ``json``'s rule was stored and then
answered 500 on every receive, blocking its recipient's inbox for good (issue 25).

So every entry point checks :func:`json_copy` (or :func:`json_text`) before anything is
stored, on every backend: strings (and keys) are valid Unicode, numbers are finite, mappings
have string keys, and nesting stays within :data:`MAX_DEPTH` levels, well below any of the
serializers' limits (including the wrapper levels a response adds around the value).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ctxkeep.errors import CtxkeepError, InvalidTypeError

MAX_DEPTH = 200
"""How many levels of lists and mappings a value may nest (``[[1]]`` is two); pydantic-core
serializes at most 254 and orjson 254, so 200 leaves room for what a response wraps around it."""


def _where(name: str, path: list[str | int]) -> str:
    return name + "".join(f"[{p!r}]" for p in path)


def _check(name: str, value: Any, path: list[str | int], error: type[CtxkeepError]) -> None:
    """Raise ``error`` for the first part of ``value`` no store or response can hold."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise error(f"{_where(name, path)} is not valid Unicode (a lone surrogate?)") from None
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise error(f"{_where(name, path)} is {value}, which JSON cannot hold")
    elif value is None or isinstance(value, int):  # bool is an int
        return
    elif len(path) >= MAX_DEPTH and isinstance(value, list | tuple | dict):
        raise error(
            f"{_where(name, path[:3])}... is nested deeper than {MAX_DEPTH} levels; flatten it"
        )
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            path.append(i)
            _check(name, item, path, error)
            path.pop()
    elif isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise error(f"{_where(name, path)} has a key {key!r} that is not a string")
            _check(name, key, path, error)
            path.append(key)
            _check(name, item, path, error)
            path.pop()
    else:
        raise error(f"{_where(name, path)} is a {type(value).__name__}, not JSON data")


def check_json(name: str, value: Any, *, error: type[CtxkeepError] = InvalidTypeError) -> None:
    """Raise ``error`` if ``value`` is not JSON data the fabric can store and deliver (the
    rule of :func:`json_text`; for a value read back, which needs no copy).
    """
    _check(name, value, [], error)


def json_text(name: str, value: Any, *, error: type[CtxkeepError] = InvalidTypeError) -> str:
    """The JSON text of ``value`` if every store and response of the fabric can hold it.

    Args:
        name: what ``value`` is, for the error message (``"payload"``, ``"changes"``).
        value: JSON data: dicts with string keys, lists (tuples become lists), strings,
            finite numbers, booleans, None.
        error: the typed error to raise (the bus raises ``InvalidMessageError``).

    Raises:
        error: a lone surrogate, a NaN or infinity, a non-string key, an object JSON has no
            form for, or nesting deeper than :data:`MAX_DEPTH` (the message names where).

    """
    check_json(name, value, error=error)
    return json.dumps(value, allow_nan=False)


def json_copy(name: str, value: Any, *, error: type[CtxkeepError] = InvalidTypeError) -> Any:
    """A copy of ``value`` (through :func:`json_text`), sharing nothing with the caller."""
    return json.loads(json_text(name, value, error=error))

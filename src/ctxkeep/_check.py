"""Argument checks for public entry points, so that malformed input raises a typed error
(:class:`~ctxkeep.errors.InvalidTypeError` for a wrong type, which is also a ``TypeError``;
:class:`~ctxkeep.errors.ConfigError` for a bad value, also a ``ValueError``) that names the
parameter, never a bare builtin error from deep inside.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from typing import Any

from ctxkeep.errors import ConfigError, InvalidSettingError, InvalidTypeError


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def text(name: str, value: Any, *, empty: bool = False) -> str:
    """``value`` if it is a string (non-empty unless ``empty``) that is valid Unicode."""
    if not isinstance(value, str):
        raise InvalidTypeError(f"{name} must be a string, got {type(value).__name__}")
    if not empty and not value:
        raise ConfigError(f"{name} must not be empty")
    if value.isascii():  # a flag of the string: no copy (every key of a store's batch)
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{name} is not valid Unicode (a lone surrogate?)") from None
    return value


def optional_text(name: str, value: Any, *, empty: bool = False) -> str | None:
    """``None`` or :func:`text`."""
    return None if value is None else text(name, value, empty=empty)


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
"""The range of every integer argument: a signed 64-bit integer is what SQLite and
PostgreSQL store (``INTEGER``, ``bigint``), so a larger offset, limit or sequence number
would fail in the driver (an ``OverflowError``, "bigint out of range") instead of here."""


def integer(name: str, value: Any, *, minimum: int | None = None, fits_64_bits: bool = True) -> int:
    """``value`` if it is an int (not a bool) of at least ``minimum`` and, unless the caller
    clamps it before any store sees it (``fits_64_bits=False``: a huge limit means all), within
    :data:`INT64_MIN` .. :data:`INT64_MAX`.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    if fits_64_bits and not INT64_MIN <= value <= INT64_MAX:
        raise ConfigError(f"{name} must fit in 64 bits (at most {INT64_MAX}), got {_show(value)}")
    return value


def optional_integer(name: str, value: Any, *, minimum: int | None = None) -> int | None:
    """``None`` or :func:`integer` (within 64 bits)."""
    return None if value is None else integer(name, value, minimum=minimum)


def flag(name: str, value: Any) -> bool:
    """``value`` if it is True or False (not 0 or 1, not a string); else an
    :class:`~ctxkeep.errors.InvalidSettingError`, wherever the setting is given.
    """
    if not isinstance(value, bool):
        raise InvalidSettingError(f"{name} must be True or False, got {_show(value)}")
    return value


def optional_flag(name: str, value: Any) -> bool | None:
    """``None`` (the default, whatever it is where it is used) or :func:`flag`."""
    if value is not None and not isinstance(value, bool):
        raise InvalidSettingError(f"{name} must be True, False or None, got {_show(value)}")
    return value


def number(name: str, value: Any, *, positive: bool = False) -> float:
    """``value`` as a float if it is a finite real number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value}")
    return float(value)


def mapping(name: str, value: Any) -> dict[str, Any]:
    """A shallow dict copy of ``value`` if it is a mapping with string keys (``None``: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"{name} must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise InvalidTypeError(f"{name} keys must be strings, got {_show(key)}")
    return dict(value)


def iterable(name: str, value: Any) -> list[Any]:
    """``value`` as a list if it is an iterable that is not a string, bytes or mapping."""
    if type(value) is list:  # the common case, without the ABC checks (about 1 us each)
        return list(value)
    if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Iterable):
        raise InvalidTypeError(f"{name} must be a list or other iterable, got {_show(value)}")
    return list(value)


def has_method(name: str, value: Any, method: str, kind: str) -> Any:
    """``value`` if it has a callable ``method`` (duck typing with a typed error)."""
    if not callable(getattr(value, method, None)):
        raise InvalidTypeError(f"{name} must be a {kind} (with .{method}()), got {_show(value)}")
    return value


def instance(name: str, value: Any, types: type | tuple[type, ...], kind: str) -> Any:
    """``value`` if it is an instance of ``types`` (``kind`` says what, for the message)."""
    if not isinstance(value, types):
        raise InvalidTypeError(f"{name} must be {kind}, got {_show(value)}")
    return value


def deep_copy(name: str, value: Any) -> Any:
    """A deep copy of ``value``, refused with a typed error if it cannot be copied (a lock, a
    socket, a structure nested too deep), so what is stored never shares state with the caller.
    """
    try:
        return copy.deepcopy(value)
    except (TypeError, copy.Error, RecursionError) as exc:
        raise InvalidTypeError(f"{name} cannot be copied ({exc}); pass plain data") from None


MAX_ID_LENGTH = 256
"""The longest id (of a session, agent, task, checkpoint or message) a store takes, in
characters: PostgreSQL indexes an entry of at most 2,704 bytes (a 20,000-letter id was a
storage failure there), and one rule holds on every backend and over HTTP."""


def identifier(name: str, value: Any, *, empty: bool = False, max_length: int | None = None) -> str:
    """``value`` if it is a :func:`text` without NUL: an id, a filter value, or any text a
    store keeps in a column of its own (an episode's goal). PostgreSQL's text cannot hold NUL
    (the driver fails, which reads as a storage outage: 503) while SQLite and Redis store it;
    one rule for every backend, checked before any I/O: NUL is refused everywhere. An id
    (``max_length``: :data:`MAX_ID_LENGTH`) is also bounded in length.
    """
    text(name, value, empty=empty)
    if "\x00" in value:
        raise ConfigError(f"{name} must not contain NUL (\\x00): {_show(value)}")
    if max_length is not None and len(value) > max_length:
        raise ConfigError(
            f"{name} must be at most {max_length} characters, got {len(value)}: {_show(value)}"
        )
    return str(value)


def ident(name: str, value: Any) -> str:
    """An id: an :func:`identifier` of at most :data:`MAX_ID_LENGTH` characters."""
    return identifier(name, value, max_length=MAX_ID_LENGTH)


def optional_ident(name: str, value: Any) -> str | None:
    """``None`` or :func:`ident`."""
    return None if value is None else ident(name, value)


def optional_identifier(name: str, value: Any) -> str | None:
    """``None`` or :func:`identifier`."""
    return None if value is None else identifier(name, value)


def url(name: str, value: Any) -> str:
    """``value`` if it is a :func:`text` with no NUL or other control character (which no
    path, host or driver accepts: refused here, not as a driver's bare ``ValueError``).
    """
    text(name, value)
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ConfigError(f"{name} holds the control character {bad!r}: {_show(value)}")
    return str(value)

"""Checkpointable cognition: the minimal durable state of an agent, versioned.

:class:`CognitiveState` holds what an agent needs to resume: its context, last observation,
working memory, current decision, tool state, and checkpoint marker. It holds no hidden
chain-of-thought: only what the agent chose to record.

Encoding is faithful or refused: :func:`encode_cognitive_state` gives a JSON-ready dict in
which sets, tuples, bytes, datetimes, dates and decimals are tagged so that
:func:`decode_cognitive_state` rebuilds them exactly; anything else (an object, a dataclass,
a dict with non-string keys) raises :class:`~ctxkeep.errors.InvalidTypeError` (a
``TypeError``) naming the path, never silently stringified. Decoding is strict the same way:
a tagged value that the encoder could not have written (an unknown tag, a missing or extra
key, base64 that is not canonical, a malformed decimal or date) raises
:class:`~ctxkeep.errors.CorruptRecordError` (a ``ValueError``) naming the path, never
decodes into some other value.

Versions: a :class:`MigrationRegistry` holds ordered upgrade steps; position ``i`` upgrades a
dict of version ``i`` to ``i + 1``. Version 0 is the legacy, unversioned layout (``memory``
and ``tools`` instead of ``working_memory`` and ``tool_state``, no ``checkpoint``). A state
newer than the registry knows raises :class:`CognitiveStateSchemaVersionError`.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from ctxkeep.errors import (
    CognitiveStateSchemaVersionError,
    ConfigError,
    CorruptRecordError,
    InvalidTypeError,
    describe,
)

CURRENT_SCHEMA_VERSION = 1
_TAG = "__ctxkeep__"
FIELDS = ("context", "observation", "working_memory", "decision", "tool_state", "checkpoint")


@dataclass(kw_only=True)
class CognitiveState:
    """The durable state of an agent's cognition."""

    schema_version: int = CURRENT_SCHEMA_VERSION
    """The layout version of this state."""
    context: Any = None
    """What the agent is working on (goal, constraints, inputs)."""
    observation: Any = None
    """The latest observation from its environment or tools."""
    working_memory: Any = None
    """Facts and intermediate results the agent keeps between steps."""
    decision: Any = None
    """The agent's current decision or plan step."""
    tool_state: Any = None
    """State of the agent's tools (open handles, cursors, pending calls)."""
    checkpoint: Any = None
    """A marker of where this state was taken (step, session, time)."""

    def copy(self) -> CognitiveState:
        """A deep copy."""
        return copy.deepcopy(self)


# -- faithful JSON ------------------------------------------------------------------------


def _encode(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {_TAG: "float", "repr": repr(value)}
        return value
    if isinstance(value, list):
        return [_encode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [_encode(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, set | frozenset):
        items = sorted((_encode(v, f"{path}{{}}") for v in value), key=repr)
        return {_TAG: "frozenset" if isinstance(value, frozenset) else "set", "items": items}
    if isinstance(value, bytes):
        return {_TAG: "bytes", "b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, datetime):
        return {_TAG: "datetime", "iso": value.isoformat()}
    if isinstance(value, date):
        return {_TAG: "date", "iso": value.isoformat()}
    if isinstance(value, Decimal):
        return {_TAG: "decimal", "str": str(value)}
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidTypeError(
                    f"cannot encode {path}: key {k!r} is not a string; use string keys"
                )
            if k == _TAG:
                raise InvalidTypeError(f"cannot encode {path}: the key {_TAG!r} is reserved")
            out[k] = _encode(v, f"{path}.{k}")
        return out
    kind = "a dataclass" if dataclasses.is_dataclass(value) else f"a {type(value).__name__}"
    raise InvalidTypeError(
        f"cannot encode {path}: {kind} has no faithful JSON form; convert it to dicts, lists, "
        "strings, numbers, sets, tuples, bytes or datetimes first"
    )


_TAG_KEYS = {
    "tuple": "items",
    "set": "items",
    "frozenset": "items",
    "bytes": "b64",
    "datetime": "iso",
    "date": "iso",
    "decimal": "str",
    "float": "repr",
}
_NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _corrupt(path: str, what: str, value: Any) -> CorruptRecordError:
    return CorruptRecordError(f"corrupt encoded value at {path}: {what}, got {describe(value)}")


def _decode(value: Any, path: str = "value") -> Any:
    if isinstance(value, list):
        return [_decode(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if _TAG not in value:
            return {k: _decode(v, f"{path}.{k}") for k, v in value.items()}
        return _decode_tagged(value, path)
    return value


def _decode_tagged(value: dict[str, Any], path: str) -> Any:
    tag = value[_TAG]
    key = _TAG_KEYS.get(tag) if isinstance(tag, str) else None
    if key is None:
        raise _corrupt(path, f"unknown {_TAG} tag", tag)
    if set(value) != {_TAG, key}:
        raise _corrupt(path, f"a {tag!r} value has exactly the keys {_TAG!r} and {key!r}", value)
    data = value[key]
    if key == "items":
        if not isinstance(data, list):
            raise _corrupt(path, f"a {tag!r} value needs a list of items", data)
        items = [_decode(v, f"{path}[{i}]") for i, v in enumerate(data)]
        if tag == "tuple":
            return tuple(items)
        try:
            return set(items) if tag == "set" else frozenset(items)
        except TypeError:
            raise _corrupt(path, f"a {tag!r} value holds only hashable items", data) from None
    if not isinstance(data, str):
        raise _corrupt(path, f"a {tag!r} value needs a string {key!r}", data)
    try:
        if tag == "bytes":
            raw = base64.b64decode(data, validate=True)
            if base64.b64encode(raw).decode("ascii") != data:  # padding bits set, or no padding
                raise ValueError("not canonical base64")
            return raw
        if tag == "datetime":
            return datetime.fromisoformat(data)
        if tag == "date":
            return date.fromisoformat(data)
        if tag == "decimal":
            number = Decimal(data)
            if str(number) != data:
                raise ValueError("not a decimal as str() writes it")
            return number
        return _NONFINITE[data]  # finite floats are never tagged
    except (ValueError, ArithmeticError, KeyError):
        raise _corrupt(path, f"not a valid {tag!r} value", data) from None


def encode_value(value: Any, path: str = "value") -> Any:
    """``value`` as JSON-ready data that :func:`decode_value` rebuilds exactly.

    Raises:
        InvalidTypeError: a value with no faithful JSON form (the message names its path).

    """
    return _encode(value, path)


def decode_value(data: Any) -> Any:
    """The inverse of :func:`encode_value`.

    Raises:
        CorruptRecordError: a tagged value the encoder could not have written.

    """
    return _decode(data)


# -- migrations ---------------------------------------------------------------------------

Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _v0_to_v1(d: dict[str, Any]) -> dict[str, Any]:
    out = dict(d)
    if "memory" in out and "working_memory" not in out:
        out["working_memory"] = out.pop("memory")
    if "tools" in out and "tool_state" not in out:
        out["tool_state"] = out.pop("tools")
    out.setdefault("checkpoint", None)
    out["schema_version"] = 1
    return out


class MigrationRegistry:
    """Ordered upgrade steps for encoded CognitiveState dicts."""

    def __init__(self, steps: list[Migration] | None = None) -> None:
        self._steps: list[Migration] = list(steps if steps is not None else [_v0_to_v1])

    @property
    def current_version(self) -> int:
        """The newest version these steps reach."""
        return len(self._steps)

    def register(self, from_version: int, step: Migration) -> None:
        """Add the step upgrading ``from_version`` to ``from_version + 1`` (in order)."""
        if not callable(step):
            raise InvalidTypeError(f"a migration step must be callable, got {describe(step)}")
        if from_version != len(self._steps):
            raise ConfigError(
                f"the next migration must start at version {len(self._steps)}, not {from_version}"
            )
        self._steps.append(step)

    def upgrade(self, d: dict[str, Any]) -> dict[str, Any]:
        """``d`` upgraded to :attr:`current_version`.

        Raises:
            CognitiveStateSchemaVersionError: a version newer than the registry knows.

        """
        v = d.get("schema_version", 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CognitiveStateSchemaVersionError(f"invalid CognitiveState schema_version {v!r}")
        if v > self.current_version:
            raise CognitiveStateSchemaVersionError(
                f"CognitiveState schema_version {v} is newer than this ctxkeep reads "
                f"({self.current_version}); upgrade ctxkeep or register a migration"
            )
        while v < self.current_version:
            d = self._steps[v](dict(d))
            v += 1
            d["schema_version"] = v
        return d

    def copy(self) -> MigrationRegistry:
        """An independent registry with the same steps."""
        return MigrationRegistry(self._steps)


DEFAULT_REGISTRY = MigrationRegistry()


def encode_cognitive_state(state: CognitiveState | None) -> dict[str, Any]:
    """A JSON-ready dict of ``state`` (``None`` encodes an empty state).

    Raises:
        InvalidTypeError: a value with no faithful JSON form, or ``state`` is not a
            CognitiveState.

    """
    state = state if state is not None else CognitiveState()
    if not isinstance(state, CognitiveState):
        raise InvalidTypeError(f"expected a CognitiveState, got {type(state).__name__}")
    out: dict[str, Any] = {"schema_version": state.schema_version}
    for name in FIELDS:
        out[name] = _encode(getattr(state, name), name)
    return out


def decode_cognitive_state(
    obj: CognitiveState | Mapping[str, Any] | None,
    *,
    registry: MigrationRegistry | None = None,
) -> CognitiveState:
    """A :class:`CognitiveState` from a state, an encoded dict (after a JSON round trip) or
    ``None`` (an empty state). Old versions are upgraded; the result is a copy.

    Raises:
        CognitiveStateSchemaVersionError: a version newer than the registry knows.
        InvalidTypeError: ``obj`` is none of the accepted kinds (a ``TypeError``).
        CorruptRecordError: a corrupt encoded value (a ``ValueError``); the message names
            its path.

    """
    if registry is not None and not isinstance(registry, MigrationRegistry):
        raise InvalidTypeError(f"registry must be a MigrationRegistry, got {describe(registry)}")
    reg = registry or DEFAULT_REGISTRY
    if obj is None:
        return CognitiveState(schema_version=reg.current_version)
    if isinstance(obj, CognitiveState):
        if obj.schema_version == reg.current_version:
            try:
                return obj.copy()
            except TypeError as exc:  # an object deepcopy cannot copy (a lock, a socket)
                raise InvalidTypeError(f"cannot copy the CognitiveState: {exc}") from exc
        obj = encode_cognitive_state(obj)
    if not isinstance(obj, Mapping):
        raise InvalidTypeError(
            f"cannot decode a CognitiveState from {type(obj).__name__} {describe(obj)}: pass "
            "a CognitiveState, the dict encode_cognitive_state gave (after json.loads) or None"
        )
    upgraded = reg.upgrade(dict(obj))
    unknown = set(upgraded) - {"schema_version", *FIELDS}
    if unknown and reg is DEFAULT_REGISTRY:
        raise CognitiveStateSchemaVersionError(
            f"CognitiveState has fields this version does not know: {sorted(unknown)}"
        )
    fields = {name: _decode(upgraded.get(name), name) for name in FIELDS}
    state = CognitiveState(schema_version=upgraded["schema_version"], **fields)
    for name in unknown:  # fields a registered migration added
        setattr(state, name, _decode(upgraded[name], name))
    return state

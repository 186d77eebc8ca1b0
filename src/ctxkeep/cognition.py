"""Checkpointable cognition: the minimal durable state of an agent, versioned.

:class:`CognitiveState` holds what an agent needs to resume: its context, last observation,
working memory, current decision, tool state, and checkpoint marker. It holds no hidden
chain-of-thought: only what the agent chose to record.

Encoding is faithful or refused: :func:`encode_cognitive_state` gives a JSON-ready dict in
which sets, tuples, bytes, datetimes, dates and decimals are tagged so that
:func:`decode_cognitive_state` rebuilds them exactly; anything else (an object, a dataclass,
a dict with non-string keys) raises :class:`TypeError` naming the path, never silently
stringified.

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

from ctxkeep.errors import CognitiveStateSchemaVersionError

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
                raise TypeError(f"cannot encode {path}: key {k!r} is not a string; use string keys")
            if k == _TAG:
                raise TypeError(f"cannot encode {path}: the key {_TAG!r} is reserved")
            out[k] = _encode(v, f"{path}.{k}")
        return out
    kind = "a dataclass" if dataclasses.is_dataclass(value) else f"a {type(value).__name__}"
    raise TypeError(
        f"cannot encode {path}: {kind} has no faithful JSON form; convert it to dicts, lists, "
        "strings, numbers, sets, tuples, bytes or datetimes first"
    )


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        tag = value.get(_TAG)
        if tag is None:
            return {k: _decode(v) for k, v in value.items()}
        if tag == "tuple":
            return tuple(_decode(v) for v in value["items"])
        if tag == "set":
            return {_decode(v) for v in value["items"]}
        if tag == "frozenset":
            return frozenset(_decode(v) for v in value["items"])
        if tag == "bytes":
            return base64.b64decode(value["b64"])
        if tag == "datetime":
            return datetime.fromisoformat(value["iso"])
        if tag == "date":
            return date.fromisoformat(value["iso"])
        if tag == "decimal":
            return Decimal(value["str"])
        if tag == "float":
            return float(value["repr"])
        raise ValueError(f"unknown encoded value tag {tag!r}")
    return value


def encode_value(value: Any, path: str = "value") -> Any:
    """``value`` as JSON-ready data that :func:`decode_value` rebuilds exactly.

    Raises:
        TypeError: a value with no faithful JSON form (the message names its path).

    """
    return _encode(value, path)


def decode_value(data: Any) -> Any:
    """The inverse of :func:`encode_value`."""
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
        if from_version != len(self._steps):
            raise ValueError(
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
        TypeError: a value with no faithful JSON form.

    """
    state = state if state is not None else CognitiveState()
    if not isinstance(state, CognitiveState):
        raise TypeError(f"expected a CognitiveState, got {type(state).__name__}")
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
        TypeError: ``obj`` is none of the accepted kinds.

    """
    reg = registry or DEFAULT_REGISTRY
    if obj is None:
        return CognitiveState(schema_version=reg.current_version)
    if isinstance(obj, CognitiveState):
        if obj.schema_version == reg.current_version:
            return obj.copy()
        obj = encode_cognitive_state(obj)
    if not isinstance(obj, Mapping):
        raise TypeError(f"cannot decode a CognitiveState from {type(obj).__name__}")
    upgraded = reg.upgrade(dict(obj))
    unknown = set(upgraded) - {"schema_version", *FIELDS}
    if unknown and reg is DEFAULT_REGISTRY:
        raise CognitiveStateSchemaVersionError(
            f"CognitiveState has fields this version does not know: {sorted(unknown)}"
        )
    fields = {name: _decode(upgraded.get(name)) for name in FIELDS}
    state = CognitiveState(schema_version=upgraded["schema_version"], **fields)
    for name in unknown:  # fields a registered migration added
        setattr(state, name, _decode(upgraded[name]))
    return state

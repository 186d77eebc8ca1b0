"""CognitiveState: versions, migrations, faithful encoding."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ctxkeep.cognition import (
    CURRENT_SCHEMA_VERSION,
    DEFAULT_REGISTRY,
    CognitiveState,
    decode_cognitive_state,
    encode_cognitive_state,
)
from ctxkeep.errors import (
    CognitiveStateSchemaVersionError,
    CorruptRecordError,
    CtxkeepError,
    InvalidTypeError,
)


def _roundtrip(state: CognitiveState) -> CognitiveState:
    return decode_cognitive_state(json.loads(json.dumps(encode_cognitive_state(state))))


def test_dict_after_json_round_trip_equals_the_original() -> None:
    state = CognitiveState(
        context={"goal": "fix", "constraints": ["no network"]},
        observation={"exit": 1, "stderr": "boom"},
        working_memory={
            "tags": {"a", "b"},
            "pair": (1, "x"),
            "raw": b"\x00\x01\xff",
            "when": datetime(2026, 5, 1, 12, 0, tzinfo=UTC),
            "day": date(2026, 5, 1),
            "amount": Decimal("10.07"),
            "frozen": frozenset({1}),
        },
        decision={"next": "edit"},
        tool_state={"cursor": 3},
        checkpoint={"step": 12},
    )
    assert _roundtrip(state) == state


def test_none_gives_an_empty_state() -> None:
    assert decode_cognitive_state(None) == CognitiveState()


def test_legacy_v0_is_upgraded() -> None:
    legacy = {"context": {"goal": "g"}, "memory": {"facts": [1]}, "tools": {"t": 1}}
    state = decode_cognitive_state(legacy)
    assert state.schema_version == CURRENT_SCHEMA_VERSION == 1
    assert state.working_memory == {"facts": [1]}
    assert state.tool_state == {"t": 1}
    assert state.checkpoint is None


def test_future_version_is_refused() -> None:
    with pytest.raises(CognitiveStateSchemaVersionError):
        decode_cognitive_state({"schema_version": 2, "context": {}})


def test_a_registered_migration_upgrades_v1_to_v2() -> None:
    registry = DEFAULT_REGISTRY.copy()

    def v1_to_v2(d: dict) -> dict:
        # v2 splits the decision into an action and a rationale field
        out = dict(d)
        out["decision"] = {"action": d.get("decision"), "rationale": None}
        return out

    registry.register(1, v1_to_v2)
    v1 = encode_cognitive_state(CognitiveState(decision="edit"))
    v2 = decode_cognitive_state(v1, registry=registry)
    assert v2.schema_version == 2
    assert v2.decision == {"action": "edit", "rationale": None}
    # a v2 dict now decodes with this registry, but not with the default one
    as_v2 = encode_cognitive_state(v2)
    assert decode_cognitive_state(as_v2, registry=registry).decision == v2.decision
    with pytest.raises(CognitiveStateSchemaVersionError):
        decode_cognitive_state(as_v2)


def test_migrations_register_in_order() -> None:
    with pytest.raises(ValueError):
        DEFAULT_REGISTRY.copy().register(5, lambda d: d)


@dataclass
class _Thing:
    x: int


@pytest.mark.parametrize(
    "value",
    [object(), _Thing(1), {1: "int key"}, {"__ctxkeep__": "forged"}, lambda: 0],
    ids=["object", "dataclass", "int-key", "reserved-key", "function"],
)
def test_values_without_a_faithful_form_are_refused(value: object) -> None:
    with pytest.raises(InvalidTypeError) as info:
        encode_cognitive_state(CognitiveState(working_memory={"v": value}))
    assert "working_memory" in str(info.value)


def test_decoding_copies() -> None:
    state = CognitiveState(working_memory={"m": [1]})
    out = decode_cognitive_state(state)
    out.working_memory["m"].append(2)
    assert state.working_memory == {"m": [1]}


_json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)
)
_values = st.recursive(
    st.one_of(_json_leaf, st.binary(max_size=8), st.datetimes(timezones=st.just(UTC))),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(
            st.text(max_size=5).filter(lambda k: k != "__ctxkeep__"), inner, max_size=3
        ),
        st.frozensets(_json_leaf.filter(lambda v: v is not None), max_size=3),
    ),
    max_leaves=10,
)


@given(_values)
def test_any_supported_value_round_trips_exactly(value: object) -> None:
    state = CognitiveState(working_memory=value)
    assert _roundtrip(state) == state


# -- corrupt encoded values ---------------------------------------------------------------------

CORRUPT = {
    "bytes-bad-base64": {"__ctxkeep__": "bytes", "b64": "!!!*"},
    "bytes-padding-bits": {"__ctxkeep__": "bytes", "b64": "AB=="},
    "bytes-no-padding": {"__ctxkeep__": "bytes", "b64": "AA"},
    "bytes-not-a-string": {"__ctxkeep__": "bytes", "b64": 5},
    "tuple-without-items": {"__ctxkeep__": "tuple"},
    "tuple-items-a-string": {"__ctxkeep__": "tuple", "items": "abc"},
    "set-of-unhashables": {"__ctxkeep__": "set", "items": [[1]]},
    "unknown-tag": {"__ctxkeep__": "pickle", "data": "x"},
    "tag-not-a-string": {"__ctxkeep__": None},
    "extra-key": {"__ctxkeep__": "date", "iso": "2026-05-01", "tz": "UTC"},
    "bad-decimal": {"__ctxkeep__": "decimal", "str": "ten"},
    "decimal-with-spaces": {"__ctxkeep__": "decimal", "str": " 10"},
    "bad-date": {"__ctxkeep__": "date", "iso": "2026-13-01"},
    "bad-datetime": {"__ctxkeep__": "datetime", "iso": "yesterday"},
    "finite-float": {"__ctxkeep__": "float", "repr": "1.5"},
    "bad-float": {"__ctxkeep__": "float", "repr": "infinity and beyond"},
}


@pytest.mark.parametrize("value", list(CORRUPT.values()), ids=list(CORRUPT))
def test_a_corrupt_encoded_value_is_refused_naming_its_path(value: object) -> None:
    with pytest.raises(CorruptRecordError, match=r"context\.k\[0\]") as info:
        decode_cognitive_state({"schema_version": 1, "context": {"k": [value]}})
    assert isinstance(info.value, ValueError)


def test_corrupt_base64_is_never_decoded_into_other_bytes() -> None:
    # b64decode without validation turns "!!!*" into b"" and "AB==" into b"\x00".
    for b64 in ("!!!*", "AB==", "A A=", "AA==\n"):
        with pytest.raises(CorruptRecordError):
            decode_cognitive_state(
                {"schema_version": 1, "context": {"__ctxkeep__": "bytes", "b64": b64}}
            )


@pytest.mark.parametrize("obj", [b"garbage", "{}", 5, [("schema_version", 1)]])
def test_decoding_something_that_is_not_a_state_is_an_invalid_type_error(obj: object) -> None:
    with pytest.raises(InvalidTypeError, match="cannot decode a CognitiveState"):
        decode_cognitive_state(obj)  # type: ignore[arg-type]


def test_non_finite_floats_and_decimals_round_trip() -> None:
    state = CognitiveState(
        working_memory={"nan": Decimal("NaN"), "big": Decimal("1E+2"), "inf": float("-inf")}
    )
    # NaN equals nothing, not even itself: compare the reprs
    assert repr(_roundtrip(state).working_memory) == repr(state.working_memory)


_tags = st.sampled_from(
    ["tuple", "set", "frozenset", "bytes", "datetime", "date", "decimal", "float", "nope"]
)
_tagged_garbage = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["items", "b64", "iso", "str", "repr", "x"]), inner, max_size=2
        ).flatmap(lambda d: _tags.map(lambda tag: {"__ctxkeep__": tag, **d})),
    ),
    max_leaves=6,
)


@given(_tagged_garbage)
def test_decoding_garbage_raises_only_corrupt_record_errors(value: object) -> None:
    try:
        decode_cognitive_state({"schema_version": 1, "observation": value})
    except CtxkeepError as exc:
        assert isinstance(exc, CorruptRecordError)

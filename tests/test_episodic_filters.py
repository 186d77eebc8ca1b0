"""EpisodeFilter: parsing, JSON equality, and the same answer from memory and SQLite."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkeep.episodic import EpisodeFilter, open_episodic
from ctxkeep.episodic.filters import json_equal
from ctxkeep.errors import ConfigError, InvalidFilterError
from ctxkeep.sessions.records import dumps, loads

# small pools so that generated metadata values collide often
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, 2, -1]),
    st.sampled_from([0.0, 1.0, 1.5, -0.0]),
    st.sampled_from(["", "1", "a", "true"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "0", 'q"x']), inner, max_size=2)
    ),
    max_leaves=5,
)


def canonical(v: Any) -> Any:
    """A hashable form in which equal JSON values are equal Python values."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return (type(v).__name__, v)
    if isinstance(v, int | float):
        return ("number", Fraction(v))
    if isinstance(v, list):
        return ("list", tuple(canonical(x) for x in v))
    return ("object", frozenset((k, canonical(x)) for k, x in v.items()))


def test_parse_normalises_ids_to_tuples_and_times_to_floats() -> None:
    f = EpisodeFilter.parse(
        {
            "agent_id": "a",
            "task_id": ["t1", "t2"],
            "since": 5,
            "until": datetime(2024, 1, 1, tzinfo=UTC),
        }
    )
    assert f.agent_id == ("a",) and f.task_id == ("t1", "t2")
    assert f.since == 5.0 and f.until == datetime(2024, 1, 1, tzinfo=UTC).timestamp()


def test_parse_of_nothing_selects_every_episode() -> None:
    assert EpisodeFilter.parse(None).selects_all
    assert EpisodeFilter.parse({}).selects_all
    assert EpisodeFilter.parse({"metadata": {}}).selects_all


def test_the_unknown_key_message_names_the_key_and_every_allowed_key() -> None:
    with pytest.raises(InvalidFilterError) as caught:
        EpisodeFilter.parse({"agent": "a1"})
    assert str(caught.value) == (
        "unknown filter key 'agent'; allowed keys: "
        "episode_id, session_id, agent_id, task_id, since, until, metadata"
    )


def test_a_filter_error_is_a_config_error_and_a_value_error() -> None:
    with pytest.raises(ConfigError):
        EpisodeFilter.parse({"agent_id": 5})
    with pytest.raises(ValueError):
        EpisodeFilter.parse({"agent_id": 5})


def test_the_metadata_of_a_filter_is_a_copy() -> None:
    meta = {"k": [1]}
    f = EpisodeFilter.parse({"metadata": meta})
    meta["k"].append(2)
    assert f.metadata == {"k": [1]}


@given(json_values, json_values)
def test_json_equal_is_equality_of_json_values(a: Any, b: Any) -> None:
    assert json_equal(a, b) == (canonical(a) == canonical(b))


@given(json_values)
def test_a_value_equals_itself_after_a_json_round_trip(v: Any) -> None:
    assert json_equal(v, loads(dumps(v)))


def test_true_is_not_one_and_one_is_one_point_zero() -> None:
    assert not json_equal(True, 1) and not json_equal([False], [0])
    assert json_equal(1, 1.0) and json_equal({"a": [1]}, {"a": [1.0]})


@settings(max_examples=60, deadline=None)
@given(
    stored=st.lists(
        st.dictionaries(st.sampled_from(["k", "j"]), json_values, max_size=2), max_size=6
    ),
    wanted=st.dictionaries(st.sampled_from(["k", "j"]), json_values, min_size=1, max_size=2),
)
def test_memory_and_sqlite_select_the_same_episodes_by_metadata(
    stored: list[dict[str, Any]], wanted: dict[str, Any]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stores = [
            open_episodic("memory://", embedder="hash"),
            open_episodic(f"sqlite:///{tmp}/ep.db", embedder="hash"),
        ]
        found = []
        for s in stores:
            for i, meta in enumerate(stored):
                s.save_episode("s", "", f"episode {i}", metadata=meta)
            hits = s.search("episode", top_k=10, filters={"metadata": wanted})
            found.append(sorted(h.episode.summary for h in hits))
            s.close()
    want = sorted(
        f"episode {i}"
        for i, meta in enumerate(stored)
        if all(k in meta and canonical(meta[k]) == canonical(v) for k, v in wanted.items())
    )
    assert found == [want, want]

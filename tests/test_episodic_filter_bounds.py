"""Metadata and id filters every episode store can run (issue 25): a filter SQLite's parser
or PostgreSQL's jsonb could not take (nesting, width, integers beyond 64 bits, NUL) is an
InvalidFilterError (422 through the service) before any store sees it, on every backend,
instead of a storage failure (503) or an ``OverflowError`` (500).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep import open_episodic
from ctxkeep.episodic.filters import MAX_FILTER_IDS, MAX_METADATA_DEPTH, MAX_METADATA_VALUES
from ctxkeep.errors import InvalidFilterError

__all__ = ["postgres_schema_factory", "postgres_url"]


def nested(levels: int) -> Any:
    """A value of ``levels`` levels of lists: ``[[...[1]]]``."""
    out: Any = 1
    for _ in range(levels):
        out = [out]
    return out


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/episodes.db"
    else:
        make: Callable[[], str] = request.getfixturevalue("postgres_schema_factory")
        url = make()
    with open_episodic(url, embedder="hash") as opened:
        opened.save_episode("s", "goal", "summary", metadata={"k": nested(MAX_METADATA_DEPTH)})
        yield opened


REFUSED = {
    "nested too deep": {"k": nested(MAX_METADATA_DEPTH + 1)},
    "too many values": {f"k{i}": i for i in range(MAX_METADATA_VALUES + 1)},
    "a list too wide": {"k": list(range(MAX_METADATA_VALUES + 1))},
    "2**63": {"k": 2**63},
    "-(2**63)-1": {"k": -(2**63) - 1},
    "NUL in a key": {"a\x00b": 1},
    "NUL in a text": {"k": ["a\x00b"]},
}


@pytest.mark.parametrize("metadata", REFUSED.values(), ids=REFUSED.keys())
def test_a_metadata_filter_no_store_can_run_is_an_invalid_filter_error(
    store: Any, metadata: dict[str, Any]
) -> None:
    with pytest.raises(InvalidFilterError, match="metadata"):
        store.search("goal", filters={"metadata": metadata})


def test_a_metadata_filter_at_the_bounds_is_run_on_every_backend(store: Any) -> None:
    (hit,) = store.search("goal", filters={"metadata": {"k": nested(MAX_METADATA_DEPTH)}})
    assert hit.episode.summary == "summary"
    wide = {"k": [[[[[list(range(MAX_METADATA_VALUES - 6))]]]]]}
    assert store.search("goal", filters={"metadata": wide}) == []
    assert store.search("goal", filters={"metadata": {"k": 2**63 - 1}}) == []


def test_an_id_filter_of_too_many_ids_is_an_invalid_filter_error(store: Any) -> None:
    with pytest.raises(InvalidFilterError, match="session_id"):
        store.search("goal", filters={"session_id": ["s"] * (MAX_FILTER_IDS + 1)})
    (hit,) = store.search("goal", filters={"session_id": ["s"] * MAX_FILTER_IDS})
    assert hit.episode.session_id == "s"

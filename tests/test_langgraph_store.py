"""CtxkeepStore: LangGraph's store operations on memory://, SQLite and PostgreSQL, side by side
with LangGraph's own ``InMemoryStore`` where the semantics agree, and inside a real graph.

Every store here embeds with the ``hash`` embedder (fast, deterministic); ``InMemoryStore`` is
given the same vectors, so the one difference under test in recall is hybrid scoring.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from typing_extensions import TypedDict

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import HashEmbedder, open_episodic
from ctxkeep.errors import ConfigError, InvalidFilterError, InvalidTypeError
from ctxkeep.integrations.langgraph import CtxkeepStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

KINDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
FIELDS = {"fields": ["text"]}


class Clock:
    """A time source the test moves."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, minutes: float) -> None:
        self.now += minutes * 60


Factory = Callable[..., CtxkeepStore]


def _url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/store-{uuid.uuid4().hex[:8]}.db"
    return str(request.getfixturevalue("postgres_schema_factory")())


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def new_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], str]:
    """URLs of fresh, empty places of this kind."""
    return lambda: _url(kind, request, tmp_path)


@pytest.fixture
def make(new_url: Callable[[], str]) -> Iterator[Factory]:
    """Stores of this kind (each in a fresh place unless ``url`` is given), closed after."""
    made: list[CtxkeepStore] = []

    def factory(url: str | None = None, **kwargs: Any) -> CtxkeepStore:
        kwargs.setdefault("index", FIELDS)
        store = CtxkeepStore(url or new_url(), embedder="hash", **kwargs)
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()


def _hash_vectors(texts: Any) -> list[list[float]]:
    vectors: list[list[float]] = HashEmbedder().embed_documents(list(texts)).tolist()
    return vectors


def _in_memory_store() -> InMemoryStore:
    """LangGraph's own store with the same vectors: dense recall alone."""
    return InMemoryStore(index={"dims": 256, "embed": _hash_vectors, "fields": ["text"]})


def _view(item: Any) -> Any:
    """What both stores must agree on: address and value (times and scores differ)."""
    return None if item is None else (item.namespace, item.key, item.value)


def _views(items: list[Any]) -> list[Any]:
    return sorted((_view(i) for i in items), key=repr)


# -- put / get / delete ---------------------------------------------------------------------------


def test_get_returns_what_put_stored_with_utc_times(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    store.put(("users", "u1"), "prefs", {"theme": "dark", "sizes": [1, 2.5], "on": True})
    item = store.get(("users", "u1"), "prefs")
    assert item is not None
    assert _view(item) == (
        ("users", "u1"),
        "prefs",
        {"theme": "dark", "sizes": [1, 2.5], "on": True},
    )
    assert item.created_at == item.updated_at
    assert item.created_at.tzinfo is UTC and item.created_at.timestamp() == clock.now


def test_update_keeps_created_at_and_moves_updated_at(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    store.put(("docs",), "d", {"text": "first draft"})
    first = store.get(("docs",), "d")
    clock.advance(3)
    store.put(("docs",), "d", {"text": "second draft"})
    second = store.get(("docs",), "d")
    assert first is not None and second is not None
    assert second.value == {"text": "second draft"}
    assert second.created_at == first.created_at
    assert (second.updated_at - first.updated_at).total_seconds() == 180


def test_an_update_replaces_the_items_episode(make: Factory) -> None:
    store = make()
    store.put(("docs",), "d", {"text": "quokka"})
    store.put(("docs",), "d", {"text": "wombat"})
    assert store.episodic.count() == 1
    assert [i.key for i in store.search(("docs",), query="wombat")] == ["d"]
    assert store.search(("docs",), query="quokka")[0].value == {"text": "wombat"}


def test_get_of_a_missing_key_or_namespace_is_none(make: Factory) -> None:
    store = make()
    store.put(("a",), "k", {"x": 1})
    assert store.get(("a",), "other") is None
    assert store.get(("b",), "k") is None
    assert store.get(("a", "k"), "k") is None


def test_delete_removes_the_item_and_its_episode(make: Factory) -> None:
    store = make()
    store.put(("a",), "k", {"text": "hello there"})
    store.put(("a",), "j", {"text": "general kenobi"})
    store.delete(("a",), "k")
    assert store.get(("a",), "k") is None
    assert [i.key for i in store.search(("a",), query="hello")] == ["j"]
    assert store.episodic.count() == 1
    store.delete(("a",), "never-there")  # deleting nothing is not an error


def test_returned_values_are_copies(make: Factory) -> None:
    store = make()
    value = {"tags": ["x"]}
    store.put(("a",), "k", value)
    value["tags"].append("changed by the caller")
    got = store.get(("a",), "k")
    assert got is not None and got.value == {"tags": ["x"]}
    got.value["tags"].append("changed again")
    again = store.get(("a",), "k")
    assert again is not None and again.value == {"tags": ["x"]}
    (found,) = store.search(("a",))
    found.value["tags"].append("changed by a searcher")
    assert [i.value for i in store.search(("a",))] == [{"tags": ["x"]}]
    store.batch([PutOp(("a",), "b", value)])
    value["tags"].clear()
    assert [i.value for i in store.batch([GetOp(("a",), "b")]) if i] == [
        {"tags": ["x", "changed by the caller"]}
    ]


@pytest.mark.parametrize(
    "kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)  # memory:// lives as long as its store object
def test_items_outlive_the_store_object(make: Factory, new_url: Callable[[], str]) -> None:
    url = new_url()
    store = make(url)
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    store.put(("notes",), "n2", {"text": "lunch is at noon"})
    store.close()
    reopened = make(url)
    assert _view(reopened.get(("notes",), "n1")) == (
        ("notes",),
        "n1",
        {"text": "the launch code is aardvark"},
    )
    assert reopened.search(("notes",), query="aardvark")[0].key == "n1"


# -- search -------------------------------------------------------------------------------------


def test_search_without_query_is_newest_updated_first_and_pages(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    for key in ["a", "b", "c", "d", "e"]:
        store.put(("docs",), key, {"text": key})
        clock.advance(1)
    store.put(("docs",), "b", {"text": "b again"})
    found = store.search(("docs",))
    assert [i.key for i in found] == ["b", "e", "d", "c", "a"]
    assert all(i.score is None for i in found)
    pages = [store.search(("docs",), limit=2, offset=o) for o in (0, 2, 4, 6)]
    assert [[i.key for i in p] for p in pages] == [["b", "e"], ["d", "c"], ["a"], []]


def test_search_stays_within_the_namespace_prefix(make: Factory) -> None:
    store = make()
    for ns in [("a",), ("a", "b"), ("a", "b", "c"), ("ab",), ("a2", "b"), ("x", "a")]:
        store.put(ns, "k", {"text": "same words"})
    assert sorted(i.namespace for i in store.search(("a",))) == [
        ("a",),
        ("a", "b"),
        ("a", "b", "c"),
    ]
    assert sorted(i.namespace for i in store.search(("a", "b"))) == [("a", "b"), ("a", "b", "c")]
    assert len(store.search((), limit=100)) == 6
    hits = store.search(("a", "b"), query="same words")
    assert sorted(i.namespace for i in hits) == [("a", "b"), ("a", "b", "c")]


def test_search_with_query_ranks_indexed_items_then_the_rest(make: Factory) -> None:
    store = make()
    store.put(("m",), "tea", {"text": "she drinks green tea every morning"})
    store.put(("m",), "car", {"text": "he drives a red car"})
    store.put(("m",), "raw", {"text": "green tea notes"}, index=False)
    store.put(("m",), "empty", {"other": "no text field"})
    found = store.search(("m",), query="green tea")
    assert [i.key for i in found[:2]] == ["tea", "car"]
    assert found[0].score is not None and found[1].score is not None
    assert found[0].score > found[1].score
    assert {i.key for i in found[2:]} == {"raw", "empty"}
    assert all(i.score is None for i in found[2:])
    keys = [
        i.key for o in range(4) for i in store.search(("m",), query="green tea", limit=1, offset=o)
    ]
    assert keys == [i.key for i in found]


def test_index_paths_choose_what_is_recalled(make: Factory) -> None:
    store = make(index={"fields": ["title", "notes[*].body"]})
    store.put(("d",), "x", {"title": "ocelot", "notes": [{"body": "pangolin"}], "skip": "lemur"})
    store.put(("d",), "y", {"title": "heron", "notes": []})
    assert store.search(("d",), query="pangolin")[0].key == "x"
    assert store.search(("d",), query="ocelot")[0].key == "x"
    texts = {h.episode.summary for h in store.episodic.search("ocelot heron", 10)}
    assert texts == {"ocelot\npangolin", "heron"}  # "skip" is not indexed
    store.put(("d",), "z", {"title": "ibis", "skip": "narwhal"}, index=["skip"])
    assert store.search(("d",), query="narwhal")[0].key == "z"


FILTER_CASES = [
    ({"color": "red"}, ["r1", "r2"]),
    ({"color": "red", "size": 2}, ["r2"]),
    ({"size": 2.0}, ["r2", "b1"]),
    ({"size": {"$gt": 1}}, ["r2", "b1"]),
    ({"size": {"$gte": 1, "$lt": 2}}, ["r1"]),
    ({"size": {"$lte": 1}}, ["r1", "g1"]),
    ({"color": {"$ne": "red"}}, ["b1", "g1", "n1"]),
    ({"color": {"$eq": "blue"}}, ["b1"]),
    ({"meta": {"lang": "en"}}, ["r1", "b1"]),
    ({"meta": {"lang": "en", "v": 2}}, ["b1"]),
    ({"tags": ["x", "y"]}, ["r1"]),
    ({"tags": ("x", "y")}, ["r1"]),
    ({"tags": ["x"]}, []),
    ({"missing": None}, ["r1", "r2", "b1", "g1", "n1"]),
    ({"color": {"$gt": "c"}}, ["r1", "r2", "g1"]),
]
"""(filter, the keys it selects); InMemoryStore raises on the order operators (n1's size is
a string), so it is compared on the others."""


def test_filters_agree_with_in_memory_store(make: Factory) -> None:
    items = {
        "r1": {
            "text": "one",
            "color": "red",
            "size": 1,
            "meta": {"lang": "en"},
            "tags": ["x", "y"],
        },
        "r2": {"text": "two", "color": "red", "size": 2, "meta": {"lang": "de"}},
        "b1": {"text": "three", "color": "blue", "size": 2.0, "meta": {"lang": "en", "v": 2}},
        "g1": {"text": "four", "color": "green", "size": 0.5},
        "n1": {"text": "five", "size": "big"},
    }
    ours, theirs = make(), _in_memory_store()
    for key, value in items.items():
        ours.put(("shop",), key, value)
        theirs.put(("shop",), key, value)
    ordered = {"$gt", "$gte", "$lt", "$lte"}
    for flt, keys in FILTER_CASES:
        if not any(isinstance(v, dict) and ordered & v.keys() for v in flt.values()):
            assert _views(theirs.search(("shop",), filter=flt)) == _views(
                [theirs.get(("shop",), k) for k in keys]
            ), flt
        assert sorted(i.key for i in ours.search(("shop",), filter=flt)) == sorted(keys), flt
        with_query = ours.search(("shop",), query="one two", filter=flt)
        assert sorted(i.key for i in with_query) == sorted(keys), flt


def test_filters_compare_json_values_not_python_values(make: Factory) -> None:
    store = make()
    store.put(("f",), "t", {"flag": True, "n": 1, "s": "10"})
    assert store.search(("f",), filter={"flag": 1}) == []  # true is not 1 (InMemoryStore: is)
    assert store.search(("f",), filter={"n": True}) == []
    assert [i.key for i in store.search(("f",), filter={"n": 1.0})] == ["t"]
    assert store.search(("f",), filter={"s": {"$gt": 5}}) == []  # no order between kinds
    assert store.search(("f",), filter={"nothing": {"$lt": 5}}) == []  # InMemoryStore raises


def test_batch_reads_see_the_store_before_its_puts(make: Factory) -> None:
    store = make()
    store.put(("b",), "old", {"text": "before"})
    got, _, listed, found, _ = store.batch(
        [
            GetOp(("b",), "new"),
            PutOp(("b",), "new", {"text": "first"}),
            ListNamespacesOp(),
            SearchOp(("b",)),
            PutOp(("b",), "new", {"text": "last"}),
        ]
    )
    assert got is None and listed == [("b",)]
    assert [i.key for i in found] == ["old"]  # type: ignore[union-attr]
    last = store.get(("b",), "new")
    assert last is not None and last.value == {"text": "last"}
    assert store.episodic.count() == 2


def test_namespace_scoped_recall_agrees_with_exact_scope(make: Factory) -> None:
    store = make()
    for i in range(12):
        store.put(("n", str(i % 3)), f"k{i}", {"text": f"word{i} shared", "even": i % 2 == 0})
    store.put(("elsewhere",), "x", {"text": "word1 shared"})
    exact = store.search(("n",), query="word4 shared", filter={"even": True}, limit=4)
    store.exact_scope = 1
    scoped = store.search(("n",), query="word4 shared", filter={"even": True}, limit=4)
    assert exact[0].key == scoped[0].key == "k4"
    assert {i.key for i in scoped} <= {f"k{i}" for i in range(0, 12, 2)}
    assert len(scoped) == 4
    everything = store.search(("n",), query="word4 shared", filter={"even": True}, limit=100)
    assert sorted(i.key for i in everything) == sorted(f"k{i}" for i in range(0, 12, 2))


def test_hybrid_recall_finds_rare_words_dense_alone_ranks_lower(make: Factory) -> None:
    """A long note holds the query's rare words once each; short notes share its common word.
    By cosine alone (LangGraph's InMemoryStore, same vectors) the short notes win; the lexical
    side lifts the note with the rare words to the top.
    """
    notes = {
        "target": "Monday planning notes: budgets, hiring, offices, travel, laptops, the "
        "quarterly review, the holiday schedule and the zygomorphic orchid for the lobby",
        "f1": "fresh flowers",
        "f2": "flowers on the desk",
        "f3": "we bought flowers",
        "u1": "the printer is jammed again",
        "u2": "payroll runs on Friday",
        "u3": "parking permits renew in May",
        "u4": "the wifi password changed",
        "u5": "coffee machine descaling",
        "u6": "fire drill at noon",
        "u7": "new badge readers",
    }
    query = "zygomorphic orchid flowers"
    ours, dense = make(), _in_memory_store()
    for key, text in notes.items():
        ours.put(("notes",), key, {"text": text})
        dense.put(("notes",), key, {"text": text})
    dense_rank = [i.key for i in dense.search(("notes",), query=query)]
    assert dense_rank.index("target") == 3
    assert ours.search(("notes",), query=query)[0].key == "target"


# -- namespaces ---------------------------------------------------------------------------------

NAMESPACES = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f")]
NAMESPACES += [("a", "c", "f"), ("x", "b", "f"), ("y",)]


LIST_OPS = [
    ListNamespacesOp(),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("a", "b")),)),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("a", "*", "f")),)),
    ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("f",)),)),
    ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("*", "f")),)),
    ListNamespacesOp(
        match_conditions=(MatchCondition("prefix", ("a",)), MatchCondition("suffix", ("f",)))
    ),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("a", "b")),), max_depth=3),
    ListNamespacesOp(max_depth=1),
    ListNamespacesOp(max_depth=2, limit=2, offset=1),
    ListNamespacesOp(limit=3, offset=5),
    ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("a", "b", "c", "d")),)),
]


def test_list_namespaces_agrees_with_in_memory_store(make: Factory) -> None:
    ours, theirs = make(), InMemoryStore()
    for ns in NAMESPACES:
        ours.put(ns, "k", {"v": 1})
        theirs.put(ns, "k", {"v": 1})
    for op, got, want in zip(LIST_OPS, ours.batch(LIST_OPS), theirs.batch(LIST_OPS), strict=True):
        assert got == want, op
    assert ours.list_namespaces(prefix=("a", "b"), suffix=("f",)) == [("a", "b", "f")]


def test_an_emptied_namespace_is_not_listed(make: Factory) -> None:
    store = make()
    store.put(("a", "b"), "k", {"v": 1})
    store.put(("c",), "k", {"v": 1})
    store.delete(("a", "b"), "k")
    assert store.list_namespaces() == [("c",)]


# -- TTL ----------------------------------------------------------------------------------------


def test_an_expired_item_is_never_returned(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    store.put(("t",), "short", {"text": "ephemeral note"}, ttl=1)
    store.put(("t", "sub"), "long", {"text": "durable note"}, ttl=10)
    clock.advance(1.5)
    assert store.get(("t",), "short") is None
    assert [i.key for i in store.search(("t",), query="note")] == ["long"]
    assert store.list_namespaces() == [("t", "sub")]
    clock.advance(10)
    assert store.search(("t",)) == [] and store.list_namespaces() == []


def test_reads_refresh_the_ttl_unless_told_not_to(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    store.put(("t",), "k", {"text": "kept alive by reads"}, ttl=1)
    store.put(("t",), "j", {"text": "read without refresh"}, ttl=1)
    clock.advance(0.8)
    assert store.get(("t",), "k") is not None  # now expires at 1.8
    assert store.get(("t",), "j", refresh_ttl=False) is not None  # still at 1.0
    clock.advance(0.8)
    assert store.get(("t",), "j") is None
    assert store.get(("t",), "k") is not None  # 2.6
    clock.advance(0.8)
    assert [i.key for i in store.search(("t",), query="alive")] == ["k"]  # 3.4
    clock.advance(0.8)
    assert store.search(("t",), refresh_ttl=False) != []  # stays 3.4
    clock.advance(0.3)
    assert store.get(("t",), "k") is None


def test_ttl_config_gives_the_default_and_the_refresh_policy(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock, ttl={"default_ttl": 2, "refresh_on_read": False})
    store.put(("t",), "k", {"v": 1})
    store.put(("t",), "forever", {"v": 2}, ttl=None)
    clock.advance(1.5)
    assert store.get(("t",), "k") is not None  # does not refresh
    clock.advance(1)
    assert store.get(("t",), "k") is None
    assert store.get(("t",), "forever") is not None
    store.put(("t",), "k", {"v": 3})
    clock.advance(1.5)
    assert store.get(("t",), "k", refresh_ttl=True) is not None  # asked to
    clock.advance(1.5)
    assert store.get(("t",), "k") is not None


def test_a_put_over_an_expired_item_creates_a_new_one(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    store.put(("t",), "k", {"v": 1}, ttl=1)
    clock.advance(2)
    store.put(("t",), "k", {"v": 2})
    item = store.get(("t",), "k")
    assert item is not None and item.created_at.timestamp() == clock.now


def test_sweep_deletes_expired_items_and_their_episodes(make: Factory) -> None:
    clock = Clock()
    store = make(clock=clock)
    store.put(("t",), "a", {"text": "gone soon"}, ttl=1)
    store.put(("t",), "b", {"text": "gone soon too"}, ttl=1)
    store.put(("t",), "c", {"text": "stays"})
    assert store.sweep_ttl() == 0
    clock.advance(2)
    assert store.sweep_ttl() == 2
    assert store.episodic.count() == 1
    assert store.sweep_ttl() == 0


def test_the_sweeper_thread_sweeps_until_stopped() -> None:
    clock = Clock()
    store = CtxkeepStore("memory://", embedder="hash", clock=clock, ttl={"default_ttl": 1})
    try:
        store.put(("t",), "k", {"text": "x"})
        clock.advance(2)
        future = store.start_ttl_sweeper(sweep_interval_minutes=0.0005)
        assert store.start_ttl_sweeper() is future  # one sweeper per store
        for _ in range(500):
            if store.episodic.count() == 0:
                break
            time.sleep(0.01)
        assert store.episodic.count() == 0
        assert store.stop_ttl_sweeper(timeout=5)
        assert future.result(timeout=5) is None
    finally:
        store.close()


# -- async --------------------------------------------------------------------------------------


def test_async_methods_agree_with_sync_ones(make: Factory) -> None:
    store = make()

    async def scenario() -> tuple[Any, ...]:
        await store.aput(("a", "x"), "k1", {"text": "async alpaca"})
        await store.aput(("a", "y"), "k2", {"text": "async bison"})
        got = await store.aget(("a", "x"), "k1")
        found = await store.asearch(("a",), query="bison")
        listed = await store.alist_namespaces(prefix=("a",))
        await store.adelete(("a", "x"), "k1")
        return got, found, listed, await store.aget(("a", "x"), "k1")

    got, found, listed, gone = asyncio.run(scenario())
    assert _view(got) == (("a", "x"), "k1", {"text": "async alpaca"})
    assert found[0].key == "k2" and listed == [("a", "x"), ("a", "y")] and gone is None
    assert _view(store.get(("a", "y"), "k2")) == (("a", "y"), "k2", {"text": "async bison"})


# -- side by side with InMemoryStore on random operation sequences ---------------------------------

_labels = st.sampled_from(["a", "b", "c"])
_namespaces = st.lists(_labels, min_size=1, max_size=3).map(tuple)
_values = st.fixed_dictionaries(
    {"text": st.sampled_from(["red fox", "blue bird", "red bird"]), "n": st.integers(0, 3)}
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _namespaces, st.sampled_from("kl"), _values),
        st.tuples(st.just("delete"), _namespaces, st.sampled_from("kl")),
        st.tuples(st.just("get"), _namespaces, st.sampled_from("kl")),
        st.tuples(st.just("search"), st.lists(_labels, max_size=2).map(tuple), st.integers(0, 3)),
        st.tuples(st.just("list"), st.lists(_labels, max_size=2).map(tuple), st.integers(1, 3)),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_random_sequences_agree_with_in_memory_store(ops: list[tuple[Any, ...]]) -> None:
    ours, theirs = CtxkeepStore("memory://", embedder="hash", index=FIELDS), _in_memory_store()
    live: dict[tuple[tuple[str, ...], str], Any] = {}
    try:
        for op in ops:
            if op[0] == "put":
                _, ns, key, value = op
                ours.put(ns, key, value)
                theirs.put(ns, key, value)
                live[ns, key] = value
            elif op[0] == "delete":
                _, ns, key = op
                ours.delete(ns, key)
                theirs.delete(ns, key)
                live.pop((ns, key), None)
            elif op[0] == "get":
                _, ns, key = op
                assert _view(ours.get(ns, key)) == _view(theirs.get(ns, key))
            elif op[0] == "search":
                _, prefix, n = op
                flt = {"n": {"$gte": n}}
                assert _views(ours.search(prefix, filter=flt, limit=100)) == _views(
                    theirs.search(prefix, filter=flt, limit=100)
                )
                ranked = ours.search(prefix, query="red bird", limit=100)
                assert _views(ranked) == _views(theirs.search(prefix, query="red bird", limit=100))
            else:
                _, prefix, depth = op
                want = sorted({ns[:depth] for ns, _ in live if ns[: len(prefix)] == prefix})
                assert ours.list_namespaces(prefix=prefix or None, max_depth=depth) == want
    finally:
        ours.close()


# -- a real graph -------------------------------------------------------------------------------


class _State(TypedDict):
    user: str
    said: str
    recalled: list[str]


def _remember(state: _State, *, store: BaseStore) -> dict[str, Any]:
    store.put(("memories", state["user"]), uuid.uuid4().hex, {"text": state["said"]})
    return {}


def _recall(state: _State) -> dict[str, Any]:
    found = get_store().search(("memories", state["user"]), query=state["said"], limit=2)
    return {"recalled": [i.value["text"] for i in found]}


def _graph(store: CtxkeepStore) -> Any:
    builder = StateGraph(_State)
    builder.add_node("remember", _remember)
    builder.add_node("recall", _recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(store=store)


def test_a_langgraph_graph_remembers_and_recalls_through_the_store(make: Factory) -> None:
    store = make()
    graph = _graph(store)
    graph.invoke({"user": "u1", "said": "my cat is called Miso", "recalled": []})
    graph.invoke({"user": "u2", "said": "my cat is called Pixel", "recalled": []})
    out = graph.invoke({"user": "u1", "said": "I live in Lisbon", "recalled": []})
    assert set(out["recalled"]) == {"I live in Lisbon", "my cat is called Miso"}
    out = asyncio.run(
        graph.ainvoke({"user": "u1", "said": "what is my cat called", "recalled": []})
    )
    assert out["recalled"][1] == "my cat is called Miso"
    assert len(store.search(("memories",), limit=100)) == 4


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.put(("a.b",), "k", {}), InvalidNamespaceError),
        (lambda s: s.put(("a", ""), "k", {}), InvalidNamespaceError),
        (lambda s: s.put((), "k", {}), InvalidNamespaceError),
        (lambda s: s.put(("langgraph", "x"), "k", {}), InvalidNamespaceError),
        (lambda s: s.batch([PutOp(("langgraph",), "k", {})]), InvalidNamespaceError),
        (lambda s: s.batch([GetOp(("a", 1), "k")]), InvalidNamespaceError),  # type: ignore[arg-type]
        # a batch checks each namespace once, each one that differs still checked
        (
            lambda s: s.batch(
                [PutOp(("b",), "k", {}), PutOp(("b",), "j", {}), PutOp(("b.c",), "k", {})]
            ),
            InvalidNamespaceError,
        ),
        (
            lambda s: s.batch([PutOp(("b",), "k", {}), PutOp(("b", ["c"]), "k", {})]),  # type: ignore[list-item]
            InvalidNamespaceError,
        ),
        (
            lambda s: s.batch([PutOp(("b",), "k", {}), PutOp(("b", ""), "k", {})]),
            InvalidNamespaceError,
        ),
        (lambda s: s.batch([GetOp(("a",), 1)]), InvalidTypeError),  # type: ignore[arg-type]
        # ("a",) is a namespace the store has checked: its puts' other fields still are
        (lambda s: s.batch([PutOp(("a",), 1, {})]), InvalidTypeError),  # type: ignore[arg-type]
        (lambda s: s.batch([PutOp(("a",), "k", {}, ttl=0)]), ConfigError),
        (lambda s: s.put(("a",), "k", {"x": math.inf}), ConfigError),
        # put (BaseStore.put) refuses these namespaces for a delete too; a batch's delete not
        (lambda s: s.put((), "k", None), InvalidNamespaceError),  # type: ignore[arg-type]
        (lambda s: s.put(("langgraph",), "k", None), InvalidNamespaceError),  # type: ignore[arg-type]
        (lambda s: s.search(("a.b",)), InvalidNamespaceError),
        (lambda s: s.search(("a", "")), InvalidNamespaceError),
        (lambda s: s.search(["a"]), InvalidNamespaceError),  # type: ignore[arg-type]
        (lambda s: s.put(("a",), "k", {"s": {1, 2}}), InvalidTypeError),
        (lambda s: s.put(("a",), "k", {"x": math.nan}), ConfigError),
        (lambda s: s.put(("a",), "k", {1: "x"}), InvalidTypeError),
        (lambda s: s.put(("a",), "k", ["not", "a", "mapping"]), InvalidTypeError),
        (lambda s: s.put(("a",), "k", {"x": 2**70}), ConfigError),
        (lambda s: s.put(("a",), "k", {}, ttl=-1), ConfigError),
        (lambda s: s.put(("a",), "k", {}, index="text"), InvalidTypeError),
        (lambda s: s.search(("a",), filter={"x": {"$regex": "y"}}), InvalidFilterError),
        (lambda s: s.search(("a",), filter={"x": {"$gt": [1]}}), InvalidFilterError),
        (lambda s: s.search(("a",), filter={"x": {1, 2}}), InvalidFilterError),
        (lambda s: s.search(("a",), filter=["x"]), InvalidFilterError),
        (lambda s: s.search(("a",), limit=-1), ConfigError),
        (lambda s: s.search(("a",), query=3), InvalidTypeError),
        # the fields search takes as they are (ASCII text, plain ints in range), and the rest
        (lambda s: s.search(("a",), limit=True), InvalidTypeError),
        (lambda s: s.search(("a",), limit=2.0), InvalidTypeError),  # type: ignore[arg-type]
        (lambda s: s.search(("a",), offset=-1), ConfigError),
        (lambda s: s.search(("a",), offset=2**63), ConfigError),
        (lambda s: s.search(("a",), query=b"x"), InvalidTypeError),  # type: ignore[arg-type]
        (lambda s: s.search(("a",), query="\ud800"), ConfigError),
        (lambda s: s.batch([SearchOp(("a",), limit=-1)]), ConfigError),
        (lambda s: s.batch([SearchOp(("a",), query=3)]), InvalidTypeError),  # type: ignore[arg-type]
        (lambda s: s.list_namespaces(max_depth=0), ConfigError),
        (lambda s: s.list_namespaces(prefix=("a.b",)), InvalidNamespaceError),
        (lambda s: s.batch(["get a"]), InvalidTypeError),
    ],
)
def test_bad_input_gets_a_typed_error_and_changes_nothing(
    call: Callable[[CtxkeepStore], Any], error: type[Exception]
) -> None:
    store = CtxkeepStore("memory://", embedder="hash")
    try:
        store.put(("a",), "k", {"text": "kept"})
        with pytest.raises(error):
            call(store)
        assert _view(store.get(("a",), "k")) == (("a",), "k", {"text": "kept"})
        assert store.list_namespaces() == [("a",)]
    finally:
        store.close()


def test_the_namespaces_a_store_remembers_as_checked_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ctxkeep.integrations.langgraph import _store_filters

    monkeypatch.setattr(_store_filters, "KNOWN_NAMESPACES", 3)
    with CtxkeepStore("memory://", index=False) as store:
        for i in range(10):
            store.put(("n", f"u{i}"), "k", {"i": i})
            store.batch([PutOp(("m", f"u{i}"), "k", {"i": i}), PutOp(("n", f"u{i}"), "j", None)])
            assert 1 <= len(store._known) <= 3
        assert set(store._known) <= {("n", f"u{i}") for i in range(10)} | {
            ("m", f"u{i}") for i in range(10)
        }
        assert all(text == ".".join(ns) for ns, text in store._known.items())
        with pytest.raises(InvalidNamespaceError):
            store.put(("n", "u9.x"), "k", {})
        store.batch([PutOp((), "gone", None)])  # a batch's delete of nothing: no namespace kept
        assert () not in store._known and ("langgraph",) not in store._known
        assert len(store.search(("n",), limit=100)) == 10


def test_a_bad_op_in_a_batch_stops_the_whole_batch() -> None:
    store = CtxkeepStore("memory://", embedder="hash")
    try:
        store.put(("a",), "k", {"v": 1})
        with pytest.raises(InvalidNamespaceError):
            store.batch(
                [PutOp(("a",), "k", None), PutOp(("b",), "n", {"v": 2}), GetOp(("x.y",), "k")]
            )
        assert store.get(("a",), "k") is not None and store.list_namespaces() == [("a",)]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"url": "redis://127.0.0.1:6379/0"}, ConfigError),
        ({"url": "memory://", "index": {"embed": "openai:text-embedding-3-small"}}, ConfigError),
        ({"url": "memory://", "index": {"dims": 3}}, ConfigError),
        ({"url": "memory://", "index": {"feilds": ["text"]}}, ConfigError),
        ({"url": "memory://", "index": {"fields": "text"}}, ConfigError),
        ({"url": "memory://", "ttl": {"default_ttl": 0}}, ConfigError),
        ({"url": "memory://", "ttl": {"refresh_on_read": "yes"}}, InvalidTypeError),
        ({"url": "memory://", "ttl": {"sweep_every": 1}}, ConfigError),
        ({"url": 5}, InvalidTypeError),
    ],
)
def test_bad_configuration_is_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        CtxkeepStore(embedder="hash", **kwargs)


def test_a_given_episodic_store_is_used_and_left_open(tmp_path: Path) -> None:
    episodic = open_episodic(f"sqlite:///{tmp_path}/e.db", embedder="hash")
    with CtxkeepStore(episodic=episodic, index=FIELDS) as store:
        store.put(("a",), "k", {"text": "shared file"})
        assert store.search(("a",), query="shared")[0].key == "k"
    assert episodic.count() == 1  # still open, the episode still there
    with CtxkeepStore(episodic=episodic, index=FIELDS) as again:  # the items live in its file
        assert _view(again.get(("a",), "k")) == (("a",), "k", {"text": "shared file"})
    episodic.close()
    with pytest.raises(ConfigError):
        CtxkeepStore(episodic=open_episodic("memory://", embedder="hash"), embedder="hash")


def test_the_langgraph_example_resumes_its_thread_and_recalls_by_the_rare_word(
    tmp_path: Path,
) -> None:
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "examples" / "langgraph_app.py"
    spec = importlib.util.spec_from_file_location("langgraph_app", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["langgraph_app"] = module
    spec.loader.exec_module(module)
    out = module.main(tmp_path / "lg.db", "hash")
    assert len(out["said"]) == 2  # turn 2 resumed turn 1's thread from its checkpoint
    assert out["recalled"] == ["I am allergic to penicillin"]
    assert out["checkpoints"] >= 4


# -- the item table's schema ----------------------------------------------------------------------

OLD_ROWS = [
    # namespace, key, value, created_at, updated_at, expires_at, ttl_minutes, episode_id
    ("u.a", "k1", '{"n":1}', 1e9, 1e9 + 5, None, None, None),
    ("u.a", "k2", '{"n":2}', 1e9, 1e9 + 9, 1e9 + 600, 10.0, None),  # expired at 2e9
    ("u.b", "k3", '{"n":3}', 1e9, 1e9 + 7, 3e9, 10.0, None),
]


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_items_stored_at_schema_2_read_back_after_the_upgrade(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Schema 3 (SQLite: the rows in the primary key's b-tree; both: the expiry index
    partial) keeps every row of schema 2: gets, the order, listings and the TTL sweep."""
    from ctxkeep.integrations.langgraph import _store_items as si

    insert = f"INSERT INTO {si.TABLE} VALUES ({', '.join('?' * len(si.COLUMNS))})"
    if engine == "sqlite":
        import sqlite3
        from contextlib import closing

        from ctxkeep._sqlite import SQLiteClient

        path = tmp_path / "old.db"
        url = f"sqlite:///{path}"
        SQLiteClient(
            str(path), meta_key="langgraph_store", migrations=si.SQLITE_MIGRATIONS[:2]
        ).close()
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.executemany(insert, OLD_ROWS)
    else:
        import psycopg

        from ctxkeep._pg import PgClient

        url = request.getfixturevalue("postgres_schema_factory")()
        PgClient(
            url, name="old", meta_key="langgraph_store", migrations=si.POSTGRES_MIGRATIONS[:2]
        ).close()
        with psycopg.connect(url) as pg:
            pg.cursor().executemany(insert.replace("?", "%s"), OLD_ROWS)
    with CtxkeepStore(url, index=False, clock=lambda: 2e9) as store:
        got = store.batch([GetOp(("u", ns), key) for ns, key in (("a", "k1"), ("b", "k3"))])
        assert [(g.value, g.created_at.timestamp()) for g in got if g is not None] == [
            ({"n": 1}, 1e9),
            ({"n": 3}, 1e9),
        ]
        assert store.get(("u", "a"), "k2") is None  # expired
        assert [i.key for i in store.search(("u",))] == ["k3", "k1"]
        assert store.list_namespaces() == [("u", "a"), ("u", "b")]
        assert store.sweep_ttl() == 1
        store.put(("u", "a"), "k1", {"n": 10}, ttl=1)
        assert store.get(("u", "a"), "k1").created_at.timestamp() == 1e9  # type: ignore[union-attr]
        items = store._items
        assert isinstance(items, si.SQLItems)
        if engine == "sqlite":
            schema = dict(
                items._db.q(
                    "read the schema", "SELECT name, sql FROM sqlite_schema WHERE sql IS NOT NULL"
                )
            )
            assert schema[si.TABLE].rstrip().endswith("WITHOUT ROWID")
        else:
            schema = dict(
                items._db.q(
                    "read the schema",
                    "SELECT indexname, indexdef FROM pg_indexes "
                    "WHERE schemaname = current_schema()",
                )
            )
        assert "WHERE" in schema[f"{si.TABLE}_expiry"]
        assert f"{si.TABLE}_order" in schema

"""CtxkeepStore's operations cost what they return (issue 26): the item table orders and
pages a search, rows are built only for the page (and a query's hits), on every backend the
same order; a batch of puts reads and writes its rows in bulk.

Speed itself is measured in ``bench/peers.py``; here, what makes it: how many rows a search
builds, and that the engine's order is Python's (code points, not the locale).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph")

from langgraph.store.base import GetOp, PutOp

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.integrations.langgraph import CtxkeepStore, _store_items

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

SQL_KINDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
KINDS = ["memory", *SQL_KINDS]
KEYS = ["b", "B", "a", "Z", "é", "e", "ä", "10", "9", "a b", "a-b", "_"]
"""Keys whose locale order differs from their code point order."""


def _store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> CtxkeepStore:
    if kind == "memory":
        url = "memory://"
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path}/store-{uuid.uuid4().hex[:8]}.db"
    else:
        url = str(request.getfixturevalue("postgres_schema_factory")())
    return CtxkeepStore(url, embedder="hash", index={"fields": ["text"]}, clock=lambda: 1e9)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CtxkeepStore]:
    made = _store(request.param, request, tmp_path)
    yield made
    made.close()


def _fill(store: CtxkeepStore) -> None:
    """Every key in two namespaces, in one batch (one ``updated_at``: the order is by
    namespace and key), plus items outside the searched prefix."""
    ops = [
        PutOp(ns, key, {"text": f"fact {key}", "even": i % 2 == 0})
        for ns in (("u", "x"), ("u", "X"))
        for i, key in enumerate(KEYS)
    ]
    ops += [PutOp(("v",), key, {"text": key, "even": True}) for key in KEYS]
    store.batch(ops)


@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_a_search_without_a_query_orders_ties_by_code_point(store: CtxkeepStore) -> None:
    _fill(store)
    found = [(i.namespace, i.key) for i in store.search(("u",), limit=100)]
    assert found == sorted((ns, key) for ns in (("u", "x"), ("u", "X")) for key in KEYS)


@pytest.mark.parametrize("store", KINDS, indirect=True)
@pytest.mark.parametrize("flt", [None, {"even": True}])
def test_search_pages_cover_the_whole_order_once(
    store: CtxkeepStore, flt: dict[str, Any] | None
) -> None:
    _fill(store)
    whole = [(i.namespace, i.key) for i in store.search(("u",), filter=flt, limit=100)]
    pages = [
        (i.namespace, i.key)
        for offset in range(0, len(whole) + 5, 5)
        for i in store.search(("u",), filter=flt, limit=5, offset=offset)
    ]
    assert pages == whole
    assert len(whole) == (len(KEYS) if flt else 2 * len(KEYS))


@pytest.mark.parametrize("store", SQL_KINDS, indirect=True)
@pytest.mark.parametrize("flt", [None, {"even": True}])
def test_a_search_without_a_query_builds_rows_only_for_its_page(
    store: CtxkeepStore, flt: dict[str, Any] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store)
    built = 0
    row = _store_items._row

    def counted(values: Any) -> _store_items.Row:
        nonlocal built
        built += 1
        return row(values)

    monkeypatch.setattr(_store_items, "_row", counted)
    assert len(store.search(("u",), filter=flt, limit=3, offset=2)) == 3
    assert built == 3


@pytest.mark.parametrize("store", SQL_KINDS, indirect=True)
def test_a_search_with_a_query_builds_rows_only_for_its_hits_and_its_page(
    store: CtxkeepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store)
    built = 0
    row = _store_items._row

    def counted(values: Any) -> _store_items.Row:
        nonlocal built
        built += 1
        return row(values)

    monkeypatch.setattr(_store_items, "_row", counted)
    found = store.search(("u",), query="fact ä", limit=3)
    assert len(found) == 3
    assert built <= 3 + 3  # the hits, then the first 3 of the order for the rest


@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_a_batch_over_more_keys_than_a_chunk_keeps_each_created_at(
    store: CtxkeepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_items, "CHUNK", 7)
    keys = [f"k{i}" for i in range(30)]
    store.batch([PutOp(("c",), key, {"text": key}, index=False) for key in keys])
    store.clock = lambda: 2e9
    store.batch(
        [PutOp(("c",), key, {"text": key + "!"}, index=False) for key in keys[:20]]
        + [PutOp(("c",), key, None) for key in keys[20:25]]
        + [PutOp(("c",), "k0", {"text": "last"}, index=False)]
    )
    found = {i.key: i for i in store.search(("c",), limit=100)}
    assert sorted(found) == sorted(keys[:20] + keys[25:])
    assert found["k0"].value == {"text": "last"}
    assert found["k1"].value == {"text": "k1!"}
    assert all(i.created_at.timestamp() == 1e9 for i in found.values())
    assert {k for k, i in found.items() if i.updated_at.timestamp() == 2e9} == set(keys[:20])


@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_gets_over_more_keys_than_a_chunk_find_each_once(
    store: CtxkeepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_store_items, "CHUNK", 7)
    keys = [f"k{i}" for i in range(30)]
    store.batch([PutOp(("c",), key, {"text": key}, index=False) for key in keys])
    asked = [*keys, "k3", "missing", "k29"]
    got = store.batch([GetOp(("c",), key) for key in asked])
    assert [g.value if g is not None else None for g in got] == [
        {"text": key} if key != "missing" else None for key in asked
    ]

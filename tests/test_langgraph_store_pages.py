"""CtxkeepStore's operations cost what they return (issue 26): the item table orders and
pages a search, rows are built only for the page (and a query's hits), on every backend the
same order; a batch of puts reads and writes its rows in bulk.

Speed itself is measured in ``bench/peers.py``; here, what makes it: how many rows a search
builds, and that the engine's order is Python's (code points, not the locale).
"""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("langgraph")

from langgraph.store.base import GetOp, PutOp

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import postgres as episodic_pg
from ctxkeep.integrations.langgraph import CtxkeepStore, _store_items
from ctxkeep.integrations.langgraph._store_filters import matches_filter, sql_filter

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
    monkeypatch.setattr(_store_items, "ROWS_PER_INSERT", 6)  # SQLite: 5 inserts, then 4
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


def test_a_sqlite_batch_takes_as_many_rows_an_insert_as_the_parameter_limit_allows(
    tmp_path: Path,
) -> None:
    import sqlite3

    with CtxkeepStore(f"sqlite:///{tmp_path}/s.db", index=False) as store:
        items = store._items
        assert isinstance(items, _store_items.SQLItems)
        conn = items._db.conn()  # type: ignore[attr-defined]
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 20)  # two rows an insert
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        store.batch([PutOp(("c",), f"k{i}", {"i": i}) for i in range(5)])
        conn.set_trace_callback(None)
        inserts = [sql for sql in seen if sql.startswith("INSERT")]
        assert [sql.count("), (") + 1 for sql in inserts] == [2, 2, 1]
        assert [i.value for i in store.search(("c",), limit=10)] == [{"i": i} for i in range(5)]


@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_the_rows_a_batch_writes_are_plain_tuples_the_collector_stops_tracking(
    store: CtxkeepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a named tuple stays tracked for ever: a batch's rows then counted towards a full
    # collection of every object of the process
    written: list[Any] = []
    write = store._items.write

    def spy(puts: Any, now: float, conn: Any = None) -> list[Any]:
        written.extend(row for row in puts.values() if row is not None)
        return write(puts, now, conn)

    monkeypatch.setattr(store._items, "write", spy)
    forgetting = getattr(store._items, "write_forgetting", None)
    if forgetting is not None:  # PostgreSQL with an index: the rows and the forgetting

        def spy_forgetting(puts: Any, now: float, conn: Any, forgets: Any) -> Any:
            written.extend(row for row in puts.values() if row is not None)
            return forgetting(puts, now, conn, forgets)

        monkeypatch.setattr(store._items, "write_forgetting", spy_forgetting)
    store.batch([PutOp(("c",), f"k{i}", {"text": f"fact {i}"}, ttl=i or None) for i in range(6)])
    store.batch([PutOp(("c",), f"k{i}", {"text": f"fact {i}!"}) for i in range(3)])
    gc.collect()
    assert len(written) == 9
    assert not any(gc.is_tracked(row) for row in written)
    assert [i.value["text"] for i in store.search(("c",), limit=3)] == [
        f"fact {i}!" for i in range(3)
    ]


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


@pytest.mark.postgres
def test_a_bulk_load_on_postgresql_leaves_the_table_analyzed(
    postgres_schema_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filtered search right after a bulk load walks the order's index only if the planner
    has statistics (see ``_store_items.ANALYZE_AFTER``); ``reltuples`` is -1 until a table
    is first analyzed (PostgreSQL 14+)."""
    monkeypatch.setattr(_store_items, "ANALYZE_AFTER", 50)
    with CtxkeepStore(postgres_schema_factory(), index=False) as store:
        items = store._items
        assert isinstance(items, _store_items.SQLItems)

        def estimated_rows() -> float:
            sql = f"SELECT reltuples FROM pg_class WHERE oid = '{_store_items.TABLE}'::regclass"
            return float(items._db.q("read the estimate", sql)[0][0])

        store.batch([PutOp(("a",), f"k{i}", {"n": i}) for i in range(49)])
        assert estimated_rows() < 0
        store.batch([PutOp(("b",), f"k{i}", {"n": i}) for i in range(50)])
        assert estimated_rows() == 99
        found = store.search(("b",), filter={"n": 7})
        assert [i.key for i in found] == ["k7"]


@pytest.mark.postgres
def test_a_bulk_load_on_postgresql_leaves_the_window_documents_analyzed(
    postgres_schema_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search's lexical candidates come from the query's informative terms, which the
    statistics of the episodes' window documents tell (see ``_db.ANALYZE_AFTER``): a bulk
    load of items leaves them analyzed, and the store's searches read them at once, not
    after ``TERM_STATS_SECONDS``."""
    monkeypatch.setattr(episodic_pg, "ANALYZE_AFTER", 50)
    with CtxkeepStore(postgres_schema_factory(), embedder="hash") as store:
        episodic = store._episodic
        assert isinstance(episodic, episodic_pg.PostgresEpisodicStore)

        def estimated_rows() -> float:
            sql = f"SELECT reltuples FROM pg_class WHERE oid = '{episodic_pg.TEXT_TABLE}'::regclass"
            return float(episodic.db.q("read the estimate", sql)[0][0])

        store.batch([PutOp(("a",), f"k{i}", {"text": f"note {i}"}) for i in range(49)])
        assert estimated_rows() < 0
        assert store.search(("a",), query="note seal", limit=1)  # term statistics read: none
        store.batch([PutOp(("b",), f"k{i}", {"text": f"note {i} seal"}) for i in range(50)])
        assert estimated_rows() == 99
        stats = episodic._term_stats()  # not the "none yet" the first search read
        assert stats is not None
        share, episodes = stats
        assert episodes == 99
        assert share["seal"] == pytest.approx(50 / 99, abs=1e-3)


# -- filters the engine applies: exactly Python's matches_filter -------------------------------

FILTER_VALUES: list[dict[str, Any]] = [
    {"a": 1},
    {"a": 1.0},
    {"a": True},
    {"a": False},
    {"a": 0},
    {"a": -3},
    {"a": 2.5},
    {"a": 2**62},
    {"a": "1"},
    {"a": "b"},
    {"a": "B"},
    {"a": "é"},
    {"a": "10"},
    {"a": "9"},
    {"a": None},
    {},
    {"a": [1]},
    {"a": {"x": 1}},
    {"k.dot": "x", "a": 1},
    {'we"ird': 1},
]
"""Values whose JSON types and orders differ from SQL's (1 and 1.0, true and 1, "10" and
"9", a missing key and null, keys SQLite's paths must quote)."""

FILTERS: list[dict[str, Any]] = [
    {"a": 1},
    {"a": 1.0},
    {"a": True},
    {"a": False},
    {"a": 0},
    {"a": None},
    {"a": "1"},
    {"a": 2**62},
    {"a": {"$eq": "b"}},
    {"a": {"$ne": 1}},
    {"a": {"$ne": None}},
    {"a": {"$ne": "b"}},
    {"a": {"$gt": 1}},
    {"a": {"$gte": 1}},
    {"a": {"$gt": 0, "$lt": 3}},
    {"a": {"$lt": "c"}},
    {"a": {"$lte": "B"}},
    {"a": {"$gt": "9"}},
    {"k.dot": "x"},
    {"missing": None},
    {"a": 1, "missing": None},
    {'we"ird': 1},
    {"a": [1]},
    {"a": {"x": 1}},
]


@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_a_filtered_search_keeps_exactly_what_matches_filter_accepts(store: CtxkeepStore) -> None:
    store.batch(
        [PutOp(("f",), f"v{i}", value, index=False) for i, value in enumerate(FILTER_VALUES)]
    )
    for flt in FILTERS:
        want = sorted(f"v{i}" for i, v in enumerate(FILTER_VALUES) if matches_filter(v, flt))
        got = sorted(i.key for i in store.search(("f",), filter=flt, limit=100))
        assert got == want, flt
        page = [i.key for i in store.search(("f",), filter=flt, limit=2, offset=1)]
        whole = [i.key for i in store.search(("f",), filter=flt, limit=100)]
        assert page == whole[1:3], flt


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_scalar_filters_are_written_in_sql_the_rest_left_to_python(engine: Any) -> None:
    for flt in FILTERS[:18]:
        assert sql_filter(flt, engine) is not None, flt
    assert sql_filter({"a": [1]}, engine) is None
    assert sql_filter({"a": {"x": 1}}, engine) is None
    assert (sql_filter({'we"ird': 1}, engine) is None) == (engine == "sqlite")


# -- recall: the whole store first, then the scope alone ----------------------------------------


@pytest.mark.parametrize("store", KINDS, indirect=True)
@pytest.mark.parametrize("exact_scope", [1000, 1])
def test_recall_returns_only_current_items_of_the_scope_however_deep_it_looks(
    store: CtxkeepStore, exact_scope: int
) -> None:
    """The searched namespace holds 3 items; 60 elsewhere, an episode of another user of the
    episodic store and an item's replaced text all match the query better. The store-wide
    searches find none of the scope, the search within it (by episode ids, or with
    ``exact_scope=1`` by namespaces) finds all three."""
    store.exact_scope = exact_scope
    store.batch(
        [PutOp(("other",), f"o{i}", {"text": f"orchid lobby flowers {i}"}) for i in range(60)]
    )
    store.batch([PutOp(("mine", "a"), f"m{i}", {"text": f"orchid note {i}"}) for i in range(3)])
    store.put(("mine", "a"), "m0", {"text": "orchid lobby flowers, replaced"})
    store.put(("mine", "a"), "m0", {"text": "orchid note 0"})
    store.episodic.save_episode("someone", "", "orchid lobby flowers", agent_id="someone")
    found = store.search(("mine",), query="orchid lobby flowers", limit=5)
    assert sorted(i.key for i in found) == ["m0", "m1", "m2"]
    assert all(i.score is not None and i.value["text"].startswith("orchid note") for i in found)
    assert [
        i.key for i in store.search(("mine",), query="orchid", filter={"text": "orchid note 1"})
    ] == ["m1"]


def test_memory_pages_read_only_the_head_of_the_order_kept_through_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1e9]
    store = CtxkeepStore("memory://", index=False, clock=lambda: now[0])
    try:
        for i in range(300):
            now[0] += 1
            store.put(("u", f"n{i % 3}"), f"k{i}", {"i": i, "even": i % 2 == 0}, ttl=None)
        for i in range(0, 300, 7):  # rewrites move a row to the head, deletes drop it
            now[0] += 1
            if i % 2:
                store.delete(("u", f"n{i % 3}"), f"k{i}")
            else:
                store.put(("u", f"n{i % 3}"), f"k{i}", {"i": i, "even": True, "again": 1})
        store.put(("u", "n0"), "short", {"even": True}, ttl=1)  # minutes
        now[0] += 120
        assert store.sweep_ttl() == 1
        items = store._items
        assert isinstance(items, _store_items.MemoryItems)
        rows = sorted(items._rows.values(), key=lambda r: (-r.updated_at, r.namespace, r.key))
        assert [(ns, key) for _, ns, key in items.newest_first()] == [r.address for r in rows]
        calls = 0

        def counted(value: Any, flt: Any) -> bool:
            nonlocal calls
            calls += 1
            return matches_filter(value, flt)

        monkeypatch.setattr(_store_items, "matches_filter", counted)
        page = store.search(("u",), filter={"even": True}, limit=5, offset=5)
        expected = [r.key for r in rows if r.value and '"even":true' in r.value.replace(" ", "")]
        assert [i.key for i in page] == expected[5:10]
        assert calls <= 25  # the head of the order, not all ~260 rows
    finally:
        store.close()


@pytest.mark.parametrize("bulk", [4, 10_000], ids=["rebuilt", "row-by-row"])
def test_memory_batches_keep_the_order_whether_rebuilt_or_edited(
    monkeypatch: pytest.MonkeyPatch, bulk: int
) -> None:
    monkeypatch.setattr(_store_items, "BULK_ORDER", bulk)
    now = [1e9]
    with CtxkeepStore("memory://", index=False, clock=lambda: now[0]) as store:
        store.batch([PutOp(("u", f"n{i % 3}"), f"k{i}", {"i": i}) for i in range(40)])
        now[0] += 1
        store.batch(
            [PutOp(("u", f"n{i % 3}"), f"k{i}", {"i": -i}) for i in range(0, 40, 3)]
            + [PutOp(("u", f"n{i % 3}"), f"k{i}", None) for i in range(1, 40, 5)]
            + [PutOp(("v",), f"k{i}", {"i": i}) for i in range(6)]
        )
        items = store._items
        assert isinstance(items, _store_items.MemoryItems)
        row = _store_items.Row
        # rows of a time a run already holds (the last one), then of an earlier time
        items.write({("v", f"k{i}"): row("v", f"k{i}", "{}", 1, now[0]) for i in range(5)}, now[0])
        items.write({("w", f"k{i}"): row("w", f"k{i}", "{}", 1, now[0] - 1) for i in range(7)}, 0)
        rows = sorted(items._rows.values(), key=lambda r: (-r.updated_at, r.namespace, r.key))
        assert [(ns, key) for _, ns, key in items.newest_first()] == [r.address for r in rows]
        assert len(rows) == 40 - 8 + 6 + 7


SPACES = [("u", "n0"), ("u", "n1"), ("u", "n0", "x"), ("v",)]
"""Namespaces of the random writes below: one below another, one beside."""


@pytest.mark.parametrize("bulk", [2, 10_000], ids=["rebuilt", "row-by-row"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.integers(-1, 2),  # how the clock moves (back, stays, on)
            st.lists(
                st.tuples(st.integers(0, 11), st.booleans(), st.sampled_from([None, 1])),
                max_size=9,
            ),
        ),
        max_size=14,
    ),
    sweep=st.booleans(),
)
def test_memory_order_is_the_sorted_rows_after_any_writes(
    bulk: int, steps: list[tuple[int, list[tuple[int, bool, int | None]]]], sweep: bool
) -> None:
    """Runs of the ``memory://`` order, through puts, replacements, deletes (a few or a whole
    run, one by one or rebuilt), clocks that stay or move back and sweeps: always every row,
    newest first, ties by namespace then key, and a page of every prefix (each started at
    its bound) is the head of its rows.
    """
    old = _store_items.BULK_ORDER
    _store_items.BULK_ORDER = bulk  # not monkeypatch: a fixture is not reset between examples
    try:
        now = [1e9]
        with CtxkeepStore("memory://", index=False, clock=lambda: now[0]) as store:
            for move, puts in steps:
                now[0] += move
                ops = {
                    f"k{i}": PutOp(SPACES[i % 4], f"k{i}", None if gone else {"i": i}, ttl=ttl)
                    for i, gone, ttl in puts
                }
                store.batch(list(ops.values()))
            if sweep:
                now[0] += 120
                store.sweep_ttl()
            items = store._items
            assert isinstance(items, _store_items.MemoryItems)
            rows = sorted(items._rows.values(), key=lambda r: (-r.updated_at, r.namespace, r.key))
            assert [(ns, key) for _, ns, key in items.newest_first()] == [r.address for r in rows]
            live = [r for r in rows if r.live(now[0])]
            for prefix in [(), ("u",), ("u", "n0"), ("u", "n1"), ("v",), ("w",)]:
                under = [
                    (tuple(r.namespace.split(".")), r.key)
                    for r in live
                    if tuple(r.namespace.split("."))[: len(prefix)] == prefix
                ]
                found = store.search(prefix, limit=5, offset=2)
                assert [(i.namespace, i.key) for i in found] == under[2:7]
            assert items._empty == sum(not run for run in items._runs)
    finally:
        _store_items.BULK_ORDER = old


@pytest.mark.parametrize("store", KINDS, indirect=True)
def test_a_prefix_takes_its_namespace_and_those_below_it_only(store: CtxkeepStore) -> None:
    spaces = [("u",), ("u", "x"), ("u", "x", "é"), ("u-x",), ("u/",), ("u/x",), ("u0",)]
    spaces += [("ux",), ("t",), ("v", "u"), ("u\U0001f600",), ("uu", "u")]
    for ns in spaces:
        store.put(ns, "k", {"text": "x"})
    found = {i.namespace for i in store.search(("u",), limit=100)}
    assert found == {("u",), ("u", "x"), ("u", "x", "é")}
    found = {i.namespace for i in store.search(("u", "x"), limit=100)}
    assert found == {("u", "x"), ("u", "x", "é")}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["u", "u.x", "v"]), st.text(max_size=3), st.integers()),
        unique_by=lambda e: e[:2],
    ),
    st.booleans(),
)
def test_entries_sort_by_address_whether_one_namespace_or_several(
    entries: list[tuple[str, str, int]], one: bool
) -> None:
    """``_sort_addressed`` (by key alone when every entry has one namespace) gives the order
    ``sorted`` gives: by namespace, then key, in code points."""
    if one:
        entries = list({key: ("u", key, n) for _, key, n in entries}.values())
    got = list(entries)
    _store_items._sort_addressed(got)
    assert got == sorted(entries)

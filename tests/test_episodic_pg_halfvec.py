"""Episodic PostgreSQL keeps its vectors as ``halfvec`` in a new table (two bytes a dimension,
where ``vector`` takes four), and a table an older ctxkeep made with ``vector`` opens, saves
and searches as it is."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import open_episodic
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.postgres import PostgresEpisodicStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres

FACTS = [
    "the deploy key rotates every Tuesday",
    "penguins live in the southern hemisphere",
    "the billing service is owned by the Kestrel team",
]


def _column_type(store: PostgresEpisodicStore) -> str:
    rows = store.db.q(
        "read the column's type",
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'ctxkeep_episodes'::regclass AND attname = 'embedding'",
    )
    return str(rows[0][0])


def _save_and_search(store: PostgresEpisodicStore) -> None:
    store.save_episodes(
        [{"session_id": f"s{i}", "task_goal": "", "summary": f} for i, f in enumerate(FACTS)]
    )
    for fact in FACTS:
        assert store.search(fact, 1)[0].episode.summary == fact


def test_a_new_table_keeps_halfvec_vectors_with_a_halfvec_index(
    postgres_schema_factory: Callable[[], str],
) -> None:
    store = open_episodic(postgres_schema_factory(), "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        dim = store.embedder.dim
        assert _column_type(store) == f"halfvec({dim})"
        index = store.db.q(
            "read the index", "SELECT pg_get_indexdef('ctxkeep_episodes_hnsw'::regclass)"
        )
        assert "halfvec_cosine_ops" in index[0][0]
        _save_and_search(store)
        # the cosines the store computes are the exact ones within float16's precision
        q = store.embedder.embed_query(FACTS[0])
        exact = store.embedder.embed_documents(FACTS) @ q
        scores = store._dense(q, store._rows(EpisodeFilter.parse(None)))
        assert scores == pytest.approx(exact, abs=2e-3)
    finally:
        store.close()


def test_a_table_an_older_ctxkeep_made_with_vector_keeps_it(
    postgres_schema_factory: Callable[[], str],
) -> None:
    url = postgres_schema_factory()
    store = open_episodic(url, "hash")
    assert isinstance(store, PostgresEpisodicStore)
    dim = store.embedder.dim
    with store.db.tx("make the table as an older ctxkeep did") as conn:
        conn.execute("DROP INDEX ctxkeep_episodes_hnsw")
        conn.execute(
            f"ALTER TABLE ctxkeep_episodes ALTER COLUMN embedding TYPE vector({dim}) "
            f"USING embedding::vector({dim})"
        )
        conn.execute(
            "CREATE INDEX ctxkeep_episodes_hnsw ON ctxkeep_episodes "
            "USING hnsw (embedding vector_cosine_ops)"
        )
    store.close()
    store = open_episodic(url, "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        _save_and_search(store)
        assert _column_type(store) == f"vector({dim})"
        vectors = store._vectors(store._rows(EpisodeFilter.parse(None)))
        assert vectors.shape == (len(FACTS), dim)
    finally:
        store.close()


def test_the_recall_bench_converts_a_store_between_the_types_and_it_still_finds(
    postgres_schema_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench/store_recall.py --pg-types``: the column and its index change type, the same
    vectors stay, and the store opened again searches on them."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import store_recall

    url = postgres_schema_factory()
    store = open_episodic(url, "hash")
    assert isinstance(store, PostgresEpisodicStore)
    dim = store.embedder.dim
    _save_and_search(store)
    store.close()
    for vtype in ("vector", "halfvec"):
        store_recall.convert(url, vtype)
        store = open_episodic(url, "hash")
        try:
            assert isinstance(store, PostgresEpisodicStore)
            assert _column_type(store) == f"{vtype}({dim})"
            index = store.db.q(
                "read the index", "SELECT pg_get_indexdef('ctxkeep_episodes_hnsw'::regclass)"
            )
            assert f"{vtype}_cosine_ops" in index[0][0]
            for fact in FACTS:
                assert store.search(fact, 1)[0].episode.summary == fact
        finally:
            store.close()

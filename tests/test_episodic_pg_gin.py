"""Episodic PostgreSQL's full-text index: its pending list is held small (every search reads
all of it: 244 pages after a load of 10,000 episodes made a search 16 ms, not 4-7), and the
window documents live in a narrow table of their own (schema 4), upgraded from the column of
the episodes' table they were in."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import open_episodic
from ctxkeep.episodic.postgres import GIN_PENDING_LIST_KB, PostgresEpisodicStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres


def _options(store: PostgresEpisodicStore) -> list[str]:
    rows = store.db.q(
        "read the index options",
        "SELECT reloptions FROM pg_class WHERE oid = 'ctxkeep_episode_terms_body'::regclass",
    )
    return list(rows[0][0] or [])


def test_the_full_text_index_keeps_a_small_pending_list(
    postgres_schema_factory: Callable[[], str],
) -> None:
    store = open_episodic(postgres_schema_factory(), "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        assert f"gin_pending_list_limit={GIN_PENDING_LIST_KB}" in _options(store)
        store.save_episodes(
            [
                {"session_id": f"s{i}", "task_goal": "", "summary": f"fact {i} about penguins"}
                for i in range(300)
            ]
        )
        matching = store.db.q(
            "count the matches",
            "SELECT count(*) FROM ctxkeep_episode_terms "
            "WHERE body @@ to_tsquery('simple', 'penguin')",
        )
        assert matching[0][0] == 300
        assert [h.episode.summary for h in store.search("fact 7 penguins", 1)] == [
            "fact 7 about penguins"
        ]
    finally:
        store.close()


def _columns(store: PostgresEpisodicStore, table: str) -> set[str]:
    rows = store.db.q(
        "read the columns",
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
        "AND NOT attisdropped",
        (table,),
    )
    return {r[0] for r in rows}


def test_a_database_of_schema_2_is_upgraded(
    postgres_schema_factory: Callable[[], str],
) -> None:
    url = postgres_schema_factory()
    store = open_episodic(url, "hash")
    assert isinstance(store, PostgresEpisodicStore)
    store.save_episodes(
        [
            {"session_id": "s", "task_goal": "", "summary": "kept across the upgrade"},
            {"session_id": "s", "task_goal": "", "summary": "a penguin beside it"},
        ]
    )
    penguins = (
        "SELECT count(*) FROM ctxkeep_episode_terms WHERE body @@ to_tsquery('simple', 'penguin')"
    )
    before = store.db.q("count the matches", penguins)
    assert before[0][0] >= 1
    with store.db.tx("go back to version 2") as conn:
        # schema 2: the window documents in the episodes' own body column, its index's
        # pending list at PostgreSQL's default
        conn.execute("ALTER TABLE ctxkeep_episodes ADD COLUMN body TSVECTOR NOT NULL DEFAULT ''")
        conn.execute(
            "UPDATE ctxkeep_episodes e SET body = t.body FROM ctxkeep_episode_terms t "
            "WHERE t.row = e.row"
        )
        conn.execute("DROP TABLE ctxkeep_episode_terms")
        conn.execute("CREATE INDEX ctxkeep_episodes_body ON ctxkeep_episodes USING gin (body)")
        conn.execute("UPDATE ctxkeep_meta SET value = '2' WHERE key = 'episodic'")
    store.close()
    again = open_episodic(url, "hash")
    try:
        assert isinstance(again, PostgresEpisodicStore)
        assert f"gin_pending_list_limit={GIN_PENDING_LIST_KB}" in _options(again)
        assert "body" not in _columns(again, "ctxkeep_episodes")
        assert _columns(again, "ctxkeep_episode_terms") == {"row", "body"}
        assert again.search_relevant_context("upgrade", 1) == ["kept across the upgrade"]
        assert again.search_relevant_context("penguin", 1) == ["a penguin beside it"]
        # the documents came across (a window holds its neighbours' words too)
        assert again.db.q("count the matches", penguins) == before
    finally:
        again.close()


def test_forgetting_an_episode_removes_its_document(
    postgres_schema_factory: Callable[[], str],
) -> None:
    store = open_episodic(postgres_schema_factory(), "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        ids = store.save_episodes(
            [{"session_id": "s", "task_goal": "", "summary": f"walrus {i}"} for i in range(3)]
        )
        store.forget(episode_id=ids[0])
        rows = store.db.q("count the documents", "SELECT count(*) FROM ctxkeep_episode_terms")
        assert rows == [(2,)]
        assert {h.episode.summary for h in store.search("walrus", 5)} == {"walrus 1", "walrus 2"}
    finally:
        store.close()

"""Episodic PostgreSQL: the full-text index's pending list is held small (every search reads
all of it: 244 pages after a load of 10,000 episodes made a search 16 ms, not 4-7)."""

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
        "SELECT reloptions FROM pg_class WHERE oid = 'ctxkeep_episodes_body'::regclass",
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
            "SELECT count(*) FROM ctxkeep_episodes WHERE body @@ to_tsquery('simple', 'penguin')",
        )
        assert matching[0][0] == 300
        assert [h.episode.summary for h in store.search("fact 7 penguins", 1)] == [
            "fact 7 about penguins"
        ]
    finally:
        store.close()


def test_a_database_of_the_previous_schema_is_upgraded(
    postgres_schema_factory: Callable[[], str],
) -> None:
    url = postgres_schema_factory()
    store = open_episodic(url, "hash")
    assert isinstance(store, PostgresEpisodicStore)
    store.save_episode("s", "", "kept across the upgrade")
    with store.db.tx("go back to version 2") as conn:
        conn.execute("ALTER INDEX ctxkeep_episodes_body RESET (gin_pending_list_limit)")
        conn.execute("UPDATE ctxkeep_meta SET value = '2' WHERE key = 'episodic'")
    store.close()
    again = open_episodic(url, "hash")
    try:
        assert isinstance(again, PostgresEpisodicStore)
        assert f"gin_pending_list_limit={GIN_PENDING_LIST_KB}" in _options(again)
        assert again.search_relevant_context("upgrade", 1) == ["kept across the upgrade"]
    finally:
        again.close()


def test_lexical_candidates_come_from_the_informative_terms(
    postgres_schema_factory: Callable[[], str],
) -> None:
    """A term in more than 1,000 episodes (and 1% of them) finds no candidates once the table
    has statistics, as in every ctxkeep store; it still scores them, and a query of common
    terms alone still finds by its rarest."""
    store = open_episodic(postgres_schema_factory(), "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        store.save_episodes(
            [
                {
                    "session_id": f"s{i}",
                    "task_goal": "",
                    "summary": f"penguin note {i}" + (" walrus" if i % 400 == 0 else ""),
                }
                for i in range(1_200)
            ]
        )
        # no statistics yet: every term finds candidates
        assert store._informative(["penguin", "walrus"]) == ["penguin", "walrus"]
        with store.db.tx("analyse") as conn:
            conn.execute("ANALYZE ctxkeep_episodes")
        store._stats = None  # read them again now
        assert store._informative(["penguin", "walrus"]) == ["walrus"]
        assert store._informative(["penguin"]) == ["penguin"]
        assert store._informative(["penguin", "note"]) == ["penguin", "note"]  # two rarest
        hits = store.search("penguin walrus", 3)
        assert sorted(h.episode.summary for h in hits) == [
            "penguin note 0 walrus",
            "penguin note 400 walrus",
            "penguin note 800 walrus",
        ]
        assert all(h.lexical > 0 for h in hits)
        assert len(store.search("penguin note", 5)) == 5
    finally:
        store.close()

"""Episodic PostgreSQL: the window documents in a table of their own, whose full-text index
keeps a small pending list (every search reads all of it: 244 pages after a load of 10,000
episodes made a search 16 ms, not 4-7)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep._db import ANALYZE_AFTER
from ctxkeep.episodic import open_episodic
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.postgres import GIN_PENDING_LIST_KB, TEXT_TABLE, PostgresEpisodicStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres


def _options(store: PostgresEpisodicStore) -> list[str]:
    rows = store.db.q(
        "read the index options",
        f"SELECT reloptions FROM pg_class WHERE oid = '{TEXT_TABLE}_body'::regclass",
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
            f"SELECT count(*) FROM {TEXT_TABLE} WHERE body @@ to_tsquery('simple', 'penguin')",
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
    store.save_episodes(
        [{"session_id": w, "task_goal": "", "summary": f"kept {w}"} for w in ("walrus", "seal")]
    )
    with store.db.tx("go back to version 2") as conn:
        # the documents in the episodes' table, their index's pending list the default
        conn.execute(
            "ALTER TABLE ctxkeep_episodes ADD COLUMN body TSVECTOR NOT NULL DEFAULT ''::tsvector"
        )
        conn.execute(
            f"UPDATE ctxkeep_episodes e SET body = t.body FROM {TEXT_TABLE} t WHERE t.row = e.row"
        )
        conn.execute(f"DROP TABLE {TEXT_TABLE}")
        conn.execute("CREATE INDEX ctxkeep_episodes_body ON ctxkeep_episodes USING gin (body)")
        # every content key unique and NOT NULL
        conn.execute("DROP INDEX ctxkeep_episodes_content_key")
        conn.execute("ALTER TABLE ctxkeep_episodes ALTER COLUMN content_key SET NOT NULL")
        conn.execute("ALTER TABLE ctxkeep_episodes ALTER COLUMN tokens SET NOT NULL")
        conn.execute(
            "ALTER TABLE ctxkeep_episodes "
            "ADD CONSTRAINT ctxkeep_episodes_content_key_key UNIQUE (content_key)"
        )
        conn.execute("UPDATE ctxkeep_meta SET value = '2' WHERE key = 'episodic'")
    store.close()
    again = open_episodic(url, "hash")
    try:
        assert isinstance(again, PostgresEpisodicStore)
        assert f"gin_pending_list_limit={GIN_PENDING_LIST_KB}" in _options(again)
        columns = again.db.q(
            "read the columns",
            "SELECT attname FROM pg_attribute WHERE attrelid = 'ctxkeep_episodes'::regclass "
            "AND attnum > 0 AND NOT attisdropped",
        )
        assert "body" not in {c for (c,) in columns}
        index = again.db.q(
            "read the keys' index",
            "SELECT pg_get_indexdef('ctxkeep_episodes_content_key'::regclass)",
        )
        assert index[0][0].endswith("(content_key) WHERE (content_key IS NOT NULL)")
        # the stored episodes keep their keys: a save of one is a duplicate
        assert (
            again.save_episode("walrus", "", "kept walrus")
            == again.search("kept walrus", 1)[0].episode.episode_id
        )
        # each window document moved with its row: the lexical side finds each episode
        rows = again._rows(EpisodeFilter())
        for w in ("walrus", "seal"):
            assert int((again._lexical([w], rows) > 0).sum()) == 1
        again.save_episode("new", "", "narwhal saved after the upgrade")
        assert again.search_relevant_context("walrus", 1) == ["kept walrus"]
        assert again.search_relevant_context("narwhal", 1) == ["narwhal saved after the upgrade"]
    finally:
        again.close()


def test_lexical_candidates_come_from_the_informative_terms(
    postgres_schema_factory: Callable[[], str],
) -> None:
    """A term in more than 1,000 episodes (and 1% of them) finds no candidates once the table
    has statistics, as in every ctxkeep store; it still scores them, and a query of common
    terms alone still finds by its rarest. A batch of ``ANALYZE_AFTER`` episodes or more
    analyzes the table in its transaction, so its searches have them at once (autovacuum
    analyzes a new table a minute or more later)."""
    store = open_episodic(postgres_schema_factory(), "hash")

    def notes(lo: int, hi: int) -> list[dict[str, str]]:
        return [
            {
                "session_id": f"s{i}",
                "task_goal": "",
                "summary": f"penguin note {i}" + (" walrus" if i % 400 == 0 else ""),
            }
            for i in range(lo, hi)
        ]

    try:
        assert isinstance(store, PostgresEpisodicStore)
        assert ANALYZE_AFTER == 1_000
        store.save_episodes(notes(0, 200))
        # a batch under ANALYZE_AFTER, no statistics yet: every term finds candidates
        assert store._informative(["penguin", "walrus"]) == ["penguin", "walrus"]
        store.save_episodes(notes(200, 1_200))  # ANALYZE_AFTER of them
        # read again at once, not after TERM_STATS_SECONDS
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

"""Episodic PostgreSQL: the episodes of a batch of new sessions (``CtxkeepStore``'s) keep no
content key nor tokens; every other episode keeps its own key, unique, so a public save finds
duplicates, and a session's windows come out the same either way."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import content_key, open_episodic
from ctxkeep.episodic.postgres import TEXT_TABLE, PostgresEpisodicStore
from ctxkeep.errors import StorageError

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres


def _stored(store: PostgresEpisodicStore) -> dict[str, tuple[str | None, str | None]]:
    """Summary -> the row's content key and tokens."""
    rows = store.db.q(
        "read the rows",
        "SELECT record::jsonb ->> 'summary', content_key, tokens FROM ctxkeep_episodes",
    )
    return {summary: (key, tokens) for summary, key, tokens in rows}


def _windows(store: PostgresEpisodicStore, session: str) -> list[str]:
    rows = store.db.q(
        "read the windows",
        f"SELECT t.body::text FROM ctxkeep_episodes e JOIN {TEXT_TABLE} t USING (row) "
        "WHERE e.session_id = %s ORDER BY e.pos",
        (session,),
    )
    return [body for (body,) in rows]


def test_episodes_of_new_sessions_keep_no_content_key_nor_tokens(
    postgres_schema_factory: Callable[[], str],
) -> None:
    store = open_episodic(postgres_schema_factory(), "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        made = store._save_episodes(
            [{"session_id": f"new-{i}", "task_goal": "", "summary": f"fresh {i}"} for i in (1, 2)],
            new_sessions=True,
        )
        saved = store.save_episodes([{"session_id": "s", "task_goal": "", "summary": "kept"}])
        assert _stored(store) == {
            "fresh 1": (None, None),
            "fresh 2": (None, None),
            "kept": (content_key("s", "", "kept"), "kept"),
        }
        # a public save of a stored episode is found a duplicate by its key, as before
        again = store.save_episodes([{"session_id": "s", "task_goal": "", "summary": "kept"}])
        assert again == saved and store.count() == 3
        # the episodes without a key are found and forgotten by their ids
        assert [h.episode.summary for h in store.search("fresh 2", 1)] == ["fresh 2"]
        store.forget(episode_id=made)
        assert store.count() == 1
        # the keys kept are still unique
        with pytest.raises(StorageError), store.db.tx("insert a duplicate key") as conn:
            conn.execute(
                "INSERT INTO ctxkeep_episodes (episode_id, content_key, session_id, created_at, "
                "pos, record, tokens, embedding) SELECT 'other', content_key, session_id, "
                "created_at, 1, record, tokens, embedding FROM ctxkeep_episodes"
            )
    finally:
        store.close()


def test_a_session_without_tokens_gets_the_windows_of_one_with_them(
    postgres_schema_factory: Callable[[], str],
) -> None:
    """Appending to a session saved without tokens, and forgetting from it, rewrites its
    windows from its episodes' texts: the same windows as a session saved with them."""
    store = open_episodic(postgres_schema_factory(), "hash")
    try:
        assert isinstance(store, PostgresEpisodicStore)
        texts = [("goal a", "walrus tusks"), ("", "seal pups"), ("goal c", "orca pods")]
        first = [{"task_goal": g, "summary": s} for g, s in texts[:2]]
        lean = store._save_episodes([{"session_id": "lean", **e} for e in first], new_sessions=True)
        kept = store.save_episodes([{"session_id": "kept", **e} for e in first])
        lean_rows = store.db.q(
            "count the lean rows",
            "SELECT count(*) FROM ctxkeep_episodes WHERE session_id = 'lean' "
            "AND content_key IS NULL AND tokens IS NULL",
        )
        assert lean_rows == [(2,)]
        assert _windows(store, "lean") == _windows(store, "kept")
        g, s = texts[2]
        store.save_episode("lean", g, s)
        store.save_episode("kept", g, s)
        assert len(_windows(store, "lean")) == 3
        assert _windows(store, "lean") == _windows(store, "kept")
        store.forget(episode_id=[lean[0], kept[0]])
        assert len(_windows(store, "lean")) == 2
        assert _windows(store, "lean") == _windows(store, "kept")
    finally:
        store.close()

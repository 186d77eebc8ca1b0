"""Episodic PostgreSQL finds pgvector in whichever schema the database holds it: an extension
lives in one schema of a database (``public`` where a DBA made it, a host's ``extensions``,
a server's shared schema), and a URL whose ``search_path`` is its own schema alone found no
``vector`` type (``schema setup: type "vector" does not exist``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import open_episodic

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres

FIND = (
    "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
    "WHERE e.extname = 'vector'"
)


def test_a_store_whose_search_path_lacks_pgvector_s_schema_opens_and_searches(
    postgres_url: str, postgres_schema_factory: Callable[[], str]
) -> None:
    import psycopg

    made = None
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        if conn.execute(FIND).fetchone() is None:  # put it where a DBA might
            made = f"ctxkeep_test_ext_{uuid.uuid4().hex[:12]}"
            conn.execute(f"CREATE SCHEMA {made}")
            conn.execute(f"CREATE EXTENSION vector SCHEMA {made}")
        (home,) = conn.execute(FIND).fetchone() or ("",)
    try:
        url = postgres_schema_factory()  # search_path: a new schema, and no other
        assert home not in url
        store = open_episodic(url, embedder="hash")
        try:
            store.save_episodes(
                [
                    {"session_id": "s1", "task_goal": "", "summary": "the deploy key rotates"},
                    {"session_id": "s2", "task_goal": "", "summary": "penguins live south"},
                ]
            )
            hits = store.search("when does the deploy key rotate", top_k=1)
            assert [h.episode.summary for h in hits] == ["the deploy key rotates"]
            assert store.db.search_path is not None and store.db.search_path.endswith(f'"{home}"')
        finally:
            store.close()
        with psycopg.connect(postgres_url, autocommit=True) as conn:  # nothing moved
            assert conn.execute(FIND).fetchone() == (home,)
    finally:
        if made is not None:
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {made} CASCADE")

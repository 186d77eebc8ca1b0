"""CtxkeepStore on PostgreSQL, counted on the wire: how many times an operation waits for the
server (:func:`~_round_trips.pg_waits` of its one pooled connection), a measure of its speed
that does not depend on the machine's load (issue 26: LangGraph's ``PostgresStore`` sends a
put's statements in one pipelined sync)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

from _round_trips import pg_waits, pg_wire
from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.integrations.langgraph import CtxkeepStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(
    postgres_schema_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[CtxkeepStore]:
    # a pool of its own (an application_name of its own) of one connection: the one traced
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    url = postgres_schema_factory() + f"&application_name=rt_{uuid.uuid4().hex[:8]}"
    s = CtxkeepStore(url, embedder="hash", index={"fields": ["text"]})
    s.put(("notes",), "warm", {"text": "the first put prepares the statements"})
    s.search(("notes",), query="first put")
    yield s
    s.close()


def test_a_put_of_a_new_item_waits_twice(store: CtxkeepStore) -> None:
    # once for the row it replaced (none), once for the commit
    with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
        store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    assert pg_waits(lines) == 2, lines
    assert store.get(("notes",), "n1") is not None


def test_a_search_waits_once_its_hits_rows_read_in_its_statement(store: CtxkeepStore) -> None:
    for i in range(5):
        store.put(("notes",), f"n{i}", {"text": f"note {i} about the launch code"})
    store.search(("notes",), query="launch code", limit=3)  # prepares its statement
    with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
        found = store.search(("notes",), query="launch code", limit=3)
    assert pg_waits(lines) == 1, lines
    assert len(found) == 3 and all(f.value["text"].endswith("launch code") for f in found)


def test_a_search_reads_beside_its_hits_the_rows_as_they_are(store: CtxkeepStore) -> None:
    store.put(("codes",), "a", {"text": "the launch code is aardvark", "v": 1})
    store.put(("codes",), "b", {"text": "the launch code is zebra"}, ttl=1.0)
    store.put(("codes",), "a", {"text": "the launch code is aardvark", "v": 2})
    store.put(("other",), "c", {"text": "the launch code is aardvark"})
    found = store.search(("codes",), query="launch code aardvark", limit=5)
    assert [(f.key, f.value.get("v")) for f in found] == [("a", 2), ("b", None)]
    store.clock = lambda: 4e9  # b expired
    assert [f.key for f in store.search(("codes",), query="launch code")] == ["a"]


def test_a_put_the_server_refuses_leaves_nothing_and_no_open_transaction(
    store: CtxkeepStore,
) -> None:
    store.put(("notes",), "n1", {"text": "kept as it was"})
    episodes = store.episodic.count()
    with store._items._db.pool.connection() as conn:  # type: ignore[attr-defined]
        # a refusal in the middle of the pipeline, after the episode's insert
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.value LIKE '%refused%' THEN RAISE EXCEPTION 'refused by a trigger'; "
            "END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON ctxkeep_langgraph_items "
            "FOR EACH ROW EXECUTE FUNCTION refuse()"
        )
    with pytest.raises(Exception, match="refused by a trigger"):
        store.put(("notes",), "n1", {"text": "refused"})
    with store._items._db.pool.connection() as conn:  # type: ignore[attr-defined]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    got = store.get(("notes",), "n1")
    assert got is not None and got.value == {"text": "kept as it was"}
    assert store.episodic.count() == episodes
    store.put(("notes",), "n2", {"text": "the next put goes through"})
    assert store.episodic.count() == episodes + 1

"""CtxkeepStore on PostgreSQL, counted on the wire: how many times an operation waits for the
server (:func:`~_round_trips.pg_waits` of its one pooled connection), a measure of its speed
that does not depend on the machine's load (issue 26: LangGraph's ``PostgresStore`` sends a
put's statements in one pipelined sync)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from _round_trips import pg_waits, pg_wire
from conftest_services import (
    postgres_database,
    postgres_schema_factory,
    postgres_url,
    with_schema,
)
from ctxkeep.integrations.langgraph import CtxkeepStore

__all__ = [  # fixtures, re-exported for pytest
    "postgres_database",
    "postgres_schema_factory",
    "postgres_url",
]

pytestmark = pytest.mark.postgres


@pytest.fixture
def elsewhere(postgres_database: str) -> str:
    """The URL of a fresh database whose pgvector lives in a schema of its own (as a host's
    ``extensions``), with a ``search_path`` of another schema alone."""
    with psycopg.connect(postgres_database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA extensions")
        conn.execute("CREATE EXTENSION vector SCHEMA extensions")
        conn.execute("CREATE SCHEMA app")
    return with_schema(postgres_database, "app")


@pytest.fixture(params=["pgvector on the path", "pgvector off the path"])
def store(
    request: pytest.FixtureRequest,
    postgres_schema_factory: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[CtxkeepStore]:
    # a pool of its own (an application_name of its own) of one connection: the one traced.
    # pgvector off the path: the item table's client and the episodic store's share that
    # connection, so a search_path of each their own would be set again at every switch (a
    # wait of its own: six of these tests failed so, after a server test had made its
    # extensions' schema)
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    if request.param == "pgvector off the path":
        base = request.getfixturevalue("elsewhere")
    else:
        base = postgres_schema_factory()
    url = base + f"&application_name=rt_{uuid.uuid4().hex[:8]}"
    s = CtxkeepStore(url, embedder="hash", index={"fields": ["text"]})
    s.put(("notes",), "warm", {"text": "the first put prepares the statements"})
    s.search(("notes",), query="first put")
    yield s
    s.close()


def test_a_put_of_a_new_item_waits_once(store: CtxkeepStore) -> None:
    # its episode, its row and the forgetting of what it replaced (nothing) pipelined, read
    # after the commit: one wait (two before: the row's statement was read before the commit)
    with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
        store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    assert pg_waits(lines) == 1, lines
    assert store.get(("notes",), "n1") is not None


def test_a_put_of_one_item_sends_its_episode_without_arrays(
    store: CtxkeepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The episode of a put of one item goes as scalar parameters: psycopg picks a dumper for
    each list parameter in Python, and the statement of many took ten one-element lists (issue
    26). Its rows are those the statement of many writes."""
    from langgraph.store.base import PutOp
    from psycopg.types.array import ListBinaryDumper, ListDumper

    lists: list[object] = []
    for cls in (ListDumper, ListBinaryDumper):
        dump = cls.dump

        def counted(self: object, obj: object, dump: Callable[..., object] = dump) -> object:
            lists.append(obj)
            return dump(self, obj)

        monkeypatch.setattr(cls, "dump", counted)
    value = {"text": "the launch code is aardvark"}
    store.put(("alone",), "n1", value)
    assert lists == []
    store.batch([PutOp(("many",), "n1", value), PutOp(("many",), "n2", {"text": "otters"})])
    assert lists  # the statement of many, as before
    with store._items._db.pool.connection() as conn:  # type: ignore[attr-defined]
        rows = conn.execute(
            "SELECT e.task_id, e.agent_id, e.content_key, e.tokens, e.pos, "
            "e.record::json -> 'metadata' ->> 'key', e.embedding::text, t.body::text "
            "FROM ctxkeep_episodes e JOIN ctxkeep_episode_text t USING (row) "
            "WHERE e.task_id IN ('alone', 'many') "
            "AND e.record::json -> 'metadata' ->> 'key' = 'n1' "
            "ORDER BY e.task_id"
        ).fetchall()
    assert [r[0] for r in rows] == ["alone", "many"]
    assert rows[0][1:] == rows[1][1:]
    assert [f.key for f in store.search(("alone",), query="aardvark launch code")] == ["n1"]


def _episodes(store: CtxkeepStore) -> tuple[int, int]:
    """How many rows the episodes' table and their documents' table hold."""
    with store._items._db.pool.connection() as conn:  # type: ignore[attr-defined]
        row = conn.execute(
            "SELECT (SELECT count(*) FROM ctxkeep_episodes), "
            "(SELECT count(*) FROM ctxkeep_episode_text)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_put_over_an_item_waits_once_and_its_old_episode_is_gone(store: CtxkeepStore) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    before = _episodes(store)
    old = store.episodic.search("aardvark", 1)[0].episode.episode_id
    # five before: the row read before the commit, then the episodic store's forgetting (its
    # rows read, deleted, the session's rest read to renumber), then the commit
    with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
        store.put(("notes",), "n1", {"text": "the launch code is wombat"})
    assert pg_waits(lines) == 1, lines
    assert _episodes(store) == before  # one episode (and its document) for one
    assert store.episodic.count(filters={"episode_id": old}) == 0
    summaries = [h.episode.summary for h in store.episodic.search("launch code", 5)]
    assert sorted(summaries) == [
        "the first put prepares the statements",
        "the launch code is wombat",
    ]
    found = store.search(("notes",), query="launch code aardvark")
    assert {f.key: f.value for f in found}["n1"] == {"text": "the launch code is wombat"}


def test_a_delete_waits_once_and_forgets_the_episode(store: CtxkeepStore) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    before = _episodes(store)
    with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
        store.delete(("notes",), "n1")
    assert pg_waits(lines) == 1, lines  # five before, as a put over an item
    assert _episodes(store) == (before[0] - 1, before[1] - 1)
    assert [f.key for f in store.search(("notes",), query="aardvark")] == ["warm"]


def test_an_episode_that_shares_its_session_is_forgotten_as_forget_does(
    store: CtxkeepStore,
) -> None:
    """An item's episode is alone in its session; if another episode joined it (another
    user of the episodic store), the put's statement leaves it to ``forget``, which
    renumbers the session's rest.
    """
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    hit = store.episodic.search("aardvark", 1)[0].episode
    store.episodic.save_episode(hit.session_id, "", "a neighbour about aardvark")
    store.put(("notes",), "n1", {"text": "the launch code is wombat"})
    assert store.episodic.count(filters={"episode_id": hit.episode_id}) == 0
    with store._items._db.pool.connection() as conn:  # type: ignore[attr-defined]
        left = conn.execute(
            "SELECT pos FROM ctxkeep_episodes WHERE session_id = %s", (hit.session_id,)
        ).fetchall()
    assert left == [(0,)]  # the neighbour, renumbered
    found = store.search(("notes",), query="launch code aardvark")
    assert {f.key: f.value for f in found}["n1"] == {"text": "the launch code is wombat"}


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
    # The refusal comes back before the pipeline's end in some runs (fetched by a later
    # statement's send) and at its sync in others: each is told as the trigger's error (it
    # was "pipeline aborted" in 4 of 40 runs of one refused put).
    for _ in range(60):
        with pytest.raises(Exception, match="refused by a trigger"):
            store.put(("notes",), "n1", {"text": "refused"})
        with store._items._db.pool.connection() as conn:  # type: ignore[attr-defined]
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    got = store.get(("notes",), "n1")
    assert got is not None and got.value == {"text": "kept as it was"}
    assert store.episodic.count() == episodes
    store.put(("notes",), "n2", {"text": "the next put goes through"})
    assert store.episodic.count() == episodes + 1


def test_a_batch_over_items_waits_once_and_forgets_what_it_replaced(store: CtxkeepStore) -> None:
    from langgraph.store.base import PutOp

    store.batch([PutOp(("notes",), f"n{i}", {"text": f"note {i} about otters"}) for i in range(6)])
    before = _episodes(store)
    ops = [PutOp(("notes",), f"n{i}", {"text": f"note {i} about badgers"}) for i in range(4)]
    ops += [PutOp(("notes",), "n4", None), PutOp(("notes",), "n5", {"x": 1}, index=False)]
    with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
        store.batch(ops)
    assert pg_waits(lines) == 1, lines
    assert _episodes(store) == (before[0] - 2, before[1] - 2)  # n4 deleted, n5 not indexed
    summaries = {h.episode.summary for h in store.episodic.search("note about", 20)}
    assert {s for s in summaries if "otters" in s} == set()
    found = store.search(("notes",), query="note about otters badgers", limit=10)
    assert {f.key: f.value for f in found} == {
        "warm": {"text": "the first put prepares the statements"},
        **{f"n{i}": {"text": f"note {i} about badgers"} for i in range(4)},
        "n5": {"x": 1},
    }


def test_a_checkpointer_beside_the_store_keeps_the_connection_s_search_path(
    elsewhere: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a LangGraph app's checkpointer and store on one URL share the process's pool: every
    # ctxkeep client of a URL ends its search_path with pgvector's schema where the URL's
    # path lacks it, so they agree, and moving between them sets no path (the checkpointer's
    # client kept the URL's own, and each switch was a set_config round trip of its own)
    from langgraph.checkpoint.base import empty_checkpoint

    from ctxkeep.integrations.langgraph import CtxkeepSaver

    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    url = elsewhere + f"&application_name=rt_{uuid.uuid4().hex[:8]}"
    with (
        CtxkeepStore(url, embedder="hash", index={"fields": ["text"]}) as store,
        CtxkeepSaver(url) as saver,
    ):
        client = saver._backend.client  # type: ignore[attr-defined]
        assert client.search_path == store._items._db.search_path  # type: ignore[attr-defined]
        cfg: dict[str, Any] = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        store.put(("notes",), "warm", {"text": "the first put prepares the statements"})
        cfg = saver.put(cfg, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
        with pg_wire(store._items._db.pool) as lines:  # type: ignore[attr-defined]
            store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
            saver.put(cfg, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
            store.put(("notes",), "n2", {"text": "the launch code is wombat"})
        assert not [line for line in lines if "search_path" in line[1]], lines
        assert saver.get_tuple(cfg) is not None
        assert store.get(("notes",), "n2") is not None


def test_puts_of_one_key_from_threads_leave_its_last_value_found(
    postgres_schema_factory: Callable[[], str],
) -> None:
    """Puts racing on one key: each replaces the row another committed; the item found is
    the last put's, no search returns an episode of a version replaced, and none is left.
    """
    import threading

    url = postgres_schema_factory()
    with CtxkeepStore(url, embedder="hash", index={"fields": ["text"]}) as store:
        store.put(("race",), "k", {"text": "version start of the raced item"})

        def puts(t: int) -> None:
            for i in range(15):
                store.put(("race",), "k", {"text": f"version {t}-{i} of the raced item"})

        threads = [threading.Thread(target=puts, args=(t,)) for t in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        got = store.get(("race",), "k")
        assert got is not None
        found = store.search(("race",), query="version of the raced item", limit=10)
        assert [(f.key, f.value) for f in found] == [("k", got.value)]
        # the item's episode alone is left: a put reads the row it replaces locked, so one
        # committed meanwhile by another thread is read as it is, its episode forgotten (read
        # in the statement's snapshot, unlocked, 7-15 were left to no item)
        current = store._items.get([("race", "k")])[("race", "k")].episode_id
        assert store.episodic.count(filters={"episode_id": current}) == 1
        assert store.episodic.count() == 1

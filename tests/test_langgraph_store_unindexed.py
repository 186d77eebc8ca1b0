"""CtxkeepStore(index=False): no episodes and no embedder, as LangGraph's own stores without an
index config, on memory://, SQLite and PostgreSQL; beside ``InMemoryStore()`` at its defaults,
and over rows an indexed store wrote before (their episodes are still forgotten).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langgraph")
from langgraph.store.base import GetOp, PutOp
from langgraph.store.memory import InMemoryStore

from conftest_services import fresh_store_url, postgres_schema_factory, postgres_url
from ctxkeep.episodic import HashEmbedder, open_episodic
from ctxkeep.errors import ConfigError
from ctxkeep.integrations.langgraph import CtxkeepStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest


class CountingEmbedder(HashEmbedder):
    """The hash embedder, counting the texts it embeds."""

    def __init__(self) -> None:
        super().__init__()
        self.texts = 0

    def embed_documents(self, texts: Any) -> np.ndarray:
        texts = list(texts)
        self.texts += len(texts)
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> np.ndarray:
        self.texts += 1
        return super().embed_query(text)


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_store_url(request, tmp_path)


def _load(store: Any) -> None:
    for i in range(6):
        store.put(("u", "facts"), f"k{i}", {"text": f"fact number {i} about penicillin", "n": i})
    store.put(("u", "other"), "x", {"text": "penicillin elsewhere", "n": 9})


def test_no_episode_no_embedding_and_the_peers_answers(url: str) -> None:
    embedder = CountingEmbedder()
    peer = InMemoryStore()
    with CtxkeepStore(url, embedder=embedder, index=False) as store:
        for side in (store, peer):
            _load(side)
            side.put(("u", "facts"), "k2", {"text": "replaced", "n": 2})
            side.delete(("u", "facts"), "k3")
        for kwargs in ({"query": "penicillin"}, {"query": "penicillin", "filter": {"n": 4}}):
            ours = store.search(("u",), **kwargs)
            theirs = peer.search(("u",), **kwargs)
            # a query does not rank: the same matches as the peer's, unscored, newest-updated
            # first (as LangGraph's SQLite and PostgreSQL stores; InMemoryStore keeps them in
            # the order they were put)
            assert sorted((i.key, str(i.value)) for i in ours) == sorted(
                (i.key, str(i.value)) for i in theirs
            )
            assert all(i.score is None for i in ours)
            assert [i.updated_at for i in ours] == sorted(
                (i.updated_at for i in ours), reverse=True
            )
        whole = [i.key for i in store.search(("u",), query="penicillin", limit=10)]
        assert whole[0] == "k2"
        assert [i.key for i in store.search(("u",), query="x", limit=2, offset=1)] == whole[1:3]
        assert store.get(("u", "facts"), "k2").value == {"text": "replaced", "n": 2}  # type: ignore[union-attr]
        assert store.get(("u", "facts"), "k3") is None
        assert store.list_namespaces() == peer.list_namespaces()
        assert store._episodic is None  # never opened
    assert embedder.texts == 0


def test_rows_an_indexed_store_wrote_lose_their_episodes(url: str, tmp_path: Path) -> None:
    if url == "memory://":
        pytest.skip("a memory:// store's items do not outlive it")
    with CtxkeepStore(url, embedder="hash", index={"fields": ["text"]}) as indexed:
        _load(indexed)
        assert indexed.search(("u",), query="penicillin")[0].score is not None
        before = indexed.episodic.count({"agent_id": "langgraph-store"})
    assert before == 7
    with CtxkeepStore(url, embedder="hash", index=False) as plain:
        plain.put(("u", "facts"), "k0", {"text": "no longer indexed"})
        plain.delete(("u", "facts"), "k1")
        assert plain.search(("u",), query="penicillin")[0].score is None
    episodes = open_episodic(url, "hash")
    try:
        left = episodes.count({"agent_id": "langgraph-store"})
    finally:
        episodes.close()
    assert left == 5  # k0's and k1's episodes forgotten
    with CtxkeepStore(url, embedder="hash", index={"fields": ["text"]}) as indexed:
        hits = indexed.search(("u",), query="penicillin", limit=10)
        ranked = [h.key for h in hits if h.score is not None]
        assert "k0" not in ranked and "k1" not in ranked
        assert sorted(ranked) == ["k2", "k3", "k4", "k5", "x"]


def test_index_false_with_an_episodic_store_is_refused() -> None:
    episodes = open_episodic("memory://", "hash")
    try:
        with pytest.raises(ConfigError, match="index=False"):
            CtxkeepStore(episodic=episodes, index=False)
    finally:
        episodes.close()


def test_a_put_keeps_created_at_of_a_live_item_only(url: str) -> None:
    now = [1e9]
    with CtxkeepStore(url, index=False, clock=lambda: now[0]) as store:
        store.put(("u",), "a", {"v": 1}, ttl=10)  # minutes
        now[0] += 60
        store.put(("u",), "a", {"v": 2}, ttl=10)
        item = store.get(("u",), "a")
        assert item is not None and item.value == {"v": 2}
        assert (item.created_at.timestamp(), item.updated_at.timestamp()) == (1e9, 1e9 + 60)
        now[0] += 3600  # expired: a put makes a new item
        store.put(("u",), "a", {"v": 3})
        item = store.get(("u",), "a")
        assert item is not None and item.created_at.timestamp() == now[0]
        store.delete(("u",), "a")
        assert store.get(("u",), "a") is None


@pytest.mark.postgres
def test_one_put_or_delete_on_postgres_is_one_statement_outside_a_transaction(
    postgres_schema_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with CtxkeepStore(postgres_schema_factory(), index=False) as store:
        store.put(("u",), "a", {"v": 1})
        db = store._items._db  # type: ignore[attr-defined]
        statements: list[str] = []
        q = db.q

        def counted(doing: str, sql: str, params: Any = (), **kw: Any) -> Any:
            statements.append(sql)
            return q(doing, sql, params, **kw)

        def no_tx(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a transaction for one put")

        monkeypatch.setattr(db, "q", counted)
        monkeypatch.setattr(db, "tx", no_tx)
        store.put(("u",), "a", {"v": 2})
        store.delete(("u",), "a")
        assert len(statements) == 2
    with CtxkeepStore(store._url, index=False) as again:  # type: ignore[arg-type]
        assert again.get(("u",), "a") is None


def test_a_batch_keeps_created_at_of_live_items_only(url: str) -> None:
    """A batch's puts keep ``created_at`` as one put does (PostgreSQL writes the batch in one
    statement: ``_store_items.PG_PUT_MANY``), its deletes delete, and what it replaced is
    forgotten."""
    now = [1e9]
    with CtxkeepStore(url, index=False, clock=lambda: now[0]) as store:
        store.batch(
            [
                PutOp(("u",), "live", {"v": 1}),
                PutOp(("u",), "ttl", {"v": 1}, ttl=10),
                PutOp(("u",), "gone", {"v": 1}),
            ]
        )
        now[0] += 3600  # "ttl" expired
        store.batch(
            [
                PutOp(("u",), "live", {"v": 2}),
                PutOp(("u",), "ttl", {"v": 2}),
                PutOp(("u",), "gone", None),
                PutOp(("u",), "new", {"v": 2}, ttl=5),
                PutOp(("u",), "never", None),
            ]
        )
        got = {i.key: i for i in store.search(("u",), limit=10)}
        assert sorted(got) == ["live", "new", "ttl"]
        assert all(i.value == {"v": 2} for i in got.values())
        created = {k: i.created_at.timestamp() for k, i in got.items()}
        assert created == {"live": 1e9, "ttl": now[0], "new": now[0]}
        assert {i.updated_at.timestamp() for i in got.values()} == {now[0]}
        now[0] += 301  # "new" expired, swept; the others have no TTL
        assert store.sweep_ttl() == 1
        assert store.get(("u",), "new") is None


@pytest.mark.postgres
def test_a_batch_on_postgres_writes_its_rows_in_one_statement(
    postgres_schema_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with CtxkeepStore(postgres_schema_factory(), index=False) as store:
        store.batch([PutOp(("u",), f"k{i}", {"n": i}) for i in range(5)])
        db = store._items._db  # type: ignore[attr-defined]
        sent: list[str] = []
        tx = db.tx

        @contextmanager
        def counted(doing: str, **kw: Any) -> Iterator[Any]:
            with tx(doing, **kw) as conn:
                real = conn.execute

                def execute(sql: str, *args: Any, **kwargs: Any) -> Any:
                    sent.append(sql)
                    return real(sql, *args, **kwargs)

                monkeypatch.setattr(conn, "execute", execute)
                try:
                    yield conn
                finally:
                    monkeypatch.undo()

        monkeypatch.setattr(db, "tx", counted)
        store.batch(
            [PutOp(("u",), f"k{i}", {"n": -i}) for i in range(3)]
            + [PutOp(("u",), "k4", None)]
            + [PutOp(("v",), f"k{i}", {"n": i}) for i in range(400)]
        )
        assert len(sent) == 1 and sent[0].startswith("WITH new AS")
        monkeypatch.undo()
    with CtxkeepStore(store._url, index=False) as again:  # type: ignore[arg-type]
        got = again.batch([GetOp(("u",), f"k{i}") for i in range(5)] + [GetOp(("v",), "k399")])
        assert [g.value if g is not None else None for g in got] == [
            {"n": 0},
            {"n": -1},
            {"n": -2},
            {"n": 3},
            None,
            {"n": 399},
        ]


@pytest.mark.postgres
def test_puts_on_postgres_are_prepared_on_their_first_run(
    postgres_schema_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg prepares a statement on its fifth run on a connection unless asked: a put's
    (its text fixed) is asked to be prepared on its first, as LangGraph's PostgresStore does
    (``prepare_threshold=0``)."""
    import psycopg

    asked: list[tuple[str, Any]] = []
    real = psycopg.Connection.execute

    def execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        asked.append((" ".join(str(query).split()[:3]), kw.get("prepare")))
        return real(self, query, params, **kw)

    with CtxkeepStore(postgres_schema_factory(), index=False) as store:
        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        store.put(("u",), "a", {"v": 1})
        store.batch([PutOp(("u",), "b", {"v": 2}), PutOp(("u",), "a", None)])
        store.delete(("u",), "b")
        monkeypatch.undo()
        assert asked == [
            ("WITH old AS", True),
            ("WITH new AS", True),
            ("DELETE FROM ctxkeep_langgraph_items", True),
        ]
        assert store.get(("u",), "a") is None and store.get(("u",), "b") is None

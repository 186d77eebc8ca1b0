"""Episodic PostgreSQL ranks a search in the database when its config fuses the lexical and
dense scores alone (``CtxkeepStore``'s): one statement returns the best hits with their
records, ranked as the Python fusion ranks the same candidates; and a search sets the pooled
connection's ``hnsw.ef_search`` only when it differs, with no transaction around it, sent
with its statement."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from _round_trips import pg_waits, pg_wire
from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import RetrievalConfig, open_episodic, postgres
from ctxkeep.episodic.base import Hit
from ctxkeep.episodic.postgres import PostgresEpisodicStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres

PLAIN = RetrievalConfig(smooth=(0.0, 0.0), session_weight=0.0)
"""Both scores fused, nothing else: ranked in PostgreSQL."""

WORDS = [
    "deploy",
    "key",
    "rotates",
    "billing",
    "service",
    "owned",
    "team",
    "penguin",
    "south",
    "tuesday",
    "cat",
    "miso",
]


def _facts() -> list[dict[str, Any]]:
    return [
        {
            "session_id": f"s{i % 7}",
            "task_goal": "",
            "summary": " ".join(WORDS[(i * k) % len(WORDS)] for k in (1, 3, 5)) + f" #{i}",
            "agent_id": "a" if i % 2 else "b",
        }
        for i in range(60)
    ]


def _open(url: str, config: RetrievalConfig) -> PostgresEpisodicStore:
    store = open_episodic(url, "hash", config=config)
    assert isinstance(store, PostgresEpisodicStore)
    return store


def _in_python(store: PostgresEpisodicStore, query: str, top_k: int, **kw: Any) -> list[Hit]:
    """The search ranked in Python (the generic path) over the same candidates."""
    ranked = store._ranked
    store._ranked = lambda *a: None  # type: ignore[method-assign]
    try:
        return store.search(query, top_k, **kw)
    finally:
        store._ranked = ranked  # type: ignore[method-assign]


@pytest.fixture
def store(postgres_schema_factory: Callable[[], str]) -> Iterator[PostgresEpisodicStore]:
    s = _open(postgres_schema_factory(), PLAIN)
    s.save_episodes(_facts())
    yield s
    s.close()


@pytest.mark.parametrize(
    "query", ["deploy key", "penguin tuesday miso", "billing", "nothing matches zzz", ""]
)
@pytest.mark.parametrize("filters", [None, {"agent_id": "a"}])
def test_a_search_ranked_in_postgres_scores_every_candidate_as_python_does(
    store: PostgresEpisodicStore, query: str, filters: Any
) -> None:
    # top_k above the candidates: every candidate comes back, with its scores
    sql = store.search(query, 500, filters=filters)
    py = _in_python(store, query, 500, filters=filters)
    assert len(sql) == len(py) > 0
    by_id = {h.episode.episode_id: h for h in py}
    for hit in sql:
        want = by_id[hit.episode.episode_id]
        assert hit.episode == want.episode
        assert (hit.score, hit.lexical, hit.dense) == pytest.approx(
            (want.score, want.lexical, want.dense), rel=1e-6, abs=1e-6
        )
    scores = [h.score for h in sql]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize(
    "weights",
    [(1.0, 0.0), (0.0, 1.0), (0.5, 2.0)],
    ids=["no dense score (no vector)", "no lexical score", "weighted"],
)
def test_a_search_ranked_in_postgres_by_either_side_alone_scores_as_python_does(
    postgres_schema_factory: Callable[[], str], weights: tuple[float, float]
) -> None:
    # each side's candidates keep the score they have; the other is looked up, or 0 where
    # its weight is 0 (no vector is made without a dense weight: the lexical side alone)
    lexical, dense = weights
    config = RetrievalConfig(
        smooth=(0.0, 0.0), session_weight=0.0, lexical_weight=lexical, dense_weight=dense
    )
    s = _open(postgres_schema_factory(), config)
    try:
        s.save_episodes(_facts())
        for query in ["deploy key", "penguin tuesday miso", "nothing matches zzz", ""]:
            sql = s.search(query, 500)
            py = _in_python(s, query, 500)
            assert len(sql) == len(py)
            by_id = {h.episode.episode_id: h for h in py}
            for hit in sql:
                want = by_id[hit.episode.episode_id]
                assert (hit.score, hit.lexical, hit.dense) == pytest.approx(
                    (want.score, want.lexical, want.dense), rel=1e-6, abs=1e-6
                )
    finally:
        s.close()


def test_the_best_hits_ranked_in_postgres_are_pythons(
    store: PostgresEpisodicStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as many candidates as Python's ranking has (a search ranked in PostgreSQL asks for
    # a quarter; 60 episodes are more than 50)
    monkeypatch.setattr(postgres, "RANKED_SHARE", 1.0)
    for query in ["deploy key", "penguin tuesday miso", "owned team cat"]:
        sql = store.search(query, 5)
        py = _in_python(store, query, 5)
        assert [h.score for h in sql] == pytest.approx([h.score for h in py], rel=1e-6)
        # the same episodes, but among those tied with the last (Python's order among
        # ties is arbitrary)
        last = sql[-1].score

        def above(hits: list[Hit], last: float = last) -> set[str]:
            return {h.episode.episode_id for h in hits if h.score > last + 1e-6}

        assert above(sql) == above(py)


def test_a_search_ranked_in_postgres_asks_each_side_for_a_share_of_the_candidates(
    store: PostgresEpisodicStore, statements: list[str]
) -> None:
    hits = store.search("deploy key", 10)
    assert len(hits) == 10
    (search,) = [s for s in statements if "scored AS MATERIALIZED" in s]
    # 50 a side for 10 hits (Python ranks 200 a side), the 10 best records
    assert search.count("LIMIT 50)") == 2 and "LIMIT 10)" in search
    statements.clear()
    store.search("deploy key", 20)  # 20 a hit: 400 a side in Python
    (search,) = [s for s in statements if "scored AS MATERIALIZED" in s]
    assert search.count("LIMIT 100)") == 2


def test_a_config_with_session_knobs_is_ranked_in_python(
    postgres_schema_factory: Callable[[], str],
) -> None:
    s = _open(postgres_schema_factory(), RetrievalConfig())
    try:
        s.save_episodes(_facts())
        assert s._ranked(["deploy"], None, None, 200, 3) is None  # type: ignore[arg-type]
        assert s.search("deploy key", 3)
    finally:
        s.close()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements psycopg runs, and a note for each transaction it opens."""
    ran: list[str] = []
    execute, transaction = psycopg.Connection.execute, psycopg.Connection.transaction

    def run(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append(str(query))
        return execute(self, query, *args, **kwargs)

    def tx(self: Any, *args: Any, **kwargs: Any) -> Any:
        ran.append("<transaction>")
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", run)
    monkeypatch.setattr(psycopg.Connection, "transaction", tx)
    return ran


def test_a_search_sets_ef_search_only_when_the_connection_has_another(
    postgres_schema_factory: Callable[[], str],
    monkeypatch: pytest.MonkeyPatch,
    statements: list[str],
) -> None:
    # a pool of its own (pools are shared per address) of one connection: both stores use it
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    url = postgres_schema_factory()
    url += ("&" if "?" in url else "?") + f"application_name=ef_{uuid.uuid4().hex[:8]}"
    wide = PostgresEpisodicStore(url, "hash", PLAIN, ef_search=300)
    narrow = PostgresEpisodicStore(url, "hash", PLAIN, ef_search=60)
    try:
        wide.save_episodes(_facts())

        def searching(store: PostgresEpisodicStore) -> list[str]:
            statements.clear()
            assert store.search("deploy key", 3)
            return [s for s in statements if "ef_search" in s or s == "<transaction>"]

        assert searching(wide) == ["SET hnsw.ef_search = 300"]
        assert searching(wide) == []  # the connection has it: no SET, no transaction
        assert searching(narrow) == ["SET hnsw.ef_search = 60"]
        assert searching(wide) == ["SET hnsw.ef_search = 300"]
        with wide.db.connection() as conn:
            assert conn.execute("SHOW hnsw.ef_search").fetchone() == ("300",)
    finally:
        wide.close()
        narrow.close()


def test_a_search_that_sets_ef_search_sends_it_with_its_statement(
    postgres_schema_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # one round trip a search, ef_search set or not (CtxkeepStore asks again for more hits,
    # at another ef_search, when too few of the first are in its scope)
    monkeypatch.setenv("CTXKEEP_PG_POOL_MAX", "1")
    url = postgres_schema_factory()
    url += ("&" if "?" in url else "?") + f"application_name=ef_{uuid.uuid4().hex[:8]}"
    store = PostgresEpisodicStore(url, "hash", PLAIN, ef_search=100)
    try:
        store.save_episodes(_facts())
        store.search("deploy key", 3)
        for top_k in (40, 40, 3, 40):  # 40 hits: ef_search 200; 3: 100
            with pg_wire(store.db.pool) as lines:
                assert store.search("deploy key", top_k)
            assert pg_waits(lines) == 1, lines
        with store.db.connection() as conn:
            assert conn.execute("SHOW hnsw.ef_search").fetchone() == ("200",)
    finally:
        store.close()

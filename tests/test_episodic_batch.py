"""Batched episodic writes and PostgreSQL's one-statement search (issue 26): a batch is stored
as the same episodes saved one by one, every window document is its session's window as it
stands, a save costs a fixed number of statements however many episodes it holds, an episode's
JSON is the same bytes as before, and PostgreSQL's folded search gives the scores of its
per-row primitives.
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import EpisodicMemoryStore, RetrievalConfig, open_episodic
from ctxkeep.episodic.base import EPISODE_VERSION, Episode, episode_record
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.text import tokenize
from ctxkeep.sessions.records import dumps

__all__ = ["postgres_schema_factory", "postgres_url"]

WORDS = [f"w{i}" for i in range(40)]


def episodes(seed: int, n: int, sessions: int) -> list[dict[str, Any]]:
    """``n`` episodes over ``sessions`` sessions, interleaved, with fixed times."""
    rng = random.Random(seed)
    return [
        {
            "session_id": f"s{rng.randrange(sessions)}",
            "task_goal": "",
            "summary": f"turn {i} " + " ".join(rng.choices(WORDS, k=rng.randint(2, 8))),
            "metadata": {"i": i},
            "created_at": 1000.0 + i,
        }
        for i in range(n)
    ]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., EpisodicMemoryStore]]:
    made: list[EpisodicMemoryStore] = []

    def make(config: RetrievalConfig | None = None) -> EpisodicMemoryStore:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path}/e{len(made)}.db"
        else:
            url = request.getfixturevalue("postgres_schema_factory")()
        store = open_episodic(url, embedder="hash", config=config)
        made.append(store)
        return store

    yield make
    for s in made:
        s.close()


def stored(store: EpisodicMemoryStore) -> dict[str, list[tuple[int, str, str]]]:
    """Each session's ``(pos, summary, window document)`` by position, read from the table."""
    if store.name == "sqlite":
        sql = (
            "SELECT e.session_id, e.pos, e.record, f.body, e.doclen FROM ctxkeep_episodes e "
            "JOIN ctxkeep_episode_fts f ON f.rowid = e.row ORDER BY e.session_id, e.pos"
        )
    else:
        sql = (
            "SELECT e.session_id, e.pos, e.record, t.body::text, 0 FROM ctxkeep_episodes e "
            "JOIN ctxkeep_episode_text t USING (row) ORDER BY e.session_id, e.pos"
        )
    out: dict[str, list[tuple[int, str, str]]] = {}
    for sid, pos, record, body, doclen in store._db.q("read", sql):  # type: ignore[attr-defined]
        if store.name == "sqlite":
            assert doclen == len(body.split())
        out.setdefault(sid, []).append((pos, _loads(record)["summary"], body))
    return out


def _loads(text: str) -> dict[str, Any]:
    from ctxkeep.sessions.records import loads

    out: dict[str, Any] = loads(text)
    return out


def expected_body(store: EpisodicMemoryStore, summaries: list[str], p: int) -> str:
    """The window document of position ``p`` as the engine stores it."""
    doc = store.window_doc([tokenize(s) for s in summaries], p)
    if store.name == "sqlite":
        return doc
    got = store._db.q("tsvector", "SELECT to_tsvector('simple', %s)::text", (doc,))  # type: ignore[attr-defined]
    return str(got[0][0])


def test_an_episode_record_is_the_bytes_asdict_gave() -> None:
    @settings(max_examples=200, deadline=None)
    @given(
        meta=st.dictionaries(
            st.text(max_size=5),
            st.recursive(
                st.none()
                | st.booleans()
                | st.integers(-(2**63), 2**63 - 1)
                | st.floats(allow_nan=False)
                | st.text(),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3)
                ),
                max_leaves=8,
            ),
            max_size=4,
        ),
        text=st.text(max_size=20),
        agent=st.none() | st.text(max_size=5),
        created=st.floats(allow_nan=False, allow_infinity=False),
    )
    def check(meta: dict[str, Any], text: str, agent: str | None, created: float) -> None:
        e = Episode(
            episode_id="e1",
            session_id=text,
            task_goal=text[::-1],
            summary=text + "!",
            metadata=meta,
            agent_id=agent,
            task_id=agent,
            created_at=created,
        )
        before = dumps({"v": EPISODE_VERSION, **dataclasses.asdict(e)})
        assert episode_record(e) == before

    check()


def test_a_batch_stores_what_saving_one_at_a_time_stores(
    make_store: Callable[..., EpisodicMemoryStore],
) -> None:
    data = episodes(1, 60, sessions=5)
    store = make_store()  # one store (a PostgreSQL schema of its own holds pgvector's type)
    for item in data:
        store.save_episodes([{**item, "session_id": "one-" + item["session_id"]}])
    batched = [{**item, "session_id": "batch-" + item["session_id"]} for item in data]
    store.save_episodes(batched[:7])
    store.save_episodes(batched[7:40])
    store.save_episodes(batched[40:])
    got = stored(store)
    assert len(got) == 10
    for sid, rows in got.items():
        if sid.startswith("one-"):
            assert rows == got["batch-" + sid.removeprefix("one-")]
    assert store.count() == 120


@pytest.mark.parametrize("window", [0, 1, 2, 4])
def test_every_window_document_is_its_sessions_window_after_batches_and_forgets(
    make_store: Callable[..., EpisodicMemoryStore], window: int
) -> None:
    store = make_store(RetrievalConfig(window=window))
    data = episodes(2, 90, sessions=4)
    store.save_episodes(data[:30])
    gone = [h.episode.episode_id for h in store.search("turn", 40)][::7]
    store.forget(episode_id=gone)
    store.save_episodes(data[30:31])  # a batch of one onto existing sessions
    store.save_episodes([*data[31:], {**data[0], "session_id": "new"}])
    for sid, rows in stored(store).items():
        summaries = [s for _, s, _ in rows]
        assert [p for p, _, _ in rows] == list(range(len(rows))), sid
        for p, (_, _, body) in enumerate(rows):
            assert body == expected_body(store, summaries, p), (sid, p)


def test_a_batch_saved_into_a_cached_sqlite_store_is_found_as_a_reopened_one_finds_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    data = episodes(3, 80, sessions=3)
    with open_episodic(url, embedder="hash") as store:
        store.save_episodes(data[:40])
        store.search("w1", 5)  # the cache is current: the next save updates it in place
        store.save_episodes(data[40:])
        hits = [(h.episode.episode_id, round(h.score, 9)) for h in store.search("w1 w2", 10)]
    with open_episodic(url, embedder="hash") as fresh:
        assert [
            (h.episode.episode_id, round(h.score, 9)) for h in fresh.search("w1 w2", 10)
        ] == hits


def test_a_sqlite_batch_is_a_fixed_number_of_statements(tmp_path: Path) -> None:
    with open_episodic(f"sqlite:///{tmp_path}/e.db", embedder="hash") as store:
        store.save_episodes(episodes(4, 10, sessions=10))
        conn: sqlite3.Connection = store._db.conn()  # type: ignore[attr-defined]

        def statements(n: int) -> int:
            sent: list[str] = []
            conn.set_trace_callback(sent.append)
            fresh = [{**e, "session_id": f"new{n}-{i}"} for i, e in enumerate(episodes(n, n, 1))]
            store.save_episodes(fresh)
            conn.set_trace_callback(None)
            # executemany traces its statement once a row: count all but the inserts (and
            # FTS5's own statements, traced with a "--" before them)
            return sum(not s.lstrip().upper().startswith(("INSERT", "--")) for s in sent)

        assert statements(3) == statements(300)


@pytest.mark.postgres
def test_a_postgres_batch_is_a_fixed_number_of_statements(
    postgres_schema_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    psycopg = pytest.importorskip("psycopg")
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    with open_episodic(postgres_schema_factory(), embedder="hash") as store:
        store.save_episodes(episodes(6, 10, sessions=3))
        monkeypatch.setattr(psycopg.Cursor, "execute", counting)

        def statements(n: int) -> int:
            sent.clear()
            store.save_episodes(episodes(n, n, sessions=3 + n // 2))  # old and new sessions
            return len(sent)

        assert statements(2) == statements(200)


def test_a_saved_episode_shares_no_metadata_with_the_caller() -> None:
    meta: dict[str, Any] = {"namespace": ["a", "b"], "deep": {"n": [1]}}
    with open_episodic("memory://", embedder="hash") as store:
        eid = store.save_episode("s", "", "text", metadata=meta)
        meta["namespace"].append("c")
        meta["deep"]["n"].append(2)
        assert store.get(eid).metadata == {"namespace": ["a", "b"], "deep": {"n": [1]}}


def forget_statements(store: EpisodicMemoryStore, count: Callable[[], int], n: int) -> int:
    """The statements ``count`` sees while ``n`` episodes, one in each of ``n`` sessions that
    keep others (so positions are renumbered and windows rewritten), are forgotten at once.
    """
    data = [{**e, "session_id": f"f{n}-{i % n}"} for i, e in enumerate(episodes(n, 3 * n, 1))]
    ids = store.save_episodes(data)
    store.search("turn", 1)  # a process's caches brought up to date first, not counted
    before = count()
    store.forget(episode_id=ids[:n])  # the first of each session: every position moves
    return count() - before


def test_a_sqlite_forget_is_a_fixed_number_of_statements(tmp_path: Path) -> None:
    with open_episodic(f"sqlite:///{tmp_path}/e.db", embedder="hash") as store:
        store.save_episodes(episodes(4, 10, sessions=10))
        conn: sqlite3.Connection = store._db.conn()  # type: ignore[attr-defined]
        sent: list[str] = []
        conn.set_trace_callback(sent.append)
        # executemany traces its statement once a row: count the reads
        reads = lambda: sum(s.lstrip().upper().startswith("SELECT") for s in sent)  # noqa: E731
        assert forget_statements(store, reads, 3) == forget_statements(store, reads, 300)
        conn.set_trace_callback(None)
        for sid, rows in stored(store).items():
            assert [p for p, _, _ in rows] == list(range(len(rows))), sid
            summaries = [s for _, s, _ in rows]
            assert [b for _, _, b in rows] == [
                expected_body(store, summaries, p) for p in range(len(rows))
            ]


@pytest.mark.postgres
def test_a_postgres_forget_is_a_fixed_number_of_statements(
    postgres_schema_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    psycopg = pytest.importorskip("psycopg")
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    with open_episodic(postgres_schema_factory(), embedder="hash") as store:
        assert forget_statements(store, lambda: len(sent), 2) == forget_statements(
            store, lambda: len(sent), 200
        )
        for sid, rows in stored(store).items():
            assert [p for p, _, _ in rows] == list(range(len(rows))), sid
            summaries = [s for _, s, _ in rows]
            assert [b for _, _, b in rows] == [
                expected_body(store, summaries, p) for p in range(len(rows))
            ]


NO_NEIGHBOURS = RetrievalConfig(smooth=(0.0, 0.0), session_weight=0.0)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "filters", [None, {"session_id": ["s0", "s2"]}, {"since": 1010.0, "until": 1060.0}]
)
def test_postgres_folded_search_gives_the_scores_of_its_primitives(
    postgres_schema_factory: Callable[[], str], filters: dict[str, Any] | None
) -> None:
    with open_episodic(postgres_schema_factory(), embedder="hash") as store:
        store.save_episodes(episodes(8, 120, sessions=4))
        f = EpisodeFilter.parse(filters)
        scope = set(store._rows(f).tolist())
        for query in ["w1 w7", "turn 5 w30", "nothing matches this"]:
            terms = tokenize(query)
            q = store.embedder.embed_query(query)
            cand = store._scope(terms, q, f, 10)
            rows = cand.rows
            assert rows.size and rows.tolist() == sorted(rows.tolist())
            assert set(rows.tolist()) <= scope
            assert cand.lexical is not None and cand.dense is not None
            assert cand.lexical.tolist() == store._lexical(terms, rows).tolist()
            np.testing.assert_allclose(cand.dense, store._dense(q.astype(np.float32), rows))
            assert cand.neighbours is not None
            for mine, theirs in zip(cand.neighbours, store._neighbours(rows), strict=True):
                assert mine.tolist() == theirs.tolist()
            assert cand.created is not None
            assert cand.created.tolist() == store._created(rows).tolist()
            # the rows are what the indexes found and those rows' neighbours in the scope;
            # with no knob that uses neighbours, only what the indexes found
            store.config = NO_NEIGHBOURS
            found = store._scope(terms, q, f, 10).rows
            store.config = RetrievalConfig()
            nb = store._nb_rows(found)
            assert set(rows.tolist()) == set(found.tolist()) | (set(nb[nb >= 0].tolist()) & scope)


def test_new_sessions_are_stored_as_looked_up_ones_without_a_look_up(
    make_store: Callable[..., EpisodicMemoryStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_save_episodes(new_sessions=True)`` (how ``CtxkeepStore`` saves an item's episode,
    each in a session of its own) reads neither stored episodes nor the sessions' ends, and
    stores what a save that reads them stores.
    """
    data = [{**item, "session_id": f"own{i}"} for i, item in enumerate(episodes(2, 12, sessions=3))]
    store = make_store()
    looked = store.save_episodes(
        [{**item, "session_id": "a-" + item["session_id"]} for item in data]
    )

    def refuse(*args: Any) -> Any:
        raise AssertionError("a new session was looked up")

    monkeypatch.setattr(store, "_find_keys", refuse)
    monkeypatch.setattr(store, "_tails", refuse)
    fresh = store._save_episodes(
        [{**item, "session_id": "b-" + item["session_id"]} for item in data], new_sessions=True
    )
    assert len(set(looked + fresh)) == 2 * len(data)
    got = stored(store)
    for sid, rows in got.items():
        if sid.startswith("a-"):
            assert rows == got["b-" + sid.removeprefix("a-")]
    assert store.count() == 2 * len(data)

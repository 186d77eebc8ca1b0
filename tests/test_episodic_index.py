"""Episodic stores on an HNSW vector index: candidate search, filters, forget, the file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ctxkeep.episodic import (
    EpisodicMemoryStore,
    HNSWParams,
    IndexConfig,
    RetrievalConfig,
    open_episodic,
)
from ctxkeep.episodic.index import hnsw_available, read_header

pytestmark = pytest.mark.skipif(
    not hnsw_available(), reason="faiss is not installed: pip install -e '.[hnsw]'"
)

N_SESSIONS, TURNS = 40, 50  # 2,000 episodes: over 4x the 200 candidates, so candidates are used
GRAPH = IndexConfig(hnsw_from=500, hnsw=HNSWParams(m=16, ef_construction=64))
DENSE = RetrievalConfig(lexical_weight=0, smooth=(0.0, 0.0))  # the raw cosine only
WORDS = [
    "deploy",
    "cache",
    "retry",
    "token",
    "budget",
    "window",
    "queue",
    "vector",
    "shard",
    "lease",
    "replica",
]


def episodes() -> list[dict[str, Any]]:
    rng = np.random.default_rng(3)
    out = []
    for s in range(N_SESSIONS):
        for t in range(TURNS):
            i = s * TURNS + t
            words = " ".join(rng.choice(WORDS, 6))
            out.append(
                {
                    "session_id": f"s{s}",
                    "task_goal": "",
                    "summary": f"marker{i} {words}",
                    "agent_id": "even" if s % 2 == 0 else "odd",
                }
            )
    return out


DATA = episodes()


def open_store(kind: str, tmp: Path, index: IndexConfig, **kw: Any) -> EpisodicMemoryStore:
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp}/episodes.db"
    return open_episodic(url, embedder="hash", index=index, **kw)


@pytest.fixture(scope="module", params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def graph_store(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    s = open_store(kind, tmp_path_factory.mktemp(kind), GRAPH)
    s.save_episodes(DATA)
    yield s
    s.close()


def test_a_large_store_searches_an_hnsw_graph(graph_store: Any) -> None:
    assert graph_store.vectors.approximate and len(graph_store.vectors) == len(DATA)


@pytest.mark.parametrize("i", [0, 7, 333, 1024, 1999])
def test_a_unique_word_finds_its_episode_through_the_candidates(graph_store: Any, i: int) -> None:
    hit = graph_store.search(f"marker{i} deploy", 1)[0]
    assert hit.episode.summary == DATA[i]["summary"]


@pytest.mark.parametrize("i", [5, 480, 1500])
def test_dense_only_search_finds_the_same_text_in_the_graph(
    kind: str, graph_store: Any, tmp_path: Path, i: int
) -> None:
    dense = open_store(kind, tmp_path, GRAPH, config=DENSE)
    try:
        dense.save_episodes(DATA)
        hit = dense.search(DATA[i]["summary"], 1)[0]
        assert hit.episode.summary == DATA[i]["summary"] and hit.lexical == 0.0
        assert hit.dense == pytest.approx(1.0, abs=1e-5)
    finally:
        dense.close()


def test_candidates_agree_with_exact_scoring(kind: str, graph_store: Any, tmp_path: Path) -> None:
    # the memory store on an exact index scores every episode: the reference
    exact = open_store("memory", tmp_path, IndexConfig(kind="exact"))
    try:
        exact.save_episodes(DATA)
        assert not exact.vectors.approximate
        same = 0
        for i in range(0, len(DATA), 100):
            q = f"marker{i} " + DATA[i + 1]["summary"].split(" ", 1)[1]
            a = [h.episode.summary for h in graph_store.search(q, 5)]
            b = [h.episode.summary for h in exact.search(q, 5)]
            assert a[0] == b[0] == DATA[i]["summary"]
            same += len(set(a) & set(b))
        assert same >= 0.6 * 5 * len(range(0, len(DATA), 100))
    finally:
        exact.close()


def test_filters_hold_in_candidate_search(graph_store: Any) -> None:
    hits = graph_store.search("marker10 deploy cache", 10, filters={"agent_id": "odd"})
    assert len(hits) == 10 and all(h.episode.agent_id == "odd" for h in hits)
    assert all(h.episode.summary != DATA[10]["summary"] for h in hits)  # s0 is "even"
    hits = graph_store.search("marker60 deploy", 3, filters={"agent_id": "odd"})
    assert hits[0].episode.summary == DATA[60]["summary"]  # s1: "odd"


def test_forget_removes_an_episode_from_the_graph(kind: str, tmp_path: Path) -> None:
    s = open_store(kind, tmp_path, GRAPH, config=DENSE)
    try:
        s.save_episodes(DATA)
        target = DATA[77]["summary"]
        assert s.search(target, 1)[0].episode.summary == target
        eid = s.search(target, 1)[0].episode.episode_id
        assert s.forget(episode_id=eid) == 1
        assert len(s.vectors) == len(DATA) - 1
        assert all(h.episode.summary != target for h in s.search(target, 20))
    finally:
        s.close()


# -- the SQLite file beside the database --------------------------------------------------------


def sqlite_store(tmp: Path, index: IndexConfig = GRAPH, **kw: Any) -> Any:
    return open_store("sqlite", tmp, index, **kw)


def test_the_graph_is_persisted_beside_the_database_and_loaded(tmp_path: Path) -> None:
    s = sqlite_store(tmp_path)
    s.save_episodes(DATA)
    assert s.vectors.approximate
    s.close()
    header = read_header(tmp_path / "episodes.db.vidx")
    assert header["kind"] == "hnsw" and header["count"] == len(DATA)
    again = sqlite_store(tmp_path)
    assert again.search("marker9 deploy", 1)[0].episode.summary == DATA[9]["summary"]
    assert again.index_status == "loaded"
    again.close()


def test_a_missing_or_corrupt_file_is_rebuilt_and_a_stale_one_synced(tmp_path: Path) -> None:
    s = sqlite_store(tmp_path)
    s.save_episodes(DATA)
    s.close()
    path = tmp_path / "episodes.db.vidx"
    path.unlink()
    s = sqlite_store(tmp_path)
    assert s.count() == len(DATA) and len(s.vectors) == len(DATA)
    assert s.index_status == "built" and path.exists()
    s.close()
    path.write_bytes(b"not an index")
    s = sqlite_store(tmp_path)
    assert len(s.vectors) == len(DATA) and s.index_status == "rebuilt"
    s.close()
    # another writer adds rows the file lacks: the next opener adds just those
    writer = sqlite_store(tmp_path, index=IndexConfig(kind="exact"))
    writer.save_episode("late", "", "a late episode about leases")
    writer.close()
    s = sqlite_store(tmp_path)
    assert len(s.vectors) == len(DATA) + 1 and s.index_status == "synced"
    assert s.search("late episode leases", 1)[0].episode.session_id == "late"
    s.close()


def test_writes_through_another_connection_reach_an_open_graph(tmp_path: Path) -> None:
    reader = sqlite_store(tmp_path, config=DENSE)
    reader.save_episodes(DATA)
    assert reader.vectors.approximate
    writer = sqlite_store(tmp_path, config=DENSE)
    writer.save_episode("new", "", "brand new words about replicas")
    gone = DATA[3]["summary"]
    writer.forget(session_id="s0")
    writer.close()
    assert reader.search("brand new words about replicas", 1)[0].episode.session_id == "new"
    assert all(h.episode.summary != gone for h in reader.search(gone, 20))
    assert len(reader.vectors) == len(DATA) - TURNS + 1
    reader.close()


def test_forget_rewrites_the_file_without_the_vectors(tmp_path: Path) -> None:
    s = sqlite_store(tmp_path)
    s.save_episodes(DATA)
    s.close()
    s = sqlite_store(tmp_path)
    assert s.forget(agent_id="odd") == len(DATA) // 2
    header = read_header(tmp_path / "episodes.db.vidx")
    assert header["count"] == len(DATA) // 2  # written at once, not at close
    s.close()


def test_rows_are_never_reused(tmp_path: Path) -> None:
    s = sqlite_store(tmp_path, index=IndexConfig(kind="exact"))
    s.save_episode("s", "", "first")
    s.forget(session_id="s")
    s.save_episode("s", "", "second")
    s.close()
    with sqlite3.connect(tmp_path / "episodes.db") as conn:
        assert conn.execute("SELECT row FROM ctxkeep_episodes").fetchall() == [(2,)]


def test_a_small_store_is_exact_and_keeps_no_file(tmp_path: Path) -> None:
    s = sqlite_store(tmp_path, index=IndexConfig())
    s.save_episodes(DATA[:300])
    assert not s.vectors.approximate
    s.close()
    assert not (tmp_path / "episodes.db.vidx").exists()


def test_sqlite_counts_repeated_tokens_like_the_memory_store(tmp_path: Path) -> None:
    texts = ["alpha alpha alpha beta", "alpha beta beta", "gamma alpha", "beta beta beta beta"]
    stores = [open_store(k, tmp_path, IndexConfig(kind="exact")) for k in ("memory", "sqlite")]
    for s in stores:
        s.save_episodes([{"session_id": "s", "task_goal": "", "summary": t} for t in texts])
    memory, sqlite = (
        [(h.episode.summary, h.lexical) for h in s.search("alpha", 4)] for s in stores
    )
    assert [x for x, _ in memory] == [x for x, _ in sqlite]
    assert [y for _, y in memory] == pytest.approx([y for _, y in sqlite])
    for s in stores:
        s.close()


def test_neighbour_rows_match_session_positions() -> None:
    from ctxkeep.episodic.base import session_neighbour_rows

    rng = np.random.default_rng(5)
    sessions, pos, ids = [], [], []
    counter: dict[str, int] = {}
    for row in rng.permutation(np.arange(10, 400)).tolist():
        s = f"s{int(rng.integers(0, 12))}"
        sessions.append(s)
        pos.append(counter.setdefault(s, 0))
        counter[s] += 1
        ids.append(row)
    order = np.argsort(ids)  # the store passes rows sorted
    ids_arr = np.asarray(ids)[order]
    sess = [sessions[i] for i in order]
    p = [pos[i] for i in order]
    at = {(s, q): r for s, q, r in zip(sess, p, ids_arr.tolist(), strict=True)}
    want = [[at.get((s, q + d), -1) for d in (-1, 1, -2, 2)] for s, q in zip(sess, p, strict=True)]
    assert session_neighbour_rows(ids_arr, sess, p).tolist() == want


@pytest.mark.parametrize("window", [1, 2, 3])
def test_the_cache_kept_up_through_own_writes_equals_a_fresh_read(
    tmp_path: Path, window: int
) -> None:
    config = RetrievalConfig(window=window)
    s = sqlite_store(tmp_path, index=IndexConfig(kind="exact"), config=config)
    applied = []
    apply = s._apply_insert
    s._apply_insert = lambda *a: applied.append(1) or apply(*a)
    rng = np.random.default_rng(window)
    for b in range(12):
        batch = [
            {
                "session_id": f"s{int(rng.integers(0, 5))}",
                "task_goal": "",
                "summary": f"batch {b} item {i} " + " ".join(rng.choice(WORDS, 4)),
            }
            for i in range(int(rng.integers(1, 30)))
        ]
        s.save_episodes(batch)
        if b == 6:
            s.forget(session_id="s1")  # a full reload in between
        kept = s._state()
        reads = s._writes
        fresh = sqlite_store(tmp_path, index=IndexConfig(kind="exact"), config=config)
        want = fresh._state()
        for key in ("ids", "nb", "created", "doclen"):
            assert kept[key].tolist() == want[key].tolist(), (b, key)
        assert s._writes == reads and s._cache is kept  # no reload happened
        fresh.close()
    assert len(applied) >= 10  # all but the first write and the one after forget
    s.close()


def test_closing_after_another_process_forgot_does_not_write_the_vectors_back(
    tmp_path: Path,
) -> None:
    a = sqlite_store(tmp_path, config=DENSE)
    a.save_episodes(DATA)
    a.close()
    a = sqlite_store(tmp_path, config=DENSE)
    a.save_episode("late", "", "one more (opens a's index, which writes the file)")
    a.save_episode("late", "", "and another, unsaved in the file")
    b = sqlite_store(tmp_path, config=DENSE)
    assert b.forget(session_id="s3") == TURNS
    b.close()
    a.close()  # a still held s3's vectors in memory when b forgot them
    assert read_header(tmp_path / "episodes.db.vidx")["count"] == len(DATA) - TURNS + 2

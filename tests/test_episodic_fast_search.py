"""Counting query terms in window documents from own tokens (issue 15): the same counts, the
same candidates and the same hits as reading the documents, under every filter."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkeep.episodic import (
    EpisodicMemoryStore,
    HNSWParams,
    IndexConfig,
    MemoryEpisodicStore,
    RetrievalConfig,
    open_episodic,
)
from ctxkeep.episodic.base import store_bm25
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.index import hnsw_available
from ctxkeep.episodic.terms import (
    RowIndex,
    TokenTable,
    sorted_unique,
    window_hits,
    window_term_counts,
)
from ctxkeep.episodic.text import tokenize

WORDS = [f"word{i}" for i in range(60)]
GRAPH = IndexConfig(hnsw_from=300, hnsw=HNSWParams(m=16, ef_construction=64))
LEXICAL = RetrievalConfig(dense_weight=0.0)  # no vectors: the candidates are deterministic


def corpus(seed: int, sessions: int = 30, turns: int = 40) -> list[dict[str, Any]]:
    """Sessions of Zipf-worded episodes, with agents, tasks, times and metadata to filter on."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, len(WORDS) + 1)
    p /= p.sum()
    out = []
    for s in range(sessions):
        for t in range(turns):
            i = s * turns + t
            words = " ".join(WORDS[w] for w in rng.choice(len(WORDS), rng.integers(3, 12), p=p))
            out.append(
                {
                    "session_id": f"s{s}",
                    "task_goal": "",
                    "summary": f"unique{i} {words}",
                    "agent_id": f"a{s % 3}",
                    "task_id": f"t{s % 4}",
                    "created_at": 1_000.0 + i,
                    "metadata": {"parity": i % 2, "tags": ["x"] if i % 5 == 0 else []},
                }
            )
    return out


def open_store(kind: str, tmp: Path, **kw: Any) -> EpisodicMemoryStore:
    url = "memory://" if kind == "memory" else f"sqlite:///{tmp}/episodes.db"
    return open_episodic(url, embedder="hash", **kw)


def body_counts(path: Path, rows: np.ndarray, terms: list[str]) -> np.ndarray:
    """The terms' counts in the window documents stored in the FTS5 table (the old way)."""
    with sqlite3.connect(path) as conn:
        bodies = dict(conn.execute("SELECT rowid, body FROM ctxkeep_episode_fts").fetchall())
    conn.close()
    return np.asarray(
        [[Counter(bodies.get(int(r), "").split())[w] for w in terms] for r in rows.tolist()],
        np.float64,
    ).reshape(rows.size, len(terms))


# -- the pieces -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    sessions=st.lists(
        st.lists(st.lists(st.sampled_from("abcde"), max_size=6), max_size=9), max_size=5
    ),
    window=st.integers(0, 4),
    self_weight=st.integers(1, 3),
    data=st.data(),
)
def test_window_term_counts_are_the_window_documents_counts(
    sessions: list[list[list[str]]], window: int, self_weight: int, data: st.DataObject
) -> None:
    store = MemoryEpisodicStore("hash", RetrievalConfig(window=window, self_weight=self_weight))
    table, nb, rows_of = TokenTable(), {}, []
    order = data.draw(st.permutations(range(sum(len(s) for s in sessions))))
    row = iter(order)
    for tokens in sessions:
        rows = [next(row) + 1 for _ in tokens]
        rows_of.append(rows)
        for p, r in enumerate(rows):
            nb[r] = [rows[p + d] if 0 <= p + d < len(rows) else -1 for d in (-1, 1, -2, 2)]
    flat = [
        (r, t)
        for rows, toks in zip(rows_of, sessions, strict=True)
        for r, t in zip(rows, toks, strict=True)
    ]
    half = len(flat) // 2  # added in two parts, the second out of order
    terms = ["a", "c", "e", "zzz"]
    table.add([r for r, _ in flat[:half]], [t for _, t in flat[:half]])
    table.posting("a")  # postings of the first part: the second is scanned, or rebuilt
    table.add([r for r, _ in flat[half:]], [t for _, t in flat[half:]])
    all_rows = np.asarray(sorted(nb), np.int64)

    def nb_rows(rs: np.ndarray) -> np.ndarray:
        return np.asarray([nb[int(r)] for r in rs], np.int64).reshape(-1, 4)

    got = window_term_counts(all_rows, terms, table.counts, nb_rows, window, self_weight)
    hit_rows, hit_counts = window_hits(table, terms, all_rows, nb_rows, window, self_weight)
    for rows, toks in zip(rows_of, sessions, strict=True):
        for p, r in enumerate(rows):
            want = store.window_counts(toks, p)
            i = int(np.searchsorted(all_rows, r))
            assert got[i].tolist() == [want[w] for w in terms]
    # window_hits: exactly the rows whose window holds a term, with the same counts
    holding = np.flatnonzero(got.sum(1) > 0)
    assert hit_rows.tolist() == all_rows[holding].tolist()
    assert hit_counts.tolist() == got[holding].tolist()


def test_postings_follow_the_table_as_it_grows_and_forgets() -> None:
    table = TokenTable()
    table.add([1, 2, 3], [["a", "b"], ["a", "a"], ["c"]])
    assert [x.tolist() for x in table.posting("a")] == [[1, 2], [1, 2]]
    table.add([5], [["a", "c"]])  # scanned, not rebuilt
    assert [x.tolist() for x in table.posting("a")] == [[1, 2, 5], [1, 2, 1]]
    table.add([4], [["c", "c"]])  # out of order: rows move, postings rebuilt
    assert [x.tolist() for x in table.posting("c")] == [[3, 4, 5], [1, 2, 1]]
    table.keep(np.asarray([2, 4, 5]))
    assert [x.tolist() for x in table.posting("a")] == [[2, 5], [2, 1]]
    assert [x.tolist() for x in table.posting("new")] == [[], []]
    table.add([6], [["new"]])
    assert [x.tolist() for x in table.posting("new")] == [[6], [1]]


def test_counts_are_the_same_from_postings_and_from_rows_added_since() -> None:
    rng = np.random.default_rng(7)
    tokens = [[f"t{w}" for w in rng.zipf(1.5, rng.integers(0, 9)) if w < 40] for _ in range(300)]
    table = TokenTable()
    table.add(range(1, 201), tokens[:200])
    table.posting("t1")  # postings of rows 1-200; rows 201-300 are read token by token
    table.add(range(201, 301), tokens[200:])
    terms = ["t1", "t2", "t7", "t30", "absent"]
    rows = np.asarray([0, 3, 150, 200, 201, 250, 300, 301])
    want = [[Counter(tokens[r - 1])[w] if 1 <= r <= 300 else 0 for w in terms] for r in rows]
    assert table.counts(rows, terms).tolist() == want
    assert table.counts(rows[::-1].copy(), terms).tolist() == want[::-1]  # any order


def test_window_hits_match_the_counts_for_rare_and_common_terms() -> None:
    # a rare term's hits are few (sorted), a common term's many (added up over every row)
    rng = np.random.default_rng(8)
    table, nb = TokenTable(), {}
    rows = np.arange(1, 401)
    for s in range(0, 400, 40):
        for p in range(40):
            nb[s + p + 1] = [s + p + 1 + d if 0 <= p + d < 40 else -1 for d in (-1, 1, -2, 2)]
    tokens = [["common"] * int(rng.integers(0, 3)) for _ in rows]
    tokens[123].append("rare")
    table.add(rows.tolist(), tokens)

    def nb_rows(rs: np.ndarray) -> np.ndarray:
        return np.asarray([nb[int(r)] for r in rs], np.int64).reshape(-1, 4)

    want = window_term_counts(rows, ["rare", "common"], table.counts, nb_rows, 2, 3)
    for terms in (["rare"], ["common"], ["rare", "common"]):
        cols = [["rare", "common"].index(t) for t in terms]
        for live in (rows, RowIndex(rows)):
            got_rows, got = window_hits(table, terms, live, nb_rows, 2, 3)
            holding = np.flatnonzero(want[:, cols].sum(1) > 0)
            assert got_rows.tolist() == rows[holding].tolist()
            assert got.tolist() == want[holding][:, cols].tolist()


def test_a_token_table_keeps_and_finds_rows() -> None:
    table = TokenTable()
    table.add([5, 9, 2], [["a", "b", "a"], [], ["b"]])
    assert table.rows.tolist() == [2, 5, 9]
    assert table.missing(np.asarray([1, 2, 9, 40])).tolist() == [1, 40]
    assert table.counts(np.asarray([9, 5, 2, 7]), ["a", "b"]).tolist() == [
        [0, 0],
        [2, 1],
        [0, 1],
        [0, 0],  # not held: nothing
    ]
    table.keep(np.asarray([2, 9]))
    assert table.rows.tolist() == [2, 9] and table.missing(np.asarray([5])).tolist() == [5]
    table.add(range(10, 2010), [["c"]] * 2000)  # appended: grows
    assert table.counts(np.asarray([2, 1999]), ["b", "c"]).tolist() == [[1, 0], [0, 1]]


def test_row_index_and_sorted_unique() -> None:
    ids = np.asarray([3, 8, 1_000_000_000])  # sparse: binary search
    assert RowIndex(ids).find(np.asarray([8, 4, 3])).tolist() == [1, -1, 0]
    assert RowIndex(np.asarray([1, 2, 5])).find(np.asarray([5, -1, 9])).tolist() == [2, -1, -1]
    assert sorted_unique(np.asarray([4, 1, 4, 2, 1])).tolist() == [1, 2, 4]


# -- the stores ------------------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_sqlite_counts_terms_as_its_stored_window_documents(tmp_path: Path) -> None:
    data = corpus(1, sessions=8, turns=20)
    s = open_store("sqlite", tmp_path)
    try:
        s.save_episodes(data[:100])
        s.save_episodes(data[100:])
        s.forget(episode_id=[s.search(f"unique{i}", 1)[0].episode.episode_id for i in (0, 41, 77)])
        s.save_episode("s1", "", "word0 word1 appended after a gap")
        rows = s._rows(EpisodeFilter())
        terms = ["word0", "word3", "word17", "appended", "nowhere"]
        assert (
            s._term_counts(terms, rows).tolist()
            == body_counts(tmp_path / "episodes.db", rows, terms).tolist()
        )
    finally:
        s.close()


def test_sqlite_sees_rows_another_connection_wrote(tmp_path: Path) -> None:
    data = corpus(2, sessions=4, turns=10)
    a, b = open_store("sqlite", tmp_path), open_store("sqlite", tmp_path)
    try:
        a.save_episodes(data[:20])
        assert a.search("word0 word5", 3)  # a's token table is filled
        b.save_episodes(data[20:])
        b.forget(session_id="s0")
        rows = a._rows(EpisodeFilter())
        terms = ["word0", "word5", "unique33"]
        assert (
            a._term_counts(terms, rows).tolist()
            == body_counts(tmp_path / "episodes.db", rows, terms).tolist()
        )
        assert a.search("unique33", 1)[0].episode.summary == data[33]["summary"]
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(not hnsw_available(), reason="faiss is not installed")
@pytest.mark.parametrize(
    "filters",
    [
        None,
        {"agent_id": "a1"},
        {"session_id": ["s2", "s5", "s9", "s11", "s20", "s21"]},
        {"task_id": "t3"},
        {"since": 1_300.0, "until": 1_900.0},
        {"metadata": {"parity": 1}},
        {"metadata": {"tags": ["x"]}, "agent_id": ["a0", "a2"]},
    ],
)
def test_candidate_search_is_the_same_on_memory_and_sqlite(
    tmp_path: Path, filters: dict[str, Any] | None
) -> None:
    # lexical candidates (no vectors): both stores pick and score them by one rule
    data = corpus(3)
    mem = open_store("memory", tmp_path, config=LEXICAL, index=GRAPH)
    sql = open_store("sqlite", tmp_path, config=LEXICAL, index=GRAPH)
    try:
        mem.save_episodes(data)
        sql.save_episodes(data)
        rng = np.random.default_rng(4)
        for i in rng.choice(len(data), 12, replace=False).tolist():
            words = data[i]["summary"].split()
            q = " ".join(rng.choice(words, min(4, len(words)), replace=False))
            a = mem.search(q, 10, filters=filters)
            b = sql.search(q, 10, filters=filters)
            assert [h.episode.summary for h in a] == [h.episode.summary for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-9)
            allowed = {e["summary"] for e in data if _matches(e, filters)}
            assert all(h.episode.summary in allowed for h in a)
    finally:
        mem.close()
        sql.close()


def _matches(e: dict[str, Any], filters: dict[str, Any] | None) -> bool:
    for key, want in (filters or {}).items():
        if key == "since" and e["created_at"] < want:
            return False
        if key == "until" and e["created_at"] > want:
            return False
        if key == "metadata" and any(e["metadata"].get(k) != v for k, v in want.items()):
            return False
        ids = [want] if isinstance(want, str) else want
        if key in ("agent_id", "session_id", "task_id") and e[key] not in ids:
            return False
    return True


@pytest.mark.skipif(not hnsw_available(), reason="faiss is not installed")
def test_candidates_lexical_scores_are_bm25_of_the_stored_documents(
    kind: str, tmp_path: Path
) -> None:
    data = corpus(5)
    s = open_store(kind, tmp_path, index=GRAPH)
    try:
        s.save_episodes(data)
        f = EpisodeFilter()
        for q in ["word0 word7 unique12", "word2 word40 word41", "unique999 word1"]:
            terms = tokenize(q)
            got = s._candidates(terms, s.embedder.embed_query(q), f, 200)
            assert got is not None
            cand, lex = got
            assert lex is not None
            counts = Counter(terms)
            docs = _window_docs(s, data)
            tf = np.asarray([[docs[int(r)][w] for w in counts] for r in cand], np.float64)
            df = {w: sum(1 for d in docs.values() if d[w]) for w in counts}
            doclen = np.asarray([sum(d.values()) for _, d in sorted(docs.items())], np.float64)
            want = store_bm25(
                counts,
                df,
                tf,
                np.asarray([sum(docs[int(r)].values()) for r in cand]),
                doclen,
                s.config.k1,
                s.config.b,
            )
            assert lex == pytest.approx(want, rel=1e-12)
    finally:
        s.close()


def _window_docs(s: EpisodicMemoryStore, data: list[dict[str, Any]]) -> dict[int, Counter[str]]:
    """Every row's window document, rebuilt from the saved texts (sessions in order)."""
    rows = s._rows(EpisodeFilter()).tolist()
    by_session: dict[str, list[list[str]]] = {}
    for e in data:
        by_session.setdefault(e["session_id"], []).append(tokenize(e["summary"]))
    out: dict[int, Counter[str]] = {}
    at = 0
    for tokens in by_session.values():  # saved session after session, rows in order
        for p in range(len(tokens)):
            out[rows[at]] = s.window_counts(tokens, p)
            at += 1
    return out


def test_hits_are_copies(kind: str, tmp_path: Path) -> None:
    s = open_store(kind, tmp_path)
    try:
        s.save_episode("s", "", "the kayak trip", metadata={"tags": ["a"], "deep": {"k": [1]}})
        s.save_episode("s", "", "the canoe trip")
        hit = s.search("kayak", 1)[0]
        hit.episode.metadata["tags"].append("b")
        hit.episode.metadata["deep"]["k"].append(2)
        again = s.search("kayak", 1)[0].episode
        assert again.metadata == {"tags": ["a"], "deep": {"k": [1]}}
        s.search("canoe", 1)[0].episode.metadata["new"] = 1
        assert s.search("canoe", 1)[0].episode.metadata == {}
    finally:
        s.close()

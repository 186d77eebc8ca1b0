"""Episodes in process memory (``memory://``): BM25 postings and a vector index.

Episode rows are append-only; deleting tombstones a row and rebuilds the windows and
neighbour links of its session. The vectors live in an :class:`~ctxkeep.episodic.index.AutoIndex`
keyed by row: exact below ``IndexConfig.hnsw_from`` episodes, where every filtered episode
is scored; HNSW from there, where search scores only the candidates the two indexes return
(see :meth:`MemoryEpisodicStore._candidates`), counting their query terms from a
:class:`~ctxkeep.episodic.terms.TokenTable` as the SQLite store does. Thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from ctxkeep.episodic.base import (
    Episode,
    EpisodicMemoryStore,
    Filters,
    Hit,
    NewEpisodes,
    RetrievalConfig,
    bm25,
    copy_episode,
    in_sorted,
    informative_terms,
    lexical_top,
    store_bm25,
    with_neighbours,
)
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.index import IndexConfig, VectorIndex, make_index
from ctxkeep.episodic.terms import RowIndex, TokenTable, window_hits, window_term_counts


class MemoryEpisodicStore(EpisodicMemoryStore):
    """All episodes in memory; exact hybrid search."""

    name = "memory"

    def __init__(
        self,
        embedder: str | Embedder = "local",
        config: RetrievalConfig | None = None,
        index: IndexConfig | None = None,
    ) -> None:
        super().__init__(embedder, config, index)
        self._lock = threading.RLock()
        self._eps: list[Episode | None] = []
        self._keys: dict[str, int] = {}
        self._ids: dict[str, int] = {}  # episode id -> row (a forget by ids scanned every row)
        self._row_key: list[str] = []
        self._tokens: list[list[str]] = []
        self._docs: list[Counter[str]] = []
        self._postings: dict[str, dict[int, int]] = {}
        self._table = TokenTable()  # own tokens, for counting terms in many windows at once
        self._sessions: dict[str, list[int]] = {}
        # task -> its rows, ascending (forgotten rows stay: _rows skips tombstones); a task
        # filter scanned every episode, 80% of a LoCoMo search at 5,882 episodes
        self._tasks: dict[str | None, list[int]] = {}
        # per row, in arrays grown by doubling ([:len(self._eps)] is current):
        self._doclen = np.zeros(0, np.float64)  # window document length (0: forgotten)
        self._nb = np.zeros((0, 4), np.int64)  # prev1, next1, prev2, next2 (-1: none)
        self._created_arr = np.zeros(0, np.float64)
        self.vectors: VectorIndex = make_index(self.embedder.dim, self.index_config)
        """The episodes' vectors by row."""
        self._live_rows: np.ndarray | None = None  # cached: every live row, sorted
        self._live_cache: tuple[np.ndarray, RowIndex, np.ndarray] | None = None  # see _live

    # -- indexes ---------------------------------------------------------------------------

    def _set_doc(self, row: int, doc: Counter[str]) -> None:
        old = self._docs[row]
        for t in old:
            p = self._postings.get(t)
            if p is not None:
                p.pop(row, None)
                if not p:
                    del self._postings[t]
        for t, c in doc.items():
            self._postings.setdefault(t, {})[row] = c
        self._docs[row] = doc
        self._doclen[row] = sum(doc.values())

    def _rebuild_session(self, sid: str, start: int = 0) -> None:
        """Recompute window documents and neighbour links from position ``start`` on (and the
        ``window`` positions before it, whose windows reach it).
        """
        rows = self._sessions.get(sid, [])
        tokens = [self._tokens[r] for r in rows]
        for p in range(self.window_from(start), len(rows)):
            r = rows[p]
            self._set_doc(r, self.window_counts(tokens, p))
            self._nb[r] = (
                rows[p - 1] if p >= 1 else -1,
                rows[p + 1] if p + 1 < len(rows) else -1,
                rows[p - 2] if p >= 2 else -1,
                rows[p + 2] if p + 2 < len(rows) else -1,
            )

    def _grow(self, n: int) -> None:
        """Make the per-row arrays hold ``n`` rows (new rows: empty, no neighbours)."""
        if n <= self._doclen.size:
            return
        size = max(n, 2 * self._doclen.size, 64)
        doclen, nb, created = np.zeros(size), np.full((size, 4), -1, np.int64), np.zeros(size)
        old = self._doclen.size
        doclen[:old], nb[:old], created[:old] = self._doclen, self._nb, self._created_arr
        self._doclen, self._nb, self._created_arr = doclen, nb, created

    # -- reading ---------------------------------------------------------------------------

    def search(self, query: str, top_k: int = 3, *, filters: Filters = None) -> list[Hit]:
        """:meth:`EpisodicMemoryStore.search` under the store's lock: a forget in another
        thread between the scoring of the rows and the reading of the best ones left a hit
        whose episode was gone (an ``AttributeError`` on its tombstone).
        """
        with self._lock:
            return super().search(query, top_k, filters=filters)

    # -- primitives ------------------------------------------------------------------------

    def _find_keys(self, keys: Sequence[str]) -> dict[str, str]:
        with self._lock:
            out = {}
            for k in keys:
                r = self._keys.get(k)
                e = self._eps[r] if r is not None else None
                if e is not None:
                    out[k] = e.episode_id
            return out

    def _insert(self, batch: NewEpisodes) -> None:
        with self._lock:
            touched: dict[str, int] = {}
            first = len(self._eps)
            self._grow(first + len(batch.episodes))
            for e, k, _, toks in batch.rows():
                r = len(self._eps)
                self._eps.append(e)  # its own: save_episodes made it (and its metadata)
                self._keys[k] = r
                self._ids[e.episode_id] = r
                self._row_key.append(k)
                self._tokens.append(list(toks))
                self._docs.append(Counter())
                self._created_arr[r] = e.created_at
                self._tasks.setdefault(e.task_id, []).append(r)
                session = self._sessions.setdefault(e.session_id, [])
                touched.setdefault(e.session_id, len(session))
                session.append(r)
            rows = np.arange(first, len(self._eps))
            self.vectors.add(rows, batch.vectors)
            self._table.add(rows.tolist(), batch.tokens)
            self._live_rows = None
            for sid, start in touched.items():
                rows_of = self._sessions[sid]
                if len(rows_of) == 1:  # a new session of one episode (each of a LangGraph
                    # store's items): its own tokens, no neighbours (_grow made them -1)
                    r = rows_of[0]
                    self._set_doc(r, self.window_counts([self._tokens[r]], 0))
                else:
                    self._rebuild_session(sid, start)

    def _rows(self, f: EpisodeFilter) -> np.ndarray:
        with self._lock:
            if f.selects_all:
                if self._live_rows is None:
                    live = [i for i, e in enumerate(self._eps) if e is not None]
                    self._live_rows = np.asarray(live, np.int64)
                return self._live_rows
            cand: Any
            if f.episode_id is not None:  # only the ids' rows can match
                cand = sorted({r for i in f.episode_id if (r := self._ids.get(i)) is not None})
            elif f.session_id is not None:  # only the sessions' rows can match
                cand = sorted({r for s in f.session_id for r in self._sessions.get(s, ())})
            elif f.task_id is not None:  # only the tasks' rows can match
                cand = sorted({r for t in f.task_id for r in self._tasks.get(t, ())})
            else:
                cand = range(len(self._eps))
            out = [i for i in cand if (e := self._eps[i]) is not None and f.matches(e)]
            return np.asarray(out, np.int64)

    def _lexical(self, terms: list[str], rows: np.ndarray) -> np.ndarray:
        with self._lock:
            where = np.full(len(self._eps), -1, np.int64)
            where[rows] = np.arange(rows.size)
            hits = []
            for term, qtf in Counter(terms).items():
                post = self._postings.get(term)
                if not post:
                    continue
                idx = np.fromiter(post.keys(), np.int64, len(post))
                tf = np.fromiter(post.values(), np.float64, len(post))
                pos = where[idx]
                keep = pos >= 0
                hits.append((qtf, pos[keep], tf[keep]))
            doclen = self._doclen[rows]
            return bm25(hits, doclen, self.config.k1, self.config.b)

    def _candidates(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        """With an HNSW index and a scope of more than ``4n`` episodes: the ``n`` best by
        BM25 over the informative query terms (those in at most 1% of the episodes; a term in
        most would make every posting a candidate) and the ``n`` nearest in the graph, with
        their session neighbours. Their lexical scores are BM25 over every query term with
        the statistics of the whole store, as in the SQLite store.
        """
        with self._lock:
            if not self.vectors.approximate:
                return None
            scope = self._rows(f)
            if scope.size <= 4 * n:
                return None
            counts = Counter(terms)
            use_lex = bool(terms) and bool(self.config.lexical_weight)
            df = {w: len(self._postings.get(w, ())) for w in counts}
            parts = []
            live, live_index, live_doclen = self._live()
            informative = informative_terms(counts, df, live.size) if use_lex else []
            cfg = self.config
            if informative:
                # the windows holding an informative term, counted from the token table's
                # postings (as the SQLite store does)
                sub = {w: counts[w] for w in informative}
                found, tf = window_hits(
                    self._table, list(sub), live_index, self._nb_rows, cfg.window, cfg.self_weight
                )
                if not f.selects_all:
                    keep = in_sorted(found, scope)
                    found, tf = found[keep], tf[keep]
                scores = store_bm25(sub, df, tf, self._doclen[found], live_doclen, cfg.k1, cfg.b)
                parts.append(found[lexical_top(scores, n)])
            if q is not None:
                parts.append(self.vectors.search(q, n, None if f.selects_all else scope)[0])
            cand = with_neighbours(parts, self._nb_rows, scope)
            if not use_lex:
                return cand, None
            # the candidates' counts of every query term, from the token table
            # (:mod:`~ctxkeep.episodic.terms`: looking each up in each window's counts took
            # 60% of a search at 100,000 episodes)
            tf = window_term_counts(
                cand, list(counts), self._table.counts, self._nb_rows, cfg.window, cfg.self_weight
            )
            lex = store_bm25(counts, df, tf, self._doclen[cand], live_doclen, cfg.k1, cfg.b)
            return cand, lex

    def _live(self) -> tuple[np.ndarray, RowIndex, np.ndarray]:
        """Every live row (sorted), their positions and their window document lengths; kept
        until rows change (a search at 100,000 episodes gathered the lengths twice and
        indexed the rows once, 0.5 ms).
        """
        with self._lock:
            live = self._rows(EpisodeFilter())
            if self._live_cache is None or self._live_cache[0] is not live:
                self._live_cache = (live, RowIndex(live), self._doclen[live])
            return self._live_cache

    def _nb_rows(self, rows: np.ndarray) -> np.ndarray:
        with self._lock:
            out: np.ndarray = np.take(self._nb, rows, axis=0)  # faster than self._nb[rows]
            return out

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        return self.vectors.vectors(rows)

    def _created(self, rows: np.ndarray) -> np.ndarray:
        with self._lock:
            out: np.ndarray = self._created_arr[rows]
            return out

    def _episodes(self, rows: np.ndarray) -> list[Episode]:
        with self._lock:
            return [copy_episode(self._eps[r]) for r in rows.tolist()]

    def _delete(self, rows: np.ndarray) -> None:
        with self._lock:
            touched = set()
            for r in rows.tolist():
                e = self._eps[r]
                if e is None:
                    continue
                touched.add(e.session_id)
                self._sessions[e.session_id].remove(r)
                self._set_doc(r, Counter())
                self._keys.pop(self._row_key[r], None)
                self._ids.pop(e.episode_id, None)
                self._eps[r] = None
                self._nb[r] = -1
            self.vectors.remove(rows)
            self._live_rows = None
            for sid in touched:
                if not self._sessions.get(sid):
                    self._sessions.pop(sid, None)
                else:
                    self._rebuild_session(sid)

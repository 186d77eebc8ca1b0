"""Episodic memory: past runs recalled by words and by meaning.

An :class:`Episode` is one thing worth remembering (a turn, a step, a run's summary) of a
session. Retrieval is hybrid, with every knob chosen on LoCoMo (BENCHMARKS.md):

* **lexical**: BM25 over stemmed, stopword-free tokens; each episode's document is its own
  text counted ``self_weight`` times plus the text of its ``window`` neighbours on each side
  in the same session (so "what did she say after the trip?" finds the turn next to it);
* **dense**: cosine similarity of the embedder's vectors, smoothed over the session's
  neighbours (``smooth``: weights of the +-1 and +-2 neighbours);
* **fusion**: each score vector is z-scored over the searched episodes and added with
  ``dense_weight`` (score fusion beat reciprocal rank fusion by 11 points of recall@10);
* **session prior**: each episode then gets ``session_weight`` times the z-score, over the
  searched sessions, of the best fused score in its session, so a turn in the session where
  the query's subject is discussed outranks an equal match in an unrelated one (on LoCoMo
  with wordllama vectors, recall@10 78.9 -> 79.9 cross-validated; :func:`session_prior`).

:class:`EpisodicMemoryStore` does this once for every backend, with the rules every backend
shares: which episodes a filter selects (:class:`~ctxkeep.episodic.filters.EpisodeFilter`),
each episode's window document (:meth:`EpisodicMemoryStore.window_docs`) and the positions of
its session neighbours (:func:`neighbour_positions`). A backend supplies storage and the
primitives :meth:`_rows`, :meth:`_lexical`, :meth:`_vectors`, :meth:`_nb_rows`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import math
import os
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from ctxkeep import _check
from ctxkeep.episodic.embedders import Embedder, get_embedder, stored_embedder
from ctxkeep.episodic.filters import EpisodeFilter
from ctxkeep.episodic.index import IndexConfig
from ctxkeep.episodic.index._base import matvec
from ctxkeep.episodic.terms import sorted_unique
from ctxkeep.episodic.text import tokenize
from ctxkeep.errors import ConfigError, EpisodeNotFoundError, InvalidMessageError

EPISODE_VERSION = 1


@dataclass(frozen=True)
class Episode:
    """One remembered piece of a past run."""

    episode_id: str
    """Unique id."""
    session_id: str
    """The session it came from."""
    task_goal: str
    """What the run was trying to do."""
    summary: str
    """What happened (the text recalled)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Caller data (JSON values); filterable by equality."""
    agent_id: str | None = None
    """The agent that lived it."""
    task_id: str | None = None
    """The task it belonged to."""
    created_at: float = 0.0
    """Unix time."""

    @property
    def text(self) -> str:
        """The text that is indexed and recalled."""
        return episode_text(self.task_goal, self.summary)


DEFAULT_MIN_SCORE = 0.0
"""The fused score a relevant hit needs by default (:meth:`Hit.is_relevant`): no less than the
average searched episode. ``ctxkeep memory search``, the inspector and ``ctxkeep mcp``'s recall
use it."""


@dataclass(frozen=True)
class Hit:
    """A search result: the episode, its fused score and the two scores fused."""

    episode: Episode
    score: float
    lexical: float = 0.0
    dense: float = 0.0

    def is_relevant(self, min_score: float = DEFAULT_MIN_SCORE) -> bool:
        """Whether the hit is evidence, not just the nearest of unrelated episodes: some query
        word matched (in the episode or its session neighbours) and the fused score, a z-score
        over the searched episodes, is at least ``min_score`` (0: no worse than average).

        Meaning alone (a paraphrase with no shared word) is not enough: on LoCoMo, unrelated
        queries still get fused scores of 2-5 from the embedding, relevant ones 4-16 and
        always some lexical evidence.
        """
        return self.lexical > 0 and self.score >= min_score


@dataclass(frozen=True)
class RetrievalConfig:
    """Hybrid retrieval knobs; the defaults were chosen on LoCoMo (BENCHMARKS.md: in-sample
    and cross-validated across its conversations).
    """

    window: int = 2
    """Neighbours on each side in the same session added to an episode's lexical document."""
    self_weight: int = 3
    """How many times an episode's own tokens count in its lexical document."""
    dense_weight: float = 1.0
    """Weight of the dense z-score against the lexical one (0: lexical only)."""
    lexical_weight: float = 1.0
    """Weight of the lexical z-score (0: dense only)."""
    smooth: tuple[float, float] = (0.3, 0.15)
    """Dense score smoothing: weights of the +-1 and +-2 session neighbours."""
    recency_half_life: float | None = None
    """Seconds; if set, newer episodes get up to +``recency_weight`` added (halving per
    half-life)."""
    recency_weight: float = 0.5
    """The largest recency bonus, in z-score units."""
    k1: float = 1.2
    """BM25 term saturation."""
    b: float = 0.75
    """BM25 length normalisation."""
    session_weight: float = 0.75
    """Weight of the session prior: the z-score, over the searched sessions, of the best
    fused score in the episode's session (0: none)."""


INGEST_KNOBS = ("window", "self_weight")
"""The :class:`RetrievalConfig` fields baked into a store's indexes as episodes are saved:
changing one on a store holding episodes needs them saved again (the others act at search)."""


def content_key(session_id: str, task_goal: str, summary: str) -> str:
    """The dedup key: equal session, goal and summary are one episode."""
    h = hashlib.sha256()
    for part in (session_id, task_goal, summary):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def _new_episode(i: int, item: Any, now: float) -> Episode:
    """The episode item ``i`` of a batch describes, with a new id.

    Raises:
        InvalidMessageError: a malformed item.

    """

    def bad(what: str) -> InvalidMessageError:
        return InvalidMessageError(f"episode {i}: {what}", index=i)

    if not isinstance(item, Mapping) or not {"session_id", "task_goal", "summary"} <= item.keys():
        raise InvalidMessageError(f"episode {i} needs session_id, task_goal and summary", index=i)
    for name in ("session_id", "task_goal", "summary", "agent_id", "task_id"):
        v = item.get(name)
        if type(v) is str and v.isascii() and "\x00" not in v:
            continue  # what the checks below pass, without their calls (a batch's every item)
        if not isinstance(v, str) and (v is not None or name not in ("agent_id", "task_id")):
            raise bad(f"{name} must be a string" + (" or None" if name.endswith("_id") else ""))
        if isinstance(v, str):
            try:  # each is a column of its own (PostgreSQL's text holds no NUL)
                _check.identifier(name, v, empty=True)
            except ConfigError as exc:
                raise bad(str(exc)) from None
    meta = item.get("metadata")
    if meta is not None and not isinstance(meta, Mapping):
        raise bad(f"metadata must be a mapping, got {type(meta).__name__}")
    meta = dict(meta or {})
    from ctxkeep.sessions.records import dumps, loads

    try:
        # the decoded copy is what the episode keeps: it shares nothing with the caller's
        copied = loads(dumps(meta))
        if copied != meta:
            raise ValueError("not exact")
    except (TypeError, ValueError) as exc:
        raise bad("metadata must be JSON objects with string keys") from exc
    created = item.get("created_at")
    if isinstance(created, datetime):
        created = created.timestamp()
    elif created is None:
        created = now
    elif isinstance(created, bool) or not isinstance(created, int | float):
        raise bad(f"created_at must be a unix time or a datetime, got {created!r:.40}")
    if not math.isfinite(created):
        raise bad(f"created_at must be finite, got {created}")
    return Episode(
        # 32 random hex digits, as uuid4().hex at 1/6 the cost. Not in time order: an id is
        # named by its first characters (`ctxkeep memory forget --id`, the MCP forget), which
        # ids made in one run would share
        episode_id=os.urandom(16).hex(),
        session_id=item["session_id"],
        task_goal=item["task_goal"],
        summary=item["summary"],
        metadata=copied,
        agent_id=item.get("agent_id"),
        task_id=item.get("task_id"),
        created_at=float(created),
    )


Filters = Mapping[str, Any] | EpisodeFilter | None
"""What ``filters=`` takes: a mapping of :class:`EpisodeFilter` keys, a filter, or ``None``."""


@dataclass(frozen=True)
class NewEpisodes:
    """A batch of new episodes for a backend to store, aligned by position."""

    episodes: list[Episode]
    """The episodes, in the order saved (their sessions' order)."""
    keys: list[str]
    """Their content keys."""
    vectors: np.ndarray
    """Their vectors, (len(episodes), dim)."""
    tokens: list[list[str]]
    """Their tokens."""
    new_sessions: bool = False
    """Every episode's session is new (see :meth:`EpisodicMemoryStore.save_episodes`): a
    backend need not read the sessions' ends nor lock them."""

    def rows(self) -> Iterator[tuple[Episode, str, np.ndarray, list[str]]]:
        """``(episode, key, vector, tokens)`` of each new episode, in order."""
        return zip(self.episodes, self.keys, self.vectors, self.tokens, strict=True)


@dataclass(frozen=True)
class Candidates:
    """The rows a search scores, with what the store could give of their scores at once."""

    rows: np.ndarray
    """The rows, sorted (int64)."""
    lexical: np.ndarray | None = None
    """Their lexical scores, or None for :meth:`EpisodicMemoryStore._lexical`."""
    dense: np.ndarray | None = None
    """Their cosine similarities with the query, or None for
    :meth:`EpisodicMemoryStore._dense`."""
    neighbours: tuple[np.ndarray, ...] | None = None
    """Their neighbour positions within ``rows``, or None for
    :meth:`EpisodicMemoryStore._neighbours`."""
    created: np.ndarray | None = None
    """Their ``created_at``, or None for :meth:`EpisodicMemoryStore._created`."""


def session_neighbour_rows(
    ids: np.ndarray, sessions: Sequence[str], pos: Sequence[int]
) -> np.ndarray:
    """For each of the rows ``ids`` (of episodes in ``sessions`` at positions ``pos``), the
    rows among ``ids`` at session positions -1, +1, -2, +2 (-1 where none among them).
    """
    n = ids.size
    nb = np.full((n, 4), -1, np.int64)
    if not n:
        return nb
    sess = np.unique(np.asarray(sessions, dtype=object), return_inverse=True)[1]
    p = np.asarray(pos, np.int64)
    span = int(p.max()) + 5  # a key +-2 never reaches another session's
    key = sess.astype(np.int64) * span + p + 2
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    for c, d in enumerate((-1, 1, -2, 2)):
        want = key + d
        at = np.minimum(np.searchsorted(ordered, want), n - 1)
        ok = (ordered[at] == want) & (p + d >= 0)
        nb[ok, c] = ids[order[at[ok]]]
    return nb


def neighbour_positions(rows: np.ndarray, nb: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each of ``rows``, the positions *within rows* of its session neighbours.

    Args:
        rows: row numbers (any order).
        nb: for each row, the rows of its -1, +1, -2, +2 session neighbours (-1: none),
            shape (len(rows), 4).

    Returns:
        Four arrays (one per neighbour): the neighbour's position in ``rows``, or the row's
        own position where it has none or the neighbour is not among ``rows``.

    """
    own = np.arange(rows.size)
    if not rows.size:
        return (own, own, own, own)
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    out = []
    for c in range(4):
        want = nb[:, c]
        at = np.minimum(np.searchsorted(ordered, want), rows.size - 1)
        found = (want >= 0) & (ordered[at] == want)
        out.append(np.where(found, order[at], own))
    return tuple(out)


def copy_episode(e: Episode) -> Episode:
    """A copy of ``e`` sharing nothing mutable with it: only its metadata is mutable (a
    ``copy.deepcopy`` of the whole dataclass cost a search at 100,000 episodes 0.4 ms a hit).
    """
    return dataclasses.replace(e, metadata=copy.deepcopy(e.metadata))


_EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(Episode))


def episode_text(task_goal: str, summary: str) -> str:
    """The text of an episode of ``task_goal`` and ``summary`` (:attr:`Episode.text`)."""
    return f"{task_goal}\n{summary}" if task_goal else summary


def episode_record(e: Episode, omit: Collection[str] = ()) -> str:
    """The stored JSON of an episode: ``v``, then its fields in their order but those in
    ``omit`` (a store keeps them in columns of their own: :func:`episode_from_record` takes
    them back).

    Built field by field, not with ``dataclasses.asdict``: that deep-copies the metadata only
    for it to be serialised, a quarter of a batch save of 10,000 episodes on SQLite.
    """
    from ctxkeep.sessions.records import dumps

    record: dict[str, Any] = {"v": EPISODE_VERSION}
    for name in _EPISODE_FIELDS:
        if name not in omit:
            record[name] = getattr(e, name)
    return dumps(record)


def episode_from_record(text: str | bytes, **fields: Any) -> Episode:
    """The episode a stored JSON describes, with ``fields`` (the fields a store keeps in
    columns, left out of the JSON: :func:`episode_record`'s ``omit``) over its own.

    Raises:
        SchemaVersionError: a record newer than this ctxkeep.

    """
    from ctxkeep.errors import SchemaVersionError
    from ctxkeep.sessions.records import loads

    d = loads(text)
    v = d.pop("v", 0)
    if v > EPISODE_VERSION:
        raise SchemaVersionError(
            f"episode record version {v} is newer than this ctxkeep reads ({EPISODE_VERSION})"
        )
    if fields:
        d.update(fields)
    return Episode(**d)


def bm25(
    hits: Iterable[tuple[int, np.ndarray, np.ndarray]],
    doclen: np.ndarray,
    k1: float,
    b: float,
) -> np.ndarray:
    """BM25 of every document of a collection.

    The collection is what is being searched (the episodes the filters select), so idf and
    average length are those of that scope: searching one task's memories is not skewed by
    the words of other tasks (on LoCoMo, +0.7 recall@10 over store-wide statistics).

    Args:
        hits: per query term, ``(times in the query, positions of the documents holding it,
            its count in each of them)``.
        doclen: the length of every document in the collection.
        k1: term saturation.
        b: length normalisation.

    """
    n = doclen.size
    scores = np.zeros(n, np.float64)
    if n == 0:
        return scores
    avg = max(float(doclen.mean()), 1e-9)
    for qtf, pos, tf in hits:
        if pos.size:
            scores[pos] += _bm25_term(qtf, pos.size, n, tf, doclen[pos], avg, k1, b)
    return scores


def _bm25_term(
    qtf: int, df: int, n: int, tf: np.ndarray, doclen: np.ndarray, avg: float, k1: float, b: float
) -> np.ndarray:
    """One query term's BM25 contribution to documents with counts ``tf`` and ``doclen``."""
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    out: np.ndarray = qtf * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * doclen / avg))
    return out


def store_bm25(
    counts: Mapping[str, int],
    df: Mapping[str, int],
    tf: np.ndarray,
    doclen: np.ndarray,
    all_doclen: np.ndarray,
    k1: float,
    b: float,
) -> np.ndarray:
    """BM25 of some documents of a store with the statistics of the whole store.

    Args:
        counts: query term -> times in the query.
        df: query term -> documents of the store holding it.
        tf: the documents' counts of each term of ``counts`` (in that order), (docs, terms).
        doclen: the documents' lengths.
        all_doclen: the length of every document of the store.
        k1: term saturation.
        b: length normalisation.

    """
    out = np.zeros(doclen.size, np.float64)
    n = all_doclen.size
    avg = max(float(all_doclen.mean()), 1e-9) if n else 1.0
    for j, (w, qtf) in enumerate(counts.items()):
        if df[w]:
            out += _bm25_term(qtf, df[w], n, tf[:, j], doclen, avg, k1, b)
    return out


def informative_terms(counts: Mapping[str, int], df: Mapping[str, int], n: int) -> list[str]:
    """The query terms that find lexical candidates in a store of ``n`` documents: those in
    at most 1% of them (at least 1,000), else the two rarest present. A term in most
    documents would make most of the store a candidate; every term still scores them.
    """
    limit = max(1_000, 0.01 * n)
    found = [w for w in counts if 0 < df[w] <= limit]
    return found or sorted((w for w in counts if df[w]), key=df.__getitem__)[:2]


def in_sorted(rows: np.ndarray, scope: np.ndarray) -> np.ndarray:
    """Which of ``rows`` are in the sorted array ``scope`` (a boolean mask)."""
    if not scope.size:
        return np.zeros(rows.size, bool)
    at = np.minimum(np.searchsorted(scope, rows), scope.size - 1)
    out: np.ndarray = scope[at] == rows
    return out


def lexical_top(scores: np.ndarray, n: int) -> np.ndarray:
    """Positions of the (at most) ``n`` highest positive scores, in no order."""
    pos = np.flatnonzero(scores > 0)
    if pos.size > n:
        pos = pos[np.argpartition(-scores[pos], n - 1)[:n]]
    return pos


def with_neighbours(
    parts: Sequence[np.ndarray], neighbours: Callable[[np.ndarray], np.ndarray], scope: np.ndarray
) -> np.ndarray:
    """The rows of ``parts`` and their session neighbours that lie in ``scope``, sorted.

    Args:
        parts: arrays of rows.
        neighbours: for sorted rows, an array (len(rows), k) of neighbour rows, -1 for none.
        scope: the rows that may be returned, sorted.

    """
    cand = sorted_unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    if cand.size:
        nb = neighbours(cand).ravel()
        cand = sorted_unique(np.concatenate([cand, nb[nb >= 0]]))
    out: np.ndarray = cand[in_sorted(cand, scope)]
    return out.astype(np.int64, copy=False)


def session_labels(prev: np.ndarray) -> np.ndarray:
    """One label per session run: for each position, the position of the first episode of
    its chain of previous-neighbour links.

    Args:
        prev: for each position, the position of its -1 session neighbour, its own where it
            has none among the positions (a session cut by a filter is several runs).

    """
    root = prev
    while True:  # pointer jumping: log2(longest session) steps
        nxt = root[root]
        if np.array_equal(nxt, root):
            return root
        root = nxt


def session_prior(total: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """For each episode, the z-score over the searched sessions of the best of ``total`` in
    its session (``labels`` from :func:`session_labels`).

    Evidence comes in sessions: LoCoMo's questions are answered by turns of the sessions
    where their subject is talked about, so the best match of a session says something about
    its other turns. Chosen on LoCoMo by cross-validation (leave one conversation, or one
    category, out) among weights 0.25 to 1.5 and the session's best or summed positive score:
    every fold chose the best, weighted 0.5 to 1.
    """
    if not total.size:
        return total
    best = np.full(total.size, -np.inf)
    np.maximum.at(best, labels, total)
    present = np.flatnonzero(np.isfinite(best))
    z = np.zeros(total.size)
    z[present] = _z(best[present])
    out: np.ndarray = z[labels]
    return out


def _z(x: np.ndarray) -> np.ndarray:
    if x.size == 0:
        return x
    sd = float(x.std())
    return (x - float(x.mean())) / sd if sd > 1e-12 else np.zeros_like(x)


class EpisodicMemoryStore(ABC):
    """Saves episodes and finds the ones relevant to a query (hybrid search)."""

    name = "episodic"

    def __init__(
        self,
        embedder: str | Embedder = "local",
        config: RetrievalConfig | None = None,
        index: IndexConfig | None = None,
    ):
        self.embedder: Embedder = get_embedder(embedder)
        self._embedder_spec = embedder  # a store that records another model: _stored_embedder
        self.config = config or RetrievalConfig()
        self.index_config = index or IndexConfig()
        """Which vector index the in-process stores keep (PostgreSQL has its own)."""
        if self.config.window < 0 or self.config.self_weight < 1:
            raise ConfigError("window must be >= 0 and self_weight >= 1")
        if not math.isfinite(self.config.session_weight):
            raise ConfigError("session_weight must be a finite number")

    # -- writing ---------------------------------------------------------------------------

    def save_episode(
        self,
        session_id: str,
        task_goal: str,
        summary: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        agent_id: str | None = None,
        task_id: str | None = None,
        created_at: float | datetime | None = None,
    ) -> str:
        """Save one episode (an exact duplicate is stored once); returns its id."""
        return self.save_episodes(
            [
                {
                    "session_id": session_id,
                    "task_goal": task_goal,
                    "summary": summary,
                    "metadata": metadata,
                    "agent_id": agent_id,
                    "task_id": task_id,
                    "created_at": created_at,
                }
            ]
        )[0]

    def save_episodes(self, episodes: Iterable[Mapping[str, Any]]) -> list[str]:
        """Save many episodes in one batch (embedded together); returns their ids in order.

        Each item has ``session_id``, ``task_goal``, ``summary`` and optionally
        ``metadata``, ``agent_id``, ``task_id``, ``created_at``. Episodes of one session are
        kept in the order saved (that order defines neighbours).

        Raises:
            InvalidMessageError: a malformed item (nothing of the batch is stored).
            InvalidTypeError: ``episodes`` is not an iterable.

        """
        return self._save_episodes(episodes, new_sessions=False)

    def _save_episodes(
        self, episodes: Iterable[Mapping[str, Any]], *, new_sessions: bool
    ) -> list[str]:
        """:meth:`save_episodes`; ``new_sessions``: the caller vouches that no session of
        the batch holds an episode yet (it made their ids, unique), so none is looked up:
        not the stored copies of the episodes (their keys hold the session) nor the
        sessions' ends (``CtxkeepStore`` gives each item a session of its own; on
        PostgreSQL these were two of a put's round trips). A session that does hold
        episodes would get wrong neighbours and could hold duplicates: hence not public.
        """
        new: list[Episode] = []
        keys: list[str] = []
        now = time.time()
        for i, item in enumerate(_check.iterable("episodes", episodes)):
            e = _new_episode(i, item, now)
            new.append(e)
            keys.append(content_key(e.session_id, e.task_goal, e.summary))
        if not new:
            return []
        existing = {} if new_sessions else self._find_keys(keys)
        fresh_idx = [i for i, k in enumerate(keys) if k not in existing]
        # within the batch too
        seen: dict[str, int] = {}
        unique_idx = []
        for i in fresh_idx:
            if keys[i] in seen:
                continue
            seen[keys[i]] = i
            unique_idx.append(i)
        if unique_idx:
            eps = [new[i] for i in unique_idx]
            vectors = self.embedder.embed_documents([e.text for e in eps])
            tokens = [tokenize(e.text) for e in eps]
            kept = [keys[i] for i in unique_idx]
            self._insert(NewEpisodes(eps, kept, vectors, tokens, new_sessions))
        out = []
        for k in keys:
            if k in existing:
                out.append(existing[k])
            else:
                out.append(new[seen[k]].episode_id)
        return out

    # -- reading ---------------------------------------------------------------------------

    def search(self, query: str, top_k: int = 3, *, filters: Filters = None) -> list[Hit]:
        """The ``top_k`` episodes most relevant to ``query`` (hybrid; best first).

        Args:
            query: what to recall.
            top_k: how many hits at most.
            filters: which episodes to search (:class:`EpisodeFilter` keys: ``episode_id``,
                ``agent_id``, ``session_id``, ``task_id`` (a value or a list), ``since`` /
                ``until`` (unix time or datetime, inclusive), ``metadata`` (keys with
                JSON-equal values)).

        Raises:
            InvalidFilterError: an unknown filter key or a value of the wrong kind.
            InvalidTypeError: ``query`` is not a string or ``top_k`` not an int.

        """
        f = EpisodeFilter.parse(filters)
        query = _check.text("query", query, empty=True)
        top_k = _check.integer("top_k", top_k)
        if top_k < 1:
            return []
        cfg = self.config
        terms = tokenize(query)
        q = self.embedder.embed_query(query) if cfg.dense_weight else None
        n = max(200, 20 * top_k)
        ranked = self._ranked(terms, q, f, n, top_k)
        if ranked is not None:
            return ranked
        # Large stores first narrow to candidates from their indexes (PostgreSQL always, the
        # others once their vector index is HNSW); small ones score every filtered episode.
        cand = self._scope(terms, q, f, n)
        rows = cand.rows
        if rows.size == 0:
            return []
        total = np.zeros(rows.size, np.float64)
        lex = np.zeros(rows.size, np.float64)
        dense = np.zeros(rows.size, np.float64)
        if cfg.lexical_weight:
            given = cand.lexical
            lex = (given if given is not None else self._lexical(terms, rows)).astype(np.float64)
            total += cfg.lexical_weight * _z(lex)
        nbs = cand.neighbours
        if cfg.dense_weight and q is not None:
            given = cand.dense
            dense = (
                given if given is not None else self._dense(q.astype(np.float32), rows)
            ).astype(np.float64)
            a, b = cfg.smooth
            if a or b:
                nbs = nbs or self._neighbours(rows)
                p1, n1, p2, n2 = nbs
                dense = dense + a * (dense[p1] + dense[n1]) + b * (dense[p2] + dense[n2])
            total += cfg.dense_weight * _z(dense)
        if cfg.session_weight:
            nbs = nbs or self._neighbours(rows)
            total += cfg.session_weight * session_prior(total, session_labels(nbs[0]))
        if cfg.recency_half_life:
            created = cand.created if cand.created is not None else self._created(rows)
            age = np.maximum(0.0, created.max() - created)
            total += cfg.recency_weight * np.power(0.5, age / cfg.recency_half_life)
        k = min(top_k, rows.size)
        best = np.argpartition(-total, k - 1)[:k]
        best = best[np.argsort(-total[best], kind="stable")]
        episodes = self._episodes(rows[best])
        return [
            Hit(e, float(total[i]), float(lex[i]), float(dense[i]))
            for e, i in zip(episodes, best, strict=True)
        ]

    def search_relevant_context(
        self, query: str, top_k: int = 3, *, filters: Filters = None
    ) -> list[str]:
        """The texts of the best episodes (``filters`` as in :meth:`search`)."""
        return [h.episode.text for h in self.search(query, top_k, filters=filters)]

    def find_stored(self, keys: Sequence[str]) -> dict[str, str]:
        """The ids of the stored episodes whose :func:`content_key` is among ``keys`` (keys
        of episodes not stored are absent): one indexed look-up, so an importer can skip what
        is stored without embedding it.
        """
        return self._find_keys(list(keys))

    def get(self, episode_id: str) -> Episode:
        """One episode by id.

        Raises:
            EpisodeNotFoundError: unknown id (a ``LookupError``).

        """
        episode_id = _check.identifier("episode_id", episode_id, empty=True)
        rows = self._rows(EpisodeFilter(episode_id=(episode_id,)))
        if rows.size == 0:
            raise EpisodeNotFoundError(f"no episode {episode_id!r}")
        return self._episodes(rows)[0]

    def count(self, filters: Filters = None) -> int:
        """How many episodes match ``filters`` (as in :meth:`search`).

        Raises:
            InvalidFilterError: an unknown filter key or a value of the wrong kind.

        """
        return int(self._rows(EpisodeFilter.parse(filters)).size)

    def forget(
        self,
        *,
        episode_id: str | Sequence[str] | None = None,
        session_id: str | Sequence[str] | None = None,
        agent_id: str | Sequence[str] | None = None,
    ) -> int:
        """Delete episodes by id, session or agent (a value or a list each; an episode must
        match every one given) from every index; returns how many.

        Raises:
            ConfigError: none of the three is given.
            InvalidFilterError: a value of the wrong kind.

        """
        given = {"episode_id": episode_id, "session_id": session_id, "agent_id": agent_id}
        f = EpisodeFilter.parse({k: v for k, v in given.items() if v is not None})
        if f.selects_all:
            raise ConfigError("forget needs episode_id, session_id or agent_id")
        rows = self._rows(f)
        if rows.size:
            self._delete(rows)
        return int(rows.size)

    def close(self) -> None:  # noqa: B027 - optional
        """Release resources."""

    def __enter__(self) -> EpisodicMemoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- shared by the stores that keep window documents -------------------------------------

    def window_counts(self, tokens: Sequence[Sequence[str]], p: int) -> Counter[str]:
        """The lexical document of position ``p`` of a session whose episodes have
        ``tokens``, as term counts: its own tokens ``self_weight`` times, then its
        ``window`` neighbours'.
        """
        w, sw = self.config.window, self.config.self_weight
        doc = Counter(tokens[p])  # counted in C, then weighted (+= per token: 2x slower)
        if sw != 1:
            for t in doc:
                doc[t] *= sw
        for q in list(range(max(0, p - w), p)) + list(range(p + 1, min(len(tokens), p + 1 + w))):
            doc.update(tokens[q])
        return doc

    def window_doc(self, tokens: Sequence[Sequence[str]], p: int) -> str:
        """:meth:`window_counts` as text (each token repeated, in first-seen order)."""
        return " ".join(t for t, c in self.window_counts(tokens, p).items() for _ in range(c))

    def window_from(self, start: int) -> int:
        """The first session position whose window document or neighbour links change when
        the session changes from position ``start`` on.
        """
        return max(0, start - max(self.config.window, 2))

    def window_docs(self, tokens: Sequence[Sequence[str]], start: int) -> Iterator[tuple[int, str]]:
        """``(position, document)`` of every window document of a session (whose episodes
        have ``tokens``, in order) that changes when it changes from position ``start`` on.
        """
        for p in range(self.window_from(start), len(tokens)):
            yield p, self.window_doc(tokens, p)

    def _stored_embedder(self, stored: str) -> bool:
        """Take the embedder a store records, ``stored``, where the one asked for allows it
        (:func:`~ctxkeep.episodic.embedders.stored_embedder`: ``local`` opens a store of
        another local model with that model); whether the embedder is now ``stored``.
        """
        if stored != self.embedder.name:
            spec = stored_embedder(self._embedder_spec, stored)
            if spec is not self._embedder_spec:
                self.embedder = get_embedder(spec)
        return stored == self.embedder.name

    # -- primitives ------------------------------------------------------------------------

    def _scope(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> Candidates:
        """The rows a search scores (:meth:`_candidates`, or every row matching ``f``), with
        what the store has at hand of their scores.
        """
        cand = self._candidates(terms, q, f, n)
        if cand is None:
            return Candidates(self._rows(f))
        return Candidates(cand[0], lexical=cand[1])

    def _ranked(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int, top_k: int
    ) -> list[Hit] | None:
        """The ``top_k`` hits ranked by the engine itself, by the fusion :meth:`search` does
        here under this store's config (the scores' z-scores over the candidates, weighted),
        over candidates of the store's choosing (:meth:`_scope` takes ``n`` a side); or None
        (the default) for :meth:`search` to rank the candidates of :meth:`_scope` here.
        """
        return None

    def _candidates(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        """Rows worth scoring (about ``n`` by each score, with their session neighbours;
        sorted) and, if the store has them, their lexical scores over the whole scope; or
        None to score every row that matches ``f``.
        """
        return None

    def _neighbours(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """For each row, the positions *within rows* of its session's -1, +1, -2, +2
        neighbours (its own position where there is none or it was filtered out).
        """
        return neighbour_positions(rows, self._nb_rows(rows))

    def _dense(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Cosine similarity of each row's vector with ``q``."""
        return matvec(self._vectors(rows), q)

    @abstractmethod
    def _find_keys(self, keys: Sequence[str]) -> dict[str, str]:
        """Existing episode ids for content keys."""

    @abstractmethod
    def _insert(self, batch: NewEpisodes) -> None:
        """Store episodes (appended to their sessions in order) in every index."""

    @abstractmethod
    def _rows(self, f: EpisodeFilter) -> np.ndarray:
        """Row numbers of live episodes matching ``f``, sorted (int64 array)."""

    @abstractmethod
    def _lexical(self, terms: list[str], rows: np.ndarray) -> np.ndarray:
        """BM25 of each row's window document for ``terms``."""

    @abstractmethod
    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        """The rows' vectors, shape (len(rows), dim)."""

    @abstractmethod
    def _nb_rows(self, rows: np.ndarray) -> np.ndarray:
        """For each row, the rows of its session's -1, +1, -2, +2 neighbours (-1 where
        there is none), shape (len(rows), 4).
        """

    @abstractmethod
    def _created(self, rows: np.ndarray) -> np.ndarray:
        """The rows' ``created_at``."""

    @abstractmethod
    def _episodes(self, rows: np.ndarray) -> list[Episode]:
        """The rows' episodes (copies), in the order given."""

    @abstractmethod
    def _delete(self, rows: np.ndarray) -> None:
        """Remove rows from every index."""

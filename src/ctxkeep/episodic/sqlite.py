"""Episodes in one SQLite file (``sqlite:///path.db``): the embedded default.

The file holds the episodes (their JSON record, session position and vector) and an FTS5
index of each episode's window document (its stemmed tokens ``self_weight`` times plus its
session neighbours'). Each process keeps the vectors in an
:class:`~ctxkeep.episodic.index.AutoIndex` keyed by row, brought up to date when another
connection changes the file (``PRAGMA data_version``: the rows it lacks are read, the gone
removed). Below ``IndexConfig.hnsw_from`` episodes the index is exact and every filtered
episode is scored (BM25 with the statistics of the searched scope). From there it is an
HNSW graph, persisted beside the database as ``<file>.vidx`` (loaded if current, synced if
only some rows changed, rebuilt if missing or built otherwise), and search scores only
candidates: the best by FTS5's BM25 (store-wide statistics) and the nearest in the graph,
with their session neighbours. Rows are never reused (``next_row``), so a row's vector never
changes and a file's row fingerprint says whether it is current.

The schema version is kept in ``ctxkeep_episodic_meta``; migrations are an ordered list and a
file written by a newer ctxkeep is refused. The embedder's name is stored too: opening a file
with another embedder is refused rather than mixing vector spaces.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from ctxkeep.episodic.base import (
    Episode,
    EpisodicMemoryStore,
    RetrievalConfig,
    _to_ts,
    bm25,
    episode_from_record,
    episode_record,
    informative_terms,
    store_bm25,
    with_neighbours,
)
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.episodic.index import (
    IndexConfig,
    VectorIndex,
    hnsw_available,
    make_index,
    open_index,
    sync_index,
)
from ctxkeep.errors import ConfigError, SchemaVersionError, StorageError
from ctxkeep.sessions.records import loads

MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE IF NOT EXISTS ctxkeep_episodes (
            row INTEGER PRIMARY KEY,
            episode_id TEXT NOT NULL UNIQUE,
            content_key TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL,
            task_id TEXT,
            agent_id TEXT,
            created_at REAL NOT NULL,
            pos INTEGER NOT NULL,
            record TEXT NOT NULL,
            tokens TEXT NOT NULL,
            vector BLOB NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_session ON ctxkeep_episodes (session_id, pos)",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_task ON ctxkeep_episodes (task_id)",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_agent ON ctxkeep_episodes (agent_id)",
        "CREATE VIRTUAL TABLE IF NOT EXISTS ctxkeep_episode_fts USING fts5(body, "
        "tokenize='unicode61 remove_diacritics 0')",
    ],
    # 2: window document lengths, for BM25 statistics over the searched scope
    [
        "ALTER TABLE ctxkeep_episodes ADD COLUMN doclen INTEGER NOT NULL DEFAULT 0",
        "UPDATE ctxkeep_episodes SET doclen = (SELECT length(body) - length(replace(body, ' ', ''))"
        " + (body != '') FROM ctxkeep_episode_fts WHERE rowid = ctxkeep_episodes.row)",
    ],
    # 3: rows are never reused (a vector index file keyed by row stays valid); document
    # frequencies of the FTS5 index, for BM25 over candidates with store-wide statistics
    [
        "INSERT OR IGNORE INTO ctxkeep_episodic_meta VALUES ('next_row', "
        "(SELECT coalesce(max(row), 0) + 1 FROM ctxkeep_episodes))",
        "CREATE VIRTUAL TABLE IF NOT EXISTS ctxkeep_episode_vocab "
        "USING fts5vocab(ctxkeep_episode_fts, 'row')",
        # what each process reloads after a write, without reading the vectors' pages
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_scan "
        "ON ctxkeep_episodes (row, session_id, pos, created_at, doclen)",
    ],
]

SAVE_EVERY = 0.05
"""An HNSW index file is rewritten once this fraction of its rows (at least 10,000) was added
since it was written, and on close and forget. Rows a crash loses are re-added on open
(at 1M rows: at most 50,000, about 2 minutes; each save takes about 8 s)."""


def _neighbour_rows(ids: np.ndarray, sessions: list[str], pos: list[int]) -> np.ndarray:
    """For each row, the rows at session positions -1, +1, -2, +2 (-1 where none)."""
    n = ids.size
    nb = np.full((n, 4), -1, np.int64)
    if not n:
        return nb
    sess = np.unique(np.asarray(sessions, dtype=object), return_inverse=True)[1]
    p = np.asarray(pos, np.int64)
    order = np.lexsort((p, sess))
    s_sorted, p_sorted = sess[order], p[order]
    for c, d in enumerate((-1, 1, -2, 2)):
        j = np.clip(np.arange(n) + d, 0, n - 1)
        ok = (s_sorted[j] == s_sorted) & (p_sorted[j] == p_sorted + d)
        nb[order[ok], c] = ids[order[j[ok]]]
    return nb


class SQLiteEpisodicStore(EpisodicMemoryStore):
    """Episodes, an FTS5 index and vectors in one SQLite file."""

    name = "sqlite"

    def __init__(
        self,
        path: str | Path,
        embedder: str | Embedder = "local",
        config: RetrievalConfig | None = None,
        index: IndexConfig | None = None,
    ) -> None:
        super().__init__(embedder, config, index)
        self.path = Path(path)
        self.index_path = self.path.with_name(self.path.name + ".vidx")
        """Where the HNSW index is kept (only once the store is large enough for one)."""
        self._vindex: VectorIndex | None = None
        self._unsaved = 0
        self._df: dict[str, int] = {}  # term -> documents holding it (see _doc_freq)
        self._df_at = 0
        self.index_status: str | None = None
        """What opening the vector index did (``loaded``, ``synced``, ``rebuilt`` or
        ``built``; see :func:`~ctxkeep.episodic.index.open_index`), once it is open."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._cache_lock = threading.Lock()
        self._cache: dict[str, Any] | None = None
        self._cache_writes = -1  # the _writes the cache reflects
        self._writes = 0
        self._migrate()

    # -- plumbing ----------------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=60000")
            except sqlite3.Error as exc:
                raise StorageError(f"cannot open {self.path}: {exc}") from exc
            self._local.conn = conn
        return conn

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StorageError(f"{self.path}: {exc}") from exc
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _q(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return self._conn().execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as exc:
            raise StorageError(f"{self.path}: {exc}") from exc

    def _migrate(self) -> None:
        with self._tx() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS ctxkeep_episodic_meta "
                "(key TEXT PRIMARY KEY, value TEXT)"
            )
            rows = dict(conn.execute("SELECT key, value FROM ctxkeep_episodic_meta").fetchall())
            version = int(rows.get("schema_version", 0))
            if version > len(MIGRATIONS):
                raise SchemaVersionError(
                    f"{self.path} holds episodes of a newer ctxkeep (schema {version}; this one "
                    f"reads up to {len(MIGRATIONS)}); upgrade ctxkeep"
                )
            stored = rows.get("embedder")
            if stored and stored != self.embedder.name:
                raise ConfigError(
                    f"{self.path} holds vectors of embedder {stored!r}, not "
                    f"{self.embedder.name!r}: open it with the same embedder"
                )
            if version == len(MIGRATIONS) and stored:
                return  # current: write nothing (a commit would make other processes reload)
            for i in range(version, len(MIGRATIONS)):
                for stmt in MIGRATIONS[i]:
                    conn.execute(stmt)
            conn.execute(
                "INSERT OR REPLACE INTO ctxkeep_episodic_meta VALUES ('schema_version', ?)",
                (str(len(MIGRATIONS)),),
            )
            conn.execute(
                "INSERT OR REPLACE INTO ctxkeep_episodic_meta VALUES ('embedder', ?)",
                (self.embedder.name,),
            )

    def close(self) -> None:
        """Write the HNSW index file if rows were added since; close this thread's
        connection.
        """
        if self._unsaved:
            self._state()  # first drop what others forgot: it must not go back to the file
            with self._cache_lock:
                if self._unsaved:
                    self._save_index()
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
            self._local.dv = None

    # -- the in-process cache of vectors and neighbour positions -------------------------------

    def _current(self, data_version: int) -> bool:
        """Whether the cache holds what this thread's connection sees (under the lock).

        ``PRAGMA data_version`` changes when another connection commits; its values are
        per connection, so each thread remembers the one it last checked the cache at.
        """
        return (
            self._cache is not None
            and getattr(self._local, "dv", None) == data_version
            and self._cache_writes == self._writes
        )

    def _state(self) -> dict[str, Any]:
        dv = int(self._q("PRAGMA data_version")[0][0])
        with self._cache_lock:
            if self._current(dv):
                assert self._cache is not None
                return self._cache
            rows = self._q(
                "SELECT row, session_id, pos, created_at, doclen FROM ctxkeep_episodes ORDER BY row"
            )
            ids = np.asarray([r[0] for r in rows], np.int64)
            self._sync_vectors(ids)
            self._cache = {
                "ids": ids,
                "nb": _neighbour_rows(ids, [r[1] for r in rows], [r[2] for r in rows]),
                "created": np.asarray([r[3] for r in rows], np.float64),
                "doclen": np.asarray([r[4] for r in rows], np.float64),
            }
            self._cache_writes = self._writes
            self._local.dv = dv
            return self._cache

    def _apply_insert(self, first: int, tail: list[tuple[Any, ...]]) -> None:
        """Bring the cache up to date with this thread's insert of rows ``first`` on.

        ``tail``: (row, session, pos, created_at, doclen) of every row of the touched
        sessions from ``lo`` (two positions before the first rewritten window) on, read in
        the inserting transaction; rows from ``lo + 2`` on get new links and lengths.
        """
        cache = self._cache
        assert cache is not None
        ids = np.asarray([r[0] for r in tail], np.int64)
        order = np.argsort(ids)
        ids = ids[order]
        sessions = [tail[i][1] for i in order]
        pos = np.asarray([tail[i][2] for i in order], np.int64)
        nb = _neighbour_rows(ids, sessions, pos.tolist())
        lo: dict[str, int] = {}
        for s, p in zip(sessions, pos.tolist(), strict=True):
            lo[s] = min(lo.get(s, p), p)
        update = np.asarray(
            [p >= lo[s] + 2 or lo[s] == 0 for s, p in zip(sessions, pos.tolist(), strict=True)]
        )
        doclen = np.asarray([tail[i][4] for i in order], np.float64)
        old = update & (ids < first)
        at = np.searchsorted(cache["ids"], ids[old])
        cache["nb"][at] = nb[old]
        cache["doclen"][at] = doclen[old]
        new = ids >= first
        cache["ids"] = np.concatenate([cache["ids"], ids[new]])
        cache["nb"] = np.concatenate([cache["nb"], nb[new]])
        cache["doclen"] = np.concatenate([cache["doclen"], doclen[new]])
        created = np.asarray([tail[i][3] for i in order], np.float64)
        cache["created"] = np.concatenate([cache["created"], created[new]])

    # -- the vector index --------------------------------------------------------------------

    def _sync_vectors(self, ids: np.ndarray) -> None:
        """Make the vector index hold exactly the rows ``ids`` (under the cache lock)."""
        if self._vindex is None:
            self._open_vectors(ids)
        else:
            added, removed = sync_index(self._vindex, ids, self._read_vectors)
            self._unsaved += added
            if removed:
                self._save_index()  # forgotten vectors leave the file too
        if self._vindex is not None and self._vindex.approximate and not self.index_path.exists():
            self._save_index()  # it has just become a graph

    def _open_vectors(self, ids: np.ndarray) -> None:
        cfg = self.index_config
        big = cfg.kind == "hnsw" or (
            cfg.kind == "auto" and ids.size >= cfg.hnsw_from and hnsw_available()
        )
        if cfg.kind != "exact" and (big or self.index_path.exists()):
            self._vindex, self.index_status = open_index(
                self.index_path,
                self.embedder.dim,
                ids,
                self._read_vectors,
                config=cfg,
                salt=self.embedder.name,
            )
            if not self._vindex.approximate:
                self.index_path.unlink(missing_ok=True)  # small again: the database suffices
        else:
            self._vindex = make_index(self.embedder.dim, cfg)
            sync_index(self._vindex, ids, self._read_vectors)
            self.index_status = "built"

    def _read_vectors(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of ``rows`` (in that order)."""
        found: dict[int, bytes] = {}
        ids = rows.tolist()
        for s in range(0, len(ids), 900):
            chunk = ids[s : s + 900]
            marks = ",".join("?" * len(chunk))
            found.update(
                self._q(f"SELECT row, vector FROM ctxkeep_episodes WHERE row IN ({marks})", chunk)
            )
        dim = self.embedder.dim
        if not ids:
            return np.zeros((0, dim), np.float32)
        return np.frombuffer(b"".join(found[r] for r in ids), np.float32).reshape(-1, dim)

    def _index_added(self, n: int) -> None:
        """``n`` rows were added to the index: write its file when enough are unsaved."""
        index = self._vindex
        if index is None:
            return
        first_graph = index.approximate and not self.index_path.exists()
        self._unsaved += n
        if first_graph or self._unsaved >= max(10_000, SAVE_EVERY * len(index)):
            self._save_index()

    def _save_index(self) -> None:
        index = self._vindex
        if index is not None and index.approximate:
            index.save(self.index_path, salt=self.embedder.name)
        self._unsaved = 0

    @property
    def vectors(self) -> VectorIndex:
        """The episodes' vectors by row (current as of the last read)."""
        self._state()
        assert self._vindex is not None
        return self._vindex

    def _pos_of(self, rows: np.ndarray) -> np.ndarray:
        """Positions of (existing) rows in the cached arrays."""
        out: np.ndarray = np.searchsorted(self._state()["ids"], rows)
        return out

    # -- primitives ----------------------------------------------------------------------------

    def _find_keys(self, keys: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for s in range(0, len(keys), 500):
            chunk = list(keys[s : s + 500])
            marks = ",".join("?" * len(chunk))
            for k, eid in self._q(
                "SELECT content_key, episode_id FROM ctxkeep_episodes "
                f"WHERE content_key IN ({marks})",
                chunk,
            ):
                out[k] = eid
        return out

    def _rewrite_windows(self, conn: sqlite3.Connection, session_id: str, start: int) -> None:
        """Recompute the FTS documents of a session from position ``start - window``."""
        first = max(0, start - max(self.config.window, 2))
        rows = conn.execute(
            "SELECT row, tokens FROM ctxkeep_episodes WHERE session_id = ? ORDER BY pos",
            (session_id,),
        ).fetchall()
        tokens = [r[1].split() for r in rows]
        for p in range(first, len(rows)):
            body = self.window_doc(tokens, p)
            conn.execute("DELETE FROM ctxkeep_episode_fts WHERE rowid = ?", (rows[p][0],))
            conn.execute(
                "INSERT INTO ctxkeep_episode_fts (rowid, body) VALUES (?, ?)", (rows[p][0], body)
            )
            conn.execute(
                "UPDATE ctxkeep_episodes SET doclen = ? WHERE row = ?",
                (len(body.split()), rows[p][0]),
            )

    def _insert(
        self,
        episodes: list[Episode],
        keys: list[str],
        vectors: np.ndarray,
        tokens: list[list[str]],
    ) -> None:
        vecs = np.asarray(vectors, np.float32)
        with self._tx() as conn:
            dv = int(conn.execute("PRAGMA data_version").fetchone()[0])
            with self._cache_lock:  # nobody else commits now: is the cache what we see?
                cache = self._cache if self._current(dv) else None
                writes = self._writes
            first = int(
                conn.execute(
                    "SELECT value FROM ctxkeep_episodic_meta WHERE key = 'next_row'"
                ).fetchone()[0]
            )
            conn.execute(
                "UPDATE ctxkeep_episodic_meta SET value = ? WHERE key = 'next_row'",
                (str(first + len(episodes)),),
            )
            starts: dict[str, int] = {}
            for row, (e, k, v, toks) in enumerate(
                zip(episodes, keys, vecs, tokens, strict=True), first
            ):
                pos = conn.execute(
                    "SELECT coalesce(max(pos), -1) + 1 FROM ctxkeep_episodes WHERE session_id = ?",
                    (e.session_id,),
                ).fetchone()[0]
                starts.setdefault(e.session_id, pos)
                conn.execute(
                    "INSERT INTO ctxkeep_episodes (row, episode_id, content_key, session_id, "
                    "task_id, agent_id, created_at, pos, record, tokens, vector) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        row,
                        e.episode_id,
                        k,
                        e.session_id,
                        e.task_id,
                        e.agent_id,
                        e.created_at,
                        pos,
                        episode_record(e),
                        " ".join(toks),
                        v.tobytes(),
                    ),
                )
            for sid, start in starts.items():
                self._rewrite_windows(conn, sid, start)
            tail: list[tuple[Any, ...]] = []
            if cache is not None:
                back = max(self.config.window, 2) + 2
                for sid, start in starts.items():
                    tail += conn.execute(
                        "SELECT row, session_id, pos, created_at, doclen FROM ctxkeep_episodes "
                        "WHERE session_id = ? AND pos >= ?",
                        (sid, max(0, start - back)),
                    ).fetchall()
        with self._cache_lock:
            self._writes += 1
            if cache is not None and self._cache is cache and self._cache_writes == writes:
                self._apply_insert(first, tail)  # no reload of every row after our own write
                self._cache_writes = self._writes
            if self._vindex is not None:
                self._vindex.add(np.arange(first, first + len(episodes)), vecs)
                self._index_added(len(episodes))
        if self._vindex is None:
            self._state()  # index as it is written (the first write of a process opens it)

    @staticmethod
    def _where(filters: dict[str, Any], col_prefix: str = "") -> tuple[list[str], list[Any]]:
        """SQL conditions for the column filters (not ``metadata``)."""
        where, params = [], []
        for col in ("episode_id", "session_id", "agent_id", "task_id"):
            if col in filters:
                want = filters[col]
                if isinstance(want, list | tuple | set | frozenset):
                    want = list(want)
                    where.append(f"{col_prefix}{col} IN ({','.join('?' * len(want))})")
                    params.extend(want)
                else:
                    where.append(f"{col_prefix}{col} = ?")
                    params.append(want)
        since, until = _to_ts(filters.get("since")), _to_ts(filters.get("until"))
        if since is not None:
            where.append(f"{col_prefix}created_at >= ?")
            params.append(since)
        if until is not None:
            where.append(f"{col_prefix}created_at <= ?")
            params.append(until)
        return where, params

    def _rows(self, filters: dict[str, Any]) -> np.ndarray:
        where, params = self._where(filters)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        meta = filters.get("metadata")
        if meta:
            rows = self._q(
                f"SELECT row, record FROM ctxkeep_episodes {clause} ORDER BY row", params
            )
            keep = [
                r[0]
                for r in rows
                if all(loads(r[1])["metadata"].get(k) == v for k, v in meta.items())
            ]
            return np.asarray(keep, np.int64)
        if not where:
            ids: np.ndarray = self._state()["ids"]
            return ids
        rows = self._q(f"SELECT row FROM ctxkeep_episodes {clause} ORDER BY row", params)
        return np.asarray([r[0] for r in rows], np.int64)

    def _term_counts(self, terms: Sequence[str], rows: np.ndarray) -> np.ndarray:
        """How often each term occurs in each row's window document: (len(rows), len(terms))."""
        out = np.zeros((rows.size, len(terms)), np.float64)
        if not terms or rows.size == 0:
            return out
        at = {int(r): i for i, r in enumerate(rows)}
        padded = [f" {w} " for w in terms]
        ids = rows.tolist()
        for s in range(0, len(ids), 900):
            chunk = ids[s : s + 900]
            marks = ",".join("?" * len(chunk))
            for rowid, body in self._q(
                f"SELECT rowid, body FROM ctxkeep_episode_fts WHERE rowid IN ({marks})", chunk
            ):
                # tokens are words without spaces, one space apart: doubling the spaces
                # lets " w " match every occurrence (a repeated token shares its spaces)
                doc = f" {body.replace(' ', '  ')} "
                out[at[int(rowid)]] = [doc.count(w) for w in padded]
        return out

    def _lexical(self, terms: list[str], rows: np.ndarray) -> np.ndarray:
        """BM25 with the statistics of the searched scope ``rows`` (small: at most a few
        thousand rows are scored this way, their documents read).
        """
        if not terms or rows.size == 0:
            return np.zeros(rows.size, np.float64)
        counts = Counter(terms)
        tf = self._term_counts(list(counts), rows)
        hits = []
        for j, qtf in enumerate(counts.values()):
            pos = np.flatnonzero(tf[:, j])
            hits.append((qtf, pos, tf[pos, j]))
        doclen = self._state()["doclen"][self._pos_of(rows)]
        return bm25(hits, doclen, self.config.k1, self.config.b)

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        return self.vectors.vectors(rows)

    def _candidates(
        self, terms: list[str], q: np.ndarray | None, filters: dict[str, Any], n: int
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        """For a scope of more than ``4n`` episodes: the ``n`` best by FTS5's BM25 over the
        informative query terms and the ``n`` nearest in the vector index, with their
        session neighbours; their lexical scores are BM25 with store-wide statistics.
        """
        st = self._state()
        index = self.vectors
        scope = self._rows(filters)
        if scope.size <= 4 * n:
            return None
        parts = []
        counts = Counter(terms)
        use_lex = bool(terms) and bool(self.config.lexical_weight)
        df = self._doc_freq(list(counts), st) if use_lex else {}
        informative = informative_terms(counts, df, st["ids"].size) if use_lex else []
        if informative:
            match = " OR ".join('"' + w.replace('"', '""') + '"' for w in informative)
            where, params = self._where(filters, "e.")
            cond = "".join(f" AND {c}" for c in where)
            top = self._q(
                "SELECT e.row FROM ctxkeep_episode_fts JOIN ctxkeep_episodes e "
                "ON e.row = ctxkeep_episode_fts.rowid "
                f"WHERE ctxkeep_episode_fts MATCH ?{cond} ORDER BY rank LIMIT ?",
                (match, *params, 4 * n if filters.get("metadata") else n),
            )
            parts.append(np.asarray([r for (r,) in top], np.int64))
        if q is not None:
            parts.append(index.search(q, n, scope if filters else None)[0])
        cand = with_neighbours(parts, lambda rows: st["nb"][self._pos_of(rows)], scope)
        if not use_lex:
            return cand, None
        tf = self._term_counts(list(counts), cand)
        doclen = st["doclen"]
        lex = store_bm25(
            counts, df, tf, doclen[self._pos_of(cand)], doclen, self.config.k1, self.config.b
        )
        return cand, lex

    def _doc_freq(self, terms: list[str], st: dict[str, Any]) -> dict[str, int]:
        """How many documents of the store hold each term.

        Counting costs FTS5 a walk over the term's postings, so counts are cached per
        process and recounted once the store's size has moved by 1% (idf barely moves).
        """
        n = int(st["ids"].size)
        with self._cache_lock:
            if abs(n - self._df_at) > 0.01 * max(n, 1):
                self._df.clear()
                self._df_at = n
            missing = [w for w in terms if w not in self._df]
        if missing:
            marks = ",".join("?" * len(missing))
            found = dict(
                self._q(
                    f"SELECT term, doc FROM ctxkeep_episode_vocab WHERE term IN ({marks})",
                    missing,
                )
            )
            with self._cache_lock:
                for w in missing:
                    self._df[w] = int(found.get(w, 0))
        with self._cache_lock:
            return {w: self._df.get(w, 0) for w in terms}

    def _neighbours(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        st = self._state()
        pos_in_rows = {int(r): i for i, r in enumerate(rows)}
        nb = st["nb"][self._pos_of(rows)]
        own = np.arange(rows.size)
        out = []
        for c in range(4):
            p = np.asarray([pos_in_rows.get(int(x), -1) for x in nb[:, c]], np.int64)
            out.append(np.where(p >= 0, p, own))
        return tuple(out)

    def _created(self, rows: np.ndarray) -> np.ndarray:
        out: np.ndarray = self._state()["created"][self._pos_of(rows)]
        return out

    def _episodes(self, rows: np.ndarray) -> list[Episode]:
        if rows.size == 0:
            return []
        marks = ",".join("?" * rows.size)
        found = dict(
            self._q(
                f"SELECT row, record FROM ctxkeep_episodes WHERE row IN ({marks})", rows.tolist()
            )
        )
        return [episode_from_record(found[int(r)]) for r in rows]

    def _delete(self, rows: np.ndarray) -> None:
        self._state()  # the index is open: what is deleted leaves it (and its file)
        deleted: list[int] = []
        with self._tx() as conn:
            sessions: dict[str, int] = {}
            for r in rows.tolist():
                got = conn.execute(
                    "SELECT session_id, pos FROM ctxkeep_episodes WHERE row = ?", (r,)
                ).fetchone()
                if got is None:
                    continue
                sessions[got[0]] = min(sessions.get(got[0], got[1]), got[1])
                conn.execute("DELETE FROM ctxkeep_episodes WHERE row = ?", (r,))
                deleted.append(r)
                conn.execute("DELETE FROM ctxkeep_episode_fts WHERE rowid = ?", (r,))
            for sid, start in sessions.items():
                # close the gap in positions, then rewrite the windows from there
                rest = conn.execute(
                    "SELECT row FROM ctxkeep_episodes WHERE session_id = ? ORDER BY pos", (sid,)
                ).fetchall()
                for p, (row,) in enumerate(rest):
                    conn.execute("UPDATE ctxkeep_episodes SET pos = ? WHERE row = ?", (p, row))
                self._rewrite_windows(conn, sid, start)
        with self._cache_lock:
            self._writes += 1
            if self._vindex is not None and deleted:
                self._vindex.remove(deleted)
                self._save_index()  # forgotten vectors leave the file too

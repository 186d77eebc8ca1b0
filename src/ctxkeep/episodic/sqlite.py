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
candidates: the best by BM25 with store-wide statistics over the query's informative terms
(FTS5 finds the documents holding them) and the nearest in the graph, with their session
neighbours. Rows are never reused (``next_row``), so a row's vector never changes and a
file's row fingerprint says whether it is current.

Query terms are counted in window documents without reading them: each process holds every
episode's own tokens (:class:`~ctxkeep.episodic.terms.TokenTable`, read by row, or all at
once with a large store's first search) and adds them up over the cached neighbour links
(:func:`~ctxkeep.episodic.terms.window_term_counts`). A row's tokens never change either, so
the table is never stale; it only lacks rows written since.

The file is reached through :class:`~ctxkeep._sqlite.SQLiteClient` (connections, transactions,
errors); the schema version is its ``ctxkeep_meta`` row ``episodic``, brought up by the ordered
:data:`MIGRATIONS`, beside ``episodic.embedder`` (opening a file with another embedder is
refused rather than mixing vector spaces) and ``episodic.next_row``. Files of the releases that
kept these in their own ``ctxkeep_episodic_meta`` table are adopted (:func:`legacy_version`,
migration 4); that table stays with only ``schema_version`` = 4 in it, so that such a release
refuses a file this one wrote instead of misreading it.

Filters become SQL through :class:`SQLiteDialect`: a metadata value is compared through
``json_each`` on the episode's JSON record, by JSON type and value, a list or an object member
by member, which is :func:`~ctxkeep.episodic.filters.json_equal` in SQL.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ctxkeep._sqlite import Migration, SQLiteClient, table_exists
from ctxkeep.episodic.base import (
    NewEpisodes,
    RetrievalConfig,
    bm25,
    in_sorted,
    informative_terms,
    lexical_top,
    session_neighbour_rows,
    store_bm25,
    with_neighbours,
)
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.episodic.filters import Dialect, EpisodeFilter
from ctxkeep.episodic.index import (
    IndexConfig,
    VectorIndex,
    hnsw_available,
    make_index,
    open_index,
    sync_index,
)
from ctxkeep.episodic.sql import COLUMNS, NewRow, SQLStore
from ctxkeep.episodic.terms import (
    NeighbourRows,
    RowIndex,
    TokenTable,
    sorted_unique,
    window_hits,
    window_term_counts,
)
from ctxkeep.errors import ConfigError, SchemaVersionError

LEGACY_META = "ctxkeep_episodic_meta"
"""Where releases before ``ctxkeep_meta`` kept the schema version, embedder and next row."""


def legacy_version(conn: sqlite3.Connection) -> int:
    """The schema version of a file written before ``ctxkeep_meta`` (0: no episodes yet)."""
    if not table_exists(conn, LEGACY_META):
        return 0
    row = conn.execute(f"SELECT value FROM {LEGACY_META} WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row is not None else 0
    except ValueError:
        raise SchemaVersionError(
            f"{LEGACY_META} holds an invalid schema version {row[0]!r}"
        ) from None


def _adopt_legacy_meta(conn: sqlite3.Connection) -> None:
    """Move the embedder and next row of ``ctxkeep_episodic_meta`` to ``ctxkeep_meta``; leave
    only ``schema_version`` = 4 there, which the releases that read it refuse.
    """
    conn.execute(f"CREATE TABLE IF NOT EXISTS {LEGACY_META} (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute(
        "INSERT INTO ctxkeep_meta (key, value) SELECT 'episodic.' || key, value "
        f"FROM {LEGACY_META} WHERE key IN ('embedder', 'next_row') AND value IS NOT NULL "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
    )
    conn.execute(f"DELETE FROM {LEGACY_META}")
    conn.execute(f"INSERT INTO {LEGACY_META} VALUES ('schema_version', '4')")


MIGRATIONS: list[Migration] = [
    ";\n".join(
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
            "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_session "
            "ON ctxkeep_episodes (session_id, pos)",
            "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_task ON ctxkeep_episodes (task_id)",
            "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_agent ON ctxkeep_episodes (agent_id)",
            "CREATE VIRTUAL TABLE IF NOT EXISTS ctxkeep_episode_fts USING fts5(body, "
            "tokenize='unicode61 remove_diacritics 0')",
        ]
    ),
    # 2: window document lengths, for BM25 statistics over the searched scope
    "ALTER TABLE ctxkeep_episodes ADD COLUMN doclen INTEGER NOT NULL DEFAULT 0;\n"
    "UPDATE ctxkeep_episodes SET doclen = (SELECT length(body) - length(replace(body, ' ', ''))"
    " + (body != '') FROM ctxkeep_episode_fts WHERE rowid = ctxkeep_episodes.row)",
    # 3: rows are never reused (a vector index file keyed by row stays valid); document
    # frequencies of the FTS5 index, for BM25 over candidates with store-wide statistics;
    # what each process reloads after a write, without reading the vectors' pages
    "INSERT OR IGNORE INTO ctxkeep_meta VALUES ('episodic.next_row', "
    "(SELECT coalesce(max(row), 0) + 1 FROM ctxkeep_episodes));\n"
    "CREATE VIRTUAL TABLE IF NOT EXISTS ctxkeep_episode_vocab "
    "USING fts5vocab(ctxkeep_episode_fts, 'row');\n"
    "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_scan "
    "ON ctxkeep_episodes (row, session_id, pos, created_at, doclen)",
    # 4: the embedder and next row live in ctxkeep_meta
    _adopt_legacy_meta,
]

READ_ALL_TOKENS = 0.02
"""Rows' tokens are read by row until the rows read so (and now needed) reach this fraction of
the rows the process lacks; then every lacking row's tokens are read in one scan (at 100,000
episodes: about 1 s, once per process; a search's candidates need about 2,000 rows, so
that comes with the first search of a large store; a small one reads all at once)."""

SAVE_EVERY = 0.05
"""An HNSW index file is rewritten once this fraction of its rows (at least 10,000) was added
since it was written, and on close and forget. Rows a crash loses are re-added on open
(at 1M rows: at most 50,000, about 2 minutes; each save takes about 8 s)."""


class SQLiteDialect(Dialect):
    """Filters in SQLite's SQL (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("?", "1", "0")

    def metadata_equals(self, record: str, key: str, value: Any) -> tuple[str, list[Any]]:
        """The metadata member ``key`` of the JSON ``record`` is JSON-equal to ``value``."""
        return _member(f"json_each({record}, '$.metadata')", key, value, 0)


def _member(each: str, key: str | int, value: Any, depth: int) -> tuple[str, list[Any]]:
    """The ``json_each`` table ``each`` has a member ``key`` JSON-equal to ``value``.

    ``json_each`` gives a member's JSON type and value without a path (a key may hold any
    character); a list or an object is compared member by member, with its length, in
    the member's own ``json_each``.
    """
    m = f"m{depth}"
    params: list[Any] = [key]
    if value is None:
        cond = f"{m}.type = 'null'"
    elif isinstance(value, bool):
        cond = f"{m}.type = '{'true' if value else 'false'}'"
    elif isinstance(value, int | float):
        cond = f"{m}.type IN ('integer', 'real') AND {m}.value = ?"
        params.append(value)
    elif isinstance(value, str):
        cond = f"{m}.type = 'text' AND {m}.value = ?"
        params.append(value)
    else:
        items = list(enumerate(value)) if isinstance(value, list) else list(value.items())
        kind = "array" if isinstance(value, list) else "object"
        conds = [
            f"{m}.type = '{kind}'",
            f"(SELECT count(*) FROM json_each({m}.value)) = {len(items)}",
        ]
        for k, v in items:
            sql, more = _member(f"json_each({m}.value)", k, v, depth + 1)
            conds.append(sql)
            params.extend(more)
        cond = " AND ".join(conds)
    return f"EXISTS (SELECT 1 FROM {each} AS {m} WHERE {m}.key = ? AND {cond})", params


class SQLiteEpisodicStore(SQLStore):
    """Episodes, an FTS5 index and vectors in one SQLite file."""

    name = "sqlite"
    dialect = SQLiteDialect()
    _db: SQLiteClient

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
        self._tokens = TokenTable()  # own tokens by row (see _own_counts)
        self._tokens_lock = threading.Lock()
        self._tokens_read = 0  # rows whose tokens were read one by one since the last scan
        self._tokens_hold: np.ndarray | None = None  # the ids array the table holds all of
        self._df_at = 0
        self.index_status: str | None = None
        """What opening the vector index did (``loaded``, ``synced``, ``rebuilt`` or
        ``built``; see :func:`~ctxkeep.episodic.index.open_index`), once it is open."""
        self._local = threading.local()
        self._cache_lock = threading.Lock()
        self._cache: dict[str, Any] | None = None
        self._cache_writes = -1  # the _writes the cache reflects
        self._writes = 0
        self._db = SQLiteClient(
            self.path,
            meta_key="episodic",
            migrations=MIGRATIONS,
            legacy_version=legacy_version,
        )
        try:
            self._check_embedder()
        except BaseException:
            self._db.close()
            raise

    def _check_embedder(self) -> None:
        """Record the embedder's name in a new file; refuse a file of another embedder.

        A file that has one is opened without writing (a commit makes other processes reload).
        """
        stored = self._db.meta("episodic.embedder")
        if stored is None:
            with self._db.tx("record the embedder") as conn:
                conn.execute(
                    "INSERT OR IGNORE INTO ctxkeep_meta VALUES ('episodic.embedder', ?)",
                    (self.embedder.name,),
                )
                stored = conn.execute(
                    "SELECT value FROM ctxkeep_meta WHERE key = 'episodic.embedder'"
                ).fetchone()[0]
        if not self._stored_embedder(stored):
            raise ConfigError(
                f"{self.path} holds vectors of embedder {stored!r}, not "
                f"{self.embedder.name!r}: open it with the same embedder"
            )

    def close(self) -> None:
        """Write the HNSW index file if rows were added since; close the connections."""
        if self._unsaved:
            self._state()  # first drop what others forgot: it must not go back to the file
            with self._cache_lock:
                if self._unsaved:
                    self._save_index()
        self._db.close()

    # -- the in-process cache of vectors and neighbour positions -------------------------------

    def _data_version(self, conn: sqlite3.Connection) -> tuple[sqlite3.Connection, int]:
        """``PRAGMA data_version`` of ``conn``, with the connection it belongs to."""
        return conn, int(conn.execute("PRAGMA data_version").fetchone()[0])

    def _current(self, data_version: tuple[sqlite3.Connection, int]) -> bool:
        """Whether the cache holds what this thread's connection sees (under the lock).

        ``PRAGMA data_version`` changes when another connection commits; its values are
        per connection, so each thread remembers the one it last checked the cache at, with
        its connection (a new connection, after :meth:`close`, counts afresh).
        """
        return (
            self._cache is not None
            and getattr(self._local, "dv", None) == data_version
            and self._cache_writes == self._writes
        )

    def _state(self) -> dict[str, Any]:
        with self._db.errors("read data_version"):
            dv = self._data_version(self._db.conn())
        with self._cache_lock:
            if self._current(dv):
                assert self._cache is not None
                return self._cache
            rows = self._db.q(
                "read the episodes' positions",
                "SELECT row, session_id, pos, created_at, doclen "
                "FROM ctxkeep_episodes ORDER BY row",
            )
            ids = np.asarray([r[0] for r in rows], np.int64)
            self._sync_vectors(ids)
            self._cache = {
                "ids": ids,
                "nb": session_neighbour_rows(ids, [r[1] for r in rows], [r[2] for r in rows]),
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
        nb = session_neighbour_rows(ids, sessions, pos.tolist())
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
        ids = rows.tolist()
        found: dict[int, bytes] = dict(
            self._select_in("read vectors", "SELECT row, vector FROM ctxkeep_episodes", "row", ids)
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

    def _pos_of(self, rows: np.ndarray, st: dict[str, Any] | None = None) -> np.ndarray:
        """Positions of (existing) rows in the cached arrays (of ``st``, or read now)."""
        out: np.ndarray = self._row_index(self._state() if st is None else st).find(rows)
        return out

    def _row_index(self, st: dict[str, Any]) -> RowIndex:
        """The positions of ``st``'s rows (built once per ``ids`` array)."""
        index = st.get("at")
        if index is None or index.ids is not st["ids"]:  # keyed by the ids array it indexes
            index = st["at"] = RowIndex(st["ids"])
        assert isinstance(index, RowIndex)
        return index

    def _nb_in(self, st: dict[str, Any]) -> NeighbourRows:
        """:meth:`_nb_rows` as of ``st``, without checking the file again (one search
        asked four times, each a ``PRAGMA data_version``).
        """

        def nb_rows(rows: np.ndarray) -> np.ndarray:
            out: np.ndarray = st["nb"][self._pos_of(rows, st)]
            return out

        return nb_rows

    # -- primitives ----------------------------------------------------------------------------

    def _write_windows(self, conn: Any, docs: Sequence[tuple[int, str, int]]) -> None:
        conn.executemany(
            "DELETE FROM ctxkeep_episode_fts WHERE rowid = ?", [(row,) for row, _, _ in docs]
        )
        conn.executemany(
            "INSERT INTO ctxkeep_episode_fts (rowid, body) VALUES (?, ?)",
            [(row, doc) for row, doc, _ in docs],
        )
        conn.executemany(
            "UPDATE ctxkeep_episodes SET doclen = ? WHERE row = ?", [(n, row) for row, _, n in docs]
        )

    def _insert_rows(self, conn: Any, rows: Sequence[NewRow]) -> None:
        if not rows:
            return
        marks = ", ".join("?" for _ in COLUMNS.split(","))
        conn.executemany(
            f"INSERT INTO ctxkeep_episodes (row, {COLUMNS}, doclen, vector) "
            f"VALUES (?, {marks}, ?, ?)",
            [
                (r.row, *r.values(), r.doclen, np.asarray(r.vector, np.float32).tobytes())
                for r in rows
            ],
        )
        conn.executemany(
            "INSERT INTO ctxkeep_episode_fts (rowid, body) VALUES (?, ?)",
            [(r.row, r.doc) for r in rows],
        )

    def _old_tail(self, conn: Any, starts: dict[str, int]) -> list[tuple[Any, ...]]:
        """``(row, session, pos, created_at, doclen)`` of the stored rows of sessions appended
        to from ``starts`` (their first new positions) whose neighbour links or document
        lengths the cache must take again: from ``max(window, 2) + 2`` before the start.
        """
        back = max(self.config.window, 2) + 2
        want = [(sid, max(0, start - back), start) for sid, start in starts.items() if start]
        out: list[tuple[Any, ...]] = []
        step = self.chunk // 3
        for s in range(0, len(want), step):
            part = want[s : s + step]
            out += conn.execute(
                "WITH t(sid, lo, hi) AS (VALUES "
                + ", ".join("(?, ?, ?)" for _ in part)
                + ") SELECT e.row, e.session_id, e.pos, e.created_at, e.doclen "
                "FROM t JOIN ctxkeep_episodes e "
                "ON e.session_id = t.sid AND e.pos >= t.lo AND e.pos < t.hi",
                [v for w in part for v in w],
            ).fetchall()
        return out

    def _insert(self, batch: NewEpisodes) -> None:
        n = len(batch.episodes)
        with self._db.tx("save episodes") as conn:
            dv = self._data_version(conn)
            with self._cache_lock:  # nobody else commits now: is the cache what we see?
                cache = self._cache if self._current(dv) else None
                writes = self._writes
            first = int(
                conn.execute(
                    "SELECT value FROM ctxkeep_meta WHERE key = 'episodic.next_row'"
                ).fetchone()[0]
            )
            self._db.set_meta(conn, "episodic.next_row", str(first + n))
            written = self._append(conn, batch, first)
            tail: list[tuple[Any, ...]] = []
            if cache is not None:
                starts: dict[str, int] = {}
                for r in written:
                    sid = r.episode.session_id
                    starts.setdefault(sid, r.pos)
                    tail.append((r.row, sid, r.pos, r.episode.created_at, r.doclen))
                tail += self._old_tail(conn, starts)
        with self._cache_lock:
            self._writes += 1
            if cache is not None and self._cache is cache and self._cache_writes == writes:
                self._apply_insert(first, tail)  # no reload of every row after our own write
                self._cache_writes = self._writes
            if self._vindex is not None:
                self._vindex.add(np.arange(first, first + n), np.asarray(batch.vectors, np.float32))
                self._index_added(n)
        if self._vindex is None:
            self._state()  # index as it is written (the first write of a process opens it)

    def _rows(self, f: EpisodeFilter) -> np.ndarray:
        if f.selects_all:
            ids: np.ndarray = self._state()["ids"]
            return ids
        return super()._rows(f)

    def _term_counts(
        self, terms: Sequence[str], rows: np.ndarray, nb_rows: NeighbourRows | None = None
    ) -> np.ndarray:
        """How often each term occurs in each row's window document: (len(rows), len(terms)),
        counted from the rows' and their neighbours' own tokens (:mod:`~ctxkeep.episodic.terms`).
        """
        cfg = self.config
        return window_term_counts(
            rows, terms, self._own_counts, nb_rows or self._nb_rows, cfg.window, cfg.self_weight
        )

    def _own_counts(self, rows: np.ndarray, terms: Sequence[str]) -> np.ndarray:
        """How often each term occurs in each row's own tokens (sorted unique ``rows``).

        The tokens are held in process (:class:`~ctxkeep.episodic.terms.TokenTable`): a row's
        tokens never change and rows are never reused, so what the table holds stays valid
        whoever writes; rows it lacks are read here. A row gone meanwhile counts nothing.
        """
        if self._tokens.missing(rows).size:
            with self._tokens_lock:
                self._read_tokens(self._tokens.missing(rows))
        return self._tokens.counts(rows, terms)

    def _read_tokens(self, lacking: np.ndarray) -> None:
        """Add the tokens of ``lacking`` rows to the table, or of every row it lacks (see
        :data:`READ_ALL_TOKENS`).
        """
        table = self._tokens
        ids = self._state()["ids"]
        absent = table.missing(ids)
        if self._tokens_read + lacking.size < READ_ALL_TOKENS * absent.size:
            self._tokens_read += lacking.size
            found = self._select_in(
                "read tokens", "SELECT row, tokens FROM ctxkeep_episodes", "row", lacking
            )
        else:
            self._tokens_read = 0
            if len(table) > ids.size + max(1_000, ids.size // 10):
                table.keep(ids)  # let go of forgotten rows
                self._tokens_hold = None
            lacking = sorted_unique(np.concatenate([lacking, absent]))
            found = self._db.q(
                "read tokens",
                "SELECT row, tokens FROM ctxkeep_episodes WHERE row >= ? ORDER BY row",
                (int(lacking[0]),),
            )
            rows = np.fromiter((r for r, _ in found), np.int64, len(found))
            found = [found[i] for i in np.flatnonzero(in_sorted(rows, lacking)).tolist()]
        table.add([r for r, _ in found], [t for _, t in found])

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
        st = self._state()
        doclen = st["doclen"][self._pos_of(rows, st)]
        return bm25(hits, doclen, self.config.k1, self.config.b)

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        return self.vectors.vectors(rows)

    def _candidates(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        """For a scope of more than ``4n`` episodes: the ``n`` best by BM25 over the
        informative query terms (store-wide statistics, as in the memory store) and the ``n``
        nearest in the vector index, with their session neighbours; their lexical scores are
        BM25 over every query term with store-wide statistics.
        """
        st = self._state()
        index = self._vindex
        assert index is not None
        scope = st["ids"] if f.selects_all else self._rows(f)
        if scope.size <= 4 * n:
            return None
        parts = []
        counts = Counter(terms)
        use_lex = bool(terms) and bool(self.config.lexical_weight)
        df = self._doc_freq(list(counts), st) if use_lex else {}
        informative = informative_terms(counts, df, st["ids"].size) if use_lex else []
        nb_rows = self._nb_in(st)
        doclen = st["doclen"]
        cfg = self.config
        if informative:
            # the window documents holding an informative term, with its counts, from the
            # postings of the rows' own tokens (no FTS5 query: finding them there and
            # counting their terms took most of a search), scored as the memory store does
            sub = {w: counts[w] for w in informative}
            live = self._row_index(st)
            with self._tokens_lock:
                self._hold_tokens(st["ids"])
                found, tf = window_hits(
                    self._tokens, list(sub), live, nb_rows, cfg.window, cfg.self_weight
                )
            if not f.selects_all:
                keep = in_sorted(found, scope)
                found, tf = found[keep], tf[keep]
            found_len = doclen[live.find(found)]
            scores = store_bm25(sub, df, tf, found_len, doclen, cfg.k1, cfg.b)
            parts.append(found[lexical_top(scores, n)])
        if q is not None:
            parts.append(index.search(q, n, None if f.selects_all else scope)[0])
        cand = with_neighbours(parts, nb_rows, scope)
        if not use_lex:
            return cand, None
        tf = self._term_counts(list(counts), cand, nb_rows)
        lex = store_bm25(counts, df, tf, doclen[self._pos_of(cand, st)], doclen, cfg.k1, cfg.b)
        return cand, lex

    def _hold_tokens(self, ids: np.ndarray) -> None:
        """Make the token table hold every row of ``ids`` (a state's rows; under the tokens
        lock). Checking all 100,000 rows took 0.4-0.8 ms a search: once they are held, the same
        ``ids`` array (a state's, replaced when rows change) is not checked again.
        """
        if self._tokens_hold is ids:
            return
        lacking = self._tokens.missing(ids)
        if lacking.size:
            self._read_tokens(lacking)
        self._tokens_hold = ids

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
                self._db.q(
                    "count document frequencies",
                    f"SELECT term, doc FROM ctxkeep_episode_vocab WHERE term IN ({marks})",
                    tuple(missing),
                )
            )
            with self._cache_lock:
                for w in missing:
                    self._df[w] = int(found.get(w, 0))
        with self._cache_lock:
            return {w: self._df.get(w, 0) for w in terms}

    def _nb_rows(self, rows: np.ndarray) -> np.ndarray:
        st = self._state()
        out: np.ndarray = st["nb"][self._pos_of(rows, st)]
        return out

    def _created(self, rows: np.ndarray) -> np.ndarray:
        st = self._state()
        out: np.ndarray = st["created"][self._pos_of(rows, st)]
        return out

    def _delete(self, rows: np.ndarray) -> None:
        self._state()  # the index is open: what is deleted leaves it (and its file)
        deleted: list[int] = []
        with self._db.tx("forget episodes") as conn:
            sessions: dict[str, int] = {}
            ids = rows.tolist()
            for s in range(0, len(ids), self.chunk):
                part = ids[s : s + self.chunk]
                marks = ", ".join("?" for _ in part)
                for r, sid, pos in conn.execute(
                    f"DELETE FROM ctxkeep_episodes WHERE row IN ({marks}) "
                    "RETURNING row, session_id, pos",
                    part,
                ).fetchall():
                    sessions[sid] = min(sessions.get(sid, pos), pos)
                    deleted.append(r)
                conn.execute(f"DELETE FROM ctxkeep_episode_fts WHERE rowid IN ({marks})", part)
            self._close_gaps(conn, sessions)
        with self._cache_lock:
            self._writes += 1
            if self._vindex is not None and deleted:
                self._vindex.remove(deleted)
                self._save_index()  # forgotten vectors leave the file too

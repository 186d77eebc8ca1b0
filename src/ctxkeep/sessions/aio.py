"""The async twin of :class:`~ctxkeep.sessions.base.MemoryManager`.

Every method is the sync manager's, run in a worker thread (``asyncio.to_thread``), so the
logic exists once and an event loop is never blocked by storage I/O. Names follow the sync
API with an ``a`` prefix where the sync name is kept for clarity (``aclose``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from ctxkeep.messages import Message
from ctxkeep.sessions.base import EvictHook, MemoryManager, OnAppend, SessionPrompt
from ctxkeep.sessions.records import SessionInfo


class AsyncMemoryManager:
    """Async access to a :class:`MemoryManager` (same semantics, awaitable methods)."""

    def __init__(self, sync: MemoryManager) -> None:
        self.sync = sync

    async def create_session(
        self,
        agent_id: str,
        *,
        task_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> str:
        """See :meth:`MemoryManager.create_session`."""
        return await asyncio.to_thread(
            self.sync.create_session,
            agent_id,
            task_id=task_id,
            metadata=metadata,
            session_id=session_id,
        )

    async def get_session(self, session_id: str) -> SessionInfo:
        """See :meth:`MemoryManager.get_session`."""
        return await asyncio.to_thread(self.sync.get_session, session_id)

    async def add_message(self, session_id: str, role: str, content: Any, **fields: Any) -> Message:
        """See :meth:`MemoryManager.add_message`."""
        return await asyncio.to_thread(self.sync.add_message, session_id, role, content, **fields)

    async def add_structured_message(self, session_id: str, message: Any) -> Message:
        """See :meth:`MemoryManager.add_structured_message`."""
        return await asyncio.to_thread(self.sync.add_structured_message, session_id, message)

    async def add_messages(self, session_id: str, messages: Iterable[Any]) -> list[Message]:
        """See :meth:`MemoryManager.add_messages`."""
        return await asyncio.to_thread(self.sync.add_messages, session_id, list(messages))

    async def add_messages_creating(
        self,
        session_id: str,
        agent_id: str,
        messages: Iterable[Any],
        *,
        on_append: OnAppend | None = None,
    ) -> None:
        """See :meth:`MemoryManager.add_messages_creating`."""
        await asyncio.to_thread(
            self.sync.add_messages_creating,
            session_id,
            agent_id,
            list(messages),
            on_append=on_append,
        )

    async def get_messages(self, session_id: str, *, limit: int | None = None) -> list[Message]:
        """See :meth:`MemoryManager.get_messages`."""
        return await asyncio.to_thread(self.sync.get_messages, session_id, limit=limit)

    async def build_prompt_messages(
        self, session_id: str, *, system: str | Message | None = None, pruner: Any = None
    ) -> list[Message]:
        """See :meth:`MemoryManager.build_prompt_messages`."""
        return await asyncio.to_thread(
            self.sync.build_prompt_messages, session_id, system=system, pruner=pruner
        )

    async def build_prompt(
        self,
        session_id: str,
        *,
        system: str | Message | None = None,
        pruner: Any = None,
    ) -> SessionPrompt:
        """Async :meth:`MemoryManager.build_prompt`."""
        return await asyncio.to_thread(
            self.sync.build_prompt, session_id, system=system, pruner=pruner
        )

    async def list_sessions(
        self,
        *,
        agent_id: str | None = None,
        task_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[SessionInfo]:
        """See :meth:`MemoryManager.list_sessions`."""
        return await asyncio.to_thread(
            self.sync.list_sessions, agent_id=agent_id, task_id=task_id, limit=limit, offset=offset
        )

    async def delete_session(self, session_id: str) -> bool:
        """See :meth:`MemoryManager.delete_session`."""
        return await asyncio.to_thread(self.sync.delete_session, session_id)

    async def get_latest_session_for_agent(self, agent_id: str) -> str | None:
        """See :meth:`MemoryManager.get_latest_session_for_agent`."""
        return await asyncio.to_thread(self.sync.get_latest_session_for_agent, agent_id)

    async def pop_message(self, session_id: str) -> Message | None:
        """See :meth:`MemoryManager.pop_message`."""
        return await asyncio.to_thread(self.sync.pop_message, session_id)

    async def replace_newest(
        self, session_id: str, messages: Iterable[Any], *, newest_id: str
    ) -> list[Message]:
        """See :meth:`MemoryManager.replace_newest`."""
        return await asyncio.to_thread(
            self.sync.replace_newest, session_id, list(messages), newest_id=newest_id
        )

    async def has_session(self, session_id: str) -> bool:
        """See :meth:`MemoryManager.has_session`."""
        return await asyncio.to_thread(self.sync.has_session, session_id)

    async def archived_messages(self, session_id: str) -> list[Message]:
        """See :meth:`MemoryManager.archived_messages`."""
        return await asyncio.to_thread(self.sync.archived_messages, session_id)

    async def session_count(self) -> int:
        """See :meth:`MemoryManager.session_count`."""
        return await asyncio.to_thread(self.sync.session_count)

    def add_evict_hook(self, hook: EvictHook) -> None:
        """See :meth:`MemoryManager.add_evict_hook` (no I/O: not a coroutine)."""
        self.sync.add_evict_hook(hook)

    async def sweep(self) -> int:
        """See :meth:`MemoryManager.sweep`."""
        return await asyncio.to_thread(self.sync.sweep)

    async def aclose(self) -> None:
        """Close the underlying manager."""
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncMemoryManager:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

"""Every public method of MemoryManager has an async twin on AsyncMemoryManager, with the same
parameters, and the twin does what the sync method does."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from ctxkeep.sessions import MemoryConfig, open_async_memory
from ctxkeep.sessions.aio import AsyncMemoryManager
from ctxkeep.sessions.base import MemoryManager

NOT_IO = {"add_evict_hook"}  # registers a callback: a plain method on both
RENAMED = {"close": "aclose"}


def _public(cls: type) -> dict[str, object]:
    return {n: f for n, f in vars(cls).items() if callable(f) and not n.startswith("_")}


@pytest.mark.parametrize("name", sorted(_public(MemoryManager)))
def test_every_sync_method_has_an_async_twin_with_the_same_parameters(name: str) -> None:
    twin = getattr(AsyncMemoryManager, RENAMED.get(name, name), None)
    assert twin is not None, f"AsyncMemoryManager lacks {RENAMED.get(name, name)}"
    assert inspect.iscoroutinefunction(twin) == (name not in NOT_IO)
    sync_params = list(inspect.signature(getattr(MemoryManager, name)).parameters.values())
    async_params = list(inspect.signature(twin).parameters.values())
    assert [(p.name, p.kind, p.default) for p in sync_params] == [
        (p.name, p.kind, p.default) for p in async_params
    ]


def test_async_twins_read_what_the_sync_manager_wrote() -> None:
    async def main() -> None:
        async with open_async_memory("memory://", MemoryConfig(max_history=2)) as mem:
            sid = await mem.create_session("a")
            for text in ("one", "two", "three"):
                await mem.add_message(sid, "user", text)
            assert await mem.has_session(sid)
            assert await mem.session_count() == 1
            assert [m.content for m in await mem.archived_messages(sid)] == ["one"]
            assert [m.content for m in mem.sync.get_messages(sid)] == ["two", "three"]

    asyncio.run(main())

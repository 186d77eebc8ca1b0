"""The Agents SDK session's storage calls on a SQLite file run in the store's one worker thread,
whose connection keeps its page cache (asyncio's pool spread them over a connection per
thread, each meeting a cold cache); and its appends store the messages it converted without
copying them (``MemoryManager._add_creating(owned=True)``). Issue 26.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from ctxkeep import MemoryConfig, open_memory
from ctxkeep.integrations import openai_agents
from ctxkeep.integrations.openai_agents import CtxkeepSession
from ctxkeep.messages import Message

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


def _items(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": f"{tag} {i}"} for i in range(n)]


def test_sqlite_sessions_run_in_one_thread_per_store(tmp_path: Path) -> None:
    with open_memory(f"sqlite:///{tmp_path}/s.db", CONFIG) as mem:
        threads: set[int] = set()
        for name in ("append", "read_stored", "read", "read_tail", "since"):
            wrapped = getattr(mem.backend, name, None)
            if wrapped is None:
                continue

            def watch(*a: Any, _fn: Any = wrapped, **kw: Any) -> Any:
                threads.add(threading.get_ident())
                return _fn(*a, **kw)

            setattr(mem.backend, name, watch)
        sessions = [CtxkeepSession(f"s{i}", memory=mem) for i in range(4)]

        async def work(s: CtxkeepSession, i: int) -> None:
            for k in range(5):
                await s.add_items(_items(2, f"{i}.{k}"))
                await s.get_items(limit=3)
            assert await s.pop_item() == _items(2, f"{i}.4")[-1]
            assert len(await s.get_items()) == 9

        async def main() -> None:
            await asyncio.gather(*(work(s, i) for i, s in enumerate(sessions)))

        asyncio.run(main())
        assert len(threads) == 1 and threading.get_ident() not in threads
        worker = openai_agents._WORKERS[mem]
        assert all(s._worker is worker for s in sessions)


def test_an_owning_session_stops_its_worker(tmp_path: Path) -> None:
    session = CtxkeepSession("s", f"sqlite:///{tmp_path}/s.db", config=CONFIG)
    asyncio.run(session.add_items(_items(1, "x")))
    worker = session._worker
    assert worker is not None and openai_agents._WORKERS.get(session.memory) is worker
    session.close()
    assert session.memory not in openai_agents._WORKERS
    with pytest.raises(RuntimeError):  # shut down
        worker.submit(print)


def test_other_stores_use_asyncios_pool() -> None:
    session = CtxkeepSession("s", "memory://", config=CONFIG)
    assert session._worker is None
    asyncio.run(session.add_items(_items(2, "m")))
    assert asyncio.run(session.get_items()) == _items(2, "m")


def test_owned_messages_are_stored_as_given(tmp_path: Path) -> None:
    with open_memory(f"sqlite:///{tmp_path}/s.db", CONFIG) as mem:
        given = [Message("user", [{"type": "text", "text": "a"}], metadata={"k": [1]})]
        mem._add_creating("s", "agent", given, owned=True)
        assert given[0].id is not None and given[0].created_at is not None  # stamped in place
        assert mem.get_messages("s") == given
        kept = [Message("user", "b")]
        mem.add_messages_creating("s", "agent", kept)
        assert kept[0].id is None  # not owned: a stamped copy is stored
        assert [m.content for m in mem.get_messages("s")][-1] == "b"
        # a retry of an owned batch (its ids stamped already) stores nothing twice
        mem._add_creating("s", "agent", given, owned=True)
        assert len(mem.get_messages("s")) == 2


def _exercise(worker: Any) -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def boom() -> None:
        raise KeyError("boom")

    async def main() -> None:
        var.set("caller's")
        assert await worker.run(var.get) == "caller's"
        assert await worker.run(threading.get_ident) != threading.get_ident()
        with pytest.raises(KeyError, match="boom"):
            await worker.run(boom)
        # a call whose task is cancelled before it starts is not run
        ran: list[int] = []
        gate = threading.Event()
        blocker = asyncio.ensure_future(worker.run(gate.wait))
        waiting = asyncio.ensure_future(worker.run(ran.append, 1))
        await asyncio.sleep(0.01)
        waiting.cancel()
        gate.set()
        assert await blocker is True
        assert await worker.run(len, ran) == 0

    asyncio.run(main())
    assert worker.submit(pow, 2, 5).result() == 32


def test_the_worker_hands_back_results_errors_and_the_callers_context(tmp_path: Path) -> None:
    with open_memory(f"sqlite:///{tmp_path}/s.db", CONFIG) as mem:
        worker = openai_agents._worker_for(mem)
        assert worker is not None
        _exercise(worker)
        thread = worker.thread
        assert thread in openai_agents._LIVE
        # dropped (its store's entry gone), the worker's thread ends
        del worker
        openai_agents._WORKERS.pop(mem, None)
        gc.collect()
        thread.join(5)
        assert not thread.is_alive() and thread not in openai_agents._LIVE

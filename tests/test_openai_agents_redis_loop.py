"""The Agents SDK session on Redis runs its calls in the event loop's thread, each round trip
awaited (``ctxkeep._bridge``, ``Direct.acall``), where it hopped to a worker thread and back:
tasks and loops sharing one session take turns and never wait on each other forever, and a
cancelled call leaves what the session holds as the store holds it. Issue 26.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from conftest_services import redis_prefix_factory, redis_url

pytest.importorskip("agents")
pytest.importorskip("greenlet")
redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

from ctxkeep import MemoryConfig, MemoryManager, _bridge, open_memory  # noqa: E402
from ctxkeep._redis import Direct  # noqa: E402
from ctxkeep.integrations import openai_agents  # noqa: E402
from ctxkeep.integrations.openai_agents import CtxkeepSession  # noqa: E402

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]

CONFIG = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)


@pytest.fixture
def mem(redis_url: str, redis_prefix_factory: Callable[[], str]) -> Iterator[MemoryManager]:
    with open_memory(f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}", CONFIG) as m:
        yield m


def _items(n: int, tag: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": f"{tag} {i}"} for i in range(n)]


def _in_thread(main: Callable[[], Any], timeout: float = 60.0) -> None:
    """Run ``main`` in a thread of its own and fail if it does not finish (a loop waiting on
    itself would block forever, and the test with it).
    """
    failed: list[BaseException] = []

    def target() -> None:
        try:
            main()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the session's calls waited on each other"
    if failed:
        raise failed[0]


def test_a_redis_session_awaits_its_round_trips_in_the_loop_thread(
    mem: MemoryManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = CtxkeepSession("conv", memory=mem)
    asyncio.run(session.add_items(_items(3, "warm")))  # created, scripts loaded
    threads: set[int] = set()
    acall = Direct.acall

    async def watched(self: Direct, *command: Any, **kw: Any) -> Any:
        threads.add(threading.get_ident())
        return await acall(self, *command, **kw)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a call hopped to a thread")

    monkeypatch.setattr(Direct, "acall", watched)
    monkeypatch.setattr(openai_agents.asyncio, "to_thread", refused)

    async def main() -> tuple[list[Any], Any, list[Any]]:
        await session.add_items(_items(2, "more"))
        got = await session.get_items(limit=2)
        popped = await session.pop_item()
        return got, popped, await session.get_items()

    got, popped, rest = asyncio.run(main())
    assert got == _items(2, "more")
    assert popped == _items(2, "more")[-1]
    assert rest == _items(3, "warm") + _items(1, "more")
    assert threads == {threading.get_ident()}


def test_tasks_sharing_a_session_in_one_loop_take_turns(mem: MemoryManager) -> None:
    session = CtxkeepSession("conv", memory=mem)
    asyncio.run(session.add_items(_items(1, "first")))
    popped: list[Any] = []

    async def main() -> None:
        async def add(k: int) -> None:
            await session.add_items(_items(2, f"t{k}"))

        async def pop() -> None:
            popped.append(await session.pop_item())

        await asyncio.gather(*(add(k) for k in range(10)), *(pop() for _ in range(5)))

    _in_thread(lambda: asyncio.run(main()))
    left = asyncio.run(session.get_items())
    assert len(left) == 1 + 20 - 5
    assert all(p is not None for p in popped)
    fresh = CtxkeepSession("conv", memory=mem)  # holds nothing: reads the store
    assert asyncio.run(fresh.get_items()) == left
    everything = [i["content"] for i in left + popped]
    assert sorted(everything) == sorted(
        ["first 0"] + [f"t{k} {i}" for k in range(10) for i in range(2)]
    )


def test_sessions_sharing_a_store_in_one_loop_run_at_once(mem: MemoryManager) -> None:
    sessions = [CtxkeepSession(f"conv{n}", memory=mem) for n in range(8)]

    async def work(session: CtxkeepSession, n: int) -> Any:
        for k in range(5):
            await session.add_items(_items(2, f"s{n}.{k}"))
            await session.get_items(limit=3)
        return await session.pop_item()

    async def main() -> list[Any]:
        return await asyncio.gather(*(work(s, n) for n, s in enumerate(sessions)))

    popped: list[Any] = []
    _in_thread(lambda: popped.extend(asyncio.run(main())))
    assert popped == [_items(2, f"s{n}.4")[-1] for n in range(8)]
    for n, session in enumerate(sessions):
        kept = [i for k in range(5) for i in _items(2, f"s{n}.{k}")][:-1]
        assert asyncio.run(session.get_items()) == kept


def test_loops_in_threads_sharing_a_session_each_store_theirs(mem: MemoryManager) -> None:
    session = CtxkeepSession("conv", memory=mem)

    def work(n: int) -> None:
        async def main() -> None:
            for k in range(10):
                await session.add_items(_items(1, f"l{n}.{k}"))
                await session.get_items(limit=3)

        asyncio.run(main())

    def all_loops() -> None:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    _in_thread(all_loops)
    got = asyncio.run(session.get_items())
    assert sorted(i["content"] for i in got) == sorted(
        f"l{n}.{k} 0" for n in range(4) for k in range(10)
    )
    assert asyncio.run(CtxkeepSession("conv", memory=mem).get_items()) == got


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 5, 8])
def test_a_cancelled_pop_leaves_the_session_as_the_store_holds_it(
    mem: MemoryManager, yields: int
) -> None:
    session = CtxkeepSession("conv", memory=mem)
    asyncio.run(session.add_items(_items(6, "m")))
    asyncio.run(session.get_items())  # items held

    async def main() -> Any:
        task = asyncio.ensure_future(session.pop_item())
        for _ in range(yields):  # cut it at one point or another of its round trip
            await asyncio.sleep(0)
        task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"
        finally:
            assert await session.pop_item() is not None  # the session is usable

    outcome = asyncio.run(main())
    held = asyncio.run(session.get_items())
    assert held == asyncio.run(CtxkeepSession("conv", memory=mem).get_items())
    assert held in (_items(6, "m")[:4], _items(6, "m")[:5])
    assert outcome in ("cancelled", _items(6, "m")[-1])


def test_without_greenlet_a_redis_session_runs_in_a_thread(
    mem: MemoryManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_bridge, "AVAILABLE", False)
    session = CtxkeepSession("conv", memory=mem)
    threads: set[int] = set()
    call = Direct.__call__

    def watched(self: Direct, *command: Any, **kw: Any) -> Any:
        threads.add(threading.get_ident())
        return call(self, *command, **kw)

    monkeypatch.setattr(Direct, "__call__", watched)

    async def main() -> Any:
        await session.add_items(_items(2, "x"))
        return await session.pop_item()

    assert asyncio.run(main()) == _items(2, "x")[-1]
    assert threads and threading.get_ident() not in threads


def test_clear_session_sent_by_redis_py_runs_off_the_loop(
    mem: MemoryManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = CtxkeepSession("conv", memory=mem)
    asyncio.run(session.add_items(_items(2, "x")))
    threads: list[int] = []
    delete = mem.delete_session

    def watched(session_id: str) -> Any:
        threads.append(threading.get_ident())
        return delete(session_id)

    monkeypatch.setattr(mem, "delete_session", watched)

    async def main() -> list[Any]:
        await session.clear_session()
        return await session.get_items()

    assert asyncio.run(main()) == []
    assert threads and threading.get_ident() not in threads


def test_what_redis_py_sends_for_a_bridged_call_leaves_the_loop_free(
    redis_url: str, redis_prefix_factory: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's creation on its first add and a trim past ``max_history`` go through
    redis-py's client, which has no awaited form: its round trips are sent from a thread
    (``_bridge.blocking``), never from the loop's, which goes on meanwhile."""
    config = MemoryConfig(max_history=4, session_ttl=None, max_sessions=None)
    url = f"{redis_url}?{urlencode({'prefix': redis_prefix_factory()})}"
    senders: list[int] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def watched(self: Any, command: Any, check_health: bool = True) -> None:
        senders.append(threading.get_ident())
        send(self, command, check_health)

    with open_memory(url, config) as memory:
        session = CtxkeepSession("conv", memory=memory)
        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", watched)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0)
                ticks += 1

        async def main() -> list[Any]:
            ticker = asyncio.ensure_future(tick())
            try:
                await session.add_items(_items(3, "a"))  # creates the session
                for k in range(4):  # past max_history: trimmed
                    await session.add_items(_items(1, f"b{k}"))
                return await session.get_items()
            finally:
                ticker.cancel()

        loop_thread = threading.get_ident()
        assert asyncio.run(main()) == [item for k in range(4) for item in _items(1, f"b{k}")]
    assert senders, "redis-py sent nothing: the test no longer reaches its paths"
    assert loop_thread not in senders
    assert ticks > 0

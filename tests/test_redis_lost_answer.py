"""A Redis append whose answer was lost is stored once.

A raw TCP proxy stands between the backend and a real Redis: when told to, it forwards what the
client sends and closes the client's connection on the server's next answer instead of passing
it on (the script ran; its answer was lost). The client's :class:`ctxkeep._redis.Direct` sends
the command again on a new connection, as redis-py's retries do: an append whose ids were made
for it (``Append.fresh_ids``: a LangChain message or an Agents SDK item without one) was sent
again as it was, told to look no id up, and stored the message a second time. It is sent again
looking its ids up, so the second run finds the message and stores nothing. A replace or a
pop (an Agents SDK ``pop_item``) sent again found its own write and answered that the session
had changed (and ``pop_item`` took a second item): each carries a token the first run leaves in
the session's hash, so the second run answers what the first did.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode, urlparse

import pytest

from _proxy import ForwardingProxy
from conftest_services import redis_prefix_factory, redis_url
from ctxkeep.errors import SessionChangedError
from ctxkeep.integrations.openai_agents import CtxkeepSession
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager

pytest.importorskip("redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'")

pytestmark = pytest.mark.redis

__all__ = ["redis_prefix_factory", "redis_url"]


class LosingProxy(ForwardingProxy):
    """Forwards TCP both ways to ``upstream``; while :attr:`lose` is above 0, the server's
    next answer on any connection closes that connection instead of reaching the client.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.lose = 0
        self.lost = 0
        self.meanwhile: Callable[[], None] | None = None
        """Run where an answer is lost, before the client sees its connection close."""
        self._lock = threading.Lock()
        super().__init__(upstream)

    def passes(self, data: bytes, *, answer: bool) -> bool:
        if not answer:
            return True
        with self._lock:
            if self.lose <= 0:
                return True
            self.lose -= 1
            self.lost += 1
        if self.meanwhile is not None:
            self.meanwhile()
        return False


@pytest.fixture
def proxy(redis_url: str) -> Iterator[LosingProxy]:
    parsed = urlparse(redis_url)
    p = LosingProxy((parsed.hostname or "127.0.0.1", parsed.port or 6379))
    yield p
    p.close()


@pytest.fixture
def mem(
    proxy: LosingProxy, redis_url: str, redis_prefix_factory: Callable[[], str]
) -> Iterator[MemoryManager]:
    db = urlparse(redis_url).path or "/0"
    url = f"redis://127.0.0.1:{proxy.port}{db}?{urlencode({'prefix': redis_prefix_factory()})}"
    config = MemoryConfig(max_history=None, max_sessions=None, session_ttl=None)
    m = open_memory(url, config=config)
    yield m
    m.close()


def test_an_append_of_new_ids_whose_answer_was_lost_is_stored_once(
    mem: MemoryManager, proxy: LosingProxy
) -> None:
    sid = mem.create_session("agent")
    mem.add_messages(sid, [{"role": "user", "content": "first"}])  # scripts loaded, state known
    proxy.lose = 1
    mem.add_messages(sid, [{"role": "assistant", "content": "second"}])  # no id: made here
    assert proxy.lost == 1  # the answer was lost, and the append answered all the same
    held = mem.get_messages(sid)
    assert [m.content for m in held] == ["first", "second"]
    assert len({m.id for m in held}) == 2


def test_an_agents_sdk_add_whose_answer_was_lost_is_stored_once(
    mem: MemoryManager, proxy: LosingProxy
) -> None:
    session = CtxkeepSession("conv", memory=mem)
    items: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]

    async def main() -> list[Any]:
        await session.add_items(items[:1])
        proxy.lose = 1
        await session.add_items(items[1:])  # awaited in the loop: Direct.acall's resend
        return await CtxkeepSession("conv", memory=mem).get_items()

    got = asyncio.run(main())
    assert proxy.lost == 1
    assert [i["content"] for i in got] == ["hi", "hello"]


def test_a_pop_whose_answer_was_lost_takes_one_item(mem: MemoryManager, proxy: LosingProxy) -> None:
    # The pop script ran and its answer was lost: sent again as it was, it found the newest
    # message gone ('stale'), the session answered SessionChangedError and the adapter read
    # and popped again, taking a second item. The op's token in the session's hash makes the
    # second run answer the first one's outcome.
    session = CtxkeepSession("conv", memory=mem)
    items: list[Any] = [{"role": "user", "content": c} for c in ("one", "two", "three")]

    async def main() -> tuple[Any, list[Any]]:
        for item in items:  # one message each: a pop takes a message back
            await session.add_items([item])
        proxy.lose = 1
        popped = await session.pop_item()  # awaited in the loop: Direct's resend
        return popped, await CtxkeepSession("conv", memory=mem).get_items()

    popped, held = asyncio.run(main())
    assert proxy.lost == 1
    assert popped is not None and popped["content"] == "three"
    assert [i["content"] for i in held] == ["one", "two"]


def test_a_replace_whose_answer_was_lost_is_done_once(
    mem: MemoryManager, proxy: LosingProxy
) -> None:
    # Sent again as it was, the replace script found the replacement newest, not the message
    # it replaces ('stale'), and replace_newest raised SessionChangedError for a replace
    # that had been stored.
    sid = mem.create_session("agent")
    _, second = mem.add_messages(
        sid, [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    )
    mem.get_messages(sid)  # the newest message known: the replace is one script call
    proxy.lose = 1
    third = {"role": "assistant", "content": "third"}
    (stored,) = mem.replace_newest(sid, [third], newest_id=second.id or "")
    assert proxy.lost == 1
    held = mem.get_messages(sid)
    assert [m.content for m in held] == ["first", "third"]
    assert held[-1].id == stored.id


def test_a_sync_pop_whose_answer_was_lost_takes_one_message(
    mem: MemoryManager, proxy: LosingProxy
) -> None:
    sid = mem.create_session("agent")
    mem.add_messages(sid, [{"role": "user", "content": c} for c in ("one", "two", "three")])
    newest = mem.get_messages(sid)[-1]
    proxy.lose = 1
    assert mem.replace_newest(sid, [], newest_id=newest.id) == []  # a conditional pop
    assert proxy.lost == 1
    assert [m.content for m in mem.get_messages(sid)] == ["one", "two"]


def _other_process(mem: MemoryManager, redis_url: str) -> MemoryManager:
    """A second manager on ``mem``'s keys, straight to Redis (not through the proxy)."""
    db = urlparse(redis_url).path or "/0"
    prefix = mem.backend.keys.prefix  # type: ignore[attr-defined]
    base = redis_url.split("?")[0].rsplit("/", 1)[0]
    config = MemoryConfig(max_history=None, max_sessions=None, session_ttl=None)
    return open_memory(f"{base}{db}?{urlencode({'prefix': prefix})}", config=config)


def test_a_pop_sent_again_after_another_write_is_not_done_twice(
    mem: MemoryManager, proxy: LosingProxy, redis_url: str
) -> None:
    # Between the lost answer and the send again, another process appends: the token is
    # found, but the session has moved on from the pop's revision. The pop is not done again
    # (it would take 'four'), and the answer makes no claim on the session as it now is: the
    # next read has the other's message.
    sid = mem.create_session("agent")
    mem.add_messages(sid, [{"role": "user", "content": c} for c in ("one", "two", "three")])
    newest = mem.get_messages(sid)[-1]
    with _other_process(mem, redis_url) as other:
        proxy.meanwhile = lambda: other.add_message(sid, "user", "four")
        proxy.lose = 1
        assert mem.replace_newest(sid, [], newest_id=newest.id) == []
        proxy.meanwhile = None
        assert proxy.lost == 1
        assert [m.content for m in mem.get_messages(sid)] == ["one", "two", "four"]
        assert [m.content for m in other.get_messages(sid)] == ["one", "two", "four"]


def test_a_replace_sent_again_after_another_write_is_not_done_twice(
    mem: MemoryManager, proxy: LosingProxy, redis_url: str
) -> None:
    sid = mem.create_session("agent")
    _, second = mem.add_messages(
        sid, [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    )
    mem.get_messages(sid)
    with _other_process(mem, redis_url) as other:
        proxy.meanwhile = lambda: other.add_message(sid, "user", "fourth")
        proxy.lose = 1
        third = {"role": "assistant", "content": "third"}
        (stored,) = mem.replace_newest(sid, [third], newest_id=second.id or "")
        proxy.meanwhile = None
        assert proxy.lost == 1
        # What this process knows of the session is not 'third' as the newest: a pop of it
        # (by its id) is refused, not taken from 'fourth'.
        with pytest.raises(SessionChangedError):
            mem.replace_newest(sid, [], newest_id=stored.id or "")
        held = mem.get_messages(sid)
        assert [m.content for m in held] == ["first", "third", "fourth"]
        assert held[1].id == stored.id

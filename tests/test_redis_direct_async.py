"""Round trips awaited in the event loop (``ctxkeep._redis.Direct.acall`` / ``atransaction``,
and sync code run by ``ctxkeep._bridge.run`` reaching them through ``__call__``): the held
connections of the sync path, waited on by the loop, never one that could answer a later
call with an earlier call's reply, against a real Redis. The twin of test_redis_direct.py.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from conftest_services import redis_url

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)
pytest.importorskip("greenlet")

from ctxkeep import _bridge, _redis  # noqa: E402
from ctxkeep._redis import Direct, direct  # noqa: E402

pytestmark = pytest.mark.redis

__all__ = ["client", "redis_url"]

# the sync tests' helpers and client fixture: the awaited calls are checked as the sync ones
from test_redis_direct import ECHO, _script, _taken, client  # noqa: E402


def _no_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a thread was used")

    monkeypatch.setattr(_redis.asyncio, "to_thread", refused)


def _kill(client: Any, conn: Any) -> None:
    """Have the server drop ``conn``."""
    conn.send_command("CLIENT", "ID")
    assert client.client_kill_filter(_id=conn.read_response()) == 1


def test_awaited_calls_run_in_the_loop_on_the_held_connection(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = direct(client)
    assert runner.awaits
    assert runner("PING") is True or runner("PING") == "PONG"  # one connection held
    taken = _taken(monkeypatch, client.connection_pool)
    _no_threads(monkeypatch)

    async def main() -> list[Any]:
        return [await runner.acall("EVAL", ECHO, 0, str(i)) for i in range(5)]

    assert asyncio.run(main()) == [[str(i), 7] for i in range(5)]
    assert taken == []
    assert runner("EVAL", ECHO, 0, "sync") == ["sync", 7]  # the socket is blocking again


def test_bridged_code_awaits_its_scripts_in_the_loop(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(client)
    assert script([], "warm") == ["warm", 7]  # loaded, and a connection held
    _no_threads(monkeypatch)
    loop_thread = threading.get_ident()
    seen: list[Any] = []
    acall = Direct.acall

    async def watched(self: Direct, *command: Any, **kw: Any) -> Any:
        seen.append(threading.get_ident())
        return await acall(self, *command, **kw)

    monkeypatch.setattr(Direct, "acall", watched)

    def sync_work() -> list[Any]:  # plain sync code, as a store runs it
        return [script([], "a"), script([], "b")]

    assert asyncio.run(_bridge.run(sync_work)) == [["a", 7], ["b", 7]]
    assert seen == [loop_thread, loop_thread]


def test_bridged_code_loads_a_script_the_server_lacks(client: Any) -> None:
    script = _script(client)

    def sync_work() -> Any:
        return script([], "first")

    assert asyncio.run(_bridge.run(sync_work)) == ["first", 7]
    assert client.script_exists(script.sha) == [True]


def test_an_awaited_error_reply_raises_and_leaves_the_connection_usable(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = direct(client)
    runner("PING")
    taken = _taken(monkeypatch, client.connection_pool)

    async def main() -> Any:
        with pytest.raises(redis.ResponseError, match="unknown command"):
            await runner.acall("NOSUCHCOMMAND")
        with pytest.raises(redis.exceptions.NoScriptError):
            await runner.acall("EVALSHA", "0" * 40, 0)
        return await runner.acall("EVAL", ECHO, 0, "b")

    assert asyncio.run(main()) == ["b", 7]
    assert taken == []  # the held one answered all of it


def test_an_error_inside_bridged_code_raises_where_the_sync_call_would(client: Any) -> None:
    broken = _script(client, "return redis.call('NOSUCHCOMMAND')")

    def sync_work() -> str:
        try:
            broken([], "x")
        except redis.ResponseError as exc:
            return f"caught {type(exc).__name__}"
        return "not raised"

    assert asyncio.run(_bridge.run(sync_work)) == "caught ResponseError"


def test_an_awaited_call_cancelled_between_send_and_reply_never_answers_the_next_call(
    client: Any,
) -> None:
    runner = direct(client)
    key = f"ctxkeep-test:{uuid.uuid4().hex}"

    async def main() -> list[Any]:
        # BLPOP waits on an empty list: its reply comes after the cancellation
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(runner.acall("BLPOP", key, 1), 0.05)
        return [await runner.acall("ECHO", "next"), await runner.acall("ECHO", "then")]

    try:
        assert asyncio.run(main()) == ["next", "then"]
        client.rpush(key, "late")  # what the BLPOP would have taken stays
        assert runner("LRANGE", key, 0, -1) == ["late"]
    finally:
        client.delete(key)


def test_a_cancellation_is_raised_inside_bridged_code(client: Any) -> None:
    runner = direct(client)
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    unwound: list[str] = []

    def sync_work() -> Any:
        try:
            return runner("BLPOP", key, 1)
        finally:
            unwound.append("finally")

    async def main() -> Any:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_bridge.run(sync_work), 0.05)
        return await runner.acall("ECHO", "after")

    assert asyncio.run(main()) == "after"
    assert unwound == ["finally"]


def test_an_awaited_call_on_a_dropped_connection_is_made_again(client: Any) -> None:
    runner = direct(client)
    runner("PING")
    _kill(client, runner._idle[-1])

    async def main() -> list[Any]:
        return [await runner.acall("ECHO", "b"), await runner.acall("ECHO", "c")]

    assert asyncio.run(main()) == ["b", "c"]


def test_an_awaited_call_past_the_socket_timeout_raises_and_the_next_answers(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=0.05)
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    try:
        runner = direct(client)

        async def main() -> Any:
            with pytest.raises(redis.TimeoutError):
                await runner.acall("BLPOP", key, 1)
            return await runner.acall("ECHO", "next")

        assert asyncio.run(main()) == "next"
    finally:
        client.close()


def test_an_awaited_call_in_a_forked_process_takes_its_own_connection(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = direct(client)
    runner("PING")
    parents = list(runner._idle)
    assert parents
    monkeypatch.setattr(_redis, "_forks", _redis._forks)
    _redis._forked()  # what the child of a fork runs (os.register_at_fork)
    taken = _taken(monkeypatch, client.connection_pool)
    assert asyncio.run(runner.acall("ECHO", "b")) == "b"
    assert len(taken) == 1
    assert taken[0] not in parents


def test_a_pool_that_cannot_hold_awaits_its_calls_in_a_thread(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, max_connections=4, decode_responses=True)
    try:
        runner = direct(client)
        assert not runner.awaits
        threads: list[int] = []
        call = Direct.__call__

        def watched(self: Direct, *command: Any, **kw: Any) -> Any:
            threads.append(threading.get_ident())
            return call(self, *command, **kw)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Direct, "__call__", watched)
            assert asyncio.run(runner.acall("ECHO", "x")) == "x"
        assert threads and threads[0] != threading.get_ident()
    finally:
        client.close()


# -- read-only transactions -----------------------------------------------------------------------


def test_an_awaited_transaction_answers_each_command(client: Any) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.hset(f"{key}:h", mapping={"a": "1", "b": "2"})
    client.zadd(f"{key}:z", {"x": 1, "y": 2, "z": 3})
    runner = direct(client)
    try:
        fields, members = asyncio.run(
            runner.atransaction(
                ("HGETALL", f"{key}:h"), ("ZRANGEBYSCORE", f"{key}:z", "(1", "+inf")
            )
        )
    finally:
        client.delete(f"{key}:h", f"{key}:z")
    flat = fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=True))
    assert flat == {"a": "1", "b": "2"}
    assert members == ["y", "z"]


def test_an_error_in_an_awaited_transaction_raises_and_the_next_one_answers_its_own(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.set(key, "not a hash")
    runner = direct(client)
    runner("PING")
    taken = _taken(monkeypatch, client.connection_pool)

    async def main() -> list[Any]:
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await runner.atransaction(("HGETALL", key), ("GET", key))
        with pytest.raises(redis.ResponseError):  # refused while queued: EXECABORT
            await runner.atransaction(("GET", key, "extra"))
        return await runner.atransaction(("GET", key), ("STRLEN", key))

    try:
        assert asyncio.run(main()) == ["not a hash", 10]
        assert runner("GET", key) == "not a hash"
        assert taken == []  # every reply was read: the held connection stayed
    finally:
        client.delete(key)


def test_an_awaited_transaction_on_a_dropped_connection_is_tried_on_a_new_one(
    client: Any,
) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.set(key, "v")
    runner = direct(client)
    try:
        runner("PING")
        _kill(client, runner._idle[-1])
        assert asyncio.run(runner.atransaction(("GET", key))) == ["v"]
    finally:
        client.delete(key)


def test_an_awaited_pipeline_answers_each_command_in_the_loop(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.zadd(key, {"x": 1, "y": 2})
    script = _script(client, "return redis.call('ZCARD', KEYS[1])")
    runner = direct(client)
    runner("PING")
    _no_threads(monkeypatch)

    async def main() -> list[Any]:
        answers = await runner.apipeline(("ZRANGE", key, -1, -1), ("HGETALL", key))
        # sync code run by the bridge awaits its pipelines in the loop too
        return [answers, await _bridge.run(script.followed, [key], [], ("ZRANGE", key, 0, 0))]

    try:
        (top, wrong), followed = asyncio.run(main())
    finally:
        client.delete(key)
    assert top == ["y"] and isinstance(wrong, redis.ResponseError)
    assert followed == [2, ["x"]]


def test_loops_in_threads_and_tasks_at_once_each_get_their_own_answers(client: Any) -> None:
    script = _script(client)
    client.script_load(script.source)
    runner = direct(client)
    wrong: list[tuple[str, Any]] = []

    async def task(name: str) -> None:
        for i in range(100):
            asked = f"{name}-{i}"
            if i % 2:
                answer = await runner.acall("EVALSHA", script.sha, 0, asked)
            else:
                answer = await _bridge.run(script, [], asked)
            if answer != [asked, 7]:
                wrong.append((asked, answer))

    async def loop(name: str) -> None:
        await asyncio.gather(*(task(f"{name}.{k}") for k in range(4)))

    threads = [threading.Thread(target=asyncio.run, args=(loop(f"t{n}"),)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert len(runner._idle) <= Direct.IDLE

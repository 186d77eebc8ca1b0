"""Scripts sent on a held connection (``ctxkeep._redis.Direct``, under ``LuaScript``): one
connection kept between calls, and never one that could answer a later call with an earlier
call's reply, against a real Redis.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from conftest_services import redis_url

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

from ctxkeep import _redis  # noqa: E402
from ctxkeep._redis import Direct, LuaScript, direct  # noqa: E402

pytestmark = pytest.mark.redis

__all__ = ["redis_url"]

ECHO = "return {ARGV[1], 7}"


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    """A client of its own (its pool counts only this test's connections)."""
    made = redis.Redis.from_url(redis_url, decode_responses=True)
    yield made
    made.close()


def _script(client: Any, source: str = ECHO) -> LuaScript:
    # a source of the test's own, so that its first run meets NOSCRIPT wherever it runs
    return LuaScript(client, f"-- {uuid.uuid4().hex}\n{source}")


def _taken(monkeypatch: pytest.MonkeyPatch, pool: Any) -> list[Any]:
    """The connections the pool hands out from now on."""
    taken: list[Any] = []
    get = pool.get_connection

    def counting(*args: Any, **kwargs: Any) -> Any:
        conn = get(*args, **kwargs)
        taken.append(conn)
        return conn

    monkeypatch.setattr(pool, "get_connection", counting)
    return taken


def test_a_script_runs_on_one_connection_held_between_calls(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(client)
    client.script_load(script.source)
    taken = _taken(monkeypatch, client.connection_pool)
    answers = [script([], str(i)) for i in range(5)]
    assert answers == [[str(i), 7] for i in range(5)]
    # redis-py's execute_command takes one from the pool for each call
    assert len(taken) == 1
    assert direct(client).holds


def test_one_client_has_one_direct_for_all_its_scripts(client: Any) -> None:
    assert _script(client)._run is _script(client)._run is direct(client)


def test_an_error_reply_raises_and_leaves_the_connection_usable(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _script(client, "return redis.call('NOSUCHCOMMAND')")
    fine = _script(client)
    client.script_load(broken.source)
    assert fine([], "a") == ["a", 7]
    taken = _taken(monkeypatch, client.connection_pool)
    with pytest.raises(redis.ResponseError):
        broken([], "x")
    assert fine([], "b") == ["b", 7]
    assert taken == []  # the held one answered all of it


def test_a_call_cut_between_send_and_reply_never_answers_the_next_call(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(client)
    assert script([], "first") == ["first", 7]
    conn = direct(client)._idle[-1]
    if direct(client).raw:  # read on the socket itself: its first read is cut
        monkeypatch.setattr(conn, "_sock", _CutSocket(conn._sock))
    else:
        read = conn.read_response
        calls = 0

        def interrupted(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise KeyboardInterrupt  # the reply to "lost" stays unread on the socket
            return read(*args, **kwargs)

        monkeypatch.setattr(conn, "read_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        script([], "lost")
    assert script([], "next") == ["next", 7]
    assert script([], "then") == ["then", 7]


class _CutSocket:
    """A connection's socket whose first read is interrupted (the reply stays unread on it)."""

    def __init__(self, sock: Any) -> None:
        self._real = sock
        self.reads = 0

    def recv(self, *args: Any) -> Any:
        self.reads += 1
        if self.reads == 1:
            raise KeyboardInterrupt
        return self._real.recv(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_replies_are_read_on_the_socket_where_hiredis_reads_them(client: Any) -> None:
    run = direct(client)
    assert run.raw == run.hiredis  # a plain TCP connection: hiredis reads its replies
    script = _script(client)
    assert script([], "a") == ["a", 7]
    assert run("ECHO", "b") == "b"
    assert run.transaction(("ECHO", "c"), ("ECHO", "d")) == ["c", "d"]
    with pytest.raises(redis.ResponseError):
        run("NOSUCHCOMMAND")
    with pytest.raises(redis.ResponseError):
        run.transaction(("ECHO", "e"), ("NOSUCHCOMMAND",))
    assert run("ECHO", "f") == "f"  # the connection is still in step


def test_a_connection_the_server_dropped_is_made_again(client: Any) -> None:
    script = _script(client)
    assert script([], "a") == ["a", 7]
    conn = direct(client)._idle[-1]
    conn.send_command("CLIENT", "ID")
    held = conn.read_response()
    assert client.client_kill_filter(_id=held) == 1
    assert script([], "b") == ["b", 7]
    assert script([], "c") == ["c", 7]


def test_a_forked_process_takes_its_own_connection(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(client)
    assert script([], "a") == ["a", 7]
    parents = list(direct(client)._idle)
    assert parents
    monkeypatch.setattr(_redis, "_forks", _redis._forks)
    _redis._forked()  # what the child of a fork runs (os.register_at_fork)
    taken = _taken(monkeypatch, client.connection_pool)
    assert script([], "b") == ["b", 7]
    assert len(taken) == 1
    assert taken[0] not in parents


@pytest.mark.skipif(not hasattr(_redis.os, "fork"), reason="no fork()")
def test_the_child_of_a_real_fork_holds_none_of_its_parents_connections(client: Any) -> None:
    script = _script(client)
    assert script([], "a") == ["a", 7]
    assert direct(client)._idle
    pid = _redis.os.fork()
    if pid == 0:  # the child: its Direct holds none of the parent's sockets
        _redis.os._exit(0 if direct(client)._held() is None else 1)
    _, status = _redis.os.waitpid(pid, 0)
    assert _redis.os.waitstatus_to_exitcode(status) == 0
    assert direct(client)._held() is not None  # the parent's are still its own


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda url: redis.Redis.from_url(url, max_connections=4), id="small-pool"),
        pytest.param(
            lambda url: redis.Redis(
                connection_pool=redis.BlockingConnectionPool.from_url(url, max_connections=4)
            ),
            id="blocking-pool",
        ),
    ],
)
def test_a_pool_that_bounds_its_connections_gets_each_one_back(
    redis_url: str, make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = make(redis_url)
    try:
        script = _script(client)
        assert not direct(client).holds
        pool = client.connection_pool
        taken = _taken(monkeypatch, pool)
        given: list[Any] = []
        release = pool.release
        monkeypatch.setattr(pool, "release", lambda conn: (given.append(conn), release(conn)))
        for i in range(3):
            assert script([], str(i)) == [str(i).encode(), 7]
        assert len(taken) >= 3
        assert given == taken
    finally:
        client.close()


def test_without_hiredis_the_command_is_packed_by_redis_py(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_redis, "hiredis", None)
    runner = Direct(client)
    assert not runner.hiredis
    assert runner("EVAL", ECHO, 0, "é✓") == ["é✓", 7]


# -- read-only transactions -----------------------------------------------------------------------


def test_a_transaction_answers_each_command_in_one_write(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.hset(f"{key}:h", mapping={"a": "1", "b": "2"})
    client.zadd(f"{key}:z", {"x": 1, "y": 2, "z": 3})
    sent: list[Any] = []
    runner = direct(client)
    try:
        runner("PING")  # a held connection to watch
        exchange = runner._roundtrip  # each call's one write
        monkeypatch.setattr(
            runner, "_roundtrip", lambda c, p, n: (sent.append(p), exchange(c, p, n))[1]
        )
        fields, members = runner.transaction(
            ("HGETALL", f"{key}:h"), ("ZRANGEBYSCORE", f"{key}:z", "(1", "+inf")
        )
    finally:
        client.delete(f"{key}:h", f"{key}:z")
    flat = fields if isinstance(fields, dict) else dict(zip(fields[::2], fields[1::2], strict=True))
    assert flat == {"a": "1", "b": "2"}
    assert members == ["y", "z"]
    assert len(sent) == 1
    assert sent[0].count(b"MULTI") == 1


def test_an_error_in_a_transaction_raises_and_the_next_one_answers_its_own(client: Any) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.set(key, "not a hash")
    runner = direct(client)
    try:
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            runner.transaction(("HGETALL", key), ("GET", key))
        assert runner.transaction(("GET", key), ("STRLEN", key)) == ["not a hash", 10]
        assert runner("GET", key) == "not a hash"
    finally:
        client.delete(key)


def test_a_transaction_on_a_dropped_connection_is_tried_on_a_new_one(client: Any) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.set(key, "v")
    runner = direct(client)
    try:
        runner("PING")
        conn = runner._idle[-1]
        conn.send_command("CLIENT", "ID")
        assert client.client_kill_filter(_id=conn.read_response()) == 1
        assert runner.transaction(("GET", key)) == ["v"]
    finally:
        client.delete(key)


# -- commands pipelined after a script ----------------------------------------------------------


def test_a_pipeline_answers_each_command_in_one_write_and_keeps_error_replies(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.zadd(key, {"x": 1, "y": 2})
    sent: list[Any] = []
    runner = direct(client)
    try:
        runner("PING")  # a held connection to watch
        exchange = runner._roundtrip
        monkeypatch.setattr(
            runner, "_roundtrip", lambda c, p, n: (sent.append(p), exchange(c, p, n))[1]
        )
        top, wrong, echo = runner.pipeline(("ZRANGE", key, -1, -1), ("HGETALL", key), ("ECHO", "e"))
    finally:
        client.delete(key)
    assert top == ["y"] and echo == "e"
    assert isinstance(wrong, redis.ResponseError)  # not raised: the others stand
    assert len(sent) == 1 and b"MULTI" not in sent[0]
    assert runner("ECHO", "f") == "f"  # every reply was read: the connection is in step


def test_a_script_followed_by_a_read_loads_itself_and_answers_both(client: Any) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    script = _script(client, "redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2]) return 1")
    try:  # the first run meets NOSCRIPT (the read after it answers all the same)
        assert script.followed([key], ["1", "a"], ("ZRANGE", key, -1, -1)) == [1, ["a"]]
        assert script.followed([key], ["2", "b"], ("ZRANGE", key, -1, -1)) == [1, ["b"]]
        failing = _script(client, "return redis.error_reply('NOPE no')")
        with pytest.raises(redis.ResponseError, match="NOPE"):
            failing.followed([key], [], ("ZRANGE", key, -1, -1))
        assert client.zrange(key, 0, -1) == ["a", "b"]
    finally:
        client.delete(key)


def test_a_pipeline_on_a_dropped_connection_or_a_single_connection_client_answers(
    client: Any, redis_url: str
) -> None:
    key = f"ctxkeep-test:{uuid.uuid4().hex}"
    client.set(key, "v")
    runner = direct(client)
    single = redis.Redis.from_url(redis_url, decode_responses=True, single_connection_client=True)
    try:
        runner("PING")
        conn = runner._idle[-1]
        conn.send_command("CLIENT", "ID")
        assert client.client_kill_filter(_id=conn.read_response()) == 1
        assert runner.pipeline(("GET", key), ("STRLEN", key)) == ["v", 1]
        answers = Direct(single).pipeline(("GET", key), ("HGETALL", key))
        assert answers[0] == "v" and isinstance(answers[1], redis.ResponseError)
    finally:
        client.delete(key)
        single.close()


def test_threads_calling_at_once_each_get_their_own_answers(client: Any) -> None:
    script = _script(client)
    client.script_load(script.source)
    wrong: list[tuple[str, Any]] = []

    def work(name: str) -> None:
        for i in range(200):
            asked = f"{name}-{i}"
            answer = script([], asked)
            if answer != [asked, 7]:
                wrong.append((asked, answer))

    threads = [threading.Thread(target=work, args=(f"t{n}",)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    assert len(direct(client)._idle) <= Direct.IDLE

"""What every Redis-backed part shares: URL handling, the connection, optimistic transactions,
schema versions, and the one place redis-py's errors become
:class:`~ctxkeep.errors.StorageError`.

:class:`RedisClient` is the client a store holds (checkpoints, the bus, the fabric's task state;
sessions next); the module functions below it (:func:`split_url`, :func:`describe_url`,
:func:`connect`, :func:`atomic`, :func:`translated`) are its parts, kept for the stores that
use them directly. :class:`LuaScript` runs a store's Lua script in one ``EVALSHA``.

URLs. ``?prefix=`` is ctxkeep's (the key prefix, ``ctxkeep:`` by default); a store may claim
more query parameters of its own (``params``), which the client takes out and hands back in
:attr:`RedisClient.params`; the rest goes to redis-py.

Schema versions. Every store keeps its version in one hash, ``{prefix}meta``, one field per
store (``checkpoints``, ``bus``, ``fabric``, ``sessions``...), and passes an ordered list of
migrations: position ``i`` brings the store's keys from version ``i`` to ``i + 1``. A store
already at the newest version is opened with one read and no write; a newer version is refused
with :class:`~ctxkeep.errors.SchemaVersionError`. Before the meta hash, checkpoints and
sessions kept their version in a string key of their own, ``{prefix}schema:{store}``: a store
that did (``legacy_schema_key=True``) adopts that version when the hash has no field for it,
and keeps the old key in step, because an older ctxkeep reads only that key and must refuse a
layout it cannot read.

Importing this module without redis-py installed raises an ``ImportError`` naming the extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeAlias, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from ctxkeep import _bridge
from ctxkeep.errors import ConfigError, MissingDependencyError, SchemaVersionError, StorageError

try:
    import redis
    from redis._parsers import _HiredisParser
    from redis._parsers import hiredis as _hiredis_parser
    from redis.client import Pipeline
    from redis.connection import DefaultParser, PythonRespSerializer
    from redis.utils import HIREDIS_AVAILABLE
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("redis", "redis") from exc

try:
    import hiredis
except ImportError:  # pragma: no cover - redis-py packs in Python then (Direct.hiredis)
    hiredis = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from redis.typing import EncodableT

_NOT_ENOUGH_DATA: Any = getattr(_hiredis_parser, "NOT_ENOUGH_DATA", False)
"""What the hiredis reader of redis-py's parser gives while a reply is incomplete."""
_PUSH: Any = getattr(hiredis, "PushNotification", None)
"""The type of a RESP3 push message read by hiredis (3.2 on), between replies."""

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_PREFIX = "ctxkeep:"

Again: TypeAlias = "Callable[[], Sequence[EncodableT]]"
"""What a write is sent as where a dropped connection sends it a second time (its first run may
have been done and only its answer lost): made only then, not on every call.
"""

Migration: TypeAlias = "Callable[[RedisClient], None]"
"""One step of a store's migrations, run with the store's client (it may run twice when two
processes open an old key space at once: keep it idempotent).
"""

__all__ = [
    "DEFAULT_PREFIX",
    "Direct",
    "LuaScript",
    "Migration",
    "Pipeline",
    "RedisClient",
    "atomic",
    "connect",
    "describe_url",
    "direct",
    "redis",
    "split_url",
    "storage_error",
    "take_params",
    "translated",
]


# -- the parts ----------------------------------------------------------------------------------


def take_params(url: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """``(url without the named query parameters, {name: its last value})``.

    A store's own URL parameters (such as the session store's ``?ttl_grace=``) come out here,
    before the URL reaches redis-py, which refuses parameters it does not know.
    """
    parsed = urlparse(url)
    query = parse_qsl(parsed.query, keep_blank_values=True)
    taken = {k: v for k, v in query if k in names}
    rest = urlencode([(k, v) for k, v in query if k not in names])
    return urlunparse(parsed._replace(query=rest)), taken


def split_url(url: str, prefix: str | None = None) -> tuple[str, str]:
    """``(url for redis-py, key prefix)``: ``?prefix=`` is ctxkeep's, the rest redis-py's.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL, perhaps with ``?prefix=``.
        prefix: the prefix asked for in code (``None``: the URL's, else ``ctxkeep:``).

    Raises:
        ConfigError: an empty prefix, or the URL and ``prefix`` disagree.

    """
    rest, taken = take_params(url, ("prefix",))
    in_url = taken.get("prefix")
    if in_url is not None and prefix is not None and in_url != prefix:
        raise ConfigError(f"two key prefixes given: {in_url!r} in the URL and {prefix!r}; pass one")
    chosen = prefix if prefix is not None else (in_url if in_url is not None else DEFAULT_PREFIX)
    if not chosen:
        raise ConfigError("the Redis key prefix must not be empty (?prefix=...)")
    return rest, chosen


def describe_url(url: str) -> str:
    """Where a Redis URL points, without its password (for error messages):
    ``host:port/db``, or the socket's path.
    """
    parsed = urlparse(url)
    if not parsed.hostname:
        return parsed.path
    return f"{parsed.hostname}:{parsed.port or 6379}{parsed.path}"


class _Client(redis.Redis):
    """redis-py's client, whose round trips in code :func:`ctxkeep._bridge.run` runs in an
    event loop are sent from a thread and awaited (:func:`ctxkeep._bridge.blocking`): what
    has no awaited form (a session's creation, a trim, an eviction, a ``WATCH`` transaction)
    does not block the loop. Elsewhere it is redis-py's client, unchanged.
    """

    def execute_command(self, *args: Any, **options: Any) -> Any:
        return _bridge.blocking(super().execute_command, *args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _Pipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class _Pipeline(Pipeline):
    """:class:`_Client`'s pipeline: its sends (the queued commands, the immediate ones while
    watching, the ``UNWATCH`` of a reset) awaited in the same way.
    """

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        return _bridge.blocking(super().execute, raise_on_error)

    def immediate_execute_command(self, *args: Any, **options: Any) -> Any:
        return _bridge.blocking(super().immediate_execute_command, *args, **options)

    def reset(self) -> None:  # type: ignore[override]  # Pipeline.reset, not RESET
        if self.watching and self.connection is not None:  # it sends UNWATCH
            _bridge.blocking(super().reset)
        else:
            super().reset()


def connect(url: str) -> redis.Redis:
    """A client for a URL without ctxkeep's parameters (strings in, strings out).

    Raises:
        ConfigError: a URL redis-py cannot read.

    """
    try:
        return _Client.from_url(url, decode_responses=True, socket_connect_timeout=5)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL: {exc}") from exc


def atomic(client: redis.Redis, watch: list[str], body: Callable[[Pipeline], T]) -> T:
    """Run ``body`` with the ``watch`` keys watched; ``EXEC`` what it queued after ``MULTI``,
    and start over when a watched key changed meanwhile (optimistic locking).

    ``body`` reads at once through the pipe until it calls ``pipe.multi()``; an exception it
    raises ends the attempt and propagates.
    """
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(*watch)  # type: ignore[no-untyped-call]
                result = body(pipe)
                if pipe.explicit_transaction:
                    pipe.execute()
                else:
                    pipe.reset()
                return result
            except redis.WatchError:
                continue


def storage_error(where: str, exc: redis.RedisError) -> StorageError:
    """The StorageError a redis-py error becomes: the one wording, naming the server."""
    return StorageError(f"Redis at {where}: {exc}")


def translated(method: Callable[P, T]) -> Callable[P, T]:
    """Wrap redis-py's errors in StorageError, naming the server (the method's object has a
    ``where`` attribute).
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            raise storage_error(getattr(args[0], "where", "?"), exc) from exc

    return wrapper


class Direct:
    """Commands of a hot path sent on a connection of the client's pool, without redis-py's
    ``execute_command`` around them (:class:`LuaScript` runs its scripts here).

    ``execute_command`` takes a connection from the pool (a poll of the socket for stray
    data, a lock and the pool's metrics counters each way), packs the arguments in Python
    (a generator and an encoder call per argument) and times the call for its metrics: 43 us
    of client CPU for an ``EVALSHA`` of 24 arguments, where packing it by hiredis and the
    socket's send and receive take 9 us (client thread time over 4,000 calls to a private
    Redis 7.0; 18 us with a connection taken from the pool and given back each call). Here
    the arguments are packed by hiredis in one call (when it is installed and the client
    encodes UTF-8 strictly, redis-py's own rule for strings), and the connection is one this
    object holds between calls (up to :attr:`IDLE` of them, one per thread calling at once):
    each call is a send and a read.

    A connection comes back to the idle ones only after a whole answer was read (a reply, or
    an error reply such as ``NOSCRIPT``); any other outcome (an interrupt, a timeout, a
    dropped connection) disconnects it, so no later call can read an earlier call's answer.
    A dropped connection is the case redis-py's retries are for: the command is then run
    again through ``execute_command``, whose retry policy applies as before. Connections held
    are the pool's (in use, as the pool counts them), so closing the client closes them; a
    process forked meanwhile leaves the parent's alone and takes its own. A pool this does
    not fit (another class than :class:`redis.ConnectionPool`, a client-side cache, RESP3,
    which may interleave push messages, a ``max_connections`` below :attr:`MIN_POOL`, a
    single-connection client) takes a connection from the pool for each call and gives it
    back, still packed by hiredis.

    Awaited. :meth:`acall`, :meth:`atransaction` and :meth:`apipeline` are the same round
    trips waited on in the running event loop: the same packing, the same held connections
    (their socket non-blocking for the call; the event loop waits for it to be readable), the
    reply read by the connection's own hiredis reader, the same outcomes. A new connection is
    made in a thread (its connect and handshake block), a dropped one is tried once more on a
    new one. Code run by :func:`ctxkeep._bridge.run` reaches them through ``__call__``,
    :meth:`transaction` and :meth:`pipeline` themselves, so one body of sync code serves
    both. It needs what
    holding needs, hiredis's parser, and a plain TCP or Unix socket (:attr:`awaits`;
    otherwise they run the sync call in a thread).
    """

    IDLE = 2
    """Connections held between calls, at most."""
    MIN_POOL = 16
    """The smallest ``max_connections`` a pool must allow for connections to be held."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        pool = client.connection_pool
        self.pool = pool
        kwargs = pool.connection_kwargs
        self.hiredis = (
            hiredis is not None
            and HIREDIS_AVAILABLE
            and (
                kwargs.get("encoding", "utf-8").lower().replace("-", "") == "utf8"
                and kwargs.get("encoding_errors", "strict") == "strict"
            )
        )
        self.holds = (
            type(pool) is redis.ConnectionPool
            and getattr(pool, "cache", None) is None
            and kwargs.get("protocol") in (None, 2, "2")
            and pool.max_connections >= self.MIN_POOL
            and client.connection is None
        )
        self.raw = (
            self.hiredis
            and pool.connection_class in (redis.Connection, redis.UnixDomainSocketConnection)
            and kwargs.get("parser_class", DefaultParser) is _HiredisParser
        )
        """Whether a round trip is sent and read on the connection's socket and hiredis reader
        themselves (:meth:`_roundtrip`), not through redis-py's ``send_packed_command`` and
        ``read_response``."""
        self.awaits = self.raw and self.holds
        """Whether :meth:`acall` and :meth:`atransaction` wait in the event loop."""
        self._packer = PythonRespSerializer(6000, pool.get_encoder().encode)
        self._idle: list[Any] = []
        self._forks = _forks

    def __call__(self, *command: EncodableT, again: Again | None = None) -> Any:
        """Run ``command``; its answer as the connection's parser gives it (no response
        callback: for ``EVALSHA`` redis-py has none). An error reply raises as redis-py
        raises it; a dropped connection runs the command again through ``execute_command``:
        what ``again()`` gives where given (the form of a write that is safe to run a second
        time, as its first run may have been done and only its answer lost; made only then),
        else ``command``.
        """
        if self.awaits and _bridge.bridged():
            return _bridge.wait(self.acall(*command, again=again))
        if self.client.connection is not None:  # a single-connection client: its own lock
            return self.client.execute_command(*command)  # type: ignore[no-untyped-call]
        conn = self._take()
        done = False
        try:
            (answer,) = self._roundtrip(conn, self._pack(command), 1)
            done = True  # a whole reply, an error reply too: the connection is clean
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()
            resent = command if again is None else again()
            return self.client.execute_command(*resent)  # type: ignore[no-untyped-call]
        finally:
            if not done:
                conn.disconnect()
            self._give(conn)
        if isinstance(answer, redis.ResponseError):
            raise answer
        return answer

    def transaction(self, *commands: Sequence[EncodableT]) -> list[Any]:
        """Run read-only ``commands`` in one ``MULTI``/``EXEC`` sent as one write; their
        answers as the connection's parser gives them (``HGETALL``: a flat list of fields and
        values; no response callbacks). One round trip, as redis-py's transaction pipeline,
        without its per-command Python work. An error reply raises (the connection, whose
        other replies are unread, is dropped); a dropped connection is tried once more on a
        new one (the commands only read).
        """
        if self.awaits and _bridge.bridged():
            return _bridge.wait(self.atransaction(*commands))
        packed = self._pack_transaction(commands)
        for attempt in (1, 2):
            conn = self._take()
            done = False
            try:
                replies = self._roundtrip(conn, packed, len(commands) + 2)
                done = True  # every reply read: the connection is clean
            except (redis.ConnectionError, redis.TimeoutError):
                if attempt == 2:
                    raise
                continue
            finally:
                if not done:
                    conn.disconnect()
                self._give(conn)
            for reply in replies[:-1]:  # OK, then QUEUED for each command
                if isinstance(reply, redis.ResponseError):
                    raise reply
            return _answers(replies[-1])
        raise AssertionError("unreachable")  # pragma: no cover

    def pipeline(self, *commands: Sequence[EncodableT]) -> list[Any]:
        """Run ``commands`` sent as one write and read back together: one round trip, not a
        transaction (another client's commands may run between them). Their answers in
        order, as the connection's parser gives them, an error reply as the exception it made
        (not raised: the others stand). A dropped connection runs them again through a
        redis-py pipeline, as :meth:`__call__` does one command.
        """
        if self.awaits and _bridge.bridged():
            return _bridge.wait(self.apipeline(*commands))
        if self.client.connection is not None:  # a single-connection client: its own lock
            return self._pipelined(commands)
        conn = self._take()
        done = False
        try:
            packed = b"".join(self._pack(c) for c in commands)
            answers = self._roundtrip(conn, packed, len(commands))
            done = True  # every reply read: the connection is clean
        except (redis.ConnectionError, redis.TimeoutError):
            conn.disconnect()
            return self._pipelined(commands)
        finally:
            if not done:
                conn.disconnect()
            self._give(conn)
        return answers

    def _pipelined(self, commands: Sequence[Sequence[EncodableT]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)  # type: ignore[no-untyped-call]
        return pipe.execute(raise_on_error=False)

    async def acall(self, *command: EncodableT, again: Again | None = None) -> Any:
        """``self(*command)`` awaited in the running event loop (see the class docstring):
        its answer as ``__call__`` gives it; an error reply raises as there; a dropped
        connection (or a timeout) runs the command (``again`` where given, as there) once
        more on a new one.
        """
        if not self.awaits:
            return await asyncio.to_thread(functools.partial(self, *command, again=again))
        resend = None if again is None else lambda: self._pack(tuple(again()))
        (answer,) = await self._aexchange(self._pack(command), 1, resend)
        if isinstance(answer, redis.ResponseError):
            raise answer  # a whole error reply: the connection is clean
        return answer

    async def atransaction(self, *commands: Sequence[EncodableT]) -> list[Any]:
        """:meth:`transaction` awaited in the running event loop (see the class
        docstring): the same answers and errors; every reply is read, so the connection
        stays held after an error reply.
        """
        if not self.awaits:
            return await asyncio.to_thread(self.transaction, *commands)
        replies = await self._aexchange(self._pack_transaction(commands), len(commands) + 2)
        for reply in replies[:-1]:  # OK, then QUEUED for each command
            if isinstance(reply, redis.ResponseError):
                raise reply
        return _answers(replies[-1])

    async def apipeline(self, *commands: Sequence[EncodableT]) -> list[Any]:
        """:meth:`pipeline` awaited in the running event loop (see the class docstring): the
        same answers; a dropped connection sends the commands once more on a new one.
        """
        if not self.awaits:
            return await asyncio.to_thread(self.pipeline, *commands)
        return await self._aexchange(b"".join(self._pack(c) for c in commands), len(commands))

    async def _aexchange(
        self, packed: bytes, replies: int, resend: Callable[[], bytes] | None = None
    ) -> list[Any]:
        """:meth:`_exchange` on a held connection (or a new one); a dropped connection or a
        timeout sends ``packed`` (what ``resend()`` packs, where given) once more on a new one. A
        connection cut short (an error, a cancellation) is disconnected before it is given
        back.
        """
        for attempt in (1, 2):
            conn = await self._atake()
            done = False
            try:
                answers = await self._exchange(conn, packed, replies)
                done = True
            except (redis.ConnectionError, redis.TimeoutError):
                if attempt == 2:
                    raise
                if resend is not None:
                    packed = resend()
                continue
            finally:
                if not done:
                    conn.disconnect()
                self._give(conn)
            return answers
        raise AssertionError("unreachable")  # pragma: no cover

    def _roundtrip(self, conn: Any, packed: bytes, replies: int) -> list[Any]:
        """Send ``packed`` on ``conn`` and read ``replies`` replies, blocking; error replies
        are returned as redis-py's parser makes them (not raised).

        Where the connection is a plain socket read by hiredis (:attr:`raw`), on the socket
        and the reader themselves: what ``send_packed_command`` and ``read_response`` do for
        a whole reply, without their per-call Python (the host's name formatted for an error
        message that is not raised, the push and health-check bookkeeping of RESP3 and of a
        health-check interval, which :attr:`holds` excludes or this path does not use): 8.3
        -> 6.4 us of client CPU for a round trip of a short command to a private Redis.

        Raises:
            redis.ConnectionError: the connection was closed or broke.
            redis.TimeoutError: no reply within the connection's ``socket_timeout``.

        """
        if not self.raw:
            conn.send_packed_command([packed], check_health=False)
            out: list[Any] = []
            for _ in range(replies):
                try:
                    out.append(conn.read_response())
                except redis.ResponseError as exc:  # a whole error reply
                    out.append(exc)
            return out
        if conn._sock is None:
            conn.connect()
        sock, reader = _socket(conn)
        answers: list[Any] = []
        try:
            sock.sendall(packed)
            # read first: a connection starts a round trip with nothing unread (see the
            # class docstring), so no answer can be in the reader before the first read
            while True:
                data = sock.recv(65536)
                if not data:
                    raise redis.ConnectionError("Connection closed by server.")
                reader.feed(data)
                if not _take_replies(conn, reader, answers, replies):
                    break
        except TimeoutError as exc:  # socket.timeout
            raise redis.TimeoutError(f"Timeout on the socket: {exc}") from exc
        except OSError as exc:
            raise redis.ConnectionError(f"Error on the socket: {exc}") from exc
        return answers

    async def _exchange(self, conn: Any, packed: bytes, replies: int) -> list[Any]:
        """Send ``packed`` on ``conn`` and read ``replies`` replies, waiting in the running
        loop only when the socket is not ready (a wait of at most the connection's
        ``socket_timeout``, as each of its sync sends and reads); error replies are
        returned as redis-py's parser makes them (not raised).

        Raises:
            redis.ConnectionError: the connection was closed or broke.
            redis.TimeoutError: the socket was not ready within the timeout.

        """
        if conn._sock is None:  # disconnected after a call was cut short: connect off the loop
            await asyncio.to_thread(conn.connect)
        sock, reader = _socket(conn)
        timeout = conn.socket_timeout
        answers: list[Any] = []
        sock.setblocking(False)
        try:
            view = memoryview(packed)
            while view:
                try:
                    view = view[sock.send(view) :]
                except BlockingIOError:
                    await _ready(sock, timeout, writing=True)
            while True:  # read first, as _roundtrip does
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    await _ready(sock, timeout, writing=False)
                    continue
                if not data:
                    raise redis.ConnectionError("Connection closed by server.")
                reader.feed(data)
                if not _take_replies(conn, reader, answers, replies):
                    break
        except OSError as exc:
            raise redis.ConnectionError(f"Error on the socket: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):  # closed meanwhile: nothing to restore
                sock.settimeout(timeout)
        return answers

    def _pack(self, command: Sequence[EncodableT]) -> bytes:
        if self.hiredis:
            return bytes(hiredis.pack_command(tuple(command)))  # type: ignore[arg-type]
        return b"".join(self._packer.pack(*command))  # type: ignore[no-untyped-call]

    def _pack_transaction(self, commands: Sequence[Sequence[EncodableT]]) -> bytes:
        return b"".join(self._pack(c) for c in (("MULTI",), *commands, ("EXEC",)))

    def _held(self) -> Any:
        """A connection held between calls, or None."""
        if self.holds:
            if self._forks != _forks:  # forked: those are the parent's sockets
                self._idle, self._forks = [], _forks
            try:
                return self._idle.pop()
            except IndexError:
                pass
        return None

    def _take(self) -> Any:
        conn = self._held()
        return conn if conn is not None else self.pool.get_connection()

    async def _atake(self) -> Any:
        conn = self._held()
        if conn is not None:
            return conn
        # the pool connects a new connection (and may wait for one): not in the loop
        return await asyncio.to_thread(self.pool.get_connection)

    def _give(self, conn: Any) -> None:
        if self.holds and len(self._idle) < self.IDLE and self._forks == _forks:
            self._idle.append(conn)
        else:
            self.pool.release(conn)


_forks = 0
"""How many times this process has been a fork's child: a :class:`Direct` made before the
newest fork holds its parent's connections. Counted by a hook of ``os.register_at_fork``, where
a ``getpid`` on each take and give of a connection was two system calls a round trip."""


def _forked() -> None:
    global _forks
    _forks += 1


os.register_at_fork(after_in_child=_forked)


def _socket(conn: Any) -> tuple[Any, Any]:
    """The socket of a connected ``conn`` and its hiredis reader (:attr:`Direct.raw`).

    Raises:
        redis.ConnectionError: the connection was closed.

    """
    sock, reader = conn._sock, getattr(conn._parser, "_reader", None)
    if sock is None or reader is None:
        raise redis.ConnectionError("the connection was closed")
    return sock, reader


def _take_replies(conn: Any, reader: Any, answers: list[Any], replies: int) -> bool:
    """Move the replies ``reader`` holds into ``answers`` until it has ``replies`` of them,
    as redis-py's own read does (a push notification handed to the parser, an error reply
    kept as the parser made it); True while more data must be read from the socket first.

    Raises:
        redis.ConnectionError: a reply that is not RESP (a protocol error).

    """
    while len(answers) < replies:
        answer = reader.gets()
        if answer is _NOT_ENOUGH_DATA:
            return True
        if _PUSH is not None and isinstance(answer, _PUSH):
            conn._parser.handle_push_response(answer)
            continue
        if isinstance(answer, redis.ConnectionError):  # a protocol error
            raise answer
        answers.append(answer)
    return False


async def _ready(sock: Any, timeout: float | None, *, writing: bool) -> None:
    """Wait in the running loop until ``sock`` can be written (``writing``) or read.

    What ``loop.sock_recv`` and ``asyncio.timeout`` would do, without their futures and
    tasks around one readiness callback: the caller tries the socket first and waits here
    only when it would block.

    Raises:
        redis.TimeoutError: not ready within ``timeout`` seconds (None: no limit).

    """
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake(outcome: BaseException | None = None) -> None:
        if not ready.done():
            if outcome is None:
                ready.set_result(None)
            else:
                ready.set_exception(outcome)

    fd = sock.fileno()
    (loop.add_writer if writing else loop.add_reader)(fd, wake)
    timer = None
    if timeout is not None:
        timer = loop.call_later(timeout, wake, redis.TimeoutError("Timeout reading from socket"))
    try:
        await ready
    finally:
        (loop.remove_writer if writing else loop.remove_reader)(fd)
        if timer is not None:
            timer.cancel()


def _answers(answers: list[Any]) -> list[Any]:
    """An ``EXEC``'s answers, the first error reply among them raised."""
    for answer in answers:
        if isinstance(answer, redis.ResponseError):
            raise answer
    return answers


_directs: weakref.WeakKeyDictionary[redis.Redis, Direct] = weakref.WeakKeyDictionary()
_directs_lock = threading.Lock()


def direct(client: redis.Redis) -> Direct:
    """The :class:`Direct` of a client (one per client, made on first use)."""
    with _directs_lock:
        found = _directs.get(client)
        if found is None:
            found = _directs[client] = Direct(client)
        return found


class LuaScript:
    """A Lua script run by ``EVALSHA`` in one round trip, loaded into the server's script cache
    when the server answers ``NOSCRIPT`` (first use, or after a restart or ``SCRIPT FLUSH``).

    What redis-py's ``register_script`` does, for a hot path: the command goes out through
    :class:`Direct` (a held connection, packed by hiredis), without the copies of the keys
    and arguments, the import and the three calls that redis-py's ``Script.__call__`` and
    ``evalsha`` make on every run, nor ``execute_command``'s pool and metrics work.
    """

    def __init__(self, client: redis.Redis, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        self._run = direct(client)

    def __call__(self, keys: Sequence[str], *args: EncodableT, again: Again | None = None) -> Any:
        """Run the script on ``keys`` with ``args``; its answer as redis-py parses it.
        ``again``: makes the arguments to run it with where a dropped connection sends it a
        second time (:class:`Direct`), if not ``args``.
        """
        command: tuple[EncodableT, ...] = ("EVALSHA", self.sha, len(keys), *keys)
        resend = None if again is None else lambda: (*command, *again())
        try:
            return self._run(*command, *args, again=resend)
        except redis.exceptions.NoScriptError:
            self._run("SCRIPT", "LOAD", self.source)  # through Direct: awaited where it is
            return self._run(*command, *args, again=resend)

    def followed(
        self, keys: Sequence[str], args: Sequence[EncodableT], *after: Sequence[EncodableT]
    ) -> list[Any]:
        """Run the script, then the commands ``after`` sent in the same write
        (:meth:`Direct.pipeline`: one round trip, not atomic with the script); the script's
        answer, then theirs (an error reply of theirs as the exception, not raised).

        Raises:
            redis.ResponseError: the script's error reply.

        """
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        answers = self._run.pipeline(command, *after)
        if isinstance(answers[0], redis.exceptions.NoScriptError):
            self._run("SCRIPT", "LOAD", self.source)
            answers = self._run.pipeline(command, *after)
        if isinstance(answers[0], redis.ResponseError):
            raise answers[0]
        return answers


# -- the client ---------------------------------------------------------------------------------


class RedisClient:
    """One store's view of a Redis server: its key prefix, the connection, transactions, error
    translation and the store's schema version (see the module docstring).

    Args:
        url: ``redis://[user:password@]host:port/db`` (``rediss://`` for TLS,
            ``unix:///path.sock``), optionally with ``?prefix=...`` for the keys.
        meta_key: the store's field in ``{prefix}meta`` (``"checkpoints"``, ``"bus"``...).
        migrations: the store's ordered migrations; their number is the newest version.
        prefix: the key prefix asked for in code (default: the URL's ``?prefix=``, else
            ``ctxkeep:``).
        legacy_schema_key: the store kept its version in ``{prefix}schema:{meta_key}`` before
            the meta hash: adopt it, and keep it in step.
        params: query parameters of the store's own, taken out of the URL into
            :attr:`params`.

    Raises:
        ConfigError: a bad URL or prefix.
        StorageError: Redis does not answer.
        SchemaVersionError: the prefix holds the store's keys written by a newer ctxkeep.

    """

    prefix: str
    """The key prefix."""
    where: str
    """Where the server is, without the password (for messages)."""
    params: dict[str, str]
    """The store's own query parameters found in the URL (the last value of each)."""
    meta_key: str
    """The store's field in :attr:`meta`."""
    version: int
    """The newest version of the store's keys this ctxkeep knows."""
    conn: redis.Redis
    """The redis-py client (thread-safe, strings in and out)."""

    def __init__(
        self,
        url: str,
        *,
        meta_key: str,
        migrations: Sequence[Migration],
        prefix: str | None = None,
        legacy_schema_key: bool = False,
        params: Collection[str] = (),
    ) -> None:
        rest, self.params = take_params(url, params)
        client_url, self.prefix = split_url(rest, prefix)
        self.where = describe_url(client_url)
        self.meta_key = meta_key
        self.legacy_schema_key = legacy_schema_key
        self.conn = connect(client_url)
        try:
            self.migrate(migrations)
        except BaseException:
            self.conn.close()
            raise

    @property
    def meta(self) -> str:
        """The hash of every store's schema version under this prefix."""
        return f"{self.prefix}meta"

    @property
    def legacy_key(self) -> str:
        """Where the store kept its version before :attr:`meta`."""
        return f"{self.prefix}schema:{self.meta_key}"

    def close(self) -> None:
        """Close the connection pool."""
        self.conn.close()

    def __enter__(self) -> RedisClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- errors and transactions ---------------------------------------------------------

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Translate redis-py errors raised inside the block into StorageError."""
        try:
            yield
        except redis.RedisError as exc:
            raise storage_error(self.where, exc) from exc

    def atomic(self, watch: list[str], body: Callable[[Pipeline], T]) -> T:
        """An optimistic transaction over ``watch`` (see :func:`atomic`); redis-py errors
        become StorageError, an exception of ``body`` propagates as it is.
        """
        with self.errors():
            return atomic(self.conn, watch, body)

    # -- schema versions -----------------------------------------------------------------

    def stored_version(self) -> int | None:
        """The store's recorded version under this prefix (``None``: none yet)."""
        with self.errors():
            return self._stored(self.conn)[1]

    def migrate(self, migrations: Sequence[Migration]) -> None:
        """Bring the store's keys to the newest version, ``len(migrations)`` (see the module
        docstring).

        Raises:
            SchemaVersionError: a version newer than that, or not a number.
            StorageError: Redis failed.

        """
        newest = self.version = len(migrations)
        with self.errors():
            raw = cast("str | None", self.conn.hget(self.meta, self.meta_key))
        if raw is not None and self._checked(raw) == newest:
            return  # current: one read, no write

        def body(pipe: Pipeline) -> None:
            in_meta, version = self._stored(pipe)
            version = version or 0
            if version > newest:
                raise self._newer(version, newest)
            if in_meta and version == newest:
                return  # another process finished the migration meanwhile
            for step in migrations[version:]:
                step(self)
            pipe.multi()
            pipe.hset(self.meta, self.meta_key, str(newest))
            if self.legacy_schema_key:
                pipe.set(self.legacy_key, str(newest))

        self.atomic([self.meta, self.legacy_key], body)

    def _stored(self, client: redis.Redis | Pipeline) -> tuple[bool, int | None]:
        """``(whether the meta hash has it, the recorded version)``: the meta field, else (for
        a store that had one) the legacy key.
        """
        raw = cast("str | None", client.hget(self.meta, self.meta_key))
        if raw is not None:
            return True, self._checked(raw)
        if self.legacy_schema_key:
            raw = cast("str | None", client.get(self.legacy_key))
        return False, None if raw is None else self._checked(raw)

    def _checked(self, raw: str) -> int:
        try:
            return int(raw)
        except ValueError:
            raise SchemaVersionError(
                f"Redis keys under {self.prefix!r}: {self.meta_key} has an invalid schema "
                f"version {raw!r}; it was not written by ctxkeep"
            ) from None

    def _newer(self, version: int, newest: int) -> SchemaVersionError:
        return SchemaVersionError(
            f"Redis keys under {self.prefix!r} hold {self.meta_key} of a newer ctxkeep "
            f"(schema {version}; this one reads up to {newest}); upgrade ctxkeep"
        )

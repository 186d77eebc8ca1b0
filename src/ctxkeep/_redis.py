"""What every Redis-backed part shares: URL handling, the connection, optimistic transactions,
and the one place redis-py's errors become :class:`~ctxkeep.errors.StorageError`.

Importing this module without redis-py installed raises an ``ImportError`` naming the extra.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

from ctxkeep.errors import ConfigError, MissingDependencyError, StorageError

try:
    import redis
    from redis.client import Pipeline
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("redis", "redis") from exc

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_PREFIX = "ctxkeep:"

__all__ = [
    "DEFAULT_PREFIX",
    "Pipeline",
    "atomic",
    "connect",
    "describe_url",
    "redis",
    "split_url",
    "translated",
]


def split_url(url: str, prefix: str | None = None) -> tuple[str, str]:
    """``(url for redis-py, key prefix)``: ``?prefix=`` is ctxkeep's, the rest redis-py's.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL, perhaps with ``?prefix=``.
        prefix: the prefix asked for in code (``None``: the URL's, else ``ctxkeep:``).

    Raises:
        ConfigError: an empty prefix, or the URL and ``prefix`` disagree.

    """
    parsed = urlparse(url)
    query = parse_qsl(parsed.query, keep_blank_values=True)
    in_url = [v for k, v in query if k == "prefix"]
    if in_url and prefix is not None and in_url[-1] != prefix:
        raise ConfigError(
            f"two key prefixes given: {in_url[-1]!r} in the URL and {prefix!r}; pass one"
        )
    chosen = prefix if prefix is not None else (in_url[-1] if in_url else DEFAULT_PREFIX)
    if not chosen:
        raise ConfigError("the Redis key prefix must not be empty (?prefix=...)")
    rest = urlencode([(k, v) for k, v in query if k != "prefix"])
    return urlunparse(parsed._replace(query=rest)), chosen


def describe_url(url: str) -> str:
    """Where a Redis URL points, without its password (for error messages)."""
    parsed = urlparse(url)
    return f"{parsed.hostname or parsed.path}:{parsed.port or ''}{parsed.path}"


def connect(url: str) -> redis.Redis:
    """A client for a URL without ctxkeep's parameters (strings in, strings out)."""
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5)


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


def translated(method: Callable[P, T]) -> Callable[P, T]:
    """Wrap redis-py's errors in StorageError, naming the server (the method's object has a
    ``where`` attribute).
    """

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            where = getattr(args[0], "where", "?")
            raise StorageError(f"Redis at {where}: {exc}") from exc

    return wrapper

"""A store's sync code run in the event loop, its round trips awaited: one body of logic for
the sync and the async callers, no thread hop.

:func:`run` runs a sync function in a greenlet of the event loop's thread; where that code
reaches a round trip that can be awaited (:meth:`ctxkeep._redis.Direct.__call__` and
``transaction`` on a connection it can wait on in the loop), the round trip calls
:func:`wait`, which hands the awaitable to :func:`run`, suspends the greenlet until the loop
has its answer, and returns it (or raises its error) where the sync call would have. All the
CPU work (packing, parsing, the session's checks and caches) is the sync path's own; only
the wait differs. This is SQLAlchemy's asyncio bridge (``greenlet_spawn`` / ``await_only``).

What it asks of the code it runs: no lock may be held across a round trip that another
greenlet of the same thread would wait for (it would wait forever, the loop being that
thread): callers serialise the calls that share such a lock (one asyncio lock per session
and loop in the Agents SDK adapter). I/O the code does by other means goes through
:func:`blocking`, which sends it from a thread and awaits that: ctxkeep's redis-py client
does so for the rare paths that have no awaited form (a session's creation, a trim, an
eviction), so the loop is never blocked on a round trip.

Without the ``greenlet`` package, :data:`AVAILABLE` is False and callers keep to a thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

try:
    import greenlet  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - depends on the environment
    greenlet = None

T = TypeVar("T")

AVAILABLE = greenlet is not None
"""Whether :func:`run` can run anything (the ``greenlet`` package is installed)."""

__all__ = ["AVAILABLE", "IDLE", "blocking", "bridged", "run", "wait"]


IDLE = 8
"""Greenlets kept per thread between calls, at most (more run at once only when that many
calls wait at once)."""


_DONE = object()
"""What a greenlet of :func:`run` switches back with when its call is over (the outcome is
on the greenlet: a value switched with stays referenced by greenlet's own state)."""


def _serve(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """A greenlet's body: run one call after another, each handed over by :func:`run`
    (making a greenlet costs several times a switch to one); each outcome, ``(True,
    result)`` or ``(False, exception)``, is left in the greenlet's ``outcome``.
    """
    me = _getcurrent()
    while True:
        try:
            me.outcome = (True, fn(*args))
        except greenlet.GreenletExit:  # the greenlet is being collected: let it end
            raise
        except BaseException as exc:  # handed to run(), which raises it in the caller
            me.outcome = (False, exc)
        fn = args = None  # type: ignore[assignment]  # an idle greenlet holds nothing
        fn, args = me.parent.switch(_DONE)


_idle = threading.local()


if greenlet is not None:

    class _Bridged(greenlet.greenlet):  # type: ignore[misc]
        """A greenlet :func:`run` runs calls in: code in it may :func:`wait`."""

    _getcurrent = greenlet.getcurrent

    def bridged() -> bool:
        """Whether the running code was started by :func:`run` (and may :func:`wait`)."""
        return type(_getcurrent()) is _Bridged

else:  # pragma: no cover - depends on the environment

    def bridged() -> bool:
        """Whether the running code was started by :func:`run` (never, without greenlet)."""
        return False


def wait(awaitable: Awaitable[T]) -> T:
    """``awaitable``'s result, awaited by the event loop that :func:`run` this code; its
    exception raised here. Only in code :func:`bridged` says is.
    """
    current = _getcurrent()
    if type(current) is not _Bridged:
        raise RuntimeError("ctxkeep._bridge.wait outside ctxkeep._bridge.run")
    return current.parent.switch(awaitable)  # type: ignore[no-any-return]


def blocking(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a call that blocks on I/O: in code :func:`run` runs, sent to a
    thread and awaited there, so that the loop goes on meanwhile; elsewhere called here.

    A cancellation while the thread runs waits for it to finish (``fn`` may hold a
    connection the caller's cleanup uses next) and is then raised at this call.
    """
    if not bridged():
        return fn(*args, **kwargs)
    return wait(_finished(fn, args, kwargs))


async def _finished(fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
    """``fn``'s outcome from a thread, waited for to the end even when cancelled."""
    done = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    cancelled = False
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            cancelled = True  # wait on: fn runs to its end in its thread
        except BaseException:  # fn's own error: done.result() raises it below
            pass
    if cancelled:
        if not done.cancelled():
            done.exception()  # retrieved: the cancellation is what the caller sees
        raise asyncio.CancelledError
    return done.result()


async def run(fn: Callable[..., T], /, *args: Any) -> T:
    """``fn(*args)`` run in this event loop's thread, each :func:`wait` inside it awaited;
    in a copy of the caller's context (as ``asyncio.to_thread`` runs it). An exception of
    ``fn`` propagates; one of an awaited step (a cancellation among them) is raised inside
    ``fn`` at its :func:`wait`, so its ``finally`` blocks run and locks are released.
    """
    idle: list[Any] = _idle.__dict__.setdefault("greenlets", [])
    here = _getcurrent()
    child = idle.pop() if idle else _Bridged(_serve, parent=here)
    child.parent = here
    child.gr_context = contextvars.copy_context()
    step = child.switch(fn, args)
    while step is not _DONE:
        try:
            answer = await step
        except BaseException:
            step = child.throw(*sys.exc_info())
        else:
            step = child.switch(answer)
    ok, value = child.outcome
    child.outcome = None
    if len(idle) < IDLE:
        idle.append(child)
    if ok:
        return value  # type: ignore[no-any-return]
    try:
        raise value
    finally:
        del value  # not kept alive by this frame, held by the error's traceback

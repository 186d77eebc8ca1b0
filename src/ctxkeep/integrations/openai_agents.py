"""A ctxkeep :class:`~ctxkeep.MemoryManager` as an OpenAI Agents SDK ``Session``.

:class:`CtxkeepSession` implements the SDK's ``Session`` protocol (``session_id``,
``session_settings``, ``get_items``, ``add_items``, ``pop_item``, ``clear_session``) over any
:func:`~ctxkeep.open_memory` URL: the embedded SQLite file by default, Redis or PostgreSQL for
history shared between processes and machines. Construct it as the SDK's ``SQLiteSession``::

    from agents import Runner
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    session = CtxkeepSession("user-42", "redis://127.0.0.1:6379/0")
    await Runner.run(agent, "hello", session=session)

How items are stored: ``add_items`` converts the SDK's Responses input items with
:func:`~ctxkeep.from_responses` and appends the messages in one atomic
:meth:`~ctxkeep.MemoryManager.add_messages`; ``get_items`` reads the messages back and
converts them with :func:`~ctxkeep.to_responses`, which gives back the very items that were
added, key order included (a run of ``function_call`` items is one message and comes back as
the same items; a ``reasoning`` item travels with the message after it). So the session's
``MemoryConfig`` applies to an Agents SDK history as to any other: idle TTL, LRU beyond
``max_sessions``, and ``max_history`` counted in messages and trimmed in whole tool units (a
call is never kept without its output), with trimmed messages archived.

The ctxkeep session is created on first use (``create_session(agent_id, session_id=...)``)
and deleted by ``clear_session``; the next ``add_items`` creates it again. A session that has
expired reads as empty, as one that was never written.

Costs and limits:

* ``pop_item`` returns the newest *item*. When the newest message stands for several items
  (a run of parallel calls, or reasoning items carried with it), the message is replaced by
  one without its last item, in one transaction (:meth:`~ctxkeep.MemoryManager.replace_newest`):
  no reader, in this process or another, sees it half popped, and a crash loses nothing.
  The rest get fresh message ids.
* The stored history obeys ctxkeep's sequence rules: a ``function_call_output`` must answer a
  call still waiting. Items added while calls wait that do not start with an output (more
  calls of the same run, a reasoning item) continue the newest message: it is replaced by
  itself joined with them, in one transaction, as for ``pop_item``. A message after some
  outputs while other calls still wait is refused (``MissingToolResultError``), where
  ``SQLiteSession`` would store it; the Runner never writes one.
* ``get_items(limit)`` reads the newest ``limit`` messages (each stands for at least one item)
  and keeps the newest ``limit`` items of them.
"""

from __future__ import annotations

import asyncio
import atexit
import bisect
import contextlib
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ctxkeep import _bridge, _check
from ctxkeep.artifacts import (
    READ_ARTIFACT_TOOL,
    ArtifactStore,
    as_artifact_store,
    read_artifact_tool,
)
from ctxkeep.builder.compose import (
    RecallPolicy,
    join_prior,
    must_keep_tokens,
    newest_user_message,
    prompt_budget,
    recall_room,
    recall_then_fit,
)
from ctxkeep.errors import (
    ArtifactNotFoundError,
    BudgetExceededError,
    InvalidMessageError,
    MissingDependencyError,
    MissingToolResultError,
    SessionChangedError,
    SessionNotFoundError,
    describe,
)
from ctxkeep.integrations._items import ConvertedItems, owned_conversion, owned_from_responses
from ctxkeep.messages import Message
from ctxkeep.prune import PruneReport, TokenPruner
from ctxkeep.responses import _owned_to_responses, from_responses, to_responses
from ctxkeep.sessions import MemoryConfig, MemoryManager, open_memory
from ctxkeep.sessions.records import SessionInfo, record_to_message
from ctxkeep.sessions.sqlite import SQLiteBackend
from ctxkeep.tokens import TokenCounter, get_counter

try:
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("openai-agents", "agents") from exc

if TYPE_CHECKING:
    from agents import FunctionTool
    from agents.items import TResponseInputItem
    from agents.run_config import CallModelData, ModelInputData

    from ctxkeep.episodic.base import EpisodicMemoryStore

_T = TypeVar("_T")

_RETRIES = 50
"""Attempts at an atomic replace before giving up when other writers keep changing the
session (each attempt reads the newest message again)."""

__all__ = ["CtxkeepInputFilter", "CtxkeepSession", "FilterReport", "ctxkeep_input_filter"]


class CtxkeepSession:
    """An Agents SDK ``Session`` kept in ctxkeep session memory.

    Args:
        session_id: the conversation's id; also the ctxkeep session's id.
        url: an :func:`~ctxkeep.open_memory` URL (``memory://``, ``sqlite:///path``,
            ``redis://...``, ``postgresql://...``); ``None`` is the embedded SQLite file.
        session_settings: as for ``SQLiteSession``; its ``limit`` is the default of
            :meth:`get_items`.
        config: the memory bounds (TTL, LRU, ``max_history``) when this session opens the
            store itself; ignored when ``memory`` is given (it has its own).
        agent_id: the ``agent_id`` of the ctxkeep session created on first use.
        memory: an open manager to use instead of opening ``url`` (share one store between
            many sessions); the caller keeps ownership and closes it.

    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        session_id: str,
        url: str | None = None,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        config: MemoryConfig | None = None,
        agent_id: str = "agents-sdk",
        memory: MemoryManager | None = None,
    ) -> None:
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
        if memory is not None and url is not None:
            raise ValueError("pass either url or memory, not both")
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.agent_id = agent_id
        self._owns_memory = memory is None
        self.memory: MemoryManager = memory if memory is not None else open_memory(url, config)
        # One instance's operations run one at a time, so a pop's take-back-and-re-add is
        # never seen half done by a task sharing the instance.
        self._lock = threading.Lock()
        # The session's items kept encoded between reads (checked against the store on
        # each): get_items decodes only the messages it has not seen.
        self._items = ConvertedItems(self.memory, session_id, _items_of_message)
        self._worker = _worker_for(self.memory)
        self._awaits = _awaits(self.memory)
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    # -- the Session protocol -------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The history, oldest first; the newest ``limit`` items if ``limit`` (or
        ``session_settings.limit``) is set. ``0`` gives none; a negative limit gives all, as
        ``SQLiteSession`` does.
        """
        return await self._run(self._get_items, resolve_session_limit(limit, self.session_settings))

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` (all or none), creating the ctxkeep session on first use.

        Raises:
            InvalidMessageError: an item ctxkeep cannot read.
            OrphanToolResultError / MissingToolResultError: an output answering no waiting
                call, or a message after a call's output while another call still waits.

        """
        batch = [dict(i) for i in cast("list[dict[str, Any]]", list(items))]
        if batch:
            # Fails on a malformed item before any I/O; made for this call alone, as are
            # the copies of the items they were made of.
            messages, copies = owned_conversion(batch)
            await self._run(self._add, copies, messages)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item; None when the session is empty."""
        return await self._run(self._pop_item)

    async def clear_session(self) -> None:
        """Delete the history (the ctxkeep session; the next add creates it again)."""
        await self._run(self._clear, in_thread=True)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close the store if this session opened it (and its worker thread)."""
        if self._owns_memory:
            self.memory.close()
            with _WORKERS_LOCK:
                worker = _WORKERS.pop(self.memory, None)
            if worker is not None:
                worker.shutdown()

    # -- sync work, off the event loop or awaited in it ---------------------------------------

    async def _run(self, fn: Callable[..., _T], /, *args: Any, in_thread: bool = False) -> _T:
        """``fn(*args)`` without blocking the event loop on the store.

        Where the store's round trips can be awaited (:func:`_awaits`: Redis), in the
        loop's own thread by :func:`ctxkeep._bridge.run`: the same sync code, each round
        trip awaited, no hop to a thread and back (about 125 us a call). The calls of one
        session in one loop take turns, as ``fn`` holds the session's locks across its
        round trips; a call from another thread's loop waits for those locks as a thread
        would. ``in_thread``: ``fn`` sends only through redis-py (``clear_session``), whose
        round trips have no awaited form: it runs in a thread whole, in its turn (one hop,
        not one per command). Elsewhere off the loop: in
        the store's own worker thread where it has one (:func:`_worker_for`), else in
        asyncio's default pool (``asyncio.to_thread``).
        """
        if self._awaits:
            async with self._turn():
                if in_thread:
                    return await asyncio.to_thread(fn, *args)
                return await _bridge.run(fn, *args)
        if self._worker is None:
            return await asyncio.to_thread(fn, *args)
        return await self._worker.run(fn, *args)

    def _turn(self) -> asyncio.Lock:
        """The lock this session's calls in the running loop take turns by."""
        loop = asyncio.get_running_loop()
        turn = self._turns.get(loop)
        if turn is None:
            with _TURNS_LOCK:  # not self._lock: a suspended call of this session holds it
                turn = self._turns.setdefault(loop, asyncio.Lock())
        return turn

    def _get_items(self, limit: int | None) -> list[TResponseInputItem]:
        if limit is not None and limit < 0:
            limit = None  # SQLite's LIMIT -1: everything
        with self._lock:
            try:
                if limit is None or self._items.warm:
                    # Checked against the store; only messages not seen before are decoded.
                    return cast("list[TResponseInputItem]", self._items.read(limit))
                # Every message stands for at least one item, so the newest ``limit``
                # messages hold the newest ``limit`` items (decoded for this read).
                messages = self.memory.get_messages(self.session_id, limit=limit)
            except SessionNotFoundError:  # unknown, or expired
                return []
        # The messages were decoded for this read alone: the items may share their values.
        items = _owned_to_responses(messages)
        if limit is not None:
            items = items[-limit:] if limit > 0 else []
        return cast("list[TResponseInputItem]", items)

    def _add(self, items: list[dict[str, Any]], messages: list[Message]) -> None:
        """Append ``messages`` (``items`` converted, both made for this call alone): one
        write transaction in the common case; the session is created on first use, and a
        batch that continues the newest message (calls wait that it does not answer) is
        joined with it.
        """
        with self._lock:
            if messages[0].role != "tool" and self._items.newest_has_calls():
                # The newest message in hand stands for calls, which all wait (nothing came
                # after it): a batch that does not answer one continues it. Joined in one
                # write, its seq and generation compared inside it (no append refused first,
                # no read); a newest message that is no longer the session's takes the path
                # below.
                joined, _ = self._items.rewrite(
                    lambda newest: (newest + items, None), self._replace_held
                )
                if joined:
                    return
            try:
                # The messages were converted for this call alone: stored as they are, and
                # the newest one's items kept with it (a pop then converts nothing back).
                self._items.expect(messages, items)
                self.memory._add_creating(
                    self.session_id, self.agent_id, messages, self._items.appended, owned=True
                )
            except MissingToolResultError:
                if messages[0].role == "tool" or not self._join(items):
                    raise  # an output while other calls still wait: the caller's error

    def _join(self, items: list[dict[str, Any]]) -> bool:
        """Calls wait and ``items`` do not answer them: they continue the newest message (a
        run of function calls split over two batches, or items that came after it), as one
        list of items would. Replaces that message by it joined with ``items``, in one
        transaction; False if no call waits (the batch itself is invalid).
        """
        for _ in range(_RETRIES):
            info, newest = self._newest()
            if not info.pending:
                return False
            if newest is None:
                continue  # taken back meanwhile: look again
            seq, message = newest
            joined = owned_from_responses(_owned_to_responses([message]) + items)
            with contextlib.suppress(SessionChangedError):
                self._replace_newest_at(info, seq, joined)
                return True
        raise SessionChangedError(self.session_id)

    def _newest(self) -> tuple[SessionInfo, tuple[int, Message] | None]:
        """The session's info and its newest message with its seq (None: it holds none),
        read at one instant, decoded for this caller alone (no TTL test: the write that
        follows makes it, inside its transaction).

        Raises:
            SessionNotFoundError: unknown or deleted session.

        """
        info, rows = self.memory._newest_rows(self.session_id, 1)
        if not rows:
            return info, None
        seq, record = rows[-1]
        return info, (seq, record_to_message(record, session_id=self.session_id, seq=seq))

    def _replace_newest_at(self, info: SessionInfo, seq: int, messages: list[Message]) -> None:
        """Replace the newest message, read at ``seq`` with ``info``, by ``messages`` (made
        for this call alone) in one transaction; the items held follow the write.

        Raises:
            SessionChangedError: the newest message is no longer the one at ``seq`` of
                ``info``'s generation (or the session idled past its TTL and was touched).
            SessionNotFoundError: the session is gone (or expired, and reclaimed).

        """
        stored, seqs = self.memory._replace(
            self.session_id, messages, newest_seq=seq, generation=info.generation, owned=True
        )
        self._items.replaced(info, seq, stored, seqs)

    def _pop_item(self) -> TResponseInputItem | None:
        with self._lock:
            for _ in range(_RETRIES):
                try:
                    # One write where the items held are current (the newest message held
                    # is compared by seq and generation inside it); else read and pop.
                    taken, item = self._items.pop(self._replace_held)
                    if taken:
                        if item is not None:
                            return cast("TResponseInputItem", item)
                        continue  # a message that stood for no item: taken back, go on
                    info, newest = self._newest()
                except SessionNotFoundError:
                    return None
                if newest is None:
                    return None
                seq, message = newest
                rest = _owned_to_responses([message])  # decoded for this pop alone
                last = rest.pop() if rest else None
                # The newest message without its last item takes its place, in one
                # transaction (a message that stands for no item is just taken back).
                try:
                    self._replace_newest_at(info, seq, owned_from_responses(rest))
                except (SessionChangedError, SessionNotFoundError):
                    continue  # another writer got there first: look again
                if last is not None:
                    return cast("TResponseInputItem", last)
            raise SessionChangedError(self.session_id)

    def _replace_held(
        self, seq: int, generation: str, rest: list[Any]
    ) -> tuple[list[Message], list[int]]:
        return self.memory._replace(
            self.session_id,
            owned_from_responses(rest) if rest else [],  # (a pop of a one-item message: none)
            newest_seq=seq,
            generation=generation,
            owned=True,
        )

    def _clear(self) -> None:
        with self._lock:
            self.memory.delete_session(self.session_id)


_TURNS_LOCK = threading.Lock()

_WORKERS: weakref.WeakKeyDictionary[MemoryManager, _Worker] = weakref.WeakKeyDictionary()
_WORKERS_LOCK = threading.Lock()


def _worker_for(memory: MemoryManager) -> _Worker | None:
    """The one worker thread the sessions over ``memory`` run their storage calls in, where
    the store is a SQLite file (None elsewhere: a server's round trips overlap in asyncio's
    pool).

    A SQLite connection is one per thread, and each keeps its own page cache, which it drops
    whenever another connection has written: calls spread over asyncio's pool meet a cold
    cache on most calls and read the pages of every table and index they touch again (about
    15 page reads an append). One thread keeps one connection, whose cache stays warm. It
    serialises the sessions of one file, as the SDK's ``SQLiteSession`` does with its
    per-file lock (SQLite runs one writer at a time anyway). The thread ends with the
    manager.
    """
    if not isinstance(memory.backend, SQLiteBackend):
        return None
    with _WORKERS_LOCK:
        worker = _WORKERS.get(memory)
        if worker is None:
            worker = _WORKERS[memory] = _Worker()
        return worker


_Job = tuple[
    asyncio.AbstractEventLoop | None,
    "asyncio.Future[Any] | Future[Any]",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
]


class _Worker:
    """One thread that runs the calls handed to it in turn (:func:`_worker_for`), each in the
    caller's context: ``await`` :meth:`run` from an event loop, :meth:`submit` from a thread.

    What ``loop.run_in_executor`` on a one-thread ``ThreadPoolExecutor`` does for a call,
    without the concurrent ``Future`` (a ``Condition`` and its lock), the work item and the
    chaining of that future to the loop's: the call goes on a ``SimpleQueue`` with the loop's
    own future, and its outcome is set on that future in the loop by
    ``call_soon_threadsafe``. 50 -> 40 us of process CPU per call of a function that returns
    at once, awaited by ``run_until_complete`` as the peer bench does (3,000 calls, five
    rounds interleaved, on a loaded 2-core machine: medians 51 and 41 us). As with the
    executor, a call whose awaiting task was cancelled before it started is not run, and
    calls handed over before :meth:`shutdown` still run; the thread ends once the worker is
    shut down or dropped, and at the interpreter's exit after the calls queued.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        thread = threading.Thread(
            target=_serve, args=(self._jobs,), name="ctxkeep-sqlite", daemon=True
        )
        thread.start()
        self.thread = thread
        # Dropped (its manager gone), the worker tells the thread to end. A daemon thread, as
        # threading's shutdown would wait for one nobody shut down; so at exit it is told to
        # end and waited for (_join_workers), and the calls queued are made.
        weakref.finalize(self, self._jobs.put, None)
        with _LIVE_LOCK:
            _LIVE[thread] = self._jobs

    async def run(self, fn: Callable[..., _T], /, *args: Any) -> _T:
        """``fn(*args)`` in the worker's thread, in the caller's context, awaited.

        Raises:
            RuntimeError: the worker was shut down.
            Whatever ``fn`` raises.

        """
        if self._closed:
            raise RuntimeError("cannot run a call after the worker was shut down")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[_T] = loop.create_future()
        self._jobs.put((loop, done, contextvars.copy_context(), fn, args))
        return await done

    def submit(self, fn: Callable[..., _T], /, *args: Any) -> Future[_T]:
        """``fn(*args)`` in the worker's thread; its outcome on the future returned.

        Raises:
            RuntimeError: the worker was shut down.

        """
        if self._closed:
            raise RuntimeError("cannot submit a call after the worker was shut down")
        done: Future[_T] = Future()
        self._jobs.put((None, done, contextvars.copy_context(), fn, args))
        return done

    def shutdown(self) -> None:
        """Refuse new calls; the thread ends after those handed over."""
        self._closed = True
        self._jobs.put(None)


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """The worker thread's loop (it holds the queue, not the worker: a worker dropped is
    collected, and tells it to end).
    """
    try:
        while (job := jobs.get()) is not None:
            loop, done, context, fn, args = job
            del job
            if done.cancelled():
                continue  # its awaiting task was cancelled before it started
            ok = True
            try:
                result = context.run(fn, *args)
            except BaseException as exc:  # handed to the caller, as an executor does
                ok, result = False, exc
            if loop is None:
                with contextlib.suppress(Exception):  # (cancelled meanwhile)
                    _settle(done, ok, result)
            else:
                with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
                    loop.call_soon_threadsafe(_settle, done, ok, result)
            del loop, done, context, fn, args, result
    finally:
        with _LIVE_LOCK:
            _LIVE.pop(threading.current_thread(), None)


def _settle(done: asyncio.Future[Any] | Future[Any], ok: bool, result: Any) -> None:
    """Set a call's outcome on its future (in its loop), unless it was cancelled."""
    if done.cancelled():
        return
    if ok:
        done.set_result(result)
    else:
        done.set_exception(result)


_LIVE: dict[threading.Thread, queue.SimpleQueue[_Job | None]] = {}
"""The workers' threads still running, with their queues."""
_LIVE_LOCK = threading.Lock()


@atexit.register
def _join_workers() -> None:
    """At exit: tell every worker thread to end, and wait for the calls queued."""
    with _LIVE_LOCK:
        live = list(_LIVE.items())
    for _, jobs in live:
        jobs.put(None)
    for thread, _ in live:
        thread.join()


def _awaits(memory: MemoryManager) -> bool:
    """Whether the sessions over ``memory`` can await their round trips in the event loop:
    a Redis store whose scripts and whole reads (append, replace, touch, read: each call's
    one round trip) go through a :class:`~ctxkeep._redis.Direct` that
    :attr:`~ctxkeep._redis.Direct.awaits`, with greenlet installed. The rest of what a call
    may send (a session's creation on its first add, a trim past ``max_history``, an
    eviction) goes through redis-py's client, which sends it from a thread and awaits that
    (:func:`ctxkeep._bridge.blocking`): the loop is not blocked.
    """
    run = getattr(memory.backend, "_direct", None)  # RedisBackend's
    return _bridge.AVAILABLE and run is not None and bool(run.awaits)


def _items_of_message(message: Message) -> list[dict[str, Any]]:
    """The Responses items ``message`` stands for (it was decoded for this conversion)."""
    return _owned_to_responses([message])


# -- the model-input filter ----------------------------------------------------------------


@dataclass
class FilterReport:
    """What one :class:`CtxkeepInputFilter` call sent, and why."""

    budget: int
    """``max_tokens``: the most the instructions, tool definitions and input may count."""
    tokens_sent: int
    """Tokens of the instructions (recall included) and input items sent, plus
    ``tools_tokens``; never more than ``budget``."""
    tools_tokens: int
    """The agent's function tool definitions, counted as their JSON (0 with
    ``count_tools=False``)."""
    recalled: int
    """Episodes recalled into the instructions."""
    prior_tokens: int
    """Tokens the ``### Prior Historical Context`` block added to the instructions."""
    items_in: int
    """Input items given."""
    items_out: int
    """Input items sent."""
    prune: PruneReport = field(repr=False)
    """The pruner's report on the messages the items became (the instructions first)."""


class CtxkeepInputFilter:
    """A ``call_model_input_filter`` that fits every model call of an Agents SDK run into an
    exact token budget. Build one with :func:`ctxkeep_input_filter`; see it for the arguments.

    Each call converts the input items with :func:`~ctxkeep.from_responses`, prunes them
    with a :class:`~ctxkeep.TokenPruner` (the instructions first, as a system message that is
    never dropped), and converts what it kept back with :func:`~ctxkeep.to_responses`. So a
    ``function_call`` is never sent without its ``function_call_output`` (nor an output
    without its call, nor a ``reasoning`` item without the item it precedes); an old output
    over ``compress_threshold`` tokens is sent as a head and tail excerpt naming the
    artifact that holds it in full, which the agent reads back with :attr:`read_artifact`;
    history that does not fit is dropped, oldest first, in whole units. Items sent unchanged
    are the very objects given (the SDK matches them to its pending input by identity).

    Attributes:
        last_report: the :class:`FilterReport` of the latest call (None before the first).

    """

    def __init__(
        self,
        max_tokens: int,
        *,
        preserve_last_n: int = 6,
        counter: TokenCounter | str | None = None,
        artifacts: ArtifactStore | str | None = None,
        compress_threshold: int | None = 256,
        cache_stable: bool | None = None,
        episodic: EpisodicMemoryStore | None = None,
        recall_top_k: int = 3,
        max_prior_tokens: int = 1500,
        recall_min_score: float | None = 0.0,
        recall_filters: Mapping[str, Any] | None = None,
        count_tools: bool = True,
        on_report: Callable[[FilterReport], None] | None = None,
    ) -> None:
        self.max_tokens = _check.integer("max_tokens", max_tokens, minimum=1)
        self.preserve_last_n = _check.integer("preserve_last_n", preserve_last_n, minimum=0)
        if isinstance(counter, TokenCounter):
            self.counter = counter
        else:
            self.counter = get_counter(_check.optional_text("counter", counter))
        self.artifacts = as_artifact_store(artifacts)
        self.compress_threshold = _check.optional_integer(
            "compress_threshold", compress_threshold, minimum=0
        )
        self.cache_stable = _check.optional_flag("cache_stable", cache_stable)
        if episodic is not None:
            _check.has_method("episodic", episodic, "search", "an episodic store")
        self.episodic = episodic
        self.recall_top_k = _check.integer("recall_top_k", recall_top_k, minimum=1)
        self.max_prior_tokens = _check.integer("max_prior_tokens", max_prior_tokens, minimum=0)
        self.recall_min_score = (
            None
            if recall_min_score is None
            else _check.number("recall_min_score", recall_min_score)
        )
        self.recall_filters = (
            None
            if recall_filters is None
            else dict(_check.mapping("recall_filters", recall_filters))
        )
        self.count_tools = _check.flag("count_tools", count_tools)
        if on_report is not None and not callable(on_report):
            raise TypeError(f"on_report must be callable, got {describe(on_report)}")
        self.on_report = on_report
        self.last_report: FilterReport | None = None
        self._pruners: dict[int, TokenPruner] = {}  # by history budget (tools vary per agent)
        self._lock = threading.Lock()

    # -- the SDK's entry point -------------------------------------------------------------

    def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        """Fit one model call's input (``data.model_data``) into ``max_tokens``.

        Raises:
            BudgetExceededError: the instructions, tool definitions and the newest user
                message alone do not fit (even compressed).
            InvalidMessageError: an input item ctxkeep cannot read.

        """
        from agents.run_config import ModelInputData

        given = list(data.model_data.input)
        plain = [_plain_item(item, i) for i, item in enumerate(given)]
        messages = from_responses(plain)
        tools_tokens = self._tools_tokens(data.agent) if self.count_tools else 0
        budget = prompt_budget(self.max_tokens, tools=tools_tokens, counter=self.counter)
        if budget < 1:
            raise BudgetExceededError(
                budget=self.max_tokens,
                required=self.max_tokens - budget,
                blocking=[f"the agent's tool definitions ({tools_tokens} tokens)"],
            )
        instructions = data.model_data.instructions
        newest = newest_user_message(messages)
        policy = self._recall_policy
        room = 0  # without recall nothing reads it: the must-keep count is not made
        if policy is not None:
            head = [] if instructions is None else [Message("system", instructions)]
            room = recall_room(
                budget,
                must_keep_tokens(self.counter, head + messages, newest),
                self.max_prior_tokens,
            )
        (kept, report), hits, prior = recall_then_fit(
            lambda prior: self._prune(budget, join_prior(instructions, prior), messages),
            query=newest.text if newest is not None else "",
            room=room,
            recall=policy,
            counter=self.counter,
        )
        text = join_prior(instructions, prior)
        items = _reuse(to_responses(kept), plain, given)
        prior_tokens = 0
        if prior:
            prior_tokens = self.counter.count_text(text or "") - self.counter.count_text(
                instructions or ""
            )
        self.last_report = FilterReport(
            budget=self.max_tokens,
            tokens_sent=report.tokens_after + tools_tokens,
            tools_tokens=tools_tokens,
            recalled=len(hits),
            prior_tokens=prior_tokens,
            items_in=len(given),
            items_out=len(items),
            prune=report,
        )
        if self.on_report is not None:
            self.on_report(self.last_report)
        return ModelInputData(input=cast("list[TResponseInputItem]", items), instructions=text)

    @property
    def read_artifact(self) -> FunctionTool:
        """The ``read_artifact`` tool, as an Agents SDK ``FunctionTool`` reading this filter's
        artifact store: give it to the agent (``Agent(tools=[..., flt.read_artifact])``) so
        it can read a compressed output back in full.
        """
        return read_artifact_function_tool(self.artifacts)

    # -- the parts ---------------------------------------------------------------------------

    @property
    def _recall_policy(self) -> RecallPolicy | None:
        if self.episodic is None:
            return None
        return RecallPolicy(
            self.episodic,
            top_k=self.recall_top_k,
            max_tokens=self.max_prior_tokens,
            min_score=self.recall_min_score,
            filters=self.recall_filters,
        )

    def _pruner(self, budget: int) -> TokenPruner:
        with self._lock:
            pruner = self._pruners.get(budget)
            if pruner is None:
                if len(self._pruners) >= 16:  # agents with different tools: keep a few
                    self._pruners.pop(next(iter(self._pruners)))
                pruner = TokenPruner(
                    budget,
                    self.preserve_last_n,
                    self.counter,
                    self.artifacts,
                    compress_threshold=self.compress_threshold,
                    cache_stable=self.cache_stable,
                )
                self._pruners[budget] = pruner
            return pruner

    def _prune(
        self, budget: int, instructions: str | None, messages: list[Message]
    ) -> tuple[list[Message], PruneReport]:
        head = [] if instructions is None else [Message("system", instructions)]
        kept, report = self._pruner(budget).prune_with_report(head + messages)
        return kept[len(head) :], report

    def _tools_tokens(self, agent: Any) -> int:
        """The agent's function tools as the JSON definitions a Responses call sends."""
        import json

        from agents import FunctionTool

        total = 0
        for tool in getattr(agent, "tools", None) or ():
            if isinstance(tool, FunctionTool):
                spec = {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.params_json_schema,
                    "strict": tool.strict_json_schema,
                }
            else:  # hosted tools (web search, file search...): their config
                spec = {"type": type(tool).__name__, "name": getattr(tool, "name", "")}
            total += self.counter.count_text(
                json.dumps(spec, ensure_ascii=False, sort_keys=True, default=str)
            )
        return total


def ctxkeep_input_filter(
    max_tokens: int,
    *,
    preserve_last_n: int = 6,
    counter: TokenCounter | str | None = None,
    artifacts: ArtifactStore | str | None = None,
    compress_threshold: int | None = 256,
    cache_stable: bool | None = None,
    episodic: EpisodicMemoryStore | None = None,
    recall_top_k: int = 3,
    max_prior_tokens: int = 1500,
    recall_min_score: float | None = 0.0,
    recall_filters: Mapping[str, Any] | None = None,
    count_tools: bool = True,
    on_report: Callable[[FilterReport], None] | None = None,
) -> CtxkeepInputFilter:
    """A ``RunConfig(call_model_input_filter=...)`` keeping every model call in ``max_tokens``.

    Every model call of an Agents SDK run is fitted into the budget, counted exactly::

        flt = ctxkeep_input_filter(max_tokens=100_000, episodic=open_episodic())
        agent = Agent(name="dev", tools=[run_shell, flt.read_artifact])
        await Runner.run(agent, task, session=session,
                         run_config=RunConfig(call_model_input_filter=flt))

    Args:
        max_tokens: the most the instructions (recall included), the agent's function tool
            definitions and the input items may count together (>= 1). Leave the reply's
            room out of it: it is the model's window minus the reply's ``max_tokens``.
        preserve_last_n: input messages kept in full when they fit (a preference; the budget
            wins). A run of parallel ``function_call`` items is one message.
        counter: a :class:`~ctxkeep.TokenCounter` or a name for :func:`~ctxkeep.get_counter`
            (an encoding or a model; the default is o200k_base, exact).
        artifacts: where compressed outputs are kept in full (a store or an
            :func:`~ctxkeep.open_artifacts` URL; default: in memory, for this process).
        compress_threshold: an old output over this many tokens is sent compressed (head,
            tail and the artifact's ref); ``None`` compresses only what would not fit.
        cache_stable: the pruner's cache-stable mode (on by default: prompts of a growing
            run share their prefix, which provider prompt caches discount).
        episodic: an episodic store to recall from; the best relevant episodes for the
            newest user message are appended to the instructions under
            ``### Prior Historical Context`` (fenced, labelled as data). Recall yields: when
            the conversation needs the room, nothing is recalled.
        recall_top_k: episodes recalled at most.
        max_prior_tokens: the most tokens the recalled block may take.
        recall_min_score: an episode is recalled only with lexical evidence and at least
            this fused score (:meth:`~ctxkeep.Hit.is_relevant`); None recalls the best hits.
        recall_filters: filters for the episodic search (``{"agent_id": ...}``...).
        count_tools: count the agent's tool definitions in ``max_tokens`` (their JSON; the
            provider's own rendering of tools is not public, so this is an estimate).
        on_report: called with each call's :class:`FilterReport` (what was sent, and why).

    Raises:
        InvalidTypeError / ValueError: an argument of the wrong type or out of range.

    """
    return CtxkeepInputFilter(
        max_tokens,
        preserve_last_n=preserve_last_n,
        counter=counter,
        artifacts=artifacts,
        compress_threshold=compress_threshold,
        cache_stable=cache_stable,
        episodic=episodic,
        recall_top_k=recall_top_k,
        max_prior_tokens=max_prior_tokens,
        recall_min_score=recall_min_score,
        recall_filters=recall_filters,
        count_tools=count_tools,
        on_report=on_report,
    )


def read_artifact_function_tool(store: ArtifactStore) -> FunctionTool:
    """The ``read_artifact`` tool as an Agents SDK ``FunctionTool`` over ``store``: a
    compressed output names its artifact, and the agent calls this to read it back (paged by
    ``offset`` and ``limit``, in characters). A bad call is answered with an error text the
    model can act on.
    """
    import json

    from agents import FunctionTool, RunContextWrapper

    _check.instance("store", store, ArtifactStore, "an ArtifactStore")
    spec = READ_ARTIFACT_TOOL["function"]

    async def invoke(ctx: RunContextWrapper[Any], arguments: str) -> str:
        try:
            return await asyncio.to_thread(read_artifact_tool, store, arguments)
        except (InvalidMessageError, ArtifactNotFoundError) as exc:
            return json.dumps({"error": str(exc)})

    return FunctionTool(
        name=spec["name"],
        description=spec["description"],
        params_json_schema=spec["parameters"],
        on_invoke_tool=invoke,
        strict_json_schema=False,  # offset and limit are optional
    )


def _plain_item(item: Any, i: int) -> dict[str, Any]:
    """An input item as a plain dict (the SDK's items are dicts; a pydantic item is dumped)."""
    if isinstance(item, Mapping):
        return cast("dict[str, Any]", item)
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        return cast("dict[str, Any]", dump(exclude_unset=True, mode="json"))
    raise InvalidMessageError(
        f"a Responses input item must be an object, got {describe(item)}", index=i
    )


def _key(item: Mapping[str, Any]) -> tuple[Any, ...]:
    return (item.get("type"), item.get("role"), item.get("call_id"), item.get("id"))


def _reuse(items: list[dict[str, Any]], plain: list[dict[str, Any]], given: list[Any]) -> list[Any]:
    """``items`` with each one equal to a given item replaced by that very object, matched in
    order (the pruner keeps the input's order), so the SDK sees what it sent unchanged.
    """
    where: dict[tuple[Any, ...], list[int]] = {}
    for i, item in enumerate(plain):
        where.setdefault(_key(item), []).append(i)
    out: list[Any] = []
    after = 0  # items before this were matched or passed
    for item in items:
        chosen: Any = item
        positions = where.get(_key(item), [])
        for k in range(bisect.bisect_left(positions, after), len(positions)):
            j = positions[k]
            if plain[j] == item:
                chosen, after = given[j], j + 1
                break
        out.append(chosen)
    return out

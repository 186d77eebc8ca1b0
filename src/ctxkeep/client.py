"""The client of ``ctxkeep serve``: :class:`RemoteMemory` and :class:`AsyncRemoteMemory`.

Both speak the service's ``/v1`` API with httpx and offer the methods of
:class:`~ctxkeep.MemoryManager` (and :class:`~ctxkeep.AsyncMemoryManager`) with the same
arguments, results and exceptions: a problem response is turned back into the ctxkeep
exception it stands for (:func:`ctxkeep.server.problems.error_for`), so
``OrphanToolResultError`` or ``SessionNotFoundError`` reach the caller as they would from a
local manager. A server failure that stands for a ctxkeep exception (a corrupt stored record,
stored data of an unknown version, a kind of record the storage does not offer) is raised as
that exception and a :class:`RemoteError` at once (``RemoteCorruptRecordError`` is both a
``CorruptRecordError`` and a ``RemoteError``). What the service does not map to a ctxkeep
exception (a missing key, a body over the limit, a storage outage, a bug, an unreachable
server) raises :class:`RemoteError` (a :class:`~ctxkeep.errors.StorageError`), with the
status and the problem.

The work that is not I/O (paths, bodies, decoding) is written once, in :class:`_Calls`; the two
classes only send. Evict hooks (:meth:`RemoteMemory.add_evict_hook`) are called with the
messages each response says its request trimmed or evicted (``max_history``, TTL, LRU):
evictions made while serving other clients are not seen here, as a local manager's hooks do
not see another process's.

The server's policy and storage are the server's: ``config`` and the clock belong to
:func:`ctxkeep.server.create_app`, and there is no ``backend`` attribute.

Retries. A server may drop a connection (a restart, a crash, uvicorn closing a keep-alive
connection after a 500); the client then tries again, up to :attr:`RetryPolicy.retries` times
with doubling waits: always when the request was never sent (the connection could not be
made), and after a connection lost mid-request only when sending it twice is harmless: GET,
DELETE and PUT, and appends, which the service stores once per message id (the client gives
each message an id before the first try, so every try carries the same ones). Other requests
(creating a session, a replace, a pop) raise :class:`RemoteError` at once: their fate is
unknown and the caller decides. ``RetryPolicy(retries=0)`` turns retries off.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote

from ctxkeep import _check
from ctxkeep.errors import (
    AuthenticationError,
    ConfigError,
    CtxkeepError,
    InvalidMessageError,
    InvalidTypeError,
    MissingDependencyError,
    RemoteError,
    StorageError,
)
from ctxkeep.messages import Message, coerce_message
from ctxkeep.server.problems import PROBLEM_CONTENT_TYPE, PROBLEMS, error_for, kind_for_type
from ctxkeep.server.wire import (
    evicted_from_wire,
    message_from_wire,
    message_to_wire,
    session_from_wire,
)
from ctxkeep.sessions.base import Evicted, EvictHook
from ctxkeep.sessions.records import SessionInfo

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("httpx", "server") from exc

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
_PAGE = 1000  # the server's largest page of sessions


def _remote(error: type[Exception]) -> type[RemoteError]:
    """The exception a client raises for a server failure that stands for ``error``: both a
    :class:`RemoteError` (with the status and the problem) and ``error`` itself, so a caller
    catches it as it would from a local manager (``except CorruptRecordError``) or as any
    failure of the service (``except RemoteError``).
    """
    return type(
        f"Remote{error.__name__}",
        (RemoteError, error),
        {"__module__": __name__, "__doc__": f"The service failed with {error.__name__}."},
    )


_SERVER_FAILURES: dict[str, type[RemoteError]] = {
    kind.slug: _remote(kind.error)
    for kind in PROBLEMS
    # A package the server lacks is no install for the caller to make: a RemoteError.
    if kind.status >= 500
    and kind.error not in (None, CtxkeepError, StorageError, MissingDependencyError)
}
"""The server failures (5xx) of :data:`~ctxkeep.server.problems.PROBLEMS` that stand for a
typed ctxkeep exception (a corrupt record, stored data of an unknown version, a kind of
record the storage does not offer), by problem slug; derived from the table, so a new one is
mapped too. ``storage-unavailable`` (503), ``internal-error`` (500) and
``missing-dependency`` (501: a package the server lacks, whose detail names its extra) raise
:class:`RemoteError` itself, which is a :class:`~ctxkeep.errors.StorageError`."""


@dataclass(frozen=True)
class RemotePrompt:
    """A prompt built by the service (``POST /v1/sessions/{id}/prompt``)."""

    format: str
    """``openai``, ``anthropic`` or ``responses``."""
    messages: list[dict[str, Any]]
    """The provider's messages (or Responses input items)."""
    system: list[dict[str, Any]] | None
    """Anthropic's system blocks (None in the other formats)."""
    report: dict[str, Any]
    """The build report: tokens per section, budgets, the pruner's decisions."""


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[dict[str, Any]], T]
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    not_found: Callable[[], T] | None = None
    """What a 404 ``session-not-found`` means, if not an error."""
    local: Callable[[], T] | None = None
    """The answer, known without asking the service (no request is sent)."""
    repeatable: bool = False
    """Safe to send again though it is not a GET, DELETE or PUT (an append by message id)."""

    @property
    def idempotent(self) -> bool:
        """Whether sending the request twice has the effect of sending it once."""
        return self.repeatable or self.method in _IDEMPOTENT_METHODS


_IDEMPOTENT_METHODS = frozenset({"GET", "DELETE", "PUT"})

_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Failures before the request left the client: sending it again is always safe."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How :class:`RemoteMemory` and :class:`AsyncRemoteMemory` try a request again after the
    connection failed (see the module docstring for which requests).
    """

    retries: int = 4
    """Tries after the first (0: none). Four waits of 0.1 to 0.8 s span a server restart of
    about 1.5 s, the time ``ctxkeep serve`` takes to start on a loaded two-core machine."""
    backoff: float = 0.1
    """Seconds before the first retry; each later wait doubles, up to ``max_backoff``."""
    max_backoff: float = 2.0
    """The longest wait between two tries, in seconds."""

    def __post_init__(self) -> None:
        _check.integer("retries", self.retries, minimum=0)
        for name in ("backoff", "max_backoff"):
            if _check.number(name, getattr(self, name)) < 0:
                raise ConfigError(f"{name} must be at least 0 seconds")

    def delay(self, call: _Call[Any], exc: httpx.HTTPError, attempt: int) -> float | None:
        """Seconds to wait before try ``attempt + 1`` of ``call`` after try ``attempt``
        (0-based) failed with ``exc``, or None to give up.
        """
        if attempt >= self.retries or not isinstance(exc, httpx.TransportError):
            return None
        if not isinstance(exc, _NEVER_SENT) and not call.idempotent:
            return None
        return float(min(self.backoff * 2.0**attempt, self.max_backoff))


def _sid(session_id: Any) -> str:
    """A session id as a path segment; a non-string or empty id is no session."""
    from ctxkeep.sessions.base import check_session_id

    return quote(check_session_id(session_id), safe="")


def _messages(data: dict[str, Any]) -> list[Message]:
    return [message_from_wire(m) for m in data["messages"]]


def _wire_messages(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """The messages as the API takes them, each with an ``id`` (a new one where it has none),
    so that an append sent again after a lost answer is recognised and stored once.
    """
    out = []
    for i, raw in enumerate(_check.iterable("messages", messages)):
        m = coerce_message(raw, index=i)
        wire = message_to_wire(m)
        wire["id"] = m.id or uuid.uuid4().hex
        out.append(wire)
    return out


class _Calls:
    """The API's requests, free of I/O (shared by the sync and async clients)."""

    @staticmethod
    def create_session(
        agent_id: str,
        task_id: str | None,
        metadata: Mapping[str, Any] | None,
        session_id: str | None,
    ) -> _Call[str]:
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidMessageError(f"agent_id must be a non-empty string, got {agent_id!r}")
        if task_id is not None and not isinstance(task_id, str):
            raise InvalidMessageError(f"task_id must be a string, got {task_id!r}")
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise InvalidMessageError(f"session_id must be a non-empty string, got {session_id!r}")
        meta = _check.mapping("metadata", metadata)
        message_to_wire(Message("user", "", metadata=meta))  # JSON check, as the manager's
        body: dict[str, Any] = {"agent_id": agent_id, "task_id": task_id, "metadata": meta}
        if session_id is not None:
            body["session_id"] = session_id
        return _Call("POST", "/v1/sessions", lambda d: str(d["session"]["session_id"]), body)

    @staticmethod
    def get_session(session_id: str) -> _Call[SessionInfo]:
        return _Call(
            "GET", f"/v1/sessions/{_sid(session_id)}", lambda d: session_from_wire(d["session"])
        )

    @staticmethod
    def has_session(session_id: str) -> _Call[bool]:
        if not isinstance(session_id, str) or not session_id:
            return _Call("GET", "", lambda d: False, local=lambda: False)  # never an id
        return _Call("GET", f"/v1/sessions/{_sid(session_id)}/exists", lambda d: bool(d["exists"]))

    @staticmethod
    def list_page(
        agent_id: str | None, task_id: str | None, limit: int, offset: int
    ) -> _Call[list[SessionInfo]]:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if agent_id is not None:
            params["agent_id"] = agent_id
        if task_id is not None:
            params["task_id"] = task_id
        return _Call(
            "GET",
            "/v1/sessions",
            lambda d: [session_from_wire(s) for s in d["sessions"]],
            params=params,
        )

    @staticmethod
    def delete_session(session_id: str) -> _Call[bool]:
        return _Call(
            "DELETE",
            f"/v1/sessions/{_sid(session_id)}",
            lambda d: bool(d["deleted"]),
            not_found=lambda: False,
        )

    @staticmethod
    def latest(agent_id: str) -> _Call[str | None]:
        agent = quote(_check.text("agent_id", agent_id), safe="")
        return _Call("GET", f"/v1/agents/{agent}/latest", lambda d: d["session_id"])

    @staticmethod
    def session_count() -> _Call[int]:
        return _Call("GET", "/v1/stats", lambda d: int(d["sessions"]))

    @staticmethod
    def sweep() -> _Call[int]:
        return _Call("POST", "/v1/sweep", lambda d: int(d["swept"]))

    @staticmethod
    def add_messages(session_id: str, messages: Iterable[Any]) -> _Call[list[Message]]:
        body = {"messages": _wire_messages(messages)}
        path = f"/v1/sessions/{_sid(session_id)}/messages"
        return _Call("POST", path, _messages, body, repeatable=True)

    @staticmethod
    def get_messages(session_id: str, limit: int | None) -> _Call[list[Message]]:
        _check.optional_integer("limit", limit, minimum=0)
        params = {} if limit is None else {"last": limit}
        return _Call("GET", f"/v1/sessions/{_sid(session_id)}/messages", _messages, params=params)

    @staticmethod
    def pop_message(session_id: str) -> _Call[Message | None]:
        def parse(d: dict[str, Any]) -> Message | None:
            return None if d["message"] is None else message_from_wire(d["message"])

        return _Call("POST", f"/v1/sessions/{_sid(session_id)}/messages/pop", parse)

    @staticmethod
    def replace_newest(
        session_id: str, messages: Iterable[Any], newest_id: str
    ) -> _Call[list[Message]]:
        body = {
            "newest_id": _check.text("newest_id", newest_id),
            "messages": _wire_messages(messages),
        }
        return _Call("PUT", f"/v1/sessions/{_sid(session_id)}/messages/newest", _messages, body)

    @staticmethod
    def archived(session_id: str) -> _Call[list[Message]]:
        return _Call("GET", f"/v1/sessions/{_sid(session_id)}/archived", _messages)

    @staticmethod
    def prompt_history(session_id: str, system: Any, pruner: Any) -> _Call[list[Message]]:
        if pruner is not None:
            _check.has_method("pruner", pruner, "prune", "TokenPruner")
        prefix: list[Message] = []
        if system is not None:
            if not isinstance(system, str | Message):
                raise InvalidTypeError(
                    f"system must be a string or a Message, got {type(system).__name__}"
                )
            prefix = [system.copy() if isinstance(system, Message) else Message("system", system)]

        def parse(d: dict[str, Any]) -> list[Message]:
            msgs = prefix + _messages(d)
            return list(pruner.prune(msgs)) if pruner is not None else msgs

        return _Call("GET", f"/v1/sessions/{_sid(session_id)}/prompt", parse)

    @staticmethod
    def build_prompt(session_id: str, options: dict[str, Any]) -> _Call[RemotePrompt]:
        def parse(d: dict[str, Any]) -> RemotePrompt:
            return RemotePrompt(d["format"], d["messages"], d["system"], d["report"])

        body = {k: v for k, v in options.items() if v is not None}
        return _Call("POST", f"/v1/sessions/{_sid(session_id)}/prompt", parse, body)


class _Base:
    """What both clients share: the hooks and reading responses."""

    url: str
    """The service's base URL (set by each client)."""

    def __init__(self, api_key: str, retry: RetryPolicy | None) -> None:
        self.retry = RetryPolicy() if retry is None else retry
        """When a request is tried again after a failed connection."""
        self._hooks: list[EvictHook] = []
        self._headers = {"Authorization": f"Bearer {_check.text('api_key', api_key)}"}

    def add_evict_hook(self, hook: EvictHook) -> None:
        """Call ``hook`` with every batch of messages a request of this client trimmed or
        evicted (as the server reports them).
        """
        self._hooks.append(hook)

    def _emit(self, evicted: Any) -> None:
        if not self._hooks or not isinstance(evicted, list):
            return
        for raw in evicted:
            e: Evicted = evicted_from_wire(raw)
            for hook in self._hooks:
                hook(e)

    def _answer(self, call: _Call[T], response: httpx.Response) -> T:
        """The result of ``call`` from its response, or the exception it stands for."""
        if response.is_success:
            data = response.json()
            self._emit(data.get("evicted"))
            return call.parse(data)
        problem: dict[str, Any] = {}
        if response.headers.get("content-type", "").startswith(PROBLEM_CONTENT_TYPE):
            try:
                body = response.json()
            except ValueError:
                body = None
            problem = body if isinstance(body, dict) else {}
        self._emit(problem.get("evicted"))
        kind = kind_for_type(problem.get("type"))
        if call.not_found is not None and kind is not None and kind.slug == "session-not-found":
            return call.not_found()
        error = error_for(problem)
        if error is not None:
            raise error
        detail = problem.get("detail") or response.reason_phrase or "no detail"
        message = f"ctxkeep service answered {response.status_code} to {call.method} {call.path}: "
        cls = AuthenticationError if response.status_code == 401 else RemoteError
        if kind is not None and response.status_code >= 500:
            cls = _SERVER_FAILURES.get(kind.slug, RemoteError)
        raise cls(message + str(detail), status=response.status_code, problem=problem)

    def _unreachable(self, call: _Call[Any], exc: httpx.HTTPError) -> RemoteError:
        where = f"{self.url.rstrip('/')}{call.path}"  # which server did not answer
        return RemoteError(f"ctxkeep service at {where}: {call.method} failed: {exc}")


class RemoteMemory(_Base):
    """Session memory on a ``ctxkeep serve`` service, with :class:`~ctxkeep.MemoryManager`'s
    methods. Thread-safe; a context manager.

    Args:
        url: the service's base URL (``http://127.0.0.1:8765``).
        api_key: a key from ``ctxkeep keys create``; the sessions are its tenant's.
        timeout: seconds to wait for the service (connect, read, write).
        retry: when to send a request again after the connection failed (default
            :class:`RetryPolicy`'s; see the module docstring).

    Example::

        with RemoteMemory("http://127.0.0.1:8765", api_key) as mem:
            sid = mem.create_session("agent-1")
            mem.add_message(sid, "user", "hello")

    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(api_key, retry)
        self.url = _check.text("url", url).rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, headers=self._headers, timeout=_check.number("timeout", timeout)
        )

    def _run(self, call: _Call[T]) -> T:
        if call.local is not None:
            return call.local()
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params or None
                )
            except httpx.HTTPError as exc:
                wait = self.retry.delay(call, exc, attempt)
                if wait is None:
                    raise self._unreachable(call, exc) from exc
                time.sleep(wait)
                attempt += 1
                continue
            return self._answer(call, response)

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions ----------------------------------------------------------------------------

    def create_session(
        self,
        agent_id: str,
        *,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> str:
        """See :meth:`MemoryManager.create_session`."""
        return self._run(_Calls.create_session(agent_id, task_id, metadata, session_id))

    def get_session(self, session_id: str) -> SessionInfo:
        """See :meth:`MemoryManager.get_session`."""
        return self._run(_Calls.get_session(session_id))

    def has_session(self, session_id: str) -> bool:
        """See :meth:`MemoryManager.has_session`."""
        return self._run(_Calls.has_session(session_id))

    def list_sessions(
        self,
        *,
        agent_id: str | None = None,
        task_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[SessionInfo]:
        """See :meth:`MemoryManager.list_sessions` (pages of more than 1,000 are fetched in
        several requests).
        """
        _check.integer("limit", limit, minimum=1)
        _check.integer("offset", offset, minimum=0)
        out: list[SessionInfo] = []
        while len(out) < limit:
            n = min(_PAGE, limit - len(out))
            page = self._run(_Calls.list_page(agent_id, task_id, n, offset + len(out)))
            out.extend(page)
            if len(page) < n:
                break
        return out

    def delete_session(self, session_id: str) -> bool:
        """See :meth:`MemoryManager.delete_session`."""
        return self._run(_Calls.delete_session(session_id))

    def get_latest_session_for_agent(self, agent_id: str) -> str | None:
        """See :meth:`MemoryManager.get_latest_session_for_agent`."""
        return self._run(_Calls.latest(agent_id))

    def session_count(self) -> int:
        """See :meth:`MemoryManager.session_count`."""
        return self._run(_Calls.session_count())

    def sweep(self) -> int:
        """See :meth:`MemoryManager.sweep`."""
        return self._run(_Calls.sweep())

    # -- messages ----------------------------------------------------------------------------

    def add_message(self, session_id: str, role: str, content: Any, **fields: Any) -> Message:
        """See :meth:`MemoryManager.add_message`."""
        return self.add_messages(session_id, [Message(role, content, **fields)])[0]

    def add_structured_message(self, session_id: str, message: Any) -> Message:
        """See :meth:`MemoryManager.add_structured_message`."""
        return self.add_messages(session_id, [message])[0]

    def add_messages(self, session_id: str, messages: Iterable[Any]) -> list[Message]:
        """See :meth:`MemoryManager.add_messages` (one request: all or none)."""
        return self._run(_Calls.add_messages(session_id, messages))

    def get_messages(self, session_id: str, *, limit: int | None = None) -> list[Message]:
        """See :meth:`MemoryManager.get_messages`."""
        return self._run(_Calls.get_messages(session_id, limit))

    def pop_message(self, session_id: str) -> Message | None:
        """See :meth:`MemoryManager.pop_message`."""
        return self._run(_Calls.pop_message(session_id))

    def replace_newest(
        self, session_id: str, messages: Iterable[Any], *, newest_id: str
    ) -> list[Message]:
        """See :meth:`MemoryManager.replace_newest`."""
        return self._run(_Calls.replace_newest(session_id, messages, newest_id))

    def archived_messages(self, session_id: str) -> list[Message]:
        """See :meth:`MemoryManager.archived_messages`."""
        return self._run(_Calls.archived(session_id))

    def build_prompt_messages(
        self, session_id: str, *, system: str | Message | None = None, pruner: Any = None
    ) -> list[Message]:
        """See :meth:`MemoryManager.build_prompt_messages`: the service sends the history,
        and ``pruner`` runs here.
        """
        return self._run(_Calls.prompt_history(session_id, system, pruner))

    def build_prompt(
        self,
        session_id: str,
        *,
        max_prompt_tokens: int | None = None,
        reserve_output_tokens: int | None = None,
        preserve_last_n: int | None = None,
        system: str | None = None,
        format: str = "openai",
        encoding: str | None = None,
    ) -> RemotePrompt:
        """Build the session's prompt on the service, within a token budget (see
        ``POST /v1/sessions/{id}/prompt``); options left out take the service's defaults.
        """
        options = {
            "max_prompt_tokens": max_prompt_tokens,
            "reserve_output_tokens": reserve_output_tokens,
            "preserve_last_n": preserve_last_n,
            "system": system,
            "format": format,
            "encoding": encoding,
        }
        return self._run(_Calls.build_prompt(session_id, options))


class AsyncRemoteMemory(_Base):
    """The async twin of :class:`RemoteMemory` (httpx.AsyncClient), with
    :class:`~ctxkeep.AsyncMemoryManager`'s methods.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        super().__init__(api_key, retry)
        self.url = _check.text("url", url).rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=self._headers, timeout=_check.number("timeout", timeout)
        )

    async def _run(self, call: _Call[T]) -> T:
        if call.local is not None:
            return call.local()
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params or None
                )
            except httpx.HTTPError as exc:
                wait = self.retry.delay(call, exc, attempt)
                if wait is None:
                    raise self._unreachable(call, exc) from exc
                await asyncio.sleep(wait)
                attempt += 1
                continue
            return self._answer(call, response)

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create_session(
        self,
        agent_id: str,
        *,
        task_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        session_id: str | None = None,
    ) -> str:
        """See :meth:`RemoteMemory.create_session`."""
        return await self._run(_Calls.create_session(agent_id, task_id, metadata, session_id))

    async def get_session(self, session_id: str) -> SessionInfo:
        """See :meth:`RemoteMemory.get_session`."""
        return await self._run(_Calls.get_session(session_id))

    async def has_session(self, session_id: str) -> bool:
        """See :meth:`RemoteMemory.has_session`."""
        return await self._run(_Calls.has_session(session_id))

    async def list_sessions(
        self,
        *,
        agent_id: str | None = None,
        task_id: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> list[SessionInfo]:
        """See :meth:`RemoteMemory.list_sessions`."""
        _check.integer("limit", limit, minimum=1)
        _check.integer("offset", offset, minimum=0)
        out: list[SessionInfo] = []
        while len(out) < limit:
            n = min(_PAGE, limit - len(out))
            page = await self._run(_Calls.list_page(agent_id, task_id, n, offset + len(out)))
            out.extend(page)
            if len(page) < n:
                break
        return out

    async def delete_session(self, session_id: str) -> bool:
        """See :meth:`RemoteMemory.delete_session`."""
        return await self._run(_Calls.delete_session(session_id))

    async def get_latest_session_for_agent(self, agent_id: str) -> str | None:
        """See :meth:`RemoteMemory.get_latest_session_for_agent`."""
        return await self._run(_Calls.latest(agent_id))

    async def session_count(self) -> int:
        """See :meth:`RemoteMemory.session_count`."""
        return await self._run(_Calls.session_count())

    async def sweep(self) -> int:
        """See :meth:`RemoteMemory.sweep`."""
        return await self._run(_Calls.sweep())

    async def add_message(self, session_id: str, role: str, content: Any, **fields: Any) -> Message:
        """See :meth:`RemoteMemory.add_message`."""
        return (await self.add_messages(session_id, [Message(role, content, **fields)]))[0]

    async def add_structured_message(self, session_id: str, message: Any) -> Message:
        """See :meth:`RemoteMemory.add_structured_message`."""
        return (await self.add_messages(session_id, [message]))[0]

    async def add_messages(self, session_id: str, messages: Iterable[Any]) -> list[Message]:
        """See :meth:`RemoteMemory.add_messages`."""
        return await self._run(_Calls.add_messages(session_id, messages))

    async def get_messages(self, session_id: str, *, limit: int | None = None) -> list[Message]:
        """See :meth:`RemoteMemory.get_messages`."""
        return await self._run(_Calls.get_messages(session_id, limit))

    async def pop_message(self, session_id: str) -> Message | None:
        """See :meth:`RemoteMemory.pop_message`."""
        return await self._run(_Calls.pop_message(session_id))

    async def replace_newest(
        self, session_id: str, messages: Iterable[Any], *, newest_id: str
    ) -> list[Message]:
        """See :meth:`RemoteMemory.replace_newest`."""
        return await self._run(_Calls.replace_newest(session_id, messages, newest_id))

    async def archived_messages(self, session_id: str) -> list[Message]:
        """See :meth:`RemoteMemory.archived_messages`."""
        return await self._run(_Calls.archived(session_id))

    async def build_prompt_messages(
        self, session_id: str, *, system: str | Message | None = None, pruner: Any = None
    ) -> list[Message]:
        """See :meth:`RemoteMemory.build_prompt_messages`."""
        return await self._run(_Calls.prompt_history(session_id, system, pruner))

    async def build_prompt(
        self,
        session_id: str,
        *,
        max_prompt_tokens: int | None = None,
        reserve_output_tokens: int | None = None,
        preserve_last_n: int | None = None,
        system: str | None = None,
        format: str = "openai",
        encoding: str | None = None,
    ) -> RemotePrompt:
        """See :meth:`RemoteMemory.build_prompt`."""
        options = {
            "max_prompt_tokens": max_prompt_tokens,
            "reserve_output_tokens": reserve_output_tokens,
            "preserve_last_n": preserve_last_n,
            "system": system,
            "format": format,
            "encoding": encoding,
        }
        return await self._run(_Calls.build_prompt(session_id, options))


__all__ = [
    "AsyncRemoteMemory",
    "AuthenticationError",
    "RemoteError",
    "RemoteMemory",
    "RemotePrompt",
]

"""Errors on the wire: ctxkeep's exceptions as RFC 9457 problem details, and back.

The service answers every failure with ``application/problem+json``: ``type`` (a
``urn:ctxkeep:problem:<slug>`` URI that names the kind of problem), ``title`` (the same for
every problem of that kind), ``status`` and ``detail`` (the exception's message, which says
what was wrong and what to do), plus extension members that carry the exception's attributes
(``index`` and ``tool_call_id`` of a sequence error, ``budget``/``required``/``blocking`` of a
budget error, ``limit``/``actual``/``unit``/``breakdown`` of a prompt that is too long,
``task_id``/``expected``/``current`` of a stale task-state write...).

:data:`PROBLEMS` is the one table both sides read: the server turns an exception into a
problem with :func:`problem_for`, and :mod:`ctxkeep.client` turns a problem back into the same
exception type with :func:`error_for`. The table is ordered most specific first; an exception
takes the first row whose class it is an instance of.

No third-party import here: the client uses this module without the server's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ctxkeep.errors import (
    ArtifactNotFoundError,
    BudgetExceededError,
    CheckpointNotFoundError,
    CognitiveStateSchemaVersionError,
    ConfigError,
    CorruptRecordError,
    CtxkeepError,
    EpisodeNotFoundError,
    InvalidFilterError,
    InvalidMessageError,
    InvalidSequenceError,
    InvalidTypeError,
    MessageError,
    MessageIdConflictError,
    MissingDependencyError,
    MissingToolResultError,
    OrphanToolResultError,
    PromptTooLongError,
    SchemaVersionError,
    SessionChangedError,
    SessionExistsError,
    SessionNotFoundError,
    StaleTaskStateError,
    StorageError,
    UnknownAgentError,
    UnknownEncodingError,
    UnknownRoleError,
)

PROBLEM_TYPE_PREFIX = "urn:ctxkeep:problem:"
"""Every problem ``type`` starts with this; the rest is the slug of :class:`ProblemKind`."""

PROBLEM_CONTENT_TYPE = "application/problem+json"


@dataclass(frozen=True)
class ProblemKind:
    """One kind of problem: the exception class it stands for and how it is answered."""

    error: type[Exception] | None
    """The ctxkeep exception it stands for (None: a problem of the HTTP layer only)."""
    status: int
    """The HTTP status."""
    slug: str
    """The last part of the ``type`` URI."""
    title: str
    """A short summary, the same for every occurrence."""

    @property
    def type(self) -> str:
        """The problem's ``type`` URI."""
        return PROBLEM_TYPE_PREFIX + self.slug


class NotAvailableError(CtxkeepError):
    """The server's storage does not offer this kind of record (episodes on Redis)."""


PROBLEMS: tuple[ProblemKind, ...] = (
    ProblemKind(SessionNotFoundError, 404, "session-not-found", "Session not found"),
    ProblemKind(ArtifactNotFoundError, 404, "artifact-not-found", "Artifact not found"),
    ProblemKind(EpisodeNotFoundError, 404, "episode-not-found", "Episode not found"),
    ProblemKind(CheckpointNotFoundError, 404, "checkpoint-not-found", "Checkpoint not found"),
    ProblemKind(UnknownAgentError, 404, "unknown-agent", "Agent has joined no task"),
    ProblemKind(StaleTaskStateError, 409, "stale-task-state", "Task state changed since read"),
    ProblemKind(SessionExistsError, 409, "session-exists", "Session already exists"),
    ProblemKind(SessionChangedError, 409, "session-changed", "Session changed since it was read"),
    ProblemKind(MessageIdConflictError, 409, "message-id-conflict", "Another message has that id"),
    ProblemKind(OrphanToolResultError, 422, "orphan-tool-result", "Tool result without its call"),
    ProblemKind(
        MissingToolResultError, 422, "missing-tool-result", "Tool call still waits for results"
    ),
    ProblemKind(InvalidSequenceError, 422, "invalid-sequence", "Invalid message sequence"),
    ProblemKind(UnknownRoleError, 422, "unknown-role", "Unknown message role"),
    ProblemKind(InvalidMessageError, 422, "invalid-message", "Invalid message"),
    ProblemKind(MessageError, 422, "invalid-message", "Invalid message"),
    ProblemKind(BudgetExceededError, 422, "budget-exceeded", "Prompt does not fit the budget"),
    ProblemKind(PromptTooLongError, 422, "prompt-too-long", "Prompt too long"),
    ProblemKind(UnknownEncodingError, 422, "unknown-encoding", "Unknown token encoding"),
    ProblemKind(InvalidTypeError, 422, "invalid-type", "Argument of the wrong type"),
    ProblemKind(InvalidFilterError, 422, "invalid-filter", "Invalid search filter"),
    ProblemKind(ConfigError, 422, "invalid-parameter", "Invalid parameter"),
    ProblemKind(
        CognitiveStateSchemaVersionError,
        422,
        "state-schema-version",
        "Cognitive state of an unknown version",
    ),
    ProblemKind(SchemaVersionError, 500, "schema-version", "Stored data of an unknown version"),
    # A stored record that cannot be read (a message row, a task state): the store's fault, so
    # no 4xx, and not 503 storage-unavailable, which says "retry later": a retry reads the
    # same damaged record. 500 under its own type, so an operator can tell it from a bug and
    # repair or delete the record the log names.
    ProblemKind(CorruptRecordError, 500, "corrupt-record", "Stored record is corrupt"),
    ProblemKind(NotAvailableError, 501, "not-available", "Not available on this storage"),
    # A route whose optional package this server lacks (the default embedder of the episodic
    # routes without its extra): told, as it names the extra that brings it.
    ProblemKind(MissingDependencyError, 501, "missing-dependency", "Not installed on this server"),
    ProblemKind(StorageError, 503, "storage-unavailable", "Storage failed"),
    ProblemKind(CtxkeepError, 500, "internal-error", "Internal error"),
)
"""ctxkeep's exceptions and their problems, most specific first."""

# Problems of the HTTP layer, with no ctxkeep exception behind them.
INVALID_REQUEST = ProblemKind(None, 422, "invalid-request", "Invalid request")
BODY_TOO_LARGE = ProblemKind(None, 413, "body-too-large", "Request body too large")
UNAUTHORIZED = ProblemKind(None, 401, "unauthorized", "Missing or invalid API key")
NOT_FOUND = ProblemKind(None, 404, "not-found", "Not found")
METHOD_NOT_ALLOWED = ProblemKind(None, 405, "method-not-allowed", "Method not allowed")
MALFORMED_REQUEST = ProblemKind(None, 400, "malformed-request", "Malformed HTTP request")
"""A request the HTTP parser refused (the connection is closed after it)."""
REQUEST_TIMEOUT = ProblemKind(None, 408, "request-timeout", "Request timeout")
"""A head or body that did not arrive in time (the connection is closed after it)."""
INTERNAL_ERROR = ProblemKind(None, 500, "internal-error", "Internal error")

HTTP_PROBLEMS: tuple[ProblemKind, ...] = (
    INVALID_REQUEST,
    BODY_TOO_LARGE,
    UNAUTHORIZED,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    MALFORMED_REQUEST,
    REQUEST_TIMEOUT,
    INTERNAL_ERROR,
)
"""Every problem of the HTTP layer the server answers (the client reads them back too)."""

_BY_STATUS = {
    **{kind.status: kind for kind in HTTP_PROBLEMS},
    400: INVALID_REQUEST,  # from the framework, a body that is not UTF-8 JSON: as invalid JSON
}


def kind_for_status(status: int) -> ProblemKind:
    """The problem of the HTTP layer answered for an HTTP error of ``status`` (raised by the
    framework: an unknown route, a wrong method...); a status with none of its own gets an
    ``http-error`` of that status.
    """
    found = _BY_STATUS.get(status)
    return found if found is not None else ProblemKind(None, status, "http-error", "HTTP error")


_BY_SLUG: dict[str, ProblemKind] = {}
for _kind in (*PROBLEMS, *HTTP_PROBLEMS):
    _BY_SLUG.setdefault(_kind.slug, _kind)


def kind_of(error: BaseException) -> ProblemKind:
    """The row of :data:`PROBLEMS` for ``error`` (an unknown exception: internal error)."""
    for kind in PROBLEMS:
        if kind.error is not None and isinstance(error, kind.error):
            return kind
    return INTERNAL_ERROR


def problem_for(error: BaseException) -> dict[str, Any]:
    """The problem details of a ctxkeep exception (RFC 9457 members and extensions).

    A server-side failure (a storage outage, a bug) gets a detail that names the kind of
    failure only: driver messages can carry hosts and paths that are not the caller's business.
    """
    kind = kind_of(error)
    # 501 is no failure: what the server lacks is told
    told = kind.status < 500 or isinstance(error, NotAvailableError | MissingDependencyError)
    detail = str(error) if told else f"{kind.title.lower()}; see the server's log"
    problem: dict[str, Any] = {
        "type": kind.type,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
    }
    problem.update(_extensions(error))
    return problem


def _extensions(error: BaseException) -> dict[str, Any]:
    """The attributes an exception carries, as extension members."""
    if isinstance(error, InvalidSequenceError):
        return {"index": error.index, "tool_call_id": error.tool_call_id}
    if isinstance(error, InvalidMessageError):
        return {"index": error.index}
    if isinstance(error, SessionChangedError | SessionExistsError):
        return {"session_id": error.session_id}
    if isinstance(error, MessageIdConflictError):
        return {"session_id": error.session_id, "message_id": error.message_id}
    if isinstance(error, StaleTaskStateError):
        return {"task_id": error.task_id, "expected": error.expected, "current": error.current}
    if isinstance(error, BudgetExceededError):
        return {"budget": error.budget, "required": error.required, "blocking": error.blocking}
    if isinstance(error, PromptTooLongError):
        return {
            "limit": error.limit,
            "actual": error.actual,
            "unit": error.unit,
            "breakdown": error.breakdown,
        }
    return {}


def http_problem(kind: ProblemKind, detail: str, **extensions: Any) -> dict[str, Any]:
    """The problem details of a problem of the HTTP layer."""
    return {
        "type": kind.type,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        **extensions,
    }


def utf8_safe(value: Any) -> Any:
    r"""``value`` (a problem's JSON) with every string UTF-8 can encode: a lone surrogate (which
    a detail can quote from the caller's own input, such as a message id of ``"\ud800"``)
    written as its escape, ``\ud800``. A response body is UTF-8: one surrogate in a detail
    made the refusal itself fail with 500 (issue 25).
    """
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {utf8_safe(k): utf8_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [utf8_safe(v) for v in value]
    return value


def kind_for_type(type_uri: Any) -> ProblemKind | None:
    """The kind a ``type`` URI names, or None for a URI ctxkeep does not know."""
    if not isinstance(type_uri, str) or not type_uri.startswith(PROBLEM_TYPE_PREFIX):
        return None
    return _BY_SLUG.get(type_uri[len(PROBLEM_TYPE_PREFIX) :])


def error_for(problem: dict[str, Any]) -> CtxkeepError | None:
    """The ctxkeep exception a problem stands for, rebuilt with its attributes, or None when
    the problem names no ctxkeep exception (an HTTP-layer problem or an unknown type).
    """
    kind = kind_for_type(problem.get("type"))
    if kind is None or kind.error is None or kind.status >= 500:
        return None
    cls = kind.error
    detail = str(problem.get("detail") or kind.title)
    try:
        return _rebuild(cls, detail, problem)
    except (TypeError, ValueError, KeyError):  # a problem without the members it should have
        return CtxkeepError(detail)


def _rebuild(cls: type[Exception], detail: str, p: dict[str, Any]) -> CtxkeepError:
    """An instance of ``cls`` whose message is ``detail``, with its attributes."""
    if issubclass(cls, InvalidSequenceError):
        index = int(p["index"])
        return cls(_unprefixed(detail, index), index=index, tool_call_id=p.get("tool_call_id"))
    if issubclass(cls, InvalidMessageError):
        raw = p.get("index")
        at = int(raw) if raw is not None else None
        return cls(_unprefixed(detail, at), index=at)
    if issubclass(cls, SessionChangedError | SessionExistsError):
        return cls(str(p["session_id"]))
    if issubclass(cls, MessageIdConflictError):
        return cls(str(p["session_id"]), str(p["message_id"]))
    if issubclass(cls, StaleTaskStateError):
        return cls(str(p["task_id"]), int(p["expected"]), int(p["current"]))
    if issubclass(cls, BudgetExceededError):
        return cls(
            budget=int(p["budget"]), required=int(p["required"]), blocking=list(p["blocking"])
        )
    if issubclass(cls, PromptTooLongError):
        return cls(
            limit=int(p["limit"]),
            actual=int(p["actual"]),
            unit=str(p["unit"]),
            breakdown=dict(p.get("breakdown") or {}),
        )
    error = cls(detail)
    assert isinstance(error, CtxkeepError)
    return error


def _unprefixed(detail: str, index: int | None) -> str:
    """``detail`` without the ``message N: `` an indexed message error adds to its text."""
    prefix = f"message {index}: "
    return detail[len(prefix) :] if index is not None and detail.startswith(prefix) else detail

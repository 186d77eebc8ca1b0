"""The ``/v1`` routes and ``/healthz``.

Every ``/v1`` route authenticates (:func:`~ctxkeep.server.deps.tenant_of`), then runs against
its tenant's :class:`~ctxkeep.MemoryManager` only, leased from the pool for the duration of
the request: the same manager, policy and errors as the library's, so a route's behaviour is
the manager's method's. Routes are plain functions, run in worker threads (storage I/O blocks).

==========================================  ====================================================
``POST   /v1/sessions``                     create a session
``GET    /v1/sessions``                     list sessions (``agent_id``, ``task_id``, pages)
``GET    /v1/sessions/{id}``                a session's info (an access)
``GET    /v1/sessions/{id}/exists``         whether it exists (not an access)
``DELETE /v1/sessions/{id}``                delete it
``GET    /v1/agents/{agent_id}/latest``     an agent's newest session
``GET    /v1/stats``                        sessions stored
``POST   /v1/sweep``                        reclaim idle sessions
``POST   /v1/sessions/{id}/messages``       append messages, all or none
``GET    /v1/sessions/{id}/messages``       list messages (``last``, ``offset``, ``limit``)
``POST   /v1/sessions/{id}/messages/pop``   take back the newest message
``PUT    /v1/sessions/{id}/messages/newest``  replace the newest message (``newest_id``)
``GET    /v1/sessions/{id}/archived``       trimmed and evicted messages
``GET    /v1/sessions/{id}/prompt``         the history as a prompt, unpruned
``POST   /v1/sessions/{id}/prompt``         build a prompt within a budget, with its report
==========================================  ====================================================

Every ``/v1`` route takes its :class:`~ctxkeep.server.deps.Tenant` through
:data:`~ctxkeep.server.deps.TenantDep` (:mod:`ctxkeep.server.deps`, which the app imports too:
the routes never import the app). Artifacts, episodes and checkpoints are in
:mod:`~ctxkeep.server.routes_memory`, task state and the bus in
:mod:`~ctxkeep.server.routes_fabric`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel

from ctxkeep._check import INT64_MAX
from ctxkeep.artifacts.staged import StagedArtifacts
from ctxkeep.builder import BuiltPrompt
from ctxkeep.builder.budgeted import budgeted_builder
from ctxkeep.errors import SessionNotFoundError
from ctxkeep.messages import Message
from ctxkeep.prune.report import MessageDecision
from ctxkeep.responses import to_responses
from ctxkeep.server import problems
from ctxkeep.server.deps import Tenant, TenantDep, tenant_of
from ctxkeep.server.models import (
    AppendIn,
    BuildReportOut,
    CreateSessionIn,
    DeletedResponse,
    ExistsResponse,
    Health,
    IdPath,
    LatestSessionResponse,
    MessageIn,
    MessagePage,
    MessagesResponse,
    PoppedResponse,
    Problem,
    PromptIn,
    PromptResponse,
    ReplaceNewestIn,
    SessionOut,
    SessionPage,
    SessionResponse,
    StatsResponse,
    SweepResponse,
)
from ctxkeep.server.wire import message_from_wire, message_to_wire
from ctxkeep.sessions.records import SessionInfo


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the problem responses a route can give."""
    titles = {
        401: "Missing or invalid API key",
        404: "No such session",
        409: "Conflict with the session's state",
        413: "Request body too large",
        422: "Invalid request, message or sequence",
        503: "Storage failed",
    }
    return {s: {"model": Problem, "description": titles[s]} for s in statuses}


_READ = _problems(401, 422, 503)
_SESSION = _problems(401, 404, 422, 503)
_WRITE = _problems(401, 404, 413, 422, 503)

router = APIRouter()


def _session_out(info: SessionInfo) -> SessionOut:
    return SessionOut.model_validate(info.to_dict())


def _messages_in(messages: list[MessageIn]) -> list[Message]:
    """The messages of a request (an id the stores cannot keep, with NUL or longer than
    :data:`~ctxkeep.server.models.MAX_ID_LENGTH`, is refused by the manager's append, on every
    backend, with its index).

    Raises:
        InvalidMessageError: a malformed message.

    """
    return [
        message_from_wire(m.model_dump(exclude_unset=True), index=i) for i, m in enumerate(messages)
    ]


def _messages_out(messages: list[Message]) -> list[dict[str, Any]]:
    return [message_to_wire(m) for m in messages]


# -- health ---------------------------------------------------------------------------------------


@router.get("/healthz", response_model=Health, tags=["health"])
def healthz() -> Health:
    """The server answers (no authentication, no storage access)."""
    return Health(status="ok")


# -- sessions -------------------------------------------------------------------------------------


@router.post(
    "/v1/sessions",
    status_code=201,
    response_model=SessionResponse,
    responses=_problems(401, 409, 413, 422, 503),
    tags=["sessions"],
)
def create_session(body: CreateSessionIn, tenant: TenantDep) -> SessionResponse:
    """Start a session; beyond ``max_sessions`` the least recently used are evicted."""
    with tenant.memory() as mem:
        sid = mem.create_session(
            body.agent_id, task_id=body.task_id, metadata=body.metadata, session_id=body.session_id
        )
        info = mem.get_session(sid)
    return SessionResponse(session=_session_out(info), evicted=tenant.evicted())


@router.get("/v1/sessions", response_model=SessionPage, responses=_READ, tags=["sessions"])
def list_sessions(
    tenant: TenantDep,
    agent_id: Annotated[str | None, Query(min_length=1)] = None,
    task_id: Annotated[str | None, Query(min_length=1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
) -> SessionPage:
    """Live sessions, newest first, filtered by agent and/or task, one page at a time."""
    with tenant.memory() as mem:
        infos = mem.list_sessions(
            agent_id=agent_id, task_id=task_id, limit=limit + 1, offset=offset
        )
    more = len(infos) > limit
    return SessionPage(
        sessions=[_session_out(i) for i in infos[:limit]],
        limit=limit,
        offset=offset,
        next_offset=offset + limit if more else None,
        evicted=tenant.evicted(),
    )


@router.get(
    "/v1/sessions/{session_id}",
    response_model=SessionResponse,
    responses=_SESSION,
    tags=["sessions"],
)
def get_session(session_id: IdPath, tenant: TenantDep) -> SessionResponse:
    """A session's info (counts as an access)."""
    with tenant.memory() as mem:
        info = mem.get_session(session_id)
    return SessionResponse(session=_session_out(info), evicted=tenant.evicted())


@router.get(
    "/v1/sessions/{session_id}/exists",
    response_model=ExistsResponse,
    responses=_READ,
    tags=["sessions"],
)
def session_exists(session_id: IdPath, tenant: TenantDep) -> ExistsResponse:
    """Whether a live session has this id (not an access: TTL and LRU do not move)."""
    with tenant.memory() as mem:
        exists = mem.has_session(session_id)
    return ExistsResponse(exists=exists, evicted=tenant.evicted())


@router.delete(
    "/v1/sessions/{session_id}",
    response_model=DeletedResponse,
    responses=_SESSION,
    tags=["sessions"],
)
def delete_session(session_id: IdPath, tenant: TenantDep) -> DeletedResponse:
    """Delete a session and its messages (not archived); 404 if there is none."""
    with tenant.memory() as mem:
        deleted = mem.delete_session(session_id)
    if not deleted:
        raise SessionNotFoundError(f"no session {session_id!r} (unknown, deleted or expired)")
    return DeletedResponse(deleted=True, evicted=tenant.evicted())


@router.get(
    "/v1/agents/{agent_id}/latest",
    response_model=LatestSessionResponse,
    responses=_READ,
    tags=["sessions"],
)
def latest_session(agent_id: IdPath, tenant: TenantDep) -> LatestSessionResponse:
    """The agent's most recently created live session (``session_id`` null if none)."""
    with tenant.memory() as mem:
        sid = mem.get_latest_session_for_agent(agent_id)
    return LatestSessionResponse(agent_id=agent_id, session_id=sid, evicted=tenant.evicted())


@router.get("/v1/stats", response_model=StatsResponse, responses=_READ, tags=["sessions"])
def stats(tenant: TenantDep) -> StatsResponse:
    """How many sessions the tenant's store holds."""
    with tenant.memory() as mem:
        count = mem.session_count()
    return StatsResponse(sessions=count, evicted=tenant.evicted())


@router.post("/v1/sweep", response_model=SweepResponse, responses=_READ, tags=["sessions"])
def sweep(tenant: TenantDep) -> SweepResponse:
    """Reclaim the tenant's sessions idle longer than the TTL (archived first)."""
    with tenant.memory() as mem:
        swept = mem.sweep()
    return SweepResponse(swept=swept, evicted=tenant.evicted())


# -- messages -------------------------------------------------------------------------------------


@router.post(
    "/v1/sessions/{session_id}/messages",
    status_code=201,
    response_model=MessagesResponse,
    responses=_WRITE,
    tags=["messages"],
)
def append_messages(session_id: IdPath, body: AppendIn, tenant: TenantDep) -> Response:
    """Append messages atomically (all or none); returns the stored copies.

    A tool result must answer a call still waiting in the session, and no other message may
    come while calls wait; messages get an ``id`` and ``created_at`` if they have none.
    """
    messages = _messages_in(body.messages)
    with tenant.memory() as mem:
        stored = mem.add_messages(session_id, messages)
    tenant.info.appended = len(stored)
    answer = MessagesResponse.model_validate(
        {"messages": _messages_out(stored), "evicted": tenant.evicted()}
    )
    return _json(answer, 201)


@router.get(
    "/v1/sessions/{session_id}/messages",
    response_model=MessagePage,
    responses=_SESSION,
    tags=["messages"],
)
def list_messages(
    session_id: IdPath,
    tenant: TenantDep,
    last: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="Only the newest N.")] = None,
    offset: Annotated[int, Query(ge=0, le=INT64_MAX)] = 0,
    limit: Annotated[
        int | None, Query(ge=1, le=INT64_MAX, description="At most N (default: all).")
    ] = None,
) -> MessagePage:
    """The session's messages, oldest first (``last`` first narrows to the newest N, then
    ``offset`` and ``limit`` page through them).
    """
    with tenant.memory() as mem:
        messages = mem.get_messages(session_id, limit=last)
    end = len(messages) if limit is None else offset + limit
    return MessagePage.model_validate(
        {
            "messages": _messages_out(messages[offset:end]),
            "total": len(messages),
            "offset": offset,
            "next_offset": end if end < len(messages) else None,
            "evicted": tenant.evicted(),
        }
    )


@router.post(
    "/v1/sessions/{session_id}/messages/pop",
    response_model=PoppedResponse,
    responses=_SESSION,
    tags=["messages"],
)
def pop_message(session_id: IdPath, tenant: TenantDep) -> PoppedResponse:
    """Take back the newest message (null if the session holds none); not archived.

    A tool result taken back leaves its call waiting again; an assistant message taken back
    takes its calls with it.
    """
    with tenant.memory() as mem:
        popped = mem.pop_message(session_id)
    return PoppedResponse.model_validate(
        {
            "message": None if popped is None else message_to_wire(popped),
            "evicted": tenant.evicted(),
        }
    )


@router.put(
    "/v1/sessions/{session_id}/messages/newest",
    response_model=MessagesResponse,
    responses=_problems(401, 404, 409, 413, 422, 503),
    tags=["messages"],
)
def replace_newest(
    session_id: IdPath, body: ReplaceNewestIn, tenant: TenantDep
) -> MessagesResponse:
    """Atomically take back the newest message and append ``messages`` in its place, if the
    newest message is still ``newest_id`` (else 409 ``session-changed``: read again, retry).
    """
    messages = _messages_in(body.messages)
    with tenant.memory() as mem:
        stored = mem.replace_newest(session_id, messages, newest_id=body.newest_id)
    tenant.info.appended = len(stored)
    return MessagesResponse.model_validate(
        {"messages": _messages_out(stored), "evicted": tenant.evicted()}
    )


@router.get(
    "/v1/sessions/{session_id}/archived",
    response_model=MessagesResponse,
    responses=_READ,
    tags=["messages"],
)
def archived(session_id: IdPath, tenant: TenantDep) -> MessagesResponse:
    """Messages trimmed or evicted from the session and archived (they outlive it: an id
    with none, known or not, gives an empty list).
    """
    with tenant.memory() as mem:
        messages = mem.archived_messages(session_id)
    return MessagesResponse.model_validate(
        {"messages": _messages_out(messages), "evicted": tenant.evicted()}
    )


# -- prompts --------------------------------------------------------------------------------------


@router.get(
    "/v1/sessions/{session_id}/prompt",
    response_model=MessagesResponse,
    responses=_SESSION,
    tags=["prompts"],
)
def prompt_history(session_id: IdPath, tenant: TenantDep) -> MessagesResponse:
    """The session's history as a prompt, unpruned: calls still waiting for results are left
    out (what :meth:`~ctxkeep.MemoryManager.build_prompt_messages` gives without a pruner).
    """
    with tenant.memory() as mem:
        messages = mem.build_prompt_messages(session_id)
    return MessagesResponse.model_validate(
        {"messages": _messages_out(messages), "evicted": tenant.evicted()}
    )


def _json(answer: BaseModel, status_code: int) -> Response:
    """``answer``, a model the route has just validated, as the JSON response.

    A model returned by a sync route is validated again against the route's
    ``response_model`` on a worker thread of its own (FastAPI 0.165's ``serialize_response``):
    a second thread hand-off per request, on the hottest routes (appends and prompts, issue
    28). The route keeps its ``response_model`` for the OpenAPI document.
    """
    return Response(
        answer.model_dump_json(), status_code=status_code, media_type="application/json"
    )


_DECISION_FIELDS = tuple(f.name for f in fields(MessageDecision))


def report_out(built: BuiltPrompt) -> BuildReportOut:
    """A build's report as the API gives it, every pruning decision included.

    Each decision is read field by field: :func:`dataclasses.asdict` deep-copies every value,
    and at one decision per message of the history it was 9% of a loaded server's CPU
    (issue 28).
    """
    report = built.report
    summary = report.summary()
    summary["prune"]["decisions"] = [
        {name: getattr(d, name) for name in _DECISION_FIELDS} for d in report.prune.decisions
    ]
    return BuildReportOut.model_validate(summary)


@router.post(
    "/v1/sessions/{session_id}/prompt",
    response_model=PromptResponse,
    responses=_WRITE,
    tags=["prompts"],
)
def build_prompt(session_id: IdPath, body: PromptIn, tenant: TenantDep) -> Response:
    """Build the prompt for the session's next model call within a token budget.

    The history is pruned to ``max_prompt_tokens - reserve_output_tokens`` (tool calls and
    results kept whole, recent messages preferred, old tool outputs compressed first: their
    full text goes to the tenant's artifacts, and each decision's ``artifact_ref`` can be read
    back with ``GET /v1/artifacts/{ref}``); the messages come in the provider ``format``
    asked for, with the build report. When the system prompt and the newest user message
    alone do not fit, 422 ``budget-exceeded`` says by how much and what is in the way.
    """
    with tenant.stores() as stores:
        artifacts = StagedArtifacts(stores.artifacts())
        builder = budgeted_builder(
            stores.memory,
            artifacts=artifacts,
            max_prompt_tokens=body.max_prompt_tokens,
            reserve_output_tokens=body.reserve_output_tokens,
            preserve_last_n=body.preserve_last_n,
            encoding=body.encoding,
        )
        built = builder.build(session_id, system=body.system)
        artifacts.commit()
    tenant.info.report = built.report
    system: list[dict[str, Any]] | None = None
    if body.format == "anthropic":
        payload = built.to_anthropic()
        messages, system = payload.messages, payload.system
    elif body.format == "responses":
        messages = to_responses(built.messages)
    else:
        messages = built.to_openai()
    answer = PromptResponse(
        format=body.format,
        messages=messages,
        system=system,
        report=report_out(built),
        evicted=tenant.evicted(),
    )
    return _json(answer, 200)


__all__ = ["Tenant", "TenantDep", "problems", "router", "tenant_of"]

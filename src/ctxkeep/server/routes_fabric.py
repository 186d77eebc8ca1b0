"""The ``/v1/fabric`` routes: a tenant's task-shared state and inter-agent bus.

Each route authenticates and runs against its tenant's
:class:`~ctxkeep.server.fabric.TenantFabric` only (agents and tasks of another tenant are not
there):

==================================================  ==========================================
``PUT    /v1/fabric/agents/{agent_id}/task``        join a task (a new one starts from ``state``)
``GET    /v1/fabric/agents/{agent_id}/task``        the task's shared state and version
``PATCH  /v1/fabric/agents/{agent_id}/task``        compare-and-set merge (409 when stale)
``POST   /v1/fabric/agents/{agent_id}/subscriptions``  receive a topic of the agent's task
``POST   /v1/fabric/messages``                      send to a recipient or a topic
``POST   /v1/fabric/agents/{agent_id}/messages/receive``  take messages (pending until acked)
``POST   /v1/fabric/agents/{agent_id}/messages/ack``  mark messages handled
``POST   /v1/fabric/agents/{agent_id}/messages/recover``  deliver unacked ones again, first
``GET    /v1/fabric/agents/{agent_id}/dead-letters``  stored messages that could not be delivered
``DELETE /v1/fabric/agents/{agent_id}/dead-letters/{letter_id}``  remove one
==================================================  ==========================================

A message no receiver could be handed (a lone surrogate, nesting deeper than
:data:`~ctxkeep.fabric.jsondata.MAX_DEPTH`) is refused at send (422, nothing stored); one
stored that cannot be read is moved to the agent's dead letters, so the rest of its inbox
flows. An agent that has joined no task answers 404 ``unknown-agent`` (a direct message may still be
sent to it: it is delivered once it joins). Receive does not wait: poll it. Delivery is at
least once: a client that crashed calls ``recover`` and receives its unacked messages again.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ctxkeep.fabric import IPCMessage
from ctxkeep.server.fabric import TaskState
from ctxkeep.server.models import IdPath, Problem
from ctxkeep.server.models_memory import (
    AckIn,
    AckResponse,
    DeadLetterOut,
    DeadLettersResponse,
    DeletedDeadLettersResponse,
    IPCMessageOut,
    JoinIn,
    ReceivedResponse,
    ReceiveIn,
    RecoverResponse,
    SendIn,
    SentResponse,
    SubscribedResponse,
    SubscribeIn,
    TaskStateOut,
    TaskUpdateIn,
)
from ctxkeep.server.routes import TenantDep

router = APIRouter()

_TITLES = {
    401: "Missing or invalid API key",
    404: "The agent has joined no task",
    409: "The task state changed since it was read",
    413: "Request body too large",
    422: "Invalid request or value",
    503: "Storage failed",
}


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the problem responses a route can give."""
    return {s: {"model": Problem, "description": _TITLES[s]} for s in statuses}


def _task_out(agent_id: str, task: TaskState) -> TaskStateOut:
    return TaskStateOut(
        agent_id=agent_id, task_id=task.task_id, version=task.version, state=task.state
    )


def _message_out(m: IPCMessage) -> IPCMessageOut:
    return IPCMessageOut.model_validate(m.to_dict())


@router.put(
    "/v1/fabric/agents/{agent_id}/task",
    response_model=TaskStateOut,
    responses=_problems(401, 409, 413, 422, 503),
    tags=["fabric"],
)
def join_task(agent_id: IdPath, body: JoinIn, tenant: TenantDep) -> TaskStateOut:
    """Bind the agent to a task. A new task starts from ``state``; joining one that exists
    never overwrites it: ``state`` may only repeat what it holds (else 409
    ``stale-task-state``; change it with PATCH).
    """
    with tenant.stores() as stores:
        task = stores.fabric().join(agent_id, body.task_id, body.state)
    return _task_out(agent_id, task)


@router.get(
    "/v1/fabric/agents/{agent_id}/task",
    response_model=TaskStateOut,
    responses=_problems(401, 404, 422, 503),
    tags=["fabric"],
)
def read_task(agent_id: IdPath, tenant: TenantDep) -> TaskStateOut:
    """The shared state of the agent's task and its version."""
    with tenant.stores() as stores:
        task = stores.fabric().read(agent_id)
    return _task_out(agent_id, task)


@router.patch(
    "/v1/fabric/agents/{agent_id}/task",
    response_model=TaskStateOut,
    responses=_problems(401, 404, 409, 413, 422, 503),
    tags=["fabric"],
)
def update_task(agent_id: IdPath, body: TaskUpdateIn, tenant: TenantDep) -> TaskStateOut:
    """Merge ``changes`` into the task's shared state if it is still at
    ``expected_version`` (else 409 ``stale-task-state``: read again, re-apply, retry).
    """
    with tenant.stores() as stores:
        task = stores.fabric().update(agent_id, body.changes, body.expected_version)
    return _task_out(agent_id, task)


@router.post(
    "/v1/fabric/agents/{agent_id}/subscriptions",
    status_code=201,
    response_model=SubscribedResponse,
    responses=_problems(401, 404, 413, 422, 503),
    tags=["fabric"],
)
def subscribe(agent_id: IdPath, body: SubscribeIn, tenant: TenantDep) -> SubscribedResponse:
    """Deliver the topic's messages of the agent's task to it (until it changes task)."""
    with tenant.stores() as stores:
        stores.fabric().subscribe(agent_id, body.topic)
    return SubscribedResponse(agent_id=agent_id, topic=body.topic)


@router.post(
    "/v1/fabric/messages",
    status_code=201,
    response_model=SentResponse,
    responses=_problems(401, 404, 413, 422, 503),
    tags=["fabric"],
)
def send(body: SendIn, tenant: TenantDep) -> SentResponse:
    """Send ``payload`` from ``sender`` to exactly one of ``recipient`` (whatever its task)
    or ``topic`` (the subscribers of the sender's task, never the sender).
    """
    with tenant.stores() as stores:
        message = stores.fabric().send(
            body.sender, body.payload, recipient=body.recipient, topic=body.topic
        )
    return SentResponse(message=_message_out(message))


@router.post(
    "/v1/fabric/agents/{agent_id}/messages/receive",
    response_model=ReceivedResponse,
    responses=_problems(401, 404, 413, 422, 503),
    tags=["fabric"],
)
def receive(agent_id: IdPath, body: ReceiveIn, tenant: TenantDep) -> ReceivedResponse:
    """Up to ``max_messages`` for the agent, oldest first, without waiting; they stay pending
    (and ``recover`` delivers them again) until acked.
    """
    with tenant.stores() as stores:
        messages = stores.fabric().receive(agent_id, body.max_messages)
    return ReceivedResponse(messages=[_message_out(m) for m in messages])


@router.post(
    "/v1/fabric/agents/{agent_id}/messages/ack",
    response_model=AckResponse,
    responses=_problems(401, 404, 413, 422, 503),
    tags=["fabric"],
)
def ack(agent_id: IdPath, body: AckIn, tenant: TenantDep) -> AckResponse:
    """Mark received messages handled: they are not delivered again."""
    with tenant.stores() as stores:
        stores.fabric().ack(agent_id, body.ids)
    return AckResponse(acked=len(body.ids))


@router.post(
    "/v1/fabric/agents/{agent_id}/messages/recover",
    response_model=RecoverResponse,
    responses=_problems(401, 404, 422, 503),
    tags=["fabric"],
)
def recover(agent_id: IdPath, tenant: TenantDep) -> RecoverResponse:
    """After a client crash: the agent's unacked messages come first on the next receives."""
    with tenant.stores() as stores:
        pending = stores.fabric().recover(agent_id)
    return RecoverResponse(pending=pending)


@router.get(
    "/v1/fabric/agents/{agent_id}/dead-letters",
    response_model=DeadLettersResponse,
    responses=_problems(401, 404, 422, 503),
    tags=["fabric"],
)
def dead_letters(
    agent_id: IdPath,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=1000, description="The most to list.")] = 100,
) -> DeadLettersResponse:
    """The agent's stored messages that could not be delivered (moved aside from its inbox
    with the reason, so the rest flow), oldest first.
    """
    with tenant.stores() as stores:
        letters = stores.fabric().dead_letters(agent_id, limit)
    return DeadLettersResponse(dead_letters=[DeadLetterOut(**d.to_dict()) for d in letters])


@router.delete(
    "/v1/fabric/agents/{agent_id}/dead-letters/{letter_id}",
    response_model=DeletedDeadLettersResponse,
    responses=_problems(401, 404, 422, 503),
    tags=["fabric"],
)
def delete_dead_letter(
    agent_id: IdPath, letter_id: IdPath, tenant: TenantDep
) -> DeletedDeadLettersResponse:
    """Remove one dead letter (``deleted`` is 0 when there is none under that id)."""
    with tenant.stores() as stores:
        deleted = stores.fabric().delete_dead_letters(agent_id, [letter_id])
    return DeletedDeadLettersResponse(deleted=deleted)


__all__ = ["router"]

"""The ``/v1`` routes of artifacts, episodes and checkpoints.

Each route authenticates (:func:`~ctxkeep.server.deps.tenant_of`) and runs against its
tenant's stores only (:class:`~ctxkeep.server.tenants.TenantResources`), with the library's
own methods, checks and errors:

==============================================  ==================================================
``POST   /v1/artifacts``                        store a text; its content-addressed ref
``GET    /v1/artifacts/{ref}``                  the text under a ref (a prompt report's too)
``POST   /v1/episodes``                         remember an episode
``POST   /v1/episodes/search``                  hybrid search (words and meaning), filters
``GET    /v1/episodes/{episode_id}``            one episode
``DELETE /v1/episodes/{episode_id}``            forget one episode
``DELETE /v1/episodes``                         forget by ``session_id`` and/or ``agent_id``
``POST   /v1/agents/{agent_id}/checkpoints``    save a checkpoint of an agent's state
``GET    /v1/agents/{agent_id}/checkpoints``    its checkpoints, newest first (pages)
``GET    /v1/agents/{agent_id}/checkpoints/latest``  its newest (null if none)
``GET    /v1/checkpoints/{checkpoint_id}``      one checkpoint
==============================================  ==================================================

Episodes need a store that keeps them: on a ``redis://`` server their routes answer 501
``not-available``. A checkpoint's state newer than this server reads is refused with 422
``state-schema-version``; a malformed tagged value in it, 422 ``invalid-type``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query

from ctxkeep.checkpoints import Checkpoint
from ctxkeep.cognition import decode_cognitive_state, decode_value, encode_value
from ctxkeep.episodic import Episode, Hit
from ctxkeep.errors import (
    CognitiveStateSchemaVersionError,
    ConfigError,
    CorruptRecordError,
    EpisodeNotFoundError,
    InvalidTypeError,
    SchemaVersionError,
)
from ctxkeep.server.deps import Tenant, TenantDep
from ctxkeep.server.models import IdPath, Problem
from ctxkeep.server.models_memory import (
    ArtifactIn,
    ArtifactOut,
    ArtifactRefOut,
    CheckpointIn,
    CheckpointOut,
    CheckpointPage,
    CheckpointResponse,
    EpisodeIn,
    EpisodeOut,
    EpisodeResponse,
    ForgottenResponse,
    HitOut,
    LatestCheckpointResponse,
    SearchIn,
    SearchResponse,
)

T = TypeVar("T")

router = APIRouter()

_TITLES = {
    401: "Missing or invalid API key",
    404: "No such record",
    413: "Request body too large",
    422: "Invalid request or value",
    501: "Not available on this server's storage",
    503: "Storage failed",
}


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI declarations of the problem responses a route can give."""
    return {s: {"model": Problem, "description": _TITLES[s]} for s in statuses}


# -- artifacts ------------------------------------------------------------------------------------


@router.post(
    "/v1/artifacts",
    status_code=201,
    response_model=ArtifactRefOut,
    responses=_problems(401, 413, 422, 503),
    tags=["artifacts"],
)
def put_artifact(body: ArtifactIn, tenant: TenantDep) -> ArtifactRefOut:
    """Store a text (the same text is stored once) and return its ref."""
    with tenant.stores() as stores:
        ref = stores.artifacts().put(body.text)
    return ArtifactRefOut(ref=ref)


@router.get(
    "/v1/artifacts/{ref}",
    response_model=ArtifactOut,
    responses=_problems(401, 404, 422, 503),
    tags=["artifacts"],
)
def get_artifact(ref: str, tenant: TenantDep) -> ArtifactOut:
    """The exact text stored under ``ref`` (``sha256:<64 hex>``), such as the full output of
    a tool result a prompt build compressed (its decision's ``artifact_ref``).
    """
    with tenant.stores() as stores:
        text = stores.artifacts().get(ref)
    return ArtifactOut(ref=ref, text=text)


# -- episodes -------------------------------------------------------------------------------------


def _episode_out(e: Episode) -> EpisodeOut:
    return EpisodeOut(
        id=e.episode_id,
        session_id=e.session_id,
        task_goal=e.task_goal,
        summary=e.summary,
        created_at=e.created_at,
        metadata=e.metadata,
        agent_id=e.agent_id,
        task_id=e.task_id,
    )


def _hit_out(h: Hit) -> HitOut:
    return HitOut(score=h.score, lexical=h.lexical, dense=h.dense, episode=_episode_out(h.episode))


_EPISODES = _problems(401, 404, 422, 501, 503)


@router.post(
    "/v1/episodes",
    status_code=201,
    response_model=EpisodeResponse,
    responses=_problems(401, 413, 422, 501, 503),
    tags=["episodes"],
)
def save_episode(body: EpisodeIn, tenant: TenantDep) -> EpisodeResponse:
    """Remember an episode; an exact duplicate (same session, goal and summary) is stored
    once and answered with the stored one.
    """
    with tenant.stores() as stores:
        episodic = stores.episodic()
        eid = episodic.save_episode(
            body.session_id,
            body.task_goal,
            body.summary,
            metadata=body.metadata,
            agent_id=body.agent_id,
            task_id=body.task_id,
            created_at=body.created_at,
        )
        episode = episodic.get(eid)
    return EpisodeResponse(episode=_episode_out(episode))


@router.post(
    "/v1/episodes/search",
    response_model=SearchResponse,
    responses=_problems(401, 413, 422, 501, 503),
    tags=["episodes"],
)
def search_episodes(body: SearchIn, tenant: TenantDep) -> SearchResponse:
    """The ``top_k`` episodes most relevant to ``query``, best first: BM25 over the words
    and cosine similarity of the embeddings, fused. ``filters`` narrow what is searched.
    """
    return SearchResponse(hits=[_hit_out(h) for h in searched(body, tenant)])


def searched(body: SearchIn, tenant: Tenant) -> list[Hit]:
    """The ``top_k`` best episodes of the tenant for ``body``'s query and filters (the
    search of ``POST /v1/episodes/search`` and of the inspector's relevant search).
    """
    filters = None if body.filters is None else body.filters.model_dump(exclude_none=True)
    with tenant.stores() as stores:
        return stores.episodic().search(body.query, body.top_k, filters=filters)


@router.get(
    "/v1/episodes/{episode_id}",
    response_model=EpisodeResponse,
    responses=_EPISODES,
    tags=["episodes"],
)
def get_episode(episode_id: IdPath, tenant: TenantDep) -> EpisodeResponse:
    """One episode by id."""
    with tenant.stores() as stores:
        episode = stores.episodic().get(episode_id)
    return EpisodeResponse(episode=_episode_out(episode))


@router.delete(
    "/v1/episodes/{episode_id}",
    response_model=ForgottenResponse,
    responses=_EPISODES,
    tags=["episodes"],
)
def forget_episode(episode_id: IdPath, tenant: TenantDep) -> ForgottenResponse:
    """Forget one episode (from every index); 404 if there is none."""
    with tenant.stores() as stores:
        deleted = stores.episodic().forget(episode_id=episode_id)
    if not deleted:
        raise EpisodeNotFoundError(f"no episode {episode_id!r}")
    return ForgottenResponse(deleted=deleted)


@router.delete(
    "/v1/episodes",
    response_model=ForgottenResponse,
    responses=_problems(401, 422, 501, 503),
    tags=["episodes"],
)
def forget_episodes(
    tenant: TenantDep,
    session_id: Annotated[str | None, Query(min_length=1)] = None,
    agent_id: Annotated[str | None, Query(min_length=1)] = None,
) -> ForgottenResponse:
    """Forget every episode of a session and/or an agent (an episode must match each one
    given; at least one is needed); returns how many.
    """
    if session_id is None and agent_id is None:
        raise ConfigError("forget needs session_id or agent_id (or both) as query parameters")
    with tenant.stores() as stores:
        deleted = stores.episodic().forget(session_id=session_id, agent_id=agent_id)
    return ForgottenResponse(deleted=deleted)


# -- checkpoints ----------------------------------------------------------------------------------


def _checkpoint_out(cp: Checkpoint) -> CheckpointOut:
    from ctxkeep.cognition import encode_cognitive_state

    return CheckpointOut(
        checkpoint_id=cp.checkpoint_id,
        agent_id=cp.agent_id,
        task_id=cp.task_id,
        session_id=cp.session_id,
        state=encode_cognitive_state(cp.state),
        private=encode_value(cp.private, "private"),
        metadata=encode_value(cp.metadata, "metadata"),
        created_at=cp.created_at,
        seq=cp.seq,
    )


def _stored(read: Callable[[], T]) -> T:
    """``read()``, with a stored state of a newer version as the server's problem (500), not
    the caller's (a state the caller sends is 422).
    """
    try:
        return read()
    except CognitiveStateSchemaVersionError as exc:
        raise SchemaVersionError(str(exc)) from exc


def _decoded(what: str, value: Any) -> Any:
    """A caller's tagged JSON value decoded (tuples, bytes, datetimes... rebuilt).

    Raises:
        InvalidTypeError: a tagged value the encoder could not have written.

    """
    try:
        return decode_value(value)
    except CorruptRecordError as exc:
        raise InvalidTypeError(f"{what}: {exc}") from exc


_CHECKPOINTS = _problems(401, 422, 503)


@router.post(
    "/v1/agents/{agent_id}/checkpoints",
    status_code=201,
    response_model=CheckpointResponse,
    responses=_problems(401, 413, 422, 503),
    tags=["checkpoints"],
)
def save_checkpoint(agent_id: IdPath, body: CheckpointIn, tenant: TenantDep) -> CheckpointResponse:
    """Save a checkpoint of the agent's cognitive state (older state versions upgraded, newer
    ones refused with 422 ``state-schema-version``) and private layer.
    """
    try:
        state = decode_cognitive_state(body.state)
    except CorruptRecordError as exc:
        raise InvalidTypeError(f"state: {exc}") from exc
    private = _decoded("private", body.private)
    metadata = _decoded("metadata", body.metadata)
    with tenant.stores() as stores:
        checkpoints = stores.checkpoints()
        cid = checkpoints.save(
            agent_id,
            state,
            task_id=body.task_id,
            session_id=body.session_id,
            private=private,
            metadata=metadata,
        )
        cp = _stored(lambda: checkpoints.load(cid))
    return CheckpointResponse(checkpoint=_checkpoint_out(cp))


@router.get(
    "/v1/agents/{agent_id}/checkpoints",
    response_model=CheckpointPage,
    responses=_CHECKPOINTS,
    tags=["checkpoints"],
)
def checkpoint_history(
    agent_id: IdPath,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> CheckpointPage:
    """The agent's checkpoints, newest first, one page at a time."""
    with tenant.stores() as stores:
        checkpoints = stores.checkpoints()
        found = _stored(lambda: checkpoints.history(agent_id, limit=offset + limit + 1))
    page = found[offset : offset + limit]
    return CheckpointPage(
        checkpoints=[_checkpoint_out(cp) for cp in page],
        limit=limit,
        offset=offset,
        next_offset=offset + limit if len(found) > offset + limit else None,
    )


@router.get(
    "/v1/agents/{agent_id}/checkpoints/latest",
    response_model=LatestCheckpointResponse,
    responses=_CHECKPOINTS,
    tags=["checkpoints"],
)
def latest_checkpoint(agent_id: IdPath, tenant: TenantDep) -> LatestCheckpointResponse:
    """The agent's newest checkpoint (``checkpoint`` null if it has none)."""
    with tenant.stores() as stores:
        checkpoints = stores.checkpoints()
        cp = _stored(lambda: checkpoints.latest(agent_id))
    return LatestCheckpointResponse(
        agent_id=agent_id, checkpoint=None if cp is None else _checkpoint_out(cp)
    )


@router.get(
    "/v1/checkpoints/{checkpoint_id}",
    response_model=CheckpointResponse,
    responses=_problems(401, 404, 422, 503),
    tags=["checkpoints"],
)
def load_checkpoint(checkpoint_id: IdPath, tenant: TenantDep) -> CheckpointResponse:
    """One checkpoint by id."""
    with tenant.stores() as stores:
        checkpoints = stores.checkpoints()
        cp = _stored(lambda: checkpoints.load(checkpoint_id))
    return CheckpointResponse(checkpoint=_checkpoint_out(cp))


__all__ = ["router"]

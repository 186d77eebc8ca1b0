"""Request and response bodies of the artifact, episode, checkpoint and fabric routes.

None of these routes touches a session, so their responses carry no ``evicted`` member.
Values a caller stores (metadata, a checkpoint's state and private layer, task state, bus
payloads) are JSON. A checkpoint's state is a :class:`~ctxkeep.CognitiveState` in the form
:func:`~ctxkeep.encode_cognitive_state` gives (tuples, sets, bytes, datetimes tagged so they
come back exactly); its private layer and metadata use the same tags.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ctxkeep._check import INT64_MAX
from ctxkeep.server.models import MAX_ID_LENGTH


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- artifacts -------------------------------------------------------------------------------


class ArtifactIn(_Strict):
    """A text to store."""

    text: str = Field(description="The full text (a tool output, a document).")


class ArtifactRefOut(BaseModel):
    """Where a text is stored."""

    ref: str = Field(description="sha256:<64 hex> of the UTF-8 text.")


class ArtifactOut(BaseModel):
    """A stored text."""

    ref: str
    text: str


# -- episodes --------------------------------------------------------------------------------


class EpisodeIn(_Strict):
    """An episode to remember (an exact duplicate of one stored is stored once)."""

    session_id: str = Field(
        min_length=1, max_length=MAX_ID_LENGTH, description="The session it came from."
    )
    task_goal: str = Field(description="What the run was trying to do.")
    summary: str = Field(description="What happened: the text recalled.")
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="JSON values; searches filter on them by equality."
    )
    agent_id: str | None = Field(
        None, min_length=1, max_length=MAX_ID_LENGTH, description="The agent that lived it."
    )
    task_id: str | None = Field(
        None, min_length=1, max_length=MAX_ID_LENGTH, description="The task it belonged to."
    )
    created_at: float | None = Field(
        None, allow_inf_nan=False, description="Unix time (default: now)."
    )


class EpisodeOut(BaseModel):
    """A stored episode."""

    id: str
    session_id: str
    task_goal: str
    summary: str
    created_at: float = Field(description="Unix time.")
    metadata: dict[str, Any]
    agent_id: str | None
    task_id: str | None


class EpisodeResponse(BaseModel):
    """One episode."""

    episode: EpisodeOut


class EpisodeFilterIn(_Strict):
    """Which episodes to search; every member left out does not filter."""

    episode_id: str | list[str] | None = Field(None, description="An id or a list of ids.")
    session_id: str | list[str] | None = Field(None, description="A session or a list.")
    agent_id: str | list[str] | None = Field(None, description="An agent or a list.")
    task_id: str | list[str] | None = Field(None, description="A task or a list.")
    since: float | None = Field(None, allow_inf_nan=False, description="Unix time, inclusive.")
    until: float | None = Field(None, allow_inf_nan=False, description="Unix time, inclusive.")
    metadata: dict[str, Any] | None = Field(
        None, description="Keys whose values must be JSON-equal (no containment)."
    )


class SearchIn(_Strict):
    """A hybrid (words and meaning) search of the tenant's episodes."""

    query: str = Field(description="What to recall.")
    top_k: int = Field(5, ge=1, le=100, description="How many hits at most.")
    filters: EpisodeFilterIn | None = None


class HitOut(BaseModel):
    """A search result."""

    score: float = Field(description="The fused score (z-scores of the two below, summed).")
    lexical: float = Field(description="BM25 of the episode's window document.")
    dense: float = Field(description="Cosine similarity of the embeddings, smoothed.")
    episode: EpisodeOut


class SearchResponse(BaseModel):
    """Hits, best first."""

    hits: list[HitOut]


class ForgottenResponse(BaseModel):
    """The outcome of a forget."""

    deleted: int = Field(description="Episodes deleted.")


# -- checkpoints -----------------------------------------------------------------------------


class CheckpointIn(_Strict):
    """An agent's state to save."""

    state: dict[str, Any] | None = Field(
        None,
        description=(
            "A CognitiveState as encode_cognitive_state gives it (schema_version, context, "
            "observation, working_memory, decision, tool_state, checkpoint); older versions "
            "are upgraded, newer ones refused (422). Null: an empty state."
        ),
    )
    task_id: str | None = Field(
        None, min_length=1, max_length=MAX_ID_LENGTH, description="The agent's task."
    )
    session_id: str | None = Field(
        None, min_length=1, max_length=MAX_ID_LENGTH, description="The agent's session."
    )
    private: dict[str, Any] = Field(
        default_factory=dict, description="The agent's own private layer."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Caller data.")


class CheckpointOut(BaseModel):
    """A saved checkpoint."""

    checkpoint_id: str
    agent_id: str
    task_id: str | None
    session_id: str | None
    state: dict[str, Any] = Field(description="The CognitiveState, encoded.")
    private: dict[str, Any]
    metadata: dict[str, Any]
    created_at: float = Field(description="Unix time of saving.")
    seq: int = Field(description="Order among the agent's checkpoints (1, 2, ...).")


class CheckpointResponse(BaseModel):
    """One checkpoint."""

    checkpoint: CheckpointOut


class LatestCheckpointResponse(BaseModel):
    """An agent's newest checkpoint, or null if it has none."""

    agent_id: str
    checkpoint: CheckpointOut | None


class CheckpointPage(BaseModel):
    """One page of an agent's checkpoints, newest first."""

    checkpoints: list[CheckpointOut]
    limit: int
    offset: int
    next_offset: int | None = Field(description="The offset of the next page; null: last page.")


# -- the fabric ------------------------------------------------------------------------------


class JoinIn(_Strict):
    """The task an agent joins."""

    task_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH)
    state: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "A new task's initial shared state; for a task that exists, only what it already "
            "holds (else 409 stale-task-state: change it with PATCH)."
        ),
    )


class TaskStateOut(BaseModel):
    """The shared state of an agent's task."""

    agent_id: str
    task_id: str
    version: int = Field(description="Bumped by every write (0: never written).")
    state: dict[str, Any]


class TaskUpdateIn(_Strict):
    """A compare-and-set change of the task's shared state."""

    changes: dict[str, Any] = Field(description="Keys to set (merged into the state).")
    expected_version: int = Field(
        ge=0, le=INT64_MAX, description="The version the change is based on."
    )


class SubscribeIn(_Strict):
    """A topic of the agent's task to receive."""

    topic: str = Field(min_length=1, max_length=MAX_ID_LENGTH)


class SubscribedResponse(BaseModel):
    """The agent now receives the topic's messages."""

    agent_id: str
    topic: str


class SendIn(_Strict):
    """A message from an agent: to one ``recipient``, or to a ``topic`` of its task."""

    sender: str = Field(
        min_length=1,
        max_length=MAX_ID_LENGTH,
        description="The sending agent (it must have joined).",
    )
    recipient: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH)
    topic: str | None = Field(None, min_length=1, max_length=MAX_ID_LENGTH)
    payload: Any = Field(description="JSON data.")


class IPCMessageOut(BaseModel):
    """A message on the bus."""

    id: str
    sender: str
    recipient: str | None
    topic: str | None
    task_id: str | None
    payload: Any
    created_at: float


class SentResponse(BaseModel):
    """The message sent."""

    message: IPCMessageOut


class ReceiveIn(_Strict):
    """How many messages to take (they stay pending until acked)."""

    max_messages: int = Field(100, ge=1, le=1000)


class ReceivedResponse(BaseModel):
    """Messages for the agent, oldest first."""

    messages: list[IPCMessageOut]


class AckIn(_Strict):
    """Messages handled."""

    ids: list[str] = Field(max_length=1000, description="Ids of messages received.")


class AckResponse(BaseModel):
    """The outcome of an ack."""

    acked: int = Field(description="Ids acknowledged (ids not pending are ignored).")


class DeadLetterOut(BaseModel):
    """A stored message that could not be delivered, moved aside from the agent's inbox."""

    id: str = Field(description="Its id among the agent's dead letters (to delete it).")
    reason: str = Field(description="Why it could not be delivered.")
    record: dict[str, str] = Field(description="The stored record as it was found.")


class DeadLettersResponse(BaseModel):
    """The agent's dead letters, oldest first."""

    dead_letters: list[DeadLetterOut]


class DeletedDeadLettersResponse(BaseModel):
    """The outcome of deleting dead letters."""

    deleted: int = Field(description="Dead letters removed (unknown ids are ignored).")


class RecoverResponse(BaseModel):
    """The outcome of a recover."""

    pending: int = Field(description="Unacked messages the next receives deliver again first.")

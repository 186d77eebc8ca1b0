"""The service's request and response bodies, as pydantic models (they make the OpenAPI
document).

Messages travel in the wire form of :mod:`ctxkeep.server.wire`. Every ``/v1`` response of the
session, message and prompt routes is an object whose ``evicted`` member lists the messages
the request trimmed or evicted from sessions (``max_history``, TTL, LRU): they are in the
session's archive too, when the server archives.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import MISSING, fields
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from ctxkeep._check import INT64_MAX
from ctxkeep._check import MAX_ID_LENGTH as MAX_ID_LENGTH  # the service's bound is the stores'
from ctxkeep.builder.core import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_RESERVE_OUTPUT_TOKENS
from ctxkeep.messages import Message

Content = str | list[dict[str, Any]] | None


IdPath = Annotated[str, Path(max_length=MAX_ID_LENGTH, description="An id.")]
"""A route's id path parameter, bounded by :data:`MAX_ID_LENGTH`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- messages --------------------------------------------------------------------------------


class FunctionIn(_Strict):
    """OpenAI's ``function`` member of a tool call."""

    name: str
    arguments: str


class ToolCallIn(BaseModel):
    """A tool call: ctxkeep's form (``name``, ``arguments``) or OpenAI's (``function``)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="The id the tool result answers.")
    name: str | None = Field(None, description="The function's name (ctxkeep's form).")
    arguments: str | None = Field(None, description="The arguments as JSON text.")
    type: Literal["function"] | None = Field(None, description="OpenAI's form: 'function'.")
    function: FunctionIn | None = Field(None, description="OpenAI's form: name and arguments.")

    @model_validator(mode="after")
    def _one_form(self) -> ToolCallIn:
        flat = self.name is not None and self.arguments is not None
        if flat == (self.function is not None):
            raise ValueError(
                "a tool call needs either 'name' and 'arguments' or OpenAI's 'function' object"
            )
        return self


class ToolCallOut(BaseModel):
    """A tool call as stored."""

    id: str
    name: str
    arguments: str


# A message's members derive from the fields of ctxkeep.Message, by each field's declared type:
# a new field appears in both models below (a field of a type not in this table stops the import).
_MEMBER_TYPES: dict[str, tuple[Any, Any]] = {
    # declared type: (in a request, in a response)
    "str": (str, str),
    "str | None": (str | None, str | None),
    "Content": (Content, Content),
    "tuple[ToolCall, ...]": (list[ToolCallIn] | None, list[ToolCallOut]),
    "tuple[str, ...]": (list[str] | None, list[str]),
    "Mapping[str, Any]": (dict[str, Any] | None, dict[str, Any]),
    "datetime | None": (datetime | None, datetime | None),
}
_MEMBER_DESCRIPTIONS = {
    "role": "system, developer, user, assistant or tool.",
    "content": "Text, content parts, or null.",
    "tool_call_id": "For a tool message: the call answered.",
    "tool_calls": "For an assistant message.",
    "id": "A stable id; the server assigns one if absent.",
    "metadata": "Stored, never sent to a model.",
    "extra": "Provider keys passed through.",
    "created_at": "Stamped by the server if absent.",
}


def _message_members(*, request: bool) -> dict[str, Any]:
    """The members of a message in a request (only fields without a default are required) or
    in a response (all required), one per field of :class:`~ctxkeep.Message`, in order.
    """
    members: dict[str, Any] = {}
    for f in fields(Message):
        if f.type not in _MEMBER_TYPES:
            raise TypeError(
                f"Message.{f.name} is declared {f.type!r}, a type with no wire form here; add "
                "it to _MEMBER_TYPES in ctxkeep/server/models.py"
            )
        wire_type = _MEMBER_TYPES[str(f.type)][0 if request else 1]
        if not request:
            members[f.name] = wire_type
            continue
        required = f.default is MISSING and f.default_factory is MISSING
        info = Field(... if required else None, description=_MEMBER_DESCRIPTIONS.get(f.name))
        members[f.name] = Annotated[wire_type, info]
    return members


class MessageIn(BaseModel):
    """A message to append: ctxkeep's fields, or an OpenAI chat message (other keys go to
    ``extra``).
    """

    model_config = ConfigDict(extra="allow")
    # The members, as if annotated one by one here: pydantic reads the class's annotations.
    __annotations__ = _message_members(request=True)


class MessageOut(BaseModel):
    """A stored message, every field."""

    __annotations__ = _message_members(request=False)  # as in MessageIn


class EvictedOut(BaseModel):
    """Messages that left a session during the request."""

    session_id: str
    agent_id: str
    reason: Literal["max_history", "ttl", "lru", "deleted"]
    messages: list[MessageOut]


class _Response(BaseModel):
    evicted: list[EvictedOut] = Field(
        default_factory=list,
        description="Messages this request trimmed or evicted from sessions.",
    )


# -- sessions --------------------------------------------------------------------------------


class CreateSessionIn(_Strict):
    """A session to start."""

    agent_id: str = Field(
        min_length=1, max_length=MAX_ID_LENGTH, description="The agent that owns the session."
    )
    task_id: str | None = Field(
        None, max_length=MAX_ID_LENGTH, description="The task it belongs to."
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="JSON values.")
    session_id: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_ID_LENGTH,
        pattern=r"^[^/]+$",
        description="The id to use (no '/': it is a path segment); the server makes one if absent.",
    )


class SessionOut(BaseModel):
    """What the store knows about a session besides its messages."""

    session_id: str
    agent_id: str
    task_id: str | None
    metadata: dict[str, Any]
    created_at: float = Field(description="Unix time of creation.")
    accessed_at: float = Field(description="Unix time of the last read or write.")
    message_count: int
    next_seq: int
    pending: list[str] = Field(description="Tool call ids still waiting for results.")
    generation: str = Field(description="Changes when a session is created again under an id.")
    first_seq: int
    revision: int = Field(description="How many times messages were taken back.")


class SessionResponse(_Response):
    """One session."""

    session: SessionOut


class SessionPage(_Response):
    """One page of sessions, newest first."""

    sessions: list[SessionOut]
    limit: int
    offset: int
    next_offset: int | None = Field(description="The offset of the next page; null: last page.")


class ExistsResponse(_Response):
    """Whether a live session has the id (not an access)."""

    exists: bool


class DeletedResponse(_Response):
    """The outcome of a delete."""

    deleted: bool


class LatestSessionResponse(_Response):
    """An agent's most recently created live session."""

    agent_id: str
    session_id: str | None


class StatsResponse(_Response):
    """The tenant's store."""

    sessions: int = Field(description="Sessions stored (idle ones not yet reclaimed included).")


class SweepResponse(_Response):
    """The outcome of a sweep."""

    swept: int = Field(description="Sessions reclaimed as idle longer than the TTL.")


# -- messages --------------------------------------------------------------------------------


DEFAULT_MAX_APPEND_MESSAGES = 1000
"""Messages one request may write (``ctxkeep serve --max-append-messages``). The body limit
alone let one 3.3 MB append of 10,000 messages take 4.6-14.6 s and move another tenant's median
request from 12 to 59 ms (issue 25): a request's work grows with its messages, so their count
is bounded too. A long history is appended in batches (each all or none)."""

APPEND_LIMIT: ContextVar[int] = ContextVar(
    "ctxkeep_append_limit", default=DEFAULT_MAX_APPEND_MESSAGES
)
"""The limit of the app serving the current request. The models are shared by every app in the
process, so each app's middleware sets its own limit here for the request it passes on
(:class:`ctxkeep.server.app.RequestLimits`)."""


def _within_append_limit(value: Any) -> Any:
    """``value``, unless it is a list longer than :data:`APPEND_LIMIT`: checked before any
    message in it is validated, so an oversized batch costs its count only.
    """
    limit = APPEND_LIMIT.get()
    if isinstance(value, list) and len(value) > limit:
        raise PydanticCustomError(
            "too_many_messages",
            "{count} messages in one request; this server takes at most {limit} "
            "(ctxkeep serve --max-append-messages): send them in batches of {limit} or fewer",
            {"count": len(value), "limit": limit},
        )
    return value


MessageBatch = Annotated[
    list[MessageIn],
    BeforeValidator(_within_append_limit),
    Field(
        description="At most the server's limit per request (ctxkeep serve "
        f"--max-append-messages, default {DEFAULT_MAX_APPEND_MESSAGES}); more answer 422 "
        "and nothing is stored."
    ),
]
"""The messages a request writes, bounded in count."""


class AppendIn(_Strict):
    """Messages to append, all or none."""

    messages: MessageBatch


class ReplaceNewestIn(_Strict):
    """Messages that take the newest message's place, atomically."""

    newest_id: str = Field(min_length=1, description="The id the caller read as the newest.")
    messages: MessageBatch = Field(default_factory=list)


class MessagesResponse(_Response):
    """Messages, oldest first."""

    messages: list[MessageOut]


class MessagePage(_Response):
    """One page of a session's messages, oldest first."""

    messages: list[MessageOut]
    total: int = Field(description="Messages the session holds.")
    offset: int
    next_offset: int | None = Field(description="The offset of the next page; null: last page.")


class PoppedResponse(_Response):
    """The message taken back, or null if the session held none."""

    message: MessageOut | None


# -- prompts ---------------------------------------------------------------------------------


class PromptIn(_Strict):
    """How to build a prompt from a session."""

    max_prompt_tokens: int = Field(
        DEFAULT_MAX_PROMPT_TOKENS, ge=2, le=INT64_MAX, description="The model's context window."
    )
    reserve_output_tokens: int = Field(
        DEFAULT_RESERVE_OUTPUT_TOKENS,
        ge=0,
        le=INT64_MAX,
        description="Tokens kept free for the reply.",
    )
    preserve_last_n: int = Field(
        6, ge=0, le=INT64_MAX, description="Recent messages the pruner prefers."
    )
    system: str | None = Field(None, description="The system prompt, first.")
    format: Literal["openai", "anthropic", "responses"] = Field(
        "openai", description="The provider format of the messages returned."
    )
    encoding: str | None = Field(
        None, description="Token encoding or model name (default: o200k_base)."
    )


class DecisionOut(BaseModel):
    """What the pruner did with one input message."""

    index: int
    role: str
    action: Literal["kept", "compressed", "dropped", "summarised"]
    reason: str
    tokens_before: int
    tokens_after: int
    artifact_ref: str | None


class PruneReportOut(BaseModel):
    """The pruner's totals and decisions."""

    budget: int
    tokens_before: int
    tokens_after: int
    sections: dict[str, int]
    kept: int
    compressed: int
    dropped: int
    summarised: int
    summary_error: str | None
    notes: list[str]
    stable_prefix_messages: int | None
    stable_prefix_tokens: int | None
    unread: int = Field(
        0,
        description=(
            "Older messages the build did not read (dropped at an earlier cut: the session's "
            "fold snapshot, or the newest pages, stood for them); counted in `dropped`, not in "
            "`decisions` or `tokens_before`."
        ),
    )
    decisions: list[DecisionOut]


class BuildReportOut(BaseModel):
    """What went into the prompt, section by section."""

    session_id: str
    agent_id: str
    max_prompt_tokens: int
    reserve_output_tokens: int
    prompt_tokens: int
    sections: dict[str, int]
    budgets: dict[str, int]
    notes: list[str]
    prune: PruneReportOut


class PromptResponse(_Response):
    """A built prompt in the format asked for, and its report."""

    format: Literal["openai", "anthropic", "responses"]
    messages: list[dict[str, Any]] = Field(
        description="OpenAI chat messages, Anthropic MessageParams or Responses input items."
    )
    system: list[dict[str, Any]] | None = Field(
        description="Anthropic only: the system text blocks (null in the other formats)."
    )
    report: BuildReportOut


# -- other -----------------------------------------------------------------------------------


class Health(BaseModel):
    """The server answers."""

    status: Literal["ok"]


class Problem(BaseModel):
    """RFC 9457 problem details; extension members carry the error's attributes."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="A urn:ctxkeep:problem:<slug> URI naming the kind of problem.")
    title: str
    status: int
    detail: str

"""The web inspector at ``/``, and the two ``/v1/inspect`` routes it needs beyond the API.

The inspector is a small static front end in ``server/static/`` (one page, one script, one
style sheet: vanilla JavaScript and inline SVG). Nothing loads from anywhere but this server,
and a Content-Security-Policy of ``'self'`` holds the page to that. It asks for an API key
(kept in the tab's ``sessionStorage``) and reads the ``/v1`` JSON API with it, so it sees one
tenant's data exactly as any other client would:

* the sessions (``GET /v1/sessions``), and a session's messages as a timeline of turns, each
  assistant message's tool calls grouped with their results;
* for any model call of the session, the prompt's composition: a stacked bar of its tokens by
  section (system, fabric view, prior context, history, tool outputs, summary, reply priming,
  and the reserve for the reply) and the pruner's decision on every message, a compressed
  output expandable to its full text from its artifact (``GET /v1/artifacts/{ref}``);
* the tokens of every step of the session: the history as stored, the prompt built from it;
* a search box over the tenant's episodic memory, showing the episodes ``ctxkeep memory
  search`` shows (the relevant ones: ``POST /v1/inspect/episodes/search``).

The routes here give what the rest of the API does not:

================================================  ============================================
``GET /v1/inspect/tenant``                        the key's tenant (the page's header names it)
``GET /v1/inspect/sessions/{id}/window``          the window the session's prompts were built
                                                  with, and where that was found
``GET /v1/inspect/sessions/{id}/composition``     the prompt built before message ``at``, with
                                                  the build report, every message's fate, its
                                                  notes once each and, for a cache-stable
                                                  prompt that left history out, why
``GET /v1/inspect/sessions/{id}/steps``           tokens per message; per model call, the
                                                  history's tokens and the built prompt's
``POST /v1/inspect/episodes/search``              the episodes relevant to a query, by the
                                                  rule ``ctxkeep memory search`` applies
``GET /``, ``GET /inspector/{file}``              the page and its script and style sheet
================================================  ============================================

"The prompt at step N" is computed, not remembered: the session's first ``at`` messages are
copied into a scratch in-memory store and :class:`~ctxkeep.ContextBuilder` builds from them with
the settings ``POST /v1/sessions/{id}/prompt`` uses
(:func:`~ctxkeep.builder.budgeted.budgeted_builder`). A build is a function of the history it
reads and of those settings (the cache-stable pruner's cuts too), so this is the prompt that
call got, had it been built with the settings asked for. With ``at`` left out the whole session
is built, and the report equals that route's. The compressed outputs of a composition are
written to the tenant's artifact store, where the artifact route finds them; the steps chart's
many builds keep theirs in a throwaway store. The words the page shows about a prompt (its
window, why a cache-stable prompt left history out, its notes) come from
:mod:`ctxkeep.server.inspector_explain`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

from ctxkeep.artifacts import ArtifactStore, MemoryArtifactStore
from ctxkeep.artifacts.staged import StagedArtifacts
from ctxkeep.builder import BuiltPrompt, ContextBuilder
from ctxkeep.builder.budgeted import budgeted_builder
from ctxkeep.builder.core import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_RESERVE_OUTPUT_TOKENS
from ctxkeep.errors import BudgetExceededError, ConfigError, PromptTooLongError
from ctxkeep.messages import Message
from ctxkeep.server import routes
from ctxkeep.server.deps import TenantDep
from ctxkeep.server.inspector_explain import (
    WindowSource,
    cache_explanation,
    distinct_notes,
    session_window,
)
from ctxkeep.server.models import BuildReportOut, EvictedOut, IdPath, Problem
from ctxkeep.server.models_memory import HitOut, SearchIn
from ctxkeep.server.routes_memory import _hit_out, _problems, searched
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.records import SessionInfo

MAX_TOKENS_PARAM = 10_000_000
"""The largest window or reserve the inspect routes take (no model has more)."""
DEFAULT_STEPS = 200
"""Model calls the steps route builds by default (the newest); at most :data:`MAX_STEPS`."""
MAX_STEPS = 1000
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
"""Every inspector response's policy: scripts, styles and requests from this server only."""

_SCRATCH = MemoryConfig(
    max_history=None, session_ttl=None, max_sessions=None, archive_evicted=False
)
_STATIC = {
    "index.html": "text/html; charset=utf-8",
    "inspector.js": "text/javascript; charset=utf-8",
    "inspector.css": "text/css; charset=utf-8",
}

router = APIRouter()


# -- the models ---------------------------------------------------------------------------------


class _Response(BaseModel):
    evicted: list[EvictedOut] = Field(
        default_factory=list,
        description="Messages this request trimmed or evicted from sessions.",
    )


class InspectDecisionOut(BaseModel):
    """What the pruner did with one message of the history, tied to the stored message."""

    index: int = Field(description="Position in the session's messages (and the prune input).")
    message_id: str | None = Field(description="The stored message's id.")
    role: str
    action: str = Field(description="kept, compressed, dropped or summarised.")
    reason: str
    tokens_before: int = Field(description="The message's tokens as stored.")
    tokens_after: int = Field(description="Its tokens in the prompt (0: dropped).")
    artifact_ref: str | None = Field(description="Compressed: where the full text is.")
    excerpt: str | None = Field(description="Compressed: the text the prompt carries instead.")


class NoteOut(BaseModel):
    """A note of the build or the pruner, given once."""

    text: str
    count: int = Field(description="How many times the build gave it (one per output, say).")


class CompositionResponse(_Response):
    """The prompt built before message ``at`` of a session, and how."""

    session_id: str
    at: int = Field(description="Messages of the session the prompt was built from.")
    total: int = Field(description="Messages the session holds.")
    report: BuildReportOut = Field(description="As POST /v1/sessions/{id}/prompt reports it.")
    decisions: list[InspectDecisionOut]
    notes: list[NoteOut] = Field(
        description="The report's and the pruner's notes, each once, in the order given."
    )
    explanation: list[str] = Field(
        description=(
            "A cache-stable prompt that left out or compressed history: why, and what it "
            "saves, in plain words (a paragraph each); empty otherwise."
        )
    )


class WindowResponse(BaseModel):
    """The window a session's prompts were built with."""

    session_id: str
    max_prompt_tokens: int = Field(description="The model's window.")
    reserve_output_tokens: int = Field(description="The part of it kept for the reply.")
    source: WindowSource = Field(
        description=(
            "recorded: a reply's metadata names it (max_prompt_tokens, reserve_output_tokens); "
            "model: the window of the model a reply's metadata names; default: nothing in the "
            "session says, the defaults of POST /v1/sessions/{id}/prompt."
        )
    )
    model: str | None = Field(description="The model a reply names, if any.")
    message_index: int | None = Field(description="The reply the window was read from.")
    explanation: str = Field(description="Where the figures come from, in a sentence.")


class TenantResponse(BaseModel):
    """Whose data the key opens."""

    tenant: str
    sessions: int = Field(description="Sessions stored (idle ones not yet reclaimed included).")


class RelevantHitsResponse(BaseModel):
    """The relevant hits of a search, best first, and how many others it left out."""

    hits: list[HitOut]
    not_relevant: int = Field(
        description="Hits in the top_k left out as not relevant (no query word matched, or a "
        "fused score below the average searched episode's)."
    )


class MessageTokensOut(BaseModel):
    """One stored message's tokens."""

    index: int
    message_id: str | None
    role: str
    turn: int = Field(description="User messages up to and including this one.")
    tokens: int = Field(description="Its tokens, per-message overhead included.")


class StepOut(BaseModel):
    """One model call of the session: the prompt built from the messages before it."""

    step: int = Field(description="The call's number in the session, from 0.")
    at: int = Field(description="Messages before the call (the last step: the next call).")
    turn: int = Field(description="The turn the call belongs to (user messages so far).")
    history_tokens: int = Field(description="The history's tokens as a prompt, unpruned.")
    prompt_tokens: int | None = Field(description="The built prompt's (null: none fits).")
    sections: dict[str, int] = Field(description="The built prompt's tokens per section.")
    kept: int
    compressed: int
    dropped: int
    error: str | None = Field(description="Why no prompt could be built at this step.")


class StepsResponse(_Response):
    """A session's tokens, message by message and model call by model call."""

    session_id: str
    max_prompt_tokens: int
    reserve_output_tokens: int
    prompt_budget: int = Field(description="max_prompt_tokens - reserve_output_tokens.")
    total: int = Field(description="Messages the session holds.")
    first_step: int = Field(description="Older steps left out (beyond ``limit``).")
    messages: list[MessageTokensOut]
    steps: list[StepOut]


_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": title}
    for status, title in (
        (401, "Missing or invalid API key"),
        (404, "No such session"),
        (422, "Invalid request or parameter, or a prompt that cannot fit"),
        (503, "Storage failed"),
    )
}


# -- building -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildParams:
    """How prompts are built, as ``POST /v1/sessions/{id}/prompt`` takes it."""

    max_prompt_tokens: int
    reserve_output_tokens: int
    preserve_last_n: int
    encoding: str | None


def build_params(
    max_prompt_tokens: Annotated[
        int, Query(ge=2, le=MAX_TOKENS_PARAM, description="The model's context window.")
    ] = DEFAULT_MAX_PROMPT_TOKENS,
    reserve_output_tokens: Annotated[
        int, Query(ge=0, le=MAX_TOKENS_PARAM, description="Tokens kept free for the reply.")
    ] = DEFAULT_RESERVE_OUTPUT_TOKENS,
    preserve_last_n: Annotated[
        int, Query(ge=0, le=100_000, description="Recent messages the pruner prefers.")
    ] = 6,
    encoding: Annotated[
        str | None,
        Query(min_length=1, max_length=200, description="Token encoding or model name."),
    ] = None,
) -> BuildParams:
    """The build settings of a request's query."""
    return BuildParams(max_prompt_tokens, reserve_output_tokens, preserve_last_n, encoding)


ParamsDep = Annotated[BuildParams, Depends(build_params)]


def prompt_builder(
    memory: MemoryManager, params: BuildParams, artifacts: ArtifactStore
) -> ContextBuilder:
    """The builder ``POST /v1/sessions/{id}/prompt`` builds with, over ``memory``
    (:func:`~ctxkeep.builder.budgeted.budgeted_builder` with ``params``).

    Raises:
        UnknownEncodingError: an unknown encoding.
        ConfigError: a reserve that leaves the prompt no room.

    """
    return budgeted_builder(
        memory,
        artifacts=artifacts,
        max_prompt_tokens=params.max_prompt_tokens,
        reserve_output_tokens=params.reserve_output_tokens,
        preserve_last_n=params.preserve_last_n,
        encoding=params.encoding,
    )


@contextmanager
def scratch_session(info: SessionInfo) -> Iterator[MemoryManager]:
    """A scratch in-memory store holding an empty session with ``info``'s ids."""
    with open_memory("memory://", _SCRATCH) as mem:
        mem.create_session(
            info.agent_id, task_id=info.task_id, metadata=info.metadata, session_id=info.session_id
        )
        yield mem


def _read(mem: MemoryManager, session_id: str) -> tuple[SessionInfo, list[Message]]:
    return mem.get_session(session_id), mem.get_messages(session_id)


def _turns(messages: list[Message]) -> list[int]:
    """Each message's turn: the user messages up to and including it."""
    turns, n = [], 0
    for m in messages:
        n += m.role == "user"
        turns.append(n)
    return turns


def _decisions(built: BuiltPrompt, messages: list[Message]) -> list[InspectDecisionOut]:
    """The pruner's decisions tied to the stored messages (the prune input is the history
    itself: the routes give no system prompt), a compressed one with the excerpt it became.
    """
    excerpts = {ref: m.text for m in built.messages for ref in m.artifact_refs}
    return [
        InspectDecisionOut(
            index=d.index,
            message_id=messages[d.index].id,
            role=d.role,
            action=d.action,
            reason=d.reason,
            tokens_before=d.tokens_before,
            tokens_after=d.tokens_after,
            artifact_ref=d.artifact_ref,
            excerpt=excerpts.get(d.artifact_ref) if d.artifact_ref else None,
        )
        for d in built.report.prune.decisions
    ]


# -- the routes ---------------------------------------------------------------------------------


@router.get(
    "/v1/inspect/sessions/{session_id}/composition",
    response_model=CompositionResponse,
    responses=_RESPONSES,
    tags=["inspect"],
)
def composition(
    session_id: IdPath,
    tenant: TenantDep,
    params: ParamsDep,
    at: Annotated[
        int | None,
        Query(ge=0, description="Build from the first `at` messages (default: all of them)."),
    ] = None,
) -> CompositionResponse:
    """The prompt the session's model call before message ``at`` is built with: its report
    (as ``POST /v1/sessions/{id}/prompt`` gives it) and every message's fate, a compressed
    output's full text stored in the tenant's artifact store. A call still waiting for its
    results at ``at`` is left out, as in any build.
    """
    with tenant.stores() as stores:
        info, messages = _read(stores.memory, session_id)
        total = len(messages)
        if at is None:
            at = total
        elif at > total:
            raise ConfigError(f"at is {at} but session {session_id!r} holds {total} messages")
        with scratch_session(info) as mem:
            if at:
                mem.add_messages(session_id, messages[:at])
            artifacts = StagedArtifacts(stores.artifacts())
            builder = prompt_builder(mem, params, artifacts)
            built = builder.build(session_id)
            artifacts.commit()  # only a composition built: a refused one stores nothing
    report = built.report
    return CompositionResponse(
        session_id=session_id,
        at=at,
        total=total,
        report=routes.report_out(built),
        decisions=_decisions(built, messages),
        notes=[
            NoteOut(text=text, count=n)
            for text, n in distinct_notes([*report.notes, *report.prune.notes])
        ],
        explanation=cache_explanation(report, builder.pruner.config.low_water),
        evicted=tenant.evicted(),
    )


@router.get(
    "/v1/inspect/sessions/{session_id}/window",
    response_model=WindowResponse,
    responses=_RESPONSES,
    tags=["inspect"],
)
def window(session_id: IdPath, tenant: TenantDep) -> WindowResponse:
    """The window (and reply reserve) the session's prompts were built with, from what the
    session records: a reply whose metadata names its prompt's ``max_prompt_tokens`` (and
    ``reserve_output_tokens``), else the window of the ``model`` a reply names (as
    :class:`~ctxkeep.llm.ChatClient` stores it), else the prompt route's defaults, as
    ``source`` and ``explanation`` say. The page builds with it until told otherwise.
    """
    with tenant.memory() as mem:
        _, messages = _read(mem, session_id)
    found = session_window(messages)
    return WindowResponse(
        session_id=session_id,
        max_prompt_tokens=found.max_prompt_tokens,
        reserve_output_tokens=found.reserve_output_tokens,
        source=found.source,
        model=found.model,
        message_index=found.message_index,
        explanation=found.explanation,
    )


@router.get(
    "/v1/inspect/tenant",
    response_model=TenantResponse,
    responses={s: _RESPONSES[s] for s in (401, 422, 503)},
    tags=["inspect"],
)
def tenant_of_key(tenant: TenantDep) -> TenantResponse:
    """The tenant whose data the key opens, and its sessions stored."""
    with tenant.memory() as mem:
        count = mem.session_count()
    return TenantResponse(tenant=tenant.name, sessions=count)


@router.post(
    "/v1/inspect/episodes/search",
    response_model=RelevantHitsResponse,
    responses=_problems(401, 413, 422, 501, 503),
    tags=["inspect"],
)
def search_relevant(body: SearchIn, tenant: TenantDep) -> RelevantHitsResponse:
    """The relevant ones of the ``top_k`` best episodes for ``query``, by the rule
    ``ctxkeep memory search`` shows them by (:meth:`~ctxkeep.episodic.Hit.is_relevant`: some
    query word matched and the fused score is no worse than the average searched episode's);
    ``POST /v1/episodes/search`` gives all ``top_k``, relevant or not.
    """
    ranked = searched(body, tenant)
    hits = [h for h in ranked if h.is_relevant()]
    return RelevantHitsResponse(
        hits=[_hit_out(h) for h in hits], not_relevant=len(ranked) - len(hits)
    )


@router.get(
    "/v1/inspect/sessions/{session_id}/steps",
    response_model=StepsResponse,
    responses=_RESPONSES,
    tags=["inspect"],
)
def steps(
    session_id: IdPath,
    tenant: TenantDep,
    params: ParamsDep,
    limit: Annotated[
        int, Query(ge=1, le=MAX_STEPS, description="Build the newest N model calls at most.")
    ] = DEFAULT_STEPS,
) -> StepsResponse:
    """Every message's tokens, and for each model call of the session (before each assistant
    message, and the next call) the history's tokens and those of the prompt built from it.
    A step where nothing fits gets its ``error`` instead of a prompt.
    """
    with tenant.memory() as tenant_mem:
        info, messages = _read(tenant_mem, session_id)
    turns = _turns(messages)
    points = [i for i, m in enumerate(messages) if m.role == "assistant"] + [len(messages)]
    first = max(0, len(points) - limit)
    out: list[StepOut] = []
    with scratch_session(info) as mem:
        builder = prompt_builder(mem, params, MemoryArtifactStore())
        counter = builder.counter
        done = 0
        for n, at in enumerate(points[first:], start=first):
            if at > done:
                mem.add_messages(session_id, messages[done:at])
                done = at
            turn = turns[min(at, len(turns) - 1)] if turns else 0
            try:
                report = builder.build(session_id).report
            except (BudgetExceededError, PromptTooLongError) as exc:
                unpruned = mem.build_prompt_messages(session_id)
                out.append(
                    StepOut(
                        step=n,
                        at=at,
                        turn=turn,
                        history_tokens=counter.count_messages(unpruned),
                        prompt_tokens=None,
                        sections={},
                        kept=0,
                        compressed=0,
                        dropped=0,
                        error=str(exc),
                    )
                )
                continue
            out.append(
                StepOut(
                    step=n,
                    at=at,
                    turn=turn,
                    history_tokens=report.prune.tokens_before,
                    prompt_tokens=report.prompt_tokens,
                    sections=dict(report.sections),
                    kept=report.prune.count("kept"),
                    compressed=report.prune.count("compressed"),
                    dropped=report.prune.count("dropped") + report.prune.count("summarised"),
                    error=None,
                )
            )
    return StepsResponse(
        session_id=session_id,
        max_prompt_tokens=params.max_prompt_tokens,
        reserve_output_tokens=params.reserve_output_tokens,
        prompt_budget=params.max_prompt_tokens - params.reserve_output_tokens,
        total=len(messages),
        first_step=first,
        messages=[
            MessageTokensOut(
                index=i,
                message_id=m.id,
                role=m.role,
                turn=turns[i],
                tokens=counter.count_message(m),
            )
            for i, m in enumerate(messages)
        ],
        steps=out,
        evicted=tenant.evicted(),
    )


# -- the page -----------------------------------------------------------------------------------


@cache
def _static(name: str) -> bytes:
    return (resources.files("ctxkeep.server") / "static" / name).read_bytes()


def _page(name: str) -> Response:
    return Response(
        _static(name),
        media_type=_STATIC[name],
        headers={
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


@router.get("/", include_in_schema=False)
def index() -> Response:
    """The inspector's page."""
    return _page("index.html")


@router.get("/inspector/{name}", include_in_schema=False)
def static_file(name: str) -> Response:
    """The inspector's script and style sheet (nothing else is served)."""
    if name not in _STATIC or name == "index.html":
        raise HTTPException(404, f"no inspector file {name!r}")
    return _page(name)


__all__ = [
    "CONTENT_SECURITY_POLICY",
    "BuildParams",
    "CompositionResponse",
    "RelevantHitsResponse",
    "StepsResponse",
    "TenantResponse",
    "WindowResponse",
    "prompt_builder",
    "router",
    "scratch_session",
]

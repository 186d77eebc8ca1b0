"""What the MCP tools and resources do, over the stores of ``--db`` / ``--tenant``, free of MCP.

:class:`Stores` opens the same stores as the CLI (:mod:`ctxkeep.cli._stores`: the embedded
SQLite file by default, any ``--db`` URL, a tenant's store as ``ctxkeep serve`` keeps it) and
answers each tool with a JSON-ready dict through the public library API: the
:class:`~ctxkeep.MemoryManager` for sessions and messages, the episodic store for episodes,
:class:`~ctxkeep.ContextBuilder` for prompts, the artifact store for compressed outputs.

Every argument is checked here with ctxkeep's own checks, so a bad one raises the typed error
any other entry point raises (a :class:`~ctxkeep.errors.CtxkeepError`); the MCP layer
(:mod:`ctxkeep.mcp_server.app`) turns those into error results. Keeping this module free of the
SDK lets the rules be read, and called, without a transport.

The session store opens with the server; the episodic store (whose embedder takes seconds to
load) and the artifact store open on first use. The stores are safe to share between threads:
the SDK runs each tool call in a worker thread.
"""

from __future__ import annotations

import threading
from contextlib import ExitStack
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from ctxkeep import _check
from ctxkeep.errors import ConfigError, EpisodeNotFoundError, InvalidMessageError

if TYPE_CHECKING:
    from ctxkeep.artifacts import ArtifactStore
    from ctxkeep.episodic import EpisodicMemoryStore, Hit
    from ctxkeep.sessions import MemoryManager

DEFAULT_PAGE = 50
"""Messages (or sessions) in a page when the caller gives no ``limit``."""
DEFAULT_TOP_K = 5
"""Episodes ``recall`` returns at most, unless told."""
DEFAULT_PRESERVE_LAST_N = 6
"""Recent messages the pruner prefers (``TokenPruner``'s and ``POST /v1/.../prompt``'s)."""

_REDIS = ("redis", "rediss", "unix")


class Stores:
    """The stores of one ``ctxkeep mcp`` process, and what each tool does with them.

    Args:
        db: ``--db`` (``None``: the embedded SQLite file).
        tenant: ``--tenant`` (``None``: ``--db``'s own stores).
        embedder: the episodic embedder (``local``, ``wordllama``, ``e5-small``, ``openai``,
            ``hash``), as ``ctxkeep memory --embedder`` takes.

    Raises:
        ConfigError: an unsupported URL, ``--tenant`` on ``memory://``, a bad tenant name.
        MissingDependencyError: the URL's backend extra is not installed.

    """

    def __init__(self, db: str | None, tenant: str | None, *, embedder: str = "local") -> None:
        from ctxkeep.cli._stores import base_url, open_sessions

        self.db = db
        self.tenant = tenant
        self.embedder = embedder
        self.url = base_url(db)
        self._exit = ExitStack()
        self._lock = threading.Lock()
        self._episodic: EpisodicMemoryStore | None = None
        self._artifacts: ArtifactStore | None = None
        try:
            self.memory: MemoryManager = self._exit.enter_context(
                open_sessions(db, tenant, create=True)
            )
        except BaseException:
            self._exit.close()
            raise

    def close(self) -> None:
        """Close every store opened."""
        with self._lock:
            for store in (self._episodic, self._artifacts):
                if store is not None:
                    store.close()
            self._episodic = self._artifacts = None
            self._exit.close()

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the stores opened on first use --------------------------------------------------

    def episodic(self) -> EpisodicMemoryStore:
        """The episodic store of ``--db`` / ``--tenant`` (opened, and its embedder loaded, once).

        Raises:
            ConfigError: the store keeps no episodes (Redis), or was made with another embedder.

        """
        with self._lock:
            if self._episodic is None:
                from ctxkeep.cli._stores import episodic_url
                from ctxkeep.episodic import open_episodic

                url = episodic_url(self.db, self.tenant, create=True)
                if urlparse(url).scheme in _REDIS:
                    raise ConfigError(
                        "a redis:// store keeps no episodes: ctxkeep keeps them in SQLite or "
                        "PostgreSQL; start `ctxkeep mcp` with such a --db to remember and recall"
                    )
                self._episodic = open_episodic(url, embedder=self.embedder)
            return self._episodic

    def artifacts(self) -> ArtifactStore:
        """The artifact store beside the sessions (where ``build_prompt`` puts the full text of
        each output it compresses), as ``ctxkeep serve`` keeps it for the same ``--db`` and
        tenant.
        """
        with self._lock:
            if self._artifacts is None:
                from ctxkeep.artifacts import open_artifacts
                from ctxkeep.cli._stores import artifacts_url

                self._artifacts = open_artifacts(artifacts_url(self.db, self.tenant))
            return self._artifacts

    # -- sessions and messages -----------------------------------------------------------

    def create_session(
        self,
        agent_id: str,
        *,
        task_id: str | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Start a session; returns its info."""
        sid = self.memory.create_session(
            agent_id, task_id=task_id, metadata=metadata, session_id=session_id
        )
        return self.memory.get_session(sid).to_dict()

    def list_sessions(
        self,
        *,
        agent_id: str | None = None,
        task_id: str | None = None,
        limit: int = DEFAULT_PAGE,
        offset: int = 0,
    ) -> dict[str, Any]:
        """Live sessions, newest first, one page (``next_offset``: where the next one starts,
        None after the last).
        """
        _check.integer("limit", limit, minimum=1)
        # One more than the page, to know whether another follows.
        infos = self.memory.list_sessions(
            agent_id=agent_id,
            task_id=task_id,
            limit=min(limit + 1, _check.INT64_MAX),
            offset=offset,
        )
        page = infos[:limit]
        return {
            "sessions": [i.to_dict() for i in page],
            "offset": offset,
            "next_offset": offset + limit if len(infos) > limit else None,
        }

    def read_session(
        self, session_id: str, *, offset: int = 0, limit: int | None = DEFAULT_PAGE
    ) -> dict[str, Any]:
        """A session's info and one page of its messages, oldest first (as the service's
        ``GET /v1/sessions/{id}/messages`` pages them).

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.

        """
        from ctxkeep.server.wire import message_to_wire

        _check.ident("session_id", session_id)
        _check.integer("offset", offset, minimum=0)
        _check.optional_integer("limit", limit, minimum=1)
        info = self.memory.get_session(session_id)
        messages = self.memory.get_messages(session_id)
        end = len(messages) if limit is None else min(len(messages), offset + limit)
        return {
            "session": info.to_dict(),
            "messages": [message_to_wire(m) for m in messages[offset:end]],
            "total": len(messages),
            "offset": offset,
            "next_offset": end if end < len(messages) else None,
        }

    def append_message(
        self,
        session_id: str,
        role: str,
        content: Any,
        *,
        name: str | None = None,
        tool_call_id: str | None = None,
        tool_calls: list[Any] | None = None,
    ) -> dict[str, Any]:
        """Append one message as :meth:`MemoryManager.add_message` takes it; returns the
        stored copy (with its ``id`` and ``created_at``).

        Raises:
            SessionNotFoundError: unknown session.
            InvalidMessageError / UnknownRoleError / OrphanToolResultError...: a message the
                session cannot take; nothing is stored.

        """
        from ctxkeep.server.wire import message_to_wire, tool_call_from_wire

        _check.ident("session_id", session_id)
        calls = [tool_call_from_wire(c) for c in _check.iterable("tool_calls", tool_calls or [])]
        fields: dict[str, Any] = {"tool_calls": calls}
        if name is not None:
            fields["name"] = name
        if tool_call_id is not None:
            fields["tool_call_id"] = tool_call_id
        stored = self.memory.add_message(session_id, role, content, **fields)
        return {"message": message_to_wire(stored)}

    def build_prompt(
        self,
        session_id: str,
        *,
        max_prompt_tokens: int,
        reserve_output_tokens: int,
        preserve_last_n: int = DEFAULT_PRESERVE_LAST_N,
        system: str | None = None,
        encoding: str | None = None,
    ) -> dict[str, Any]:
        """The session's prompt within ``max_prompt_tokens - reserve_output_tokens`` (as
        ``POST /v1/sessions/{id}/prompt`` builds it): the messages in OpenAI's format, the
        tokens they take, and every message the pruner dropped or compressed (a compressed
        output's full text is in the artifact store, under the decision's ``artifact_ref``:
        the resource ``ctxkeep://artifacts/{ref}``).

        Raises:
            SessionNotFoundError: unknown session.
            BudgetExceededError: the system prompt and the newest user message alone do not fit.
            ConfigError / InvalidTypeError: a bad number or encoding.

        """
        from ctxkeep.artifacts.staged import StagedArtifacts
        from ctxkeep.builder.budgeted import budgeted_builder

        _check.ident("session_id", session_id)
        _check.integer("max_prompt_tokens", max_prompt_tokens, minimum=2)
        _check.integer("reserve_output_tokens", reserve_output_tokens, minimum=0)
        _check.integer("preserve_last_n", preserve_last_n, minimum=0)
        _check.optional_text("system", system, empty=True)
        # The full texts are staged and written only once the build succeeds: a refused
        # build (a system prompt over the budget) stores nothing, as the service's prompt
        # route does (issue 25).
        staged = StagedArtifacts(self.artifacts())
        builder = budgeted_builder(
            self.memory,
            artifacts=staged,
            max_prompt_tokens=max_prompt_tokens,
            reserve_output_tokens=reserve_output_tokens,
            preserve_last_n=preserve_last_n,
            encoding=_check.optional_text("encoding", encoding),
        )
        built = builder.build(session_id, system=system)
        staged.commit()
        report = built.report
        not_kept = [asdict(d) for d in report.prune.decisions if d.action != "kept"]
        return {
            "messages": built.to_openai(),
            "prompt_tokens": report.prompt_tokens,
            "prompt_budget": report.prompt_budget,
            "max_prompt_tokens": report.max_prompt_tokens,
            "reserve_output_tokens": report.reserve_output_tokens,
            "sections": dict(report.sections),
            "dropped": [d for d in not_kept if d["action"] == "dropped"],
            "compressed": [d for d in not_kept if d["action"] == "compressed"],
            "summarised": [d for d in not_kept if d["action"] == "summarised"],
            "unread": report.prune.unread,
            "notes": [*report.notes, *report.prune.notes],
        }

    # -- episodes ------------------------------------------------------------------------

    def remember(
        self,
        session_id: str,
        summary: str,
        *,
        task_goal: str = "",
        agent_id: str | None = None,
        task_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Save an episode (as ``ctxkeep memory add``); returns its id (an exact duplicate is
        stored once, under the first one's id).

        Raises:
            InvalidMessageError: an empty summary or session id, metadata that is not JSON.

        """
        _check.text("summary", summary, empty=True)
        _check.text("session_id", session_id, empty=True)
        if not summary.strip():
            raise InvalidMessageError("nothing to remember: summary is empty")
        if not session_id.strip():
            raise InvalidMessageError("session_id is empty: name the session the episode came from")
        eid = self.episodic().save_episode(
            session_id,
            task_goal,
            summary,
            metadata=_check.mapping("metadata", metadata),
            agent_id=agent_id,
            task_id=task_id,
        )
        return {"episode_id": eid}

    def recall(
        self,
        query: str,
        *,
        top_k: int = DEFAULT_TOP_K,
        min_score: float = 0.0,
        session_id: str | None = None,
        agent_id: str | None = None,
        task_id: str | None = None,
    ) -> dict[str, Any]:
        """The episodes relevant to ``query``, by the rule of ``ctxkeep memory search``
        (lexical evidence and a fused score of at least ``min_score``: no unrelated hit),
        as the ``### Prior Historical Context`` block a prompt takes and as structured hits.
        """
        from ctxkeep.episodic import format_prior_context

        _check.text("query", query)
        _check.integer("top_k", top_k, minimum=1)
        min_score = _check.number("min_score", min_score)
        filters = {
            k: v
            for k, v in (("session_id", session_id), ("agent_id", agent_id), ("task_id", task_id))
            if v is not None
        }
        found = self.episodic().search(query, top_k, filters=filters)
        hits = [h for h in found if h.is_relevant(min_score)]
        return {"context": format_prior_context(hits), "hits": [_hit(h) for h in hits]}

    def forget(
        self,
        *,
        episode_id: str | None = None,
        session_id: str | None = None,
        agent_id: str | None = None,
    ) -> dict[str, Any]:
        """Delete episodes by id (or a unique prefix of one, as ``ctxkeep memory forget
        --id``), session or agent (each one given must match); returns how many.

        Raises:
            ConfigError: none given, or an ambiguous or too short id prefix.
            EpisodeNotFoundError: no episode id starts with ``episode_id``.

        """
        from ctxkeep.cli.memory import resolve_episode_id

        store = self.episodic()
        scope = {
            k: _check.ident(k, v)
            for k, v in (("session_id", session_id), ("agent_id", agent_id))
            if v is not None
        }
        if episode_id is None and not scope:
            raise ConfigError("forget needs episode_id, session_id or agent_id")
        eid = None
        if episode_id is not None:
            eid = resolve_episode_id(store, _check.text("episode_id", episode_id), **scope)
        n = store.forget(episode_id=eid, session_id=session_id, agent_id=agent_id)
        if eid is not None and n == 0:  # taken by another client since
            raise EpisodeNotFoundError(f"no episode {eid!r}")
        return {"forgotten": n}

    # -- resources -----------------------------------------------------------------------

    def artifact_text(self, ref: str) -> str:
        """The full text stored under an artifact ref (``sha256:<64 hex>``).

        Raises:
            ArtifactNotFoundError: not a ref, or nothing stored under it.

        """
        from ctxkeep.artifacts import check_ref

        return self.artifacts().get(check_ref(ref))


def _hit(h: Hit) -> dict[str, Any]:
    e = h.episode
    return {
        "episode_id": e.episode_id,
        "session_id": e.session_id,
        "agent_id": e.agent_id,
        "task_id": e.task_id,
        "task_goal": e.task_goal,
        "summary": e.summary,
        "metadata": dict(e.metadata),
        "created_at": e.created_at,
        "score": h.score,
        "lexical": h.lexical,
        "dense": h.dense,
    }

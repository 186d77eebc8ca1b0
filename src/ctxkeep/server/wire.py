"""Messages, sessions and evictions as the service's JSON, both ways, free of I/O.

A message on the wire is its record in the full shape without the schema version (every
field of :class:`~ctxkeep.Message`, ``tool_calls`` as ``{"id", "name", "arguments"}``,
``created_at`` as ISO 8601), so it round-trips without loss. Stores leave a field at its
default out of a record (:func:`~ctxkeep.sessions.records.message_to_record`); the wire keeps
every one (:func:`~ctxkeep.sessions.records.full_record`): the service's schema declares
every member of a response's message required (``MessageOut``), and clients read them so (the
inspector, ctxkeep clients of every version, callers' own code). Requests may also send
OpenAI chat messages: a tool call as ``{"id", "type": "function", "function": {"name",
"arguments"}}``, and keys ctxkeep does not model (``refusal``, ``audio``...) kept in
``extra``, as :meth:`~ctxkeep.Message.from_openai` does.

The server and :mod:`ctxkeep.client` both use this module; it imports nothing beyond ctxkeep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from datetime import datetime
from typing import Any

from ctxkeep.errors import InvalidMessageError, describe
from ctxkeep.messages import FIELDS, Message, ToolCall
from ctxkeep.sessions.base import Evicted
from ctxkeep.sessions.records import SessionInfo, full_record, message_to_record

MESSAGE_FIELDS: tuple[str, ...] = FIELDS
"""The members of a message on the wire: the fields of :class:`~ctxkeep.Message`, in order."""

_SESSION_FIELDS = frozenset(f.name for f in fields(SessionInfo))


def message_to_wire(m: Message) -> dict[str, Any]:
    """``m`` as wire JSON (a fresh dict).

    Raises:
        InvalidMessageError: metadata or extra that JSON cannot hold exactly.

    """
    record = full_record(message_to_record(m))
    del record["v"]
    return record


def tool_call_from_wire(d: Any) -> ToolCall:
    """A tool call in ctxkeep's form (``name``, ``arguments``) or OpenAI's (``function``).

    Raises:
        InvalidMessageError: neither form.

    """
    if isinstance(d, Mapping) and "function" not in d:
        if "id" not in d or "name" not in d or "arguments" not in d:
            raise InvalidMessageError(
                f"tool call {d.get('id')!r} needs 'id', 'name' and 'arguments' (or OpenAI's "
                "'function' object)"
            )
        return ToolCall(id=d["id"], name=d["name"], arguments=d["arguments"])
    return ToolCall.from_openai(d)


def message_from_wire(d: Any, *, index: int | None = None) -> Message:
    """A message from wire JSON or an OpenAI chat message.

    Keys that are not message fields go to ``extra`` (with any ``extra`` given), as OpenAI's
    unmodelled keys do.

    Raises:
        InvalidMessageError: a malformed message; the error carries ``index``.

    """
    try:
        if not isinstance(d, Mapping):
            raise InvalidMessageError(f"a message must be an object, got {describe(d)}")
        if "role" not in d:
            raise InvalidMessageError("a message needs a 'role'")
        extra = d.get("extra")
        if extra is not None and not isinstance(extra, Mapping):
            raise InvalidMessageError(f"extra must be an object, got {describe(extra)}")
        unmodelled = {k: v for k, v in d.items() if k not in MESSAGE_FIELDS}
        created = d.get("created_at")
        if isinstance(created, str):
            try:
                created = datetime.fromisoformat(created)
            except ValueError as exc:
                raise InvalidMessageError(f"created_at is not an ISO 8601 time: {exc}") from None
        calls = d.get("tool_calls") or ()
        if isinstance(calls, str | bytes | Mapping) or not isinstance(calls, list | tuple):
            raise InvalidMessageError(f"tool_calls must be a list, got {describe(calls)}")
        refs = d.get("artifact_refs") or ()
        if not isinstance(refs, list | tuple):
            raise InvalidMessageError(f"artifact_refs must be a list, got {describe(refs)}")
        given = {k: d[k] for k in MESSAGE_FIELDS if k in d}
        given.update(
            tool_calls=[tool_call_from_wire(tc) for tc in calls],
            artifact_refs=refs,
            extra={**unmodelled, **(extra or {})},
            created_at=created,
        )
        return Message(**given)
    except InvalidMessageError as exc:
        if index is None or exc.index is not None:
            raise
        raise type(exc)(str(exc), index=index) from None


def session_to_wire(info: SessionInfo) -> dict[str, Any]:
    """A session's info as wire JSON."""
    return info.to_dict()


def session_from_wire(d: Mapping[str, Any]) -> SessionInfo:
    """A :class:`SessionInfo` from wire JSON (members it does not know are ignored)."""
    known = {k: v for k, v in d.items() if k in _SESSION_FIELDS}
    known["pending"] = tuple(known.get("pending") or ())
    known["metadata"] = dict(known.get("metadata") or {})
    return SessionInfo(**known)


def evicted_to_wire(e: Evicted) -> dict[str, Any]:
    """An eviction as wire JSON."""
    return {
        "session_id": e.session_id,
        "agent_id": e.agent_id,
        "reason": e.reason,
        "messages": [message_to_wire(m) for m in e.messages],
    }


def evicted_from_wire(d: Mapping[str, Any]) -> Evicted:
    """An :class:`Evicted` from wire JSON."""
    return Evicted(
        session_id=d["session_id"],
        agent_id=d["agent_id"],
        reason=d["reason"],
        messages=[message_from_wire(m) for m in d.get("messages") or ()],
    )

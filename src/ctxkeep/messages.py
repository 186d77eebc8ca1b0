"""Structured messages and their provider formats.

:class:`Message` is the one message type every part of ctxkeep takes and returns. It carries
what providers need (role, content, name, tool calls, tool call id) and what an agent runtime
needs to explain and replay a history (turn id, event kind, parent id, artifact refs, metadata,
creation time).

Conversions:

* OpenAI chat format: :meth:`Message.from_openai` / :meth:`Message.to_openai`, lossless for
  every field the format has (string or content-part lists, ``tool_calls``, ``tool`` role,
  ``name``, and any other provider key, passed through in ``extra``).
* Anthropic Messages format: :func:`to_anthropic` / :func:`from_anthropic` (system messages
  separated out, ``tool_use`` / ``tool_result`` blocks, consecutive tool results merged into one
  user turn, extended-thinking blocks kept byte for byte, and back).

:func:`coerce_messages` accepts ``Message`` objects or OpenAI dicts; :func:`validate_sequence`
finds the first spot a provider would reject.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ctxkeep.errors import (
    InvalidMessageError,
    MissingToolResultError,
    OrphanToolResultError,
    UnknownRoleError,
    describe,
)

Role: TypeAlias = Literal["system", "developer", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool"})
SYSTEM_ROLES: frozenset[str] = frozenset({"system", "developer"})

ContentPart: TypeAlias = dict[str, Any]
Content: TypeAlias = str | list[ContentPart] | None

_OPENAI_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})

THINKING_TYPES: frozenset[str] = frozenset({"thinking", "redacted_thinking"})
"""Content-part types of Anthropic extended thinking, kept verbatim in an assistant's content."""
BLOCK_ORDER_KEY = "anthropic_block_order"
"""The metadata key that records an Anthropic assistant turn's block order when some block
follows a ``tool_use`` block (the only order ``content`` + ``tool_calls`` cannot express)."""


def _json_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False


@dataclass(frozen=True, slots=True, eq=False)
class ToolCall:
    """One function call requested by the assistant."""

    id: str
    """The id the tool result must answer with ``tool_call_id``."""
    name: str
    """The function's name."""
    arguments: str
    """The arguments as a JSON string, exactly as the provider sent it."""

    def __post_init__(self) -> None:
        for attr in ("id", "name", "arguments"):
            value = getattr(self, attr)
            if not isinstance(value, str):
                raise InvalidMessageError(
                    f"tool call {attr} must be a string, got {type(value).__name__} "
                    f"{describe(value)}"
                )
        if not self.id:
            raise InvalidMessageError("tool call id must not be empty")

    def __eq__(self, other: object) -> bool:
        # Arguments compare as JSON: a provider that re-serialises them (Anthropic sends a
        # parsed object) still describes the same call.
        if not isinstance(other, ToolCall):
            return NotImplemented
        return (
            self.id == other.id
            and self.name == other.name
            and _json_equal(self.arguments, other.arguments)
        )

    def __hash__(self) -> int:
        return hash((self.id, self.name))

    @classmethod
    def _unchecked(cls, id: str, name: str, arguments: str) -> ToolCall:
        """A call from values the caller has checked (strings, a non-empty id)."""
        tc = object.__new__(cls)
        s = object.__setattr__
        s(tc, "id", id)
        s(tc, "name", name)
        s(tc, "arguments", arguments)
        return tc

    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON.

        Raises:
            InvalidMessageError: the arguments are not valid JSON.

        """
        try:
            return json.loads(self.arguments)
        except ValueError as exc:
            raise InvalidMessageError(
                f"tool call {self.id!r} ({self.name}) has arguments that are not valid JSON: {exc}"
            ) from exc

    def to_openai(self) -> dict[str, Any]:
        """This call as an OpenAI ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @classmethod
    def from_openai(cls, d: Any) -> ToolCall:
        """Read an OpenAI ``tool_calls`` entry.

        Raises:
            InvalidMessageError: the entry is malformed.

        """
        if not isinstance(d, Mapping):
            raise InvalidMessageError(f"a tool call must be an object, got {describe(d)}")
        fn = d.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidMessageError(f"tool call {d.get('id')!r} has no 'function' object")
        if "id" not in d or "name" not in fn or "arguments" not in fn:
            raise InvalidMessageError(
                f"tool call {d.get('id')!r} needs 'id', 'function.name' and 'function.arguments'"
            )
        return cls(id=d["id"], name=fn["name"], arguments=fn["arguments"])


def _check_content(content: Any, role: str) -> None:
    if content is None or isinstance(content, str):
        return
    if isinstance(content, list):
        for i, part in enumerate(content):
            if (type(part) is not dict and not isinstance(part, Mapping)) or not isinstance(
                part.get("type"), str
            ):
                raise InvalidMessageError(
                    f"content part {i} must be an object with a string 'type', got {describe(part)}"
                )
            if part["type"] in THINKING_TYPES:
                _check_thinking_part(part, i, role)
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise InvalidMessageError(
                    f"content part {i} of type 'text' needs a string 'text', got {describe(part)}"
                )
            if part["type"] == "image_url":
                image = part.get("image_url")
                if not isinstance(image, Mapping) or not isinstance(image.get("url"), str):
                    raise InvalidMessageError(
                        f"content part {i} of type 'image_url' needs an 'image_url' object with "
                        f"a string 'url', got {describe(part)}"
                    )
        return
    raise InvalidMessageError(
        f"content must be a string, a list of content parts or None, got "
        f"{type(content).__name__} {describe(content)}"
    )


def _check_thinking_part(part: Mapping[str, Any], i: int, role: str) -> None:
    kind = part["type"]
    if role != "assistant":
        raise InvalidMessageError(
            f"content part {i} of type {kind!r} belongs in an assistant message, not {role!r}"
        )
    needed = ("thinking", "signature") if kind == "thinking" else ("data",)
    for key in needed:
        if not isinstance(part.get(key), str):
            raise InvalidMessageError(
                f"content part {i} of type {kind!r} needs a string {key!r}, got {describe(part)}"
            )


def missing_content(m: Message) -> bool:
    """True if ``m`` has no content (``None`` or no parts) where providers require some: every
    message but an assistant message that carries tool calls.
    """
    return (m.content is None or m.content == []) and not (m.role == "assistant" and m.tool_calls)


@dataclass(frozen=True, kw_only=True)
class Message:
    """One message of an agent's history.

    ``role`` and ``content`` may be given by position; every other field by keyword. The
    constructor checks every field (:class:`~ctxkeep.errors.InvalidMessageError` or
    :class:`~ctxkeep.errors.UnknownRoleError` on a bad one) and keeps copies of what it was
    given: ``content`` parts, ``metadata`` and ``extra`` are deep-copied, ``tool_calls`` and
    ``artifact_refs`` become tuples (a tool call may be given as an OpenAI dict), ``None`` for
    ``metadata`` or ``extra`` means empty.

    Anthropic extended thinking lives in the assistant message it came with: each ``thinking``
    block (``{"type": "thinking", "thinking": ..., "signature": ...}``) and
    ``redacted_thinking`` block (``{"type": "redacted_thinking", "data": ...}``) is one part of
    ``content``, stored verbatim (every key, unchanged) and in the order Anthropic sent it
    relative to the text parts. Anthropic requires these blocks of a tool-use turn to be sent
    back unchanged, so :meth:`to_anthropic` writes them back byte for byte, and because they are
    part of the message they stay with its tool calls through stores and pruning. OpenAI has no
    such field: :meth:`to_openai` leaves them out. If a block followed a ``tool_use`` block,
    ``metadata["anthropic_block_order"]`` records the block types in order so that
    :meth:`to_anthropic` rebuilds that order too.

    Stored records (:mod:`ctxkeep.sessions.records`), the service's wire form
    (:mod:`ctxkeep.server.wire`) and its request and response models are derived from
    :func:`dataclasses.fields` of this class: a new field appears in all of them.
    """

    role: str = field(kw_only=False)
    """``system``, ``developer``, ``user``, ``assistant`` or ``tool``."""
    content: Content = field(default=None, kw_only=False)
    """Text, a list of OpenAI content parts (and, in an assistant message, Anthropic thinking
    blocks), or None (an assistant turn with only tool calls)."""
    name: str | None = None
    """The participant's name (OpenAI ``name``)."""
    turn_id: str | None = None
    """The agent turn this message belongs to."""
    tool_call_id: str | None = None
    """For a ``tool`` message: the id of the call it answers."""
    tool_calls: tuple[ToolCall, ...] = ()
    """For an ``assistant`` message: the tool calls it requests."""
    event_kind: str | None = None
    """What happened, for the runtime (``"observation"``, ``"summary"``, ...)."""
    parent_id: str | None = None
    """The id of the message this one follows from, if the runtime tracks a tree."""
    id: str | None = None
    """A stable id for this message, assigned by a store if not given."""
    artifact_refs: tuple[str, ...] = ()
    """Refs into an artifact store (for instance the full text of a compressed output)."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Free-form data that is stored but never sent to a provider."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Provider keys ctxkeep does not model (``refusal``, ``audio``...), passed through."""
    created_at: datetime | None = None
    """When the message was created; stores stamp it on append if not given."""

    if TYPE_CHECKING:
        # The signature type checkers see. At run time the dataclass generates __init__ from
        # the fields above and __post_init__ normalises; it accepts more than the fields'
        # own types say (any iterable for the tuples, OpenAI dicts for tool calls, None for
        # empty metadata), which a generated signature cannot express. A test
        # (tests/test_messages_fields.py) checks that these parameters are the fields, in order.
        def __init__(
            self,
            role: str,
            content: Content = None,
            *,
            name: str | None = None,
            turn_id: str | None = None,
            tool_call_id: str | None = None,
            tool_calls: Iterable[ToolCall | Mapping[str, Any]] = (),
            event_kind: str | None = None,
            parent_id: str | None = None,
            id: str | None = None,
            artifact_refs: Iterable[str] = (),
            metadata: Mapping[str, Any] | None = None,
            extra: Mapping[str, Any] | None = None,
            created_at: datetime | None = None,
        ) -> None: ...

    def __post_init__(self) -> None:
        # The fields are checked and normalised in the instance's __dict__ (a frozen
        # dataclass refuses setattr; the dict is what object.__setattr__ would write to).
        _normalise(self.__dict__, owned=False)

    @classmethod
    def _from_owned(cls, state: dict[str, Any]) -> Message:
        """A message whose attributes are ``state`` (every field), checked like a new
        message's but not copied: for values this process owns outright (freshly decoded
        JSON), so the deep copies of content parts and metadata are skipped.
        """
        _normalise(state, owned=True)
        m = object.__new__(cls)
        object.__setattr__(m, "__dict__", state)
        return m

    # -- conveniences --------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The text of the content (text parts joined by newlines; other parts omitted)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(
            str(p.get("text", "")) for p in self.content if p.get("type") in ("text", "input_text")
        )

    @property
    def is_system(self) -> bool:
        """True for ``system`` and ``developer`` messages."""
        return self.role in SYSTEM_ROLES

    def copy(self) -> Message:
        """A deep copy (content parts and metadata included); cached token counts carry over.

        The fields are copied as they are, not validated again: this message was checked when
        it was made, and a copy of it is as valid (about 1 µs where a new message costs 20-50).
        """
        d = self.__dict__
        # The attributes in one C-level copy; a message with more than its fields carries
        # caches (token counts, compressed forms): only the token counts carry over.
        state = d.copy()
        if len(state) != len(FIELDS):
            state = {name: d[name] for name in FIELDS}
            cached = d.get("_tokens")
            if cached:
                state["_tokens"] = dict(cached)
        if isinstance(state["content"], list):
            state["content"] = copy.deepcopy(state["content"])
        state["metadata"] = copy.deepcopy(dict(state["metadata"])) if state["metadata"] else {}
        state["extra"] = copy.deepcopy(dict(state["extra"])) if state["extra"] else {}
        m = object.__new__(Message)
        object.__setattr__(m, "__dict__", state)
        return m

    def _identified(self, new_id: str, created_at: datetime) -> Message:
        """A copy (:meth:`copy`) whose ``id`` and ``created_at`` are these where it has none:
        what a store stamps on a message it stores (values it made: not validated again).
        """
        m = self.copy()
        state = m.__dict__
        state["id"] = state["id"] or new_id
        state["created_at"] = state["created_at"] or created_at
        return m

    @classmethod
    def _unchecked(cls, state: dict[str, Any]) -> Message:
        """A message whose attributes are ``state`` (every field; taken, not copied).

        For trusted values only (a copy of a message, a record ctxkeep wrote and the caller
        checked): nothing is validated.
        """
        m = object.__new__(cls)
        object.__setattr__(m, "__dict__", state)
        return m

    def replace(self, **changes: Any) -> Message:
        """A copy with some fields changed (validated like a new message)."""
        return dataclasses.replace(self, **changes)

    # -- OpenAI ---------------------------------------------------------------------------

    def to_openai(self) -> dict[str, Any]:
        """This message as an OpenAI chat ``messages`` entry (a fresh dict).

        Anthropic thinking parts are left out (OpenAI has no field for them); an assistant
        content of nothing else becomes ``None`` with tool calls, else ``""``.
        """
        content = copy.deepcopy(self.content)
        if isinstance(content, list) and any(p["type"] in THINKING_TYPES for p in content):
            content = [p for p in content if p["type"] not in THINKING_TYPES]
            if not content:
                content = None if self.tool_calls else ""
        d: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_calls:
            d["tool_calls"] = [tc.to_openai() for tc in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        for k, v in self.extra.items():
            d.setdefault(k, copy.deepcopy(v))
        return d

    @classmethod
    def from_openai(cls, d: Any, *, index: int | None = None) -> Message:
        """Read an OpenAI chat message dict.

        Keys the format has but ctxkeep does not model are kept in ``extra`` and written back
        by :meth:`to_openai`.

        Raises:
            InvalidMessageError: the dict is malformed (the error names the problem).

        """
        if isinstance(d, Message):
            return d.copy()
        if not isinstance(d, Mapping):
            raise InvalidMessageError(
                f"a message must be an object, got {describe(d)}", index=index
            )
        if "role" not in d:
            raise InvalidMessageError("a message needs a 'role'", index=index)
        extra = {k: v for k, v in d.items() if k not in _OPENAI_KEYS}
        try:
            return cls(
                d["role"],
                d.get("content"),
                name=d.get("name"),
                tool_call_id=d.get("tool_call_id"),
                tool_calls=d.get("tool_calls") or (),
                extra=extra,
            )
        except InvalidMessageError as exc:
            if index is None or exc.index is not None:
                raise
            raise type(exc)(str(exc), index=index) from None

    # -- Anthropic ------------------------------------------------------------------------

    def to_anthropic(self) -> dict[str, Any]:
        """This message as one Anthropic ``MessageParam``.

        System messages have no place in Anthropic's ``messages`` list: use
        :func:`to_anthropic` on the whole list, which separates them out.

        Raises:
            InvalidMessageError: a system message, or content Anthropic cannot carry.

        """
        if self.is_system:
            raise InvalidMessageError(
                "a system message is not an Anthropic message; convert the whole list with "
                "ctxkeep.to_anthropic(), which returns it as 'system'"
            )
        if self.role == "tool":
            return {"role": "user", "content": [_tool_result_block(self)]}
        blocks = _content_to_anthropic(self.content)
        if self.role == "assistant" and self.tool_calls:
            uses = [
                {"type": "tool_use", "id": tc.id, "name": tc.name, "input": _tool_input(tc)}
                for tc in self.tool_calls
            ]
            blocks = _in_block_order(blocks, uses, self.metadata.get(BLOCK_ORDER_KEY))
        if self.role == "user" and not self.tool_calls and isinstance(self.content, str):
            return {"role": "user", "content": self.content}
        if self.role == "assistant" and isinstance(self.content, str) and not self.tool_calls:
            return {"role": "assistant", "content": self.content}
        return {"role": self.role, "content": blocks}


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Message))
"""The names of a message's fields, in order: what :meth:`Message.copy` carries, what a stored
record holds (:mod:`ctxkeep.sessions.records`) and what the wire form has
(:mod:`ctxkeep.server.wire`)."""
TEXT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(Message) if f.type == "str | None"
)
"""The fields declared ``str | None`` (ids and names): each is a string or None."""
_FREE_TEXT = tuple(name for name in TEXT_FIELDS if name != "tool_call_id")
# tool_call_id has a rule of its own (a tool message needs one, no other message has one).


def _normalise(state: dict[str, Any], *, owned: bool) -> None:
    """Check a message's fields (``state``: every field by name) and bring them to their
    stored types, in place: tool calls and artifact refs as tuples, ``None`` metadata and
    extra as empty dicts. Unless the caller ``owned`` the values (freshly decoded JSON),
    content parts, metadata and extra are deep-copied so the message shares nothing mutable.

    Raises:
        UnknownRoleError: a role that is not one of :data:`ROLES`.
        InvalidMessageError: any other bad field (the first one, in field order but for the
            tool rules, which come right after the content).

    """
    role = state["role"]
    if not isinstance(role, str):
        raise InvalidMessageError(f"role must be a string, got {describe(role)}")
    if role not in ROLES:
        raise UnknownRoleError(f"unknown role {role!r}; expected one of {', '.join(sorted(ROLES))}")
    content = state["content"]
    _check_content(content, role)
    # Exact-type tests first (`type(x) is tuple`) skip the slower ABC checks in the common case.
    tool_calls = state["tool_calls"]
    if tool_calls is None or (type(tool_calls) is tuple and not tool_calls):
        calls: tuple[ToolCall, ...] = ()  # None: no calls, as OpenAI's "tool_calls": null
    elif isinstance(tool_calls, (str, bytes, Mapping)) or not isinstance(tool_calls, Iterable):
        raise InvalidMessageError(f"tool_calls must be a list, got {describe(tool_calls)}")
    else:
        calls = tuple(
            tc if isinstance(tc, ToolCall) else ToolCall.from_openai(tc) for tc in tool_calls
        )
    if calls and role != "assistant":
        raise InvalidMessageError(f"only assistant messages carry tool_calls, not {role!r}")
    tool_call_id = state["tool_call_id"]
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise InvalidMessageError("a tool message needs a non-empty string tool_call_id")
    elif tool_call_id is not None:
        raise InvalidMessageError(f"only tool messages carry a tool_call_id, not {role!r}")
    for attr in _FREE_TEXT:
        value = state[attr]
        if value is not None and not isinstance(value, str):
            raise InvalidMessageError(f"{attr} must be a string or None, got {describe(value)}")
    artifact_refs = state["artifact_refs"]
    if isinstance(artifact_refs, str):
        raise InvalidMessageError("artifact_refs must be a list of strings, not one string")
    refs = () if type(artifact_refs) is tuple and not artifact_refs else tuple(artifact_refs)
    if refs and not all(isinstance(r, str) for r in refs):
        raise InvalidMessageError(f"artifact_refs must be strings, got {describe(refs)}")
    metadata, extra = state["metadata"], state["extra"]
    if type(metadata) is not dict and metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidMessageError(f"metadata must be a mapping, got {describe(metadata)}")
    if type(extra) is not dict and extra is not None and not isinstance(extra, Mapping):
        raise InvalidMessageError(f"extra must be a mapping, got {describe(extra)}")
    created_at = state["created_at"]
    if created_at is not None and not isinstance(created_at, datetime):
        raise InvalidMessageError(f"created_at must be a datetime, got {describe(created_at)}")
    state["tool_calls"] = calls
    state["artifact_refs"] = refs
    if owned:
        state["metadata"] = metadata or {}
        state["extra"] = extra or {}
        return
    if isinstance(content, list):
        state["content"] = _copied("content", content)
    state["metadata"] = _copied("metadata", dict(metadata)) if metadata else {}
    state["extra"] = _copied("extra", dict(extra)) if extra else {}


def _copied(name: str, value: Any) -> Any:
    """A deep copy of a caller's ``value`` for a new message, or InvalidMessageError naming
    the field. A value nested too deep to copy (Python's recursion limit is met near 500
    levels; a record deeper than 254 is refused by the JSON encoder anyway) or one that cannot
    be copied (a lock, a socket) could never be stored, and a bare RecursionError or TypeError
    would reach the caller (a 500 in the service). Session metadata goes through the same
    check (``create_session`` builds a message of it).
    """
    try:
        return copy.deepcopy(value)
    except (TypeError, copy.Error, RecursionError) as exc:
        reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise InvalidMessageError(
            f"{name} cannot be stored ({reason}); pass plain JSON data"
        ) from None


def _in_block_order(
    blocks: list[dict[str, Any]], uses: list[dict[str, Any]], order: Any
) -> list[dict[str, Any]]:
    """The content blocks and tool_use blocks in the recorded order, if one was recorded and
    still matches; else the content first, as Anthropic itself sends a tool-use turn.
    """
    if (
        isinstance(order, list)
        and order.count("tool_use") == len(uses)
        and len(order) == len(blocks) + len(uses)
    ):
        rest, calls = iter(blocks), iter(uses)
        return [next(calls) if kind == "tool_use" else next(rest) for kind in order]
    return blocks + uses


def _tool_input(tc: ToolCall) -> dict[str, Any]:
    value = tc.parsed_arguments()
    if not isinstance(value, dict):
        raise InvalidMessageError(
            f"tool call {tc.id!r} arguments must be a JSON object for Anthropic, got "
            f"{describe(value)}"
        )
    return value


def _content_to_anthropic(content: Content) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    blocks: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text"):
            blocks.append({"type": "text", "text": part.get("text", "")})
        elif kind in THINKING_TYPES:
            blocks.append(copy.deepcopy(dict(part)))  # verbatim: Anthropic checks the signature
        elif kind == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if url.startswith("data:"):
                header, _, data = url.partition(",")
                media_type = header[5:].split(";")[0] or "image/png"
                blocks.append(
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": media_type, "data": data},
                    }
                )
            else:
                blocks.append({"type": "image", "source": {"type": "url", "url": url}})
        else:
            raise InvalidMessageError(f"content part type {kind!r} has no Anthropic equivalent")
    return blocks


def _tool_result_block(m: Message) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id}
    if isinstance(m.content, list):
        block["content"] = _content_to_anthropic(m.content)
    else:
        block["content"] = m.content if m.content is not None else ""
    if m.metadata.get("is_error"):
        block["is_error"] = True
    return block


# -- list helpers ---------------------------------------------------------------------------


def coerce_message(m: Any, *, index: int | None = None) -> Message:
    """A :class:`Message` from a ``Message`` or an OpenAI dict (dicts are copied)."""
    if isinstance(m, Message):
        return m
    return Message.from_openai(m, index=index)


def coerce_messages(messages: Iterable[Any]) -> list[Message]:
    """Messages from ``Message`` objects or OpenAI dicts.

    Raises:
        InvalidMessageError: an item is malformed; the error names its index.
        TypeError: ``messages`` is a string or not iterable.

    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidMessageError(f"expected a list of messages, got {describe(messages)}")
    out = list(messages)
    for i, m in enumerate(out):
        if type(m) is not Message:
            out[i] = coerce_message(m, index=i)
    return out


def to_openai(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """A list of messages as OpenAI chat dicts."""
    return [m.to_openai() for m in coerce_messages(messages)]


def from_openai(messages: Iterable[Any]) -> list[Message]:
    """Messages from a list of OpenAI chat dicts."""
    return coerce_messages(messages)


@dataclass(frozen=True)
class AnthropicPayload:
    """The Anthropic form of a message list: ``system`` blocks and ``messages``."""

    system: list[dict[str, Any]]
    """One text block per system message, in order (empty if none)."""
    messages: list[dict[str, Any]]
    """The ``MessageParam`` list."""

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``anthropic.Anthropic().messages.create``."""
        out: dict[str, Any] = {"messages": self.messages}
        if self.system:
            out["system"] = self.system
        return out


def to_anthropic(messages: Iterable[Any]) -> AnthropicPayload:
    """A message list in Anthropic's Messages format.

    System (and developer) messages become ``system`` text blocks; consecutive tool results
    are merged into one user turn of ``tool_result`` blocks, as Anthropic requires.

    Anthropic's format cannot carry everything, so :func:`from_anthropic` of the result loses:

    * ``name`` on any message (no Anthropic message or ``tool_result`` block has one);
    * the ``developer`` role (it becomes a ``system`` block like a system message);
    * ``""`` versus ``None`` as the text of an assistant turn with tool calls (neither makes a
      text block);
    * the fields that are never sent to a provider (``metadata`` except ``is_error`` on a tool
      result, ``extra``, ids, turn ids, ``created_at``...).
    """
    msgs = coerce_messages(messages)
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    merging_tools = False
    for m in msgs:
        if m.is_system:
            system.append({"type": "text", "text": m.text})
            continue
        if m.role == "tool":
            block = _tool_result_block(m)
            if merging_tools:
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
                merging_tools = True
            continue
        merging_tools = False
        out.append(m.to_anthropic())
    return AnthropicPayload(system=system, messages=out)


def _anthropic_blocks(content: list[Any], index: int | None) -> list[Mapping[str, Any]]:
    for b in content:
        if not isinstance(b, Mapping) or not isinstance(b.get("type"), str):
            raise InvalidMessageError(
                f"an Anthropic content block must be an object with a string 'type', got "
                f"{describe(b)}",
                index=index,
            )
    return content


def _block_field(b: Mapping[str, Any], key: str, index: int) -> Any:
    if key not in b:
        raise InvalidMessageError(
            f"an Anthropic {b.get('type')} block needs {key!r}, got {describe(b)}", index=index
        )
    return b[key]


def _blocks_to_content(
    blocks: list[Mapping[str, Any]], *, keep_list: bool = False, index: int | None = None
) -> Content:
    parts: list[ContentPart] = []
    for b in blocks:
        kind = b.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": b.get("text", "")})
        elif kind in THINKING_TYPES:
            # Kept verbatim (every key): Anthropic wants them back unchanged. Checked by
            # Message (assistant messages only, string fields).
            parts.append(copy.deepcopy(dict(b)))
        elif kind == "image":
            src = b.get("source")
            if not isinstance(src, Mapping):
                raise InvalidMessageError("an Anthropic image block needs a 'source' object")
            if src.get("type") == "base64":
                url = f"data:{src.get('media_type', 'image/png')};base64,{src.get('data', '')}"
            else:
                url = src.get("url", "")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise InvalidMessageError(
                f"Anthropic block type {kind!r} cannot be converted here", index=index
            )
    if len(parts) == 1 and parts[0]["type"] == "text" and not keep_list:
        return str(parts[0]["text"])
    return parts


def from_anthropic(
    messages: Iterable[Mapping[str, Any]],
    system: str | Sequence[Mapping[str, Any]] | None = None,
) -> list[Message]:
    """Messages from Anthropic's format (the inverse of :func:`to_anthropic`).

    ``tool_result`` blocks become ``tool`` messages; ``tool_use`` blocks become the assistant's
    ``tool_calls``; ``thinking`` and ``redacted_thinking`` blocks become content parts of the
    assistant message, verbatim and in order (see :class:`Message`), so that
    :func:`to_anthropic` gives the same blocks back. What Anthropic's format cannot carry does
    not come back (see
    :func:`to_anthropic`): names, ``developer`` roles (they return as ``system``), and ``""``
    versus ``None`` as the text of an assistant turn that calls tools (it returns as ``None``).

    Raises:
        InvalidMessageError: a malformed message or block (a ``tool_use`` input that is not a
            JSON object, a thinking block outside an assistant message...); the error names
            the message's index.

    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidMessageError(
            f"expected a list of Anthropic messages, got {describe(messages)}"
        )
    out: list[Message] = []
    if isinstance(system, str):
        out.append(Message("system", system))
    elif system:
        if not isinstance(system, Sequence):
            raise InvalidMessageError(
                f"system must be a string or a list of text blocks, got {describe(system)}"
            )
        for b in _anthropic_blocks(list(system), None):
            out.append(Message("system", str(b.get("text", ""))))
    for i, d in enumerate(messages):
        if not isinstance(d, Mapping) or d.get("role") not in ("user", "assistant"):
            raise InvalidMessageError(
                f"an Anthropic message needs role 'user' or 'assistant', got {describe(d)}",
                index=i,
            )
        role, content = d["role"], d.get("content")
        if isinstance(content, str):
            out.append(Message(role, content))
            continue
        if not isinstance(content, list):
            raise InvalidMessageError(
                f"content must be a string or blocks, got {describe(content)}", index=i
            )
        content = _anthropic_blocks(content, i)
        if role == "assistant":
            out.append(_assistant_from_anthropic(content, i))
            continue
        pending: list[Mapping[str, Any]] = []
        for b in content:
            if b.get("type") == "tool_result":
                if pending:
                    out.append(_user_from_blocks(pending, i))
                    pending = []
                inner = b.get("content", "")
                if inner is None:
                    inner = ""
                if not isinstance(inner, (str, list)):
                    raise InvalidMessageError(
                        f"a tool_result's content must be a string or blocks, got {describe(b)}",
                        index=i,
                    )
                body_t: Content = (
                    inner
                    if isinstance(inner, str)
                    else _blocks_to_content(_anthropic_blocks(inner, i), index=i)
                )
                if isinstance(inner, list) and inner and isinstance(body_t, str):
                    body_t = [{"type": "text", "text": body_t}]
                meta = {"is_error": True} if b.get("is_error") else None
                tool_use_id = _block_field(b, "tool_use_id", i)
                out.append(Message("tool", body_t, tool_call_id=tool_use_id, metadata=meta))
            else:
                pending.append(b)
        if pending:
            out.append(_user_from_blocks(pending, i))
    return out


def _user_from_blocks(blocks: list[Mapping[str, Any]], i: int) -> Message:
    try:
        return Message("user", _blocks_to_content(blocks, keep_list=True, index=i))
    except InvalidMessageError as exc:
        if exc.index is not None:
            raise
        raise type(exc)(str(exc), index=i) from None


def _tool_call_from_block(b: Mapping[str, Any], i: int) -> ToolCall:
    tool_input = b.get("input", {})
    if not isinstance(tool_input, Mapping):
        raise InvalidMessageError(
            f"a tool_use block's input must be an object, got {describe(tool_input)}", index=i
        )
    try:
        arguments = json.dumps(tool_input, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"tool_use {b.get('id')!r} has an input that is not JSON ({exc})", index=i
        ) from exc
    return ToolCall(
        id=_block_field(b, "id", i), name=_block_field(b, "name", i), arguments=arguments
    )


def _assistant_from_anthropic(content: list[Mapping[str, Any]], i: int) -> Message:
    kinds = [b["type"] for b in content]
    try:
        calls = [_tool_call_from_block(b, i) for b in content if b["type"] == "tool_use"]
        rest = [b for b in content if b["type"] != "tool_use"]
        # to_anthropic writes an assistant's text before its tool_use blocks: one text
        # block alongside tool calls was a string.
        body = _blocks_to_content(rest, keep_list=not calls, index=i) if rest else None
        meta = None
        if calls and kinds[len(rest) :] != ["tool_use"] * len(calls):
            meta = {BLOCK_ORDER_KEY: kinds}  # a block after a tool_use: record the order
        return Message("assistant", body, tool_calls=calls, metadata=meta)
    except InvalidMessageError as exc:
        if exc.index is not None:
            raise
        raise type(exc)(str(exc), index=i) from None


# -- validation -----------------------------------------------------------------------------


def validate_sequence(messages: Iterable[Any], *, allow_pending: bool = False) -> list[Message]:
    """Check that a message list is a sequence a provider accepts.

    Every message has content (a string, or at least one content part), except an assistant
    message with ``tool_calls``, which may have none: OpenAI refuses a ``null`` content and an
    empty part list, Anthropic an empty content list. An assistant message with ``tool_calls``
    must be followed directly by exactly one ``tool`` result per call id (in any order) before
    anything else, and the ids of one message's calls are distinct; a tool result must answer
    a call of the assistant message right before its block.

    Args:
        messages: ``Message`` objects or OpenAI dicts.
        allow_pending: accept a trailing assistant tool call whose results have not arrived
            yet (a stored history mid-turn; never a prompt).

    Returns:
        The messages as ``Message`` objects.

    Raises:
        UnknownRoleError / InvalidMessageError: a malformed message.
        OrphanToolResultError: a tool result with no matching call.
        MissingToolResultError: a call not answered before the next non-tool message.

    """
    msgs = coerce_messages(messages)
    pending: dict[str, int] = {}
    call_index = -1
    for i, m in enumerate(msgs):
        if missing_content(m):
            raise InvalidMessageError(
                f"a {m.role} message needs content, not {m.content!r} (only an assistant "
                "message with tool calls may have none)",
                index=i,
            )
        if m.role == "tool":
            tid = m.tool_call_id or ""
            if tid not in pending:
                raise OrphanToolResultError(
                    f"tool result for {tid!r} does not answer a pending call of the assistant "
                    "message right before it",
                    index=i,
                    tool_call_id=tid,
                )
            del pending[tid]
            continue
        if pending:
            missing = next(iter(pending))
            raise MissingToolResultError(
                f"assistant tool call {missing!r} has no result before the next {m.role} message "
                f"(message {i})",
                index=call_index,
                tool_call_id=missing,
            )
        if m.tool_calls:
            call_index = i
            for tc in m.tool_calls:
                if tc.id in pending:
                    raise InvalidMessageError(f"duplicate tool call id {tc.id!r}", index=i)
                pending[tc.id] = i
    if pending and not allow_pending:
        missing = next(iter(pending))
        raise MissingToolResultError(
            f"assistant tool call {missing!r} has no result (the list ends first)",
            index=call_index,
            tool_call_id=missing,
        )
    return msgs


def is_valid_sequence(messages: Iterable[Any]) -> bool:
    """True if :func:`validate_sequence` would accept ``messages``."""
    try:
        validate_sequence(messages)
    except (InvalidMessageError, OrphanToolResultError, MissingToolResultError):
        return False
    return True


__all__ = [
    "ROLES",
    "AnthropicPayload",
    "Content",
    "Message",
    "Role",
    "ToolCall",
    "coerce_messages",
    "from_anthropic",
    "from_openai",
    "is_valid_sequence",
    "to_anthropic",
    "to_openai",
    "validate_sequence",
]

"""LangChain messages <-> ctxkeep messages, losslessly.

:func:`to_ctxkeep_messages` gives each ctxkeep :class:`~ctxkeep.Message` what ctxkeep counts and
checks (role, content as OpenAI parts, name, tool calls with JSON arguments, tool call id) and
keeps the rest of the LangChain message in ``metadata["langchain"]``;
:func:`from_ctxkeep_messages` reads it back, equal, or builds a message ctxkeep made (a summary,
a synthetic "no result") from its fields. The private :class:`_Converter` is the pruners' cached
conversion, whose messages carry a key back to the very LangChain object they came from
(:func:`_to_lc`), so a message the pruner leaves unchanged comes back as that object.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias, cast

from ctxkeep import _check
from ctxkeep.errors import (
    InvalidMessageError,
    InvalidTypeError,
    MissingDependencyError,
    UnknownRoleError,
    describe,
)
from ctxkeep.messages import THINKING_TYPES, Content, ContentPart, Message, ToolCall
from ctxkeep.prune.units import _NO_RESULT

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        convert_to_messages,
        messages_from_dict,
    )
    from langchain_core.prompt_values import PromptValue
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langchain", "langchain") from exc

__all__ = ["MessagesInput", "from_ctxkeep_messages", "to_ctxkeep_messages"]

MessagesInput: TypeAlias = Sequence[Any] | PromptValue

_RECORD = "langchain"  # metadata key of the lossless record
_KEY = "langchain_key"  # metadata key tying a pruned message to the LangChain one it came from
_MARK = "ctxkeep"  # response_metadata key on messages ctxkeep changed or made
_keys = itertools.count(1)
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}
_CHAT_ROLES = {
    "system": "system",
    "developer": "developer",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
}


def _role(m: BaseMessage, i: int) -> str:
    kind = m.type.removesuffix("MessageChunk").lower()
    if kind == "chat":
        role = _CHAT_ROLES.get(str(getattr(m, "role", "")))
        if role is None:
            raise UnknownRoleError(
                f"ChatMessage role {getattr(m, 'role', None)!r} has no provider role; use one of "
                + ", ".join(sorted(_CHAT_ROLES)),
                index=i,
            )
        return role
    role = _ROLES.get(kind)
    if role is None:
        raise InvalidMessageError(
            f"a {type(m).__name__} cannot be sent to a chat model here (FunctionMessage is "
            "legacy function calling with no tool_call_id: use ToolMessage)",
            index=i,
        )
    if role == "system" and m.additional_kwargs.get("__openai_role__") == "developer":
        return "developer"
    return role


def _part(block: Any, role: str) -> ContentPart:
    """One LangChain content block as a part ctxkeep accepts (counted as it would be sent)."""
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if isinstance(block, Mapping) and isinstance(block.get("type"), str):
        kind = block["type"]
        if kind == "text" and isinstance(block.get("text"), str):
            return dict(block)
        if kind == "image_url":
            image = block.get("image_url")
            if isinstance(image, str):
                return {"type": "image_url", "image_url": {"url": image}}
            if isinstance(image, Mapping) and isinstance(image.get("url"), str):
                return dict(block)
        elif kind in THINKING_TYPES:
            needed = ("thinking", "signature") if kind == "thinking" else ("data",)
            if role == "assistant" and all(isinstance(block.get(k), str) for k in needed):
                return dict(block)
        elif kind != "text":
            return dict(block)  # counted as its JSON, never free
    return {"type": "text", "text": json.dumps(block, ensure_ascii=False, default=str)}


def _content(content: Any, role: str) -> Content:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return [_part(b, role) for b in content]
    return str(content)


_args_json = json.JSONEncoder(ensure_ascii=False).encode
"""A tool call's arguments as JSON: what ``json.dumps(args, ensure_ascii=False)`` writes (the
same encoder), without making an encoder for every call (half of its cost for small args)."""


def _tool_calls(m: BaseMessage, i: int) -> list[ToolCall]:
    out = []
    for tc in getattr(m, "tool_calls", None) or ():
        if not tc.get("id"):
            raise InvalidMessageError(
                f"tool call {tc.get('name')!r} has no id, so no ToolMessage can answer it; "
                "give every tool call an id",
                index=i,
            )
        try:
            arguments = _args_json(tc.get("args", {}))
        except (TypeError, ValueError) as e:
            raise InvalidMessageError(
                f"tool call {tc['id']!r} has arguments that are not JSON ({e})", index=i
            ) from e
        call_id, name = tc["id"], tc.get("name") or ""
        if type(call_id) is str and type(name) is str:  # what ToolCall checks (id is not "")
            out.append(ToolCall._unchecked(call_id, name, arguments))
        else:
            out.append(ToolCall(id=call_id, name=name, arguments=arguments))  # its checks
    return out


def _convert(m: Any, i: int, metadata: dict[str, Any]) -> Message:
    if not isinstance(m, BaseMessage):
        raise InvalidMessageError(f"expected a LangChain message, got {describe(m)}", index=i)
    role = _role(m, i)
    tool_call_id = getattr(m, "tool_call_id", None) if role == "tool" else None
    try:
        return Message(
            role,
            _content(m.content, role),
            name=m.name if isinstance(m.name, str) else None,
            tool_call_id=tool_call_id,
            tool_calls=_tool_calls(m, i) if role == "assistant" else (),
            metadata=metadata,
        )
    except InvalidMessageError as exc:
        if exc.index is not None:
            raise
        raise type(exc)(str(exc), index=i) from None


_UNSET: dict[str, Any] = dict(Message("user").__dict__)
"""Every field of a new :class:`~ctxkeep.Message` (those :func:`_recorded` sets overwritten)."""


def _recorded(m: Any, i: int, *, owned: bool) -> Message:
    """One LangChain message as a ctxkeep message with its LangChain record in
    ``metadata["langchain"]`` (its data but the content, where ctxkeep's content is the same:
    stored once). ``owned``: the message goes to a store that takes it over and drops it once
    written (:meth:`CtxkeepChatMessageHistory.add_messages`), so it is built from values made
    for it here, checked but not copied again (``Message._from_owned``).
    """
    if not isinstance(m, BaseMessage):
        raise InvalidMessageError(f"expected a LangChain message, got {describe(m)}", index=i)
    data = m.model_dump()  # message_to_dict's "data": new containers, the record owns them
    role = _role(m, i)
    content = _content(m.content, role)
    if content == m.content:
        del data["content"]
    record = {"type": m.type, "data": data}
    state = {
        **_UNSET,
        "role": role,
        "content": content,
        "name": m.name if isinstance(m.name, str) else None,
        "tool_call_id": getattr(m, "tool_call_id", None) if role == "tool" else None,
        "tool_calls": _tool_calls(m, i) if role == "assistant" else (),
        "metadata": {_RECORD: record},
        "extra": {},
    }
    try:
        return Message._from_owned(state) if owned else Message(**state)
    except InvalidMessageError as exc:
        if exc.index is not None:
            raise
        raise type(exc)(str(exc), index=i) from None


def to_ctxkeep_messages(messages: MessagesInput) -> list[Message]:
    """LangChain messages (or anything ``convert_to_messages`` takes) as ctxkeep messages.

    Each message keeps its LangChain data in ``metadata["langchain"]`` (JSON when the message
    is), so :func:`from_ctxkeep_messages` gives back an equal message.

    Raises:
        InvalidMessageError: a message ctxkeep cannot represent (a tool call without an id,
            a ``FunctionMessage``, a ``RemoveMessage``); the error names its index.
        UnknownRoleError: a ``ChatMessage`` with a role no provider knows.

    """
    return [_recorded(m, i, owned=False) for i, m in enumerate(_lc_messages(messages))]


def _owned_ctxkeep_messages(messages: MessagesInput) -> list[Message]:
    """:func:`to_ctxkeep_messages` for a store that takes the messages over (``owned``: see
    :func:`_recorded`): about half the cost, without the copies.
    """
    return [_recorded(m, i, owned=True) for i, m in enumerate(_lc_messages(messages))]


def from_ctxkeep_messages(messages: Iterable[Message]) -> list[BaseMessage]:
    """LangChain messages from ctxkeep ones: the inverse of :func:`to_ctxkeep_messages`.

    A message with no LangChain record (one ctxkeep made: a summary, a synthetic "no result"
    tool result) is built from its fields. A tool output ctxkeep compressed comes back with
    the compressed text and ``response_metadata["ctxkeep"]`` naming the artifact that holds
    the full one.
    """
    return _from_ctxkeep(messages, owned=False)


def _from_ctxkeep(messages: Iterable[Message], *, owned: bool) -> list[BaseMessage]:
    """:func:`from_ctxkeep_messages`; ``owned``: the caller made ``messages`` for this call
    alone and throws them away (a history's fresh read), so the LangChain messages may share
    their records' values and are built without validating them again (:func:`_from_record`).
    """
    out = []
    # An owned iterable is taken one message at a time (a history read's decoding: each
    # message is dropped once converted, so no more than one is alive at a time).
    given = messages if owned else _check.iterable("messages", messages)
    for i, m in enumerate(given):
        if not isinstance(m, Message):
            raise InvalidTypeError(f"message {i} must be a ctxkeep Message, got {describe(m)}")
        record = m.metadata.get(_RECORD)
        if not isinstance(record, Mapping) or not isinstance(record.get("data"), Mapping):
            out.append(_from_fields(m))
            continue
        data = dict(record["data"])
        compressed = "ctxkeep_compressed" in m.metadata
        if compressed or "content" not in data:
            data["content"] = m.content if m.content is not None else ""
        lc = (
            _from_record(record["type"], data)
            if owned
            else messages_from_dict([{"type": record["type"], "data": data}])[0]
        )
        out.append(_apply_changes(lc, _modelled(lc, i), m))
    return out


# The record's data is a validated message's ``model_dump()`` (:func:`to_ctxkeep_messages`),
# so these types are rebuilt with ``model_construct``, without validating it again (which
# would also copy the values): about a third of a 1,000-message history read was pydantic
# validation. Any other type takes LangChain's path.
_CONSTRUCT: dict[str, type[BaseMessage]] = {
    "human": HumanMessage,
    "ai": AIMessage,
    "system": SystemMessage,
    "tool": ToolMessage,
    "chat": ChatMessage,
}


class _Construct(NamedTuple):
    """What ``model_construct`` makes of a record's data holding every field of the class
    but ``type`` (a ``model_dump()``, as :func:`_recorded` keeps it), made in two dict
    copies: ``model_construct`` walks the class's fields in Python, asking each for its
    aliases and default (a quarter of a history read).
    """

    cls: type[BaseMessage]
    fields: dict[str, Any]
    """Every field in the class's order, ``type`` holding its default (the class's literal)."""
    given: frozenset[str]
    """The fields the data holds: every one but ``type``."""


def _construct_plan(cls: type[BaseMessage]) -> _Construct | None:
    """The plan for ``cls``, or None where ``model_construct`` does more than fill the fields
    (aliases, a post-init, no extra allowed, a ``type`` without a constant default).
    """
    fields = cls.__pydantic_fields__
    kind = fields.get("type")
    if (
        kind is None
        or not isinstance(kind.default, str)
        or cls.__pydantic_post_init__
        or cls.__pydantic_root_model__
        or cls.model_config.get("extra") != "allow"
        or any(f.alias is not None or f.validation_alias is not None for f in fields.values())
    ):
        return None
    return _Construct(
        cls,
        {name: kind.default if name == "type" else None for name in fields},
        frozenset(fields) - {"type"},
    )


_PLANS = {
    kind: plan for kind, cls in _CONSTRUCT.items() if (plan := _construct_plan(cls)) is not None
}


def _from_record(kind: Any, data: dict[str, Any]) -> BaseMessage:
    cls = _CONSTRUCT.get(kind) if isinstance(kind, str) else None
    if cls is None or not isinstance(data.get("content"), str | list):
        return messages_from_dict([{"type": kind, "data": data}])[0]
    data.pop("type", None)  # the class's own literal
    plan = _PLANS.get(kind)
    if plan is None or data.keys() != plan.given:
        return cls.model_construct(**data)
    # model_construct's result: the fields in the class's order, those given as set, no
    # extra (every key given is a field) and no private attributes.
    values = plan.fields.copy()
    values.update(data)
    m = cls.__new__(cls)
    object.__setattr__(m, "__dict__", values)
    object.__setattr__(m, "__pydantic_fields_set__", set(plan.given))
    object.__setattr__(m, "__pydantic_extra__", {})
    object.__setattr__(m, "__pydantic_private__", None)
    return m


class _Modelled(NamedTuple):
    """What ctxkeep models of a LangChain message (:func:`_apply_changes` compares these), got
    without building a whole :class:`~ctxkeep.Message`.
    """

    content: Content
    tool_call_id: str | None
    tool_calls: tuple[ToolCall, ...]


def _modelled(m: BaseMessage, i: int) -> _Modelled:
    role = _role(m, i)
    return _Modelled(
        _content(m.content, role),
        getattr(m, "tool_call_id", None) if role == "tool" else None,
        tuple(_tool_calls(m, i)) if role == "assistant" else (),
    )


def _from_fields(m: Message) -> BaseMessage:
    """A LangChain message for a ctxkeep message that has no LangChain original."""
    content: Any = m.content if m.content is not None else ""
    mark: dict[str, Any] = {}
    if m.event_kind:
        mark["event_kind"] = m.event_kind
    if m.role == "tool" and m.content == _NO_RESULT:
        mark["synthetic"] = True  # the pruner's result for a call that never got one
    meta = {_MARK: mark} if mark else {}
    if m.role == "tool":
        return ToolMessage(
            content,
            tool_call_id=m.tool_call_id or "",
            name=m.name,
            status="error" if mark.get("synthetic") else "success",
            response_metadata=meta,
        )
    if m.role == "assistant":
        return AIMessage(
            content,
            name=m.name,
            tool_calls=[_lc_call(tc) for tc in m.tool_calls],
            response_metadata=meta,
        )
    if m.role in ("system", "developer"):
        extra = {"__openai_role__": "developer"} if m.role == "developer" else {}
        return SystemMessage(content, name=m.name, additional_kwargs=extra, response_metadata=meta)
    return HumanMessage(content, name=m.name, response_metadata=meta)


def _lc_call(tc: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(tc.arguments)
    except ValueError:
        args = {"arguments": tc.arguments}
    return {"name": tc.name, "args": args, "id": tc.id, "type": "tool_call"}


def _apply_changes(
    original: BaseMessage, before: Message | _Modelled, after: Message
) -> BaseMessage:
    """``original`` if ctxkeep left it as it was (``before`` -> ``after``), else a copy with
    the changes: compressed content, or tool call ids a repair made distinct.
    """
    update: dict[str, Any] = {}
    if after.content is not before.content and after.content != before.content:
        update["content"] = after.content if after.content is not None else ""
        info = after.metadata.get("ctxkeep_compressed")
        if isinstance(info, Mapping):
            mark = {
                "compressed": True,
                "artifact_ref": info.get("ref"),
                "original_chars": info.get("original_chars"),
            }
            update["response_metadata"] = {**original.response_metadata, _MARK: mark}
    if after.tool_call_id != before.tool_call_id:
        update["tool_call_id"] = after.tool_call_id
    if after.tool_calls != before.tool_calls:
        update["tool_calls"] = [_lc_call(tc) for tc in after.tool_calls]
    return original.model_copy(update=update) if update else original


def _lc_messages(messages: Any) -> list[BaseMessage]:
    if type(messages) is list and all(isinstance(m, BaseMessage) for m in messages):
        # What convert_to_messages gives for these (each message as it is), without its
        # per-message dispatch: a history's add_message hands over a list of one.
        return list(messages)
    if isinstance(messages, str | bytes | Mapping) or not isinstance(
        messages, Iterable | PromptValue
    ):
        raise InvalidTypeError(
            f"messages must be a list of messages or a PromptValue, got {describe(messages)}"
        )
    try:
        return convert_to_messages(cast("Sequence[Any]", messages))
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise InvalidMessageError(f"cannot read the messages as LangChain messages: {exc}") from exc


class _Converter:
    """LangChain messages to ctxkeep messages for pruning, each tagged with a key that ties it
    back to the object it came from. Conversions are cached (by LangChain id, or by object,
    and reused only while the message still equals a snapshot of it), so token counts carry
    over between the model calls of a run and a turn costs its new messages.
    """

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[Any, tuple[BaseMessage, Message]] = OrderedDict()
        self._size = size

    def convert(
        self, lcs: list[BaseMessage]
    ) -> tuple[list[Message], dict[int, tuple[BaseMessage, Message]]]:
        out: list[Message] = []
        originals: dict[int, tuple[BaseMessage, Message]] = {}
        for i, lc in enumerate(lcs):
            key = (type(lc), lc.id) if lc.id else id(lc)
            hit = self._cache.get(key)
            if hit is not None and hit[0] == lc:
                cm = hit[1]
                self._cache.move_to_end(key)
            else:
                cm = _convert(lc, i, {_KEY: next(_keys)})
                self._cache[key] = (lc.model_copy(deep=True), cm)
                if len(self._cache) > self._size:
                    self._cache.popitem(last=False)
            originals.setdefault(cm.metadata[_KEY], (lc, cm))
            out.append(cm)
        return out, originals


def _to_lc(m: Message, originals: Mapping[int, tuple[BaseMessage, Message]]) -> BaseMessage:
    found = originals.get(m.metadata.get(_KEY, 0))
    if found is None:
        return _from_fields(m)
    return _apply_changes(found[0], found[1], m)

"""OpenAI Responses API input items, to and from :class:`~ctxkeep.Message` lists.

The OpenAI Agents SDK keeps its history (and sends its model input) as Responses input items:
``message`` items with content parts, ``function_call`` and ``function_call_output`` items,
``reasoning`` items with encrypted content, computer, file-search, web-search, MCP, shell and
code-interpreter calls, ``item_reference`` and more. :func:`from_responses` turns such a list
into ``Message`` objects, so that token counts, :func:`~ctxkeep.validate_sequence` and the
pruner apply; :func:`to_responses` turns messages back into items.

What ctxkeep models:

* a ``message`` item (``type`` ``"message"``, or an easy message with only ``role`` and
  ``content``) is a ``Message(role, content)``, its content kept exactly (a string or the
  item's own content parts: ``input_text``, ``output_text``, ``refusal``, ``input_image``...);
* a run of consecutive ``function_call`` items is ONE assistant ``Message`` whose
  ``tool_calls`` are the calls in order (``ToolCall.id`` is the item's ``call_id``);
* each ``function_call_output`` is a ``tool`` message answering its ``call_id`` (its content
  is the output: a string or the output's content parts).

What it carries without modelling: every other field of those items (``id``, ``status``,
``phase``, ``namespace``, ``caller``...), their key order, and every other item
(``reasoning``, ``computer_call``, ``mcp_call``, ``item_reference``, a type the SDK adds
tomorrow...). They live in the ``metadata`` of the message they belong to, under
:data:`RESPONSES_KEY`, as an ordered list of entries, one per item the message stands for:

* ``{"item": {...}}``: an item ctxkeep does not model, verbatim;
* ``{"s": {...}}``: the message item or ``function_call_output`` the message *is*: the item
  in its key order, ``0`` in place of each value the message holds (``role`` and
  ``content``; ``call_id`` and ``output``);
* ``{"c": {...}}``: the k-th ``function_call`` of the run (``tool_calls[k]``): the item in its
  key order, ``0`` in place of ``call_id``, ``name`` and ``arguments``.

A message whose items are all *plain*, exactly the items :func:`to_responses` makes of a
message that never was one (``{"type": "message", "role", "content"}``, ``{"type":
"function_call", "call_id", "name", "arguments"}``, ``{"type": "function_call_output",
"call_id", "output"}``, in that key order, their content parts none that it recasts), carries
no entries at all: most of an agent's history, stored with nothing beside the message.
(Entries written before they were compact, ``{"self" | "call": {"order": [keys], "fields":
{other fields}}}``, are read as they always were.)

An unmodelled item belongs to the next modelled item after it (a ``reasoning`` item to the
call or message it precedes, a ``computer_call`` and its output to whatever comes next), or,
inside a run of function calls, stays in the run where it stood. Items after the last modelled
item belong to the last message; a list with no modelled item at all becomes one carrier
message, ``Message("assistant", "", event_kind="responses_items")``, that stands for nothing
but its items. Because the items are part of a message, the pruner keeps or drops them with
it: a reasoning item is never separated from the call after it, and a call never from its
output (they are one unit). ``metadata`` and not ``extra`` holds them because ``extra`` is
written into Chat Completions dicts by :meth:`~ctxkeep.Message.to_openai`, which would send
Responses-only keys to a Chat endpoint; the items are not counted in a message's tokens.

:func:`to_responses` writes each message's entries back in order, the modelled values (role,
content, calls, outputs) taken from the message as it is now (a compressed output is sent
compressed), so ``to_responses(from_responses(items)) == items``, key order included. A
message that never was an item (one from Chat Completions, a summary, a synthetic tool
result) gets a fresh item: system and developer messages become ``system`` / ``developer``
message items, tool calls ``function_call`` items, tool results ``function_call_output``
items, Chat content parts (``text``, ``image_url``, ``file``) their Responses twins.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

from ctxkeep.errors import InvalidMessageError, describe
from ctxkeep.messages import THINKING_TYPES, Content, Message, ToolCall, coerce_messages

RESPONSES_KEY = "responses_items"
"""The ``Message.metadata`` key holding the Responses items a message stands for."""
CARRIER_KIND = "responses_items"
"""The ``event_kind`` of a message that carries only unmodelled items (see the module doc)."""

_MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
_MESSAGE_KEYS = ("role", "content")
_CALL_KEYS = ("call_id", "name", "arguments")
_OUTPUT_KEYS = ("call_id", "output")

_RUN_OPEN = Message("assistant")
"""The place of an open run of calls' message, replaced by the message when the run closes
(one made for each run was some 4 us of a one-call conversion, made and dropped)."""

_Dup: TypeAlias = Callable[[Any], Any]
"""How to_responses takes a value from a message: ``copy.deepcopy``, or as it is."""

# -- from_responses -------------------------------------------------------------------------


def _kind(item: Mapping[str, Any], i: int) -> str:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"  # an easy input message may leave out its type
    if not isinstance(kind, str) or not kind:
        raise InvalidMessageError(
            f"a Responses input item needs a string 'type' (or a 'role'), got {describe(item)}",
            index=i,
        )
    return kind


def _string(item: Mapping[str, Any], key: str, i: int, *, empty: bool = True) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not empty and not value):
        what = "a string" if empty else "a non-empty string"
        raise InvalidMessageError(
            f"a {item.get('type', 'message')} item needs {what} {key!r}, got {describe(item)}",
            index=i,
        )
    return value


def _parts(value: Any, what: str, i: int) -> Content:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, Mapping) and isinstance(p.get("type"), str) for p in value
    ):
        return [dict(p) for p in value]
    raise InvalidMessageError(
        f"{what} must be a string or a list of content parts with a string 'type', got "
        f"{describe(value)}",
        index=i,
    )


_PLAIN_MESSAGE = ("type", "role", "content")
_PLAIN_CALL = ("type", "call_id", "name", "arguments")
_PLAIN_OUTPUT = ("type", "call_id", "output")
"""The keys, in order, of the items :func:`to_responses` makes for a message that carries
no entries (:func:`_fresh`): a message, call or output item of exactly these keys needs none."""
_RECAST = frozenset({"text", "image_url", "file", *THINKING_TYPES})
"""Content part types :func:`_fresh_content` changes (Chat parts, thinking) or drops."""

_Plain: TypeAlias = tuple[str, dict[str, Any], tuple[str, ...]]
"""An entry left unwritten unless its message needs entries: (kind, item, modelled keys)."""


def _entry(
    kind: str,
    item: dict[str, Any],
    modelled: tuple[str, ...],
    plain: bool,
    role: str = "assistant",
    content: Content = "",
) -> dict[str, Any] | _Plain:
    """The entry of a modelled item (``kind`` ``"s"`` or ``"c"``); a plain one (its keys
    ``plain``, its content given back by :func:`_fresh_content` as it is) only where its
    message needs entries at all.
    """
    if plain and (isinstance(content, str) or _plain_parts(role, content or [])):
        return (kind, item, modelled)
    return {kind: _compact(item, modelled)}


def _compact(item: Mapping[str, Any], modelled: tuple[str, ...]) -> dict[str, Any]:
    """The item in its key order, 0 standing for each value the message models."""
    return {k: 0 if k in modelled else v for k, v in item.items()}


def _plain_parts(role: str, parts: list[dict[str, Any]]) -> bool:
    """Whether :func:`_fresh_content` gives ``parts`` (of a ``role`` message) back as they are."""
    kinds = {p.get("type") for p in parts}
    return not (kinds & _RECAST) and (role != "assistant" or not kinds <= {"output_text"})


def _written(entries: list[Any]) -> list[dict[str, Any]] | None:
    """A message's entries as stored: None where every item it stands for is plain, the
    item :func:`_fresh` makes of it (:func:`to_responses` gives it back with no entries).
    """
    # The entries were ~109 bytes on every record of bench/peers.py's agent_items(1000), all
    # plain, where the SDK's SQLiteSession stores the item alone: with none, its records'
    # median is 368 bytes, not 478, and a cold get_items() of the 1,000 items runs 33% fewer
    # bytecodes (470k, not 699k; sys.settrace opcode counts), as _fresh builds each item
    # directly where _rebuild walked an order and a dict of fields.
    if entries and all(type(e) is tuple for e in entries):
        return None
    return [{e[0]: _compact(e[1], e[2])} if type(e) is tuple else e for e in entries]


class _Reader:
    """One pass over the items: modelled ones become messages, the rest ride along."""

    def __init__(self) -> None:
        self.out: list[Message] = []
        self.entries: list[list[Any]] = []  # per message, its RESPONSES_KEY list (or _Plain)
        self.calls: list[ToolCall] = []  # the open run's calls
        self.pending: list[Any] = []  # unmodelled items waiting for their owner
        self.run_open = False  # the last modelled item was a function_call

    def add(self, item: dict[str, Any], i: int) -> None:
        kind = _kind(item, i)
        if kind == "function_call":
            call = ToolCall(
                id=_string(item, "call_id", i, empty=False),
                name=_string(item, "name", i),
                arguments=_string(item, "arguments", i),
            )
            entry = _entry("c", item, _CALL_KEYS, tuple(item) == _PLAIN_CALL)
            if self.run_open:
                self.entries[-1].extend([*self.pending, entry])
                self.calls.append(call)
            else:
                self._close_run()
                self.out.append(_RUN_OPEN)  # replaced when the run closes
                self.entries.append([*self.pending, entry])
                self.calls = [call]
                self.run_open = True
            self.pending = []
            return
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise InvalidMessageError(
                    f"a message item's role must be one of {', '.join(sorted(_MESSAGE_ROLES))}, "
                    f"got {describe(role)}",
                    index=i,
                )
            if "content" not in item:
                raise InvalidMessageError("a message item needs 'content'", index=i)
            content = _parts(item["content"], "content", i)
            message = self._message(role, content, None, i)
            plain = tuple(item) == _PLAIN_MESSAGE and item["type"] == "message"
            self._own(message, _entry("s", item, _MESSAGE_KEYS, plain, role, content))
            return
        if kind == "function_call_output":
            call_id = _string(item, "call_id", i, empty=False)
            if "output" not in item:
                raise InvalidMessageError("a function_call_output item needs 'output'", index=i)
            body = _parts(item["output"], "a function_call_output's output", i)
            message = self._message("tool", body, call_id, i)
            plain = tuple(item) == _PLAIN_OUTPUT
            self._own(message, _entry("s", item, _OUTPUT_KEYS, plain, "tool", body))
            return
        self.pending.append({"item": item})

    @staticmethod
    def _message(role: str, content: Content, call_id: str | None, i: int) -> Message:
        try:
            return Message(role, content, tool_call_id=call_id)
        except InvalidMessageError as exc:
            raise InvalidMessageError(str(exc), index=i) from None

    def _own(self, message: Message, entry: dict[str, Any] | _Plain) -> None:
        self._close_run()
        self.out.append(message)
        self.entries.append([*self.pending, entry])
        self.pending = []

    def _close_run(self) -> None:
        if self.run_open:
            self.out[-1] = Message("assistant", None, tool_calls=self.calls)
            self.run_open = False

    def finish(self) -> list[Message]:
        self._close_run()
        if self.pending and not self.out:
            self.out.append(Message("assistant", "", event_kind=CARRIER_KIND))
            self.entries.append([])
        if self.pending:
            self.entries[-1].extend(self.pending)
        out = []
        for m, entries in zip(self.out, self.entries, strict=True):
            written = _written(entries)
            out.append(m if written is None else m.replace(metadata={RESPONSES_KEY: written}))
        return out


def from_responses(items: Iterable[Any]) -> list[Message]:
    """Messages from OpenAI Responses API input items (the Agents SDK's session items).

    Message items become messages, each run of ``function_call`` items one assistant message
    with ``tool_calls``, each ``function_call_output`` a ``tool`` message; every other item and
    field is carried in the messages' ``metadata`` (see the module docstring), so that
    :func:`to_responses` gives the items back exactly. The items are copied.

    Raises:
        InvalidMessageError: ``items`` is not a list, or an item is malformed (not an object,
            no ``type``, a message item with an unknown role or no content, a function call
            without a string ``call_id``, ``name`` or ``arguments``...); the error names the
            item's index.

    """
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidMessageError(
            f"expected a list of Responses input items, got {describe(items)}"
        )
    reader = _Reader()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping) or not all(isinstance(k, str) for k in item):
            raise InvalidMessageError(
                f"a Responses input item must be an object with string keys, got {describe(item)}",
                index=i,
            )
        reader.add(copy.deepcopy(dict(item)), i)
    return reader.finish()


# -- to_responses ---------------------------------------------------------------------------


def _rebuild(shape: Any, modelled: dict[str, Any], index: int, dup: _Dup) -> dict[str, Any]:
    """The item of an entry written before entries were compact: its key order and the
    fields the message does not model, apart.
    """
    if (
        not isinstance(shape, Mapping)
        or not isinstance(shape.get("order"), list)
        or not isinstance(shape.get("fields"), Mapping)
    ):
        raise InvalidMessageError(
            f"metadata[{RESPONSES_KEY!r}] has a malformed entry {describe(shape)}", index=index
        )
    fields = shape["fields"]
    out: dict[str, Any] = {}
    for key in shape["order"]:
        if key in modelled:
            out[key] = modelled[key]
        elif key in fields:
            out[key] = dup(fields[key])
    for key, value in fields.items():
        out.setdefault(key, dup(value))
    for key, value in modelled.items():
        out.setdefault(key, value)
    return out


def _expand(compact: Any, modelled: dict[str, Any], index: int, dup: _Dup) -> dict[str, Any]:
    """The item of a compact entry (:func:`_compact`), its modelled values the message's."""
    if not isinstance(compact, Mapping):
        raise InvalidMessageError(
            f"metadata[{RESPONSES_KEY!r}] has a malformed entry {describe(compact)}", index=index
        )
    out = {k: modelled[k] if k in modelled else dup(v) for k, v in compact.items()}
    for key, value in modelled.items():  # (an entry written by hand may leave one out)
        out.setdefault(key, value)
    return out


def _part(part: Mapping[str, Any], assistant: bool) -> dict[str, Any]:
    """A Chat Completions content part as its Responses twin (others pass unchanged)."""
    kind = part.get("type")
    if kind == "text":
        return {"type": "output_text" if assistant else "input_text", "text": part.get("text", "")}
    if kind == "image_url":
        image = part.get("image_url") or {}
        return {
            "type": "input_image",
            "image_url": image.get("url", ""),
            "detail": image.get("detail", "auto"),
        }
    if kind == "file":
        return {"type": "input_file", **copy.deepcopy(dict(part.get("file") or {}))}
    return copy.deepcopy(dict(part))


def _fresh_content(m: Message) -> Content:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    parts = [p for p in m.content if p.get("type") not in THINKING_TYPES]
    if m.role == "assistant" and all(p.get("type") in ("text", "output_text") for p in parts):
        return m.text  # an easy assistant message takes text, not output parts
    return [_part(p, assistant=False) for p in parts]


def _fresh(m: Message) -> list[dict[str, Any]]:
    """Items for a message that never was one (Chat Completions, a summary...)."""
    if m.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": m.tool_call_id,
                "output": _fresh_content(m),
            }
        ]
    out: list[dict[str, Any]] = []
    content = _fresh_content(m)
    if not (m.tool_calls and content in ("", [])):
        out.append({"type": "message", "role": m.role, "content": content})
    out.extend(
        {"type": "function_call", "call_id": tc.id, "name": tc.name, "arguments": tc.arguments}
        for tc in m.tool_calls
    )
    return out


def _content_value(m: Message, dup: _Dup) -> Content:
    return dup(m.content) if m.content is not None else ""


_ENTRIES: dict[str, Callable[[Any, dict[str, Any], int, _Dup], dict[str, Any]]] = {
    "s": _expand,
    "c": _expand,
    "self": _rebuild,
    "call": _rebuild,
}
"""How each kind of entry for a modelled item gives it back: compact, or as written before."""
_SELF_ENTRIES = frozenset({"s", "self"})
_CALL_ENTRIES = frozenset({"c", "call"})


def _items_of(m: Message, index: int, dup: _Dup) -> list[dict[str, Any]]:
    entries = m.metadata.get(RESPONSES_KEY)
    if entries is None:
        return _fresh(m)
    if not isinstance(entries, list):
        raise InvalidMessageError(
            f"metadata[{RESPONSES_KEY!r}] must be a list, got {describe(entries)}", index=index
        )
    out: list[dict[str, Any]] = []
    calls = iter(m.tool_calls)
    stood_for_self = False
    for entry in entries:
        if not isinstance(entry, Mapping) or len(entry) != 1:
            raise InvalidMessageError(
                f"metadata[{RESPONSES_KEY!r}] has a malformed entry {describe(entry)}",
                index=index,
            )
        [(kind, value)] = entry.items()
        if kind == "item" and isinstance(value, Mapping):
            out.append(dup(dict(value)))
        elif kind in _CALL_ENTRIES:
            tc = next(calls, None)
            if tc is not None:  # a call no longer in the message is not sent
                modelled: dict[str, Any] = {
                    "call_id": tc.id,
                    "name": tc.name,
                    "arguments": tc.arguments,
                }
                out.append(_ENTRIES[kind](value, modelled, index, dup))
        elif kind in _SELF_ENTRIES:
            stood_for_self = True
            if m.role == "tool":
                modelled = {"call_id": m.tool_call_id, "output": _content_value(m, dup)}
            else:
                modelled = {"role": m.role, "content": _content_value(m, dup)}
            out.append(_ENTRIES[kind](value, modelled, index, dup))
        else:
            raise InvalidMessageError(
                f"metadata[{RESPONSES_KEY!r}] has a malformed entry {describe(entry)}",
                index=index,
            )
    # Calls added since the message was read get fresh items, after the recorded ones.
    out.extend(
        {"type": "function_call", "call_id": tc.id, "name": tc.name, "arguments": tc.arguments}
        for tc in calls
    )
    if not stood_for_self and m.role == "tool":
        out.extend(_fresh(m))
    return out


def to_responses(messages: Iterable[Any]) -> list[dict[str, Any]]:
    """A message list as OpenAI Responses API input items (fresh dicts).

    Messages read by :func:`from_responses` give back the items they stand for, in order,
    with every field they had; their modelled values (role, content, calls, outputs) come
    from the message as it is now. Other messages (Chat Completions dicts, ``Message``
    objects built by hand, pruner summaries) get fresh items: a ``message`` item (system and
    developer roles kept; an assistant's text parts joined into its text; Anthropic thinking
    parts left out), ``function_call`` items for tool calls and ``function_call_output`` items
    for tool results. ``name`` has no Responses field and is not sent.

    Args:
        messages: ``Message`` objects or OpenAI chat dicts.

    Raises:
        InvalidMessageError: a malformed message, or malformed ``metadata["responses_items"]``;
            the error names the message's index.

    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(coerce_messages(messages)):
        out.extend(_items_of(m, i, copy.deepcopy))
    return out


def _owned_to_responses(messages: list[Message]) -> list[dict[str, Any]]:
    """:func:`to_responses` for messages the caller owns and throws away once converted (a
    session adapter's fresh read): the items share their values with the messages instead
    of deep copies of them, which were 31% of the Agents SDK's ``get_items()``.
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(coerce_messages(messages)):
        out.extend(_items_of(m, i, _shared))
    return out


def _shared(value: Any) -> Any:
    return value


__all__ = ["CARRIER_KIND", "RESPONSES_KEY", "from_responses", "to_responses"]

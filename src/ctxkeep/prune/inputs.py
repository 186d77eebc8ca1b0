"""The pruner's input: ``Message`` objects or OpenAI dicts, read only where the pruner looks.

Most agent loops hold their history as OpenAI dicts, a list that grows by a turn's dicts each
turn. Making a validated :class:`~ctxkeep.messages.Message` of each costs 20-100 µs (its
content checked and deep-copied), 0.5 s for 10,000 of them, where a prune reads a few dozen.
So the pruner reads its input through a :class:`Reader`, one per pruner:

* A dict is validated and turned into a message only when the pruner reads it (the default
  mode's walk back from the newest message reads what it keeps; the cache-stable fold reads
  each message once, as the history grows). A malformed dict raises
  :class:`~ctxkeep.errors.InvalidMessageError` (naming its index) when it is read, as
  ``coerce_messages`` would; one that is never read is never checked.
* The message made from a dict is reused, with the token counts cached on it, while the dict
  is unchanged: the reader keeps it under ``id(dict)`` with a **snapshot** of the dict taken
  when it was read, and reuses it only if the dict still compares equal to the snapshot.
  Dicts are mutable and are not hashed, so the check is on content, not identity: every list
  and dict of the snapshot is a copy (a change to a nested list in place shows), strings and
  ``None`` are shared (immutable; compared by identity first, so an unchanged dict costs a few
  pointer comparisons per key, in C), and numbers and booleans are wrapped so that ``1``,
  ``1.0`` and ``True`` are different values to the check, as they are in JSON. An id reused
  by another dict is harmless: that dict is compared like any other. The reader holds
  ``size`` entries (oldest first out).

The snapshots are also what the cache-stable fold compares a history's prefix with
(:meth:`Reader.read` returns the message and its key: the snapshot for a dict, the message
itself for a ``Message``), so a dict changed anywhere in a folded history makes the fold
replay the history as it now is.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, is_
from typing import Any, Protocol, overload

from ctxkeep.errors import InvalidMessageError, describe
from ctxkeep.messages import SYSTEM_ROLES, Message, coerce_message

_ROLE = attrgetter("role")
_SCALARS = (int, float, bool, complex)


class Messages(Protocol):
    """What the pruner's walk needs of its message list: a ``list[Message]`` or a
    :class:`LazyMessages` (repairs write replacements back).
    """

    def __len__(self) -> int: ...

    def __getitem__(self, i: int, /) -> Message: ...

    def __setitem__(self, i: int, m: Message, /) -> None: ...

    def __iter__(self) -> Iterator[Message]: ...


class _Exact:
    """A number, boolean or other non-text leaf in a snapshot: equal only to the same value of
    the same type (``1 == True`` in Python, not in JSON).
    """

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return other is self.value or (type(other) is type(self.value) and other == self.value)

    __hash__ = None  # type: ignore[assignment]


def _snapshot(value: Any) -> Any:
    """A copy of ``value`` to compare it with later (see the module docstring)."""
    kind = type(value)
    if kind is str or value is None:
        return value
    if kind is dict:
        return {k: _snapshot(v) for k, v in value.items()}
    if kind is list:
        return [_snapshot(v) for v in value]
    if kind is tuple:
        return tuple(_snapshot(v) for v in value)
    if kind in _SCALARS:
        return _Exact(value)
    return _Exact(copy.deepcopy(value))


class _Never:
    """The key of an input the fold cannot check (not a dict or a message): equal to nothing."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]


def as_list(messages: Any) -> list[Any]:
    """The input as a list (a copy), refusing what is not a list of messages.

    Raises:
        InvalidMessageError: ``messages`` is a string, a mapping or not iterable.

    """
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidMessageError(f"expected a list of messages, got {describe(messages)}")
    return list(messages)


def unchanged(snapshot: Any, item: Any) -> bool:
    """Whether ``item`` still equals the ``snapshot`` taken of it (False if they cannot be
    compared: a value whose ``==`` raises is taken as changed).
    """
    try:
        return bool(snapshot == item)
    except Exception:
        return False


class Reader:
    """Reads a pruner's input messages, reusing each dict's message while it is unchanged."""

    def __init__(self, size: int = 65_536) -> None:
        self.size = size
        self._read: dict[int, tuple[Any, Message]] = {}
        self._lock = threading.Lock()
        self._memo: _Memo | None = None

    def read(self, item: Any, index: int) -> tuple[Message, Any]:
        """The message of input ``item`` (at ``index``) and its key for the fold.

        Raises:
            InvalidMessageError: a malformed message (the error names ``index``).

        """
        if type(item) is Message:
            return item, item
        if type(item) is not dict:
            return coerce_message(item, index=index), _Never()
        hit = self._read.get(id(item))
        if hit is not None and unchanged(hit[0], item):
            return hit[1], hit[0]
        m = coerce_message(item, index=index)
        try:
            snap = _snapshot(item)
        except Exception:
            return m, _Never()
        if not unchanged(snap, item):
            return m, _Never()  # a value not equal to its own copy (NaN...): never reused
        with self._lock:
            self._read[id(item)] = (snap, m)
            while len(self._read) > self.size:
                del self._read[next(iter(self._read))]
        return m, snap

    def message(self, item: Any, index: int) -> Message:
        """The message of input ``item`` (see :meth:`read`)."""
        if type(item) is Message:
            return item
        return self.read(item, index)[0]

    def view(self, messages: Any) -> View:
        """The input as the default mode reads it: a list it can index, the indexes of its
        system messages and its newest user message.

        ``Message`` objects come as they are; OpenAI dicts are read lazily
        (:class:`LazyMessages`), their roles taken from the dicts as they are now (a role
        that is not a known string is checked when its message is read). Any other item is
        read now. A list of ``Message`` objects that starts with the previous call's (the same
        objects: a history that grew) costs only its new messages.

        Raises:
            InvalidMessageError: ``messages`` is not a list of messages, or an item that is
                neither a ``Message`` nor a dict is malformed.

        """
        items = as_list(messages)
        memo = self._memo
        start = 0
        if memo is not None and len(items) >= len(memo.items) and all(map(is_, memo.items, items)):
            start = len(memo.items)
        tail = items[start:] if start else items
        if tail and type(tail[0]) is dict:
            try:  # one pass in C, refused (TypeError) by any item that is not a dict
                roles = list(map(dict.get, items, repeat("role")))
            except TypeError:
                pass
            else:
                return self._dict_view(items, roles)
        if set(map(type, tail)) <= {Message}:
            # Messages are immutable: what the previous list held still holds.
            system = list(memo.system) if start and memo is not None else []
            roles = list(map(_ROLE, tail))
            system += compress(range(start, len(items)), map(_IS_SYSTEM, roles))
            view = View(items, system, items, None if start else roles)
            user = view.last_user(len(items), stop=start)
            if user < 0 and start and memo is not None:
                user = memo.last_user
            view.newest_user = user
            self._memo = _Memo(items, list(system), user)
            return view
        lazy = LazyMessages(items, self)
        return self._dict_view(items, [_role_of(m, lazy, i) for i, m in enumerate(items)], lazy)

    def _dict_view(
        self, items: list[Any], roles: list[Any], lazy: LazyMessages | None = None
    ) -> View:
        """The view of an input holding dicts, from the roles of its items as given."""
        self._memo = None  # a dict's role can change in place: nothing carries over
        lazy = lazy if lazy is not None else LazyMessages(items, self)
        try:
            system = list(compress(range(len(items)), map(_IS_SYSTEM, roles)))
        except TypeError:  # a role that is not even hashable (its message raises when read)
            system = [i for i, r in enumerate(roles) if _is_system(r)]
        view = View(lazy, system, items, roles)
        view.newest_user = view.last_user(len(items))
        return view


_IS_SYSTEM = SYSTEM_ROLES.__contains__


def _is_system(role: Any) -> bool:
    try:
        return role in SYSTEM_ROLES
    except TypeError:  # unhashable: not a role at all (its message raises when read)
        return False


def _role_of(item: Any, msgs: Messages, i: int) -> Any:
    """The role of input ``item`` (at ``i``) without reading a dict (anything else is read)."""
    if type(item) is Message:
        return item.role
    if isinstance(item, dict):
        return item.get("role")
    return msgs[i].role


@dataclass
class _Memo:
    """What :meth:`Reader.view` found in the last all-``Message`` list it was given."""

    items: list[Any]
    system: list[int]
    last_user: int


@dataclass
class View:
    """An input list as the default mode reads it (see :meth:`Reader.view`)."""

    msgs: Messages
    """The messages, indexable (dicts read on first index)."""
    system: list[int]
    """Indexes of the system and developer messages."""
    items: list[Any]
    """The input items as given."""
    roles: list[Any] | None = None
    """The role of every item as given, where they were all read (dict inputs)."""
    newest_user: int = -1
    """Index of the newest message whose role is ``user`` (-1 if none)."""

    def last_user(self, before: int, stop: int = 0) -> int:
        """Index of the newest ``user`` message in ``[stop, before)``, or -1."""
        if self.roles is not None:
            # A reverse scan in C: the newest user message can be thousands of tool steps back.
            head = self.roles[stop:before]
            try:
                return before - 1 - head[::-1].index("user")
            except ValueError:
                return -1
        for j in range(before - 1, stop - 1, -1):
            if _role_of(self.items[j], self.msgs, j) == "user":
                return j
        return -1


class LazyMessages(Sequence[Message]):
    """A pruner's view of an input list holding dicts: each read (and validated) on first
    index, through the pruner's :class:`Reader`; repairs write their replacements here.
    """

    __slots__ = ("_items", "_msgs", "_reader")

    def __init__(
        self, items: list[Any], reader: Reader, msgs: list[Message | None] | None = None
    ) -> None:
        self._items = items
        self._reader = reader
        self._msgs: list[Message | None] = [None] * len(items) if msgs is None else msgs

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> Message: ...

    @overload
    def __getitem__(self, i: slice) -> list[Message]: ...

    def __getitem__(self, i: int | slice) -> Message | list[Message]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._items)))]
        m = self._msgs[i]
        if m is None:
            j = i if i >= 0 else i + len(self._items)
            m = self._msgs[i] = self._reader.message(self._items[j], j)
        return m

    def __setitem__(self, i: int, m: Message) -> None:
        self._msgs[i] = m

    def __iter__(self) -> Iterator[Message]:
        for i in range(len(self._items)):
            yield self[i]

    def with_originals(self, originals: dict[int, Message]) -> LazyMessages:
        """The input as given: the messages read so far, ``originals`` in place of repairs."""
        msgs = list(self._msgs)
        for j, m in originals.items():
            msgs[j] = m
        return LazyMessages(self._items, self._reader, msgs)


__all__: list[str] = []

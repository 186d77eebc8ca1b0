"""A session's messages converted to a framework's items, kept encoded between reads.

A framework's own store gives back what it was given: the Agents SDK's ``SQLiteSession``
parses one JSON text per item. ctxkeep stores messages, so an adapter converts every message
on every read (decode the record, build the message, convert it). :class:`ConvertedItems`
keeps each message's items as JSON bytes, keyed by the message's seq, and checks them against
the store on each read the way the manager's prompt cache does: one snapshot gives the
session's generation, revision and first seq with the rows appended since the newest seq
held; another generation or revision (a session made again, a message taken back) drops
them all, a trim drops those below the first seq. So a read decodes only the messages it has
not seen, and hands the caller new objects parsed from the bytes (nothing shared between
reads).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ctxkeep.errors import InvalidMessageError, SessionChangedError, describe
from ctxkeep.messages import Content, Message
from ctxkeep.responses import CARRIER_KIND, RESPONSES_KEY, _Reader, _written
from ctxkeep.sessions import MemoryManager
from ctxkeep.sessions.records import SessionInfo, record_to_message


@dataclass
class _Held:
    generation: str
    revision: int
    next_seq: int = 0
    """The session's next seq when last seen (an append by this process follows it)."""
    seqs: list[int] = field(default_factory=list)
    """The seq of each message held, ascending."""
    items: list[list[bytes]] = field(default_factory=list)
    """Each held message's items, each as JSON bytes."""


class ConvertedItems:
    """One session's items, converted by ``convert`` (a message to its items, JSON-ready
    values) and kept encoded; :meth:`read` gives them all, or the newest ``limit``.
    """

    def __init__(
        self,
        memory: MemoryManager,
        session_id: str,
        convert: Callable[[Message], list[Any]],
    ) -> None:
        self.memory = memory
        self.session_id = session_id
        self.convert = convert
        self._held: _Held | None = None
        # The newest message as this instance last wrote it, (generation, seq, message),
        # where nothing is held (an adapter that only writes, as the SDK's Runner does
        # between reads): a pop after an add then takes it back in one write, with no read
        # of the newest message first. The message is the very object the write stored,
        # made for it alone (an adapter's owned conversion) and shared with no one; the
        # write compares seq and generation inside its transaction (a seq is not reused
        # within a generation), so a memo another writer made stale only costs that write.
        # With it the items it was converted from, last (this instance's own copies, shared
        # with no one outside it), or None: a pop then converts the message back.
        self._newest: tuple[str, int, Message, list[Any] | None] | None = None
        # The next append's newest message and the items it was converted from (this
        # instance's copies, :func:`owned_conversion`), set by :meth:`expect`.
        self._expected: tuple[Message, list[Any]] | None = None
        self._lock = threading.Lock()

    def read(self, limit: int | None = None) -> list[Any]:
        """The session's items, oldest first (the newest ``limit`` if given), new objects.

        Raises:
            SessionNotFoundError: unknown, deleted or expired session.

        """
        with self._lock:
            held = self._refresh()
            start = 0
            if limit is not None:  # from the newest message back until it holds enough items
                start, n = len(held.items), 0
                while start > 0 and n < limit:
                    start -= 1
                    n += len(held.items[start])
            parts = [item for items in held.items[start:] for item in items]
            if limit is not None:
                parts = parts[max(len(parts) - limit, 0) :] if limit else []
        return list(orjson.loads(b"[" + b",".join(parts) + b"]"))

    @property
    def warm(self) -> bool:
        """Whether anything is held (else a read reads the whole session)."""
        return self._held is not None

    def pop(
        self,
        replace: Callable[[int, str, list[Any]], tuple[list[Message], list[int]]],
    ) -> tuple[bool, Any]:
        """Take back the newest item held in one write: ``replace(seq, generation, rest)``
        replaces the newest message held (at ``seq`` of ``generation``, compared inside its
        transaction) by one standing for its items but the last, ``rest`` (and returns the
        stored messages and their seqs). Then what is held follows the write.

        Returns:
            ``(True, item)`` with the item taken back; ``(False, None)`` when nothing is held
            or the newest message held is no longer the session's (the caller reads and
            pops as usual; nothing is held after it).

        Raises:
            SessionNotFoundError: the session is gone.

        """
        return self.rewrite(_without_last, replace)

    def expect(self, messages: list[Message], items: list[Any]) -> None:
        """Before an append of ``messages`` converted from ``items`` (:func:`owned_conversion`:
        copies made for this instance alone, ``messages`` not empty): :meth:`appended` keeps
        them with the newest message, so that a pop takes back an item without converting
        the message back.
        """
        self._expected = (messages[-1], items)

    def newest_has_calls(self) -> bool:
        """Whether the newest message in hand (the newest held, or, where nothing is held,
        the one this instance wrote last) stands for ``function_call`` items.
        """
        with self._lock:
            held = self._held
            if held is not None and held.seqs:
                items = orjson.loads(b"[" + b",".join(held.items[-1]) + b"]")
                return any(item.get("type") == "function_call" for item in items)
            return self._newest is not None and bool(self._newest[2].tool_calls)

    def rewrite(
        self,
        edit: Callable[[list[Any]], tuple[list[Any], Any] | None],
        replace: Callable[[int, str, list[Any]], tuple[list[Message], list[int]]],
    ) -> tuple[bool, Any]:
        """Replace the newest message held (or the one this instance wrote last, where
        nothing is held) in one write: ``edit(items)`` gives the items to stand in its
        place and a result, or None to leave it be; ``replace(seq, generation, new_items)``
        writes them as :meth:`pop` says. Then what is held follows the write.

        Returns:
            ``(True, result)``; ``(False, None)`` when no newest message is in hand, ``edit``
            left it, or it is no longer the session's newest (the caller reads as usual).

        Raises:
            SessionNotFoundError: the session is gone.

        """
        with self._lock:
            held = self._held
            if held is None or not held.seqs:
                return self._rewrite_newest(edit, replace)
            seq, items = held.seqs[-1], held.items[-1]
            edited = edit(orjson.loads(b"[" + b",".join(items) + b"]"))
            if edited is None:
                return False, None
            new_items, result = edited
            self._newest = None
            try:
                stored, seqs = replace(seq, held.generation, new_items)
            except SessionChangedError:
                self._held = None
                return False, None
            except BaseException:
                self._held = None
                raise
            # The write found the session as held (its newest message at seq, the same
            # generation): it is now that less the newest, plus what replaced it.
            held.revision += 1
            del held.seqs[-1], held.items[-1]
            if seqs:
                self._extend(held, seqs, stored)
            return True, result

    def _rewrite_newest(
        self,
        edit: Callable[[list[Any]], tuple[list[Any], Any] | None],
        replace: Callable[[int, str, list[Any]], tuple[list[Message], list[int]]],
    ) -> tuple[bool, Any]:
        """:meth:`rewrite` of the newest message this instance wrote (:attr:`_newest`), where
        nothing is held; ``(False, None)`` without one, or where the session's newest message
        is no longer it (the caller reads as usual).
        """
        newest = self._newest
        if newest is None:
            return False, None
        generation, seq, message, made_of = newest
        # The items kept with the message (copies this instance made), or it converted
        # sharing its values: either way they are dropped here, the rest are copied by the
        # replacement's conversion, and the result is the caller's alone.
        items = None if made_of is None else _newest_items(message, made_of)
        edited = edit(items if items is not None else self.convert(message))
        if edited is None:
            return False, None
        new_items, result = edited
        self._newest = None
        try:
            stored, seqs = replace(seq, generation, new_items)
        except SessionChangedError:
            return False, None
        if stored:
            # The replacement was converted from new_items, copying them: they are this
            # instance's alone only if the items edited were (an edit may add the caller's).
            self._newest = (
                generation,
                seqs[-1],
                stored[-1],
                new_items if items is not None else None,
            )
        return True, result

    def replaced(self, info: SessionInfo, seq: int, stored: list[Message], seqs: list[int]) -> None:
        """After this process replaced the session's newest message, at ``seq`` (compared
        with the generation inside the write) when the session was ``info``, by ``stored``
        at ``seqs``: where what is held was the session as ``info`` found it, it follows the
        write as after :meth:`pop`; else the next read reads again.
        """
        with self._lock:
            self._remember(info, seqs, stored)
            held = self._held
            if (
                held is not None
                and held.seqs
                and held.seqs[-1] == seq
                and (held.generation, held.revision, held.next_seq)
                == (info.generation, info.revision, info.next_seq)
            ):
                held.revision += 1
                del held.seqs[-1], held.items[-1]
                self._extend(held, seqs, stored)

    def appended(self, info: SessionInfo, seqs: list[int], messages: list[Message]) -> None:
        """After this process's append (:data:`~ctxkeep.sessions.base.OnAppend`): where the
        append found the session as held (generation, revision, next seq) and its messages
        came right after the newest held, what is held takes them; else the next read reads
        them. ``info`` is the state the append was checked on, which may be the one this
        process last saw: on PostgreSQL and Redis an append whose check holds on it is
        stored whatever others appended since, under the seqs after theirs, so the seqs
        given are what shows another writer's messages in between.
        """
        with self._lock:
            expected, self._expected = self._expected, None
            made_of = None  # the items, where the newest message is the one expected
            if expected is not None and messages and expected[0] is messages[-1]:
                made_of = expected[1]
            self._remember(info, seqs, messages, made_of)
            held = self._held
            if (
                held is not None
                and seqs
                and seqs[0] == held.next_seq
                and (held.generation, held.revision, held.next_seq)
                == (info.generation, info.revision, info.next_seq)
            ):
                self._extend(held, seqs, messages)

    def _remember(
        self,
        info: SessionInfo,
        seqs: list[int],
        messages: list[Message],
        made_of: list[Any] | None = None,
    ) -> None:
        """After this instance's write of ``messages`` at ``seqs`` into the session of
        ``info``'s generation: the newest of them is the session's newest message (None
        where the write left none of its own: the newest is then one not in hand), kept with
        the items it was made of where they are given (this instance's copies, :meth:`expect`).
        """
        self._newest = (
            (info.generation, seqs[-1], messages[-1], made_of) if seqs and messages else None
        )

    def _extend(self, held: _Held, seqs: list[int], messages: list[Message]) -> None:
        for s, message in zip(seqs, messages, strict=True):
            held.seqs.append(s)
            held.items.append([orjson.dumps(item) for item in self.convert(message)])
            held.next_seq = s + 1

    def forget(self) -> None:
        """Drop what is held (the next read reads the whole session)."""
        with self._lock:
            self._held = None
            self._newest = self._expected = None

    def _refresh(self) -> _Held:
        reads = self.memory.reads
        sid = self.session_id
        held = self._held
        try:
            info, rows = reads.since(sid, held.seqs[-1] if held and held.seqs else 0)
            if held is not None and (held.generation, held.revision) != (
                info.generation,
                info.revision,
            ):
                held = None  # another session under this id, or messages taken back
                info, rows = reads.since(sid)
            reads.accessed(sid, info)
        except Exception:
            self._held = None
            raise
        if held is None:
            held = _Held(info.generation, info.revision)
        held.next_seq = info.next_seq
        keep = bisect_left(held.seqs, info.first_seq)  # trimmed since: not held any more
        if keep:
            del held.seqs[:keep], held.items[:keep]
        for seq, record in rows:
            if seq < info.first_seq:  # passed by a trim, not yet removed
                continue
            message = record_to_message(record, session_id=sid, seq=seq)
            held.seqs.append(seq)
            held.items.append([orjson.dumps(item) for item in self.convert(message)])
        self._held = held
        return held


def _newest_items(message: Message, items: list[Any]) -> list[Any] | None:
    """The items ``message`` stands for, where it is the last message converted from
    ``items`` (in order): the last as many as its metadata's entries, one an item, or, with
    none (every item plain), one per call or the one it is (None where that does not fit).
    """
    entries = message.metadata.get(RESPONSES_KEY)
    if entries is None:
        n = len(message.tool_calls) or 1
    else:
        n = len(entries) if type(entries) is list else 0
    return items[-n:] if 0 < n <= len(items) else None


def _without_last(items: list[Any]) -> tuple[list[Any], Any]:
    """A pop's edit: the items but the last, and the last (None when there are none)."""
    return items[:-1], items[-1] if items else None


# -- Responses items to messages, once ------------------------------------------------------

_DEFAULTS: dict[str, Any] = {
    f.name: None if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(Message)
}


def _owned_message(role: str, content: Content, **fields: Any) -> Message:
    """A new message made of values this process owns (copied from the caller's items once):
    checked as a new message is, not copied again.
    """
    return Message._from_owned({**_DEFAULTS, "role": role, "content": content, **fields})


class _OwnedReader(_Reader):
    """:func:`~ctxkeep.from_responses`'s reader over items it was given copies of: each
    message is made and checked once, its metadata set in place, where ``from_responses``
    makes it, then a copy of it with the metadata (validated and deep-copied again).
    """

    @staticmethod
    def _message(role: str, content: Content, call_id: str | None, i: int) -> Message:
        try:
            return _owned_message(role, content, tool_call_id=call_id)
        except InvalidMessageError as exc:
            raise InvalidMessageError(str(exc), index=i) from None

    def _close_run(self) -> None:
        if self.run_open:
            self.out[-1] = _owned_message("assistant", None, tool_calls=self.calls)
            self.run_open = False

    def finish(self) -> list[Message]:
        self._close_run()
        if self.pending and not self.out:
            self.out.append(_owned_message("assistant", "", event_kind=CARRIER_KIND))
            self.entries.append([])
        if self.pending:
            self.entries[-1].extend(self.pending)
        for m, entries in zip(self.out, self.entries, strict=True):
            written = _written(entries)
            if written is not None:  # made here, shared with no one
                m.__dict__["metadata"] = {RESPONSES_KEY: written}
        return self.out


def owned_from_responses(items: Iterable[Any]) -> list[Message]:
    """:func:`~ctxkeep.from_responses` (the same messages, the same errors) for an adapter
    that gives the messages up to the store (``owned=True``): the items are copied once and
    each message is checked once, not copied and checked again for its metadata.
    """
    return owned_conversion(items)[0]


def owned_conversion(items: Iterable[Any]) -> tuple[list[Message], list[dict[str, Any]]]:
    """:func:`owned_from_responses`, and the copies of the items the messages were made of
    (deep copies: nothing shared with ``items``; a message may share values with them).
    """
    if type(items) is not list and (
        isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable)
    ):
        raise InvalidMessageError(
            f"expected a list of Responses input items, got {describe(items)}"
        )
    reader = _OwnedReader()
    copies: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        # (a dict, the common case, without the ABC check; its keys in one loop)
        if (type(item) is not dict and not isinstance(item, Mapping)) or not _str_keys(item):
            raise InvalidMessageError(
                f"a Responses input item must be an object with string keys, got {describe(item)}",
                index=i,
            )
        try:
            copied = _json_copy(item)
        except RecursionError:  # nested too deep, or a cycle: as from_responses copies it
            copied = copy.deepcopy(dict(item))
        reader.add(copied, i)
        copies.append(copied)
    return reader.finish(), copies


def _str_keys(item: Mapping[Any, Any]) -> bool:
    """Whether every key of ``item`` is a string (plain ones tested by C loops alone)."""
    return _STR.issuperset(map(type, item)) or all(isinstance(k, str) for k in item)


_STR = frozenset({str})


def _json_copy(item: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``item``: plain JSON values copied directly, anything else by
    ``copy.deepcopy`` (as ``from_responses`` copies every item).
    """
    out = dict(item)
    for k, v in out.items():
        if type(v) not in _SCALARS:  # (an item's values are mostly strings: no call for them)
            out[k] = _copy_value(v)
    return out


_SCALARS = frozenset({str, int, float, bool, type(None)})
"""The types of immutable JSON values (exact types: a subclass is deep-copied)."""


def _copy_value(value: Any) -> Any:
    t = type(value)
    if t in _SCALARS:
        return value
    if t is dict:
        return {k: v if type(v) in _SCALARS else _copy_value(v) for k, v in value.items()}
    if t is list:
        return [v if type(v) in _SCALARS else _copy_value(v) for v in value]
    return copy.deepcopy(value)

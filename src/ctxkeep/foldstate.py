"""The state of a cache-stable fold at its frontier, as a store of sessions keeps it.

:class:`FoldState` is what :mod:`ctxkeep.prune.stable`'s fold is right after a cut, in
indexes, with its stored form; :class:`Unread` stands in the places of the messages a seeded
fold did not read; :class:`FoldMismatch` says a state does not describe the history it was
given. The fold itself (``_StableFolds.plan_state`` takes a state as its seed) is in
:mod:`ctxkeep.prune.stable`; the settings a snapshot is keyed by,
:func:`~ctxkeep.prune.snapshots.fold_params`. This module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ctxkeep.errors import describe

if TYPE_CHECKING:
    from ctxkeep.prune.stable import _Fold

FOLD_FORMAT = 2
"""The version of the fold's rules and of :class:`FoldState`'s stored form: part of every
snapshot's key (:func:`fold_params`), so bump it whenever either changes."""


class FoldMismatch(Exception):
    """A :class:`FoldState` that does not describe the history it was given (the caller
    replays the whole history instead).
    """


class UnreadMessageTouched(AssertionError):
    """A fold seeded from a snapshot used a message it did not read: a bug, never an input."""


class Unread:
    """History messages a seeded fold does not read, in their places in the list (one object
    may fill every such place of one read): any attribute read raises
    :class:`UnreadMessageTouched`; it is equal only to itself, so a fold keyed on it matches
    the lists made from the same read, never another history.
    """

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __getattr__(self, name: str) -> Any:
        raise UnreadMessageTouched(
            f"a message {self.where} was not read, yet the pruner used it ({name})"
        )

    def __repr__(self) -> str:
        return f"<unread: a message {self.where}>"


@dataclass(frozen=True, kw_only=True)
class FoldState:
    """A cache-stable fold's state at its frontier, in input indexes: what a snapshot keeps.

    Everything before :attr:`window_start` that the fold still needs is named here (the system
    messages and the pinned user message); the messages from the window on are all needed.
    """

    frontier: int
    """Input messages folded."""
    cut_end: int
    """The last cut's end: messages before it stay as they are until the next cut."""
    system: tuple[int, ...]
    """The system messages kept (every one with content), in order."""
    units: tuple[tuple[int, tuple[int, ...], bool], ...]
    """The window: ``(start, members, tool)`` of every unit from the cut on, oldest first."""
    pinned: int | None
    """The user message kept from before the window, if any."""
    compressed: tuple[int, ...]
    """The messages in the prompt in their compressed form."""
    last_user: int
    """The newest user message folded (-1: none)."""
    total: int
    """Tokens of the prompt (priming included)."""
    notes: tuple[str, ...]
    """What the last cut did."""
    empty: tuple[int, ...]
    """Messages with no content, dropped."""
    orphans: tuple[int, ...]
    """Tool results with no call, dropped."""
    head: tuple[tuple[int, tuple[int, ...], bool], ...] = ()
    """The conversation's head (``keep_first``): ``(start, members, tool)`` of each of its
    units, oldest first; in no window."""
    head_out: tuple[int, ...] = ()
    """Starts of the head units the last cut left out."""
    first_user: int = -1
    """The first user message with content (-1: none yet, or ``keep_first=0``)."""

    @property
    def window_start(self) -> int:
        """The first message of the window (the frontier if the window is empty)."""
        return self.units[0][0] if self.units else self.frontier

    @property
    def needed(self) -> list[int]:
        """The messages before the window the fold reads: the system ones, the pinned one and
        the head's (every message of its units).
        """
        lo = self.window_start
        out = {i for i in self.system if i < lo}
        if self.pinned is not None:
            out.add(self.pinned)
        out |= {j for _, members, _ in self.head for j in members if j < lo}
        return sorted(out)

    @classmethod
    def of(cls, fold: _Fold) -> FoldState | None:
        """The state of ``fold``, or None where a snapshot would not stand for it: no cut
        yet (a replay reads little), the budget exceeded, or repairs a state does not hold
        (messages rewritten, synthetic results).
        """
        if fold.error is not None or fold.cut_end == 0 or fold.fix.originals or fold.fix.notes:
            return None
        if fold.open:
            return None  # holds only for some histories that follow it
        pinned = fold.pinned
        if any(u.synthetic or u.pinned for u in fold.units) or (
            pinned is not None and (pinned.synthetic or pinned.members != [pinned.start])
        ):
            return None
        if any(
            u.synthetic or u.members != list(range(u.start, u.start + len(u.members)))
            for u in fold.head
        ):
            return None  # a seed rebuilds each head unit from its own messages
        return cls(
            frontier=len(fold.keys),
            cut_end=fold.cut_end,
            system=tuple(fold.system),
            units=tuple((u.start, tuple(u.members), u.tool) for u in fold.units),
            pinned=None if pinned is None else pinned.start,
            compressed=tuple(sorted(fold.compressed)),
            last_user=fold.last_user,
            total=fold.total,
            notes=tuple(fold.notes),
            empty=tuple(sorted(fold.fix.empty)),
            orphans=tuple(sorted(fold.fix.orphans)),
            head=tuple((u.start, tuple(u.members), u.tool) for u in fold.head),
            head_out=tuple(sorted(fold.head_out)),
            first_user=fold.first_user,
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (:meth:`from_json` reads it back)."""
        return {
            "frontier": self.frontier,
            "cut_end": self.cut_end,
            "system": list(self.system),
            "units": [[s, list(m), t] for s, m, t in self.units],
            "pinned": self.pinned,
            "compressed": list(self.compressed),
            "last_user": self.last_user,
            "total": self.total,
            "notes": list(self.notes),
            "empty": list(self.empty),
            "orphans": list(self.orphans),
            "head": [[s, list(m), t] for s, m, t in self.head],
            "head_out": list(self.head_out),
            "first_user": self.first_user,
        }

    @classmethod
    def from_json(cls, data: Any) -> FoldState:
        """The state :meth:`to_json` wrote.

        Raises:
            FoldMismatch: ``data`` is not such a dict.

        """
        try:
            units = tuple((_int(s), _ints(m), _bool(t)) for s, m, t in data["units"])
            head = tuple((_int(s), _ints(m), _bool(t)) for s, m, t in data["head"])
            notes = data["notes"]
            if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
                raise TypeError("notes")
            pinned = data["pinned"]
            return cls(
                frontier=_int(data["frontier"]),
                cut_end=_int(data["cut_end"]),
                system=_ints(data["system"]),
                units=units,
                pinned=None if pinned is None else _int(pinned),
                compressed=_ints(data["compressed"]),
                last_user=_int(data["last_user"]),
                total=_int(data["total"]),
                notes=tuple(notes),
                empty=_ints(data["empty"]),
                orphans=_ints(data["orphans"]),
                head=head,
                head_out=_ints(data["head_out"]),
                first_user=_int(data["first_user"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FoldMismatch(f"not a fold state: {exc!r}") from None


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an int, got {describe(value)}")
    return value


def _bool(value: Any) -> bool:
    if type(value) is not bool:
        raise TypeError(f"expected a bool, got {describe(value)}")
    return value


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {describe(value)}")
    return tuple(_int(v) for v in value)


__all__ = [
    "FOLD_FORMAT",
    "FoldMismatch",
    "FoldState",
    "Unread",
    "UnreadMessageTouched",
]

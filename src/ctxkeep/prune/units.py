"""The walk: a history cut into units, its tool-call sequences checked and repaired on the way.

A **unit** is an assistant message with ``tool_calls`` together with all of its results, or any
other single message; the pruner keeps, compresses or drops units whole, so its output is always
a valid provider sequence. :meth:`_Walk._units_backwards` yields the units from the newest
back, so a prune reads only as far as what it keeps; the cache-stable fold
(:mod:`ctxkeep.prune.stable`) walks the messages added since its frontier with the same method.

A damaged history is repaired as it is walked, each repair recorded in a :class:`_Repairs` for
the report (with ``repair=False``, refused with a typed error instead). A :class:`_Plan` is what
planning hands to the output step: the units kept, the messages compressed, what was dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctxkeep.errors import InvalidMessageError, MissingToolResultError, OrphanToolResultError
from ctxkeep.messages import Message, ToolCall, missing_content
from ctxkeep.prune.config import Configured
from ctxkeep.prune.inputs import Messages

_NO_RESULT = "[ctxkeep: no result was recorded for this tool call]"


@dataclass
class _Unit:
    start: int
    members: list[int]  # input indexes, in order
    tool: bool
    pinned: bool = False
    synthetic: list[Message] = field(default_factory=list)  # results made up for missing ones
    head: bool = False  # part of the conversation's head, kept in every prompt (keep_first)


@dataclass
class _Repairs:
    """What the walk repaired in a damaged history (reported; see ``repair``)."""

    orphans: list[int] = field(default_factory=list)  # tool results with no call: dropped
    empty: set[int] = field(default_factory=set)  # messages with no content: dropped
    originals: dict[int, Message] = field(default_factory=dict)  # input messages replaced
    notes: list[str] = field(default_factory=list)


@dataclass
class _Plan:
    msgs: Messages
    system: list[int]
    kept: list[_Unit]  # newest first
    compressed: dict[int, Message]
    dropped_units: list[_Unit]  # units dropped, as far as the walk went
    rest: Any  # the walk's remaining units (all dropped), consumed only when needed
    user_idx: int  # the pinned newest user message, or -1
    pending: _Unit | None
    total: int
    notes: list[str]
    budget_for_summary: int
    fix: _Repairs
    stable_before: int | None = None  # cache-stable: inputs before this index are a stable prefix


class _Walk(Configured):
    """The walk over a history's units: the first layer of :class:`~ctxkeep.TokenPruner`
    (its settings read from its config: :class:`~ctxkeep.prune.config.Configured`).
    """

    def _units_backwards(
        self,
        msgs: Messages,
        sys_set: set[int],
        fix: _Repairs,
        lo: int = 0,
        hi: int | None = None,
    ) -> Any:
        """Yield ``(unit, state)`` from the newest back, checking tool sequences as it goes.

        ``state`` is ``"pending"`` for a trailing tool call whose results have not arrived
        (never part of a prompt), else None. With ``repair``, a call left unanswered in the
        middle of the history gets a synthetic result, a result with no call is dropped (its
        index goes to ``fix.orphans``), duplicate call ids of one message are made distinct
        and a message with no content is dropped (a tool result gets ``""``); without it
        each raises. Repaired messages replace their originals in ``msgs`` (the pruner's own
        list; ``fix.originals`` keeps the input's for the report).

        The walk covers ``msgs[lo:hi]`` (``hi`` defaults to the end). ``lo`` must be a unit
        boundary (the cache-stable fold walks only the messages added since its frontier);
        with ``hi`` given, the range ends at a unit boundary too and nothing in it is pending.
        """
        i = (len(msgs) if hi is None else hi) - 1
        first = hi is None
        while i >= lo:
            if i in sys_set:
                i -= 1
                continue
            m = msgs[i]
            if m.role == "tool" or m.tool_calls:
                members: list[int] = []
                while i >= lo and msgs[i].role == "tool":
                    members.append(i)
                    i -= 1
                owner = msgs[i] if i >= lo and i not in sys_set else None
                if owner is None or not owner.tool_calls:
                    # Results with no call right before them.
                    if not self.repair:
                        j = members[-1]
                        raise OrphanToolResultError(
                            f"tool result for {msgs[j].tool_call_id!r} has no assistant tool "
                            "call before it",
                            index=j,
                            tool_call_id=msgs[j].tool_call_id,
                        )
                    fix.orphans.extend(members)
                    continue
                call_ids = [tc.id for tc in owner.tool_calls]
                if len(call_ids) > 1 and len(set(call_ids)) < len(call_ids):
                    call_ids = self._distinct_ids(msgs, i, members, fix)
                answered: set[str] = set()
                kept_members: list[int] = []
                for j in reversed(members):
                    tid = msgs[j].tool_call_id or ""
                    if tid in call_ids and tid not in answered:
                        answered.add(tid)
                        kept_members.append(j)
                        if missing_content(msgs[j]):
                            self._blank(msgs, j, fix)
                    elif self.repair:
                        fix.orphans.append(j)
                    else:
                        raise OrphanToolResultError(
                            f"tool result for {tid!r} does not answer a call of the assistant "
                            f"message {i} before it",
                            index=j,
                            tool_call_id=tid,
                        )
                missing = [c for c in call_ids if c not in answered]
                unit = _Unit(i, [i, *kept_members], tool=True)
                if missing and first:
                    yield unit, "pending"
                elif missing and not self.repair:
                    raise MissingToolResultError(
                        f"assistant tool call {missing[0]!r} has no result",
                        index=i,
                        tool_call_id=missing[0],
                    )
                else:
                    unit.synthetic = [
                        Message(
                            "tool",
                            _NO_RESULT,
                            tool_call_id=c,
                            event_kind="synthetic_tool_result",
                            metadata={"ctxkeep_synthetic": True},
                        )
                        for c in missing
                    ]
                    yield unit, None
                i -= 1
            else:
                if not (missing_content(m) and self._drop_empty(msgs, i, fix)):
                    yield _Unit(i, [i], tool=False), None
                i -= 1
            first = False

    def _distinct_ids(self, msgs: Messages, i: int, members: list[int], fix: _Repairs) -> list[str]:
        """Give the calls of message ``i`` that share an id distinct ids (``<id>_2``...); the
        k-th result for a shared id (in input order) answers its k-th call. Returns the ids.
        """
        owner = msgs[i]
        ids = [tc.id for tc in owner.tool_calls]
        if not self.repair:
            dup = next(c for k, c in enumerate(ids) if c in ids[:k])
            raise InvalidMessageError(
                f"duplicate tool call id {dup!r}: the tool calls of one message need distinct ids",
                index=i,
            )
        taken = set(ids)
        renamed: dict[str, list[str]] = {}  # original id -> the id of each call, in order
        new_ids: list[str] = []
        for c in ids:
            seen = renamed.setdefault(c, [])
            new = c
            n = len(seen) + 1
            while seen and new in taken:
                new = f"{c}_{n}"
                n += 1
            taken.add(new)
            seen.append(new)
            new_ids.append(new)
        fix.originals.setdefault(i, owner)
        msgs[i] = owner.replace(
            tool_calls=[
                ToolCall(id=new, name=tc.name, arguments=tc.arguments)
                for tc, new in zip(owner.tool_calls, new_ids, strict=True)
            ]
        )
        answered: dict[str, int] = {}
        for j in reversed(members):  # input order
            tid = msgs[j].tool_call_id or ""
            targets = renamed.get(tid)
            if targets is None:
                continue
            k = answered.get(tid, 0)
            answered[tid] = k + 1
            if k < len(targets) and targets[k] != tid:
                fix.originals.setdefault(j, msgs[j])
                msgs[j] = msgs[j].replace(tool_call_id=targets[k])
        changes = [
            f"{old!r} -> {new!r}" for old, new in zip(ids, new_ids, strict=True) if old != new
        ]
        fix.notes.append(
            f"gave duplicate tool call ids of message {i} distinct ids ({', '.join(changes)}), "
            "each with its result"
        )
        return new_ids

    def _drop_empty(self, msgs: Messages, i: int, fix: _Repairs) -> bool:
        """True if message ``i`` has no content and is to be dropped (or raise, no repair)."""
        m = msgs[i]
        if not missing_content(m):
            return False
        if not self.repair:
            raise InvalidMessageError(
                f"a {m.role} message needs content, not {m.content!r}", index=i
            )
        fix.empty.add(i)
        return True

    def _blank(self, msgs: Messages, j: int, fix: _Repairs) -> None:
        """Give tool result ``j``, which has no content, an empty text (or raise)."""
        if not self.repair:
            raise InvalidMessageError(
                f"a tool message needs content, not {msgs[j].content!r}", index=j
            )
        fix.originals.setdefault(j, msgs[j])
        msgs[j] = msgs[j].replace(content="")
        fix.notes.append(f"gave tool result {j}, which had no content, an empty text")

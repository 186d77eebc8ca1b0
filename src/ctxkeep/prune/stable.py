"""Prompts a provider cache can hit: the cache-stable pruning fold.

Providers discount the part of a prompt that repeats the start of an earlier request
(Anthropic bills cache reads at 0.1x the input price and cache writes at 1.25x; OpenAI bills
cached input at 0.5x or less). A pruner that drops the oldest message every turn changes the
start of the prompt every turn, so nothing is ever read from a cache.

**The cache-stable mode** (``TokenPruner(cache_stable=True)``) prunes in jumps: when the
prompt would exceed the budget, it is cut down to a low-water mark (``low_water`` of the
budget) and then only grows, each new message appended, until the budget is full again. Between
two cuts every prompt starts with the previous one, byte for byte.

*Which* prompt a history gets is a pure function of the history, not of the calls that came
before: the pruner replays the history message by message as it grew (a fold), cutting where
the budget overflowed. A replay is incremental: the fold state of a history is kept (a few
histories, least recently used first out) and reused when the next history starts with the
same messages (the same objects, or equal ones), so a turn costs the messages added since.
This was chosen over state that remembers the last prompt because:

* a process that restarts, another worker of a service, or a second pruner sends the same
  prompt for the same history, so the provider's cache (which outlives a process) still hits;
* one pruner can serve many sessions, interleaved, without one session's cuts moving
  another's: a different history simply has a different fold;
* a history that is trimmed or edited is replayed as it now is: a prompt never shows a
  message its history no longer holds, and no cached cut can point past the history's end.

The price is that the first prune of a long history counts every message once (a replay of
the whole history; token counts are cached per message, so only once), where the default mode
reads only what it keeps (a session store spares a new process that with a fold snapshot: see
below); and with ``repair=False`` damage anywhere in the history raises.

How a fold step goes (``_StableFolds.advance``): each unit (an assistant message with its tool
results, or one message) and each system message is taken in order. If the prompt with it
stays within the budget, it is appended as it is. If not, the prompt is cut again with the
default mode's rules (system messages, the recent units, the newest user message; recent
outputs compressed, then the oldest recent units dropped, if those alone do not fit), but the
older units are added only up to the low-water mark (up to the budget, as the default mode
does, when the messages that must be kept are already above the mark: the next unit cuts
again anyway). A message compressed once stays
compressed, the same way (the compressed form is content-addressed); a user message that was
the newest at a cut and lies before it stays in the prompt until the next cut, so a newer
user message does not change the prefix.

**Fold snapshots.** Right after a cut the fold's state is small: the system messages, the
window (the units from the cut on), the pinned user message, which messages are compressed
(their compressed form is content-addressed, so it is made again alike) and the totals. Between
two cuts the fold only appends. :class:`FoldState` is that state at a fold's frontier, in
indexes; a store of sessions keeps it (:mod:`ctxkeep.prune.snapshots`) so that the first prompt
of a new process reads the system messages, the pinned message and the window on, not the whole
history. :meth:`_StableFolds.plan_state` takes it as a *seed*: the fold is rebuilt from the
messages it names (the others may be :class:`Unread` placeholders, which raise if touched),
checked against them (the window walked again, the totals counted again), and folded forward
from there, as a warm fold would be; a seed that does not check out raises
:class:`FoldMismatch` and the caller replays the whole history, which stays the reference.
:func:`~ctxkeep.prune.snapshots.fold_params` names every setting that changes a fold (a snapshot is
kept per setting).
The state, its stored form and these helpers live in :mod:`ctxkeep.foldstate` (importable
from here too).

:func:`~ctxkeep.anthropic_cache.place_cache_breakpoints` (with the Anthropic format) turns a
pruned prompt into an Anthropic payload with ``cache_control`` breakpoints on its stable
prefix. The old home of all this, ``ctxkeep.cache``, still imports it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxkeep.errors import BudgetExceededError, CtxkeepError
from ctxkeep.foldstate import (
    FOLD_FORMAT,
    FoldMismatch,
    FoldState,
    Unread,
    UnreadMessageTouched,
)
from ctxkeep.messages import (
    SYSTEM_ROLES,
    Message,
    missing_content,
)
from ctxkeep.prune.fit import _Fit
from ctxkeep.prune.inputs import unchanged
from ctxkeep.prune.units import _Plan, _Repairs, _Unit

if TYPE_CHECKING:
    from ctxkeep.prune.pruner import TokenPruner

_CHECKPOINTS = 3
"""Checkpoints an advance takes inside the messages it adds: at the ends of its last units."""
_KEPT = 8
"""Checkpoints a fold keeps (its newest): a few turns of pops and retries roll back."""

# -- the cache-stable fold ----------------------------------------------------------------------


@dataclass
class _Fold:
    """Where the replay of one history stands (see the module docstring)."""

    fix: _Repairs
    total: int
    """Tokens of the prompt so far (system, window, pinned user, priming)."""
    keys: list[Any] = field(default_factory=list)
    """What the input messages folded are compared with, in order (the frontier is
    ``len(keys)``): each ``Message`` itself, a snapshot of each dict
    (:mod:`ctxkeep.prune.inputs`)."""
    msgs: list[Message] = field(default_factory=list)
    """The same, repairs applied (the pruner's own list)."""
    system: list[int] = field(default_factory=list)
    sys_tokens: int = 0
    units: list[_Unit] = field(default_factory=list)
    """The window: every unit from the cut on, oldest first."""
    pinned: _Unit | None = None
    """A user message before the cut, kept (the newest one when the cut was made)."""
    head: list[_Unit] = field(default_factory=list)
    """The conversation's head (``keep_first`` units from its first user message), in no
    window: kept across cuts, in place."""
    head_out: frozenset[int] = frozenset()
    """Starts of the head units the last cut left out (even compressed they did not fit)."""
    first_user: int = -1
    """The first user message with content (the head's start; -1: none yet)."""
    compressed: dict[int, Message] = field(default_factory=dict)
    last_user: int = -1
    cut_end: int = 0
    """Messages before this index are in the prompt as they were right after the last cut."""
    notes: list[str] = field(default_factory=list)
    """What the last cut did (reported until the next one)."""
    error: BudgetExceededError | None = None
    """Set while the must-keep messages do not fit: the next unit cuts again."""
    open: bool = False
    """Folded while a newer call waited for its results (left out): holds only for a history
    with a user or assistant message at the frontier (see ``_StableFolds._may_extend``)."""
    checkpoints: list[_Checkpoint] = field(default_factory=list)
    """The fold as it stood at its last few unit boundaries, oldest first (see
    :class:`_Checkpoint`)."""


@dataclass(frozen=True)
class _Checkpoint:
    """A fold as it stood at ``frontier``: what a history that shares only the first
    ``frontier`` messages with the fold rolls back to, instead of a replay from the start.

    It costs a few references, no copies: every list a fold holds either only grows (keys,
    system, the window until the next cut) or is never changed once made (the messages of an
    advance, the compressed forms, the notes and the units: a cut walks copies), so a prefix
    of the list named here is the state as it was. Only the repairs, a few sets usually empty,
    are copied.
    """

    frontier: int
    keys: list[Any]
    msgs: list[Message]
    """Holds at least ``frontier`` messages, the first ``frontier`` of them the fold's."""
    system: int
    """How many of the fold's system messages (a prefix of ``sys_list``) it held."""
    sys_list: list[int]
    units: int
    unit_list: list[_Unit]
    pinned: _Unit | None
    head: int
    head_list: list[_Unit]
    head_out: frozenset[int]
    first_user: int
    compressed: dict[int, Message]
    notes: list[str]
    fix: _Repairs
    total: int
    sys_tokens: int
    last_user: int
    cut_end: int
    open: bool

    def restore(self) -> _Fold:
        """A fold of its own (no list shared with the one the checkpoint was taken of)."""
        f = self.frontier
        fix = self.fix
        return _Fold(
            fix=type(fix)(list(fix.orphans), set(fix.empty), dict(fix.originals), list(fix.notes)),
            total=self.total,
            keys=self.keys[:f],
            msgs=self.msgs if len(self.msgs) == f else self.msgs[:f],
            system=self.sys_list[: self.system],
            sys_tokens=self.sys_tokens,
            units=self.unit_list[: self.units],
            pinned=self.pinned,
            head=self.head_list[: self.head],
            head_out=self.head_out,
            first_user=self.first_user,
            compressed=self.compressed,
            last_user=self.last_user,
            cut_end=self.cut_end,
            notes=self.notes,
            open=self.open,
        )


def _starts_with(items: list[Any], keys: list[Any]) -> bool:
    """Whether the input ``items`` begins with the messages folded under ``keys``: the same
    ``Message`` objects or equal ones, dicts equal to their snapshots.

    One list comparison, in C: each pair is compared by identity first (the same message
    objects cost a pointer comparison), then with the key's ``==`` (a snapshot's is exact).
    """
    n = len(keys)
    if len(items) < n:
        return False
    # the whole input when nothing was added: no slice (a slice touches every item once more)
    return n == 0 or unchanged(keys, items if len(items) == n else items[:n])


class _StableFolds:
    """The fold states of the last few histories a cache-stable pruner saw (LRU, locked)."""

    def __init__(self, pruner: TokenPruner, size: int = 16) -> None:
        self.pruner = pruner
        self.size = size
        self._folds: list[_Fold] = []  # least recently used first
        self._lock = threading.Lock()

    def plan(self, messages: list[Any]) -> _Plan | None:
        """The cache-stable plan of ``messages`` (a list of ``Message`` objects or OpenAI
        dicts), or None where the default mode must do.
        """
        return self.plan_state(messages)[0]

    def plan_state(
        self, messages: list[Any], seed: FoldState | None = None, *, state: bool = False
    ) -> tuple[_Plan | None, FoldState | None]:
        """:meth:`plan`, from ``seed`` where no fold kept here covers it, and (with ``state``)
        the fold's state afterwards (None where it cannot be a snapshot: see
        :meth:`FoldState.of`).

        Args:
            messages: the input; with a seed, the positions the seed does not name (before
                its window) may hold anything (:class:`Unread`): they are never read.
            seed: the fold's state at ``seed.frontier`` (:meth:`FoldState.from_json`), for a
                history that starts with the messages it was taken from.
            state: also return the state.

        Raises:
            FoldMismatch: ``seed`` does not describe ``messages``; nothing was kept.

        """
        inp = messages
        if not inp:
            if seed is not None:
                raise FoldMismatch("a seed for an empty history")
            return None, None  # nothing to fold: the default mode plans (and refuses) it alike
        with self._lock:
            fold = self._find(inp)
            if seed is not None and len(fold.keys) < seed.frontier:
                self._folds.remove(fold)
                fold = self._seeded(seed, inp)  # raises before anything is kept
                self._folds.append(fold)
            try:
                plan = self._advance(fold, inp)
            except BaseException:
                self._folds.remove(fold)  # half advanced: never reuse it
                raise
            if plan is None and seed is not None:
                self._folds.remove(fold)  # the default mode would read what the seed left out
                raise FoldMismatch("a system message after a pending call")
            return plan, FoldState.of(fold) if state else None

    def _seeded(self, seed: FoldState, inp: list[Any]) -> _Fold:
        """The fold of ``inp[:seed.frontier]`` that ``seed`` describes, rebuilt from the
        messages it names and checked against them.

        The window is walked again (the same units, the same repairs), the system and pinned
        messages are checked for their roles, the compressed forms are made again and every
        total is counted again; anything that differs raises.

        Raises:
            FoldMismatch: the seed does not describe ``inp``.

        """
        p = self.pruner
        end = seed.frontier
        lo = seed.window_start
        if not 0 < end <= len(inp):
            raise FoldMismatch(f"the seed folds {end} messages; the history holds {len(inp)}")
        msgs: list[Message] = list(inp[:end])

        def message(i: int) -> Message:
            if not 0 <= i < end or type(msgs[i]) is not Message:
                raise FoldMismatch(f"the seed needs message {i}, which was not read")
            return msgs[i]

        window = [message(i) for i in range(lo, end)]
        sys_in = {i for i, m in enumerate(window, lo) if m.role in SYSTEM_ROLES}
        fix = _Repairs()
        try:
            walked = [u for u, _ in p._units_backwards(msgs, sys_in, fix, lo=lo, hi=end)]
        except CtxkeepError as exc:
            raise FoldMismatch(f"the window does not walk as it did: {exc}") from None
        walked.reverse()
        if fix.originals or fix.notes or any(u.synthetic for u in walked):
            raise FoldMismatch("the window needs repairs a seed does not hold")
        head = self._seeded_head(seed, msgs, message)
        starts = {u.start for u in head}
        users = [u.start for u in walked if msgs[u.start].role == "user"]
        walked = [u for u in walked if u.start not in starts]  # the head is in no window
        if [(u.start, tuple(u.members), u.tool) for u in walked] != list(seed.units):
            raise FoldMismatch("the window's units are not the seed's")
        empty_in = set(fix.empty) | {i for i in sys_in if missing_content(msgs[i])}
        if {i for i in seed.empty if i >= lo} != empty_in or {
            i for i in seed.orphans if i >= lo
        } != set(fix.orphans):
            raise FoldMismatch("the window's repairs are not the seed's")
        system = list(seed.system)
        for i in system:
            m = message(i)
            if m.role not in SYSTEM_ROLES or missing_content(m):
                raise FoldMismatch(f"message {i} is not a system message with content")
        if system != sorted(set(system)) or {i for i in system if i >= lo} != sys_in - empty_in:
            raise FoldMismatch("the system messages are not the seed's")
        pinned: _Unit | None = None
        if seed.pinned is not None:
            j = seed.pinned
            m = message(j)
            if j >= lo or m.role != "user" or missing_content(m):
                raise FoldMismatch(f"message {j} is not a user message before the window")
            pinned = _Unit(j, [j], tool=False, pinned=True)
        if not users:
            users = sorted(
                [u.start for u in head if u.start < lo and msgs[u.start].role == "user"]
                + ([] if seed.pinned is None else [seed.pinned])
            )
        newest_user = users[-1] if users else -1
        if seed.last_user != newest_user or not 0 < seed.cut_end <= end:
            raise FoldMismatch("the seed's newest user message or cut is not the history's")
        keep = {j for u in walked for j in u.members}
        if pinned is not None:
            keep.add(pinned.start)
        kept_head = [u for u in head if u.start not in seed.head_out]
        keep |= {j for u in kept_head for j in u.members}
        compressed: dict[int, Message] = {}
        for j in seed.compressed:
            if j not in keep:
                raise FoldMismatch(f"compressed message {j} is not in the prompt")
            compressed[j] = p.compress(msgs[j])
        sys_tokens = sum(p.tokens(msgs[i]) for i in system)
        total = p._priming + sys_tokens + sum(p._unit_tokens(msgs, u, compressed) for u in walked)
        if pinned is not None:
            total += p._unit_tokens(msgs, pinned, compressed)
        total += sum(p._unit_tokens(msgs, u, compressed) for u in kept_head)
        if total != seed.total:
            raise FoldMismatch(f"the seed counts {seed.total} tokens; its messages count {total}")
        return _Fold(
            fix=_Repairs(orphans=list(seed.orphans), empty=set(seed.empty)),
            total=total,
            keys=list(msgs),  # Messages are their own keys; an Unread is equal only to itself
            msgs=msgs,
            system=system,
            sys_tokens=sys_tokens,
            units=walked,
            pinned=pinned,
            head=head,
            head_out=frozenset(seed.head_out),
            first_user=seed.first_user,
            compressed=compressed,
            last_user=seed.last_user,
            cut_end=seed.cut_end,
            notes=list(seed.notes),
        )

    def _seeded_head(
        self, seed: FoldState, msgs: list[Message], message: Callable[[int], Message]
    ) -> list[_Unit]:
        """The head ``seed`` names, each unit walked again from its own messages.

        Raises:
            FoldMismatch: a unit does not walk as the seed says, or the head does not start
                at a user message.

        """
        p = self.pruner
        head: list[_Unit] = []
        if len(seed.head) > p.keep_first or set(seed.head_out) - {s for s, _, _ in seed.head}:
            raise FoldMismatch("the seed's head is not this pruner's")
        for start, members, tool in seed.head:
            for j in members:
                message(j)  # read (the walk below touches nothing else: members are contiguous)
            fix = _Repairs()
            try:
                got = [
                    u for u, _ in p._units_backwards(msgs, set(), fix, lo=start, hi=members[-1] + 1)
                ]
            except CtxkeepError as exc:
                raise FoldMismatch(f"the head does not walk as it did: {exc}") from None
            if (
                len(got) != 1
                or (got[0].start, tuple(got[0].members), got[0].tool) != (start, members, tool)
                or got[0].synthetic
                or fix.orphans
                or fix.empty
                or fix.originals
                or fix.notes
            ):
                raise FoldMismatch(f"the head's unit at message {start} is not the seed's")
            got[0].head = True
            head.append(got[0])
        first = head[0].start if head else -1
        if first != seed.first_user or (head and message(first).role != "user"):
            raise FoldMismatch("the head does not start at the first user message")
        return head

    def _find(self, inp: list[Any]) -> _Fold:
        """The fold to advance for ``inp``: the kept fold or checkpoint that folded the longest
        prefix of it (a checkpoint restored as a fold of its own), else a new fold.

        A history that differs from a kept fold only in its newest messages (a retry, a pop,
        a replaced answer) so rolls back to the newest checkpoint inside the common prefix
        and folds forward from there: a few messages, not the whole history again.
        """
        n = len(inp)
        candidates: list[tuple[int, int, _Fold, _Checkpoint | None]] = []
        for f in self._folds:
            if len(f.keys) <= n and self._may_extend(f.open, len(f.keys), inp):
                candidates.append((len(f.keys), 1, f, None))
            candidates += [
                (cp.frontier, 0, f, cp)
                for cp in f.checkpoints
                if cp.frontier < len(f.keys)
                and cp.frontier <= n
                and self._may_extend(cp.open, cp.frontier, inp)
            ]
        # The longest prefix first; a fold before its own checkpoint at the same frontier.
        candidates.sort(key=lambda e: (e[0], e[1]), reverse=True)
        found: _Fold | None = None
        for k, _, f, c in candidates:
            keys = f.keys if c is None else c.keys
            if k and not unchanged([keys[k - 1]], [inp[k - 1]]):
                continue  # the newest message differs: no need to compare the rest
            if not _starts_with(inp, keys if len(keys) == k else keys[:k]):
                continue
            if c is None:
                found = f
                self._folds.remove(f)
            else:
                found = c.restore()
                found.checkpoints = [d for d in f.checkpoints if d.frontier <= k]
            break
        if found is None:
            found = _Fold(fix=_Repairs(), total=self.pruner._priming)
        self._folds.append(found)
        if len(self._folds) > self.size:
            del self._folds[0]
        return found

    @staticmethod
    def _may_extend(open_end: bool, frontier: int, inp: list[Any]) -> bool:
        """Whether a fold state at ``frontier`` can stand for ``inp[:frontier]`` as far as
        the newest unit goes: an *open* state (folded while a newer call waited for its
        results, so an older unanswered call got synthetic results) holds only while a user
        or assistant message follows it (else that older call is the newest: pending).
        """
        if not open_end:
            return True
        if len(inp) <= frontier:
            return False
        item = inp[frontier]
        role = (
            item.role if type(item) is Message else item.get("role") if type(item) is dict else None
        )
        return role in ("user", "assistant")

    def _advance(self, fold: _Fold, inp: list[Any]) -> _Plan | None:
        """Fold the messages added since the frontier; the plan of the whole of ``inp``."""
        p = self.pruner
        lo = len(fold.keys)
        read = [p._reader.read(item, i) for i, item in enumerate(inp[lo:], lo)]
        new = [m for m, _ in read]
        # A new list whenever something was added (the last plan's report holds the old one);
        # the same one when nothing was (a plan never changes its list).
        msgs = fold.msgs + new if new else fold.msgs
        n = len(msgs)
        new_sys = [i for i in range(lo, n) if msgs[i].role in SYSTEM_ROLES]
        sys_set = set(new_sys)
        fix = _Repairs()
        walked = list(p._units_backwards(msgs, sys_set, fix, lo=lo))
        pending: _Unit | None = None
        hi = n
        if walked and walked[0][1] == "pending":
            # The newest unit waits for its results: fold up to it, leave it out, and take
            # it in whole once its results are there.
            pending = walked[0][0]
            hi = pending.start
            if any(i > hi for i in new_sys):
                return None  # a system message after a pending call: the default mode's
            msgs = fold.msgs + new
            fix = _Repairs()
            walked = list(p._units_backwards(msgs, sys_set, fix, lo=lo, hi=hi))
        fold.fix.orphans.extend(fix.orphans)
        fold.fix.empty |= fix.empty
        fold.fix.originals.update(fix.originals)
        fold.fix.notes.extend(fix.notes)
        fold.msgs = msgs[:hi] if hi < n else msgs
        events: list[tuple[int, _Unit | None]] = [(i, None) for i in new_sys if i < hi]
        events += [(u.start, u) for u, _ in walked]
        events.sort(key=lambda e: e[0])
        budget = p.max_token_budget
        fold.keys.extend(k for _, k in read[: hi - lo])  # the fold's own list
        # Checkpoints inside this advance: at the ends of its last few units, where the state
        # is the replay's of the history up to there (no repairs in the walk, no synthetic
        # results: a replay of that prefix would take an unanswered call as pending).
        marks = (
            len(events) - _CHECKPOINTS
            if not (fix.orphans or fix.empty or fix.originals or fix.notes)
            else len(events)
        )
        for k, (i, u) in enumerate(events):
            if u is None:
                if p._drop_empty(msgs, i, fold.fix):
                    continue
                t = p.tokens(msgs[i])
                fold.system.append(i)
                fold.sys_tokens += t
                fold.total += t
                end = i + 1
            else:
                if msgs[u.start].role == "user":
                    fold.last_user = u.start
                    if fold.first_user < 0 and p.keep_first:
                        fold.first_user = u.start
                if fold.first_user >= 0 and len(fold.head) < p.keep_first:
                    u.head = True
                    fold.head.append(u)
                else:
                    fold.units.append(u)
                fold.total += p._unit_tokens(msgs, u, {})
                end = u.members[-1] + 1
            if fold.error is not None or fold.total > budget:
                self._cut(fold, msgs, end)
            if k >= marks and u is not None and not u.synthetic and end < hi and fold.error is None:
                self._checkpoint(fold, msgs, end, open_end=False)
        fold.open = pending is not None
        if fold.error is not None:
            e = fold.error
            raise BudgetExceededError(budget=e.budget, required=e.required, blocking=e.blocking)
        self._checkpoint(fold, fold.msgs, hi, open_end=fold.open)
        notes = list(fold.notes)
        if pending is not None:
            notes.append("dropped a trailing tool call whose results have not arrived")
        kept = list(fold.units)
        if fold.pinned is not None:
            kept.append(fold.pinned)
        kept += [u for u in fold.head if u.start not in fold.head_out]
        return _Plan(
            msgs=msgs,
            system=list(fold.system),
            kept=kept,
            compressed=dict(fold.compressed),
            dropped_units=[],
            rest=None,
            user_idx=fold.last_user,
            pending=pending,
            total=fold.total,
            notes=notes,
            budget_for_summary=0,
            fix=_Repairs(
                orphans=list(fold.fix.orphans),
                empty=set(fold.fix.empty),
                originals=dict(fold.fix.originals),
                notes=list(fold.fix.notes),
            ),
            stable_before=fold.cut_end,
        )

    @staticmethod
    def _checkpoint(fold: _Fold, msgs: list[Message], frontier: int, *, open_end: bool) -> None:
        """Keep the fold's state at ``frontier`` (its last :data:`_KEPT` checkpoints)."""
        kept = fold.checkpoints
        if kept and kept[-1].frontier >= frontier:
            return  # the same state (nothing was added)
        fix = fold.fix
        kept.append(
            _Checkpoint(
                frontier=frontier,
                keys=fold.keys,
                msgs=msgs,
                system=len(fold.system),
                sys_list=fold.system,
                units=len(fold.units),
                unit_list=fold.units,
                pinned=fold.pinned,
                head=len(fold.head),
                head_list=fold.head,
                head_out=fold.head_out,
                first_user=fold.first_user,
                compressed=fold.compressed,
                notes=fold.notes,
                fix=type(fix)(
                    list(fix.orphans), set(fix.empty), dict(fix.originals), list(fix.notes)
                ),
                total=fold.total,
                sys_tokens=fold.sys_tokens,
                last_user=fold.last_user,
                cut_end=fold.cut_end,
                open=open_end,
            )
        )
        if len(kept) > _KEPT:
            del kept[0]

    def _cut(self, fold: _Fold, msgs: list[Message], end: int) -> None:
        """Cut the window down to the low-water mark (the default mode's rules otherwise).

        The fit marks units (``pinned``): it gets copies, so the units a checkpoint names
        never change.
        """
        p = self.pruner
        notes: list[str] = []
        compressed = dict(fold.compressed)
        low = math.floor(p.low_water * p.max_token_budget)

        def copies(units: list[_Unit]) -> list[_Unit]:
            return [
                _Unit(u.start, u.members, u.tool, synthetic=u.synthetic, head=u.head) for u in units
            ]

        def fit_to(
            limit: int, compressed: dict[int, Message], notes: list[str], **how: Any
        ) -> _Fit:
            walker = ((u, None) for u in reversed(copies(fold.units)))
            return p._fit(
                msgs,
                fold.system,
                fold.sys_tokens,
                walker,
                fold.last_user,
                limit,
                compressed,
                notes,
                copies(fold.head),
                **how,
            )

        try:
            fit = fit_to(low, compressed, notes, squeeze=True)
            if fit.total > low:
                # What must be kept is already above the low-water mark, so the next unit
                # will cut again anyway: keep as much as the default mode would meanwhile.
                compressed, notes = dict(fold.compressed), []
                fit = fit_to(p.max_token_budget, compressed, notes)
        except BudgetExceededError as exc:
            fold.error = exc
            return
        head = {u.start for u in fit.kept if u.head}
        pinned = next((u for u in fit.kept if u.pinned and not u.head), None)
        window = [u for u in fit.kept if not u.pinned and not u.head]
        cut = min((u.start for u in window), default=math.inf)
        if pinned is not None and pinned.start > cut:
            window.append(pinned)  # inside the window: an ordinary unit from now on
            pinned = None
        for u in window:
            u.pinned = False
        window.sort(key=lambda u: u.start)
        keep = {j for u in window for j in u.members}
        keep |= {j for u in fold.head if u.start in head for j in u.members}
        if pinned is not None:
            keep.add(pinned.start)
        fold.units = window
        fold.pinned = pinned
        fold.head_out = frozenset(u.start for u in fold.head if u.start not in head)
        fold.compressed = {j: c for j, c in fit.compressed.items() if j in keep}
        fold.total = fit.total
        fold.error = None
        fold.cut_end = end
        notes.append(
            f"cache-stable: cut at message {end - 1} down to {fit.total} tokens "
            f"(low-water mark {low}); the prompt grows from here until the budget is full"
        )
        fold.notes = notes


__all__ = ["FOLD_FORMAT", "FoldMismatch", "FoldState", "Unread", "UnreadMessageTouched"]

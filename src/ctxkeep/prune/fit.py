"""The plan: which units of a history go into a prompt, and which outputs are compressed.

:meth:`_Fitter._plan` is the fill mode's plan (rules 2 to 5 of :mod:`ctxkeep.prune`): it pins
the newest user message, walks the units from the newest back (:mod:`ctxkeep.prune.units`) and
hands them to :meth:`_Fitter._fit`, which goes in steps, each its own function over unit costs:
the recent units taken from the walk (:func:`_recent_units`), the conversation's head weighed
beside the system messages and the newest user message (``_fit_head``: kept, compressed or
dropped), what must be kept brought within the budget (``_fit_must_keep``: recent outputs
compressed, then the oldest recent units dropped, then the newest user message compressed; else
``_over_budget`` names what is in the way), and older units added while they fit (``_fill``).
The cache-stable fold (:mod:`ctxkeep.prune.stable`) calls ``_fit`` at each cut with its own
walk and limit.

A unit costs the tokens of its messages (counted once per message and cached), a compressed
message counted in its compressed form. :meth:`_Fitter.compress` turns a tool output into its
head, its tail and a ref to the full text, which is stored in the pruner's artifact store first.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, Any

from ctxkeep.errors import BudgetExceededError
from ctxkeep.messages import SYSTEM_ROLES, Message, coerce_message, missing_content
from ctxkeep.prune.inputs import Messages, Reader, View, _role_of
from ctxkeep.prune.units import _Plan, _Repairs, _Unit, _Walk

if TYPE_CHECKING:
    from ctxkeep.artifacts import ArtifactStore
    from ctxkeep.prune.summary import AsyncSummarizer, Summarizer
    from ctxkeep.tokens import TokenCounter


@dataclass
class _Fit:
    kept: list[_Unit]
    compressed: dict[int, Message]
    dropped: list[_Unit]
    rest: Any
    pending: _Unit | None
    total: int
    summary_room: int


def _hi(end: int, msgs: Messages) -> int | None:
    """The ``hi`` of a walk that ends at ``end``: None at the end of the history (where the
    newest unit may wait for its results).
    """
    return None if end >= len(msgs) else end


class _Fitter(_Walk):
    """Token costs, compression and the choice of units: the second layer of
    :class:`~ctxkeep.TokenPruner`.
    """

    # Set by TokenPruner.__init__ (see its docstring).
    counter: TokenCounter
    artifacts: ArtifactStore
    summarizer: Summarizer | AsyncSummarizer | None
    _priming: int
    _compress_key: tuple[str, Any, int]
    _reader: Reader

    def tokens(self, message: Message) -> int:
        """Tokens of one message with this pruner's counter (cached)."""
        return self.counter.count_message(message)

    # -- compression ---------------------------------------------------------------------

    def compress(self, message: Message) -> Message:
        """The compressed form of a tool output: head, tail, and a ref to the full text.

        The full text is stored in :attr:`artifacts` first, so nothing is lost.
        """
        message = coerce_message(message)
        cache: dict[Any, Message] = message.__dict__.setdefault("_ctxkeep_compressed", {})
        hit = cache.get(self._compress_key) if self._compress_key[1] is not None else None
        if hit is not None:
            return hit
        full = message.text if isinstance(message.content, list) else (message.content or "")
        ref = self.artifacts.put(full)
        chars = max(0, self.excerpt_tokens * 3)
        if len(full) <= 2 * chars + 200:
            head, tail = full[: len(full) // 3], ""
        else:
            head, tail = full[:chars], full[-chars:]
        omitted = len(full) - len(head) - len(tail)
        marker = (
            f"[ctxkeep: {omitted} of {len(full)} characters omitted "
            f"({self.tokens(message)} tokens in full); full output is artifact {ref}: "
            f"call read_artifact to read it]"
        )
        body = "\n".join(p for p in (head, marker, tail) if p)
        meta = dict(message.metadata)
        meta["ctxkeep_compressed"] = {"ref": ref, "original_chars": len(full)}
        out = message.replace(
            content=body,
            artifact_refs=(*message.artifact_refs, ref),
            metadata=meta,
        )
        cache[self._compress_key] = out
        return out

    # -- planning ------------------------------------------------------------------------

    def _unit_tokens(self, msgs: Messages, u: _Unit, compressed: dict[int, Message]) -> int:
        t = self.tokens
        n = sum(t(compressed.get(j, msgs[j])) for j in u.members)
        if u.synthetic:
            n += sum(t(m) for m in u.synthetic)
        return n

    def _compress_unit(
        self, msgs: Messages, u: _Unit, compressed: dict[int, Message], threshold: int
    ) -> bool:
        changed = False
        for j in u.members:
            m = msgs[j]
            if m.role == "tool" and j not in compressed and self.tokens(m) > threshold:
                c = self.compress(m)
                if self.tokens(c) < self.tokens(m):
                    compressed[j] = c
                    changed = True
        return changed

    def _plan(self, messages: Sequence[Any]) -> _Plan:
        # Dicts are read lazily: the walk back reads (and checks) only what it reaches.
        view = self._reader.view(messages)
        msgs = view.msgs
        budget = self.max_token_budget
        system = view.system
        sys_set = set(system)
        fix = _Repairs()
        if any(missing_content(msgs[i]) for i in system):
            system = [i for i in system if not self._drop_empty(msgs, i, fix)]
        sys_tokens = sum(self.tokens(msgs[i]) for i in system)
        notes: list[str] = []

        first, end = self._head_range(view)
        head: list[_Unit] = []
        if first < 0:
            walker = self._units_backwards(msgs, sys_set, fix)
        else:
            # The head is walked on its own (it is kept whatever the budget leaves), then the
            # units after it newest first, then those before it.
            walked = list(self._units_backwards(msgs, sys_set, fix, lo=first, hi=_hi(end, msgs)))
            waiting = [(u, state) for u, state in walked if state == "pending"]
            head = [u for u, state in reversed(walked) if state != "pending"]
            for u in head:
                u.head = True
            after = self._units_backwards(msgs, sys_set, fix, lo=end) if end < len(msgs) else ()
            before = self._units_backwards(msgs, sys_set, fix, lo=0, hi=first)
            walker = chain(waiting, after, before)
        limit = budget - (self.summary_max_tokens if self.summarizer is not None else 0)
        # The newest user message is pinned wherever it is; a reverse scan of roles finds it
        # without walking (and checking) the units in between. One with no content is no
        # message to pin (the walk drops it or raises): the one before it is pinned.
        user_idx = view.newest_user
        while user_idx >= 0 and missing_content(msgs[user_idx]):
            self._drop_empty(msgs, user_idx, fix)
            user_idx = view.last_user(user_idx)
        fit = self._fit(msgs, system, sys_tokens, walker, user_idx, limit, {}, notes, head)
        return _Plan(
            msgs=msgs,
            system=system,
            kept=fit.kept,
            compressed=fit.compressed,
            dropped_units=fit.dropped,
            rest=fit.rest,
            user_idx=user_idx,
            pending=fit.pending,
            total=fit.total,
            notes=notes,
            budget_for_summary=fit.summary_room,
            fix=fix,
        )

    def _head_range(self, view: View) -> tuple[int, int]:
        """``(first, end)``: the conversation's head is the units that start in
        ``[first, end)`` (``first`` is -1 where there is none).

        The head starts at the first user message with content and holds ``keep_first``
        units: each starts at a message that is neither a tool result nor a system message
        and is not dropped as empty (an assistant tool call, with its results, is one unit).
        """
        if not self.keep_first:
            return -1, -1
        msgs, items = view.msgs, view.items
        n = len(items)
        first = j = 0
        if view.roles is not None:
            try:  # a scan in C: the first user message is seldom far, but may be
                j = view.roles.index("user")
            except ValueError:
                return -1, -1
        first = -1
        while j < n:
            if _role_of(items[j], msgs, j) == "user" and not missing_content(msgs[j]):
                first = j
                break
            j += 1
        if first < 0:
            return -1, -1
        starts = 0
        for j in range(first, n):
            role = _role_of(items[j], msgs, j)
            if role == "tool" or role in SYSTEM_ROLES:
                continue
            m = msgs[j]
            if m.tool_calls or not missing_content(m):
                starts += 1
                if starts > self.keep_first:
                    return first, j
        return first, n

    def _fit(
        self,
        msgs: Messages,
        system: list[int],
        sys_tokens: int,
        walker: Any,
        user_idx: int,
        limit: int,
        compressed: dict[int, Message],
        notes: list[str],
        head: Sequence[_Unit] = (),
        squeeze: bool = False,
    ) -> _Fit:
        """Choose the units of a prompt from ``walker`` (``(unit, state)``, newest first).

        The recent units and the newest user message (``user_idx``) must fit the budget (recent
        outputs compressed, then the oldest recent units dropped, if not); older units are
        added newest first while the total stays within ``limit``. ``compressed`` holds the
        messages already compressed (the cache-stable mode keeps them so) and is filled in.

        ``head`` (the conversation's head, not in ``walker``) is kept too: if with the system
        messages and the newest user message it exceeds the budget, its messages are
        compressed, and if even that does not fit it is dropped (before the newest user
        message is compressed); a head unit that is the newest user message is that message.
        """
        budget = self.max_token_budget
        head, pinned_user = _user_out_of_head(head, user_idx)
        recent, older, pending, pinned_user = _recent_units(
            walker, user_idx, self.preserve_last_n, pinned_user, notes
        )
        cost = self._unit_tokens
        must = sys_tokens + self._priming + sum(cost(msgs, u, compressed) for u in recent)
        if pinned_user is not None:
            must += cost(msgs, pinned_user, compressed)
        must += sum(cost(msgs, u, compressed) for u in head)
        if squeeze and must > limit and self.compress_threshold is not None:
            # A cache-stable cut whose must-keep part is above the low-water mark: recent tool
            # outputs over the threshold are compressed, oldest first, as older ones are, so
            # the cut still jumps down (else every new unit would cut again).
            must = self._compress_recent(
                msgs,
                recent,
                compressed,
                must,
                limit,
                self.compress_threshold,
                notes,
                "compressed recent tool output to reach the low-water mark",
            )
        lost_head: list[_Unit] = []
        if must > budget and head:
            user_unit = pinned_user or next((u for u in recent if u.pinned), None)
            head, lost_head, must = self._fit_head(
                msgs, head, user_unit, sys_tokens, compressed, must, notes
            )
        kept = list(recent)
        dropped: list[_Unit] = []
        if must > budget:
            must = self._fit_must_keep(msgs, kept, dropped, pinned_user, compressed, must, notes)
            if must > budget:
                raise self._over_budget(
                    msgs, system, sys_tokens, [*head, *kept], pinned_user, compressed, must
                )
        if pinned_user is not None:
            kept.append(pinned_user)
        kept += head
        total = must
        rest: Any = None  # the walk's units not taken yet (all of them dropped)
        older_left = iter([u for u in older if not u.pinned])
        if dropped:
            # The must-keep part itself lost units: no older one is added.
            dropped += older_left
            rest = walker
        else:
            # Older units newest first, past the pinned user message, while they fit.
            walked = (u for u, _ in walker if u.start != user_idx)
            added, stopped, total = self._fill(
                msgs, chain(older_left, walked), compressed, must, limit
            )
            kept += added
            if stopped is not None:
                # Everything older than the first unit that did not fit is dropped, but the
                # pinned user message (kept). The rest of the walk is left to be done lazily:
                # only a summary needs it, so a prune costs what it keeps.
                dropped += [stopped, *older_left]
                rest = walker
        summary_room = budget - total if rest is not None else 0
        dropped += lost_head
        return _Fit(kept, compressed, dropped, rest, pending, total, summary_room)

    def _compress_recent(
        self,
        msgs: Messages,
        recent: list[_Unit],
        compressed: dict[int, Message],
        must: int,
        limit: int,
        threshold: int,
        notes: list[str],
        note: str,
    ) -> int:
        """Recent tool outputs over ``threshold`` compressed, oldest first, until ``must``
        is within ``limit``; the new ``must``.
        """
        for u in reversed(recent):
            if must <= limit:
                break
            if u.tool:
                before = self._unit_tokens(msgs, u, compressed)
                if self._compress_unit(msgs, u, compressed, threshold):
                    must += self._unit_tokens(msgs, u, compressed) - before
                    notes.append(note)
        return must

    def _fit_head(
        self,
        msgs: Messages,
        head: list[_Unit],
        user_unit: _Unit | None,
        sys_tokens: int,
        compressed: dict[int, Message],
        must: int,
        notes: list[str],
    ) -> tuple[list[_Unit], list[_Unit], int]:
        """The head beside what comes before it (the system messages, the newest user
        message): as it is if they fit the budget together, else compressed, else dropped.
        Returns the head kept, the head dropped, and the new ``must``.
        """
        budget = self.max_token_budget
        head_cost = sum(self._unit_tokens(msgs, u, compressed) for u in head)
        fixed = sys_tokens + self._priming
        if user_unit is not None:
            fixed += self._unit_tokens(msgs, user_unit, compressed)
        j = user_unit.start if user_unit is not None else -1
        if fixed > budget and self.compress_oversized_user and j >= 0 and j not in compressed:
            # The newest user message alone exceeds the budget beside the system messages:
            # it is compressed anyway (later), so the head is weighed against its excerpt.
            fixed += min(0, self.tokens(self.compress(msgs[j])) - self.tokens(msgs[j]))
        if fixed + head_cost <= budget:
            return head, [], must
        for u in head:
            for j in u.members:
                m = msgs[j]
                if j not in compressed:
                    c = self.compress(m)
                    if self.tokens(c) < self.tokens(m):
                        compressed[j] = c
        cost = sum(self._unit_tokens(msgs, u, compressed) for u in head)
        notes.append(
            "compressed the task (the conversation's first user message): with the "
            "system messages and the newest user message it exceeds the budget"
        )
        if fixed + cost <= budget:
            return head, [], must + cost - head_cost
        for u in head:
            for j in u.members:
                compressed.pop(j, None)
        notes.append(
            "dropped the task (the conversation's first user message): even "
            "compressed it does not fit beside the system messages and the newest "
            "user message"
        )
        return [], head, must - head_cost

    def _fit_must_keep(
        self,
        msgs: Messages,
        kept: list[_Unit],
        dropped: list[_Unit],
        pinned_user: _Unit | None,
        compressed: dict[int, Message],
        must: int,
        notes: list[str],
    ) -> int:
        """What must be kept, over the budget, brought down: recent tool outputs compressed
        (oldest first), then the oldest recent units dropped (moved from ``kept`` to
        ``dropped``), then the newest user message compressed. The new ``must`` (still over
        the budget where nothing more could be done).
        """
        budget = self.max_token_budget
        must = self._compress_recent(
            msgs,
            kept,
            compressed,
            must,
            budget,
            0,
            notes,
            "compressed recent tool output to fit the budget",
        )
        for u in reversed(list(kept)):  # a copy: units are removed from kept on the way
            if must <= budget:
                break
            if u.pinned:
                continue
            must -= self._unit_tokens(msgs, u, compressed)
            kept.remove(u)
            dropped.append(u)
            for j in u.members:
                compressed.pop(j, None)
            notes.append("dropped a recent unit to fit the budget")
        user_unit = pinned_user or next((u for u in kept if u.pinned), None)
        j = user_unit.start if user_unit is not None else -1
        if must > budget and self.compress_oversized_user and j >= 0 and j not in compressed:
            c = self.compress(msgs[j])
            if self.tokens(c) < self.tokens(msgs[j]):
                must += self.tokens(c) - self.tokens(msgs[j])
                compressed[j] = c
                notes.append("compressed the newest user message: alone it exceeds the budget")
        return must

    def _over_budget(
        self,
        msgs: Messages,
        system: list[int],
        sys_tokens: int,
        kept: list[_Unit],
        pinned_user: _Unit | None,
        compressed: dict[int, Message],
        must: int,
    ) -> BudgetExceededError:
        """The error for messages that must be kept and do not fit, naming each of them."""
        blocking = [f"system messages: {sys_tokens} tokens"] if system else []
        blocking += [
            f"message {u.start} ({msgs[u.start].role}): "
            f"{self._unit_tokens(msgs, u, compressed)} tokens"
            for u in kept
        ]
        if pinned_user is not None:
            j = pinned_user.start
            blocking.append(
                f"newest user message {j}: {self.tokens(compressed.get(j, msgs[j]))} tokens"
            )
        return BudgetExceededError(budget=self.max_token_budget, required=must, blocking=blocking)

    def _fill(
        self,
        msgs: Messages,
        units: Iterator[_Unit],
        compressed: dict[int, Message],
        total: int,
        limit: int,
    ) -> tuple[list[_Unit], _Unit | None, int]:
        """Older ``units``, newest first, added while the total stays within ``limit`` (a
        tool output over ``compress_threshold`` compressed, any tool output compressed where
        that makes it fit). Returns the units added, the first one that did not fit (None:
        all fit; the units after it are not read) and the total.
        """
        added: list[_Unit] = []
        for u in units:
            if u.tool and self.compress_threshold is not None:
                self._compress_unit(msgs, u, compressed, self.compress_threshold)
            cost = self._unit_tokens(msgs, u, compressed)
            if total + cost > limit and u.tool and self._compress_unit(msgs, u, compressed, 0):
                cost = self._unit_tokens(msgs, u, compressed)
            if total + cost > limit:
                for j in u.members:
                    compressed.pop(j, None)
                return added, u, total
            added.append(u)
            total += cost
        return added, None, total


def _user_out_of_head(head: Sequence[_Unit], user_idx: int) -> tuple[list[_Unit], _Unit | None]:
    """The head without the newest user message's unit, and that unit (pinned) if the head
    held it: a head unit that is the newest user message is that message.
    """
    rest = list(head)
    for u in rest:
        if u.start == user_idx:
            rest.remove(u)
            u.pinned = True
            return rest, u
    return rest, None


def _recent_units(
    walker: Iterator[tuple[_Unit, str]],
    user_idx: int,
    preserve_last_n: int,
    pinned_user: _Unit | None,
    notes: list[str],
) -> tuple[list[_Unit], list[_Unit], _Unit | None, _Unit | None]:
    """The recent units taken from the walk (newest first, until ``preserve_last_n``
    messages), the first older unit walked past (``[]`` or one), the unit still waiting for
    its results (left out), and the pinned newest user message's unit (met in the walk past
    the recent ones, or made for it where no recent unit holds it).
    """
    recent: list[_Unit] = []
    older: list[_Unit] = []
    pending: _Unit | None = None
    seen = 0
    for unit, state in walker:
        if state == "pending":
            pending = unit
            notes.append("dropped a trailing tool call whose results have not arrived")
            continue
        if seen < preserve_last_n:
            recent.append(unit)
            seen += len(unit.members)
            if unit.start == user_idx:
                unit.pinned = True
            continue
        if unit.start == user_idx:
            unit.pinned = True
            pinned_user = unit
        else:
            older.append(unit)
        break
    if user_idx >= 0 and pinned_user is None and not any(u.pinned for u in recent):
        pinned_user = _Unit(user_idx, [user_idx], tool=False, pinned=True)
    return recent, older, pending, pinned_user

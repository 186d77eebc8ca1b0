"""The read stage: a session's history as the pruner declares it needs it.

:meth:`~ctxkeep.MemoryManager.build_prompt` asks the pruner how it reads
(``pruner.read_prompt(memory, session_id, prefix)``); a :class:`~ctxkeep.TokenPruner` answers
with its mode's read (:mod:`ctxkeep.prune.modes`), one of the strategies here:

* the fill mode (``cache_stable=False``, no summarizer) reads the newest pages of the session
  until the prune of what it read provably is the prune of it all
  (:func:`prompt_from_pages`, the proof in :mod:`ctxkeep.prune.tail`);
* the cache-stable mode reads from the fold snapshot stored with the session at its last cut
  and the messages it names, and folds forward (:func:`prompt_from_fold`,
  :mod:`ctxkeep.prune.snapshots`);
* anything else (a summarizer, a store with no snapshots) answers None, and the manager reads
  every message.

The manager offers only storage primitives and its prompt cache (``MemoryManager.reads``, a
:class:`~ctxkeep.sessions.base.HistoryReads`); the strategies live here, with the pruner whose
insides they rely on. Every strategy returns what the replay of the whole history would (the
property tests check it on every backend), and a report whose indexes are positions in
the session, the messages it did not read counted as ``unread``.
"""

from __future__ import annotations

import dataclasses
import warnings
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from ctxkeep.foldstate import FoldMismatch, Unread, UnreadMessageTouched
from ctxkeep.messages import SYSTEM_ROLES, Message, missing_content
from ctxkeep.prune.snapshots import fold_history, fold_prompt, store_fold
from ctxkeep.prune.tail import prompt_from_tail
from ctxkeep.sessions.base import CachedHistory, SessionPrompt, newest_user
from ctxkeep.sessions.records import SessionInfo, record_to_message

if TYPE_CHECKING:
    from ctxkeep.prune import PruneReport, TokenPruner
    from ctxkeep.sessions.base import HistoryReads

_UNREAD_PAGE = Unread("older than the pages read")
"""The place of a message a paged prompt read did not need, in its report."""


def prompt_from_pages(
    reads: HistoryReads, session_id: str, prefix: list[Message], pruner: TokenPruner
) -> SessionPrompt | None:
    """The prompt for a pruner that reads only what it keeps: the session read
    newest first, a page at a time, until :func:`prompt_from_tail` proves the prune of
    what was read the prune of it all (see :mod:`ctxkeep.prune.tail`). None where the
    report's positions cannot be told from a partial read (a session with a gap in its
    seqs, left by a message taken back): the caller reads it all.
    """
    cached = reads.take_cached(session_id)
    if cached is not None and cached.fold is not None and cached.fold.base > 0:
        cached = None  # a fold snapshot's read: placeholders, not pages
    info: SessionInfo | None = None
    if cached is not None:
        info, rows = reads.since(session_id, cached.seqs[-1] if cached.seqs else 0)
        if (cached.generation, cached.revision) != (info.generation, info.revision):
            cached = None  # another session under this id, or messages taken back
    if cached is None or info is None:
        tail = reads.newest(session_id, reads.page, None)
        info, rows = tail.info, tail.rows
        cached = CachedHistory(
            info.generation,
            info.revision,
            [],
            [],
            complete=len(rows) < reads.page,
            marks=[(seq, record_to_message(r)) for seq, r in tail.marks],
        )
    # Trimmed since: drop what the session no longer holds.
    keep = bisect_left(cached.seqs, info.first_seq)
    seqs = cached.seqs[keep:] + [seq for seq, _ in rows]
    msgs = cached.messages[keep:] + [record_to_message(r) for _, r in rows]
    marks = [(seq, m) for seq, m in cached.marks if seq >= info.first_seq]
    complete = cached.complete or (bool(seqs) and seqs[0] <= info.first_seq)
    head = cached.head
    if head is not None and head and head[0][0] < info.first_seq:
        head = None  # trimmed: the head is another one now
    if head is None and not complete:
        head = _head_marks(reads, session_id, info, pruner.keep_first)
        if head is None:
            return None  # no head in the session's first messages: read it all
    if head:
        marks = _merged(marks, head, seqs[0] if seqs else info.next_seq)
    page = reads.page
    partial: tuple[list[Message], PruneReport] | None = None
    while True:
        history: list[Message] | None = msgs
        if info.pending:
            calls = [i for i, m in enumerate(msgs) if m.tool_calls]
            history = msgs[: calls[-1]] if calls else []
            if not calls and not complete:
                history = None  # the waiting call is older than this page
        if complete:
            assert history is not None
            out, report = pruner.prune_with_report(prefix + history)
            break
        if history is not None:
            partial = prompt_from_tail(pruner, prefix, [m for _, m in marks], history)
            if partial is not None:
                break
        # An older page: below the oldest message held in this read.
        page *= 2
        tail = reads.newest(session_id, page, seqs[0] if seqs else info.next_seq)
        moved = tail.info
        if (moved.generation, moved.revision, moved.first_seq) != (
            info.generation,
            info.revision,
            info.first_seq,
        ):
            # Trimmed, taken back or created again between two pages: start over.
            reads.forget_cached(session_id)
            return prompt_from_pages(reads, session_id, prefix, pruner)
        seqs = [seq for seq, _ in tail.rows] + seqs
        msgs = [record_to_message(r) for _, r in tail.rows] + msgs
        marks = [(seq, record_to_message(r)) for seq, r in tail.marks]
        complete = len(tail.rows) < page
        if head:
            marks = _merged(marks, head, seqs[0] if seqs else info.next_seq)
    reads.keep_cached(
        session_id,
        CachedHistory(
            info.generation,
            info.revision,
            seqs,
            msgs,
            complete=complete,
            marks=[] if complete else marks,
            head=None if complete else head,
        ),
    )
    user = newest_user(msgs) or newest_user([m for _, m in marks])
    if partial is None:
        return SessionPrompt(info, out, report, user)
    # A prune of the messages read: its report's indexes are placed at their positions
    # in the session (a seq's position is its offset from first_seq while the seqs have
    # no gap: every seq from first_seq to next_seq - 1 held).
    if info.next_seq - info.first_seq != info.message_count:
        return None
    out, report = partial
    seq_of = {id(m): seq for seq, m in zip(seqs, msgs, strict=True)}
    seq_of.update((id(m), seq) for seq, m in marks)
    n = len(prefix)
    where: list[int] = []
    for i, m in enumerate(report._messages):
        seq = seq_of.get(id(m)) if i >= n else None
        if i >= n and seq is None:
            return None  # not a message of this read (a repair): read it all
        where.append(i if seq is None else n + seq - info.first_seq)
    placed: list[Any] = [_UNREAD_PAGE] * (n + info.message_count)
    for i, m in zip(where, report._messages, strict=True):
        placed[i] = m
    report = dataclasses.replace(
        report,
        _messages=placed,
        _fates={where[i]: fate for i, fate in report._fates.items()},
    )
    return SessionPrompt(info, out, report, user)


HEAD_PAGE = 8
"""Messages read from a session's start for its head (four times more each time it is not
settled, up to :data:`HEAD_MAX`)."""
HEAD_MAX = 512
"""The most messages read for a head: past them, the session is read whole."""


def _head_marks(
    reads: HistoryReads, session_id: str, info: SessionInfo, keep_first: int
) -> list[tuple[int, Message]] | None:
    """The conversation's head that a pruner with ``keep_first`` keeps in every prompt,
    with seqs, read from the session's start (see ``keep_first`` on
    :class:`~ctxkeep.TokenPruner`): ``[]`` for none, None where it is not settled within
    :data:`HEAD_MAX` messages or the session changed meanwhile (the caller reads it all).
    """
    if not keep_first:
        return []
    n = HEAD_PAGE
    while n <= HEAD_MAX:
        got, rows = reads.seqs(session_id, range(info.first_seq, info.first_seq + n))
        if (got.generation, got.revision, got.first_seq) != (
            info.generation,
            info.revision,
            info.first_seq,
        ):
            return None
        read = [(seq, record_to_message(r)) for seq, r in rows]
        span = head_span([m for _, m in read], keep_first)
        whole = info.first_seq + n >= info.next_seq  # every message of the session read
        if span is not None and (span[1] < len(read) or whole):
            return read[span[0] : span[1]]
        if span is None and whole:
            return []
        n *= 4
    return None


def head_span(messages: list[Message], keep_first: int) -> tuple[int, int] | None:
    """``(first, end)``: the head is ``messages[first:end]``, the ``keep_first`` units from
    the first user message with content (each starts at a message that is neither a tool
    result nor a system message, and is not empty); None if there is no such user message.
    ``end`` is ``len(messages)`` where the head may go on past them.
    """
    first = next(
        (i for i, m in enumerate(messages) if m.role == "user" and not missing_content(m)),
        None,
    )
    if first is None:
        return None
    starts = 0
    for j in range(first, len(messages)):
        m = messages[j]
        if m.role == "tool" or m.role in SYSTEM_ROLES:
            continue
        if m.tool_calls or not missing_content(m):
            starts += 1
            if starts > keep_first:
                return first, j
    return first, len(messages)


def _merged(
    marks: list[tuple[int, Message]], head: list[tuple[int, Message]], below: int
) -> list[tuple[int, Message]]:
    """``marks`` and the head's messages below seq ``below``, in session order, once each."""
    by_seq = dict(marks)
    by_seq.update((seq, m) for seq, m in head if seq < below)
    return sorted(by_seq.items(), key=lambda e: e[0])


def prompt_from_fold(
    reads: HistoryReads, session_id: str, prefix: list[Message], pruner: TokenPruner, key: str
) -> SessionPrompt:
    """The prompt for a cache-stable :class:`~ctxkeep.TokenPruner`: the history read from the
    fold snapshot stored under ``key`` where one holds (the messages it names and those from
    its window on), else every message; the fold started from the snapshot, checked, and
    folded forward; a new snapshot stored when it cut (see :mod:`ctxkeep.prune.snapshots`).
    Anything the checks refuse is read and replayed whole.
    """
    cached = reads.take_cached(session_id)
    loaded = fold_history(reads.backend, reads.since, session_id, key, len(prefix), cached)
    try:
        out, report, state = fold_prompt(prefix, loaded, pruner)
    except (FoldMismatch, UnreadMessageTouched) as exc:
        if isinstance(exc, UnreadMessageTouched):  # a bug: the replay below is still right
            warnings.warn(
                f"ctxkeep: a fold snapshot was not enough: {exc}", RuntimeWarning, stacklevel=2
            )
        loaded = fold_history(
            reads.backend, reads.since, session_id, key, len(prefix), None, whole=True
        )
        out, report, state = fold_prompt(prefix, loaded, pruner)
    info, folded = loaded.info, loaded.folded
    if state is not None:
        folded.seed = state
        store_fold(reads.backend, session_id, len(prefix), state, loaded, pruner.counter)
    reads.keep_cached(
        session_id,
        CachedHistory(
            info.generation,
            info.revision,
            loaded.seqs,
            loaded.history,
            complete=folded.base == 0,
            fold=folded,
        ),
    )
    return SessionPrompt(info, out, report, newest_user(loaded.history))


__all__ = ["prompt_from_fold", "prompt_from_pages"]

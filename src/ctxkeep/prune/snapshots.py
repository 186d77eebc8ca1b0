"""The first prompt of a process for a cache-stable pruner: a fold snapshot kept with the session.

A cache-stable prompt is a pure function of the history: the pruner replays the history from
its first message, cutting where the budget overflowed (:mod:`ctxkeep.prune.stable`). A process that
already folded a session keeps the fold; a new process would replay all of it (8 s for 10,000
messages: every message decoded and counted). But right after a cut the fold's state is small
(the system messages, the window from the cut on, the pinned user message, the compressed
messages, the totals), and between cuts the fold only appends. So the manager stores the fold's
state with the session (:class:`FoldSnapshot`, a few hundred bytes of JSON) after each prompt
whose fold cut (the state at that prompt's last message), and a new process reads only what the
state names: the system and pinned messages, and every message from the window's start to the
newest (:meth:`~ctxkeep.sessions.base.Backend.read_rows`). The pruner rebuilds the fold from
them, checks it, and folds forward (``_StableFolds.plan_state`` in :mod:`ctxkeep.prune.stable`);
the messages it did not read are :class:`~ctxkeep.foldstate.Unread` placeholders in their
places, which raise if anything touches them. On the 10,000-message session of
``bench/cold_prompt.py`` the first prompt of a process takes about 30 ms on a loaded two-core
machine where the replay takes 10 s.

Keys and identity. A snapshot is stored per session under :func:`snapshot_key`: a hash of every
pruner setting that changes the fold (:func:`fold_params`, with the fold's
format and the ctxkeep version) and of the prompt's own system message. It holds the session's
identity when it was taken: ``generation`` (the session created again under the same id has
another), ``revision`` (a message taken back), ``first_seq`` (trimmed by ``max_history``), and
the seq and id of the last message folded. With the same generation, revision and first_seq the
messages up to that seq are the ones folded (appends only add newer seqs), and the message count
checks the positions. A snapshot that does not match, a state the pruner's checks refuse
(:class:`~ctxkeep.foldstate.FoldMismatch`), or a pending call older than the messages read make
the manager read and replay the whole session, which stays the reference, and store the snapshot
of that replay.

Writes. A snapshot is written when the fold has cut since the one the manager last stored or
read (one write per cut, not per turn), as the manager's last step of the prompt. A failed write
(:class:`~ctxkeep.errors.CtxkeepError` from the store) is logged and ignored: the prompt is
already built, and a missing snapshot costs the next new process a replay, never a wrong prompt.
Snapshots are deleted with their session; on Redis the key expires with it (its TTL is the
session's when written).
"""

from __future__ import annotations

import hashlib
import logging
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ctxkeep._version import __version__
from ctxkeep.errors import CtxkeepError
from ctxkeep.foldstate import FOLD_FORMAT, FoldMismatch, FoldState, Unread
from ctxkeep.messages import Message
from ctxkeep.prune.config import fold_key, is_plain_pruner
from ctxkeep.sessions.records import (
    dumps,
    full_record,
    loads,
    message_to_record,
    record_to_message,
)

if TYPE_CHECKING:
    from ctxkeep.prune import PruneReport, TokenPruner
    from ctxkeep.sessions.backend import Backend, Snapshot
    from ctxkeep.sessions.base import CachedHistory
    from ctxkeep.sessions.records import SessionInfo

log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1
"""The version of :class:`FoldSnapshot`'s stored form."""


def fold_params(pruner: Any) -> list[Any] | None:
    """Every setting of ``pruner`` that changes its cache-stable fold, JSON-ready (with
    :data:`~ctxkeep.foldstate.FOLD_FORMAT`, the ctxkeep version, every field of its
    :class:`~ctxkeep.prune.config.PrunerConfig` and its counter's), or None where no snapshot
    may stand for a replay: not a :class:`~ctxkeep.TokenPruner` itself (a subclass may prune
    otherwise), not cache-stable, a counter whose counts are not a function of its settings
    (a :class:`~ctxkeep.tokens.CalibratedCounter` learns; an unknown type), or an artifact
    store whose refs are not the content's own (a ``put`` of its own). The settings come from
    the config's fields: a new setting is in the key without anyone listing it.
    """
    from ctxkeep.artifacts import ArtifactStore
    from ctxkeep.tokens import HeuristicCounter, Overhead, TiktokenCounter

    if not is_plain_pruner(pruner) or not pruner.cache_stable or pruner.summarizer is not None:
        return None
    c = pruner.counter
    counter: list[Any]
    if type(c) is TiktokenCounter:
        counter = ["tiktoken", c.name]
    elif type(c) is HeuristicCounter:
        counter = ["heuristic", repr(float(c.chars_per_token))]
    else:
        return None
    o = c.overhead
    if type(o) is not Overhead or type(pruner.artifacts).put is not ArtifactStore.put:
        return None
    return [
        FOLD_FORMAT,
        __version__,
        fold_key(pruner.config),
        counter,
        [o.per_message, o.per_name, o.reply_priming, o.per_tool_call],
    ]


def snapshot_key(pruner: Any, prefix: list[Message]) -> str | None:
    """The key of ``pruner``'s snapshots for prompts that start with ``prefix`` (the prompt's
    own system message), or None where a snapshot may not stand for a replay
    (:func:`fold_params`).
    """
    params = fold_params(pruner)
    if params is None:
        return None
    # The prefix's records in the full shape, as before stored records left defaults out: the
    # same keys, so the snapshots a store holds still serve after the upgrade.
    data = [SNAPSHOT_VERSION, params, [full_record(message_to_record(m)) for m in prefix]]
    return hashlib.sha256(dumps(data).encode("utf-8")).hexdigest()


@dataclass(frozen=True, kw_only=True)
class FoldSnapshot:
    """A fold's state with the session identity it holds for, as stored (history indexes are
    positions in the session's messages; the state's are the pruner's input, ``prefix`` more).
    """

    generation: str
    revision: int
    first_seq: int
    prefix: int
    """Messages before the history in the pruner's input (the prompt's own system message)."""
    read_from: int
    """The first history message read in order: the window's start, or the frontier."""
    after_seq: int
    """Every message with a seq above this one is at ``read_from`` or later."""
    marks: tuple[tuple[int, int], ...]
    """``(history index, seq)`` of each message before ``read_from`` the fold needs."""
    last_seq: int
    """The seq of the last message folded."""
    last_id: str | None
    """Its id."""
    state: FoldState
    counts: tuple[tuple[int, int], ...] = ()
    """``(history index, tokens)`` of messages the fold reads, as the pruner's counter counted
    them (the key names the counter): a new process does not count them again."""

    def to_text(self) -> str:
        """The stored JSON."""
        return dumps(
            {
                "v": SNAPSHOT_VERSION,
                "generation": self.generation,
                "revision": self.revision,
                "first_seq": self.first_seq,
                "prefix": self.prefix,
                "read_from": self.read_from,
                "after_seq": self.after_seq,
                "marks": [list(m) for m in self.marks],
                "last": [self.last_seq, self.last_id],
                "state": self.state.to_json(),
                "counts": [list(c) for c in self.counts],
            }
        )

    @classmethod
    def from_text(cls, text: str) -> FoldSnapshot:
        """Read what :meth:`to_text` wrote.

        Raises:
            FoldMismatch: not such a snapshot (another version, or damaged).

        """
        try:
            data = loads(text)
            if data["v"] != SNAPSHOT_VERSION:
                raise ValueError(f"version {data['v']!r}")
            last_seq, last_id = data["last"]
            ints = [data[k] for k in ("revision", "first_seq", "prefix", "read_from", "after_seq")]
            marks = tuple((int(i), int(s)) for i, s in data["marks"])
            counts = tuple((int(i), int(n)) for i, n in data.get("counts", ()))
            if any(n < 0 for _, n in counts):
                raise ValueError("a negative count")
            if not all(type(v) is int for v in [*ints, last_seq]) or not isinstance(
                data["generation"], str
            ):
                raise TypeError("a field of the wrong type")
            if last_id is not None and not isinstance(last_id, str):
                raise TypeError("last id")
            return cls(
                generation=data["generation"],
                revision=ints[0],
                first_seq=ints[1],
                prefix=ints[2],
                read_from=ints[3],
                after_seq=ints[4],
                marks=marks,
                last_seq=last_seq,
                last_id=last_id,
                state=FoldState.from_json(data["state"]),
                counts=counts,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FoldMismatch(f"not a fold snapshot: {exc!r}") from None

    def holds_for(self, info: SessionInfo) -> bool:
        """Whether the session is still the one the snapshot was taken of."""
        return (self.generation, self.revision, self.first_seq) == (
            info.generation,
            info.revision,
            info.first_seq,
        )


@dataclass
class Folded:
    """What the manager's prompt cache knows of a session's fold for one snapshot key."""

    key: str
    first_seq: int
    """The session's ``first_seq`` when read: a trim moves every position."""
    base: int = 0
    """History index of the first message read in order: those before it are
    :class:`~ctxkeep.foldstate.Unread` but for :attr:`known`."""
    known: dict[int, int] = field(default_factory=dict)
    """History index -> seq of each message read before :attr:`base`."""
    after_seq: int = 0
    """Every message with a seq above this one is at :attr:`base` or later."""
    seed: FoldState | None = None
    """The newest fold state seen: a new pruner starts from it."""
    written: tuple[Any, ...] | None = None
    """The identity and cut of the snapshot last stored or read (nothing is written again
    until the fold cuts)."""

    def for_whole_read(self, first_seq: int) -> Folded | None:
        """This fold for a read of every message of the same session (generation and
        revision: the manager checks them), or None if the session was trimmed since: the
        same messages in the same places, so the fold's seed and what was stored hold.
        """
        if first_seq != self.first_seq:
            return None
        return Folded(self.key, self.first_seq, seed=self.seed, written=self.written)


@dataclass
class Loaded:
    """A session read for a snapshot: its info, the history (placeholders where not read), the
    seqs of the messages read in order (from ``folded.base`` on) and the snapshot's fold.
    """

    info: SessionInfo
    history: list[Any]
    seqs: list[int]
    folded: Folded
    counts: tuple[tuple[int, int], ...] = ()
    """The snapshot's counts of messages read (:attr:`FoldSnapshot.counts`)."""


def load(backend: Backend, session_id: str, key: str, prefix: int) -> Loaded | None:
    """The session as a stored snapshot under ``key`` needs it, or None (no snapshot, or one
    that does not hold for the session as it is now).
    """
    text = backend.get_fold(session_id, key)
    if text is None:
        return None
    try:
        snap = FoldSnapshot.from_text(text)
    except FoldMismatch as exc:
        log.warning("fold snapshot of session %r ignored: %s", session_id, exc)
        return None
    end = snap.state.frontier - prefix
    if snap.prefix != prefix or not 0 <= snap.read_from <= end:
        return None
    got = backend.read_rows(
        session_id, seqs=[seq for _, seq in snap.marks] + [snap.last_seq], after_seq=snap.after_seq
    )
    if got is None:
        return None
    info, rows = got
    if not snap.holds_for(info):
        return None
    tail = [(seq, record) for seq, record in rows if seq > snap.after_seq]
    by_seq = dict(rows)
    last = by_seq.get(snap.last_seq)
    if last is None or last.get("id") != snap.last_id:
        return None
    seqs = [seq for seq, _ in tail]
    if info.message_count != snap.read_from + len(tail) or len(seqs) < end - snap.read_from:
        return None
    if end - 1 >= snap.read_from and seqs[end - 1 - snap.read_from] != snap.last_seq:
        return None
    if end - 1 < snap.read_from and snap.last_seq != snap.after_seq:
        return None
    # One placeholder for every message not read: a new one per read (a fold keyed on it
    # matches the lists made from this read only).
    history: list[Any] = [Unread(f"before message {snap.read_from}")] * snap.read_from
    known: dict[int, int] = {}
    for i, seq in snap.marks:
        record = by_seq.get(seq)
        if record is None or not 0 <= i < snap.read_from:
            return None
        history[i] = record_to_message(record)
        known[i] = seq
    history += [record_to_message(r) for _, r in tail]
    written = (key, info.generation, info.revision, info.first_seq, snap.state.cut_end)
    folded = Folded(key, info.first_seq, snap.read_from, known, snap.after_seq, snap.state, written)
    return Loaded(info, history, seqs, folded, snap.counts)


def snapshot_of(
    info: SessionInfo,
    prefix: int,
    state: FoldState,
    history: list[Any],
    seq_at: Callable[[int], int | None],
    counter: Any = None,
) -> FoldSnapshot | None:
    """The snapshot of ``state`` for the session as ``info`` says, or None where a message it
    needs is not known here (its seq, or the last message's id).
    """
    end = state.frontier - prefix
    lo = state.window_start - prefix
    if end < 1 or lo < 0 or end > len(history) or type(history[end - 1]) is not Message:
        return None
    marks: list[tuple[int, int]] = []
    for i in state.needed:
        if i < prefix:
            continue  # the prompt's own system message
        seq = seq_at(i - prefix)
        if seq is None:
            return None
        marks.append((i - prefix, seq))
    last_seq = seq_at(end - 1)
    first = seq_at(lo) if lo < end else last_seq
    if last_seq is None or first is None:
        return None
    counts: list[tuple[int, int]] = []
    if counter is not None:
        for i in [m for m, _ in marks] + list(range(lo, end)):
            m = history[i]
            n = counter.cached_count(m) if type(m) is Message else None
            if n is not None:
                counts.append((i, n))
    return FoldSnapshot(
        generation=info.generation,
        revision=info.revision,
        first_seq=info.first_seq,
        prefix=prefix,
        read_from=lo,
        after_seq=first - 1 if lo < end else last_seq,
        marks=tuple(marks),
        last_seq=last_seq,
        last_id=history[end - 1].id,
        state=state,
        counts=tuple(counts),
    )


def fold_history(
    backend: Backend,
    read: Callable[[str, int], Snapshot],
    session_id: str,
    key: str,
    prefix: int,
    cached: CachedHistory | None,
    *,
    whole: bool = False,
) -> Loaded:
    """The session for a cache-stable prompt: the ``cached`` history and the messages added
    since, else (unless ``whole``) what the stored snapshot needs, else every message.
    ``read(session_id, after_seq)`` is the manager's read (it raises for a session gone).
    """
    f = cached.fold if cached is not None else None
    if cached is not None and (cached.complete or f is not None):
        after = cached.seqs[-1] if cached.seqs else (f.after_seq if f is not None else 0)
        info, rows = read(session_id, after)
        new_seqs = [seq for seq, _ in rows]
        new = [record_to_message(r) for _, r in rows]
        if (cached.generation, cached.revision) == (info.generation, info.revision):
            if cached.complete:
                keep = bisect_left(cached.seqs, info.first_seq)  # trimmed since
                if f is None or f.key != key or f.first_seq != info.first_seq:
                    f = Folded(key, info.first_seq)  # positions moved, or another fold
                return Loaded(info, cached.messages[keep:] + new, cached.seqs[keep:] + new_seqs, f)
            if f is not None and f.key == key and f.first_seq == info.first_seq:
                return Loaded(info, cached.messages + new, cached.seqs + new_seqs, f)
    if not whole:
        loaded = load(backend, session_id, key, prefix)
        if loaded is not None:
            return loaded
    info, rows = read(session_id, 0)
    return Loaded(
        info,
        [record_to_message(r) for _, r in rows],
        [seq for seq, _ in rows],
        Folded(key, info.first_seq),
    )


def fold_prompt(
    prefix: list[Message], loaded: Loaded, pruner: TokenPruner
) -> tuple[list[Message], PruneReport, FoldState | None]:
    """The pruned prompt of a loaded history, its report and the fold's state after it.

    Raises:
        FoldMismatch: the call still waiting for results is older than the messages read.

    """
    history, base = loaded.history, loaded.folded.base
    for i, n in loaded.counts:
        if i < len(history) and type(history[i]) is Message:
            pruner.counter.seed_count(history[i], n)  # type: ignore[attr-defined]
    if loaded.info.pending:
        # The unit still waiting for results is not part of a prompt.
        cut = next((i for i in range(len(history) - 1, base - 1, -1) if history[i].tool_calls), -1)
        if cut < 0 and base > 0:
            raise FoldMismatch("the pending call is older than the messages read")
        history = history[:cut] if cut >= 0 else history
    return pruner._prune_folded(prefix + history, loaded.folded.seed)


def store_fold(
    backend: Backend,
    session_id: str,
    prefix: int,
    state: FoldState,
    loaded: Loaded,
    counter: Any = None,
) -> None:
    """Store ``state`` as the session's snapshot if the fold cut since the one stored or read;
    a failed write is logged and ignored (it costs a later process a replay).
    """
    info, f = loaded.info, loaded.folded
    mark = (f.key, info.generation, info.revision, info.first_seq, state.cut_end)
    if f.written == mark:
        return
    f.written = mark
    seqs = loaded.seqs

    def seq_at(i: int) -> int | None:
        if i >= f.base:
            return seqs[i - f.base] if i - f.base < len(seqs) else None
        return f.known.get(i)

    snap = snapshot_of(info, prefix, state, loaded.history, seq_at, counter)
    if snap is None:
        return
    try:
        backend.put_fold(session_id, info.generation, f.key, snap.to_text())
    except CtxkeepError as exc:
        log.warning("fold snapshot of session %r not stored: %s", session_id, exc)


__all__: list[str] = []

"""The pruner's report: what a prune did with every input message, and why.

:class:`~ctxkeep.prune.pruner.TokenPruner` decides a fate for each input message (kept,
compressed, dropped or summarised, with a reason and its tokens in the output) and hands the
fates to a :class:`PruneReport`. The per-message :class:`MessageDecision` list is built from
them only when :attr:`PruneReport.decisions` is read, and the counts need no list at all, so a
prune that nobody inspects costs nothing per dropped message. A repaired input message is
reported as it was given (:func:`_with_originals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from ctxkeep.foldstate import Unread
from ctxkeep.messages import Message
from ctxkeep.prune.inputs import LazyMessages, Messages

Action: TypeAlias = Literal["kept", "compressed", "dropped", "summarised"]


@dataclass(frozen=True)
class MessageDecision:
    """What the pruner did with one input message."""

    index: int
    """Position in the input."""
    role: str
    """The message's role."""
    action: Action
    """kept, compressed, dropped, or summarised (dropped, and covered by the summary)."""
    reason: str
    """Why, in a few words."""
    tokens_before: int
    """Tokens of the message as given."""
    tokens_after: int
    """Tokens it takes in the output (0 if dropped)."""
    artifact_ref: str | None = None
    """For a compressed message: where its full text is."""


@dataclass
class PruneReport:
    """What a prune kept, compressed and dropped, why, and the tokens of each section."""

    budget: int
    """The token budget."""
    tokens_after: int
    """Tokens of the output (overhead and reply priming included)."""
    sections: dict[str, int]
    """Output tokens per section: system, history, tools, summary, priming."""
    summary_error: str | None = None
    """Why no summary stands in for dropped history, if a summarizer was given and failed."""
    notes: list[str] = field(default_factory=list)
    """Notable events (recent outputs compressed, recent units dropped, pending calls)."""
    stable_prefix_messages: int | None = None
    """Cache-stable mode: how many leading output messages stay exactly as they are until the
    next cut (what a provider cache written at the cut can hit); None in the default mode."""
    stable_prefix_tokens: int | None = None
    """Cache-stable mode: the tokens of those messages (overhead included)."""
    _messages: Sequence[Message | Unread] = field(default=(), repr=False)
    _tokens: Any = field(default=None, repr=False)
    _fates: dict[int, tuple[Action, str, int, str | None]] = field(default_factory=dict, repr=False)
    _default_fate: tuple[Action, str] = field(default=("dropped", "over budget"), repr=False)

    @property
    def decisions(self) -> list[MessageDecision]:
        """One decision per input message, in input order (built on first access).

        Raises:
            InvalidMessageError: an input dict the prune never had to read (older history,
                dropped) is read here to count it, and is malformed.

        """
        out = []
        for i, m in enumerate(self._messages):
            if type(m) is Unread:
                continue  # not read: older history a fold snapshot stood for
            before = self._tokens(m)
            fate = self._fates.get(i)
            if fate is None:
                action, reason = self._default_fate
                out.append(MessageDecision(i, m.role, action, reason, before, 0))
            else:
                action, reason, after, ref = fate
                out.append(MessageDecision(i, m.role, action, reason, before, after, ref))
        return out

    @property
    def tokens_before(self) -> int:
        """Tokens of the input as a prompt (of the messages read: see :attr:`unread`)."""
        read = (m for m in self._messages if type(m) is not Unread)
        return int(sum(self._tokens(m) for m in read) + self.sections.get("priming", 0))

    @property
    def unread(self) -> int:
        """Input messages the prune did not read: older history dropped at an earlier cut of
        a cache-stable fold, which the session's fold snapshot stood for (a session's first
        prompt of a process reads from the snapshot on). They count as dropped, and are in
        neither :attr:`decisions` nor :attr:`tokens_before`.
        """
        return sum(1 for m in self._messages if type(m) is Unread)

    def count(self, action: Action) -> int:
        """How many input messages got ``action``."""
        if action == self._default_fate[0]:
            return len(self._messages) - sum(1 for f in self._fates.values() if f[0] != action)
        return sum(1 for f in self._fates.values() if f[0] == action)

    def summary(self) -> dict[str, Any]:
        """Totals, for logs and ``--json`` output."""
        return {
            "budget": self.budget,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "sections": dict(self.sections),
            "kept": self.count("kept"),
            "compressed": self.count("compressed"),
            "dropped": self.count("dropped"),
            "summarised": self.count("summarised"),
            "summary_error": self.summary_error,
            "unread": self.unread,
            "notes": list(self.notes),
            "stable_prefix_messages": self.stable_prefix_messages,
            "stable_prefix_tokens": self.stable_prefix_tokens,
        }


def _with_originals(msgs: Messages, originals: dict[int, Message]) -> Sequence[Message]:
    """The input as given: repaired messages replaced by their originals (for the report)."""
    if isinstance(msgs, LazyMessages):
        return msgs.with_originals(originals) if originals else msgs
    assert isinstance(msgs, list)
    if not originals:
        return msgs
    out = list(msgs)
    for j, m in originals.items():
        out[j] = m
    return out


__all__ = [
    "Action",
    "MessageDecision",
    "PruneReport",
]

"""A prompt from the newest pages of a long session: when a prune of them is the prune of it all.

The default mode of :class:`~ctxkeep.TokenPruner` walks a history's units from the newest back
and stops at the first older unit that does not fit the budget; besides the units it walks it
reads only the system messages, the newest user message and the conversation's head (the first
user message and the ``keep_first`` units from it), which it keeps wherever they are. So a
prompt of a 10,000-message session needs the newest few pages of it and those messages, not
every record decoded: :meth:`~ctxkeep.sessions.base.MemoryManager.build_prompt_messages` reads
the session newest first (:meth:`~ctxkeep.sessions.base.Backend.read_tail`), prunes what it
has, and reads an older page only when :func:`prompt_from_tail` cannot prove that the prune of
what it has is the prune of the whole session.

The proof, for a *partial* history ``P`` = the prompt's own system message, the older system
messages, the head (where it is older than the suffix) and the newest user message if the
suffix has none, then a contiguous suffix of the session (the newest messages, oldest first),
each in session order:

* the suffix starts at a unit boundary: its oldest message ``b`` is not a tool result or a system
  message (the messages before ``b`` are left out, but for the marks among them);
* the units newer than ``b``'s unit hold at least ``preserve_last_n`` messages, so the walk's
  recent units (and the one unit it takes past them) never reach beyond ``b``;
* the newest user message has content (else the pruner pins an older one, anywhere);
* the head given is whole: it starts with a user message with content and holds
  ``keep_first`` units, each tool call with all its results (so the head ``P`` has is the
  head of the history: ``P``'s next unit starts after it, in the suffix or the newest user
  message). A head that the suffix cuts is not proved: the read goes on until the suffix holds
  it all. That the marks hold the head at all is the caller's word (see ``marks``);
* the prune of ``P`` dropped ``b`` for the budget, and repaired nothing: so the walk stopped at a
  unit of the suffix that did not fit, and never read older messages.

Everything the pruner read is then the same in ``P`` and in the whole history, in the same order,
so its output is the same (indexes differ; the output does not carry them). What fails the proof
is answered by reading an older page, up to the whole session. The cache-stable mode (the
default of ``TokenPruner()``) and a summarizer need the whole history: a cache-stable prompt is a
replay of the history from its first message (:mod:`ctxkeep.prune.stable`; a fold snapshot
stored with the session stands for the replay up to its last cut), and a summary covers every
dropped message. A summarizer, a pruner of another type, and no pruner at all read every message.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxkeep.messages import SYSTEM_ROLES, Message, missing_content
from ctxkeep.prune.config import is_plain_pruner

if TYPE_CHECKING:
    from ctxkeep.prune.pruner import TokenPruner
    from ctxkeep.prune.report import PruneReport

FIRST_PAGE = 64
"""Messages in the first page of a paged prompt read; each further page is twice the last."""


def pages_suffice(pruner: Any) -> bool:
    """Whether a prompt for ``pruner`` can be built from the newest pages of a session: a
    :class:`~ctxkeep.TokenPruner` itself (not a subclass, which may prune otherwise) in its
    default mode, without a summarizer.
    """
    return is_plain_pruner(pruner) and not pruner.cache_stable and pruner.summarizer is None


def prompt_from_tail(
    pruner: TokenPruner,
    prefix: list[Message],
    marks: list[Message],
    suffix: list[Message],
) -> tuple[list[Message], PruneReport] | None:
    """The pruned prompt of a session from its newest messages, or None if more are needed.

    Args:
        pruner: a pruner for which :func:`pages_suffice` holds.
        prefix: the prompt's own system message, if any.
        marks: the messages older than ``suffix`` that the prune reads wherever they are, in
            session order: every system message; with ``pruner.keep_first`` = N > 0, the
            session's **head**: its first user message that has content and every message
            after it (tool results included) before the (N+1)-th message, counting from it,
            that is neither a tool result nor a system message nor a message without content
            (an assistant tool call without text counts); and the newest user message older
            than ``suffix`` (needed only if ``suffix`` has none; given once if it is in the
            head). Head messages that are in ``suffix`` are not marks.
        suffix: every message of the session from some point to the newest (calls still
            waiting for results left out), in order.

    Returns:
        ``pruner.prune_with_report(prefix + history)`` for the whole history, when the module
        docstring's proof holds (the report's indexes are those of the messages read, in the
        order read: its ``_messages``); else None (read an older page).

    """
    # The suffix from its first unit boundary on: tool results before it answer a call older
    # than the suffix (the system messages among them are marks like the older ones).
    lo = next((i for i, m in enumerate(suffix) if m.role not in SYSTEM_ROLES | {"tool"}), None)
    if lo is None:
        return None
    marks = marks + [m for m in suffix[:lo] if m.role in SYSTEM_ROLES]
    suffix = suffix[lo:]
    lo = 0
    end = lo + 1
    while end < len(suffix) and suffix[end].role == "tool":
        end += 1
    newer = sum(1 for m in suffix[end:] if m.role not in SYSTEM_ROLES)
    if newer < pruner.preserve_last_n:
        return None
    rest = [m for m in marks if m.role not in SYSTEM_ROLES]
    head = _head(rest, pruner.keep_first)
    if head is None:
        return None  # a head cut by the suffix (or by a call whose results are in it)
    oldest = suffix[lo]
    if pruner.keep_first and not head and oldest.role == "user" and not missing_content(oldest):
        # No head among the marks, so no older user message has content: the suffix's
        # oldest unit is the head, which the walk never takes (the head rule keeps,
        # compresses or drops it), so its fate cannot show where the walk stopped.
        return None
    extra = rest[len(head) :]
    if len(extra) > 1 or any(m.role != "user" for m in extra):
        return None  # not marks this proof knows
    user = next((m for m in reversed(suffix) if m.role == "user"), None)
    taken = {id(m) for m in head}
    if user is None:
        user = extra[0] if extra else next((m for m in reversed(head) if m.role == "user"), None)
        taken |= {id(m) for m in extra}
    if user is not None and missing_content(user):
        return None
    read = [m for m in marks if m.role in SYSTEM_ROLES or id(m) in taken]
    msgs = prefix + read + suffix
    try:
        out, report = pruner.prune_with_report(msgs)
    except Exception:  # an error names input indexes: the whole read raises it as it is
        return None
    # The report's fates by input index: only messages kept or compressed are in it, else
    # "dropped for the budget" is its default (a repair, a summary or a pending call would
    # leave another fate, and the walk may then have gone further: read on).
    fates = report._fates
    if any(f[0] not in ("kept", "compressed") for f in fates.values()):
        return None
    if len(prefix) + len(read) + lo in fates:
        return None  # the walk reached the suffix's oldest unit and kept it: read on
    return out, report


def _head(rest: list[Message], keep_first: int) -> list[Message] | None:
    """The head among the non-system ``marks`` (their first messages: see
    :func:`prompt_from_tail`), or None where it is not whole there: fewer than ``keep_first``
    units, or a tool call whose results are not all in it.
    """
    if not keep_first or not rest or rest[0].role != "user" or missing_content(rest[0]):
        return []
    head: list[Message] = []
    starts = 0
    for m in rest:
        if m.role != "tool":
            if starts == keep_first:
                break
            if not (m.tool_calls or not missing_content(m)):
                return None  # dropped as empty: not a unit, yet a mark; read on
            starts += 1
        head.append(m)
    calls = {tc.id for m in head for tc in m.tool_calls}
    if starts < keep_first or not calls <= {m.tool_call_id for m in head if m.role == "tool"}:
        return None
    return head

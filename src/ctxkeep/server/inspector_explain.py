"""What the inspector says about a prompt in words: the window a session's prompts used, why a
cache-stable prompt left history out, and its notes once each.

Pure functions over a session's stored messages and a build's report, for the routes of
:mod:`ctxkeep.server.inspector`:

* :func:`session_window`: the window (and reply reserve) the session's prompts were built
  with, from what the session records: a reply whose metadata names the window its prompt was
  built in (``max_prompt_tokens``, ``reserve_output_tokens``), else a reply's ``model`` (what
  :class:`~ctxkeep.llm.ChatClient` stores with every reply) looked up in
  :data:`ctxkeep.llm.models.MODELS` as the client does; else the prompt route's defaults, and
  it says so.
* :func:`cache_explanation`: a cache-stable prompt that leaves messages out while far under
  its budget looks like a bug; this says, in plain words, that the prompt is cut in jumps so
  that its start stays the same from call to call and the provider's prompt cache is reused,
  and what that saves (the tokens read back from the cache instead of recomputed).
* :func:`distinct_notes`: the build's and the pruner's notes, each once, with how often it
  was given (the pruner notes one per recent output it compressed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from ctxkeep.builder import BuildReport
from ctxkeep.builder.core import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_RESERVE_OUTPUT_TOKENS
from ctxkeep.llm.models import known_limits, resolve_limits
from ctxkeep.messages import Message

WindowSource: TypeAlias = Literal["recorded", "model", "default"]

CACHE_PRICES = "Anthropic bills cache reads at 0.1x the input price, OpenAI cached input at 0.5x"
"""The providers' discounts, as :mod:`ctxkeep.prune.stable` gives them."""


@dataclass(frozen=True, kw_only=True)
class SessionWindow:
    """The window a session's prompts were built with, and where that was found."""

    max_prompt_tokens: int
    """The model's window."""
    reserve_output_tokens: int
    """The part of it kept for the reply."""
    source: WindowSource
    """``recorded``: a reply's metadata names it; ``model``: the window of the model a reply
    names; ``default``: nothing in the session says, the prompt route's defaults."""
    model: str | None
    """The model a reply names, if any."""
    message_index: int | None
    """The reply it was read from."""
    explanation: str
    """Where the figures come from, in a sentence."""


def _int(value: object) -> int | None:
    return value if type(value) is int and value > 0 else None


def session_window(messages: Sequence[Message]) -> SessionWindow:
    """The window the session's newest replies were built with (see the module docstring)."""
    replies = [(i, m) for i, m in enumerate(messages) if m.role == "assistant"]
    for i, m in reversed(replies):
        window = _int(m.metadata.get("max_prompt_tokens"))
        if window is None:
            continue
        reserve = m.metadata.get("reserve_output_tokens")
        reserve = reserve if type(reserve) is int and 0 <= reserve < window else 0
        return SessionWindow(
            max_prompt_tokens=window,
            reserve_output_tokens=reserve,
            source="recorded",
            model=_model(m),
            message_index=i,
            explanation=(
                f"Reply #{i} records the window its prompt was built in: "
                f"{window:,} tokens, {reserve:,} of them kept for the reply."
            ),
        )
    for i, m in reversed(replies):
        model = _model(m)
        if model is None or known_limits(model) is None:
            continue
        limits = resolve_limits(model, context_window=None, max_output_tokens=None)
        return SessionWindow(
            max_prompt_tokens=limits.context_window,
            reserve_output_tokens=limits.default_output_tokens,
            source="model",
            model=model,
            message_index=i,
            explanation=(
                f"Reply #{i} came from {model}, whose window is {limits.context_window:,} "
                f"tokens; a ChatClient for it keeps {limits.default_output_tokens:,} for the "
                "reply by default (more if the call gave max_tokens or tool definitions). "
                "The session does not record the exact figures."
            ),
        )
    return SessionWindow(
        max_prompt_tokens=DEFAULT_MAX_PROMPT_TOKENS,
        reserve_output_tokens=DEFAULT_RESERVE_OUTPUT_TOKENS,
        source="default",
        model=None,
        message_index=None,
        explanation=(
            "Nothing in this session records the window its prompts were built with (no reply "
            "names a window or a known model), so these are the defaults of "
            f"POST /v1/sessions/{{id}}/prompt: a window of {DEFAULT_MAX_PROMPT_TOKENS:,} "
            f"tokens, {DEFAULT_RESERVE_OUTPUT_TOKENS:,} of them kept for the reply. Set your "
            "model's window here to see its prompts."
        ),
    )


def _model(m: Message) -> str | None:
    model = m.metadata.get("model")
    return model if isinstance(model, str) and model else None


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def cache_explanation(report: BuildReport, low_water: float) -> list[str]:
    """Why a cache-stable prompt left out (or compressed) history, and what that saves, in
    plain words; empty when the prompt is not cache-stable or kept the whole history as it
    was. ``low_water`` is the pruner's: the share of the budget a cut prunes down to.
    """
    p = report.prune
    if p.stable_prefix_messages is None:
        return []
    dropped = p.count("dropped") + p.count("summarised")
    compressed = p.count("compressed")
    if not dropped and not compressed:
        return []
    budget = p.budget
    low = math.floor(low_water * budget)
    parts = [f"{_n(dropped, 'message')} left out"] if dropped else []
    parts += [f"{_n(compressed, 'tool output')} compressed"] if compressed else []
    verb = "is" if (dropped or compressed) == 1 else "are"
    what = " and ".join(parts)
    if report.prompt_tokens <= low:  # far under the budget: what looks like a bug
        lead = (
            f"Why {verb} {what}, though the prompt uses only {report.prompt_tokens:,} of its "
            f"{report.prompt_budget:,} tokens? This prompt is kept cache-stable."
        )
    else:
        lead = (
            f"Why {verb} {what}? The history does not fit the prompt's "
            f"{report.prompt_budget:,} tokens, and this prompt is kept cache-stable."
        )
    why = (
        f"{lead} A provider reuses the start of a prompt it has already seen (its prompt "
        "cache): those tokens are read back instead of recomputed, and cost less "
        f"({CACHE_PRICES} or less). Dropping the oldest message at every call would change "
        "the start of every prompt, and nothing would ever be reused."
    )
    how = (
        "So the history is cut in jumps: when it last overflowed the budget, the prompt was "
        f"cut once, down to the low-water mark ({low:,} tokens, {round(low_water * 100)}% of "
        "the budget), leaving out or compressing what did not fit under it. Since then each "
        "new message is only appended, so every call starts the same way, until the budget "
        "is full and the next cut."
    )
    stable_messages = p.stable_prefix_messages
    stable_tokens = p.stable_prefix_tokens or 0
    saves = (
        f"What it saves: the first {_n(stable_messages, 'message')} of this prompt "
        f"({stable_tokens:,} of its {report.prompt_tokens:,} tokens) stay exactly as they are "
        f"until the next cut, so each call until then can read at least those "
        f"{stable_tokens:,} tokens back from the provider's cache instead of recomputing them."
    )
    return [why, how, saves]


def distinct_notes(notes: Iterable[str]) -> list[tuple[str, int]]:
    """Each note once, in the order first given, with how many times it was given."""
    counts: dict[str, int] = {}
    for n in notes:
        counts[n] = counts.get(n, 0) + 1
    return list(counts.items())


__all__ = [
    "SessionWindow",
    "WindowSource",
    "cache_explanation",
    "distinct_notes",
    "session_window",
]

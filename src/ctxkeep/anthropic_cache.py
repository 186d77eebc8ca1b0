"""Anthropic prompt caching: ``cache_control`` breakpoints on a prompt's stable prefix.

Anthropic bills a cache read at 0.1x the input price and a cache write at 1.25x, for the prefix
up to a block marked ``cache_control`` (at most four marks a request). A pruned prompt's stable
prefix (:attr:`~ctxkeep.PruneReport.stable_prefix_messages`, what stays until the pruner's next
cut) is where a mark pays: :func:`place_cache_breakpoints` puts the marks on an Anthropic
payload (:func:`~ctxkeep.to_anthropic`). This lives with the Anthropic format, not with the
pruner that says how long the prefix is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from ctxkeep.errors import ConfigError, describe
from ctxkeep.messages import AnthropicPayload, coerce_messages, to_anthropic

ANTHROPIC_MAX_BREAKPOINTS = 4
"""Anthropic accepts at most four ``cache_control`` breakpoints per request."""


def _mark(block_holder: dict[str, Any], key: str, control: dict[str, str]) -> bool:
    """Put ``cache_control`` on the last block of ``block_holder[key]`` (text becomes a block)."""
    content = block_holder.get(key)
    if isinstance(content, str):
        if not content:
            return False  # Anthropic refuses cache_control on an empty text block
        content = [{"type": "text", "text": content}]
        block_holder[key] = content
    if not isinstance(content, list) or not content:
        return False
    last = content[-1]
    if last.get("type") in ("thinking", "redacted_thinking"):
        return False  # thinking blocks cannot carry cache_control
    last["cache_control"] = dict(control)
    return True


def _count_marks(payload: AnthropicPayload) -> int:
    n = sum(1 for b in payload.system if "cache_control" in b)
    for m in payload.messages:
        if isinstance(m["content"], list):
            n += sum(1 for b in m["content"] if isinstance(b, dict) and "cache_control" in b)
    return n


def place_cache_breakpoints(
    messages: Iterable[Any],
    *,
    stable_prefix: int = 0,
    ttl: Literal["5m", "1h"] | None = None,
    max_breakpoints: int = ANTHROPIC_MAX_BREAKPOINTS,
) -> AnthropicPayload:
    """``messages`` as an Anthropic payload with ``cache_control`` breakpoints on its prefix.

    Breakpoints go, in this order of priority, on the last block of the last message (the
    whole prompt is written to the cache, so the next turn, which starts with it, reads it),
    on the last system block (tools and system are read even after a cut), and on the block
    that ends the first ``stable_prefix`` messages (a prompt's prefix that stays until the
    next cut: :attr:`~ctxkeep.prune.PruneReport.stable_prefix_messages`). A prefix shorter
    than the model's minimum (1,024 tokens on most Claude models) is simply not cached;
    Anthropic does not refuse it.

    Args:
        messages: the prompt (``Message`` objects or OpenAI dicts), as pruned.
        stable_prefix: how many leading messages stay the same until the next cut (0: none).
        ttl: ``"5m"`` or ``"1h"``; None leaves Anthropic's default (5 minutes).
        max_breakpoints: at most this many breakpoints in all (1-4; those already in the
            payload's content count too).

    Returns:
        The :class:`~ctxkeep.messages.AnthropicPayload` (``.kwargs()`` for
        ``messages.create``).

    Raises:
        ConfigError: a bad ``stable_prefix``, ``ttl`` or ``max_breakpoints``.

    """
    if isinstance(max_breakpoints, bool) or not isinstance(max_breakpoints, int):
        raise ConfigError(f"max_breakpoints must be an int, got {describe(max_breakpoints)}")
    if not 1 <= max_breakpoints <= ANTHROPIC_MAX_BREAKPOINTS:
        raise ConfigError(
            f"max_breakpoints must be 1-{ANTHROPIC_MAX_BREAKPOINTS} (Anthropic's limit), "
            f"got {max_breakpoints}"
        )
    if ttl not in (None, "5m", "1h"):
        raise ConfigError(f"ttl must be '5m', '1h' or None, got {describe(ttl)}")
    if isinstance(stable_prefix, bool) or not isinstance(stable_prefix, int) or stable_prefix < 0:
        raise ConfigError(f"stable_prefix must be an int >= 0, got {describe(stable_prefix)}")
    msgs = coerce_messages(messages)
    payload = to_anthropic(msgs)
    control: dict[str, str] = {"type": "ephemeral"}
    if ttl is not None:
        control["ttl"] = ttl
    room = max_breakpoints - _count_marks(payload)
    marks: list[tuple[dict[str, Any], str]] = []
    if payload.messages:
        marks.append((payload.messages[-1], "content"))
    if payload.system:
        marks.append(({"system": payload.system}, "system"))
    stable = min(stable_prefix, len(msgs))
    head = to_anthropic(msgs[:stable]).messages if 0 < stable < len(msgs) else []
    if head:
        # The prefix ends in message k-1 of the whole payload, after as many blocks as the
        # prefix alone has there (the tool results of one turn are merged into one message).
        k = len(head)
        target = payload.messages[k - 1]
        n_blocks = _blocks(head[-1])
        if not (k == len(payload.messages) and n_blocks == _blocks(target)):
            if isinstance(target["content"], list) and n_blocks < len(target["content"]):
                marks.append(({"content": target["content"][:n_blocks]}, "content"))
            else:
                marks.append((target, "content"))
    for holder, key in marks:
        if room <= 0:
            break
        if _mark(holder, key, control):
            room -= 1
    return payload


def _blocks(message: dict[str, Any]) -> int:
    content = message["content"]
    return len(content) if isinstance(content, list) else 1


__all__ = ["ANTHROPIC_MAX_BREAKPOINTS", "place_cache_breakpoints"]

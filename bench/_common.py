"""Shared pieces of the benchmarks: the data, the exact counter, and the pruners compared.

The pruners all map a prompt (``list[Message]``) to what would be sent (``list[Message]``),
the shape :func:`ctxkeep.replay.replay_run` expects, and everything they send is measured by
the same exact counter (o200k_base, OpenAI's message accounting: 3 per message + role +
content + name, tool calls counted, 3 for the reply priming).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ctxkeep.messages import Message, coerce_messages
from ctxkeep.tokens import TokenCounter, get_counter

SHARED_DATA_ENV = "CTXKEEP_SHARED_DATA"
ENCODING = "o200k_base"

Pruner = Callable[[list[Message]], list[Message]]

# -- data -------------------------------------------------------------------------------------


def shared_data_dir() -> Path | None:
    """``$CTXKEEP_SHARED_DATA`` or ``../shared/data`` next to the repository, if present."""
    candidates = []
    if os.environ.get(SHARED_DATA_ENV):
        candidates.append(Path(os.environ[SHARED_DATA_ENV]))
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for path in candidates:
        if (path / "trajectories").is_dir():
            return path
    return None


def require_shared_data() -> Path:
    """The shared data folder, or exit with a message saying how to provide it."""
    data = shared_data_dir()
    if data is None:
        sys.exit(
            "error: no trajectories found: this benchmark needs ../shared/data/trajectories "
            f"(next to the repository) or ${SHARED_DATA_ENV} pointing at a folder holding "
            "trajectories/"
        )
    return data


def load_runs(data: Path, pattern: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(name, OpenAI messages)`` of every trajectory file matching ``pattern``, by name."""
    runs = []
    for path in sorted((data / "trajectories").glob(pattern)):
        record = json.loads(path.read_text(encoding="utf-8"))
        runs.append((path.stem, record["messages"]))
    return runs


def exact_counter() -> TokenCounter:
    """The one counter every pruner's output is measured with."""
    return get_counter(ENCODING)


# -- LangChain trim_messages ------------------------------------------------------------------

# The configuration of the README's anchor ("strategy last, exact counter"): the newest
# messages that fit, the first system message kept, no partial messages, no start_on / end_on.
TRIM_KWARGS: dict[str, Any] = {
    "strategy": "last",
    "include_system": True,
    "allow_partial": False,
}


def require_langchain() -> None:
    """Exit with a message if langchain-core is not installed."""
    try:
        import langchain_core.messages  # noqa: F401
    except ImportError:
        sys.exit("error: this benchmark needs langchain-core: pip install -e '.[dev]'")


def trim_kwargs_text(budget: int | str = "BUDGET", extra: dict[str, Any] | None = None) -> str:
    """The ``trim_messages`` call, as text, for tables and reports."""
    kw = {**TRIM_KWARGS, **(extra or {})}
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return f"trim_messages(msgs, max_tokens={budget}, token_counter=exact, {args})"


def langchain_exact_counter(counter: TokenCounter) -> Callable[[list[Any]], int]:
    """A ``trim_messages`` token counter that counts what ``counter.count_messages`` counts.

    The LangChain messages are converted back to OpenAI dicts (``convert_to_openai_messages``,
    the form a LangChain app sends) and counted with ctxkeep's exact counter, reply priming
    included, so LangChain is held to exactly the budget definition ctxkeep is held to. Like
    any user-written counter it has no cache: ``trim_messages`` calls it on whole lists.
    """
    from langchain_core.messages import convert_to_openai_messages

    def count(messages: list[Any]) -> int:
        return counter.count_messages(convert_to_openai_messages(messages))

    return count


def to_langchain(messages: Sequence[Message]) -> list[Any]:
    """LangChain messages from ctxkeep messages (via their OpenAI form)."""
    from langchain_core.messages import convert_to_messages

    return list(convert_to_messages([m.to_openai() for m in messages]))


def from_langchain(messages: Sequence[Any]) -> list[Message]:
    """ctxkeep messages of what a LangChain app sends (``convert_to_openai_messages``)."""
    from langchain_core.messages import convert_to_openai_messages

    return coerce_messages(convert_to_openai_messages(list(messages)))


class TrimPruner:
    """LangChain ``trim_messages`` with the exact counter, as a ``replay_run`` pruner.

    Each input message is converted to LangChain once (the conversion is not part of
    ``trim_messages`` and is not what is compared); the output is converted back with
    ``convert_to_openai_messages``, which is what gets measured.
    """

    def __init__(
        self, budget: int, counter: TokenCounter, extra: dict[str, Any] | None = None
    ) -> None:
        self.budget = budget
        self.token_counter = langchain_exact_counter(counter)
        self.kwargs = {**TRIM_KWARGS, **(extra or {})}
        # id(message) -> (message, its LangChain twin); the message is held so ids stay unique.
        self._converted: dict[int, tuple[Message, Any]] = {}

    def _lc(self, messages: Sequence[Message]) -> list[Any]:
        out = []
        todo = [m for m in messages if self._converted.get(id(m), (None,))[0] is not m]
        for m, lc in zip(todo, to_langchain(todo), strict=True):
            self._converted[id(m)] = (m, lc)
        for m in messages:
            out.append(self._converted[id(m)][1])
        return out

    def trim(self, lc_messages: list[Any]) -> list[Any]:
        """One ``trim_messages`` call on LangChain messages."""
        from langchain_core.messages import trim_messages

        return list(
            trim_messages(
                lc_messages,
                max_tokens=self.budget,
                token_counter=self.token_counter,
                **self.kwargs,
            )
        )

    def __call__(self, messages: list[Message]) -> list[Message]:
        return from_langchain(self.trim(self._lc(messages)))


# -- the naive chars/4 pruner -----------------------------------------------------------------

NAIVE_RULE = (
    "system + last N kept whole; older messages added newest first, tool outputs cut to "
    "120 chars, each one that still fits an estimate of ceil(len(content)/4) per message"
)


def _estimate(m: Message) -> int:
    return math.ceil(len(m.text) / 4)


def naive_pruner(budget: int, last_n: int) -> Pruner:
    """The README's naive pruner: chars/4 estimates, no notion of tool-call units."""

    def prune(messages: list[Message]) -> list[Message]:
        system = [m for m in messages if m.role in ("system", "developer")]
        conv = [m for m in messages if m.role not in ("system", "developer")]
        recent = conv[len(conv) - last_n :] if last_n else []
        older = conv[: len(conv) - len(recent)]
        used = sum(_estimate(m) for m in (*system, *recent))
        kept: list[Message] = []
        for m in reversed(older):
            if m.role == "tool":
                m = m.replace(content=m.text[:120])
            cost = _estimate(m)
            if used + cost <= budget:
                kept.append(m)
                used += cost
        return [*system, *reversed(kept), *recent]

    return prune


# -- formatting -------------------------------------------------------------------------------


def millions(n: int) -> str:
    """``16,468,844`` -> ``16.47M`` (short figures for tables)."""
    if n >= 1_000_000:
        return f"{n / 1e6:.2f}M"
    if n >= 10_000:
        return f"{n / 1e3:.0f}k"
    return f"{n:,}"


def write_json(payload: dict[str, Any], target: str) -> None:
    """Write ``payload`` to ``target`` (``-`` for stdout)."""
    text = json.dumps(payload, indent=2)
    if target == "-":
        print(text)
    else:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(text + "\n", encoding="utf-8")


@dataclass(frozen=True)
class Group:
    """A family of trajectories replayed with one budget (the figures BENCHMARKS.md quotes)."""

    name: str
    pattern: str
    budget: int
    last_n: int


GROUPS = (
    Group("mini-swe", "mini-swe-*.json", 6000, 6),
    Group("tau", "tau-*.json", 4000, 6),
    Group("swe-agent", "swe-agent-*.json", 6000, 6),
)

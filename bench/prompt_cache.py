"""What a provider prompt cache can hit, and what it costs: ctxkeep default, cache-stable, trim.

Every assistant step of every trajectory in ``../shared/data/trajectories`` is replayed in
order (the prompt before it, pruned), as ``bench/replay_compare.py`` does, through:

* ctxkeep's default mode: ``TokenPruner(budget, last_n)``;
* ctxkeep's cache-stable mode: ``TokenPruner(budget, last_n, cache_stable=True)`` (cut to the
  low-water mark, 0.7 of the budget, then append until the budget is full);
* LangChain ``trim_messages`` (strategy last, the same exact counter; see ``bench/_common.py``).

Measured per prompt, and summed per group:

* tokens sent: ctxkeep's exact counter (o200k_base, 3 per message + role + content + name,
  tool calls counted, 3 for reply priming), the same as ``replay_compare.py``;
* cacheable prefix: the longest common prefix of this prompt and the previous one (the
  previous step of the same run, pruned by the same pruner) as a provider sees them. Each
  message is serialised as its OpenAI chat JSON (``json.dumps(m.to_openai(), sort_keys=True,
  ensure_ascii=False)``) and tokenised with o200k_base; the prompt is the concatenation, in
  order. Messages equal in that form count whole (their exact counter tokens); in the first
  message that differs, the common prefix of the two token sequences counts (at most that
  message's counter tokens). The share is cacheable / sent;
* cost in US$ of the whole replay, input tokens only, under the published prices (per million
  input tokens, as listed by the providers in 2025; change ``PRICES`` to update):

  ===========================  ======  ==============  ===========
  model family                 input   cache write     cache read
  ===========================  ======  ==============  ===========
  Anthropic Claude Sonnet 4.x  $3.00   $3.75 (1.25x)   $0.30 (0.1x)
  OpenAI GPT-4o                $2.50   (automatic)     $1.25 (0.5x)
  OpenAI GPT-4.1               $2.00   (automatic)     $0.50 (0.25x)
  OpenAI GPT-5                 $1.25   (automatic)     $0.125 (0.1x)
  ===========================  ======  ==============  ===========

  (Claude Haiku 4.5, $1.00 / $1.25 / $0.10, has Sonnet's ratios: its costs are Sonnet's / 3.)

  OpenAI caches automatically: a prompt whose common prefix with an earlier one is at least
  1,024 tokens reads it in steps of 128 tokens; nothing is billed for writing. Anthropic reads
  only up to a ``cache_control`` breakpoint that an earlier request wrote; the breakpoints are
  those :func:`ctxkeep.anthropic_cache.place_cache_breakpoints` places: the end of the prompt
  (written by every request, read by the next one if it starts with the whole previous prompt), the
  end of the system messages, and, in the cache-stable mode, the end of the stable prefix
  reported by the pruner (written by the request that made the cut). A read needs at least
  1,024 tokens (Sonnet's minimum). Everything after the read up to the end of the prompt is
  written at 1.25x. "Anthropic, no cache" is the same prompts without breakpoints (1x), the
  cheaper choice for a pruner whose prefix never repeats.

Counts are o200k_base tokens for every provider (Anthropic's tokenizer is not public); the
ratios between pruners are what to read.

Usage:
    python bench/prompt_cache.py
    python bench/prompt_cache.py --group mini-swe --limit 5
    python bench/prompt_cache.py --low-water 0.6
    python bench/prompt_cache.py --json bench/out/prompt_cache.json
    python bench/prompt_cache.py --json            # JSON on stdout instead of tables
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from _common import (
    ENCODING,
    GROUPS,
    TrimPruner,
    load_runs,
    require_langchain,
    require_shared_data,
)
from _common import write_json as dump_json
from ctxkeep.errors import BudgetExceededError, MessageError
from ctxkeep.messages import Message, coerce_messages, validate_sequence
from ctxkeep.prune import TokenPruner
from ctxkeep.replay import step_prompts
from ctxkeep.tokens import TokenCounter, get_counter

OPENAI_MIN, OPENAI_STEP, ANTHROPIC_MIN = 1024, 128, 1024

# $ per million input tokens: (input, cache write, cache read); write None = automatic, free.
PRICES: dict[str, tuple[float, float | None, float]] = {
    "anthropic_sonnet": (3.00, 3.75, 0.30),
    "openai_gpt4o": (2.50, None, 1.25),
    "openai_gpt41": (2.00, None, 0.50),
    "openai_gpt5": (1.25, None, 0.125),
}


# A pruner here returns (prompt, stable prefix messages or 0).
Prune = Callable[[list[Message]], tuple[list[Message], int]]


def contenders(
    low_water: float,
) -> dict[str, tuple[str, Callable[[int, int, TokenCounter], Prune]]]:
    def ctxkeep(stable: bool) -> Callable[[int, int, TokenCounter], Prune]:
        def make(b: int, n: int, c: TokenCounter) -> Prune:
            pruner = TokenPruner(b, n, c, cache_stable=stable, low_water=low_water)

            def prune(msgs: list[Message]) -> tuple[list[Message], int]:
                out, report = pruner.prune_with_report(msgs)
                return out, report.stable_prefix_messages or 0

            return prune

        return make

    def trim(b: int, n: int, c: TokenCounter) -> Prune:
        t = TrimPruner(b, c)
        return lambda msgs: (t(msgs), 0)

    return {
        "default": ("ctxkeep default", ctxkeep(False)),
        "stable": (f"ctxkeep stable {low_water:g}", ctxkeep(True)),
        "trim": ("trim_messages", trim),
    }


# -- measuring one prompt against the previous one ------------------------------------------------


class Serialiser:
    """Each message's serialised token ids (cached by its JSON), and its counter tokens."""

    def __init__(self, counter: TokenCounter) -> None:
        self.encode: Callable[[str], list[int]] = counter.encode  # type: ignore[attr-defined]
        self.counter = counter
        self._ids: dict[str, list[int]] = {}

    def key(self, m: Message) -> str:
        return json.dumps(m.to_openai(), sort_keys=True, ensure_ascii=False)

    def ids(self, key: str) -> list[int]:
        hit = self._ids.get(key)
        if hit is None:
            hit = self._ids[key] = self.encode(key)
        return hit


def common_prefix(
    ser: Serialiser, prev: list[str], cur: list[str], cur_tokens: list[int]
) -> tuple[int, int]:
    """(tokens of the common prefix, leading messages equal) of two serialised prompts."""
    k = 0
    while k < len(prev) and k < len(cur) and prev[k] == cur[k]:
        k += 1
    tokens = sum(cur_tokens[:k])
    if k < len(prev) and k < len(cur):
        a, b = ser.ids(prev[k]), ser.ids(cur[k])
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        tokens += min(n, cur_tokens[k])
    return tokens, k


@dataclass
class Stats:
    label: str
    prompts: int = 0
    tokens_sent: int = 0
    cacheable: int = 0
    over_budget: int = 0
    invalid: int = 0
    refused: int = 0
    task_missing: int = 0
    """Prompts without the run's task (its first user message, whole or as an excerpt)."""
    shares: list[float] = field(default_factory=list)
    cost: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys((*PRICES, "anthropic_nocache"), 0.0)
    )
    seconds: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "prompts": self.prompts,
            "tokens_sent": self.tokens_sent,
            "cacheable_tokens": self.cacheable,
            "cacheable_share_total": round(self.cacheable / self.tokens_sent, 4)
            if self.tokens_sent
            else 0.0,
            "cacheable_share_median": round(statistics.median(self.shares), 4)
            if self.shares
            else 0.0,
            "over_budget": self.over_budget,
            "invalid": self.invalid,
            "refused": self.refused,
            "task_missing": self.task_missing,
            "cost_usd": {k: round(v, 4) for k, v in self.cost.items()},
            "prune_ms_median": round(statistics.median(self.seconds) * 1e3, 4)
            if self.seconds
            else None,
        }


def holds_task(out: list[Message], task: Message | None) -> bool:
    """Whether a prompt holds the task: the run's first user message as it is, or its
    compressed form (a user message with an artifact ref that starts with the task's head).
    """
    if task is None:
        return True
    text = task.text
    head = text[: min(len(text) // 3, 60)]
    for m in out:
        if m.role != "user":
            continue
        if m.text == text:
            return True
        if "ctxkeep_compressed" in m.metadata and m.artifact_refs and m.text.startswith(head):
            return True
    return False


def replay(
    msgs: list[Message],
    prune: Prune,
    counter: TokenCounter,
    ser: Serialiser,
    budget: int,
    st: Stats,
) -> None:
    prev_keys: list[str] | None = None
    prev_tokens = 0
    first_system = 0
    while first_system < len(msgs) and msgs[first_system].is_system:
        first_system += 1
    for k in step_prompts(msgs):
        st.prompts += 1
        t0 = time.perf_counter()
        try:
            out, stable = prune(msgs[:k])
        except BudgetExceededError:
            st.refused += 1
            prev_keys = None
            continue
        st.seconds.append(time.perf_counter() - t0)
        toks = [counter.count_message(m) for m in out]
        sent = sum(toks) + counter.count_messages([])
        keys = [ser.key(m) for m in out]
        st.tokens_sent += sent
        head = msgs[first_system:k]
        st.task_missing += not holds_task(out, next((m for m in head if m.role == "user"), None))
        if sent > budget:
            st.over_budget += 1
        try:
            validate_sequence(out)
        except MessageError:
            st.invalid += 1
        lcp, equal = (0, 0) if prev_keys is None else common_prefix(ser, prev_keys, keys, toks)
        st.cacheable += lcp
        st.shares.append(lcp / sent if sent else 0.0)
        # OpenAI: automatic, 128-token steps from 1,024.
        oa = lcp // OPENAI_STEP * OPENAI_STEP if lcp >= OPENAI_MIN else 0
        # Anthropic: the longest breakpoint an earlier request wrote that this prompt repeats.
        n_sys = 0
        while n_sys < len(out) and out[n_sys].is_system:
            n_sys += 1
        reads = [0]
        if prev_keys is not None and equal >= len(prev_keys):
            reads.append(prev_tokens)
        if prev_keys is not None and equal >= n_sys:
            reads.append(sum(toks[:n_sys]))
        if prev_keys is not None and 0 < stable <= equal:
            reads.append(sum(toks[:stable]))
        read = max(r for r in reads if r == 0 or r >= ANTHROPIC_MIN) if reads else 0
        for name, (inp, write, cached) in PRICES.items():
            if write is None:
                st.cost[name] += ((sent - oa) * inp + oa * cached) / 1e6
            else:
                st.cost[name] += ((sent - read) * write + read * cached) / 1e6
        st.cost["anthropic_nocache"] += sent * PRICES["anthropic_sonnet"][0] / 1e6
        prev_keys, prev_tokens = keys, sum(toks)


def table(title: str, rows: dict[str, Stats]) -> Table:
    t = Table(title=title, title_justify="left")
    cols = (
        "pruner",
        "prompts",
        "tokens sent",
        "cacheable",
        "share (median)",
        "Sonnet $",
        "Sonnet no-cache $",
        "GPT-4o $",
        "GPT-4.1 $",
        "GPT-5 $",
        "vs default (Sonnet / 4o)",
        "over",
        "invalid",
        "refused",
        "no task",
        "prune ms",
    )
    for c in cols:
        t.add_column(c, justify="left" if c == "pruner" else "right")
    base = rows["default"]
    for s in rows.values():
        d = s.to_dict()
        best_sonnet = min(s.cost["anthropic_sonnet"], s.cost["anthropic_nocache"])
        base_sonnet = min(base.cost["anthropic_sonnet"], base.cost["anthropic_nocache"])
        t.add_row(
            s.label,
            f"{s.prompts:,}",
            f"{s.tokens_sent:,}",
            f"{d['cacheable_share_total']:.1%}",
            f"{d['cacheable_share_median']:.1%}",
            f"{s.cost['anthropic_sonnet']:.2f}",
            f"{s.cost['anthropic_nocache']:.2f}",
            f"{s.cost['openai_gpt4o']:.2f}",
            f"{s.cost['openai_gpt41']:.2f}",
            f"{s.cost['openai_gpt5']:.2f}",
            f"{best_sonnet / base_sonnet:.2f} / "
            f"{s.cost['openai_gpt4o'] / base.cost['openai_gpt4o']:.2f}",
            f"{s.over_budget:,}",
            f"{s.invalid:,}",
            f"{s.refused:,}",
            f"{s.task_missing:,}",
            f"{d['prune_ms_median']:.2f}" if d["prune_ms_median"] is not None else "-",
        )
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--group", action="append", choices=[g.name for g in GROUPS])
    p.add_argument("--limit", type=int, help="at most this many runs per group")
    p.add_argument("--low-water", type=float, default=0.7, help="cache-stable low-water (0.7)")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write machine output to FILE (tables still printed), or to stdout alone",
    )
    args = p.parse_args(argv)
    data = require_shared_data()
    require_langchain()
    counter = get_counter(ENCODING)
    ser = Serialiser(counter)
    who = contenders(args.low_water)
    console = Console() if Console().is_terminal else Console(width=200)
    tables_out = args.json != "-"
    payload: dict[str, Any] = {
        "encoding": ENCODING,
        "low_water": args.low_water,
        "prices_per_mtok": {
            k: {"input": v[0], "cache_write": v[1], "cache_read": v[2]} for k, v in PRICES.items()
        },
        "groups": [],
    }
    totals = {k: Stats(label) for k, (label, _) in who.items()}
    for g in GROUPS:
        if args.group and g.name not in args.group:
            continue
        runs = [(n, coerce_messages(m)) for n, m in load_runs(data, g.pattern)[: args.limit]]
        if not runs:
            continue
        rows = {k: Stats(label) for k, (label, _) in who.items()}
        for key, (_, make) in who.items():
            for _, msgs in runs:
                replay(msgs, make(g.budget, g.last_n, counter), counter, ser, g.budget, rows[key])
        for key, s in rows.items():
            tot = totals[key]
            for f in (
                "prompts",
                "tokens_sent",
                "cacheable",
                "over_budget",
                "invalid",
                "refused",
                "task_missing",
            ):
                setattr(tot, f, getattr(tot, f) + getattr(s, f))
            tot.shares += s.shares
            tot.seconds += s.seconds
            for c, v in s.cost.items():
                tot.cost[c] += v
        if tables_out:
            console.print(
                table(f"{g.pattern} ({len(runs)} runs): budget {g.budget}, last {g.last_n}", rows)
            )
        payload["groups"].append(
            {
                "group": g.name,
                "budget": g.budget,
                "last_n": g.last_n,
                "runs": len(runs),
                "pruners": {k: s.to_dict() for k, s in rows.items()},
            }
        )
    if not payload["groups"]:
        sys.exit("error: nothing replayed")
    payload["total"] = {k: s.to_dict() for k, s in totals.items()}
    if tables_out:
        if len(payload["groups"]) > 1:
            console.print(table("total, all groups", totals))
        console.print(
            "cacheable = longest common prefix with the previous prompt of the same run "
            "(OpenAI JSON per message, o200k_base); $ = input tokens only, whole replay"
        )
    if args.json:
        dump_json(payload, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

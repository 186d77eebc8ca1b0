"""Replay real agent runs through ctxkeep, LangChain ``trim_messages`` and a naive pruner.

ctxkeep runs twice, side by side: its default (``ctxkeep replay``'s pruner, the cache-stable
mode: prune to 0.7 of the budget at a cut, then append until the budget is full) and
``cache_stable=False`` (every prompt pruned to the full budget; the default before).

Every assistant step of every trajectory in ``../shared/data/trajectories`` is replayed: the
prompt before it goes through each pruner, and what the pruner would send is measured with the
same exact counter (o200k_base, OpenAI's message accounting, reply priming included):

* tokens sent, and prompts over the budget by that counter;
* prompts that are not a valid tool-call sequence (``ctxkeep.messages.validate_sequence``
  raises), next to the prompts that were already invalid as given ("input invalid": some
  mini-swe runs have a tool call that a format-error user message answered instead of a tool
  result; ctxkeep repairs those with a synthetic result);
* for ctxkeep, tool outputs sent compressed and prompts refused (``BudgetExceededError``).

Usage:
    python bench/replay_compare.py
    python bench/replay_compare.py --group mini-swe --limit 5
    python bench/replay_compare.py --json bench/out/replay_compare.json
    python bench/replay_compare.py --json            # JSON on stdout instead of tables
    python bench/replay_compare.py --trim-variants   # also trim_messages with start_on
    python bench/replay_compare.py --check           # exit 1 if a "Done when" check fails
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from _common import (
    ENCODING,
    GROUPS,
    NAIVE_RULE,
    Group,
    Pruner,
    TrimPruner,
    load_runs,
    naive_pruner,
    require_langchain,
    require_shared_data,
    to_langchain,
    trim_kwargs_text,
    write_json,
)
from _common import from_langchain as lc_back
from ctxkeep.errors import MessageError
from ctxkeep.messages import Message, coerce_messages, validate_sequence
from ctxkeep.replay import RunStats, ctxkeep_pruner, replay_run, step_prompts
from ctxkeep.tokens import TokenCounter, get_counter

# README anchors (mini-swe, 902 prompts, 6000 / 6, a "+4 per message" counter).
ANCHORS = {
    "naive": "5.75M sent, 653 over budget, 599 invalid",
    "trim": "4.50M sent, 0 over budget, 446 invalid",
}


# ctxkeep's two modes: the default (cache-stable, low water 0.7) and the mode that prunes
# every prompt to the full budget (the default before the cache-stable mode).
CTXKEEP_KEYS = ("ctxkeep", "ctxkeep_full")


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    make: Callable[[int, int, TokenCounter], Pruner]


def contenders(trim_variants: bool) -> list[Contender]:
    out = [
        Contender(
            "ctxkeep",
            "ctxkeep (default: cache-stable)",
            lambda b, n, c: ctxkeep_pruner(b, n, c).prune,
        ),
        Contender(
            "ctxkeep_full",
            "ctxkeep cache_stable=False",
            lambda b, n, c: ctxkeep_pruner(b, n, c, cache_stable=False).prune,
        ),
        Contender("trim", "trim_messages", lambda b, n, c: TrimPruner(b, c)),
    ]
    if trim_variants:
        out += [
            Contender(
                "trim_start_human",
                "trim start_on=human",
                lambda b, n, c: TrimPruner(b, c, {"start_on": "human"}),
            ),
            Contender(
                "trim_start_human_ai",
                "trim start_on=human,ai",
                lambda b, n, c: TrimPruner(b, c, {"start_on": ("human", "ai")}),
            ),
        ]
    out.append(Contender("naive", "naive chars/4", lambda b, n, c: naive_pruner(b, n)))
    return out


@dataclass
class Result:
    stats: RunStats
    seconds: float = 0.0
    runs: list[RunStats] = field(default_factory=list)


def input_invalid(msgs: list[Message]) -> int:
    """Step prompts of a run that are not a valid sequence as given."""
    bad = 0
    for k in step_prompts(msgs):
        try:
            validate_sequence(msgs[:k])
        except MessageError:
            bad += 1
    return bad


def roundtrip_drift(runs: list[tuple[str, list[Message]]], counter: TokenCounter) -> dict[str, int]:
    """How LangChain's OpenAI round trip changes the messages' exact counts.

    ``convert_to_openai_messages`` re-serialises tool-call arguments (spacing, escapes), so
    what a LangChain app sends can differ by a few tokens from the original message.
    """
    changed = delta = total = 0
    for _, msgs in runs:
        for m, back in zip(msgs, lc_back(to_langchain(msgs)), strict=True):
            a, b = counter.count_message(m), counter.count_message(back)
            total += 1
            changed += a != b
            delta += b - a
    return {"messages": total, "messages_changed": changed, "token_delta": delta}


def replay_group(
    group: Group,
    runs: list[tuple[str, list[Message]]],
    who: list[Contender],
    counter: TokenCounter,
    progress: Progress,
) -> dict[str, Result]:
    steps = sum(len(step_prompts(m)) for _, m in runs)
    results: dict[str, Result] = {}
    for c in who:
        task = progress.add_task(f"{group.name}: {c.label}", total=steps)
        res = Result(RunStats(c.label))
        t0 = time.perf_counter()
        for name, msgs in runs:
            s = replay_run(
                name,
                msgs,
                c.make(group.budget, group.last_n, counter),
                counter,
                group.budget,
                on_step=partial(progress.advance, task),
            )
            res.runs.append(s)
            res.stats.add(s)
        res.seconds = time.perf_counter() - t0
        progress.remove_task(task)
        results[c.key] = res
    return results


def checks(results: dict[str, Result]) -> list[tuple[str, bool]]:
    """The issue's "Done when" for one group, checked for each ctxkeep mode.

    0 prompts over budget, 0 invalid, 0 refused, and no more tokens sent than trim_messages.
    """
    tr = results["trim"].stats
    out = []
    for key in CTXKEEP_KEYS:
        ck = results[key].stats
        who = ck.name
        out += [
            (f"{who}: over budget = {ck.over_budget}", ck.over_budget == 0),
            (f"{who}: invalid = {ck.invalid}", ck.invalid == 0),
            (f"{who}: refused = {ck.errors}", ck.errors == 0),
            (
                f"{who}: sends {ck.tokens_sent:,} <= trim_messages {tr.tokens_sent:,} "
                f"({ck.tokens_sent / tr.tokens_sent - 1:+.1%})"
                if tr.tokens_sent
                else "trim_messages sent nothing",
                ck.tokens_sent <= tr.tokens_sent,
            ),
        ]
    return out


def table(title: str, rows: list[tuple[str, Result]], input_bad: int) -> Table:
    t = Table(title=title, title_justify="left")
    for col in (
        "pruner",
        "prompts",
        "tokens unpruned",
        "tokens sent",
        "saving",
        "over budget",
        "invalid",
        "input invalid",
        "compressed",
        "refused",
        "time s",
    ):
        if col == "pruner":
            t.add_column(col, justify="left", no_wrap=True)
        else:
            t.add_column(col, justify="right")
    for label, r in rows:
        s = r.stats
        t.add_row(
            label,
            f"{s.prompts:,}",
            f"{s.tokens_unpruned:,}",
            f"{s.tokens_sent:,}",
            f"{s.saving:.1%}",
            f"{s.over_budget:,}",
            f"{s.invalid:,}",
            f"{input_bad:,}",
            f"{s.compressed:,}" if label.startswith("ctxkeep") else "-",
            f"{s.errors:,}" if label.startswith("ctxkeep") else "-",
            f"{r.seconds:.1f}",
        )
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--group",
        action="append",
        choices=[g.name for g in GROUPS],
        help="replay only this group (repeatable; default: all)",
    )
    p.add_argument("--limit", type=int, help="at most this many runs per group")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write machine output to FILE (tables still printed), or to stdout alone",
    )
    p.add_argument(
        "--trim-variants",
        action="store_true",
        help="also replay trim_messages with start_on='human' and start_on=('human','ai')",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if a check fails")
    args = p.parse_args(argv)

    data = require_shared_data()
    require_langchain()
    counter = get_counter(ENCODING)
    groups = [g for g in GROUPS if not args.group or g.name in args.group]
    who = contenders(args.trim_variants)
    labels = {c.key: c.label for c in who}
    tables_out = args.json != "-"
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    err = Console(stderr=True)

    payload: dict[str, Any] = {
        "encoding": ENCODING,
        "counter": "ctxkeep get_counter('o200k_base'): 3/message + role + content + name, "
        "tool calls counted, +3 reply priming",
        "trim_call": trim_kwargs_text(),
        "naive_rule": NAIVE_RULE,
        "groups": [],
    }
    totals = {c.key: Result(RunStats(c.label)) for c in who}
    total_input_bad = 0
    all_ok = True
    for g in groups:
        raw = load_runs(data, g.pattern)[: args.limit]
        if not raw:
            err.print(f"[yellow]no {g.pattern} files in {data / 'trajectories'}; skipped")
            continue
        runs = [(name, coerce_messages(msgs)) for name, msgs in raw]
        bad = sum(input_invalid(m) for _, m in runs)
        drift = roundtrip_drift(runs, counter)
        with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
            results = replay_group(g, runs, who, counter, progress)
        ok = checks(results)
        all_ok &= all(passed for _, passed in ok)
        total_input_bad += bad
        for key, r in results.items():
            totals[key].stats.add(r.stats)
            totals[key].seconds += r.seconds
        prompts = results["ctxkeep"].stats.prompts
        if tables_out:
            console.print(
                table(
                    f"{g.pattern} ({len(runs)} runs, {prompts:,} prompts): "
                    f"budget {g.budget}, last {g.last_n}",
                    [(labels[k], r) for k, r in results.items()],
                    bad,
                )
            )
            for text, passed in ok:
                console.print(f"  {'[green]ok  ' if passed else '[red]FAIL'}[/] {text}")
            console.print(
                f"  LangChain round trip: {drift['messages_changed']} of {drift['messages']} "
                f"messages count differently after convert_to_openai_messages "
                f"({drift['token_delta']:+,} tokens in all)\n"
            )
        payload["groups"].append(
            {
                "group": g.name,
                "pattern": g.pattern,
                "budget": g.budget,
                "last_n": g.last_n,
                "runs": len(runs),
                "input_invalid": bad,
                "langchain_roundtrip": drift,
                "pruners": {
                    k: {**r.stats.to_dict(), "label": labels[k], "seconds": round(r.seconds, 2)}
                    for k, r in results.items()
                },
                "per_run": {k: [s.to_dict() for s in r.runs] for k, r in results.items()},
                "checks": [{"check": text, "passed": passed} for text, passed in ok],
            }
        )

    if not payload["groups"]:
        sys.exit("error: nothing replayed")
    payload["total"] = {
        k: {**r.stats.to_dict(), "label": labels[k], "seconds": round(r.seconds, 2)}
        for k, r in totals.items()
    }
    payload["total_input_invalid"] = total_input_bad
    payload["checks_passed"] = all_ok
    if tables_out:
        if len(payload["groups"]) > 1:
            console.print(
                table(
                    "total, all groups (each prompt against its group's budget)",
                    [(labels[k], r) for k, r in totals.items()],
                    total_input_bad,
                )
            )
        console.print(f"counter: {payload['counter']}")
        console.print(f"(b) LangChain: {trim_kwargs_text()}, start_on / end_on not set")
        console.print(
            "    exact = ctxkeep counter.count_messages(convert_to_openai_messages(msgs)); "
            "its output is measured as convert_to_openai_messages(output)"
        )
        console.print(f"(c) naive chars/4: {NAIVE_RULE}")
        console.print(
            "README anchors (mini-swe, a '+4 per message' counter, 16.26M unpruned): "
            f"naive {ANCHORS['naive']}; trim_messages {ANCHORS['trim']}"
        )
    if args.json:
        write_json(payload, args.json)
    return 1 if args.check and not all_ok else 0


if __name__ == "__main__":
    sys.exit(main())

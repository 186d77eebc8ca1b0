"""How long one prune of a long session takes: ctxkeep vs LangChain ``trim_messages``.

The session is a system prompt, a user task, then assistant tool-call / tool-result pairs
whose contents cycle through the real steps of the mini-swe trajectories in
``../shared/data/trajectories`` (thinking text, bash commands, outputs from a few bytes to
41k characters), with fresh call ids. Without ``../shared`` the steps come from
``ctxkeep.demo.demo_session`` (generated file listings, source files, test logs, JSON; outputs
cut to 1,500 characters so the session is about as heavy per message as the real one).

Measured, with ``time.perf_counter`` and garbage collection left on:

* ctxkeep ``TokenPruner(6000, 6).prune(session)``: the cold first call (no token counts
  cached on the messages yet), then the median and p90 of repeated warm calls;
* one ``trim_messages`` call on the same session (already converted to LangChain messages)
  with an exact counter (ctxkeep's counter over ``convert_to_openai_messages``), the
  median of a few calls, and the ratio trim / ctxkeep;
* how ctxkeep's warm prune scales with history length (1k, 10k, 100k messages by default).

Usage:
    python bench/prune_speed.py
    python bench/prune_speed.py --runs 100 --trim-runs 3 --sizes 1000,10000,100000
    python bench/prune_speed.py --json bench/out/prune_speed.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from _common import (
    ENCODING,
    TrimPruner,
    from_langchain,
    load_runs,
    require_langchain,
    shared_data_dir,
    to_langchain,
    trim_kwargs_text,
    write_json,
)
from ctxkeep.messages import Message, ToolCall, coerce_messages, is_valid_sequence
from ctxkeep.prune import TokenPruner
from ctxkeep.tokens import TokenCounter, get_counter

BUDGET = 6000
LAST_N = 6
GOAL_MS = 5.0  # the goal for one warm prune of a 10,000-message session
FALLBACK_OUTPUT_CHARS = 1500
ANCHOR = "README: one trim_messages call on a 10,000-message session (2.9M tokens): 1.4 s"

Unit = tuple[Message, list[Message]]  # an assistant tool call and its results


# -- the session ------------------------------------------------------------------------------


def _units(msgs: list[Message]) -> list[Unit]:
    """Assistant tool-call messages whose every call is answered right after, with results."""
    out = []
    for i, m in enumerate(msgs):
        if m.role != "assistant" or not m.tool_calls:
            continue
        ids = {tc.id for tc in m.tool_calls}
        results = []
        for r in msgs[i + 1 :]:
            if r.role != "tool" or r.tool_call_id not in ids:
                break
            results.append(r)
        if {r.tool_call_id for r in results} == ids and len(results) == len(ids):
            out.append((m, results))
    return out


def source_material() -> tuple[str, Message, Message, list[Unit]]:
    """(where from, system prompt, user task, tool-call units to cycle through)."""
    data = shared_data_dir()
    if data is not None:
        runs = [coerce_messages(msgs) for _, msgs in load_runs(data, "mini-swe-*.json")]
        if runs:
            units = [u for msgs in runs for u in _units(msgs)]
            first = runs[0]
            system = next(m for m in first if m.role == "system")
            task = next(m for m in first if m.role == "user")
            where = f"{len(units)} tool steps of {len(runs)} mini-swe trajectories ({data})"
            return where, system, task, units
    from ctxkeep.demo import demo_session

    # Its outputs run to thousands of tokens; capped, the session's tokens per message come
    # close to the mini-swe runs' (about 275), so the default sizes stay quick to time.
    msgs = [
        m.replace(content=m.text[:FALLBACK_OUTPUT_CHARS]) if m.role == "tool" else m
        for m in demo_session(steps=400, seed=7)
    ]
    where = (
        f"ctxkeep.demo.demo_session(steps=400), tool outputs cut to {FALLBACK_OUTPUT_CHARS:,} "
        "chars (no ../shared/data found)"
    )
    return where, msgs[0], msgs[1], _units(msgs)


def build_session(n: int, system: Message, task: Message, units: list[Unit]) -> list[Message]:
    """``n`` fresh messages: system, task, then the units cycled with new call ids."""
    out = [system.replace(), task.replace()]
    call = 0
    k = 0
    while len(out) < n:
        call_msg, results = units[k % len(units)]
        k += 1
        if len(out) + 1 + len(results) > n:
            if len(out) + 2 > n:
                out.append(Message("user", "Any progress? Keep the fix minimal."))
            continue
        ids = {}
        calls = []
        for tc in call_msg.tool_calls:
            call += 1
            ids[tc.id] = f"call_{call}"
            calls.append(ToolCall(id=ids[tc.id], name=tc.name, arguments=tc.arguments))
        out.append(Message("assistant", call_msg.content, tool_calls=calls))
        out.extend(Message("tool", r.content, tool_call_id=ids[r.tool_call_id]) for r in results)
    return out


# -- timing -----------------------------------------------------------------------------------


@dataclass
class Timing:
    samples: list[float]  # seconds

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def p90(self) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, round(0.9 * (len(s) - 1)))]

    def ms(self) -> dict[str, float]:
        return {
            "median_ms": round(self.median * 1e3, 4),
            "p90_ms": round(self.p90 * 1e3, 4),
            "min_ms": round(min(self.samples) * 1e3, 4),
            "max_ms": round(max(self.samples) * 1e3, 4),
            "runs": len(self.samples),
        }


def timed(fn: Callable[[], Any], runs: int) -> tuple[Timing, Any]:
    samples = []
    out = None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return Timing(samples), out


@dataclass
class CtxkeepResult:
    messages: int
    history_tokens: int
    cold_s: float
    warm: Timing
    kept: int
    sent_tokens: int
    valid: bool


def time_ctxkeep(
    session: list[Message], counter: TokenCounter, runs: int, max_seconds: float
) -> CtxkeepResult:
    """Cold first prune, then ``runs`` warm ones (fewer, at least 5, if they would be slow)."""
    pruner = TokenPruner(BUDGET, LAST_N, counter)
    t0 = time.perf_counter()
    pruner.prune(session)  # cold: nothing counted or compressed yet
    cold = time.perf_counter() - t0
    probe, _ = timed(lambda: pruner.prune(session), 1)
    runs = min(runs, max(5, int(max_seconds / max(probe.median, 1e-9))))
    warm, out = timed(lambda: pruner.prune(session), runs)
    return CtxkeepResult(
        messages=len(session),
        history_tokens=counter.count_messages(session),  # after timing: this fills the caches
        cold_s=cold,
        warm=warm,
        kept=len(out),
        sent_tokens=counter.count_messages(out),
        valid=is_valid_sequence(out),
    )


# -- output -----------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=10_000, help="session length (10000)")
    p.add_argument("--runs", type=int, default=50, help="timed warm ctxkeep prunes (50)")
    p.add_argument("--trim-runs", type=int, default=5, help="timed trim_messages calls (5)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=5.0,
        help="cap on the warm ctxkeep runs' time per session size: fewer runs (at least 5) "
        "when they would take longer (5)",
    )
    p.add_argument(
        "--sizes",
        default="1000,10000,100000",
        help="session lengths for the scaling table (comma-separated)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="write machine output to FILE (tables still printed), or to stdout alone",
    )
    args = p.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if args.messages < 3 or any(s < 3 for s in sizes):
        sys.exit("error: sessions need at least 3 messages")
    require_langchain()

    counter = get_counter(ENCODING)
    counter.count_text("warm up the encoder")
    where, system, task, units = source_material()
    tables_out = args.json != "-"
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)

    # ctxkeep on the main session, then trim_messages on the same (fresh) session.
    session = build_session(args.messages, system, task, units)
    main_ck = time_ctxkeep(session, counter, args.runs, args.max_seconds)
    trim = TrimPruner(BUDGET, counter)
    lc_session = to_langchain(build_session(args.messages, system, task, units))
    trim_t, trim_out = timed(lambda: trim.trim(lc_session), args.trim_runs)
    trim_sent = from_langchain(trim_out)
    trim_tokens = counter.count_messages(trim_sent)
    trim_valid = is_valid_sequence(trim_sent)

    scaling: list[CtxkeepResult] = []
    for n in sizes:
        if n == args.messages:
            scaling.append(main_ck)
        else:
            big = build_session(n, system, task, units)
            scaling.append(time_ctxkeep(big, counter, args.runs, args.max_seconds))

    ratio_warm = trim_t.median / main_ck.warm.median
    ratio_cold = trim_t.median / main_ck.cold_s
    payload: dict[str, Any] = {
        "session_source": where,
        "messages": args.messages,
        "history_tokens": main_ck.history_tokens,
        "budget": BUDGET,
        "last_n": LAST_N,
        "encoding": ENCODING,
        "ctxkeep": {
            "call": f"TokenPruner({BUDGET}, {LAST_N}, get_counter({ENCODING!r})).prune(session)",
            "cold_ms": round(main_ck.cold_s * 1e3, 4),
            "warm": main_ck.warm.ms(),
            "kept_messages": main_ck.kept,
            "sent_tokens": main_ck.sent_tokens,
            "valid": main_ck.valid,
            "goal_ms": GOAL_MS,
            "goal_met": main_ck.warm.median * 1e3 <= GOAL_MS,
        },
        "trim_messages": {
            "call": trim_kwargs_text(BUDGET),
            "counter": "ctxkeep counter.count_messages(convert_to_openai_messages(msgs))",
            **trim_t.ms(),
            "kept_messages": len(trim_out),
            "sent_tokens": trim_tokens,
            "valid": trim_valid,
        },
        "ratio_trim_over_ctxkeep_warm": round(ratio_warm, 1),
        "ratio_trim_over_ctxkeep_cold": round(ratio_cold, 1),
        "scaling": [
            {
                "messages": r.messages,
                "history_tokens": r.history_tokens,
                "cold_ms": round(r.cold_s * 1e3, 4),
                "warm": r.warm.ms(),
                "kept_messages": r.kept,
                "sent_tokens": r.sent_tokens,
                "valid": r.valid,
            }
            for r in scaling
        ],
    }

    if tables_out:
        t = Table(
            title=f"one prune of a {args.messages:,}-message session "
            f"({main_ck.history_tokens:,} tokens), budget {BUDGET}, last {LAST_N}",
            title_justify="left",
        )
        for col in ("pruner", "runs", "median ms", "p90 ms", "cold ms", "kept", "sent", "valid"):
            t.add_column(col, justify="left" if col == "pruner" else "right", no_wrap=True)
        t.add_row(
            "ctxkeep (warm)",
            str(len(main_ck.warm.samples)),
            ms(main_ck.warm.median),
            ms(main_ck.warm.p90),
            ms(main_ck.cold_s),
            f"{main_ck.kept:,}",
            f"{main_ck.sent_tokens:,}",
            "yes" if main_ck.valid else "NO",
        )
        t.add_row(
            "trim_messages",
            str(len(trim_t.samples)),
            ms(trim_t.median),
            ms(trim_t.p90),
            ms(trim_t.samples[0]),
            f"{len(trim_out):,}",
            f"{trim_tokens:,}",
            "yes" if trim_valid else "NO",
        )
        console.print(t)
        goal = "met" if payload["ctxkeep"]["goal_met"] else "NOT met"
        console.print(
            f"  trim_messages / ctxkeep: {ratio_warm:,.0f}x (warm median), "
            f"{ratio_cold:,.0f}x (ctxkeep cold first call)"
        )
        console.print(f"  goal <= {GOAL_MS:g} ms warm: {goal}")
        console.print(f"  {ANCHOR}\n")

        s = Table(title="ctxkeep warm prune vs history length", title_justify="left")
        for col in (
            "messages",
            "history tokens",
            "runs",
            "cold ms",
            "warm median ms",
            "warm p90 ms",
            "kept",
            "sent",
            "valid",
        ):
            s.add_column(col, justify="right", no_wrap=True)
        for r in scaling:
            s.add_row(
                f"{r.messages:,}",
                f"{r.history_tokens:,}",
                str(len(r.warm.samples)),
                ms(r.cold_s),
                ms(r.warm.median),
                ms(r.warm.p90),
                f"{r.kept:,}",
                f"{r.sent_tokens:,}",
                "yes" if r.valid else "NO",
            )
        console.print(s)
        console.print(f"session: {where}")
        console.print(f"trim_messages: {trim_kwargs_text(BUDGET)}")
        console.print(
            "  exact = ctxkeep counter.count_messages(convert_to_openai_messages(msgs)); "
            "input converted to LangChain messages before timing"
        )
        console.print(
            "  'cold ms' of trim_messages is its first call; it keeps no cache, so every call "
            "is cold"
        )
    if args.json:
        write_json(payload, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

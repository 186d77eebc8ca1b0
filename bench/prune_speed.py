"""How long one prune of a long session takes: ctxkeep's two modes vs LangChain ``trim_messages``.

The session is a system prompt, a user task, then assistant tool-call / tool-result pairs
whose contents cycle through the real steps of the mini-swe trajectories in
``../shared/data/trajectories`` (thinking text, bash commands, outputs from a few bytes to
41k characters), with fresh call ids. Without ``../shared`` the steps come from
``ctxkeep.demo.demo_session`` (generated file listings, source files, test logs, JSON; outputs
cut to 1,500 characters so the session is about as heavy per message as the real one).

ctxkeep runs in both of its modes, side by side in one process (their runs interleaved):
``TokenPruner(6000, 6, counter, cache_stable=False)`` (every prompt pruned to the full
budget; the default before the cache-stable mode) and ``cache_stable=True`` (the default:
cut to 0.7 of the budget, then append; its first prune of a history replays all of it).
Measured for each, with ``time.perf_counter`` and garbage collection left on:

* cold first prune: a new pruner on a freshly built session (no token counts cached on its
  messages: what a process that just loaded a long session pays), the median of
  ``--cold-runs`` sessions;
* first prune by a new pruner of a session whose counts are cached (the cold run's session
  again): the same minus counting tokens;
* warm prune: the same pruner on the same history again (the figure quoted before the
  cache-stable mode existed);
* one new turn: a tool-call unit appended to the history (fresh messages), then a prune,
  ``--turns`` times in a row: the per-turn cost of an agent loop;

then one ``trim_messages`` call on the same session (already converted to LangChain messages)
with an exact counter (ctxkeep's counter over ``convert_to_openai_messages``), the median of a
few calls, and the ratios trim / ctxkeep; and how each mode scales with history length (1k,
10k, 100k messages by default; one cold run per size other than ``--messages``).

Usage:
    python bench/prune_speed.py
    python bench/prune_speed.py --runs 100 --trim-runs 3 --sizes 1000,10000,100000
    python bench/prune_speed.py --json bench/out/prune_speed.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
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
        out.extend(
            Message("tool", r.content, tool_call_id=ids[r.tool_call_id or ""]) for r in results
        )
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


@dataclass(frozen=True)
class Mode:
    key: str
    label: str
    cache_stable: bool

    def pruner(self, counter: TokenCounter) -> TokenPruner:
        return TokenPruner(BUDGET, LAST_N, counter, cache_stable=self.cache_stable)

    def call(self) -> str:
        return (
            f"TokenPruner({BUDGET}, {LAST_N}, get_counter({ENCODING!r}), "
            f"cache_stable={self.cache_stable}).prune(session)"
        )


MODES = (
    Mode("full", "cache_stable=False", cache_stable=False),
    Mode("stable", "cache-stable (default)", cache_stable=True),
)


def new_turns(units: list[Unit], turns: int, offset: int) -> list[list[Message]]:
    """``turns`` fresh tool-call units (new messages, new call ids) to append to a session."""
    out = []
    for j in range(turns):
        call_msg, results = units[(offset + j) % len(units)]
        ids = {tc.id: f"turn_{j}_{i}" for i, tc in enumerate(call_msg.tool_calls)}
        calls = [
            ToolCall(id=ids[tc.id], name=tc.name, arguments=tc.arguments)
            for tc in call_msg.tool_calls
        ]
        unit = [Message("assistant", call_msg.content, tool_calls=calls)]
        unit += [
            Message("tool", r.content, tool_call_id=ids[r.tool_call_id or ""]) for r in results
        ]
        out.append(unit)
    return out


@dataclass
class ModeResult:
    mode: Mode
    messages: int
    history_tokens: int
    cold: Timing  # a new pruner, a freshly built session (nothing counted)
    counted: Timing  # a new pruner, a session whose token counts are cached
    warm: Timing  # the same pruner, the same history again
    turn: Timing  # one unit appended, then a prune
    kept: int
    sent_tokens: int
    valid: bool
    turns_over_budget: int
    turns_invalid: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.label,
            "call": self.mode.call(),
            "messages": self.messages,
            "history_tokens": self.history_tokens,
            "cold_first_prune": self.cold.ms(),
            "first_prune_counts_cached": self.counted.ms(),
            "warm_same_history": self.warm.ms(),
            "new_turn": self.turn.ms(),
            "kept_messages": self.kept,
            "sent_tokens": self.sent_tokens,
            "valid": self.valid,
            "turns_over_budget": self.turns_over_budget,
            "turns_invalid": self.turns_invalid,
            "goal_ms": GOAL_MS,
            "goal_met_warm": self.warm.median * 1e3 <= GOAL_MS,
            "goal_met_turn": self.turn.median * 1e3 <= GOAL_MS,
        }


def measure(
    n: int,
    material: tuple[Message, Message, list[Unit]],
    counter: TokenCounter,
    *,
    runs: int,
    turns: int,
    cold_runs: int,
    max_seconds: float,
) -> dict[str, ModeResult]:
    """Both modes on ``n``-message sessions, their runs interleaved (see the docstring).

    Each mode gets its own sessions (fresh messages): token counts are cached on the message
    objects, so sharing them would hand one mode's counting to the other.
    """
    system, task, units = material
    session: dict[str, list[Message]] = {}
    pruner: dict[str, TokenPruner] = {}
    cold: dict[str, list[float]] = {m.key: [] for m in MODES}
    for _ in range(cold_runs):
        for m in MODES:
            session[m.key] = build_session(n, system, task, units)
            pruner[m.key] = m.pruner(counter)
            t0 = time.perf_counter()
            pruner[m.key].prune(session[m.key])
            cold[m.key].append(time.perf_counter() - t0)

    counted: dict[str, list[float]] = {m.key: [] for m in MODES}
    for _ in range(cold_runs):
        for m in MODES:
            fresh = m.pruner(counter)
            t0 = time.perf_counter()
            fresh.prune(session[m.key])
            counted[m.key].append(time.perf_counter() - t0)

    # Warm: as many runs as fit in max_seconds per mode (at least 5), interleaved.
    todo = {}
    for m in MODES:
        probe, _ = timed(partial(pruner[m.key].prune, session[m.key]), 1)
        todo[m.key] = min(runs, max(5, int(max_seconds / max(probe.median, 1e-9))))
    warm: dict[str, list[float]] = {m.key: [] for m in MODES}
    out: dict[str, list[Message]] = {}
    for r in range(max(todo.values())):
        for m in MODES:
            if r < todo[m.key]:
                t0 = time.perf_counter()
                out[m.key] = pruner[m.key].prune(session[m.key])
                warm[m.key].append(time.perf_counter() - t0)

    # New turns: the history grows by one unit per prune (each mode its own fresh units);
    # the lists are built before timing, as an agent loop holds its history already.
    prompts: dict[str, list[list[Message]]] = {}
    for m in MODES:
        hist = list(session[m.key])
        prompts[m.key] = []
        for unit in new_turns(units, turns, offset=n):
            hist = hist + unit
            prompts[m.key].append(hist)
    turn: dict[str, list[float]] = {m.key: [] for m in MODES}
    over = dict.fromkeys(todo, 0)
    invalid = dict.fromkeys(todo, 0)
    for j in range(turns):
        for m in MODES:
            t0 = time.perf_counter()
            sent = pruner[m.key].prune(prompts[m.key][j])
            turn[m.key].append(time.perf_counter() - t0)
            over[m.key] += counter.count_messages(sent) > BUDGET
            invalid[m.key] += not is_valid_sequence(sent)

    return {
        m.key: ModeResult(
            mode=m,
            messages=n,
            history_tokens=counter.count_messages(session[m.key]),  # after timing
            cold=Timing(cold[m.key]),
            counted=Timing(counted[m.key]),
            warm=Timing(warm[m.key]),
            turn=Timing(turn[m.key]),
            kept=len(out[m.key]),
            sent_tokens=counter.count_messages(out[m.key]),
            valid=is_valid_sequence(out[m.key]),
            turns_over_budget=over[m.key],
            turns_invalid=invalid[m.key],
        )
        for m in MODES
    }


# -- OpenAI dicts -----------------------------------------------------------------------------


@dataclass
class InputResult:
    """One mode on one form of the same session: ``Message`` objects or OpenAI dicts."""

    mode: Mode
    form: str  # "Message objects" or "OpenAI dicts"
    first: Timing  # a new pruner's first prune of the session (counts not cached)
    warm: Timing
    turn: Timing
    kept: int
    sent_tokens: int
    valid: bool
    turns_over_budget: int
    turns_invalid: int
    same_as_messages: bool  # the output equals the one of the Message form (dicts only)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.label,
            "input": self.form,
            "first_prune": self.first.ms(),
            "warm_same_history": self.warm.ms(),
            "new_turn": self.turn.ms(),
            "kept_messages": self.kept,
            "sent_tokens": self.sent_tokens,
            "valid": self.valid,
            "turns_over_budget": self.turns_over_budget,
            "turns_invalid": self.turns_invalid,
            "same_output_as_message_objects": self.same_as_messages,
            "goal_ms": GOAL_MS,
            "goal_met_warm": self.warm.median * 1e3 <= GOAL_MS,
        }


FORMS = ("Message objects", "OpenAI dicts")


def measure_forms(
    n: int,
    material: tuple[Message, Message, list[Unit]],
    counter: TokenCounter,
    *,
    runs: int,
    turns: int,
    max_seconds: float,
) -> dict[tuple[str, str], InputResult]:
    """Both modes on one ``n``-message session held as ``Message`` objects and as OpenAI dicts
    (``m.to_openai()``, as most agent loops hold history), all four runs interleaved.

    Each (mode, form) gets its own fresh session and pruner, so no token counts are shared.
    New turns append a unit in the same form (fresh dicts for the dict form), the lists built
    before timing, as an agent loop holds its history already.
    """
    system, task, units = material
    keys = [(m, f) for m in MODES for f in FORMS]
    session: dict[tuple[str, str], list[Any]] = {}
    pruner: dict[tuple[str, str], TokenPruner] = {}
    first: dict[tuple[str, str], list[float]] = {}
    for mode, form in keys:
        msgs = build_session(n, system, task, units)
        k = (mode.key, form)
        session[k] = msgs if form == FORMS[0] else [m.to_openai() for m in msgs]
        pruner[k] = mode.pruner(counter)
        t0 = time.perf_counter()
        pruner[k].prune(session[k])
        first[k] = [time.perf_counter() - t0]
    todo = {}
    for mode, form in keys:
        k = (mode.key, form)
        probe, _ = timed(partial(pruner[k].prune, session[k]), 1)
        todo[k] = min(runs, max(5, int(max_seconds / max(probe.median, 1e-9))))
    warm: dict[tuple[str, str], list[float]] = {k: [] for k in todo}
    out: dict[tuple[str, str], list[Message]] = {}
    for r in range(max(todo.values())):
        for k in todo:
            if r < todo[k]:
                t0 = time.perf_counter()
                out[k] = pruner[k].prune(session[k])
                warm[k].append(time.perf_counter() - t0)
    prompts: dict[tuple[str, str], list[list[Any]]] = {}
    for mode, form in keys:
        k = (mode.key, form)
        hist = list(session[k])
        prompts[k] = []
        for unit in new_turns(units, turns, offset=n):
            hist = hist + (unit if form == FORMS[0] else [m.to_openai() for m in unit])
            prompts[k].append(hist)
    turn: dict[tuple[str, str], list[float]] = {k: [] for k in todo}
    sent_turns: dict[tuple[str, str], list[list[Message]]] = {k: [] for k in todo}
    for j in range(turns):
        for k in todo:
            t0 = time.perf_counter()
            sent = pruner[k].prune(prompts[k][j])
            turn[k].append(time.perf_counter() - t0)
            sent_turns[k].append(sent)
    results = {}
    for mode, form in keys:
        k = (mode.key, form)
        ref = (mode.key, FORMS[0])
        results[k] = InputResult(
            mode=mode,
            form=form,
            first=Timing(first[k]),
            warm=Timing(warm[k]),
            turn=Timing(turn[k]),
            kept=len(out[k]),
            sent_tokens=counter.count_messages(out[k]),
            valid=is_valid_sequence(out[k]),
            turns_over_budget=sum(counter.count_messages(x) > BUDGET for x in sent_turns[k]),
            turns_invalid=sum(not is_valid_sequence(x) for x in sent_turns[k]),
            same_as_messages=_same(out[k], out[ref])
            and all(map(_same, sent_turns[k], sent_turns[ref])),
        )
    return results


def _same(a: list[Message], b: list[Message]) -> bool:
    """The same prompt: equal OpenAI payloads (artifact refs differ between pruners' stores)."""
    strip = [{**m.to_openai(), "content": m.text if m.artifact_refs else m.content} for m in a]
    other = [{**m.to_openai(), "content": m.text if m.artifact_refs else m.content} for m in b]
    return len(a) == len(b) and all(
        x == y or (x["role"] == y["role"] == "tool" and "[ctxkeep:" in str(x["content"]))
        for x, y in zip(strip, other, strict=True)
    )


# -- output -----------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=10_000, help="session length (10000)")
    p.add_argument("--runs", type=int, default=50, help="timed warm ctxkeep prunes per mode (50)")
    p.add_argument(
        "--turns", type=int, default=50, help="timed new turns (a unit appended) per mode (50)"
    )
    p.add_argument(
        "--cold-runs",
        type=int,
        default=3,
        help="fresh sessions pruned cold per mode, at --messages (3; 1 at the other sizes)",
    )
    p.add_argument("--trim-runs", type=int, default=5, help="timed trim_messages calls (5)")
    p.add_argument(
        "--max-seconds",
        type=float,
        default=5.0,
        help="cap on the warm ctxkeep runs' time per mode and session size: fewer runs (at "
        "least 5) when they would take longer (5)",
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
    if min(args.runs, args.turns, args.cold_runs, args.trim_runs) < 1:
        sys.exit("error: --runs, --turns, --cold-runs and --trim-runs must be at least 1")
    require_langchain()

    load_before = os.getloadavg()
    counter = get_counter(ENCODING)
    counter.count_text("warm up the encoder")
    where, system, task, units = source_material()
    material = (system, task, units)
    tables_out = args.json != "-"
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)

    # ctxkeep's two modes on the main session, then trim_messages on the same (fresh) session.
    main_ck = measure(
        args.messages,
        material,
        counter,
        runs=args.runs,
        turns=args.turns,
        cold_runs=args.cold_runs,
        max_seconds=args.max_seconds,
    )
    trim = TrimPruner(BUDGET, counter)
    lc_session = to_langchain(build_session(args.messages, system, task, units))
    trim_t, trim_out = timed(lambda: trim.trim(lc_session), args.trim_runs)
    trim_sent = from_langchain(trim_out)
    trim_tokens = counter.count_messages(trim_sent)
    trim_valid = is_valid_sequence(trim_sent)

    # The same session as OpenAI dicts, side by side with Message objects, then trim_messages
    # on those dicts (it converts them itself on every call, as it does for an app's history).
    forms = measure_forms(
        args.messages,
        material,
        counter,
        runs=args.runs,
        turns=args.turns,
        max_seconds=args.max_seconds,
    )
    dict_session = [m.to_openai() for m in build_session(args.messages, system, task, units)]
    trim_d, trim_d_out = timed(lambda: trim.trim(dict_session), args.trim_runs)

    scaling: list[dict[str, ModeResult]] = []
    for n in sizes:
        if n == args.messages:
            scaling.append(main_ck)
        else:
            scaling.append(
                measure(
                    n,
                    material,
                    counter,
                    runs=args.runs,
                    turns=args.turns,
                    cold_runs=1,
                    max_seconds=args.max_seconds,
                )
            )

    history_tokens = main_ck["full"].history_tokens
    ratios = {
        m.key: {
            "warm": round(trim_t.median / main_ck[m.key].warm.median, 1),
            "new_turn": round(trim_t.median / main_ck[m.key].turn.median, 1),
            "cold": round(trim_t.median / main_ck[m.key].cold.median, 2),
        }
        for m in MODES
    }
    payload: dict[str, Any] = {
        "session_source": where,
        "messages": args.messages,
        "history_tokens": history_tokens,
        "budget": BUDGET,
        "last_n": LAST_N,
        "encoding": ENCODING,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "ctxkeep": {m.key: main_ck[m.key].to_dict() for m in MODES},
        "trim_messages": {
            "call": trim_kwargs_text(BUDGET),
            "counter": "ctxkeep counter.count_messages(convert_to_openai_messages(msgs))",
            **trim_t.ms(),
            "kept_messages": len(trim_out),
            "sent_tokens": trim_tokens,
            "valid": trim_valid,
        },
        "ratio_trim_over_ctxkeep": ratios,
        "openai_dicts": {
            "results": [r.to_dict() for r in forms.values()],
            "trim_messages_on_dicts": {**trim_d.ms(), "kept_messages": len(trim_d_out)},
            "ratio_trim_on_dicts_over_ctxkeep_dicts_warm": {
                m.key: round(trim_d.median / forms[(m.key, FORMS[1])].warm.median, 1) for m in MODES
            },
        },
        "scaling": [r[m.key].to_dict() for r in scaling for m in MODES],
    }

    if tables_out:
        t = Table(
            title=f"one prune of a {args.messages:,}-message session "
            f"({history_tokens:,} tokens), budget {BUDGET}, last {LAST_N}: medians in ms "
            f"(p90)",
            title_justify="left",
        )
        cols = (
            "pruner",
            "cold first prune",
            "new pruner, counts cached",
            "warm, same history",
            "one new turn",
            "kept",
            "sent",
            "valid",
        )
        for col in cols:
            t.add_column(col, justify="left" if col == "pruner" else "right")
        for m in MODES:
            r = main_ck[m.key]
            t.add_row(
                f"ctxkeep {m.label}",
                f"{ms(r.cold.median)} ({len(r.cold.samples)} runs)",
                ms(r.counted.median),
                f"{ms(r.warm.median)} ({ms(r.warm.p90)}, {len(r.warm.samples)} runs)",
                f"{ms(r.turn.median)} ({ms(r.turn.p90)}, {len(r.turn.samples)} turns)",
                f"{r.kept:,}",
                f"{r.sent_tokens:,}",
                "yes" if r.valid and not r.turns_invalid and not r.turns_over_budget else "NO",
            )
        t.add_row(
            "trim_messages",
            f"{ms(trim_t.samples[0])} (first call)",
            "-",
            f"{ms(trim_t.median)} ({ms(trim_t.p90)}, {len(trim_t.samples)} runs)",
            "-",
            f"{len(trim_out):,}",
            f"{trim_tokens:,}",
            "yes" if trim_valid else "NO",
        )
        console.print(t)
        for m in MODES:
            r, q = main_ck[m.key], ratios[m.key]
            goal = "met" if r.warm.median * 1e3 <= GOAL_MS else "NOT met"
            goal_turn = "met" if r.turn.median * 1e3 <= GOAL_MS else "NOT met"
            console.print(
                f"  {m.label}: trim_messages / ctxkeep {q['warm']:,.0f}x (warm), "
                f"{q['new_turn']:,.0f}x (new turn), {q['cold']:,.2f}x (cold first prune); "
                f"goal <= {GOAL_MS:g} ms: warm {goal}, new turn {goal_turn}; turns over "
                f"budget {r.turns_over_budget}, invalid {r.turns_invalid}"
            )
        console.print(f"  {ANCHOR}\n")

        s = Table(
            title="ctxkeep vs history length: medians in ms (cold: 1 run except at "
            f"{args.messages:,})",
            title_justify="left",
        )
        for col in (
            "messages",
            "history tokens",
            "mode",
            "cold first prune",
            "new pruner, counts cached",
            "warm",
            "warm p90",
            "one new turn",
            "turn p90",
            "kept",
            "sent",
            "valid",
        ):
            s.add_column(col, justify="left" if col == "mode" else "right")
        for row in scaling:
            for m in MODES:
                r = row[m.key]
                s.add_row(
                    f"{r.messages:,}",
                    f"{r.history_tokens:,}",
                    m.label,
                    ms(r.cold.median),
                    ms(r.counted.median),
                    ms(r.warm.median),
                    ms(r.warm.p90),
                    ms(r.turn.median),
                    ms(r.turn.p90),
                    f"{r.kept:,}",
                    f"{r.sent_tokens:,}",
                    "yes" if r.valid and not r.turns_invalid and not r.turns_over_budget else "NO",
                )
        console.print(s)

        d = Table(
            title=f"the same {args.messages:,}-message session as Message objects and as OpenAI "
            "dicts (each its own session and pruner, runs interleaved): medians in ms (p90)",
            title_justify="left",
        )
        for col in (
            "pruner",
            "input",
            "first prune",
            "warm, same history",
            "one new turn",
            "kept",
            "sent",
            "valid",
            "same output",
        ):
            d.add_column(col, justify="left" if col in ("pruner", "input") else "right")
        for (_, form), r in forms.items():
            d.add_row(
                f"ctxkeep {r.mode.label}",
                form,
                ms(r.first.median),
                f"{ms(r.warm.median)} ({ms(r.warm.p90)}, {len(r.warm.samples)} runs)",
                f"{ms(r.turn.median)} ({ms(r.turn.p90)}, {len(r.turn.samples)} turns)",
                f"{r.kept:,}",
                f"{r.sent_tokens:,}",
                "yes" if r.valid and not r.turns_invalid and not r.turns_over_budget else "NO",
                "-" if form == FORMS[0] else ("yes" if r.same_as_messages else "NO"),
            )
        d.add_row(
            "trim_messages",
            "OpenAI dicts",
            f"{ms(trim_d.samples[0])} (first call)",
            f"{ms(trim_d.median)} ({ms(trim_d.p90)}, {len(trim_d.samples)} runs)",
            "-",
            f"{len(trim_d_out):,}",
            "-",
            "-",
            "-",
        )
        console.print(d)
        for m in MODES:
            r = forms[(m.key, FORMS[1])]
            goal = "met" if r.warm.median * 1e3 <= GOAL_MS else "NOT met"
            console.print(
                f"  {m.label}, OpenAI dicts: trim_messages / ctxkeep "
                f"{trim_d.median / r.warm.median:,.0f}x (warm), "
                f"{trim_d.median / r.turn.median:,.0f}x (new turn); goal <= {GOAL_MS:g} ms "
                f"warm: {goal}"
            )
        console.print(f"session: {where}")
        console.print(
            "load average (1 min) before / after: "
            + " / ".join(str(x) for x in payload["load_average_before_after"])
        )
        console.print(f"trim_messages: {trim_kwargs_text(BUDGET)}")
        console.print(
            "  exact = ctxkeep counter.count_messages(convert_to_openai_messages(msgs)); "
            "input converted to LangChain messages before timing"
        )
        console.print(
            "  cold first prune: a new pruner on a freshly built session (no token counts "
            "cached); new pruner, counts cached: the same session again; one new turn: a "
            "tool-call unit appended, then a prune"
        )
    if args.json:
        write_json(payload, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

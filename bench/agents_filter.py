"""Real agent runs as OpenAI Agents SDK model inputs: the SDK's ``ToolOutputTrimmer`` against
``ctxkeep_input_filter``, side by side.

Every trajectory of ``../shared/data/trajectories`` is converted to Responses input items
(:func:`ctxkeep.to_responses`: a message item per message, a ``function_call`` item per tool
call, a ``function_call_output`` per result) and every assistant step is replayed: the items
before it are one model call's input, handed to each ``call_model_input_filter`` exactly as the
SDK's Runner hands it (a ``CallModelData``). One filter instance serves a whole run, as in a
real run. What each filter returns is measured with the same exact counter (o200k_base,
message overhead and reply priming included; both filters get ``instructions=None``, the
system prompt is an item):

* tokens sent, and calls over the group's budget;
* calls with a broken pair: a ``function_call`` sent without its ``function_call_output``, or
  an output without its call (what the Responses API rejects); the input row shows the calls
  already broken as given (some mini-swe runs answer a call with a user message; ctxkeep's
  pruner repairs those with a synthetic result);
* output bytes unrecoverable: of the outputs in a call's input, the bytes neither sent nor
  retrievable (an output cut to a preview loses the rest; a compressed output whose artifact
  holds its full text loses nothing); summed over calls;
* output bytes left out of the call: outputs not sent at all (dropped whole; the session
  still holds them); summed over calls.

The trimmer runs with its defaults (``recent_turns=2``, ``max_output_chars=500``,
``preview_chars=200``): it trims only outputs older than the second-newest user message, and
most of these runs are one user task followed by tool calls, so it trims nothing there.

Usage:
    python bench/agents_filter.py
    python bench/agents_filter.py --group tau --limit 10
    python bench/agents_filter.py --json bench/out/agents_filter.json
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from _common import GROUPS, Group, load_runs, require_shared_data, write_json
from ctxkeep.messages import Message, coerce_messages
from ctxkeep.replay import step_prompts
from ctxkeep.responses import from_responses, to_responses
from ctxkeep.tokens import TokenCounter, get_counter

REF = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass
class Tally:
    calls: int = 0
    tokens_in: int = 0
    broken_in: int = 0
    tokens_sent: int = 0
    over_budget: int = 0
    broken_pairs: int = 0
    bytes_unrecoverable: int = 0
    bytes_left_out: int = 0
    refused: int = 0
    seconds: float = 0.0


def broken(items: list[dict[str, Any]]) -> bool:
    """A call without its output, or an output without an earlier call."""
    waiting: set[str] = set()
    answered: set[str] = set()
    for item in items:
        kind = item.get("type")
        if kind == "function_call":
            waiting.add(item["call_id"])
        elif kind == "function_call_output":
            if item["call_id"] not in waiting:
                return True
            answered.add(item["call_id"])
    return waiting != answered


def loss(
    given: list[dict[str, Any]], sent: list[dict[str, Any]], artifacts: Any
) -> tuple[int, int]:
    """(bytes unrecoverable, bytes left out) of the outputs in ``given``.

    Some runs reuse a call id in a later turn, so outputs are matched newest first (both
    filters leave out the oldest first): the newest given output of an id with the newest
    sent one, and so on.
    """
    sent_outputs: dict[str, list[Any]] = {}
    for item in sent:
        if item.get("type") == "function_call_output":
            sent_outputs.setdefault(item["call_id"], []).append(item["output"])
    lost = left_out = 0
    for item in reversed(given):
        if item.get("type") != "function_call_output":
            continue
        full = item["output"] if isinstance(item["output"], str) else str(item["output"])
        size = len(full.encode())
        candidates = sent_outputs.get(item["call_id"])
        if not candidates:
            left_out += size
            continue
        out = candidates.pop()
        out = out if isinstance(out, str) else str(out)
        if out == full:
            continue
        ref = REF.search(out)
        if ref and artifacts is not None and artifacts.get(ref.group(0)) == full:
            continue
        lost += max(0, size - len(out.encode()))
    return lost, left_out


def call_data(items: list[Any]) -> Any:
    from agents import Agent
    from agents.run_config import CallModelData, ModelInputData

    return CallModelData(
        model_data=ModelInputData(input=items, instructions=None),
        agent=Agent(name="replay"),
        context=None,
    )


def replay(
    group: Group, runs: list[tuple[str, list[Message]]], counter: TokenCounter
) -> dict[str, Tally]:
    from agents.extensions import ToolOutputTrimmer

    from ctxkeep.errors import BudgetExceededError
    from ctxkeep.integrations.openai_agents import ctxkeep_input_filter

    tallies = {"ToolOutputTrimmer": Tally(), "ctxkeep_input_filter": Tally()}
    for _, messages in runs:
        filters: dict[str, Any] = {
            "ToolOutputTrimmer": ToolOutputTrimmer(),
            "ctxkeep_input_filter": ctxkeep_input_filter(
                max_tokens=group.budget,
                preserve_last_n=group.last_n,
                counter=counter,
                count_tools=False,  # the trajectories carry no tool definitions
            ),
        }
        for step in step_prompts(messages):
            given = to_responses(messages[:step])
            tokens_in = counter.count_messages(from_responses(given))
            broken_in = broken(given)
            for name, flt in filters.items():
                tally = tallies[name]
                tally.calls += 1
                tally.tokens_in += tokens_in
                tally.broken_in += broken_in
                start = time.perf_counter()
                try:
                    out = flt(call_data(list(given))).input
                except BudgetExceededError:
                    tally.refused += 1
                    continue
                finally:
                    tally.seconds += time.perf_counter() - start
                sent = [dict(i) for i in out]
                tokens = counter.count_messages(from_responses(sent))
                tally.tokens_sent += tokens
                tally.over_budget += tokens > group.budget
                tally.broken_pairs += broken(sent)
                lost, left_out = loss(given, sent, getattr(flt, "artifacts", None))
                tally.bytes_unrecoverable += lost
                tally.bytes_left_out += left_out
    return tallies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", choices=[g.name for g in GROUPS])
    parser.add_argument("--limit", type=int, help="runs per group")
    parser.add_argument("--json", nargs="?", const="-", help="write results as JSON")
    args = parser.parse_args()
    data = require_shared_data()
    counter = get_counter("o200k_base")
    console = Console()
    results: dict[str, Any] = {}
    for group in GROUPS:
        if args.group and group.name != args.group:
            continue
        runs = [
            (name, coerce_messages(msgs))
            for name, msgs in load_runs(data, group.pattern)[: args.limit]
        ]
        tallies = replay(group, runs, counter)
        results[group.name] = {
            "budget": group.budget,
            "runs": len(runs),
            **{k: asdict(v) for k, v in tallies.items()},
        }
        table = Table(title=f"{group.name}: {len(runs)} runs, budget {group.budget} tokens")
        for col in (
            "filter",
            "calls",
            "tokens sent",
            "over budget",
            "broken pairs",
            "bytes unrecoverable",
            "bytes left out",
            "refused",
            "ms/call",
        ):
            table.add_column(col, justify="left" if col == "filter" else "right")
        first = next(iter(tallies.values()))
        table.add_row(
            "(input as given)",
            str(first.calls),
            f"{first.tokens_in / 1e6:.2f}M",
            "",
            str(first.broken_in),
            *[""] * 4,
        )
        for name, t in tallies.items():
            table.add_row(
                name,
                str(t.calls),
                f"{t.tokens_sent / 1e6:.2f}M",
                str(t.over_budget),
                str(t.broken_pairs),
                f"{t.bytes_unrecoverable:,}",
                f"{t.bytes_left_out:,}",
                str(t.refused),
                f"{1000 * t.seconds / max(t.calls, 1):.1f}",
            )
        console.print(table)
    if args.json:
        write_json(results, args.json)


if __name__ == "__main__":
    main()

"""How fast messages are made, copied and stored: this checkout against another one, side by side.

The hot paths of :class:`ctxkeep.Message` are its constructor (every message a caller adds,
every OpenAI dict read), :meth:`~ctxkeep.Message.copy` (every read of a store hands out
copies) and the stored record both ways (:func:`~ctxkeep.sessions.records.message_to_record`
on every append, :func:`~ctxkeep.sessions.records.record_to_message` on every read: a
``get_messages`` of 10,000 messages, the pruner's reads). This bench times each over 10,000
messages of an agent run's shape: a system prompt and a task, then assistant turns with a tool
call (thinking text, JSON arguments, turn ids, metadata) and tool results of 200-2,000
characters, one result in eight as content parts, one in sixteen with an artifact ref.

Both checkouts are measured in one process: ctxkeep is imported from this checkout's ``src/``
and again, as a second copy of the package, from ``--old`` (each copy's functions keep their
own modules). Every pass times each stage on both copies back to back, the order alternating
from pass to pass, so both see the same machine load; the time is the process's CPU time
(``time.process_time``: what other jobs on the machine take does not count), garbage
collection run before each stage and paused during it. The table gives
per-message medians in µs over ``--passes`` passes, with their range, and the median of the
passes' ratios new / old (each pass measures both back to back), with its middle half.

Stages:

* ``Message(...)``: the constructor with keyword arguments, as a caller adds a message;
* ``from_openai``: :meth:`Message.from_openai` of the run's OpenAI dicts;
* ``copy``: :meth:`Message.copy`;
* ``replace``: :meth:`Message.replace` of one field (validated like a new message);
* ``to_record``: :func:`message_to_record` (the JSON round-trip check included);
* ``from_record``: :func:`record_to_message` of the stored JSON text (parsing included);
* ``from_record, parts``: the same for the records whose content is a list of parts only (the
  checked path: the fast path takes string content), eight times over.

Usage:
    git worktree add --detach /tmp/msg-old <commit>
    python bench/message_speed.py --old /tmp/msg-old/src --passes 21
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STAGES = (
    "Message(...)",
    "from_openai",
    "copy",
    "replace",
    "to_record",
    "from_record",
    "from_record, parts",
)


def _kwargs(n: int, tool_call: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The constructor arguments of ``n`` messages of an agent run (deterministic)."""
    out: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        (("system", "You are a careful software engineer. " * 8), {}),
        (("user", "Fix the failing test in tests/test_io.py. " * 4), {"turn_id": "t0"}),
    ]
    created = datetime(2026, 1, 1, tzinfo=UTC)
    i = 0
    while len(out) < n:
        i += 1
        call_id = f"call_{i:06d}"
        args = json.dumps({"command": f"grep -rn 'pattern_{i}' src/ | head -{i % 50 + 1}"})
        out.append(
            (
                ("assistant", f"Step {i}: I look for the pattern next. " * 3),
                {
                    "turn_id": f"t{i}",
                    "tool_calls": [tool_call(call_id, "bash", args)],
                    "metadata": {"model": "gpt-x", "latency_ms": i % 997},
                    "created_at": created,
                },
            )
        )
        body = f"src/module_{i}.py:{i}: pattern_{i} = value\n" * (5 + i % 45)
        content: Any = [{"type": "text", "text": body}] if i % 8 == 0 else body
        kw: dict[str, Any] = {"tool_call_id": call_id, "turn_id": f"t{i}", "created_at": created}
        if i % 16 == 0:
            kw["artifact_refs"] = [f"art_{i}"]
            kw["event_kind"] = "observation"
        out.append((("tool", content), kw))
    return out[:n]


def _load(src: Path) -> dict[str, Any]:
    """The functions measured, from a copy of ctxkeep imported from ``src``."""
    mine = [k for k in sys.modules if k == "ctxkeep" or k.startswith("ctxkeep.")]
    saved = {k: sys.modules.pop(k) for k in mine}
    sys.path.insert(0, str(src))
    try:
        import ctxkeep
        from ctxkeep.messages import Message, ToolCall
        from ctxkeep.sessions.records import dumps, message_to_record, record_to_message

        if not ctxkeep.__file__ or not ctxkeep.__file__.startswith(str(src)):
            sys.exit(f"error: imported {ctxkeep.__file__}, not ctxkeep from {src}")
    finally:
        sys.path.remove(str(src))
        for k in [k for k in sys.modules if k == "ctxkeep" or k.startswith("ctxkeep.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return {
        "Message": Message,
        "ToolCall": ToolCall,
        "dumps": dumps,
        "to_record": message_to_record,
        "from_record": record_to_message,
    }


def _stages(api: dict[str, Any], n: int) -> dict[str, tuple[Callable[[], object], int]]:
    """Each stage as a call over its messages (inputs made beforehand), and how many."""
    message, to_record, from_record = api["Message"], api["to_record"], api["from_record"]
    args = _kwargs(n, api["ToolCall"])
    msgs = [message(*a, **kw) for a, kw in args]
    dicts = [m.to_openai() for m in msgs]
    texts = [api["dumps"](to_record(m)) for m in msgs]
    parts = [t for t, m in zip(texts, msgs, strict=True) if isinstance(m.content, list)]
    back = [from_record(t) for t in texts]
    assert [to_record(m) for m in back] == [to_record(m) for m in msgs]
    return {
        "Message(...)": (lambda: [message(*a, **kw) for a, kw in args], n),
        "from_openai": (lambda: [message.from_openai(d) for d in dicts], n),
        "copy": (lambda: [m.copy() for m in msgs], n),
        "replace": (lambda: [m.replace(turn_id="x") for m in msgs], n),
        "to_record": (lambda: [to_record(m) for m in msgs], n),
        "from_record": (lambda: [from_record(t) for t in texts], n),
        "from_record, parts": (lambda: [from_record(t) for t in parts * 8], 8 * len(parts)),
    }


def _cpu(fn: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()  # a full collection landing in one stage or another would be most of the noise
    try:
        start = time.process_time()
        fn()
        return time.process_time() - start
    finally:
        gc.enable()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", type=Path, help="the src/ folder of the checkout to compare with")
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--passes", type=int, default=21)
    args = ap.parse_args()
    sides = {"new": HERE.parent / "src"}
    if args.old:
        sides["old"] = args.old.resolve()
    stages = {side: _stages(_load(src), args.messages) for side, src in sides.items()}
    times: dict[str, dict[str, list[float]]] = {s: {k: [] for k in STAGES} for s in sides}
    for p in range(args.passes):
        for stage in STAGES:
            order = list(sides) if p % 2 == 0 else list(reversed(sides))
            for side in order:
                run, count = stages[side][stage]
                times[side][stage].append(_cpu(run) / count * 1e6)
    print(f"{args.messages:,} messages, {args.passes} passes; CPU µs per message, median (range)")
    compare = "old" in sides
    head = " | new / old, paired: median (middle half) |" if compare else " |"
    print("| stage | " + " | ".join(sides) + head)
    print("|---" * (len(sides) + 1 + compare) + "|")
    for stage in STAGES:
        cells = [
            f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})"
            for t in (times[side][stage] for side in sides)
        ]
        if compare:  # each pass's ratio: both sides measured back to back, under the same load
            ratios = [n / o for n, o in zip(times["new"][stage], times["old"][stage], strict=True)]
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            cells.append(f"{statistics.median(ratios):.2f} ({q1:.2f}-{q3:.2f})")
        print(f"| {stage} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

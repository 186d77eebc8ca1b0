"""A long agent session that ctxkeep generates itself, for ``ctxkeep demo`` and tests.

The session looks like a coding agent's: a system prompt, a task, then many steps of an
assistant calling tools (``ls``, ``cat``, ``pytest``, an HTTP API) and getting realistic
outputs back (file listings, source files, test logs, JSON), some of them thousands of tokens
long, a few steps with parallel tool calls. It is deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

from ctxkeep.messages import Message, ToolCall

_SYSTEM = (
    "You are a careful software engineer working in a repository. Use the tools to inspect "
    "files, run commands and tests. Keep changes minimal and explain each step."
)
_TASK = (
    "The nightly job fails: `pytest tests/test_billing.py` reports a rounding error in "
    "invoice totals for multi-currency orders. Find the cause, fix it, and make the tests pass."
)
_WORDS = [
    "invoice",
    "currency",
    "total",
    "amount",
    "rate",
    "round",
    "decimal",
    "order",
    "line",
    "item",
    "tax",
    "discount",
    "customer",
    "ledger",
    "account",
    "balance",
    "payment",
    "refund",
    "quantity",
    "price",
    "subtotal",
    "exchange",
]


def _listing(rng: random.Random) -> str:
    lines = []
    for _ in range(rng.randint(20, 120)):
        name = "_".join(rng.sample(_WORDS, 2)) + rng.choice([".py", ".json", ".md", ".txt"])
        lines.append(
            f"-rw-r--r-- 1 dev dev {rng.randint(80, 90000):>6} Nov {rng.randint(1, 30):>2} "
            f"{rng.randint(0, 23):02}:{rng.randint(0, 59):02} src/billing/{name}"
        )
    return "\n".join(lines)


def _source(rng: random.Random) -> str:
    out = ['"""Billing helpers."""', "", "from decimal import Decimal, ROUND_HALF_EVEN", ""]
    for i in range(rng.randint(8, 40)):
        a, b = rng.sample(_WORDS, 2)
        out += [
            f"def {a}_{b}_{i}(order, rate=Decimal('1.0')):",
            f'    """Compute the {a} {b} for an order."""',
            f"    value = sum(line.{a} * line.quantity for line in order.lines)",
            "    return (value * rate).quantize(Decimal('0.01'), rounding=ROUND_HALF_EVEN)",
            "",
        ]
    return "\n".join(out)


def _test_log(rng: random.Random) -> str:
    lines = ["============================= test session starts =============================="]
    n = rng.randint(30, 200)
    failed = rng.randint(0, 4)
    for i in range(n):
        a, b = rng.sample(_WORDS, 2)
        status = "FAILED" if i < failed else "PASSED"
        lines.append(f"tests/test_billing.py::test_{a}_{b}_{i} {status}")
    for i in range(failed):
        lines += [
            f"___________________________ test_case_{i} ___________________________",
            "    def test_multi_currency_total():",
            ">       assert invoice.total == Decimal('10.07')",
            "E       AssertionError: assert Decimal('10.06') == Decimal('10.07')",
        ]
    lines.append(
        f"========== {failed} failed, {n - failed} passed in {rng.uniform(1, 9):.2f}s =========="
    )
    return "\n".join(lines)


def _json_payload(rng: random.Random) -> str:
    items = [
        {
            "id": f"inv_{rng.randint(10000, 99999)}",
            "currency": rng.choice(["EUR", "USD", "GBP", "JPY"]),
            "lines": [
                {
                    "sku": f"SKU-{rng.randint(100, 999)}",
                    "qty": rng.randint(1, 9),
                    "price": round(rng.uniform(1, 500), 2),
                }
                for _ in range(rng.randint(1, 6))
            ],
            "total": round(rng.uniform(10, 3000), 2),
        }
        for _ in range(rng.randint(3, 25))
    ]
    return json.dumps({"object": "list", "data": items, "has_more": True}, indent=2)


_TOOLS: tuple[
    tuple[str, Callable[[random.Random], dict[str, str]], Callable[[random.Random], str]], ...
] = (
    ("bash", lambda r: {"command": "ls -la src/billing"}, _listing),
    ("read_file", lambda r: {"path": f"src/billing/{r.choice(_WORDS)}.py"}, _source),
    ("bash", lambda r: {"command": "pytest tests/test_billing.py -q"}, _test_log),
    ("http_get", lambda r: {"url": "http://localhost:8000/api/invoices?limit=50"}, _json_payload),
)


def demo_session(steps: int = 120, seed: int = 7) -> list[Message]:
    """A deterministic agent session of about ``2 * steps + 2`` messages."""
    rng = random.Random(seed)
    msgs = [Message("system", _SYSTEM), Message("user", _TASK)]
    call = 0
    for step in range(steps):
        parallel = 2 if rng.random() < 0.15 else 1
        calls, results = [], []
        for _ in range(parallel):
            name, args, output = rng.choice(_TOOLS)
            call += 1
            cid = f"call_{call:04d}"
            calls.append(ToolCall(id=cid, name=name, arguments=json.dumps(args(rng))))
            results.append(Message("tool", output(rng), tool_call_id=cid, turn_id=f"t{step}"))
        thought = f"Step {step + 1}: checking {' and '.join(rng.sample(_WORDS, 3))}."
        msgs.append(Message("assistant", thought, tool_calls=calls, turn_id=f"t{step}"))
        msgs.extend(results)
        if rng.random() < 0.05:
            msgs.append(Message("user", "Any progress? Remember to keep the fix minimal."))
    msgs.append(Message("assistant", "The rounding now happens once per invoice; tests pass."))
    return msgs

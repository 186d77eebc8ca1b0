"""``ctxkeep count``: exact tokens of a text or message file, per role and encoding."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ctxkeep.cli._io import console as make_console
from ctxkeep.cli._io import parse_messages, read_source
from ctxkeep.gate import message_length
from ctxkeep.tokens import counter_for

HELP = """Count the exact tokens of a text file or a JSON list of messages.

Accepts plain text, a JSON list of OpenAI chat messages, an object with a "messages" list
(the trajectory format), or JSONL with one message per line. Use - for standard input.

examples:
  ctxkeep count examples/data/session.json
  ctxkeep count run.json --encoding o200k_base --encoding cl100k_base --json
  echo "hello" | ctxkeep count -
"""


def register(sub: Any) -> None:
    """Add the ``count`` command."""
    p = sub.add_parser(
        "count",
        help="count exact tokens of a text or messages file",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="a file, or - for standard input")
    p.add_argument(
        "--encoding",
        "-e",
        action="append",
        help="o200k_base (default), cl100k_base, heuristic or a model name; repeatable",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def count_file(path: str, encodings: list[str]) -> dict[str, Any]:
    """Counts for one file: per role (messages) or for the whole text."""
    name, text = read_source(path)
    loaded = parse_messages(name, text, allow_text=True)
    # Made for this input: a short file is counted without waiting for the full encoding.
    sample = loaded.text if loaded.messages is None else loaded.messages
    assert sample is not None
    counters = {e: counter_for(e, sample) for e in encodings}
    rows: dict[str, dict[str, Any]] = {}
    if loaded.messages is None:
        assert loaded.text is not None
        rows["text"] = {
            "messages": 0,
            "characters": len(loaded.text),
            "tokens": {e: c.count_text(loaded.text) for e, c in counters.items()},
        }
        totals = {e: r for e, r in rows["text"]["tokens"].items()}
    else:
        for m in loaded.messages:
            row = rows.setdefault(
                m.role, {"messages": 0, "characters": 0, "tokens": dict.fromkeys(encodings, 0)}
            )
            row["messages"] += 1
            row["characters"] += message_length(m)
            for e, c in counters.items():
                row["tokens"][e] += c.count_message(m)
        totals = {e: c.count_messages(loaded.messages) for e, c in counters.items()}
    return {
        "file": name,
        "kind": "text" if loaded.messages is None else "messages",
        "roles": rows,
        "total_tokens": totals,
        "exact": {e: c.exact for e, c in counters.items()},
    }


def run(args: argparse.Namespace) -> int:
    """Print the counts."""
    encodings = args.encoding or ["o200k_base"]
    results = [count_file(f, encodings) for f in args.files]
    if args.json:
        print(json.dumps(results if len(results) > 1 else results[0], indent=2))
        return 0
    from rich.table import Table  # only for the table: --json does without

    console = make_console()
    for r in results:
        table = Table(title=f"{r['file']} ({r['kind']})")
        table.add_column("role")
        table.add_column("messages", justify="right")
        table.add_column("characters", justify="right")
        for e in encodings:
            label = e if r["exact"][e] else f"{e} (estimate)"
            table.add_column(label, justify="right")
        for role, row in r["roles"].items():
            table.add_row(
                role,
                str(row["messages"]),
                f"{row['characters']:,}",
                *(f"{row['tokens'][e]:,}" for e in encodings),
            )
        total_chars = sum(row["characters"] for row in r["roles"].values())
        total_msgs = sum(row["messages"] for row in r["roles"].values())
        table.add_section()
        table.add_row(
            "total",
            str(total_msgs),
            f"{total_chars:,}",
            *(f"{r['total_tokens'][e]:,}" for e in encodings),
            style="bold",
        )
        console.print(table)
    if any(r["kind"] == "messages" for r in results):
        console.print("[dim]message totals include per-message overhead and reply priming[/dim]")
    return 0

"""The first ``POST /v1/sessions/{id}/prompt`` of a new ``ctxkeep serve``, this checkout beside
another, in alternating rounds.

A server folder is made once (an API key, a tenant whose 10,000-message SQLite session built its
prompt through the route in an earlier run of the server, then grew by ``--after`` messages:
``bench/cold_build.py``'s "built before" state). Each round copies it, starts ``ctxkeep serve``
on the copy (this checkout's code, or with ``--compare SRC`` another checkout's ``src`` first
on ``PYTHONPATH``), waits for ``/healthz``, and times the first prompt request from the
client's side; the servers' prompts must be equal. Order alternates by round.

Usage:
    git worktree add /tmp/old <commit>
    python bench/serve_first_prompt.py --compare /tmp/old/src --rounds 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import cold_build as cb


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--after", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--compare", metavar="SRC", help="another checkout's src to run beside this")
    args = ap.parse_args()
    sides: list[tuple[str, str | None]] = [("this checkout", None)]
    if args.compare:
        sides.insert(0, (f"compared ({args.compare})", str(Path(args.compare).resolve())))
    times: dict[str, list[float]] = {name: [] for name, _ in sides}
    digests: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="ctxkeep-serve-first-") as tmp_name:
        tmp = Path(tmp_name)
        msgs = cb.session_messages(args.messages)
        template, key = cb.prepare_server(tmp, msgs, args.after)
        for r in range(args.rounds):
            for name, src in sides if r % 2 == 0 else sides[::-1]:
                if src is None:
                    os.environ.pop("PYTHONPATH", None)
                else:
                    os.environ["PYTHONPATH"] = src
                out = cb.measure_server(template, key, tmp, cb.SESSION_IDS["built"], False)
                times[name].append(out["build"] * 1000)
                digests.add(out["digest"])
                print(f"round {r + 1}: {name}: {out['build'] * 1000:.1f} ms", flush=True)
    os.environ.pop("PYTHONPATH", None)
    print(f"first prompt request, {args.messages:,} messages, SQLite, ms:")
    for name, values in times.items():
        print(
            f"  {name}: median {statistics.median(values):.1f} "
            f"({min(values):.1f}-{max(values):.1f}), {len(values)} servers"
        )
    print("  prompts equal:", len(digests) == 1)
    print("  load average:", " / ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()

"""``ctxkeep memory``: add, search and forget episodes of episodic memory."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.table import Table

from ctxkeep.cli._io import console as make_console

HELP = """Add, search and forget episodes of episodic memory.

--db takes a URL (memory://, sqlite:///path.db); the default is the embedded SQLite file.
--embedder: local (default; pip install 'ctxkeep[embeddings]'), openai, or hash (tests).

examples:
  ctxkeep memory add --session s1 --goal "fix CI" "The flaky test was a timezone bug."
  ctxkeep memory search "why did CI fail?" --top-k 5
  ctxkeep memory search "timezone" --format prompt
  ctxkeep memory forget --session s1
"""


def register(sub: Any) -> None:
    """Add the ``memory`` command group."""
    p = sub.add_parser(
        "memory",
        help="add, search and forget episodic memories",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", help="episodic store URL (default: the embedded SQLite file)")
    p.add_argument("--embedder", default="local", help="local, openai or hash")
    p.add_argument("--json", action="store_true", help="print JSON")
    ss = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = ss.add_parser("add", help="save an episode (text, or - for standard input)")
    add.add_argument("text")
    add.add_argument("--session", required=True, help="the session it came from")
    add.add_argument("--goal", default="", help="what the run was trying to do")
    add.add_argument("--agent")
    add.add_argument("--task")
    add.add_argument("--meta", help="metadata as a JSON object")
    search = ss.add_parser("search", help="find the episodes most relevant to a query")
    search.add_argument("query")
    search.add_argument("--top-k", type=int, default=5)
    search.add_argument("--agent")
    search.add_argument("--session")
    search.add_argument("--task")
    search.add_argument(
        "--format",
        choices=["table", "prompt"],
        default="table",
        help="prompt: the '### Prior Historical Context' block",
    )
    forget = ss.add_parser("forget", help="delete episodes by id, session or agent")
    forget.add_argument("--id")
    forget.add_argument("--session")
    forget.add_argument("--agent")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the chosen action."""
    from ctxkeep.episodic import format_prior_context, open_episodic
    from ctxkeep.errors import InvalidMessageError

    with open_episodic(args.db, embedder=args.embedder) as store:
        if args.action == "add":
            text = sys.stdin.read() if args.text == "-" else args.text
            try:
                meta = json.loads(args.meta) if args.meta else None
            except ValueError as exc:
                raise InvalidMessageError(f"--meta is not JSON: {exc}") from exc
            eid = store.save_episode(
                args.session,
                args.goal,
                text,
                metadata=meta,
                agent_id=args.agent,
                task_id=args.task,
            )
            print(json.dumps({"episode_id": eid}) if args.json else eid)
            return 0
        if args.action == "search":
            filters = {
                k: v
                for k, v in (
                    ("agent_id", args.agent),
                    ("session_id", args.session),
                    ("task_id", args.task),
                )
                if v
            }
            hits = store.search(args.query, args.top_k, filters=filters)
            if args.json:
                print(
                    json.dumps(
                        [
                            {
                                "episode_id": h.episode.episode_id,
                                "session_id": h.episode.session_id,
                                "score": h.score,
                                "text": h.episode.text,
                            }
                            for h in hits
                        ],
                        indent=2,
                        ensure_ascii=False,
                    )
                )
            elif args.format == "prompt":
                print(format_prior_context(hits), end="")
            else:
                table = Table(title=f"{len(hits)} episodes for {args.query!r}")
                for col in ("score", "session", "episode", "text"):
                    table.add_column(col)
                for h in hits:
                    table.add_row(
                        f"{h.score:.3f}",
                        h.episode.session_id,
                        h.episode.episode_id[:12],
                        h.episode.text[:100],
                    )
                make_console().print(table)
            return 0
        n = store.forget(episode_id=args.id, session_id=args.session, agent_id=args.agent)
        print(json.dumps({"forgotten": n}) if args.json else f"forgot {n} episode(s)")
        return 0

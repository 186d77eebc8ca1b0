"""``ctxkeep sessions``: list, show and delete stored sessions."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from ctxkeep.cli._args import (
    Option,
    add_action,
    add_shared_options,
    non_negative_int,
    positive_int,
)
from ctxkeep.cli._io import console as make_console
from ctxkeep.cli._stores import TENANT_OPTION, open_sessions
from ctxkeep.tokens import get_counter

HELP = """List, show and delete stored sessions in any session store.

--db takes a URL (memory://, sqlite:///path.db, redis://host:port/db, postgresql://...);
the default is the embedded SQLite file ($CTXKEEP_DB or the user data directory). A store
that does not exist is an error: these commands never create one.

--tenant NAME works on that tenant's store as `ctxkeep serve --db <the same URL>` keeps it:
the sessions the API and the inspector show for that tenant's keys.
--db, --tenant and --json go before or after the action.

examples:
  ctxkeep sessions list
  ctxkeep sessions list --agent demo-agent --limit 10 --json
  ctxkeep sessions list --db sqlite:///agents.db
  ctxkeep sessions list --tenant acme
  ctxkeep sessions show 3f2a... --last 20
  ctxkeep sessions delete 3f2a...
"""


OPTIONS = (
    Option(("--db",), {"help": "session store URL (default: the embedded SQLite file)"}),
    TENANT_OPTION,
    Option(("--json",), {"action": "store_true", "help": "print JSON instead of tables"}),
)


def register(sub: Any) -> None:
    """Add the ``sessions`` command group."""
    p = sub.add_parser(
        "sessions",
        help="list, show and delete stored sessions",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ss = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = add_action(
        ss,
        "list",
        "list sessions, newest first",
        "ctxkeep sessions list --agent demo-agent --limit 10",
        "ctxkeep sessions list --db sqlite:///agents.db --json",
        "ctxkeep sessions list --tenant acme",
    )
    ls.add_argument("--agent", help="only this agent's sessions")
    ls.add_argument("--task", help="only this task's sessions")
    ls.add_argument("--limit", type=positive_int, default=50, help="at most N (default 50)")
    ls.add_argument("--offset", type=non_negative_int, default=0, help="skip the newest N")
    show = add_action(
        ss, "show", "show a session's messages", "ctxkeep sessions show 3f2a... --last 20"
    )
    show.add_argument("session_id")
    show.add_argument("--last", type=positive_int, help="only the newest N messages")
    delete = add_action(ss, "delete", "delete a session", "ctxkeep sessions delete 3f2a...")
    delete.add_argument("session_id")
    add_shared_options(p, ss, OPTIONS)
    p.set_defaults(func=run)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _preview(text: str, n: int = 90) -> str:
    one = " ".join(text.split())
    return one if len(one) <= n else one[: n - 1] + "…"


def run(args: argparse.Namespace) -> int:
    """Run the chosen action (each only reads, or deletes: none creates a store)."""
    out = make_console()
    with open_sessions(args.db, args.tenant, create=False) as mem:
        if args.action == "list":
            infos = mem.list_sessions(
                agent_id=args.agent, task_id=args.task, limit=args.limit, offset=args.offset
            )
            if args.json:
                print(json.dumps([i.to_dict() for i in infos], indent=2))
                return 0
            table = Table(title=f"sessions ({len(infos)} shown)")
            for col in ("session", "agent", "task", "messages", "created", "last access"):
                table.add_column(col)
            for i in infos:
                table.add_row(
                    i.session_id,
                    i.agent_id,
                    i.task_id or "",
                    str(i.message_count),
                    _when(i.created_at),
                    _when(i.accessed_at),
                )
            out.print(table)
            return 0
        if args.action == "show":
            info = mem.get_session(args.session_id)
            msgs = mem.get_messages(args.session_id, limit=args.last)
            if args.json:
                print(
                    json.dumps(
                        {"session": info.to_dict(), "messages": [m.to_openai() for m in msgs]},
                        indent=2,
                        ensure_ascii=False,
                    )
                )
                return 0
            counter = get_counter()
            table = Table(
                title=f"session {info.session_id} · agent {info.agent_id} · "
                f"{info.message_count} messages"
            )
            for col in ("#", "role", "tokens", "content"):
                table.add_column(col, justify="right" if col in ("#", "tokens") else "left")
            first = info.message_count - len(msgs)
            for k, m in enumerate(msgs):
                body = m.text
                if m.tool_calls:
                    body += " → " + ", ".join(f"{t.name}({t.arguments})" for t in m.tool_calls)
                table.add_row(
                    str(first + k + 1), m.role, str(counter.count_message(m)), _preview(body)
                )
            out.print(table)
            return 0
        deleted = mem.delete_session(args.session_id)
        print("deleted" if deleted else f"no session {args.session_id}")
        return 0 if deleted else 1

"""``ctxkeep mcp``: serve ctxkeep's memory to MCP clients, over stdio or streamable HTTP."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from ctxkeep.cli._args import positive_int
from ctxkeep.cli._stores import TENANT_OPTION
from ctxkeep.errors import MissingDependencyError

DEFAULT_PORT = 8766
"""The streamable HTTP port (``ctxkeep serve``'s is 8765)."""

HELP = """Serve ctxkeep's memory to MCP clients (Claude Desktop, Claude Code, Cursor...) with
the official MCP SDK (the extra ctxkeep[mcp]).

Tools: remember, recall and forget (episodes of episodic memory); create_session,
list_sessions, read_session and append_message (sessions of messages); build_prompt (a
session's prompt within a token budget, with what was dropped or compressed). Resources:
ctxkeep://sessions/{session_id} (a session's history, JSON) and ctxkeep://artifacts/{ref} (the
full text of a tool output build_prompt compressed). A bad argument or an unknown session is
an error result of that call; the server keeps answering.

--transport stdio (the default) talks over standard input and output: the client starts the
command. --transport http serves streamable HTTP at http://HOST:PORT/mcp, for clients that
connect to a URL; several clients share it. The endpoint asks for no key: listen on
127.0.0.1 (the default) unless TLS and a firewall stand in front (`ctxkeep serve` is the
service with API keys). Logs go to standard error.

--db takes a URL (sqlite:///path.db, redis://host:port/db, postgresql://...); the default is the
embedded SQLite file ($CTXKEEP_DB or the user data directory), the one the other commands use.
--tenant NAME works on that tenant's stores as `ctxkeep serve --db <the same URL>` keeps them.
Episodes are kept in SQLite or PostgreSQL (on redis:// remember and recall answer an error).

examples:
  ctxkeep mcp
  ctxkeep mcp --db sqlite:///srv/agents.db --tenant acme
  ctxkeep mcp --transport http --port 8766
  claude mcp add ctxkeep -- ctxkeep mcp
"""


def register(sub: Any) -> None:
    """Add the ``mcp`` command."""
    p = sub.add_parser(
        "mcp",
        help="serve the memory to MCP clients (stdio or streamable HTTP)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--db", help="storage URL (default: the embedded SQLite file)")
    p.add_argument(*TENANT_OPTION.flags, **TENANT_OPTION.kwargs)
    p.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio (default: the client starts this command) or http (streamable HTTP)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="http: address to listen on (default 127.0.0.1)"
    )
    p.add_argument(
        "--port",
        type=positive_int,
        default=DEFAULT_PORT,
        help=f"http: port (default {DEFAULT_PORT}); the endpoint is /mcp",
    )
    p.add_argument(
        "--embedder",
        default="local",
        help="episodic embedder: local (default: wordllama), e5-small, wordllama, openai or "
        "hash (tests only)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Open the stores and serve them until the client leaves or the process is stopped."""
    try:
        import mcp  # noqa: F401 - checked before any store is opened
    except ImportError as exc:
        raise MissingDependencyError(exc.name or "mcp", "mcp") from None
    from ctxkeep.mcp_server import Stores
    from ctxkeep.mcp_server.app import HTTP_PATH
    from ctxkeep.mcp_server.app import run as serve

    if args.transport == "http":
        from ctxkeep.cli.serve import _exit_zero_on_sigterm, check_port

        check_port(args.host, args.port)
        _exit_zero_on_sigterm()  # stopped by a supervisor: the stores closed, exit 0
    with Stores(args.db, args.tenant, embedder=args.embedder) as stores:
        if args.transport == "http":
            print(
                f"ctxkeep mcp: {stores.url}{f' (tenant {args.tenant})' if args.tenant else ''} "
                f"at http://{args.host}:{args.port}{HTTP_PATH}",
                file=sys.stderr,
                flush=True,
            )
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: a normal stop
            serve(stores, args.transport, host=args.host, port=args.port)
    return 0

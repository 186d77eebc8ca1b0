"""``ctxkeep keys``: create, list and revoke the API keys of ``ctxkeep serve``'s tenants."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ctxkeep.cli._args import Option, add_action, add_shared_options
from ctxkeep.errors import ConfigError

HELP = """Create, list and revoke API keys for `ctxkeep serve`.

A key acts for one tenant; each tenant's sessions are kept apart from every other's. Creating
a key for a new tenant name creates the tenant. The key is shown once, at creation: the store
keeps only its SHA-256. List and revoke keys by their id (the 12 hex digits after "ck_").

--db takes the storage URL the server uses (sqlite:///path.db, redis://host:port/db,
postgresql://...); the default is the embedded SQLite file ($CTXKEEP_DB or the user data
directory). list and revoke never create a store: one that does not exist is an error.
--db and --json go before or after the action.

examples:
  ctxkeep keys create --tenant acme
  export CTXKEEP_API_KEY=$(ctxkeep keys create --tenant acme --quiet)
  ctxkeep keys list
  ctxkeep keys list --tenant acme --json
  ctxkeep keys revoke 3f2a9c01b7de
"""

OPTIONS = (
    Option(("--db",), {"help": "storage URL (default: the embedded SQLite file)"}),
    Option(("--json",), {"action": "store_true", "help": "print JSON"}),
)


def register(sub: Any) -> None:
    """Add the ``keys`` command group."""
    p = sub.add_parser(
        "keys",
        help="create, list and revoke API keys of the HTTP service",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = add_action(
        actions,
        "create",
        "create a key for a tenant (shown once)",
        "ctxkeep keys create --tenant acme",
        "ctxkeep keys create --tenant acme --db sqlite:///srv/ctxkeep.db --json",
    )
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument(
        "--quiet", "-q", action="store_true", help="print only the key (for scripts)"
    )
    ls = add_action(actions, "list", "list keys (never the keys themselves)", "ctxkeep keys list")
    ls.add_argument("--tenant", help="only this tenant's keys")
    revoke = add_action(
        actions, "revoke", "revoke a key by its id", "ctxkeep keys revoke 3f2a9c01b7de"
    )
    revoke.add_argument("key_id", help="the key's id (as `keys list` shows it)")
    add_shared_options(p, actions, OPTIONS)
    p.set_defaults(func=run)


def _when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def run(args: argparse.Namespace) -> int:
    """Run the chosen action."""
    from ctxkeep.cli._stores import base_url, require_existing
    from ctxkeep.server.keys import open_key_registry

    url = base_url(args.db)
    if url == "memory://":
        raise ConfigError(
            "memory:// keeps keys only inside one process: `ctxkeep serve --db memory://` "
            "prints a key it made at startup; for keys that last, give --db the server's "
            "store (sqlite:///path.db, redis://... or postgresql://...)"
        )
    if args.action != "create":
        require_existing(url, given=args.db is not None, maker="ctxkeep keys create --tenant NAME")
    registry = open_key_registry(url)
    try:
        if args.action == "create":
            record, token = registry.create(args.tenant)
            if args.json:
                print(json.dumps({**record.public(), "key": token}, indent=2))
            elif args.quiet:
                print(token)
            else:
                print(f"key id:  {record.key_id}\ntenant:  {record.tenant}\nkey:     {token}")
                print("Store the key now: it is not shown again.")
            return 0
        if args.action == "list":
            keys = registry.list_keys(args.tenant)
            if args.json:
                print(json.dumps([k.public() for k in keys], indent=2))
                return 0
            for k in keys:
                state = f"revoked {_when(k.revoked_at)}" if k.revoked_at else "active"
                print(f"{k.key_id}  {k.tenant:<32}  created {_when(k.created_at)}  {state}")
            if not keys:
                print("no keys")
            return 0
        revoked = registry.revoke(args.key_id)
        if args.json:
            print(json.dumps({"key_id": args.key_id, "revoked": revoked}))
        else:
            print("revoked" if revoked else f"no active key {args.key_id}")
        return 0 if revoked else 1
    finally:
        registry.close()

"""``pop_item`` and ``get_items(limit=20)`` at a small and a large session holding the same
newest items (issue 26: "cost the same at 100 and at 10,000 stored items, within 20%").

    python bench/session_sizes.py [--small 100] [--large 10000] [--rounds 5]
                                  [--engines sqlite,postgres,redis] [--pg-url URL] [--json out.json]

``bench/peers.py`` loads each size with the first ``size`` items of the demo session, so its two
sizes hold different newest items (larger ones at 10,000) and its figures mix content with size.
Here both sessions end on the very same items: the small one holds the demo session's first
``--small`` items, the large one ``--large - --small`` items of filler (more of the demo
session) and then those same items. The operations then touch equal content, and what is left
is the cost of the size itself.

Per engine, ctxkeep's ``CtxkeepSession`` (``MemoryConfig(max_history=None)``: nothing trimmed)
and the Agents SDK's own session on the same engine (``SQLiteSession``, ``SQLAlchemySession`` on
PostgreSQL, ``RedisSession``) for reference, each at both sizes, all open at once. In each round
every (system, size) is measured in turn, the order reversed every other round: ``pop_item``
(each pop timed alone, the item put back untimed; median of 20) and ``get_items(limit=20)``
(median of 20). Each pop is checked to give the newest item, each read the newest 20 items.

Printed per engine, system and operation: the median with min-max over rounds at each size and
the growth, large / small - 1 (the median of the rounds' ratios, with their min-max).

Durability as in ``bench/peers.py``: SQLite at ``synchronous=full`` for ctxkeep (the peer's
default), the servers as they are configured (printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import (  # the bench folder is not a package: peers.py is found by sys.path
    Engines,
    Mismatch,
    agent_items,
    clock,
    close_session,
    sqlalchemy_engine,
)

REPEAT = 20
LIMIT = 20


class Sized:
    """One system's session at one size, with its two operations timed."""

    def __init__(
        self,
        system: str,
        size: int,
        session: Any,
        items: list[dict[str, Any]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.system, self.size, self.session, self.items = system, size, session, items
        self.run = loop.run_until_complete
        for i in range(0, len(items), 500):
            self.run(session.add_items(items[i : i + 500]))

    def pop(self) -> float:
        took: list[float] = []
        for _ in range(REPEAT):
            with clock(took):
                item = self.run(self.session.pop_item())
            if item != self.items[-1]:
                raise Mismatch(f"{self.system} at {self.size}: pop_item gave {item!r:.200}")
            self.run(self.session.add_items([item]))
        return statistics.median(took)

    def newest(self) -> float:
        took: list[float] = []
        for _ in range(REPEAT):
            with clock(took):
                got = self.run(self.session.get_items(limit=LIMIT))
            if got != self.items[-LIMIT:]:
                raise Mismatch(f"{self.system} at {self.size}: get_items(limit) read otherwise")
        return statistics.median(took)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.run(self.session.clear_session())
        with contextlib.suppress(Exception):
            close_session(self.session, self.run)


def systems(engine: str, env: Engines) -> list[tuple[str, Callable[[str, int], Any]]]:
    """(name, make(session_id, size)) of ctxkeep's session and the peer on ``engine``."""
    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    if engine == "sqlite":
        from agents.memory import SQLiteSession

        ck = f"sqlite:///{env.sqlite('sizes-ck')}/ck.db?synchronous=full"
        peer_db = env.sqlite("sizes-peer") / "agents.db"
        return [
            ("CtxkeepSession", lambda sid, _: CtxkeepSession(sid, ck, config=config)),
            ("SQLiteSession", lambda sid, _: SQLiteSession(sid, peer_db)),
        ]
    if engine == "postgres":
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        ck = env.database("sizes_ck")
        peer = sqlalchemy_engine(
            env.database("sizes_sa").replace("postgresql://", "postgresql+psycopg://")
        )
        return [
            ("CtxkeepSession", lambda sid, _: CtxkeepSession(sid, ck, config=config)),
            (
                "SQLAlchemySession",
                lambda sid, _: SQLAlchemySession(sid, engine=peer, create_tables=True),
            ),
        ]
    if engine == "redis":
        from agents.extensions.memory.redis_session import RedisSession

        ck = f"{env.redis}?prefix={env.prefix('sizes-ck')}"
        prefix = env.prefix("sizes-peer").rstrip(":")
        return [
            ("CtxkeepSession", lambda sid, _: CtxkeepSession(sid, ck, config=config)),
            (
                "RedisSession",
                lambda sid, _: RedisSession.from_url(sid, url=env.redis, key_prefix=prefix),
            ),
        ]
    raise SystemExit(f"unknown engine {engine!r}")


def spread(values: list[float], scale: float = 1e3, digits: int = 3) -> str:
    """The median (min-max) of ``values`` times ``scale``."""
    med, lo, hi = (v * scale for v in (statistics.median(values), min(values), max(values)))
    return f"{med:.{digits}f} ({lo:.{digits}f} to {hi:.{digits}f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--small", type=int, default=100)
    ap.add_argument("--large", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--engines", default="sqlite,postgres,redis")
    ap.add_argument("--pg-url", help="a PostgreSQL server to make databases on")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if e]

    # The same newest items at both sizes: the small session's items end the large one.
    tail = agent_items(args.small)
    filler = agent_items(args.large - len(tail))
    # the filler ends on a whole unit (agent_items), so the tail starts a new one
    contents = {args.small: tail, args.large: filler + tail}

    out: dict[str, Any] = {"small": args.small, "large": args.large, "rounds": args.rounds}
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="ck-sizes-") as tmp_name:
        env = Engines(args, Path(tmp_name), engines)
        try:
            for line in env.durability():
                print(line)
            for engine in engines:
                sized = [
                    Sized(name, size, make(f"{name}-{size}", size), contents[size], loop)
                    for name, make in systems(engine, env)
                    for size in (args.small, args.large)
                ]
                took: dict[tuple[str, int, str], list[float]] = {}
                for r in range(args.rounds):
                    order = sized if r % 2 == 0 else sized[::-1]
                    for s in order:
                        took.setdefault((s.system, s.size, "pop_item"), []).append(s.pop())
                        took.setdefault((s.system, s.size, "get_items(limit=20)"), []).append(
                            s.newest()
                        )
                for s in sized:
                    s.close()
                print(f"\n{engine}: ms per call, median (min-max) over {args.rounds} rounds")
                for name in dict.fromkeys(s.system for s in sized):
                    for op in ("pop_item", "get_items(limit=20)"):
                        small = took[(name, args.small, op)]
                        large = took[(name, args.large, op)]
                        growth = [b / a - 1 for a, b in zip(small, large, strict=True)]
                        print(
                            f"  {name:18} {op:20} {args.small}: {spread(small)}  "
                            f"{args.large}: {spread(large)}  growth {spread(growth, 100, 1)} %"
                        )
                        out.setdefault(engine, {}).setdefault(name, {})[op] = {
                            "small_s": small,
                            "large_s": large,
                            "growth": growth,
                        }
        finally:
            for engine_obj in _sa_engines():
                with contextlib.suppress(Exception):
                    loop.run_until_complete(engine_obj.dispose())
            env.close()
            loop.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


def _sa_engines() -> list[Any]:
    import peers

    return list(peers._ENGINES)


if __name__ == "__main__":
    main()

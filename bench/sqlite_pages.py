"""WAL frames (pages) each SQLite write of ctxkeep's adapters and of their peers writes (issue 26).

    python bench/sqlite_pages.py [--sizes 1000,10000] [--states 1] [--adapters agents,saver]
                                 [--trees] [--json out.json]

A count of work that does not depend on the machine's load: every page a committed write puts
in the WAL is one frame, and a frame is what ``synchronous=full`` syncs and what a checkpoint
copies back. Before each operation the WAL is checkpointed and emptied
(``wal_checkpoint(TRUNCATE)``) and a reader holds a snapshot (so no checkpoint restarts the WAL
under the count); after it, the frames of this WAL's generation (the header's salts) are read
from the ``-wal`` file, and with ``--trees`` each frame's page is named by ``dbstat`` (the
table or index whose b-tree holds it, ``(free)`` for a page on the freelist).

The pairs and operations, on the data of ``bench/peers.py``:

* ``agents``: ``CtxkeepSession`` (``?synchronous=full``) | the SDK's ``SQLiteSession``, holding
  ``size`` items: ``pop_item``, the re-add of the popped item (``add_items([item])``: the pop
  cycle of ``bench/peers.py``) and a fresh ``add_items`` of the next item;
* ``saver``: ``CtxkeepSaver`` | ``SqliteSaver`` (the peer's connection at ctxkeep's
  ``synchronous``), a thread of ``size`` checkpoints: one step (``put`` + ``put_writes``).

Where a b-tree's leaf is split or merged depends on the rows the newest leaf happens to hold,
so one size can be a lucky or an unlucky state for either side. ``--states K`` measures the
states after ``size``, ``size + 1``, ..., ``size + K - 1`` items (each grown by one fresh add)
and prints the mean with the range; ``--states 1`` is the state ``bench/peers.py`` measures.
Each state is measured after one pop cycle (the state the bench's repeated pops settle into).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import statistics
import struct
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import agent_items, checkpoint_steps  # the bench's own data

_WAL_HEADER = 32
_FRAME_HEADER = 24


@dataclass
class Written:
    """The frames one operation put in a WAL: the page number of each, in order, and (with
    ``trees``) the b-tree each page belongs to.
    """

    pages: list[int] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)


def wal_pages(wal: Path, page_size: int) -> list[int]:
    """The page numbers of the frames of ``wal``'s current generation (salts as the header's)."""
    data = wal.read_bytes() if wal.exists() else b""
    if len(data) < _WAL_HEADER:
        return []
    salts = data[16:24]
    pages = []
    step = _FRAME_HEADER + page_size
    for off in range(_WAL_HEADER, len(data) - step + 1, step):
        if data[off + 8 : off + 16] != salts:
            break  # a frame of an earlier generation: the WAL ends before it
        pages.append(struct.unpack(">I", data[off : off + 4])[0])
    return pages


@contextlib.contextmanager
def counting(path: Path, *, trees: bool) -> Iterator[Written]:
    """The frames the block writes to ``path``'s WAL."""
    pin = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        busy = pin.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        if busy:
            raise RuntimeError(f"{path}: the WAL could not be emptied (a reader holds it)")
        pin.execute("BEGIN")
        pin.execute("SELECT count(*) FROM sqlite_master").fetchall()
        size = pin.execute("PRAGMA page_size").fetchone()[0]
        written = Written()
        yield written
        written.pages = wal_pages(Path(f"{path}-wal"), size)
        pin.execute("COMMIT")
        if trees:
            names = {
                p: f"{n}/{t}"
                for p, n, t in pin.execute("SELECT pageno, name, pagetype FROM dbstat")
            }
            written.trees = [names.get(p, "(free)") for p in written.pages]
    finally:
        pin.close()


@dataclass
class Op:
    """One operation's frames, per state measured."""

    frames: list[int] = field(default_factory=list)
    trees: Counter[str] = field(default_factory=Counter)

    def add(self, w: Written) -> None:
        self.frames.append(len(w.pages))
        self.trees.update(w.trees)

    def summary(self) -> str:
        f = self.frames
        mean = statistics.mean(f)
        return f"{mean:.2f}" if min(f) == max(f) else f"{mean:.2f} ({min(f)}-{max(f)})"


Side = dict[str, Op]


def agents_side(make: Callable[[], Any], path: Path, size: int, states: int, trees: bool) -> Side:
    """A session's frames per operation over ``states`` sizes from ``size``."""
    load = agent_items(size)  # the state bench/peers.py measures
    items = agent_items(size + states + 10)  # its prefix is ``load``
    if items[: len(load)] != load or len(items) < len(load) + states:
        raise SystemExit(f"the bench's items do not grow from {size} as expected")
    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    session = make()
    ops: Side = {"pop_item": Op(), "re-add after a pop": Op(), "fresh add_items (one)": Op()}
    try:
        run(session.add_items(load))
        held = len(load)
        for _ in range(states):
            for cycle in range(2):  # the first settles the state the bench's pops repeat
                with counting(path, trees=trees) as popped:
                    item = run(session.pop_item())
                if item != items[held - 1]:
                    raise SystemExit(f"{type(session).__name__}: pop_item gave another item")
                with counting(path, trees=trees) as readded:
                    run(session.add_items([item]))
                if cycle:
                    ops["pop_item"].add(popped)
                    ops["re-add after a pop"].add(readded)
            with counting(path, trees=trees) as fresh:
                run(session.add_items([items[held]]))
            ops["fresh add_items (one)"].add(fresh)
            held += 1
        if run(session.get_items()) != items[:held]:
            raise SystemExit(f"{type(session).__name__}: the items read back differ")
    finally:
        closer = getattr(session, "close", None)
        if closer is not None:
            out = closer()
            if asyncio.iscoroutine(out):
                run(out)
        loop.close()
    return ops


def agents_pair(tmp: Path, size: int, states: int, trees: bool) -> tuple[Side, Side]:
    """``CtxkeepSession`` and ``SQLiteSession`` at ``size``."""
    from agents.memory import SQLiteSession

    from ctxkeep import MemoryConfig
    from ctxkeep.integrations.openai_agents import CtxkeepSession

    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    ck_path = tmp / f"agents-ck-{size}.db"
    ck = agents_side(
        lambda: CtxkeepSession("main", f"sqlite:///{ck_path}?synchronous=full", config=config),
        ck_path,
        size,
        states,
        trees,
    )
    peer_path = tmp / f"agents-peer-{size}.db"
    peer = agents_side(lambda: SQLiteSession("main", peer_path), peer_path, size, states, trees)
    return ck, peer


def saver_side(saver: Any, path: Path, size: int, states: int, trees: bool) -> Side:
    """A checkpointer's frames per step on a thread of ``size`` (to ``size + states``)."""
    from langgraph.checkpoint.base import empty_checkpoint

    steps = checkpoint_steps(size + states)
    config: dict[str, Any] = {"configurable": {"thread_id": "main", "checkpoint_ns": ""}}
    versions: dict[str, Any] = {}
    op = Op()
    for i, s in enumerate(steps):
        versions = {
            ch: saver.get_next_version(versions.get(ch), None) for ch in ("messages", "step")
        }
        checkpoint = {
            **empty_checkpoint(),
            "id": s.id,
            "channel_values": {"messages": list(s.window), "step": s.n},
            "channel_versions": dict(versions),
        }
        metadata = {"source": "loop", "step": s.n, "parents": {}}
        counted = i >= size
        with counting(path, trees=trees) if counted else contextlib.nullcontext(Written()) as w:
            config = saver.put(config, checkpoint, metadata, dict(versions))
            saver.put_writes(config, list(s.writes), s.task_id)
        if counted:
            op.add(w)
    return {"step (put + put_writes)": op}


def saver_pair(tmp: Path, size: int, states: int, trees: bool) -> tuple[Side, Side]:
    """``CtxkeepSaver`` and ``SqliteSaver`` at ``size`` checkpoints, at one ``synchronous``."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from ctxkeep.integrations.langgraph import CtxkeepSaver

    ck_path = tmp / f"saver-ck-{size}.db"
    ck = CtxkeepSaver(f"sqlite:///{ck_path}")
    sync = ck._backend.client.conn().execute("PRAGMA synchronous").fetchone()[0]
    try:
        ck_side = saver_side(ck, ck_path, size, states, trees)
    finally:
        ck.close()
    peer_path = tmp / f"saver-peer-{size}.db"
    conn = sqlite3.connect(peer_path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    try:
        peer_side = saver_side(SqliteSaver(conn), peer_path, size, states, trees)
    finally:
        conn.close()
    return ck_side, peer_side


PAIRS = {
    "agents": ("CtxkeepSession", "SQLiteSession", agents_pair),
    "saver": ("CtxkeepSaver", "SqliteSaver", saver_pair),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000", help="comma-separated sizes (items held)")
    ap.add_argument("--states", type=int, default=1, help="consecutive sizes measured from each")
    ap.add_argument("--adapters", default="agents,saver", help=f"of {','.join(PAIRS)}")
    ap.add_argument("--trees", action="store_true", help="name the b-tree of each page written")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    adapters = args.adapters.split(",")
    unknown = set(adapters) - set(PAIRS)
    if unknown or args.states < 1 or any(s < 2 for s in sizes):
        ap.error(f"adapters of {sorted(PAIRS)}, --states >= 1, sizes >= 2")
    out: list[dict[str, Any]] = []
    print(
        f"SQLite {sqlite3.sqlite_version}; WAL frames per operation, mean (min-max) over "
        f"{args.states} state(s) from each size"
    )
    print(f"{'adapter':<16}{'size':>7}  {'operation':<26}{'ctxkeep':>16}{'peer':>16}  peer")
    with tempfile.TemporaryDirectory() as folder:
        for adapter in adapters:
            ours, theirs, pair = PAIRS[adapter]
            for size in sizes:
                ck, peer = pair(Path(folder), size, args.states, args.trees)
                for name, op in ck.items():
                    print(
                        f"{ours:<16}{size:>7,}  {name:<26}{op.summary():>16}"
                        f"{peer[name].summary():>16}  {theirs}"
                    )
                    if args.trees:
                        for side, o in (("ctxkeep", op), ("peer", peer[name])):
                            n = len(o.frames)
                            per = ", ".join(f"{t} {c / n:.2f}" for t, c in o.trees.most_common())
                            print(f"{'':>25}{side}: {per}")
                    out.append(
                        {
                            "adapter": ours,
                            "peer": theirs,
                            "size": size,
                            "operation": name,
                            "ctxkeep": op.frames,
                            "peer_frames": peer[name].frames,
                            "ctxkeep_trees": dict(op.trees),
                            "peer_trees": dict(peer[name].trees),
                        }
                    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

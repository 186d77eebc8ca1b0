"""What one Redis add and one pop cost in each form they could take, on the server and in wall
time, with no client logic around them: the floor under issue 26's Redis cells.

The adapters' Redis add (LangChain ``add_message``) and pop (Agents SDK ``pop_item``) are one
round trip each, a compare-and-set script; the frameworks' own stores send one plain command
(``LPUSH``, ``RPOP``) that checks nothing and keeps no index. Here each form is sent on one
socket packed by hiredis, the same way for all, interleaved round by round (wall: median of
``--ops`` calls a round; server: Redis's own time for the form's commands, ``INFO
commandstats`` usec summed over the round, per call; of the commands the form sends: a
script's or a transaction's own commands are inside its ``EVALSHA``'s or ``EXEC``'s time,
which Redis also counts under their own names, so they are counted there only):

- ``script``: ctxkeep's own :data:`~ctxkeep.sessions.redis.APPEND_SCRIPT` /
  :data:`~ctxkeep.sessions.redis.POP_SCRIPT` on a session made by ctxkeep, its common case
  (the state as the client last saw it), the pop followed by its ``ZRANGE`` of the next
  newest message as the backend sends it;
- ``watch``: the same writes as plain commands in ``MULTI``/``EXEC`` on a connection that
  ``WATCH``es the session (the compare-and-set without Lua: re-armed in the same write by a
  ``WATCH`` and a read of the hash, so one round trip, but a connection tied to the session);
- ``watch-min``: the least a checked write could store, the record in a list and the
  session's counters, in ``MULTI``/``EXEC`` under the same ``WATCH`` (no roles index, no ids);
- ``peer``: the framework's plain command.

At the end the session is read back through ctxkeep (its messages as the script and the
pops left them: a check that the script form ran as the backend runs it) and every key made
is deleted. ``--url`` is a Redis server (default: ``redis://127.0.0.1:6379/15``); the server
figures count every client's commands of those names, so they hold on a server no one else
uses meanwhile (``redis-server --port 6391 --save ''`` beside the shared one).

    python bench/redis_forms.py --ops 300 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import hiredis

from ctxkeep import MemoryConfig, open_memory
from ctxkeep.sessions.records import RECORD_VERSION
from ctxkeep.sessions.redis import (
    APPEND_SCRIPT,
    POP_SCRIPT,
    RedisKeys,
    _taking,
    _Top,
    role_member,
)
from ctxkeep.sessions.redis import session_from_fields as _info

URL = "redis://127.0.0.1:6379/15"
CONTENT = "the tool answered with a long table of figures, " * 90
"""A message of about 4.4 kB, the size of the benches' chat messages."""


class Wire:
    """One connection, commands packed by hiredis and sent as one write."""

    def __init__(self, url: str) -> None:
        u = urlparse(url)
        self.sock = socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader(encoding="utf-8")
        db = (u.path or "/0").strip("/") or "0"
        self.send([("SELECT", db)])

    def send(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        self.sock.sendall(b"".join(hiredis.pack_command(c) for c in commands))
        out: list[Any] = []
        while len(out) < len(commands):
            reply = self.reader.gets()
            if reply is False:
                self.reader.feed(self.sock.recv(65536))
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"{commands[len(out)][0]}: {reply}")
            out.append(reply)
        return out


SENT = {
    "script": ("evalsha", "zrange"),
    "watch": ("watch", "hgetall", "multi", "exec", "zrange"),
    "watch-min": ("watch", "hgetall", "multi", "exec"),
    "peer": ("lpush", "lpop"),
}
"""The commands each form sends itself (the pop's ZRANGE after the script or the transaction
included); the commands run inside an ``EVALSHA`` or an ``EXEC`` are in its time."""


def server_usec(wire: Wire, form: str) -> float:
    """Redis's time so far in the commands ``form`` sends (``INFO commandstats``), us."""
    (info,) = wire.send([("INFO", "commandstats")])
    sent = {f"cmdstat_{name}" for name in SENT[form]}
    return sum(
        float(line.split("usec=")[1].split(",")[0])
        for line in info.splitlines()
        if line.split(":")[0] in sent
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=URL)
    ap.add_argument("--ops", type=int, default=300, help="calls of each form a round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", help="also write every figure to this file")
    args = ap.parse_args()
    prefix = f"ctxkeep-forms:{uuid.uuid4().hex}:"
    keys = RedisKeys(prefix)
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    total = args.ops * args.rounds
    wire, stats = Wire(args.url), Wire(args.url)
    with open_memory(f"{args.url}?prefix={prefix}", config) as mem:
        sid = mem.create_session("bench")
        mem.add_message(sid, "user", "first")  # the script's common case: a session that holds
        kinds = keys.written(sid)
        append_sha, pop_sha = (
            wire.send([("SCRIPT", "LOAD", s)])[0] for s in (APPEND_SCRIPT, POP_SCRIPT)
        )

        flat = wire.send([("HGETALL", kinds[0])])[0]
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        info = _info(sid, fields)
        accessed, generation = fields["accessed_at"], fields["generation"]
        record = {"v": RECORD_VERSION, "role": "user", "content": CONTENT}

        box: dict[str, Any] = {"next_seq": info.next_seq, "held": []}

        def script_add() -> None:
            seq = box["next_seq"]
            rec = {**record, "id": f"m{seq}"}
            text = json.dumps(rec, separators=(",", ":"))
            argv = (
                sid, "[]", accessed, "[]", accessed, "", generation, "1e9", "1", str(seq), "",
                f"{seq}:{text}", role_member("user", seq), rec["id"],
            )  # fmt: skip
            (out,) = wire.send([("EVALSHA", append_sha, len(kinds), *kinds, *argv)])
            assert out[0] == "ok" and out[1] == seq, out
            box["next_seq"] = seq + 1
            box["held"].append(seq)

        def script_pop() -> None:
            seq = box["held"].pop()  # the newest; the hash's next_seq stays (seqs not reused)
            top = _Top(generation, seq, {"id": f"m{seq}", "role": "user"}, box["next_seq"])
            argv = (
                *_taking(sid, info, top, (), accessed, ""),
                "1e9", str(box["next_seq"]), "", uuid.uuid4().hex,
            )  # fmt: skip
            out, _newest = wire.send(
                [("EVALSHA", pop_sha, len(kinds), *kinds, *argv), ("ZRANGE", kinds[1], -1, -1)]
            )
            assert out[0] == "ok", out

        # the plain forms, each on its own keys and its own watching connection
        w = {name: Wire(args.url) for name in ("watch", "watch-min")}
        k = {name: [f"{prefix}{name}:{part}" for part in ("s", "m", "r", "i")] for name in w}
        seqs = {name: 1 for name in w}
        for name in w:
            w[name].send([("HSET", k[name][0], "next_seq", 1, "message_count", 0)])
            w[name].send([("WATCH", k[name][0]), ("HGETALL", k[name][0])])
        text = json.dumps({**record, "id": "x"}, separators=(",", ":"))

        def rearm(name: str) -> list[tuple[Any, ...]]:
            return [("WATCH", k[name][0], k[name][1]), ("HGETALL", k[name][0])]

        def watch_add() -> None:
            s, m, r, i = k["watch"]
            n = seqs["watch"]
            out = w["watch"].send([
                ("MULTI",), ("ZADD", m, n, f"{n}:{text}"), ("ZADD", r, 0, role_member("user", n)),
                ("HSET", i, f"m{n}", n), ("HSET", s, "next_seq", n + 1, "message_count", n),
                ("EXEC",), *rearm("watch"),
            ])  # fmt: skip
            assert out[5] is not None, "a watch broke: nothing else writes these keys"
            seqs["watch"] = n + 1

        def watch_pop() -> None:
            s, m, r, i = k["watch"]
            n = seqs["watch"] - 1
            out = w["watch"].send([
                ("MULTI",), ("ZREMRANGEBYSCORE", m, n, n), ("ZREM", r, role_member("user", n)),
                ("HDEL", i, f"m{n}"), ("HSET", s, "message_count", n - 1, "op", uuid.uuid4().hex),
                ("EXEC",), *rearm("watch"), ("ZRANGE", m, -1, -1),
            ])  # fmt: skip
            assert out[5] is not None and out[5][0] == 1, out[5]
            seqs["watch"] = n

        def min_add() -> None:
            s, m, _r, _i = k["watch-min"]
            n = seqs["watch-min"]
            out = w["watch-min"].send([
                ("MULTI",), ("RPUSH", m, text), ("HSET", s, "next_seq", n + 1, "message_count", n),
                ("EXEC",), *rearm("watch-min"),
            ])  # fmt: skip
            assert out[3] is not None
            seqs["watch-min"] = n + 1

        def min_pop() -> None:
            s, m, _r, _i = k["watch-min"]
            n = seqs["watch-min"] - 1
            out = w["watch-min"].send([
                ("MULTI",), ("RPOP", m), ("HSET", s, "message_count", n - 1), ("EXEC",),
                *rearm("watch-min"),
            ])  # fmt: skip
            assert out[3] is not None and out[3][0] is not None
            seqs["watch-min"] = n

        peer_key = f"{prefix}peer"

        def peer_add() -> None:
            wire.send([("LPUSH", peer_key, text)])

        def peer_pop() -> None:
            (out,) = wire.send([("LPOP", peer_key)])
            assert out is not None

        ops: dict[str, dict[str, Callable[[], None]]] = {
            "add": {"script": script_add, "watch": watch_add, "watch-min": min_add,
                    "peer": peer_add},
            "pop": {"script": script_pop, "watch": watch_pop, "watch-min": min_pop,
                    "peer": peer_pop},
        }  # fmt: skip
        wall: dict[tuple[str, str], list[float]] = {}
        server: dict[tuple[str, str], list[float]] = {}
        for rnd in range(args.rounds):
            for op in ("add", "pop"):  # the pops take back what the round's adds stored
                forms = list(ops[op])
                random.shuffle(forms)
                for form in forms:
                    fn = ops[op][form]
                    times = []
                    before = server_usec(stats, form)
                    for _ in range(args.ops):
                        t0 = time.perf_counter()
                        fn()
                        times.append(time.perf_counter() - t0)
                    spent = server_usec(stats, form) - before
                    wall.setdefault((op, form), []).append(statistics.median(times) * 1e6)
                    server.setdefault((op, form), []).append(spent / args.ops)
            print(f"round {rnd + 1}/{args.rounds}", flush=True)
        # the script form ran as the backend runs it: the session reads back through ctxkeep
        held = mem.get_messages(sid)
        assert [m.content for m in held] == ["first"], "adds and pops left the session as it was"
        mem.delete_session(sid)
    cursor = "0"
    while True:  # every key made under the prefix (the store's meta and schema keys too)
        ((cursor, found),) = wire.send([("SCAN", cursor, "MATCH", f"{prefix}*", "COUNT", 1000)])
        if found:
            wire.send([("DEL", *found)])
        if cursor == "0":
            break
    print(f"\n{total:,} calls of each form ({args.ops} a round x {args.rounds}, interleaved);")
    print("us: median (min-max over rounds); ratio = peer's wall / the form's\n")
    print(f"{'op':4} {'form':10} {'wall us':>22} {'server us':>20} {'ratio':>6}")
    figures = []
    for op, form in [(o, f) for o in ops for f in ops[o]]:
        values = wall[(op, form)]
        peer = statistics.median(wall[(op, "peer")])
        med, srv = statistics.median(values), server[(op, form)]
        print(
            f"{op:4} {form:10} {med:9.1f} ({min(values):.1f}-{max(values):.1f})"
            f" {statistics.median(srv):8.1f} ({min(srv):.1f}-{max(srv):.1f})"
            f" {peer / med:5.2f}x"
        )
        figures.append({"op": op, "form": form, "wall_us": values, "server_us": srv})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=1)


if __name__ == "__main__":
    main()

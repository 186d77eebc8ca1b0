"""One agent process of tests/test_fabric_multiprocess.py (run as a script, not collected).

planner: publishes work items 1..N on the task's ``work`` topic, then records each result the
    worker sends back in the task state; when all N are in, marks the task finished.
worker: restores its latest checkpoint (if any), then handles work items: sends the result
    (its id derived from the item, so a redelivery resends the same id), records the item in
    the task state together with the handled mark (exactly once), and checkpoints. With
    ``--stall-after K`` it hangs after the K-th item's effect is committed but before that
    message is acked, for the test to kill it there.

``--backend redis`` (the Redis Streams bus, task state and checkpoints under ``--prefix``) or
``postgres`` (the PostgreSQL bus, task state and checkpoints in the ``search_path`` schema of
``--url``).

Events go to stdout as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ctxkeep import CheckpointStore, CognitiveState, ContextFabric, IPCMessage


def emit(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


def append(key: str, value: Any) -> Any:
    return lambda data: {key: [*data.get(key, []), value]}


def planner(args: argparse.Namespace, bus: Any, state: Any) -> None:
    fabric = ContextFabric(bus=bus)
    fabric.set_task_context("planner", {}, task_id=args.task)
    for n in range(1, args.n + 1):
        fabric.send("planner", {"n": n}, topic="work")
    emit("sent", n=args.n)

    def on_result(m: IPCMessage) -> None:
        assert m.payload["square"] == m.payload["n"] ** 2
        state.update_with(append("results", m.payload["n"]), once=bus.handled_mark("planner", m.id))

    while len(state.read()[1].get("results", [])) < args.n:
        bus.handle("planner", on_result, timeout=0.2)
    state.update_with(lambda data: {"finished": True})
    emit("finished")


def checkpoints(args: argparse.Namespace) -> CheckpointStore:
    if args.backend == "redis":
        from ctxkeep.checkpoints.redis import RedisCheckpointStore

        return RedisCheckpointStore(args.url, prefix=args.prefix)
    from ctxkeep.checkpoints.postgres import PostgresCheckpointStore

    return PostgresCheckpointStore(args.url)


def worker(args: argparse.Namespace, bus: Any, state: Any) -> None:
    store = checkpoints(args)
    fabric = ContextFabric(bus=bus)
    restored = fabric.restore_checkpoint("worker", store)
    if not restored:
        fabric.set_task_context("worker", {}, task_id=args.task)
    latest = store.latest("worker")
    memory = fabric.cognitive_state("worker").working_memory or {}
    lives = int(memory.get("lives", 0)) + 1
    emit("started", lives=lives, restored_seq=latest.seq if latest else 0)
    handled_here: list[int] = []

    def on_work(m: IPCMessage) -> None:
        n = m.payload["n"]
        fabric.bus.send(
            IPCMessage(
                sender="worker",
                recipient="planner",
                task_id=args.task,
                payload={"n": n, "square": n * n},
                id=f"result-{n}",
            )
        )
        state.update_with(append("handled", n), once=bus.handled_mark("worker", m.id))
        handled_here.append(n)
        fabric.set_private("worker", "scratch", {"last": n})
        fabric.set_cognitive_state(
            "worker",
            CognitiveState(
                context={"task": args.task},
                working_memory={"lives": lives, "handled_here": len(handled_here)},
                decision={"next": "handle the next work item"},
            ),
        )
        fabric.save_checkpoint("worker", store)
        if len(handled_here) == args.stall_after:
            emit("stalled", n=n)
            time.sleep(3600)  # the test kills the process here: committed, not acked

    while not state.read()[1].get("finished"):
        bus.handle("worker", on_work, timeout=0.2, max_messages=args.batch)
    emit("finished", lives=lives, handled_here=handled_here)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["planner", "worker"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--backend", choices=["redis", "postgres"], default="redis")
    ap.add_argument("--prefix", default="")
    ap.add_argument("--task", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--consumer", required=True)
    ap.add_argument("--claim-idle-ms", type=int, default=500)
    ap.add_argument("--batch", type=int, default=5)
    ap.add_argument("--stall-after", type=int, default=0)
    args = ap.parse_args()
    bus: Any
    state: Any
    if args.backend == "redis":
        from ctxkeep.fabric.redis_bus import RedisStreamBus
        from ctxkeep.fabric.redis_state import RedisTaskState

        bus = RedisStreamBus(
            args.url,
            consumer=args.consumer,
            prefix=args.prefix,
            claim_idle_ms=args.claim_idle_ms,
            block_ms=100,
        )
        state = RedisTaskState(args.url, args.task, prefix=args.prefix)
    else:
        from ctxkeep.fabric.postgres import PostgresBus

        bus = PostgresBus(
            args.url, consumer=args.consumer, claim_idle_ms=args.claim_idle_ms, block_ms=100
        )
        state = bus.task_state(args.task)
    try:
        (planner if args.role == "planner" else worker)(args, bus, state)
    finally:
        state.close()
        bus.close()


if __name__ == "__main__":
    main()

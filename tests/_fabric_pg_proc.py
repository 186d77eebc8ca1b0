"""One process of tests/test_fabric_postgres.py (run as a script, not collected).

cas URL TASK VERSION: writes ``{"winner": <pid>}`` to the task's state by compare-and-set at
    VERSION; prints ``{"event": "won", "version": N}`` or ``{"event": "stale", "current": N}``.
stall URL TASK CONSUMER K: handles the messages of agent ``worker`` (one batch), each effect
    (the payload appended to the task state's ``done``) committed with its handled mark; after
    the K-th effect it prints ``{"event": "stalled", "n": K}`` and hangs before acking, for the
    test to kill it there with SIGKILL.

Events go to stdout as JSON lines.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ctxkeep import IPCMessage, StaleTaskStateError
from ctxkeep.fabric.postgres import PostgresBus, PostgresTaskState


def emit(event: str, **data: Any) -> None:
    print(json.dumps({"event": event, **data}), flush=True)


def cas(url: str, task: str, version: str) -> None:
    state = PostgresTaskState(url, task)
    emit("ready")
    try:
        emit("won", version=state.update({"winner": os.getpid()}, expected_version=int(version)))
    except StaleTaskStateError as exc:
        emit("stale", current=exc.current)
    finally:
        state.close()


def stall(url: str, task: str, consumer: str, k: str) -> None:
    bus = PostgresBus(url, consumer=consumer)
    state = bus.task_state(task)
    handled: list[Any] = []

    def apply(m: IPCMessage) -> None:
        state.update_with(
            lambda data: {"done": [*data.get("done", []), m.payload]},
            once=bus.handled_mark("worker", m.id),
        )
        handled.append(m.payload)
        if len(handled) == int(k):
            emit("stalled", n=m.payload)
            time.sleep(3600)  # killed here: the effect is committed, the message not acked

    bus.handle("worker", apply, timeout=30)
    bus.close()


if __name__ == "__main__":
    {"cas": cas, "stall": stall}[sys.argv[1]](*sys.argv[2:])

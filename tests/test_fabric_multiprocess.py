"""Two agent processes cooperate on one task over a shared bus and task state (Redis Streams, and
PostgreSQL tables: the same checks for both); the worker is killed with SIGKILL mid-task, restarts
from its latest checkpoint, and the task completes with no message lost and none handled twice.

The agents are ``tests/_fabric_agent.py``. The planner publishes N work items on the task's
``work`` topic and records the results the worker sends back; the worker records each item it
handles in the task state, committed together with the message's handled mark, and
checkpoints after each. The first worker hangs right after committing its 7th item, before
acking it, with more of its batch received and unacked; the test kills it there. The second
worker (another consumer of the same agent) restores the checkpoint, takes over the dead
consumer's messages after ``claim_idle_ms``, skips the one already handled, and finishes.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest_services import postgres_schema_factory, postgres_url, redis_prefix_factory, redis_url
from ctxkeep.checkpoints import CheckpointStore

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

AGENT_SCRIPT = Path(__file__).with_name("_fabric_agent.py")
N = 30
STALL_AFTER = 7
BATCH = 5
WAIT = 30.0  # seconds any one step may take before the test gives up


class Backend:
    """What the test needs of one backend: its bus, task state and checkpoints as the agents
    open them, and a look at the worker's inbox from outside.
    """

    name: str
    url: str
    args: list[str]

    def bus(self) -> Any:
        raise NotImplementedError

    def state(self, task: str) -> Any:
        raise NotImplementedError

    def checkpoints(self) -> CheckpointStore:
        raise NotImplementedError

    def pending(self, agent: str) -> list[str]:
        """The consumer of each of the agent's messages received and not acked."""
        raise NotImplementedError

    def stored(self, agent: str) -> int:
        """How many messages the agent's inbox holds (any state)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class RedisBackend(Backend):
    name = "redis"

    def __init__(self, url: str, prefix: str) -> None:
        import redis

        from ctxkeep.fabric.redis_bus import RedisBusKeys

        self.url, self.prefix = url, prefix
        self.args = ["--backend", "redis", "--url", url, "--prefix", prefix]
        self.keys = RedisBusKeys(prefix)
        self.client = redis.Redis.from_url(url, decode_responses=True)

    def bus(self) -> Any:
        from ctxkeep.fabric.redis_bus import RedisStreamBus

        return RedisStreamBus(self.url, consumer="test", prefix=self.prefix)

    def state(self, task: str) -> Any:
        from ctxkeep.fabric.redis_state import RedisTaskState

        return RedisTaskState(self.url, task, prefix=self.prefix)

    def checkpoints(self) -> CheckpointStore:
        from ctxkeep.checkpoints.redis import RedisCheckpointStore

        return RedisCheckpointStore(self.url, prefix=self.prefix)

    def pending(self, agent: str) -> list[str]:
        found = self.client.xpending_range(self.keys.inbox(agent), agent, "-", "+", 100)
        return [p["consumer"] for p in found]

    def stored(self, agent: str) -> int:
        return int(self.client.xlen(self.keys.inbox(agent)))

    def close(self) -> None:
        self.client.close()


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg

        self.url = url
        self.args = ["--backend", "postgres", "--url", url]
        self.sql = psycopg.connect(url, autocommit=True)

    def bus(self) -> Any:
        from ctxkeep.fabric.postgres import PostgresBus

        return PostgresBus(self.url, consumer="test")

    def state(self, task: str) -> Any:
        from ctxkeep.fabric.postgres import PostgresTaskState

        return PostgresTaskState(self.url, task)

    def checkpoints(self) -> CheckpointStore:
        from ctxkeep.checkpoints.postgres import PostgresCheckpointStore

        return PostgresCheckpointStore(self.url)

    def pending(self, agent: str) -> list[str]:
        rows = self.sql.execute(
            "SELECT consumer FROM ctxkeep_bus_inbox WHERE agent_id = %s AND consumer IS NOT NULL",
            (agent,),
        ).fetchall()
        return [r[0] for r in rows]

    def stored(self, agent: str) -> int:
        rows = self.sql.execute(
            "SELECT count(*) FROM ctxkeep_bus_inbox WHERE agent_id = %s", (agent,)
        ).fetchall()
        return int(rows[0][0])

    def close(self) -> None:
        self.sql.close()


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """A fresh Redis prefix or PostgreSQL schema, removed afterwards. Skips without the
    service unless ``CTXKEEP_REQUIRE_SERVICES=1``.
    """
    made: Backend
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        made = RedisBackend(url, request.getfixturevalue("redis_prefix_factory")())
    else:
        made = PostgresBackend(request.getfixturevalue("postgres_schema_factory")())
    try:
        yield made
    finally:
        made.close()


class Agent:
    """One agent process, its JSON events read from stdout as they come."""

    def __init__(self, role: str, log: Path, *args: str) -> None:
        self.role = role
        self.log = log
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(AGENT_SCRIPT), role, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def wait_for(self, event: str) -> dict[str, Any]:
        while True:
            try:
                got = self.events.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"{self.role}: no {event!r} event; {self.stderr()}") from None
            self.seen.append(got)
            if got["event"] == event:
                return got

    def finish(self) -> int:
        try:
            return self.proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.role} did not finish; {self.stderr()}") from None

    def stderr(self) -> str:
        return f"stderr of {self.role}:\n{self.log.read_text()}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def test_killed_worker_restarts_from_its_checkpoint_and_nothing_is_lost_or_doubled(
    backend: Backend, tmp_path: Path
) -> None:
    task = f"task-{uuid.uuid4().hex[:8]}"
    common = [*backend.args, "--task", task, "--n", str(N)]
    common += ["--claim-idle-ms", "500", "--batch", str(BATCH)]

    # The task exists before its agents start: members, subscriptions and state are shared.
    setup = backend.bus()
    state = backend.state(task)
    store = backend.checkpoints()
    agents: list[Agent] = []
    try:
        setup.register("planner", task)
        setup.register("worker", task)
        setup.subscribe("worker", "work")
        state.update({"goal": f"square {N} numbers", "n": N}, expected_version=0)

        planner = Agent("planner", tmp_path / "planner.log", *common, "--consumer", "planner-1")
        agents.append(planner)
        assert planner.wait_for("sent") == {"event": "sent", "n": N}  # so batches are full
        first = Agent("worker", tmp_path / "worker-1.log", *common, "--consumer", "worker-1",
                      "--stall-after", str(STALL_AFTER))  # fmt: skip
        agents.append(first)
        assert first.wait_for("started") == {"event": "started", "lives": 1, "restored_seq": 0}
        stalled = first.wait_for("stalled")
        assert stalled["n"] == STALL_AFTER

        # Mid-task: the stalled item is committed but unacked, and so is the rest of its batch.
        _, data = state.read()
        assert data["handled"] == list(range(1, STALL_AFTER + 1))
        pending = backend.pending("worker")
        assert set(pending) == {"worker-1"}
        assert len(pending) == BATCH - STALL_AFTER % BATCH + 1
        checkpoint_at_kill = store.latest("worker")
        assert checkpoint_at_kill is not None and checkpoint_at_kill.seq == STALL_AFTER

        first.proc.send_signal(signal.SIGKILL)
        assert first.finish() == -signal.SIGKILL

        second = Agent("worker", tmp_path / "worker-2.log", *common, "--consumer", "worker-2")
        agents.append(second)
        started = second.wait_for("started")
        assert started == {"event": "started", "lives": 2, "restored_seq": STALL_AFTER}
        done = second.wait_for("finished")
        assert planner.wait_for("finished")
        assert second.finish() == 0, second.stderr()
        assert planner.finish() == 0, planner.stderr()
    finally:
        for agent in agents:
            agent.stop()
        setup.close()
        close = getattr(store, "close", None)
        if close is not None:
            close()

    try:
        _, data = state.read()
        # No message lost, none handled twice: each item's effect is in the state exactly once.
        assert sorted(data["handled"]) == list(range(1, N + 1))
        assert sorted(data["results"]) == list(range(1, N + 1))
        assert data["finished"] is True
        # The redelivered stalled item was skipped; the rest of the dead consumer's batch was not.
        assert stalled["n"] not in done["handled_here"]
        assert len(done["handled_here"]) == N - STALL_AFTER
        # The restarted worker carried its checkpointed state forward.
        latest = backend.checkpoints()
        final = latest.latest("worker")
        close = getattr(latest, "close", None)
        if close is not None:
            close()
        assert final is not None and final.seq == N
        assert final.state.working_memory == {"lives": 2, "handled_here": N - STALL_AFTER}
        # Every message was acked and left its inbox.
        for agent in ("worker", "planner"):
            assert backend.pending(agent) == []
            assert backend.stored(agent) == 0
    finally:
        state.close()

"""Two agent processes cooperate on one task over the Redis bus and shared task state; the
worker is killed with SIGKILL mid-task, restarts from its latest checkpoint, and the task
completes with no message lost and none handled twice.

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
import os
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

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

from ctxkeep.checkpoints.redis import RedisCheckpointStore  # noqa: E402
from ctxkeep.fabric.redis_bus import RedisBusKeys, RedisStreamBus  # noqa: E402
from ctxkeep.fabric.redis_state import RedisTaskState  # noqa: E402

pytestmark = pytest.mark.redis

REDIS_URL = os.environ.get("CTXKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AGENT_SCRIPT = Path(__file__).with_name("_fabric_agent.py")
N = 30
STALL_AFTER = 7
BATCH = 5
WAIT = 30.0  # seconds any one step may take before the test gives up


@pytest.fixture
def redis_prefix() -> Iterator[tuple[str, str]]:
    """``(url, fresh prefix)``; the prefix's keys are deleted afterwards. Skips without a
    Redis unless ``CTXKEEP_REQUIRE_SERVICES=1``.
    """
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, decode_responses=True)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        reason = f"no Redis answers at {REDIS_URL} ({exc}); start redis-server"
        if os.environ.get("CTXKEEP_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} (CTXKEEP_REQUIRE_SERVICES=1)", pytrace=False)
        pytest.skip(reason)
    prefix = f"ctxkeep-test:{uuid.uuid4().hex}:"
    try:
        yield REDIS_URL, prefix
    finally:
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
        client.close()


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
    redis_prefix: tuple[str, str], tmp_path: Path
) -> None:
    url, prefix = redis_prefix
    task = f"task-{uuid.uuid4().hex[:8]}"
    keys = RedisBusKeys(prefix)
    common = ["--url", url, "--prefix", prefix, "--task", task, "--n", str(N)]
    common += ["--claim-idle-ms", "500", "--batch", str(BATCH)]

    # The task exists before its agents start: members, subscriptions and state live in Redis.
    setup = RedisStreamBus(url, consumer="test", prefix=prefix)
    state = RedisTaskState(url, task, prefix=prefix)
    store = RedisCheckpointStore(url, prefix=prefix)
    client = redis.Redis.from_url(url, decode_responses=True)
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
        pending = client.xpending_range(keys.inbox("worker"), "worker", "-", "+", 100)
        assert {p["consumer"] for p in pending} == {"worker-1"}
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
        store.close()

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
        latest = RedisCheckpointStore(url, prefix=prefix)
        final = latest.latest("worker")
        latest.close()
        assert final is not None and final.seq == N
        assert final.state.working_memory == {"lives": 2, "handled_here": N - STALL_AFTER}
        # Every message was acked and left its inbox.
        for agent in ("worker", "planner"):
            assert client.xpending(keys.inbox(agent), agent)["pending"] == 0
            assert client.xlen(keys.inbox(agent)) == 0
    finally:
        state.close()
        client.close()

"""Two agents cooperating on one task through the context fabric.

A planner writes the plan into the task's shared state (compare-and-set), keeps its doubts
in its private scratchpad, and messages a coder; the coder reads the task, does the work,
reports back on a topic, and checkpoints its cognitive state so it could resume elsewhere.

    python examples/two_agents.py [--bus redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse

from ctxkeep import CognitiveState, ContextFabric, StaleTaskStateError, open_checkpoints


def run(fabric: ContextFabric, checkpoint_url: str = "memory://") -> dict[str, object]:
    store = open_checkpoints(checkpoint_url)
    task = "fix-invoice-rounding"
    fabric.set_task_context("planner", {"goal": "fix rounding in invoice totals"}, task_id=task)
    fabric.set_task_context("coder", {}, task_id=task)
    fabric.bus.subscribe("planner", "progress")

    # The planner thinks privately, then publishes a plan with compare-and-set.
    fabric.set_private("planner", "doubts", ["is the bug in tax or in FX conversion?"])
    version = fabric.task_version(task)
    fabric.update_task_context(
        "planner",
        {"plan": ["reproduce", "round once per invoice", "add a test"]},
        expected_version=version,
    )
    try:  # a second write based on the old version is refused, not lost
        fabric.update_task_context("planner", {"plan": []}, expected_version=version)
    except StaleTaskStateError as exc:
        print("refused:", exc)
    fabric.send("planner", {"please": "start with step 1"}, recipient="coder")

    # The coder sees the task and the message, never the planner's doubts.
    view = fabric.context_view("coder")
    assert "doubts" not in view.task and not view.private
    handled: list[object] = []
    fabric.bus.handle("coder", lambda m: handled.append(m.payload))
    fabric.set_cognitive_state(
        "coder",
        CognitiveState(
            context={"task": task},
            observation={"tests": "1 failed"},
            decision={"next": view.task["plan"][1]},
        ),
    )
    checkpoint_id = fabric.save_checkpoint("coder", store, session_id="coder-session-1")
    fabric.send("coder", {"done": "reproduced the bug"}, topic="progress")
    reports: list[object] = []
    fabric.bus.handle("planner", lambda m: reports.append(m.payload))
    return {
        "plan": view.task["plan"],
        "coder_got": handled,
        "planner_got": reports,
        "checkpoint": checkpoint_id,
        "resume_from": store.latest("coder").state.decision,  # type: ignore[union-attr]
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bus", help="redis://... to use the Redis Streams bus")
    args = ap.parse_args()
    bus = None
    if args.bus:
        from ctxkeep.fabric.redis_bus import RedisStreamBus

        bus = RedisStreamBus(args.bus, consumer="example")
    result = run(ContextFabric(bus=bus))
    for k, v in result.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()

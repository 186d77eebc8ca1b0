"""An agent loop on session memory: every step's prompt is built from the stored session,
pruned to an exact budget, and checked by the gate before it would go to the provider.

    python examples/agent_loop.py [--db sqlite:///agent.db] [--steps 30]
"""

from __future__ import annotations

import argparse
import json

from ctxkeep import (
    MemoryConfig,
    Message,
    PromptGate,
    TokenPruner,
    ToolCall,
    get_counter,
    open_memory,
    validate_sequence,
)


def fake_tool(step: int) -> str:
    """A tool output the size real ones have (a test log)."""
    return "\n".join(f"tests/test_{step}_{i}.py::test_case PASSED" for i in range(150))


def run(db: str, steps: int) -> list[int]:
    counter = get_counter("gpt-4o")
    pruner = TokenPruner(max_token_budget=4000, preserve_last_n=6, counter=counter)
    gate = PromptGate(max_prompt_length=200_000, max_prompt_tokens=4000, counter=counter)
    sizes = []
    with open_memory(db, MemoryConfig(max_history=500)) as memory:
        sid = memory.create_session("coder", task_id="demo")
        memory.add_message(sid, "user", "Make the test suite pass.")
        for step in range(steps):
            prompt = memory.build_prompt_messages(
                sid, system="You are a careful coding agent.", pruner=pruner
            )
            validate_sequence(prompt)
            gate.check(prompt)  # raises before the provider call if over
            sizes.append(counter.count_messages(prompt))
            call = ToolCall(id=f"call_{step}", name="bash", arguments=json.dumps({"cmd": "pytest"}))
            memory.add_messages(
                sid,
                [
                    Message("assistant", f"Running the tests (step {step}).", tool_calls=[call]),
                    Message("tool", fake_tool(step), tool_call_id=call.id),
                ],
            )
    return sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--db", default="memory://")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    sizes = run(args.db, args.steps)
    print("prompt tokens per step:", sizes)
    print("max:", max(sizes), "<= 4000")


if __name__ == "__main__":
    main()

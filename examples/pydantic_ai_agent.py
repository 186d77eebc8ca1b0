"""A pydantic-ai agent whose history ctxkeep keeps within an exact token budget.

The model is pydantic-ai's own ``FunctionModel``, scripted to read one log file per step, so
the example runs offline in a few seconds. Every request the model receives is counted with the
processor's counter; the summary shows the largest stayed within the budget while the tool
outputs added up to many times it, and that a compressed output can be read back in full.

    python examples/pydantic_ai_agent.py [--steps 30] [--budget 4000]
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ctxkeep.integrations.pydantic_ai import ProcessHistory

REF = re.compile(r"sha256:[0-9a-f]{64}")


def read_log(step: int) -> str:
    """A tool output the size real ones have (a test log of 5 to 20 thousand characters)."""
    lines = 120 + (step * 37) % 360
    return "\n".join(f"tests/test_mod_{step}.py::test_case_{i} PASSED" for i in range(lines))


def run(steps: int = 30, budget: int = 4000) -> dict[str, Any]:
    """Run the agent for ``steps`` tool calls; return what the model saw, in numbers."""
    keep = ProcessHistory(max_tokens=budget, preserve_last_n=4)
    seen: list[int] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append(keep.count_tokens(messages))
        step = len(seen)
        if step <= steps:
            return ModelResponse(
                parts=[
                    TextPart(f"Reading log {step}."),
                    ToolCallPart("read_log", {"step": step}),
                ]
            )
        return ModelResponse(parts=[TextPart(f"Read {steps} logs; every test passed.")])

    agent = Agent(
        FunctionModel(model),
        system_prompt="You are a careful CI assistant.",
        capabilities=[keep.as_capability()],
    )
    agent.tool_plain(read_log)
    result = agent.run_sync("Check the CI logs.")

    refs = [d.artifact_ref for d in (keep.last_report.decisions if keep.last_report else [])]
    ref = next((r for r in refs if r), None)
    if ref is None:  # compressed at an earlier step: the ref is in the part's text
        found = REF.search(str(result.all_messages()))
        ref = found.group(0) if found else None
    restored = keep.artifacts.get(ref) if ref else ""
    return {
        "requests": len(seen),
        "budget": budget,
        "largest_request": max(seen),
        "tool_output_chars": sum(len(read_log(s)) for s in range(1, steps + 1)),
        "restored_chars": len(restored),
        "output": result.output,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--budget", type=int, default=4000)
    args = parser.parse_args()
    s = run(args.steps, args.budget)
    print(
        f"{s['requests']} requests, largest {s['largest_request']} tokens "
        f"(budget {s['budget']}); tool outputs {s['tool_output_chars']} chars; "
        f"one compressed output read back in full: {s['restored_chars']} chars"
    )
    print(f"answer: {s['output']}")


if __name__ == "__main__":
    main()

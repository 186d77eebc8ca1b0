"""An OpenAI Agents SDK agent on ctxkeep: its history in a ``CtxkeepSession``, every model
call fitted into an exact budget by ``ctxkeep_input_filter``.

    python examples/openai_agents_app.py [DIR] [--db sqlite:///agents.db] [--budget 6000]

It runs offline: the model is the SDK's own ``ScriptedModel``, scripted to read every file of
DIR (this project's ``src/ctxkeep`` by default) with a ``read_file`` tool and then answer; a
second turn asks about the first file again and reads it back with ``read_artifact``, because
its output was compressed out of the prompt. For a real model, drop ``model=`` and set
``OPENAI_API_KEY``: nothing else changes.

What it prints: per model call, the tokens sent against the tokens the whole history holds.
"""

from __future__ import annotations

import argparse
import asyncio
import re
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

from ctxkeep import get_counter
from ctxkeep.integrations.openai_agents import (
    CtxkeepSession,
    FilterReport,
    ctxkeep_input_filter,
)
from ctxkeep.responses import from_responses

REF = re.compile(r"sha256:[0-9a-f]{64}")


def make_read_file(root: Path) -> Any:
    root = root.resolve()

    @function_tool
    def read_file(path: str) -> str:
        """Read a text file under the directory being studied."""
        target = (root / path).resolve()
        if root not in target.parents:
            return f"error: {path!r} is outside the directory"
        return target.read_text(encoding="utf-8", errors="replace")

    return read_file


def script(files: list[str]) -> list[Any]:
    """The model's turns: read each file, answer; then read the first one back and answer."""
    steps: list[Any] = [
        [function_call("read_file", {"path": f}, call_id=f"read_{i}")] for i, f in enumerate(files)
    ]
    steps.append([assistant_message(f"I read {len(files)} files.", item_id="msg_1")])

    def read_back(call: Any) -> list[Any]:
        # The first file's output was compressed: its ref is in the input. Read a page back.
        for item in call.input:
            if item.get("call_id") == "read_0" and item.get("type") == "function_call_output":
                found = REF.search(str(item["output"]))
                if found:
                    args = {"ref": found.group(0), "limit": 2000}
                    return [function_call("read_artifact", args, call_id="again_0")]
        return [function_call("read_file", {"path": files[0]}, call_id="again_0")]

    steps.append(ModelStep.respond(read_back))
    steps.append([assistant_message(f"{files[0]} starts with its docstring.", item_id="msg_2")])
    return steps


async def main(root: Path, db: str, budget: int) -> tuple[list[int], int]:
    """Run the two turns; returns the tokens sent per model call and the session's tokens."""
    files = sorted(str(p.relative_to(root)) for p in root.glob("*.py"))[:12]
    model = ScriptedModel(script(files))
    reports: list[FilterReport] = []
    flt = ctxkeep_input_filter(max_tokens=budget, on_report=reports.append)
    agent = Agent(
        name="reader",
        instructions="Read the files you are asked about, then answer in one sentence.",
        model=model,
        tools=[make_read_file(root), flt.read_artifact],
    )
    session = CtxkeepSession("reader-1", db)
    config = RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    try:
        await session.clear_session()
        first = await Runner.run(
            agent, "Read every file.", session=session, run_config=config, max_turns=40
        )
        print("turn 1:", first.final_output)
        second = await Runner.run(
            agent, "What was in the first file?", session=session, run_config=config
        )
        print("turn 2:", second.final_output)
        history = await session.get_items()
    finally:
        session.close()
    sent = [r.tokens_sent for r in reports]
    whole = get_counter().count_messages(from_responses([dict(i) for i in history]))
    compressed = reports[-1].prune.count("compressed")
    print(f"{len(model.calls)} model calls within {budget} tokens; most sent: {max(sent)}")
    print(f"last call: {compressed} old outputs sent compressed, readable with read_artifact")
    print(f"the session holds {len(history)} items ({whole} tokens), every output in full")
    return sent, whole


if __name__ == "__main__":
    here = Path(__file__).resolve().parents[1]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=here / "src" / "ctxkeep")
    parser.add_argument("--db", default="sqlite:///agents-example.db")
    parser.add_argument("--budget", type=int, default=6000)
    args = parser.parse_args()
    asyncio.run(main(args.dir, args.db, args.budget))

"""A LangChain v1 agent kept inside its window by ctxkeep's ContextMiddleware, offline.

A scripted chat model calls a tool that returns 5-20k characters for ``--steps`` steps, then
answers. Every model call is pruned to ``--window`` tokens (system prompt and tool definitions
counted), old outputs are compressed into an artifact store the agent can read back, a past
run is recalled from an episodic store, and this run is saved there when it ends.

    python examples/langchain_agent.py [--steps 30] [--window 6000]
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from ctxkeep import is_valid_sequence
from ctxkeep.episodic import open_episodic
from ctxkeep.integrations.langchain import ContextMiddleware, to_ctxkeep_messages


class MeasuredMiddleware(ContextMiddleware):
    """ContextMiddleware that also keeps the tokens of every prompt it sent."""

    sent: list[int]

    def fit_request(self, request: Any) -> Any:
        """See :meth:`ContextMiddleware.fit_request`."""
        fitted = super().fit_request(request)
        assert self.last_report is not None
        self.sent.append(self.last_report.tokens_sent)
        return fitted


class ScriptedModel(BaseChatModel):
    """Reads a file per step for ``steps`` steps, then answers; counts its calls."""

    steps: int
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.calls += 1
        n = self.calls - 1
        if n >= self.steps:
            reply = AIMessage("Found it: totals are rounded per line instead of per invoice.")
        else:
            call = {"name": "read_file", "args": {"path": f"billing/part{n}.py"}, "id": f"c{n}"}
            reply = AIMessage("", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools])


def run(steps: int = 30, window: int = 6000) -> dict[str, Any]:
    """Run the agent; returns what the summary prints."""
    rng = random.Random(0)

    @tool
    def read_file(path: str) -> str:
        """Read a source file."""
        size = rng.randint(5_000, 20_000)
        line = f"# {path}\ntotal = round(sum(line.amount for line in lines), 2)\n"
        return (line * (size // len(line) + 1))[:size]

    episodes = open_episodic("memory://", embedder="hash")
    episodes.save_episode(
        "last-week", "invoice totals are off by a cent", "Rounding per line item was the cause."
    )
    middleware = MeasuredMiddleware(max_tokens=window, episodic=episodes)
    middleware.sent = []
    model = ScriptedModel(steps=steps)
    agent = create_agent(
        model,
        [read_file, middleware.read_artifact],
        system_prompt="You debug billing code.",
        middleware=[middleware],
    )
    result = agent.invoke(
        {"messages": [HumanMessage("invoice totals are off by a cent again")]},
        config={"recursion_limit": 4 * steps + 10},
    )
    report = middleware.last_report
    assert report is not None
    state = result["messages"]
    return {
        "model_calls": model.calls,
        "tool_outputs": sum(isinstance(m, ToolMessage) for m in state),
        "history_chars": sum(len(m.text) for m in state),
        "largest_prompt_tokens": max(middleware.sent),
        "window": window,
        "recalled": report.recalled,
        "compressed": report.prune.count("compressed"),
        "valid": is_valid_sequence(to_ctxkeep_messages(state)),
        "episodes": episodes.count(),
        "answer": state[-1].text,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--window", type=int, default=6000)
    args = parser.parse_args()
    out = run(args.steps, args.window)
    print(
        f"{out['model_calls']} model calls, {out['tool_outputs']} tool outputs "
        f"({out['history_chars']:,} characters of history); the largest prompt took "
        f"{out['largest_prompt_tokens']} of {out['window']} tokens ({out['compressed']} outputs "
        f"compressed in the last); {out['recalled']} past run recalled; {out['episodes']} "
        f"episodes stored.\nAnswer: {out['answer']}"
    )

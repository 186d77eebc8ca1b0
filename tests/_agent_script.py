"""A scripted model and a tool for the agent-loop tests (also run as a subprocess).

The model behind :func:`scripted_model` asks for ``read_chunk(n)`` for n = 1, 2, ... and answers
when the last tool result it sees is chunk ``steps``; it reads n from the newest tool result in
the request, so it needs no state of its own and survives the agent's process being killed.

``python tests/_agent_script.py URL DB LOG STEPS``: run the agent against the server at URL
with its sessions in the SQLite file DB, appending ``<call id>`` to LOG each time the tool
finishes (the test kills this process at random moments).
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

from _llm_servers import Reply, openai_completion

CHUNK = 6_000  # characters of filler per tool result: large outputs


def scripted_model(steps: int) -> Any:
    def default(body: Any) -> Reply:
        last_n = 0
        for m in reversed(body.get("messages", [])):
            if m.get("role") == "tool":
                content = m["content"] if isinstance(m["content"], str) else json.dumps(m)
                found = re.search(r"chunk (\d+)", content)
                last_n = int(found.group(1)) if found else 0
                break
        if last_n >= steps:
            return Reply(body=openai_completion(f"read {steps} chunks"))
        n = last_n + 1
        call = (f"call_{n}", "read_chunk", json.dumps({"n": n}))
        return Reply(body=openai_completion(None, tool_calls=[call]))

    return default


def make_read_chunk(log: str | None = None, delay: float = 0.0) -> Any:
    def read_chunk(n: int) -> str:
        """Read chunk ``n`` of the file."""
        time.sleep(delay)
        if log is not None:
            with open(log, "a") as f:
                f.write(f"call_{n}\n")
        return f"chunk {n}\n" + ("lorem ipsum dolor " * (CHUNK // 18))

    return read_chunk


def main() -> None:
    from ctxkeep import open_memory
    from ctxkeep.agent import run_agent
    from ctxkeep.llm import ChatClient

    url, db, log, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    memory = open_memory(f"sqlite:///{db}")
    client = ChatClient(
        "gpt-4o", api_key="test", base_url=url + "/v1", memory=memory, context_window=16_000,
        max_output_tokens=1_000,
    )  # fmt: skip
    run = run_agent(
        None, "read every chunk", [make_read_chunk(log, delay=0.01)], client=client,
        max_steps=steps + 5, agent_id="reader",
    )  # fmt: skip
    print(json.dumps({"status": run.status, "resumed": run.resumed, "steps": run.steps}))


if __name__ == "__main__":
    main()

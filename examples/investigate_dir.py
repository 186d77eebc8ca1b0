"""A long-running agent that investigates a directory's files, on any OpenAI-compatible server.

    python examples/investigate_dir.py PATH "What does this project do?" \\
        --model qwen3 --base-url http://127.0.0.1:8000/v1 --window 32768

(``OPENAI_API_KEY`` is read for api.openai.com; local servers such as vLLM, llama.cpp's
``llama-server`` or Ollama's ``/v1`` take any key.) The agent lists and reads files with two
tools; every call and result is stored in a SQLite session, old outputs are compressed out of
the prompt, every request passes the gate, and the agent's state is checkpointed each step:
kill it and run the same command again, and it continues where it stopped.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ctxkeep import open_memory
from ctxkeep.agent import AgentRun, run_agent
from ctxkeep.llm import ChatClient

SYSTEM = (
    "You investigate a directory to answer a question. Use list_files and read_file; read "
    "only what you need; answer in a few sentences once you know."
)


def make_tools(root: Path) -> list[object]:
    root = root.resolve()

    def inside(relative: str) -> Path:
        path = (root / relative).resolve()
        if root != path and root not in path.parents:
            raise ValueError(f"{relative!r} is outside the directory")
        return path

    def list_files(subdir: str = ".") -> str:
        """List the files under a subdirectory (relative paths, at most 200)."""
        base = inside(subdir)
        files = sorted(str(p.relative_to(root)) for p in base.rglob("*") if p.is_file())
        return "\n".join(files[:200]) + (
            f"\n... {len(files) - 200} more" if len(files) > 200 else ""
        )

    def read_file(path: str, start_line: int = 1, max_lines: int = 400) -> str:
        """Read lines of a text file (1-based start line)."""
        lines = inside(path).read_text(errors="replace").splitlines()
        chunk = lines[max(start_line - 1, 0) : start_line - 1 + max_lines]
        return "\n".join(chunk) or "(no lines there)"

    return [list_files, read_file]


def run(
    root: Path,
    question: str,
    client: ChatClient,
    *,
    max_steps: int = 40,
) -> AgentRun:
    """Investigate ``root`` to answer ``question`` (resumes an unfinished run)."""
    tools = make_tools(root)
    return run_agent(
        None,
        question,
        tools,  # type: ignore[arg-type]
        client=client,
        max_steps=max_steps,
        agent_id=f"investigate:{root.resolve()}",
        system=SYSTEM,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("question")
    ap.add_argument("--model", default="gpt-4o-mini")
    ap.add_argument("--base-url", default=None)
    ap.add_argument("--window", type=int, default=None, help="the model's context window")
    ap.add_argument("--db", default="investigate.db", help="the SQLite file of sessions")
    ap.add_argument("--max-steps", type=int, default=40)
    args = ap.parse_args()
    client = ChatClient(
        args.model,
        base_url=args.base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "local"),
        context_window=args.window,
        memory=open_memory(f"sqlite:///{args.db}"),
    )
    result = run(args.path, args.question, client, max_steps=args.max_steps)
    print(result.answer.text if result.answer else f"stopped after {result.steps} steps")
    if result.resumed:
        print(f"(resumed session {result.session_id})")


if __name__ == "__main__":
    main()

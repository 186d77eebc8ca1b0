"""A long-running agent that investigates a directory's files, on any OpenAI-compatible server.

    python examples/investigate_dir.py PATH "What does this project do?" \\
        --model qwen3 --base-url http://127.0.0.1:8000/v1 --window 32768

Without ``--base-url`` (or ``OPENAI_BASE_URL``) it talks to api.openai.com and needs
``OPENAI_API_KEY``; local servers such as vLLM, llama.cpp's ``llama-server`` or Ollama's
``/v1`` take any key. The agent lists and reads files with two tools; every call and result is
stored in a SQLite session (``--db``, default ``investigate.db`` in ctxkeep's user data
directory), old outputs are compressed out of the prompt, every request passes the gate, and
the agent's state is checkpointed each step: kill it and run the same command again, and it
continues where it stopped.

Exit codes: 0 answered (or stopped at --max-steps), 1 the model's server did not answer or
refused the request (one line naming the URL), 2 a usage error (no key for api.openai.com).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import platformdirs

from ctxkeep import open_memory
from ctxkeep.agent import AgentRun, run_agent
from ctxkeep.errors import install_command
from ctxkeep.llm import ChatClient

PUBLIC_API = "https://api.openai.com/v1"
EXIT_UNREACHABLE = 1
EXIT_USAGE = 2

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


def default_db() -> Path:
    """``investigate.db`` in ctxkeep's user data directory (not the current directory)."""
    return Path(platformdirs.user_data_dir("ctxkeep")) / "examples" / "investigate.db"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("question")
    ap.add_argument("--model", default="gpt-4o-mini")
    ap.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="an OpenAI-compatible server (default: $OPENAI_BASE_URL, else api.openai.com)",
    )
    ap.add_argument("--window", type=int, default=None, help="the model's context window")
    ap.add_argument(
        "--db",
        type=Path,
        default=None,
        help=f"the SQLite file of sessions (default {default_db()})",
    )
    ap.add_argument("--max-steps", type=int, default=40)
    args = ap.parse_args(argv)
    url = args.base_url or PUBLIC_API
    key = os.environ.get("OPENAI_API_KEY")
    if key is None and args.base_url is None:
        print(
            "investigate_dir: no OPENAI_API_KEY for api.openai.com; set it, or give the URL of "
            "your own server with --base-url (e.g. http://127.0.0.1:8000/v1)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        import openai
    except ImportError:
        print(
            f"investigate_dir: needs the openai package: {install_command('openai')}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    db = args.db or default_db()
    db.parent.mkdir(parents=True, exist_ok=True)

    with open_memory(f"sqlite:///{db}") as memory:
        client = ChatClient(
            args.model,
            base_url=url,
            api_key=key or "local",  # a server of your own takes any key
            context_window=args.window,
            memory=memory,
        )
        try:
            result = run(args.path, args.question, client, max_steps=args.max_steps)
        except openai.APIConnectionError as exc:
            print(f"investigate_dir: no answer from {url}: {exc}", file=sys.stderr)
            return EXIT_UNREACHABLE
        except openai.APIStatusError as exc:
            print(
                f"investigate_dir: {url} refused the request ({exc.status_code}): {exc.message}",
                file=sys.stderr,
            )
            return EXIT_UNREACHABLE
    print(result.answer.text if result.answer else f"stopped after {result.steps} steps")
    if result.resumed:
        print(f"(resumed session {result.session_id})")
    print(f"(sessions in {db})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

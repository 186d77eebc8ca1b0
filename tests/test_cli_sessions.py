"""``ctxkeep sessions``: options before or after the action, quiet exit on a closed pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import ctxkeep_script
from ctxkeep.cli import EXIT_BROKEN_PIPE, main
from ctxkeep.sessions import open_memory


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A session store with one session of agent ``a1``."""
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with open_memory(url) as mem:
        sid = mem.create_session("a1")
        mem.add_message(sid, "user", "hello")
    return url


def listed_agents(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    assert main(list(argv)) == 0
    return [s["agent_id"] for s in json.loads(capsys.readouterr().out)]


# -- options around the action ------------------------------------------------------------------


def test_shared_options_are_accepted_after_the_action(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert listed_agents(capsys, "sessions", "list", "--db", db, "--json") == ["a1"]


def test_shared_options_are_still_accepted_before_the_action(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert listed_agents(capsys, "sessions", "--db", db, "--json", "list") == ["a1"]


def test_an_option_before_the_action_is_not_reset_by_the_action(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert listed_agents(capsys, "sessions", "--db", db, "list", "--json") == ["a1"]
    assert listed_agents(capsys, "sessions", "--json", "list", "--db", db) == ["a1"]


def test_memory_options_are_accepted_after_the_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'episodes.db'}"
    argv = ["memory", "add", "timezone bug", "--session", "s1", "--db", db, "--embedder", "hash"]
    assert main([*argv, "--json"]) == 0
    eid = json.loads(capsys.readouterr().out)["episode_id"]
    assert main(["memory", "search", "timezone", "--db", db, "--embedder", "hash", "--json"]) == 0
    assert [h["episode_id"] for h in json.loads(capsys.readouterr().out)] == [eid]


# -- a reader that leaves early -----------------------------------------------------------------


@pytest.fixture(scope="module")
def big_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A store whose listing and whose one long session print far more than a pipe holds."""
    url = f"sqlite:///{tmp_path_factory.mktemp('pipe') / 'sessions.db'}"
    with open_memory(url) as mem:
        for i in range(600):
            sid = mem.create_session(f"agent-{i}", task_id="a task with a long enough name")
        mem.add_messages(
            sid, [{"role": "user", "content": f"line {i} " * 100} for i in range(2000)]
        )
    return url, sid


def read_head_and_close(args: list[str]) -> tuple[bytes, str, int]:
    """Run ``ctxkeep ARGS | head -c 64``: the first bytes, stderr and the exit code."""
    proc = subprocess.Popen(
        [ctxkeep_script(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    head = proc.stdout.read(64)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    return head, stderr, proc.wait(timeout=120)


def test_sessions_json_list_into_a_pipe_closed_early_exits_quietly_as_sigpipe_would(
    big_db: tuple[str, str],
) -> None:
    url, _ = big_db
    head, stderr, code = read_head_and_close(
        ["sessions", "--json", "list", "--limit", "600", "--db", url]
    )
    assert head.startswith(b"[")
    assert stderr == ""
    assert code == EXIT_BROKEN_PIPE


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["sessions", "list", "--limit", "600"], id="list-table"),
        pytest.param(["sessions", "show", "{sid}", "--json"], id="show-json"),
        pytest.param(["sessions", "show", "{sid}"], id="show-table"),
    ],
)
def test_every_printing_command_exits_quietly_when_the_reader_leaves(
    argv: list[str], big_db: tuple[str, str]
) -> None:
    url, sid = big_db
    head, stderr, code = read_head_and_close([a.format(sid=sid) for a in argv] + ["--db", url])
    assert head
    assert stderr == ""
    # 141 when the lost write raised BrokenPipeError; CPython drops the rest of one large
    # write cut short by the closed pipe without an error, and then the command ends with 0.
    assert code in (0, EXIT_BROKEN_PIPE)


def test_the_output_console_leaves_a_closed_pipe_to_main_instead_of_exiting_1() -> None:
    # rich's own handler would exit with 1 from inside a command; ours raises, so main() can
    # end every command the same quiet way.
    script = (
        "import sys\n"
        "from ctxkeep.cli._io import console\n"
        "out = console()\n"
        "try:\n"
        "    for i in range(20000):\n"
        "        out.print('line', i, 'x' * 80)\n"
        "except BrokenPipeError:\n"
        "    sys.stderr.write('raised BrokenPipeError')\n"
        "    sys.exit(0)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(64)
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0, stderr
    assert stderr.endswith("raised BrokenPipeError")

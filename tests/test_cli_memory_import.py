"""``ctxkeep memory import``: bulk import checked line by line, stored once, resumable.

The real CLI against a real SQLite file with the hashing embedder (instant, offline); the
interrupt tests run the console script in a subprocess and stop it for real mid-import.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from _cli import assert_one_line_error, ctxkeep_script
from ctxkeep.cli import main
from ctxkeep.episodic import open_episodic
from ctxkeep.sessions import open_memory


def episode(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "session_id": f"s{i // 10}",
        "task_goal": "fix CI" if i % 2 else "",
        "summary": f"Episode {i}: the flaky test number {i} was a timezone bug.",
        **extra,
    }


def write_lines(path: Path, items: list[Any]) -> Path:
    path.write_text(
        "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in items),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'memory.db'}"


def stored(db: str) -> list[Any]:
    with open_episodic(db, embedder="hash") as store:
        return store._episodes(store._rows(_all()))


def _all() -> Any:
    from ctxkeep.episodic import EpisodeFilter

    return EpisodeFilter.parse(None)


def run_import(db: str, *args: str) -> int:
    return main(["memory", "import", "--db", db, "--embedder", "hash", *args])


def import_json(db: str, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert run_import(db, *args, "--json") == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


# -- JSON lines of episodes ---------------------------------------------------------------------


def test_import_stores_each_episode_with_its_fields(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = [
        episode(0, metadata={"lang": "en"}, created_at=1_700_000_000, agent_id="a1"),
        episode(1, task_id="t9", created_at="2026-01-01T00:00:00"),
        {"session_id": "s9", "summary": "No goal given.", "created_at": "2026-01-01T02:00+02:00"},
    ]
    out = import_json(db, capsys, str(write_lines(tmp_path / "e.jsonl", items)))
    assert out | {"source": None} == {
        "source": None,
        "episodes": 3,
        "distinct": 3,
        "invalid": [],
        "added": 3,
        "already_stored": 0,
    }
    eps = {e.summary: e for e in stored(db)}
    first = eps[items[0]["summary"]]
    assert (first.metadata, first.created_at, first.agent_id) == ({"lang": "en"}, 1.7e9, "a1")
    assert (eps[items[1]["summary"]].task_id, eps[items[1]["summary"]].created_at) == (
        "t9",
        1_767_225_600.0,  # ISO 8601 without a zone is UTC
    )
    assert (eps["No goal given."].task_goal, eps["No goal given."].created_at) == ("", 1.7672256e9)


def test_a_repeated_line_is_stored_once(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = [episode(i) for i in range(30)] + [episode(3), episode(29)]
    out = import_json(
        db, capsys, str(write_lines(tmp_path / "e.jsonl", items)), "--batch-size", "7"
    )
    assert (out["episodes"], out["distinct"], out["added"]) == (32, 30, 30)
    assert len(stored(db)) == 30


def test_a_second_run_skips_what_is_stored(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(write_lines(tmp_path / "e.jsonl", [episode(i) for i in range(25)]))
    import_json(db, capsys, path, "--batch-size", "10")
    out = import_json(db, capsys, path, "--batch-size", "10")
    assert (out["added"], out["already_stored"]) == (0, 25)
    assert len(stored(db)) == 25


def test_sessions_keep_the_file_order(db: str, tmp_path: Path) -> None:
    items = [episode(i) for i in range(10)]  # one session, s0
    assert run_import(db, str(write_lines(tmp_path / "e.jsonl", items)), "--batch-size", "3") == 0
    with open_episodic(db, embedder="hash") as store:
        rows = store._rows(_all())
        order = [e.summary for e in store._episodes(rows)]
    assert order == [e["summary"] for e in items]


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"session_id": "s", "sumary": "typo"}', "unknown field(s) 'sumary'"),
        ('{"session_id": "s", "summary": 5}', "summary must be a string"),
        ('{"summary": "no session"}', "needs session_id"),
        ('{"session_id": "s", "summary": "  "}', "summary is empty"),
        ('{"session_id": "s", "summary": "x", "metadata": [1]}', "metadata must be a mapping"),
        ('{"session_id": "s", "summary": "x", "created_at": NaN}', "invalid JSON"),
        ('{"session_id": "s", "summary": "x", "created_at": "May"}', "ISO 8601"),
        ('{"session_id": "s", "summary": "x", "created_at": true}', "created_at must be"),
    ],
)
def test_a_bad_line_stops_the_import_naming_it_and_nothing_is_stored(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, fragment: str
) -> None:
    # The bad line is the 13th, after two batches' worth of good ones.
    path = write_lines(tmp_path / "e.jsonl", [*(episode(i) for i in range(12)), line, episode(99)])
    assert run_import(db, str(path), "--batch-size", "5") == 2
    assert_one_line_error(capsys.readouterr().err, "e.jsonl, line 13:", fragment, "--skip-invalid")
    assert stored(db) == []


def test_skip_invalid_leaves_bad_lines_out_and_lists_them(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = [episode(0), "{oops", "", episode(1), '{"session_id": "s"}', episode(2)]
    out = import_json(db, capsys, str(write_lines(tmp_path / "e.jsonl", items)), "--skip-invalid")
    assert [i["line"] for i in out["invalid"]] == [2, 5]
    assert (out["episodes"], out["added"]) == (3, 3)
    assert len(stored(db)) == 3


def test_a_missing_file_is_a_clear_error(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_import(db, "/nonexistent/e.jsonl") == 2
    assert_one_line_error(capsys.readouterr().err, "no such file: /nonexistent/e.jsonl")


def test_a_plain_summary_line_and_progress_on_stderr_when_not_a_terminal(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    items = [episode(i) for i in range(20)] + [episode(0)]
    assert run_import(db, str(write_lines(tmp_path / "e.jsonl", items)), "--batch-size", "4") == 0
    out, err = capsys.readouterr()
    assert out == (
        "imported 20 new episode(s) from e.jsonl; 0 were already stored, "
        "1 repeated line(s) stored once\n"
    )
    # progress between batches; the result is said once, on stdout
    assert err.splitlines() == [
        "importing e.jsonl: 4 of 21 lines done (4 new)",
        "importing e.jsonl: 8 of 21 lines done (8 new)",
        "importing e.jsonl: 12 of 21 lines done (12 new)",
        "importing e.jsonl: 16 of 21 lines done (16 new)",
        "importing e.jsonl: 20 of 21 lines done (20 new)",
    ]


def test_a_one_batch_import_prints_its_result_once(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_import(db, str(write_lines(tmp_path / "e.jsonl", [episode(1)]))) == 0
    out, err = capsys.readouterr()
    assert out == "imported 1 new episode(s) from e.jsonl; 0 were already stored\n"
    assert err == ""


@pytest.mark.parametrize(
    ("line", "missing"),
    [
        ({"session_id": "s1", "task_goal": "fix CI"}, "no summary"),
        ({"summary": "a timezone bug"}, "no session_id"),
        ({"task_goal": "fix CI"}, "no session_id and no summary"),
    ],
)
def test_a_line_missing_a_required_field_names_it_and_not_task_goal(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], line: dict[str, str], missing: str
) -> None:
    assert run_import(db, str(write_lines(tmp_path / "e.jsonl", [line]))) == 2
    err = capsys.readouterr().err
    assert_one_line_error(err, f"e.jsonl, line 1: {missing}: a line needs session_id and summary")
    assert "task_goal and the other fields are optional" in err


# -- conversations ------------------------------------------------------------------------------

CHAT = [
    {"role": "system", "content": "You help."},
    {"role": "user", "content": "Why did CI fail?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "1 failed: test_dates"},
    {"role": "assistant", "content": "A timezone bug in the date parser."},
    {"role": "user", "content": "And the deploy?"},
    {"role": "assistant", "content": "The server ran in UTC+2."},
    {"role": "user", "content": "ok"},
]
WANT = [
    ("Why did CI fail?", "Tools used: run_tests x1\nAnswer: A timezone bug in the date parser."),
    ("And the deploy?", "Answer: The server ran in UTC+2."),
]


def test_messages_become_one_episode_per_exchange(db: str, tmp_path: Path) -> None:
    path = tmp_path / "chat.json"
    path.write_text(json.dumps(CHAT), encoding="utf-8")
    assert run_import(db, str(path), "--messages", "--agent", "a1") == 0
    eps = stored(db)
    assert [(e.task_goal, e.summary) for e in eps] == WANT
    assert {(e.session_id, e.agent_id) for e in eps} == {("chat", "a1")}
    assert [e.metadata for e in eps] == [
        {"source": "chat.json", "exchange": 0},
        {"source": "chat.json", "exchange": 1},
    ]


def test_a_stored_session_is_imported_by_id(db: str, tmp_path: Path) -> None:
    sessions = f"sqlite:///{tmp_path / 'sessions.db'}"
    with open_memory(sessions) as mem:
        sid = mem.create_session("agent-1")
        for m in CHAT:
            mem.add_structured_message(sid, m)
    args = ["--from-session", sid, "--sessions-db", sessions]
    assert run_import(db, *args) == 0
    assert run_import(db, *args) == 0  # again: nothing new
    eps = stored(db)
    assert [(e.session_id, e.task_goal, e.summary) for e in eps] == [(sid, *w) for w in WANT]
    assert all(e.created_at > 0 for e in eps)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "give FILE or --from-session ID"),
        (["x.jsonl", "--from-session", "s"], "give FILE or --from-session ID"),
        (["x.jsonl", "--session", "s"], "--session goes with --messages"),
        (["-", "--messages"], "--session is needed"),
    ],
)
def test_sources_are_named_unambiguously(
    db: str, capsys: pytest.CaptureFixture[str], args: list[str], fragment: str
) -> None:
    assert run_import(db, *args) == 2
    assert_one_line_error(capsys.readouterr().err, fragment)


# -- interrupted imports --------------------------------------------------------------------------


def stored_rows(path: Path) -> int:
    """Episodes committed to the file so far (read without opening a store)."""
    try:
        with sqlite3.connect(path, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM ctxkeep_episodes").fetchone()[0])
    except sqlite3.OperationalError:  # the table is not there yet
        return 0


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_an_import_stopped_midway_resumes_without_duplicates(tmp_path: Path, sig: int) -> None:
    n = 1_500
    items = [episode(i) for i in range(n)] + [episode(i) for i in range(0, n, 100)]
    path = write_lines(tmp_path / "e.jsonl", items)
    dbfile = tmp_path / "memory.db"
    cmd = [ctxkeep_script(), "memory", "import", str(path), "--db", f"sqlite:///{dbfile}"]
    cmd += ["--embedder", "hash", "--batch-size", "10"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as from a terminal: a pytest-xdist worker ignores SIGINT, and its children would too
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while stored_rows(dbfile) == 0 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    # Hold the file's write lock between two batches, so the import cannot run to its end
    # (on a quiet machine it takes a fraction of a second): the signal finds it midway.
    lock = sqlite3.connect(dbfile, timeout=30, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        os.kill(proc.pid, sig)
        time.sleep(0.2)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    _, err = proc.communicate(timeout=60)
    partial = stored_rows(dbfile)
    assert 0 < partial < n, "the import was not stopped midway"
    assert partial % 10 == 0  # whole batches only
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert "run the same command again to resume" in err
    else:
        assert proc.returncode == -signal.SIGKILL

    # Resumed with other batches: what is stored is known by content, not by position.
    resume = [*cmd[:-1], "500", "--json"]
    again = subprocess.run(resume, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert (out["distinct"], out["already_stored"], out["added"]) == (n, partial, n - partial)
    summaries = Counter(e.summary for e in stored(f"sqlite:///{dbfile}"))
    assert len(summaries) == n
    assert set(summaries.values()) == {1}

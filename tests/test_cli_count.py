"""``ctxkeep --version`` and ``ctxkeep count``: tables, JSON that matches the library, errors."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ctxkeep import __version__, coerce_messages, get_counter
from ctxkeep.cli import main

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "List the files."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py"},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
]


def ctxkeep_script() -> str:
    script = Path(sys.executable).with_name("ctxkeep")
    found = str(script) if script.exists() else shutil.which("ctxkeep")
    if found is None:
        pytest.skip("the ctxkeep console script is not installed (pip install -e .)")
    return found


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["count", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def messages_file(tmp_path: Path) -> Path:
    path = tmp_path / "session.json"
    path.write_text(json.dumps(MESSAGES), encoding="utf-8")
    return path


# -- --version ----------------------------------------------------------------------------------


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ctxkeep {__version__}"


def test_the_console_script_prints_the_version() -> None:
    result = subprocess.run(
        [ctxkeep_script(), "--version"], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"ctxkeep {__version__}"


def test_count_help_has_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["count", "--help"])
    assert "ctxkeep count" in capsys.readouterr().out


# -- counting -----------------------------------------------------------------------------------


def test_json_counts_of_messages_equal_the_library(
    messages_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(capsys, str(messages_file))
    counter = get_counter("o200k_base")
    msgs = coerce_messages(MESSAGES)
    assert out["kind"] == "messages"
    assert out["total_tokens"] == {"o200k_base": counter.count_messages(msgs)}
    assert out["exact"] == {"o200k_base": True}
    for role in ("system", "user", "assistant", "tool"):
        of_role = [m for m in msgs if m.role == role]
        assert out["roles"][role]["messages"] == len(of_role)
        assert out["roles"][role]["tokens"]["o200k_base"] == sum(
            counter.count_message(m) for m in of_role
        )


def test_repeated_encodings_are_each_counted(
    messages_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(
        capsys, str(messages_file), "-e", "o200k_base", "-e", "cl100k_base", "-e", "heuristic"
    )
    msgs = coerce_messages(MESSAGES)
    assert out["total_tokens"] == {
        name: get_counter(name).count_messages(msgs)
        for name in ("o200k_base", "cl100k_base", "heuristic")
    }
    assert out["exact"] == {"o200k_base": True, "cl100k_base": True, "heuristic": False}


def test_a_model_name_is_accepted_as_an_encoding(
    messages_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_json(capsys, str(messages_file), "-e", "gpt-4")
    assert out["total_tokens"]["gpt-4"] == get_counter("cl100k_base").count_messages(
        coerce_messages(MESSAGES)
    )


# One trajectory of each source (the library's counts are checked on all of them in test_tokens).
@pytest.mark.shared_data
@pytest.mark.parametrize("prefix", ["mini-swe-", "swe-agent-", "tau-"])
def test_a_trajectory_counts_like_the_library(
    prefix: str, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trajectory = min((shared_data / "trajectories").glob(f"{prefix}*.json"))
    messages = json.loads(trajectory.read_text(encoding="utf-8"))["messages"]
    out = run_json(capsys, str(trajectory), "-e", "o200k_base", "-e", "cl100k_base")
    assert out["file"] == trajectory.name
    assert out["total_tokens"] == {
        name: get_counter(name).count_messages(messages) for name in ("o200k_base", "cl100k_base")
    }
    assert sum(r["messages"] for r in out["roles"].values()) == len(messages)


def test_a_text_file_is_counted_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "Plain notes, not JSON.\n日本語も数える。<|endoftext|>\n"
    path = tmp_path / "notes.txt"
    path.write_text(text, encoding="utf-8")
    out = run_json(capsys, str(path), "-e", "o200k_base", "-e", "cl100k_base")
    assert out["kind"] == "text"
    assert out["roles"]["text"]["characters"] == len(text)
    assert out["total_tokens"] == {
        "o200k_base": get_counter("o200k_base").count_text(text),
        "cl100k_base": get_counter("cl100k_base").count_text(text),
    }


def test_text_that_starts_with_a_brace_is_still_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "snippet.txt"
    path.write_text("{x for x in range(3)}\n", encoding="utf-8")
    assert run_json(capsys, str(path))["kind"] == "text"


def test_standard_input_is_read_for_a_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(MESSAGES)))
    out = run_json(capsys, "-")
    assert out["file"] == "<stdin>"
    assert out["total_tokens"]["o200k_base"] == get_counter("o200k_base").count_messages(MESSAGES)


def test_jsonl_messages_are_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text("\n".join(json.dumps(m) for m in MESSAGES) + "\n", encoding="utf-8")
    out = run_json(capsys, str(path))
    assert out["total_tokens"]["o200k_base"] == get_counter("o200k_base").count_messages(MESSAGES)


def test_several_files_give_a_list(messages_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, str(messages_file), str(messages_file))
    assert [r["file"] for r in out] == ["session.json", "session.json"]


def test_the_table_shows_each_role_and_the_total(
    messages_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["count", str(messages_file), "-e", "o200k_base", "-e", "heuristic"]) == 0
    out = capsys.readouterr().out
    for word in ("system", "user", "assistant", "tool", "total", "o200k_base"):
        assert word in out
    assert "heuristic (estimate)" in out
    total = get_counter("o200k_base").count_messages(MESSAGES)
    assert f"{total:,}" in out


def test_the_console_script_counts_standard_input(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    result = subprocess.run(
        [ctxkeep_script(), "count", "-", "--json"],
        input="hello world",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["total_tokens"] == {
        "o200k_base": get_counter("o200k_base").count_text("hello world")
    }


# -- errors ---------------------------------------------------------------------------------


def run_failing(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["count", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ctxkeep: error: ")
    return captured.err


def test_truncated_json_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(MESSAGES)[:-40], encoding="utf-8")
    assert "cut.json: invalid JSON" in run_failing(capsys, str(path))


def test_truncated_json_on_standard_input_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO('[{"role": "user", "content": "hi"'))
    assert "<stdin>: invalid JSON" in run_failing(capsys, "-")


def test_a_malformed_message_exits_2_naming_its_index(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([*MESSAGES, {"role": "wizard", "content": "x"}]), encoding="utf-8")
    err = run_failing(capsys, str(path))
    assert "message 5" in err
    assert "wizard" in err


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no such file" in run_failing(capsys, str(tmp_path / "absent.json"))


def test_a_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert str(tmp_path) in run_failing(capsys, str(tmp_path))


def test_an_unknown_encoding_exits_2(
    messages_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "llama-3" in run_failing(capsys, str(messages_file), "-e", "llama-3")


def test_the_sample_file_the_help_names_is_shipped_and_counts() -> None:
    from pathlib import Path

    from ctxkeep.cli import main

    sample = Path(__file__).resolve().parents[1] / "examples" / "data" / "session.json"
    assert main(["count", str(sample), "--json"]) == 0

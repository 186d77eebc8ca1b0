"""The examples run."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_two_agents_example() -> None:
    from ctxkeep import ContextFabric

    result = _load("two_agents").run(ContextFabric())
    assert result["coder_got"] == [{"please": "start with step 1"}]
    assert result["planner_got"] == [{"done": "reproduced the bug"}]
    assert result["resume_from"] == {"next": "round once per invoice"}


def test_agent_loop_example(tmp_path: Path) -> None:
    sizes = _load("agent_loop").run(f"sqlite:///{tmp_path}/agent.db", steps=15)
    assert len(sizes) == 15 and max(sizes) <= 4000


# -- investigate_dir.py: the user's first run (issue 27, item 7) ---------------------------------


def _investigate(
    *args: str, env: dict[str, str | None], cwd: Path
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "investigate_dir.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
        env=environ,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_investigate_with_no_server_answering_is_one_line_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    done = _investigate(
        ".", "What is it?", "--base-url", url, "--db", str(tmp_path / "i.db"),
        env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"investigate_dir: no answer from {url}")
    assert "Traceback" not in done.stderr


def test_investigate_without_a_key_never_goes_to_the_public_api(tmp_path: Path) -> None:
    done = _investigate(
        ".", "What is it?", env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None}, cwd=tmp_path
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "no OPENAI_API_KEY for api.openai.com" in line and "--base-url" in line
    assert [p.name for p in tmp_path.iterdir()] == ["home"]  # nothing written


def test_investigate_keeps_its_files_in_the_user_data_directory(
    tmp_path: Path, isolated_environment: Path
) -> None:
    from _llm_servers import Reply, openai_completion, running

    work = tmp_path / "work"
    (work / "proj").mkdir(parents=True)
    (work / "proj" / "README").write_text("This project brews coffee.\n")
    with running(lambda body: Reply(body=openai_completion("It brews coffee."))) as server:
        done = _investigate(
            "proj", "What is it?", "--base-url", server.url + "/v1",
            env={"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None}, cwd=work,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "It brews coffee."
    db = isolated_environment / ".local" / "share" / "ctxkeep" / "examples" / "investigate.db"
    assert db.is_file()
    assert f"(sessions in {db})" in done.stderr
    assert sorted(p.name for p in work.iterdir()) == ["proj"]  # nothing in the current directory


# -- langgraph_app.py: another embedder after a default run (issue 27, item 12) ------------------


def test_langgraph_example_keeps_a_file_per_embedder(
    isolated_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = _load("langgraph_app")
    assert app.cli([]) == 0
    assert app.cli(["--embedder", "local"]) == 0  # after a default run: its own file
    folder = isolated_environment / ".local" / "share" / "ctxkeep" / "examples"
    assert sorted(p.name for p in folder.iterdir()) == ["langgraph-hash.db", "langgraph-local.db"]
    assert capsys.readouterr().out.count("recalled: ['I am allergic to penicillin']") == 2


def test_langgraph_example_on_another_embedders_file_says_how_to_start_over(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = _load("langgraph_app")
    db = tmp_path / "lg.db"
    assert app.cli(["--db", str(db)]) == 0
    capsys.readouterr()
    assert app.cli(["--db", str(db), "--embedder", "local"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "holds vectors of embedder 'hash-for-tests-256'" in line
    assert line.endswith(f"to start over, delete {db} or give another --db")

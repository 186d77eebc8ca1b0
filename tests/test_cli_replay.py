"""``ctxkeep replay`` and ``ctxkeep demo`` report what the pruner did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxkeep.cli import main
from ctxkeep.demo import demo_session
from ctxkeep.messages import validate_sequence


def _write_run(tmp_path: Path) -> Path:
    path = tmp_path / "run.json"
    msgs = [m.to_openai() for m in demo_session(steps=25, seed=3)]
    path.write_text(json.dumps({"id": "r", "messages": msgs}), encoding="utf-8")
    return path


def test_demo_session_is_valid_and_long() -> None:
    msgs = demo_session(steps=50)
    validate_sequence(msgs)
    assert len(msgs) > 100


def test_replay_json_reports_zero_over_budget_and_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_run(tmp_path)
    assert main(["replay", str(path), "--budget", "3000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    total = out["total"]
    assert total["prompts"] == 26
    assert total["over_budget"] == 0 and total["invalid"] == 0
    assert total["tokens_sent"] < total["tokens_unpruned"]


def test_replay_reads_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.jsonl"
    msgs = [m.to_openai() for m in demo_session(steps=5)]
    path.write_text("\n".join(json.dumps(m) for m in msgs), encoding="utf-8")
    assert main(["replay", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total"]["prompts"] == 6


def test_replay_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", str(_write_run(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "tokens sent" in out and "over budget" in out


def test_replay_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "tokens.png"
    assert main(["replay", str(_write_run(tmp_path)), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_of_truncated_json_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"messages": [{"role": "user", "content": "hi"', encoding="utf-8")
    assert main(["replay", str(path)]) == 2
    assert "invalid JSON" in capsys.readouterr().err


def test_demo_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "20", "--json"]) == 0
    total = json.loads(capsys.readouterr().out)["total"]
    assert total["prompts"] == 21 and total["over_budget"] == 0 and total["invalid"] == 0


def test_replay_plot_without_matplotlib_stops_before_replaying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    import ctxkeep.cli.replay as replay

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("replayed before checking for matplotlib")

    monkeypatch.setattr(replay, "replay_runs", never)
    png = tmp_path / "tokens.png"
    for argv in (["replay", str(_write_run(tmp_path))], ["demo", "--db", "memory://"]):
        assert main([*argv, "--plot", str(png)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("ctxkeep: error: matplotlib is not installed")
        assert "ctxkeep[plot]" in err and "pip install" in err
    assert not png.exists()

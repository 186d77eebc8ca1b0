"""Every numeric option refuses values that make no sense; every command's help has an example."""

from __future__ import annotations

import pytest

from _cli import run_script
from ctxkeep.cli import main

BAD_NUMBERS = [
    (["demo"], "--steps", "-3"),
    (["demo"], "--steps", "0"),
    (["demo"], "--budget", "0"),
    (["demo"], "--budget", "-100"),
    (["demo"], "--last-n", "-1"),
    (["demo"], "--seed", "seven"),
    (["replay", "run.json"], "--budget", "-5"),
    (["replay", "run.json"], "--last-n", "-2"),
    (["sessions", "list"], "--limit", "0"),
    (["sessions", "list"], "--limit", "-1"),
    (["sessions", "list"], "--offset", "-1"),
    (["sessions", "show", "some-id"], "--last", "0"),
    (["memory", "search", "query"], "--top-k", "0"),
    (["memory", "search", "query"], "--top-k", "-3"),
    (["memory", "search", "query"], "--min-score", "nan"),
    (["memory", "search", "query"], "--min-score", "inf"),
    (["memory", "search", "query"], "--min-score", "high"),
]


@pytest.mark.parametrize(
    ("command", "option", "value"),
    BAD_NUMBERS,
    ids=[f"{' '.join(c[:2])} {o} {v}" for c, o, v in BAD_NUMBERS],
)
def test_a_numeric_option_out_of_range_is_a_usage_error(
    command: list[str], option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, option, value])
    assert info.value.code == 2
    assert f"error: argument {option}: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [(["demo"], "--last-n", "0"), (["sessions", "list"], "--offset", "0"),
     (["demo"], "--seed", "-1"), (["memory", "search", "q"], "--min-score", "-0.5")],
)  # fmt: skip
def test_a_numeric_option_at_its_lowest_sensible_value_parses(
    command: list[str], option: str, value: str
) -> None:
    from ctxkeep.cli import build_parser

    args = build_parser().parse_args([*command, option, value])
    assert getattr(args, option.lstrip("-").replace("-", "_")) == float(value)


def test_demo_with_negative_steps_exits_2_through_the_console_script() -> None:
    result = run_script("demo", "--steps", "-3")
    assert result.returncode == 2
    assert "argument --steps: must be a positive integer, got -3" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


COMMANDS = [
    ["count"],
    ["replay"],
    ["demo"],
    ["sessions"],
    ["sessions", "list"],
    ["sessions", "show"],
    ["sessions", "delete"],
    ["memory"],
    ["memory", "add"],
    ["memory", "search"],
    ["memory", "forget"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_every_command_help_shows_an_example(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out
    assert f"  ctxkeep {' '.join(command)}" in out

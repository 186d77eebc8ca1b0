"""The gate: code-point and exact-token limits, their settings, and the breakdown it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctxkeep import ConfigError, CtxkeepError, Message, PromptGate, PromptTooLongError, ToolCall
from ctxkeep.config import ConfigWarning
from ctxkeep.tokens import TiktokenCounter

CJK = "漢"  # one code point, three UTF-8 bytes


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file that CTXKEEP_CONFIG points at (write settings into it)."""
    path = tmp_path / "ctxkeep.toml"
    monkeypatch.setenv("CTXKEEP_CONFIG", str(path))
    return path


# -- the length limit ---------------------------------------------------------------------------


def test_the_default_limit_is_8192_code_points() -> None:
    assert PromptGate().max_prompt_length == 8192
    assert PromptGate().max_prompt_tokens is None


def test_a_cjk_prompt_of_8192_characters_passes_though_it_is_three_times_that_in_bytes() -> None:
    prompt = CJK * 8192
    assert len(prompt.encode("utf-8")) == 3 * 8192
    assert PromptGate().check(prompt) == prompt


def test_a_cjk_prompt_of_8193_characters_is_refused() -> None:
    with pytest.raises(PromptTooLongError) as info:
        PromptGate().check(CJK * 8193)
    assert str(info.value).startswith("prompt exceeds maximum length of 8192 characters")
    assert (info.value.limit, info.value.actual, info.value.excess) == (8192, 8193, 1)
    assert info.value.unit == "characters"


def test_prompt_too_long_is_a_value_error_and_a_ctxkeep_error() -> None:
    with pytest.raises(PromptTooLongError) as info:
        PromptGate(10).check("x" * 11)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, CtxkeepError)


@pytest.mark.parametrize("unset", [0, None])
def test_zero_or_none_means_the_default(unset: int | None) -> None:
    assert PromptGate(max_prompt_length=unset).max_prompt_length == 8192


def test_messages_are_measured_in_code_points_with_a_breakdown_per_role() -> None:
    msgs = [
        {"role": "system", "content": "s" * 100},
        {"role": "user", "content": CJK * 50},
        {"role": "assistant", "content": "a" * 30},
        {"role": "user", "content": CJK * 50},
    ]
    with pytest.raises(PromptTooLongError) as info:
        PromptGate(max_prompt_length=200).check(msgs)
    assert info.value.breakdown == {"system": 100, "user": 100, "assistant": 30}
    assert info.value.actual == sum(info.value.breakdown.values()) == 230
    assert "system=100, user=100, assistant=30" in str(info.value)


def test_tool_call_names_and_arguments_count_toward_the_length() -> None:
    call = ToolCall(id="call_1", name="bash", arguments='{"command": "ls"}')
    m = Message("assistant", "ok", tool_calls=[call])
    limit = len("ok") + len("bash") + len('{"command": "ls"}')
    assert PromptGate(limit).check([m]) == [m]
    with pytest.raises(PromptTooLongError):
        PromptGate(limit - 1).check([m])


def test_check_returns_messages_from_dicts() -> None:
    out = PromptGate().check([{"role": "user", "content": "hi"}])
    assert out == [Message("user", "hi")]


# -- settings -----------------------------------------------------------------------------------


def test_the_environment_sets_the_length(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_LENGTH", "100")
    assert PromptGate().max_prompt_length == 100


def test_the_config_file_sets_the_length(config_file: Path) -> None:
    config_file.write_text("max_prompt_length = 300\n", encoding="utf-8")
    assert PromptGate().max_prompt_length == 300


def test_the_environment_beats_the_config_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text("max_prompt_length = 300\n", encoding="utf-8")
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_LENGTH", "200")
    assert PromptGate().max_prompt_length == 200


def test_an_explicit_argument_beats_the_environment_and_the_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text("max_prompt_length = 300\n", encoding="utf-8")
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_LENGTH", "200")
    assert PromptGate(max_prompt_length=100).max_prompt_length == 100


def test_zero_in_the_environment_falls_through_to_the_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text("max_prompt_length = 300\n", encoding="utf-8")
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_LENGTH", "0")
    assert PromptGate().max_prompt_length == 300


def test_the_environment_and_the_file_set_the_token_limit(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text("max_prompt_tokens = 5000\n", encoding="utf-8")
    assert PromptGate().max_prompt_tokens == 5000
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_TOKENS", "4000")
    assert PromptGate().max_prompt_tokens == 4000


@pytest.mark.parametrize("value", ["lots", "1.5", "-3", "8k"])
def test_a_bad_environment_value_is_a_config_error(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_MAX_PROMPT_LENGTH", value)
    with pytest.raises(ConfigError, match="CTXKEEP_MAX_PROMPT_LENGTH") as info:
        PromptGate()
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", ['"8192"', "-1", "1.5", "true"])
def test_a_bad_config_file_value_is_a_config_error(value: str, config_file: Path) -> None:
    config_file.write_text(f"max_prompt_length = {value}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="max_prompt_length"):
        PromptGate()


def test_a_config_file_that_is_not_toml_is_a_config_error(config_file: Path) -> None:
    config_file.write_text("max_prompt_length = = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid TOML"):
        PromptGate()


def test_a_misspelled_key_in_the_config_file_warns_naming_it(config_file: Path) -> None:
    config_file.write_text("max_prompt_lenght = 300\n", encoding="utf-8")
    with pytest.warns(
        ConfigWarning, match=r"'max_prompt_lenght'.*did you mean 'max_prompt_length'"
    ):
        gate = PromptGate()
    assert gate.max_prompt_length == 8192


@pytest.mark.parametrize("value", [-1, True, 1.5, "100"])
def test_a_bad_explicit_value_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="max_prompt_length"):
        PromptGate(max_prompt_length=value)  # type: ignore[arg-type]


# -- the token limit ----------------------------------------------------------------------------


def conversation() -> list[Message]:
    return [
        Message("system", "You are a careful assistant. " * 10),
        Message("user", "Summarise the report below.\n" + "Quarterly revenue grew. " * 40),
        Message("assistant", "Revenue grew every quarter."),
        Message("user", "And costs?"),
    ]


def test_a_prompt_over_the_token_limit_is_refused_with_a_breakdown_per_role() -> None:
    counter = TiktokenCounter("o200k_base")
    msgs = conversation()
    actual = counter.count_messages(msgs)
    with pytest.raises(PromptTooLongError) as info:
        PromptGate(max_prompt_tokens=actual - 1, counter=counter).check(msgs)
    err = info.value
    assert str(err).startswith(f"prompt exceeds maximum length of {actual - 1} tokens")
    assert (err.unit, err.actual, err.excess) == ("tokens", actual, 1)
    assert err.breakdown == {
        "system": counter.count_message(msgs[0]),
        "user": counter.count_message(msgs[1]) + counter.count_message(msgs[3]),
        "assistant": counter.count_message(msgs[2]),
        "reply_priming": 3,
    }
    assert sum(err.breakdown.values()) == err.actual


def test_a_prompt_at_the_token_limit_passes() -> None:
    counter = TiktokenCounter("o200k_base")
    msgs = conversation()
    gate = PromptGate(max_prompt_tokens=counter.count_messages(msgs), counter=counter)
    assert gate.check(msgs) == msgs


def test_the_token_limit_uses_o200k_base_by_default() -> None:
    text = "Quarterly revenue grew. " * 40
    tokens = TiktokenCounter("o200k_base").count_text(text)
    assert PromptGate(max_prompt_tokens=tokens).check(text) == text
    with pytest.raises(PromptTooLongError, match=f"of {tokens - 1} tokens"):
        PromptGate(max_prompt_tokens=tokens - 1).check(text)


def test_the_length_limit_is_checked_before_the_token_limit() -> None:
    with pytest.raises(PromptTooLongError, match="characters"):
        PromptGate(max_prompt_length=10, max_prompt_tokens=1).check("x" * 11)

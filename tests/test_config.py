"""Settings: explicit argument > environment > config file > default, read in ctxkeep.config."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from ctxkeep import ConfigError, PromptGate, get_counter
from ctxkeep.config import SETTINGS, ConfigWarning, load_config_file


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A config file that CTXKEEP_CONFIG points at (write settings into it)."""
    path = tmp_path / "ctxkeep.toml"
    monkeypatch.setenv("CTXKEEP_CONFIG", str(path))
    return path


# -- the encoding -------------------------------------------------------------------------------


def test_get_counter_uses_the_config_file_encoding(config_file: Path) -> None:
    config_file.write_text('encoding = "cl100k_base"\n', encoding="utf-8")
    assert get_counter().name == "cl100k_base"


def test_the_environment_encoding_beats_the_config_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text('encoding = "cl100k_base"\n', encoding="utf-8")
    monkeypatch.setenv("CTXKEEP_ENCODING", "heuristic")
    assert get_counter().name == "heuristic"


def test_an_explicit_encoding_beats_the_environment_and_the_config_file(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text('encoding = "cl100k_base"\n', encoding="utf-8")
    monkeypatch.setenv("CTXKEEP_ENCODING", "heuristic")
    assert get_counter("o200k_base").name == "o200k_base"


def test_the_config_file_encoding_may_be_a_model_name(config_file: Path) -> None:
    config_file.write_text('encoding = "gpt-4"\n', encoding="utf-8")
    assert get_counter().name == "cl100k_base"


def test_a_config_file_encoding_that_is_not_a_string_is_a_config_error(config_file: Path) -> None:
    config_file.write_text("encoding = 200\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"encoding in .* must be a string"):
        get_counter()


def test_the_gate_counts_tokens_in_the_configured_encoding(config_file: Path) -> None:
    config_file.write_text('encoding = "cl100k_base"\n', encoding="utf-8")
    assert PromptGate(max_prompt_tokens=100).counter.name == "cl100k_base"


# -- unknown keys -------------------------------------------------------------------------------


def test_a_misspelled_key_warns_naming_it_the_likely_key_and_the_known_keys(
    config_file: Path,
) -> None:
    config_file.write_text('encodng = "cl100k_base"\n', encoding="utf-8")
    with pytest.warns(ConfigWarning) as record:
        assert get_counter().name == "o200k_base"
    message = str(record[0].message)
    assert "unknown key 'encodng'" in message
    assert "did you mean 'encoding'?" in message
    assert all(key in message for key in SETTINGS)


def test_an_unknown_key_with_no_close_match_still_warns(config_file: Path) -> None:
    config_file.write_text("colour = true\n", encoding="utf-8")
    with pytest.warns(ConfigWarning, match=r"unknown key .colour.*Known keys: encoding"):
        load_config_file()


def test_a_file_with_only_known_keys_does_not_warn(config_file: Path) -> None:
    config_file.write_text(
        'max_prompt_length = 100\nmax_prompt_tokens = 50\nencoding = "o200k_base"\n',
        encoding="utf-8",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_config_file() == {
            "max_prompt_length": 100,
            "max_prompt_tokens": 50,
            "encoding": "o200k_base",
        }


def test_an_unknown_key_can_be_made_an_error(config_file: Path) -> None:
    config_file.write_text("max_prompt_tokenz = 5\n", encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        with pytest.raises(ConfigWarning, match="max_prompt_tokenz"):
            PromptGate()

"""Loading the encodings fast without losing exactness: the one-pass parse of the ``.tiktoken``
data, and counters whose vocabulary is cut to the texts they were made for.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkeep import Message
from ctxkeep.tokens import (
    ENCODINGS,
    LONGEST_TOKEN,
    SHORT_INPUT,
    CalibratedCounter,
    HeuristicCounter,
    TiktokenCounter,
    _data_file,
    _mergeable_ranks,
    _token_lines,
    counter_for,
    get_counter,
)

# Texts that reach the corners of the two patterns and of byte-pair merging: long runs (the
# longest tokens are runs of spaces and punctuation), contractions, digits, scripts that are
# one token per character or several per character, emoji, a lone surrogate.
CORNERS = [
    "",
    " " * 300,
    "-" * 200 + "=" * 150,
    "\n\n\n   \t\t  \r\n",
    "I'm sure they'd've SAID it's 12345678901234 o'clock; don't.",
    "漢字とカタカナ、한국어 그리고 中文。",
    "naïve café – “quoted” — ½ ∑ ∞",
    "emoji 👩‍👩‍👧‍👦🏳️‍🌈 and 🇫🇷",
    "lone \ud800 surrogate",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
]


def line_by_line(name: str) -> dict[bytes, int]:
    """The parse before it was made fast: each line's base64 token and integer rank."""
    ranks: dict[bytes, int] = {}
    for line in gzip.decompress(_data_file(name).read_bytes()).splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@pytest.mark.parametrize("name", ENCODINGS)
def test_the_one_pass_parse_reads_the_ranks_each_line_gives(name: str) -> None:
    fast = _mergeable_ranks(name)
    assert list(fast.items()) == list(line_by_line(name).items())


@pytest.mark.parametrize("name", ENCODINGS)
def test_the_data_spells_every_token_in_standard_base64(name: str) -> None:
    lines = _token_lines(name)
    assert [binascii.b2a_base64(t, newline=False) for t in _mergeable_ranks(name)] == lines


@pytest.mark.parametrize("name", ENCODINGS)
def test_every_byte_is_a_token_and_none_is_longer_than_the_longest(name: str) -> None:
    ranks = _mergeable_ranks(name)
    assert all(bytes([b]) in ranks for b in range(256))
    assert max(map(len, ranks)) == LONGEST_TOKEN


@pytest.mark.parametrize("name", ENCODINGS)
@pytest.mark.parametrize("text", CORNERS)
def test_a_cut_vocabulary_encodes_its_texts_as_the_full_one(name: str, text: str) -> None:
    cut, full = TiktokenCounter(name, texts=[text]), get_counter(name)
    assert isinstance(full, TiktokenCounter)
    assert cut.encode(text) == full.encode(text)
    assert cut.count_text(text) == full.count_text(text)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=4))
def test_a_cut_vocabulary_encodes_any_texts_as_the_full_one(texts: list[str]) -> None:
    for name in ENCODINGS:
        cut, full = TiktokenCounter(name, texts=texts), TiktokenCounter(name)
        assert [cut.encode(t) for t in texts] == [full.encode(t) for t in texts]


def test_a_text_outside_the_cut_is_counted_with_the_full_encoding() -> None:
    counter = TiktokenCounter("o200k_base", texts=["hello"])
    other = "a text the cut vocabulary never saw: Ωmega 12345"
    assert counter.count_text(other) == get_counter("o200k_base").count_text(other)


def test_a_non_string_is_refused_by_a_cut_counter_too() -> None:
    from ctxkeep.errors import InvalidTypeError

    counter = TiktokenCounter("o200k_base", texts=["hello"])
    with pytest.raises(InvalidTypeError):
        counter.count_text(["hello"])  # type: ignore[arg-type]


def test_a_counter_for_messages_counts_them_as_get_counter_does() -> None:
    msgs = [
        Message("system", "Be brief."),
        Message("user", "Count 漢字 and emoji 👩‍👩‍👧 please", name="ana"),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "result " * 40},
    ]  # fmt: skip
    for name in ("o200k_base", "cl100k_base", "gpt-4o", "gpt-4"):
        counter = counter_for(name, msgs)
        assert isinstance(counter, TiktokenCounter) and counter._full is None
        assert counter.count_messages(msgs) == get_counter(name).count_messages(msgs)
        assert counter._full is None  # the full encoding was never needed


def test_a_long_input_or_an_estimate_gets_get_counters_counter() -> None:
    long = "word " * SHORT_INPUT
    assert counter_for("o200k_base", long) is get_counter("o200k_base")
    assert isinstance(counter_for("heuristic", "hi"), HeuristicCounter)
    assert isinstance(counter_for("claude-sonnet-4-5", "hi"), CalibratedCounter)


# -- the first count of a new process -----------------------------------------------------------


def test_ctxkeep_count_of_a_short_file_never_loads_the_full_encoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxkeep import tokens
    from ctxkeep.cli import main

    def refuse(counter: TiktokenCounter) -> None:
        raise AssertionError(f"the full {counter.name} was used")

    # Any use of a full encoding fails, a shared counter's loaded earlier in this process too.
    monkeypatch.setattr(tokens.TiktokenCounter, "encoding", property(refuse))
    path = tmp_path / "short.txt"
    text = "Count the tokens of this short file, please: 漢字 and 👍.\n"
    path.write_text(text, encoding="utf-8")
    assert main(["count", str(path), "-e", "o200k_base", "-e", "cl100k_base", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)["total_tokens"]
    monkeypatch.undo()
    assert counted == {e: get_counter(e).count_text(text) for e in ("o200k_base", "cl100k_base")}


def test_ctxkeep_count_imports_no_other_commands_module(tmp_path: Path) -> None:
    path = tmp_path / "short.txt"
    path.write_text("hello\n")
    script = (
        "import sys; from ctxkeep.cli import main; main(['count', sys.argv[1], '--json']); "
        "print(sorted(m for m in sys.modules if m.startswith('ctxkeep.cli.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out.splitlines()[-1].replace("'", '"'))
    assert loaded == ["ctxkeep.cli._io", "ctxkeep.cli.count"]

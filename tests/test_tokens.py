"""Token counting: exact against tiktoken's own encoder, documented overhead, images, caching."""

from __future__ import annotations

import base64
import math
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ctxkeep import (
    CalibratedCounter,
    CtxkeepError,
    HeuristicCounter,
    Message,
    TiktokenCounter,
    TokenCounter,
    ToolCall,
    UnknownEncodingError,
    get_counter,
)
from ctxkeep.tokens import encoding_for_model, image_tokens

ENCODINGS = ("o200k_base", "cl100k_base")


def reference_count(encoding: Any, text: str) -> int:
    """Tokens of ``text`` by tiktoken's own encoder, special-token strings as plain text."""
    return len(encoding.encode(text, disallowed_special=()))


def reference_message_count(encoding: Any, m: dict[str, Any]) -> int:
    """The documented accounting for one OpenAI message dict, with tiktoken's encoder.

    3 per message + role + content + name (+1); each tool call: id + name + arguments + 3;
    a tool result: its tool_call_id.
    """
    n = 3 + reference_count(encoding, m["role"])
    content = m.get("content")
    if isinstance(content, str):
        n += reference_count(encoding, content)
    elif isinstance(content, list):
        n += sum(reference_count(encoding, p["text"]) for p in content if p["type"] == "text")
    if m.get("name"):
        n += reference_count(encoding, m["name"]) + 1
    for tc in m.get("tool_calls") or []:
        fn = tc["function"]
        n += 3 + sum(reference_count(encoding, s) for s in (tc["id"], fn["name"], fn["arguments"]))
    if m.get("tool_call_id"):
        n += reference_count(encoding, m["tool_call_id"])
    return n


def message_strings(m: dict[str, Any]) -> list[str]:
    """Every string of a message that is counted as text."""
    out = [m["role"]]
    content = m.get("content")
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        out.extend(p["text"] for p in content if p.get("type") == "text")
    out.extend(s for s in (m.get("name"), m.get("tool_call_id")) if s)
    for tc in m.get("tool_calls") or []:
        out += [tc["id"], tc["function"]["name"], tc["function"]["arguments"]]
    return out


# -- exact against tiktoken ---------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_text_counts_equal_tiktoken_on_every_trajectory_string(
    trajectory: Path,
    trajectory_messages: list[dict[str, Any]],
    encoding: str,
    tiktoken_encodings: dict[str, Any],
) -> None:
    counter = TiktokenCounter(encoding)
    reference = tiktoken_encodings[encoding]
    mismatches = [
        (i, s[:60])
        for i, m in enumerate(trajectory_messages)
        for s in message_strings(m)
        if counter.count_text(s) != reference_count(reference, s)
    ]
    assert mismatches == []


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_message_counts_follow_the_documented_overhead_on_every_trajectory(
    trajectory: Path,
    trajectory_messages: list[dict[str, Any]],
    encoding: str,
    tiktoken_encodings: dict[str, Any],
) -> None:
    counter = TiktokenCounter(encoding)
    reference = tiktoken_encodings[encoding]
    expected = [reference_message_count(reference, m) for m in trajectory_messages]
    assert [counter.count_message(m) for m in trajectory_messages] == expected
    assert counter.count_messages(trajectory_messages) == sum(expected) + 3


ADVERSARIAL = {
    "endoftext": "<|endoftext|>",
    "endofprompt": "<|endofprompt|>",
    "fim_prefix": "<|fim_prefix|>",
    "fim_all": "<|fim_prefix|>a<|fim_middle|>b<|fim_suffix|>c<|endoftext|>",
    "special_in_prose": "the model stops at <|endoftext|> and the prompt ends at <|endofprompt|>.",
    "broken_special": "<|endoftext|<|endoftext|>|><|",
    "cjk": "日本語のテキストと中文文本和한국어 텍스트。全角！？",
    "emoji": "👍🏽 🇺🇳 1️⃣ 🧑🏿‍🚀 😀😃😄",
    "emoji_zwj_family": "👨‍👩‍👧‍👦" * 20,
    "combining_marks": "e\u0301" * 200 + "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
    "spaces": " " * 1000,
    "whitespace_mix": "\t\n\r\n  \u00a0\u2003\u3000" * 50,
    "newlines": "\n" * 500,
    "empty": "",
    "rtl_and_indic": "مرحبا بالعالم — नमस्ते दुनिया — שלום עולם",
    "digits": "1234567890" * 100,
    "contractions": "I'LL they'Re We'VE it's DON'T",
    "code": 'def f(x):\n\treturn {"a": [1, 2, 3]}  # ünïcödé\r\n',
}


def one_megabyte_of_mixed_text() -> str:
    chunk = "".join(ADVERSARIAL.values())
    repeats = (1 << 20) // len(chunk.encode("utf-8")) + 1
    text = chunk * repeats
    assert len(text.encode("utf-8")) >= 1 << 20
    return text


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_text_counts_equal_tiktoken(
    text: str, encoding: str, tiktoken_encodings: dict[str, Any]
) -> None:
    assert TiktokenCounter(encoding).count_text(text) == reference_count(
        tiktoken_encodings[encoding], text
    )


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_one_megabyte_string_counts_equal_tiktoken(
    encoding: str, tiktoken_encodings: dict[str, Any]
) -> None:
    text = one_megabyte_of_mixed_text()
    assert TiktokenCounter(encoding).count_text(text) == reference_count(
        tiktoken_encodings[encoding], text
    )


def test_encode_and_decode_round_trip_special_token_strings() -> None:
    counter = TiktokenCounter("o200k_base")
    text = ADVERSARIAL["fim_all"]
    assert counter.decode(counter.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_hypothesis_text_counts_equal_tiktoken(
    text: str, tiktoken_encodings: dict[str, Any]
) -> None:
    for encoding in ENCODINGS:
        assert get_counter(encoding).count_text(text) == reference_count(
            tiktoken_encodings[encoding], text
        )


FRAGMENTS = ["<|endoftext|>", "<|", "|>", "endoftext", " ", "\n", "a", "日", "👨‍👩", "\u0301", "'s"]


@settings(max_examples=200, deadline=None)
@given(text=st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join))
def test_hypothesis_special_token_fragments_count_equal_tiktoken(
    text: str, tiktoken_encodings: dict[str, Any]
) -> None:
    for encoding in ENCODINGS:
        assert get_counter(encoding).count_text(text) == reference_count(
            tiktoken_encodings[encoding], text
        )


# -- per-message overhead -------------------------------------------------------------------


@pytest.fixture
def o200k() -> TiktokenCounter:
    return TiktokenCounter("o200k_base")


def test_a_message_costs_three_plus_role_and_content(o200k: TiktokenCounter) -> None:
    m = Message("user", "What is the weather in Paris?")
    assert o200k.count_message(m) == 3 + o200k.count_text("user") + o200k.count_text(m.text)


def test_a_name_costs_its_tokens_plus_one(o200k: TiktokenCounter) -> None:
    plain = Message("user", "hello")
    named = Message("user", "hello", name="alice_smith")
    assert o200k.count_message(named) == (
        o200k.count_message(plain) + o200k.count_text("alice_smith") + 1
    )


def test_a_prompt_is_primed_with_three_tokens_for_the_reply(o200k: TiktokenCounter) -> None:
    msgs = [Message("system", "Be brief."), Message("user", "Hi")]
    assert o200k.count_messages(msgs) == sum(o200k.count_message(m) for m in msgs) + 3
    assert o200k.count_messages([]) == 3


def test_a_tool_call_costs_id_name_arguments_plus_three(o200k: TiktokenCounter) -> None:
    call = ToolCall(id="call_abc123", name="get_weather", arguments='{"city": "Paris"}')
    bare = Message("assistant", "Checking.")
    with_call = Message("assistant", "Checking.", tool_calls=[call])
    expected_call = 3 + sum(o200k.count_text(s) for s in (call.id, call.name, call.arguments))
    assert o200k.count_message(with_call) == o200k.count_message(bare) + expected_call


def test_a_tool_result_costs_its_tool_call_id(o200k: TiktokenCounter) -> None:
    m = Message("tool", "22 degrees", tool_call_id="call_abc123")
    assert o200k.count_message(m) == 3 + sum(
        o200k.count_text(s) for s in ("tool", "22 degrees", "call_abc123")
    )


def test_dicts_and_messages_count_the_same(o200k: TiktokenCounter) -> None:
    d = {"role": "user", "content": "hi there", "name": "bob"}
    assert o200k.count_message(d) == o200k.count_message(Message.from_openai(d))


# -- images -----------------------------------------------------------------------------------


def png_data_url(width: int, height: int, payload: int = 0) -> str:
    """A data URL of a PNG whose header says width x height, padded with payload bytes."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr
    chunk += struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    data = b"\x89PNG\r\n\x1a\n" + chunk + b"\x00" * payload
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def image_message(url: str, detail: str | None = None) -> Message:
    image: dict[str, Any] = {"url": url}
    if detail:
        image["detail"] = detail
    return Message(
        "user",
        [
            {"type": "text", "text": "What is in this image?"},
            {"type": "image_url", "image_url": image},
        ],
    )


def text_part_cost(counter: TiktokenCounter) -> int:
    return 3 + counter.count_text("user") + counter.count_text("What is in this image?")


def test_a_low_detail_image_costs_85(o200k: TiktokenCounter) -> None:
    m = image_message("https://example.com/cat.png", detail="low")
    assert o200k.count_message(m) == text_part_cost(o200k) + 85


def test_a_1024_square_high_detail_image_costs_765(o200k: TiktokenCounter) -> None:
    m = image_message(png_data_url(1024, 1024), detail="high")
    assert o200k.count_message(m) == text_part_cost(o200k) + 765


def test_a_data_url_image_is_counted_by_its_header_size_not_its_base64_length(
    o200k: TiktokenCounter,
) -> None:
    # 2048x4096 fits 2048x2048 as 1024x2048, its short side scales to 768: 768x1536,
    # which is 2 x 3 tiles of 512: 85 + 170 * 6.
    expected = 85 + 170 * math.ceil(768 / 512) * math.ceil(1536 / 512)
    small = image_message(png_data_url(2048, 4096), detail="high")
    large = image_message(png_data_url(2048, 4096, payload=1 << 20), detail="high")
    assert o200k.count_message(small) == text_part_cost(o200k) + expected
    assert o200k.count_message(large) == o200k.count_message(small)


def test_an_image_of_unknown_size_counts_as_the_most_an_image_can_cost() -> None:
    worst = max(image_tokens(w, h, "high") for w in range(64, 4097, 64) for h in (768, 2048, 4096))
    assert image_tokens(None, None, "high") == worst


# -- counters and names -------------------------------------------------------------------------


def test_tiktoken_counters_are_exact() -> None:
    assert get_counter("o200k_base").exact is True
    assert get_counter("cl100k_base").exact is True


def test_the_heuristic_counter_is_labelled_inexact() -> None:
    counter = get_counter("heuristic")
    assert isinstance(counter, HeuristicCounter)
    assert counter.exact is False
    assert counter.count_text("abcdefgh") == 2
    assert counter.count_text("abcdefghi") == 3


def test_every_counter_satisfies_the_token_counter_protocol() -> None:
    for name in ("o200k_base", "cl100k_base", "heuristic", "claude-sonnet-4"):
        assert isinstance(get_counter(name), TokenCounter)


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o1", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("openai/gpt-5-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
    ],
)
def test_model_names_map_to_their_encoding(model: str, encoding: str) -> None:
    assert encoding_for_model(model) == encoding
    assert get_counter(model).name == encoding


@pytest.mark.parametrize("name", ["llama-3-70b", "p50k_base", "gpt", ""])
def test_an_unknown_model_or_encoding_raises_unknown_encoding_error(name: str) -> None:
    with pytest.raises(UnknownEncodingError, match="unknown") as info:
        encoding_for_model(name)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, CtxkeepError)


def test_get_counter_rejects_an_unknown_name() -> None:
    with pytest.raises(UnknownEncodingError, match="llama-3"):
        get_counter("llama-3")


def test_get_counter_defaults_to_o200k_base() -> None:
    assert get_counter().name == "o200k_base"


def test_get_counter_reads_ctxkeep_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTXKEEP_ENCODING", "cl100k_base")
    assert get_counter().name == "cl100k_base"


def test_o200k_and_cl100k_count_differently_and_cache_separately() -> None:
    m = Message("user", "日本語のテキストと中文文本")
    o200k, cl100k = TiktokenCounter("o200k_base"), TiktokenCounter("cl100k_base")
    first, second = o200k.count_message(m), cl100k.count_message(m)
    assert first != second
    assert (o200k.count_message(m), cl100k.count_message(m)) == (first, second)


# -- the calibrated counter ---------------------------------------------------------------------


def test_claude_models_get_a_calibrated_inexact_counter() -> None:
    counter = get_counter("claude-sonnet-4-5")
    assert isinstance(counter, CalibratedCounter)
    assert counter.exact is False


def test_the_calibrated_counter_starts_from_o200k_times_its_documented_ratio() -> None:
    counter = CalibratedCounter()
    text = "The quick brown fox jumps over the lazy dog. " * 20
    assert counter.ratio == 1.15
    assert counter.count_text(text) == math.ceil(
        TiktokenCounter("o200k_base").count_text(text) * 1.15
    )


def test_the_calibrated_counter_learns_the_reported_usage() -> None:
    counter = CalibratedCounter("claude-test")
    msgs = [Message("system", "You are terse. " * 50), Message("user", "Summarise this. " * 200)]
    reported = 2 * counter.count_messages(msgs)
    counter.observe(msgs, reported)
    assert counter.observations == 1
    assert counter.count_messages(msgs) == pytest.approx(reported, rel=0.02)


def test_the_calibrated_counter_smooths_later_observations() -> None:
    counter = CalibratedCounter("claude-test", smoothing=0.5)
    msgs = [Message("user", "word " * 500)]
    first = counter.observe(msgs, 600)
    second = counter.observe(msgs, 900)
    assert first < second < 900 / 600 * first
    assert counter.observations == 2


def test_the_calibrated_counter_ignores_empty_observations() -> None:
    counter = CalibratedCounter()
    assert counter.observe([], 100) == 1.15
    assert counter.observe([Message("user", "hi")], 0) == 1.15
    assert counter.observations == 0


# -- caching ------------------------------------------------------------------------------------


class SpyCounter(TiktokenCounter):
    """A real o200k counter that records every text it encodes."""

    def __init__(self) -> None:
        super().__init__("o200k_base")
        self.encoded: list[str] = []

    def count_text(self, text: str) -> int:
        self.encoded.append(text)
        return super().count_text(text)


def test_counting_a_history_grown_by_one_message_encodes_only_the_new_message() -> None:
    history = [Message("system", "You are a coding agent.")]
    for i in range(50):
        history.append(Message("user", f"question {i}"))
        history.append(Message("assistant", f"answer {i}"))
    spy = SpyCounter()
    before = spy.count_messages(history)
    newest = Message("user", "the newest question")
    history.append(newest)
    spy.encoded.clear()

    after = spy.count_messages(history)

    assert sorted(spy.encoded) == sorted(["user", "the newest question"])
    assert after == before + TiktokenCounter("o200k_base").count_message(
        Message("user", "the newest question")
    )


def test_a_copied_message_keeps_its_cached_count() -> None:
    spy = SpyCounter()
    m = Message("user", "count me once")
    spy.count_message(m)
    spy.encoded.clear()
    assert spy.count_message(m.copy()) == spy.count_message(m)
    assert spy.encoded == []


def test_concurrent_first_calls_build_an_encoding_once() -> None:
    # A fresh interpreter: nothing is warm. 8 threads ask for the same counter at once.
    code = """
import threading, tiktoken
from ctxkeep import tokens
built = []
real = tiktoken.Encoding.__init__
def counting(self, *a, **k):
    built.append(1)
    real(self, *a, **k)
tiktoken.Encoding.__init__ = counting
barrier = threading.Barrier(8)
def ask():
    barrier.wait()
    tokens.get_counter("cl100k_base").count_text("hello")
threads = [threading.Thread(target=ask) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(len(built))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"

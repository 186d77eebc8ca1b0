"""Estimated counts: the margin a gate keeps for them, and a calibration that believes only
plausible reports (and says which it ignored).
"""

from __future__ import annotations

import logging
import math

import pytest

from ctxkeep import CalibratedCounter, HeuristicCounter, Message, PromptGate, PromptTooLongError
from ctxkeep.tokens import (
    MARGIN_FLOOR,
    PLAUSIBLE_RATIOS,
    SETTLED,
    UNCALIBRATED_ERROR,
    TiktokenCounter,
    estimate_margin,
    get_counter,
)

O200K = TiktokenCounter("o200k_base")


def prompt(words: int, word: str = "word") -> list[Message]:
    """A one-message prompt of about ``words`` o200k tokens."""
    return [Message("user", f"{word} " * words)]


def truth(msgs: list[Message], ratio: float = 1.1) -> int:
    """What a server whose tokenizer gives ``ratio`` times o200k_base reports."""
    return round(sum(O200K.count_message(m) for m in msgs) * ratio)


# -- the margin -------------------------------------------------------------------------------


def test_an_exact_counter_keeps_no_margin() -> None:
    assert estimate_margin(get_counter("o200k_base"), 15_000) == 0
    assert estimate_margin(get_counter("cl100k_base"), 15_000) == 0


def test_a_counter_that_does_not_say_is_taken_as_exact() -> None:
    class Plain:
        name = "plain"

    assert estimate_margin(Plain(), 15_000) == 0  # type: ignore[arg-type]


def test_an_estimate_keeps_at_least_the_floor() -> None:
    assert MARGIN_FLOOR == 0.05
    assert estimate_margin(HeuristicCounter(), 15_000) == 750
    assert estimate_margin(HeuristicCounter(), 101) == math.ceil(101 * 0.05)


def test_an_uncalibrated_estimate_keeps_a_wider_margin() -> None:
    counter = CalibratedCounter()
    assert not counter.calibrated
    assert counter.max_relative_error == UNCALIBRATED_ERROR == 0.15
    assert estimate_margin(counter, 15_000) == 2_400


def calibrated(ratio: float = 1.1) -> CalibratedCounter:
    """A counter calibrated on one plausible report of a 2,000-token prompt."""
    counter = CalibratedCounter("local")
    msgs = prompt(2_000)
    counter.observe(msgs, truth(msgs, ratio))
    assert counter.calibrated
    return counter


def test_a_calibrated_estimate_keeps_the_floor_until_it_sees_an_error() -> None:
    counter = calibrated()
    assert counter.max_relative_error == 0.0
    assert estimate_margin(counter, 15_000) == 750


def test_the_margin_is_the_largest_error_seen_and_a_cushion() -> None:
    counter = calibrated()
    counter.observed_error = 0.2
    assert estimate_margin(counter, 10_000) == 2_100


def test_the_margin_is_never_more_than_the_limit() -> None:
    counter = calibrated()
    counter.observed_error = 5.0
    assert estimate_margin(counter, 1_000) == 1_000
    assert estimate_margin(counter, 0) == 0


# -- calibration ------------------------------------------------------------------------------


def test_a_plausible_report_sets_the_ratio() -> None:
    counter = CalibratedCounter("local")
    msgs = prompt(2_000)
    counter.observe(msgs, truth(msgs, 1.3))
    assert counter.ratio == pytest.approx(1.3, rel=0.01)
    assert counter.observations == 1
    assert counter.ignored == 0


def test_a_server_reporting_ten_tokens_for_every_request_does_not_drive_the_ratio_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = CalibratedCounter("local")
    with caplog.at_level(logging.WARNING, logger="ctxkeep.tokens"):
        for words in (200, 1_000, 5_000):
            counter.observe(prompt(words), 10)
    assert counter.ratio == 1.15
    assert (counter.observations, counter.ignored) == (0, 3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3
    assert all("ignored a report of 10 prompt tokens" in r.getMessage() for r in warnings)
    assert "no tokenizer's" in warnings[0].getMessage()


def test_a_server_reporting_ten_times_the_truth_does_not_drive_the_ratio_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = CalibratedCounter("local")
    with caplog.at_level(logging.WARNING, logger="ctxkeep.tokens"):
        for words in (200, 1_000, 5_000):
            msgs = prompt(words)
            counter.observe(msgs, 10 * truth(msgs))
    assert counter.ratio <= PLAUSIBLE_RATIOS[1]
    assert counter.ratio == 1.15
    assert len([r for r in caplog.records if "ignored a report" in r.getMessage()]) == 3


def test_an_outlier_after_calibration_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = CalibratedCounter("local")
    for words in range(1_000, 1_000 + SETTLED * 100, 100):
        msgs = prompt(words)
        counter.observe(msgs, truth(msgs, 1.1))
    calibrated = counter.ratio
    with caplog.at_level(logging.WARNING, logger="ctxkeep.tokens"):
        msgs = prompt(3_000)
        counter.observe(msgs, truth(msgs, 2.5))  # plausible for a tokenizer, not for this one
    assert counter.ratio == calibrated
    assert counter.ignored == 1
    assert "from the calibrated" in caplog.records[-1].getMessage()


def test_outliers_in_a_row_on_one_side_recalibrate(caplog: pytest.LogCaptureFixture) -> None:
    counter = CalibratedCounter("local")
    for words in range(1_000, 1_000 + SETTLED * 100, 100):
        msgs = prompt(words)
        counter.observe(msgs, truth(msgs, 1.1))
    with caplog.at_level(logging.WARNING, logger="ctxkeep.tokens"):
        for words in range(2_000, 2_000 + SETTLED * 100, 100):
            msgs = prompt(words, "漢字")  # the content changed: the ratio with it
            counter.observe(msgs, truth(msgs, 2.0))
    assert counter.ratio == pytest.approx(2.0, rel=0.01)
    assert "recalibrated" in caplog.records[-1].getMessage()


def test_an_outlier_on_the_other_side_starts_a_new_run() -> None:
    counter = CalibratedCounter("local")
    for words in range(1_000, 1_000 + SETTLED * 100, 100):
        msgs = prompt(words)
        counter.observe(msgs, truth(msgs, 1.1))
    calibrated = counter.ratio
    for ratio in [2.0] * (SETTLED - 1) + [0.6]:
        msgs = prompt(2_000)
        counter.observe(msgs, truth(msgs, ratio))
    assert counter.ratio == calibrated
    assert counter.ignored == SETTLED


def test_the_largest_underestimate_is_remembered() -> None:
    counter = calibrated(1.0)
    estimate = counter.count_messages(prompt(3_000))
    counter.observe(prompt(3_000), round(estimate * 1.08))
    assert counter.max_relative_error == pytest.approx(0.08, abs=0.001)
    estimate = counter.count_messages(prompt(3_000))
    counter.observe(prompt(3_000), round(estimate * 0.9))  # an overestimate: safe...
    assert counter.observed_error == pytest.approx(0.08, abs=0.001)
    # ...but it lowered the ratio, and a prompt like the first one would now be under by more:
    # the margin covers the highest ratio seen against the ratio counted with now.
    highest = max(counter._highest, 1.0)
    assert counter.max_relative_error == pytest.approx(
        max(0.08, highest / counter.counting_ratio - 1), abs=0.001
    )
    assert counter.max_relative_error > 0.08
    margin = estimate_margin(counter, 10_000)
    assert margin == pytest.approx(10_000 * (counter.max_relative_error + 0.01), abs=5)


def test_the_margin_covers_the_highest_ratio_seen_after_the_ratio_fell() -> None:
    counter = calibrated(1.0)
    heavy, light = prompt(3_000, "日本語"), prompt(3_000)
    counter.observe(heavy, truth(heavy, 1.35))  # a CJK-heavy prompt
    for _ in range(6):
        counter.observe(light, truth(light, 1.0))  # then prose: the ratio falls back
    assert counter.ratio < 1.2
    # The next CJK-heavy prompt, counted at today's ratio, fits the margin's room.
    estimate = counter.count_messages(heavy)
    assert truth(heavy, 1.35) <= estimate * (1 + counter.max_relative_error) + 1


def test_a_small_first_report_may_raise_the_estimate_but_not_lower_it() -> None:
    counter = CalibratedCounter("local")
    small = prompt(60)
    counter.observe(small, truth(small, 0.9))  # a greeting: its ratio is the template's
    assert counter.ratio == 1.15 and not counter.calibrated
    counter.observe(small, truth(small, 1.6))
    assert counter.ratio > 1.15


def test_errors_before_the_calibration_is_trusted_and_on_small_prompts_are_not_counted() -> None:
    counter = CalibratedCounter("local", ratio=1.0)
    msgs = prompt(2_000)
    counter.observe(msgs, truth(msgs, 1.4))  # the starting ratio's error, not the calibration's
    assert counter.observed_error == 0.0
    small = prompt(20)
    counter.observe(small, counter.count_messages(small) + 20)  # a chat template's tokens
    assert counter.observed_error == 0.0


# -- the gate keeps the margin ----------------------------------------------------------------


def test_a_gate_on_an_estimate_refuses_a_prompt_inside_the_limit_but_not_the_margin() -> None:
    counter = HeuristicCounter()
    msgs = [Message("user", "x" * 3_800)]  # 950 + 3 + 1 + 3 = 957 tokens
    assert counter.count_messages(msgs) == 957
    gate = PromptGate(100_000, 1_000, counter=counter)
    assert gate.margin == 50
    with pytest.raises(PromptTooLongError) as info:
        gate.check(msgs)
    assert info.value.breakdown["estimate_margin"] == 50
    assert (info.value.limit, info.value.actual, info.value.excess) == (1_000, 1_007, 7)
    assert "estimate_margin=50" in str(info.value)
    at_the_margin = PromptGate(100_000, 1_008, counter=counter)  # 1,008 - 51 = 957
    assert at_the_margin.check(msgs)


def test_a_gate_on_an_exact_counter_keeps_no_margin() -> None:
    counter = get_counter("o200k_base")
    msgs = prompt(500)
    limit = counter.count_messages(msgs)
    gate = PromptGate(100_000, limit, counter=counter)
    assert gate.margin == 0
    assert gate.check(msgs)


def test_the_gate_margin_follows_the_calibration() -> None:
    counter = CalibratedCounter("local", ratio=1.0)
    gate = PromptGate(100_000, 10_000, counter=counter)
    assert gate.margin == 1_600  # a guess: uncalibrated
    msgs = prompt(2_000)
    counter.observe(msgs, truth(msgs, 1.0))
    assert gate.margin == 500
    counter.observe(prompt(3_000), round(counter.count_messages(prompt(3_000)) * 1.1))
    assert gate.margin == pytest.approx(1_100, abs=5)


def test_a_text_prompt_keeps_the_margin_too() -> None:
    gate = PromptGate(100_000, 1_000, counter=HeuristicCounter())
    with pytest.raises(PromptTooLongError) as info:
        gate.check("x" * 3_900)  # 975 tokens
    assert info.value.breakdown == {"text": 975, "estimate_margin": 50}


def test_the_margin_of_a_reserved_part_is_kept_on_the_limit_less_it() -> None:
    gate = PromptGate(100_000, 1_000, counter=HeuristicCounter())
    gate.check_tokens({"user": 902, "tools": 50}, reserved=50)  # 902 + 50 + ceil(950 * 5%)
    with pytest.raises(PromptTooLongError) as info:
        gate.check_tokens({"user": 902, "tools": 50})  # 902 + 50 + ceil(1,000 * 5%)
    assert info.value.breakdown["estimate_margin"] == 50


# -- counts that hold between reports ----------------------------------------------------------


def test_counts_move_in_grid_steps_above_the_learnt_ratio() -> None:
    counter = CalibratedCounter("local", ratio=1.0)
    msg = Message("user", "alpha beta " * 200)
    start = counter.count_message(msg)
    counter.ratio = 1.01  # up a step of the grid: counts at 1.02
    assert counter.counting_ratio == pytest.approx(1.02)
    first, version = counter.count_message(msg), counter.version
    assert first > start
    counter.ratio = 1.015  # inside the grid step: the same counts, the same version
    assert (counter.count_message(msg), counter.version) == (first, version)
    counter.ratio = 1.3  # a new step: new counts, announced
    assert counter.version != version
    assert counter.count_message(msg) > first
    assert counter.counting_ratio < 1.3 * 1.0201


def test_a_cache_stable_prune_never_overruns_while_the_ratio_rises() -> None:
    from ctxkeep import TokenPruner, ToolCall

    counter = CalibratedCounter("claude-x")
    pruner = TokenPruner(3000, 4, counter=counter)
    history = [Message("system", "sys"), Message("user", "task")]
    for i in range(40):
        call = ToolCall(id=f"c{i}", name="read", arguments="{}")
        history += [
            Message("assistant", None, tool_calls=[call]),
            Message("tool", f"out {i} " * 30, tool_call_id=call.id),
        ]
        out = pruner.prune(history)  # raised AssertionError (3,094 > 3,000) at step 21
        assert counter.count_messages(out) <= 3000
        base = sum(O200K.count_message(m) for m in out)
        counter.observe(out, int(base * (1.10 + 0.01 * i)))  # the truth rises 1% a report

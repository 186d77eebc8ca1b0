"""The task stays: the conversation's head (``keep_first``) is in every prompt, in place, in
both modes; compressed with its artifact ref when it alone does not fit, dropped before the
newest user message is touched when even that does not fit; reported as its own section.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep import (
    BudgetExceededError,
    ConfigError,
    Message,
    TokenPruner,
    ToolCall,
    get_counter,
    validate_sequence,
)
from ctxkeep.foldstate import FoldState
from ctxkeep.messages import missing_content
from ctxkeep.prune.snapshots import fold_params
from test_prune import histories

COUNTER = get_counter("o200k_base")
TASK = "Fix the off-by-one in parser.py: the last token of a line is dropped."


def _run(steps: int, size: int = 40, task: str = TASK) -> list[Message]:
    """An agent run that sends observations as user messages, as mini-swe does."""
    msgs = [Message("system", "You are a coding agent."), Message("user", task)]
    for i in range(steps):
        tc = ToolCall(id=f"call_{i}", name="bash", arguments=json.dumps({"command": f"ls {i}"}))
        msgs.append(Message("assistant", f"step {i}", tool_calls=[tc]))
        msgs.append(Message("tool", f"line {i} of output\n" * size, tool_call_id=tc.id))
        msgs.append(Message("user", f"observation {i}: see above"))
    return msgs


def _pruner(budget: int, last_n: int = 4, *, stable: bool, **kw: object) -> TokenPruner:
    return TokenPruner(budget, last_n, COUNTER, cache_stable=stable, **kw)  # type: ignore[arg-type]


def _holds(out: list[Message], task: Message, pruner: TokenPruner) -> bool:
    """The task is in the prompt as it is, or as its excerpt whose ref holds it whole."""
    for m in out:
        if m == task:
            return True
        ref = m.artifact_refs[-1] if m.role == "user" and m.artifact_refs else None
        if ref is not None and pruner.artifacts.get(ref) == task.text:
            return True
    return False


def _first_user(history: list[Message]) -> Message | None:
    return next((m for m in history if m.role == "user" and not missing_content(m)), None)


@pytest.mark.parametrize("stable", [False, True])
def test_the_task_is_in_every_prompt_of_a_long_run(stable: bool) -> None:
    history = _run(80)
    pruner = _pruner(1500, stable=stable)
    for k in range(3, len(history) + 1):
        out, report = pruner.prune_with_report(history[:k])
        assert out[1] == history[1]  # in place: right after the system prompt
        assert report.sections["task"] == COUNTER.count_message(history[1])
        assert report.decisions[1].reason.startswith("the task (the conversation's first user")
        assert COUNTER.count_messages(out) == report.tokens_after <= 1500


@pytest.mark.parametrize("stable", [False, True])
def test_keep_first_zero_lets_the_task_go(stable: bool) -> None:
    out = _pruner(1500, stable=stable, keep_first=0).prune(_run(80))
    assert Message("user", TASK) not in out


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_a_bad_keep_first_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="keep_first"):
        TokenPruner(keep_first=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("stable", [False, True])
def test_keep_first_n_keeps_the_first_n_units_whole(stable: bool) -> None:
    history = _run(80)
    out = _pruner(2000, stable=stable, keep_first=3).prune(history)
    assert out[1:5] == history[1:5]  # the task, the first call with its result, a user message
    assert history[5] not in out
    validate_sequence(out)


@pytest.mark.parametrize("stable", [False, True])
def test_a_task_too_long_for_the_budget_is_compressed_with_its_ref(stable: bool) -> None:
    long_task = "Reproduce the failure described in this log:\n" + "traceback line\n" * 2000
    history = _run(30, task=long_task)
    pruner = _pruner(1200, stable=stable)
    out, report = pruner.prune_with_report(history)
    task = history[1]
    assert task not in out and _holds(out, task, pruner)
    assert out[1].text.startswith("Reproduce the failure")
    decision = report.decisions[1]
    assert decision.action == "compressed" and decision.reason.startswith("the task")
    assert pruner.artifacts.get(decision.artifact_ref or "") == long_task
    if not stable:  # the cache-stable notes say what the last cut did (the head was already)
        assert any("compressed the task" in n for n in report.notes)
    assert history[-1] in out  # the newest user message is untouched
    assert report.tokens_after <= 1200


def test_a_task_that_does_not_fit_even_compressed_is_dropped_before_the_newest_user_message() -> (
    None
):
    # Budget: the system prompt and the newest user message fit; the task's excerpt does not.
    newest = Message("user", "now run the tests")
    history = [*_run(3, task="t " * 3000), newest]
    base = COUNTER.count_messages([history[0], newest])
    pruner = _pruner(base + 20, 0, stable=False, excerpt_tokens=60)
    out, report = pruner.prune_with_report(history)
    assert out[0] == history[0] and out[-1] == newest
    assert not _holds(out, history[1], pruner)
    assert report.decisions[1].action == "dropped"
    assert any("dropped the task" in n for n in report.notes)
    assert report.sections["task"] == 0


def test_the_head_is_kept_across_cuts_so_the_prefix_stays() -> None:
    history = _run(60)
    pruner = _pruner(1500, stable=True)
    prev: list[Message] | None = None
    cuts = 0
    for k in range(3, len(history) + 1):
        out, report = pruner.prune_with_report(history[:k])
        assert out[:2] == history[:2]  # system and task: a prefix every cut keeps
        if prev is not None and out[: len(prev)] != prev:
            cuts += 1
            assert report.stable_prefix_messages is not None
            assert report.stable_prefix_messages >= 2
        prev = out
    assert cuts >= 3


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=histories(),
    budget=st.integers(60, 3000),
    last_n=st.integers(0, 8),
    keep_first=st.integers(0, 3),
    stable=st.booleans(),
)
def test_every_prompt_holds_the_task_or_says_why_not(
    history: list[Message], budget: int, last_n: int, keep_first: int, stable: bool
) -> None:
    pruner = _pruner(budget, last_n, stable=stable, keep_first=keep_first)
    for k in range(1, len(history) + 1):
        prompt = history[:k]
        try:
            out, report = pruner.prune_with_report(prompt)
        except BudgetExceededError:
            continue
        validate_sequence(out)
        assert COUNTER.count_messages(out) == report.tokens_after <= budget
        assert sum(report.sections.values()) == report.tokens_after
        users = [m for m in prompt if m.role == "user"]
        if users:
            assert users[-1] in out or _holds(out, users[-1], pruner)  # the pinned rule holds
        task = _first_user(prompt)
        if keep_first and task is not None:
            dropped = any("dropped the task" in n for n in report.notes)
            assert _holds(out, task, pruner) or dropped
            if not dropped:
                assert report.sections["task"] > 0


def test_fold_params_and_snapshots_tell_keep_first_apart() -> None:
    assert fold_params(TokenPruner(keep_first=0)) != fold_params(TokenPruner(keep_first=1))
    history = _run(60)
    pruner = _pruner(1500, stable=True, keep_first=2)
    _, _, state = pruner._prune_folded(history, None)
    assert state is not None and state.head and state.first_user == 1
    assert {1, 2, 3} <= set(state.needed)  # the task and the first call with its result
    again = FoldState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state

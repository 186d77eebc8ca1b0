"""The cache-stable fold rolls back: a history edited at its newest messages is pruned as a
replay of it would be, from a checkpoint inside the part it shares with a kept fold.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep import CtxkeepError, Message, TokenPruner, ToolCall, get_counter
from test_prune import histories

COUNTER = get_counter("o200k_base")

_words = st.text(alphabet="abcdefgh xyz\n", min_size=0, max_size=40)
_long = st.builds(lambda s, n: (s or "out ") * n, _words, st.integers(1, 200))


@st.composite
def _pieces(draw: st.DrawFn) -> list[Message]:
    """What an agent loop appends in one step: a message, a whole tool unit, a call still
    waiting for its results, or a lone result (a call's late answer, or an orphan).
    """
    kind = draw(st.sampled_from(["user", "assistant", "unit", "unit", "call", "result", "system"]))
    ident = draw(st.integers(0, 10**6))
    if kind in ("user", "assistant", "system"):
        return [Message(kind, draw(st.one_of(_words, _long)) or "x")]
    if kind == "result":
        return [Message("tool", draw(_long), tool_call_id=f"c{draw(st.integers(0, 40))}")]
    n = draw(st.integers(1, 3))
    calls = [ToolCall(id=f"k{ident}_{j}", name="bash", arguments='{"cmd": "ls"}') for j in range(n)]
    head = Message("assistant", draw(st.one_of(st.none(), _words)), tool_calls=calls)
    if kind == "call":
        return [head]
    return [head] + [Message("tool", draw(_long), tool_call_id=c.id) for c in calls]


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), _pieces()),
        st.tuples(st.just("pop"), st.integers(1, 3)),
        st.tuples(st.just("replace"), _pieces()),
        st.tuples(st.just("trim"), st.integers(1, 3)),
        st.tuples(st.just("same"), st.none()),
    ),
    min_size=1,
    max_size=14,
)


def _apply(history: list[Message], op: str, arg: Any) -> list[Message]:
    if op == "append":
        return history + arg
    if op == "pop":
        return history[: max(0, len(history) - arg)]
    if op == "replace":
        return history[:-1] + arg[:1] if history else list(arg[:1])
    if op == "trim":
        return history[arg:]
    return list(history)


def _outcome(pruner: TokenPruner, history: list[Any]) -> Any:
    """Everything a prune says: the prompt as sent, the report's totals and every decision."""
    try:
        out, report = pruner.prune_with_report(history)
    except CtxkeepError as exc:
        # The same error about the same message (without repair, a result that answers no
        # call is told from the messages the walk has in view: its wording may differ).
        return (type(exc).__name__, getattr(exc, "index", None))
    decisions = [
        (d.index, d.action, d.reason, d.tokens_before, d.tokens_after, d.artifact_ref)
        for d in report.decisions
    ]
    wire = [json.dumps(m.to_openai(), sort_keys=True) for m in out]
    return wire, report.summary(), decisions


def _pruner(budget: int, last_n: int, repair: bool) -> TokenPruner:
    return TokenPruner(budget, last_n, COUNTER, cache_stable=True, repair=repair)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    history=histories(),
    ops=_ops,
    budget=st.integers(60, 2500),
    last_n=st.integers(0, 6),
    repair=st.booleans(),
    dicts=st.booleans(),
)
def test_a_warm_pruner_prunes_every_edit_as_a_replay_would(
    history: list[Message],
    ops: list[tuple[str, Any]],
    budget: int,
    last_n: int,
    repair: bool,
    dicts: bool,
) -> None:
    warm = _pruner(budget, last_n, repair)
    for op, arg in [("same", None), *ops]:
        history = _apply(history, op, arg)
        given_ = [m.to_openai() for m in history] if dicts else history
        expected = _outcome(_pruner(budget, last_n, repair), given_)
        assert _outcome(warm, given_) == expected, op


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(60, 2500), last_n=st.integers(0, 6))
def test_a_dict_edited_in_place_is_pruned_as_it_now_is(
    history: list[Message], budget: int, last_n: int
) -> None:
    warm = _pruner(budget, last_n, True)
    dicts = [m.to_openai() for m in history]
    _outcome(warm, dicts)
    dicts[-1]["content"] = "edited in place " * 30
    assert _outcome(warm, dicts) == _outcome(_pruner(budget, last_n, True), dicts)


def _run(steps: int) -> list[Message]:
    msgs = [Message("system", "You are an agent."), Message("user", "Fix the bug.")]
    for i in range(steps):
        tc = ToolCall(id=f"call_{i}", name="bash", arguments=json.dumps({"command": f"ls {i}"}))
        msgs.append(Message("assistant", f"step {i}", tool_calls=[tc]))
        msgs.append(Message("tool", f"line {i} of output\n" * 40, tool_call_id=tc.id))
    return msgs


def test_a_replaced_answer_rolls_back_instead_of_replaying() -> None:
    pruner = _pruner(3000, 4, True)
    history = _run(200)
    pruner.prune(history)
    folds = pruner.mode.folds
    assert folds is not None
    original = folds._folds[-1]
    retried = [*history[:-1], Message("tool", "a different answer", tool_call_id="call_199")]
    out = pruner.prune(retried)
    assert out == _pruner(3000, 4, True).prune(retried)
    restored = folds._folds[-1]
    assert restored is not original and original in folds._folds  # the old history's stays
    assert len(restored.keys) == len(retried) and len(original.keys) == len(history)
    # Rolled back, not replayed: the window's units are the kept fold's own (a replay walks
    # the history again and makes new ones).
    assert restored.units[0] is original.units[0]
    assert restored.units[:-1] == original.units[:-1]


def test_a_popped_turn_and_a_new_one_roll_back_too() -> None:
    pruner = _pruner(3000, 4, True)
    history = _run(120)
    pruner.prune(history)
    popped = history[:-2]
    assert pruner.prune(popped) == _pruner(3000, 4, True).prune(popped)
    again = [*popped, Message("user", "Try another way.")]
    assert pruner.prune(again) == _pruner(3000, 4, True).prune(again)


def test_a_call_left_unanswered_is_pending_again_once_it_is_the_newest() -> None:
    # Followed by a user message, an unanswered call gets a synthetic result; pop that
    # message and the call is the newest again: a prompt leaves it out, as a replay does.
    pruner = _pruner(3000, 4, True)
    call = Message("assistant", None, tool_calls=[ToolCall("x1", "bash", "{}")])
    history = [*_run(3), call, Message("user", "and now?")]
    pruner.prune(history)
    for edited in (history[:-1], [*history[:-1], Message("system", "be brief")]):
        assert _outcome(pruner, edited) == _outcome(_pruner(3000, 4, True), edited)
        pruner.prune(history)

"""The pruner's promises: a hard budget, whole tool units, lossless compression, reports."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctxkeep import (
    BudgetExceededError,
    Message,
    MissingToolResultError,
    OrphanToolResultError,
    PruneReport,
    SQLiteArtifactStore,
    TokenPruner,
    ToolCall,
    get_counter,
    validate_sequence,
)

COUNTER = get_counter("o200k_base")

# -- histories -----------------------------------------------------------------------------

_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=60
)
_big = st.builds(lambda s, n: (s or "x") * n, _text, st.integers(1, 400))


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Random valid histories: tool blocks (parallel too), system messages in odd places."""
    msgs: list[Message] = []
    if draw(st.booleans()):
        msgs.append(Message("system", draw(_text) or "sys"))
    call = 0
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "tools", "system"]))
        if kind == "user":
            msgs.append(Message("user", draw(st.one_of(_text, _big))))
        elif kind == "assistant":
            msgs.append(Message("assistant", draw(_text)))
        elif kind == "system":
            msgs.append(Message("system", draw(_text)))
        else:
            n = draw(st.integers(1, 3))
            calls = []
            for _ in range(n):
                call += 1
                calls.append(ToolCall(id=f"c{call}", name="bash", arguments='{"cmd": "ls"}'))
            msgs.append(Message("assistant", draw(st.one_of(st.none(), _text)), tool_calls=calls))
            results = [
                Message("tool", draw(st.one_of(_text, _big)), tool_call_id=c.id) for c in calls
            ]
            order = draw(st.permutations(results))
            msgs.extend(order)
    if not any(m.role == "user" for m in msgs):
        msgs.insert(1 if msgs and msgs[0].role == "system" else 0, Message("user", "go"))
    return [m.replace(id=f"m{i}") for i, m in enumerate(msgs)]


def _big_history(steps: int = 30, size: int = 400) -> list[Message]:
    msgs = [Message("system", "You are an agent."), Message("user", "Do the task.")]
    for i in range(steps):
        tc = ToolCall(id=f"call_{i}", name="bash", arguments=json.dumps({"command": f"ls {i}"}))
        msgs.append(Message("assistant", f"step {i}", tool_calls=[tc]))
        msgs.append(Message("tool", f"line {i} of output\n" * size, tool_call_id=tc.id))
    return msgs


def _must_keep(msgs: list[Message]) -> int:
    """Tokens of the system messages plus the newest user message."""
    users = [m for m in msgs if m.role == "user"]
    keep = [m for m in msgs if m.is_system] + users[-1:]
    return COUNTER.count_messages(keep)


# -- properties ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), budget=st.integers(40, 3000), last_n=st.integers(0, 8))
def test_prune_properties_hold_on_random_histories(
    history: list[Message], budget: int, last_n: int
) -> None:
    before = [m.copy() for m in history]
    pruner = TokenPruner(budget, last_n, counter=COUNTER, compress_oversized_user=False)
    try:
        out, report = pruner.prune_with_report(history)
    except BudgetExceededError as exc:
        # Only when the messages that are never dropped cannot fit.
        assert exc.required > budget
        assert _must_keep(history) > budget or exc.required > budget
        return
    # the input is untouched
    assert history == before
    # valid sequence, within budget
    validate_sequence(out)
    assert COUNTER.count_messages(out) <= budget
    assert report.tokens_after == COUNTER.count_messages(out)
    # system and newest user kept (maybe compressed: never here, it is disabled)
    for m in history:
        if m.is_system:
            assert m in out
    newest_user = [m for m in history if m.role == "user"][-1]
    assert newest_user in out
    # order preserved: output originals appear in input order
    positions = [int(m.id[1:]) for m in out if m.id is not None]
    assert positions == sorted(positions)
    assert len(set(positions)) == len(positions)
    # every message accounted for
    decisions = report.decisions
    assert [d.index for d in decisions] == list(range(len(history)))
    kept = sum(1 for d in decisions if d.action in ("kept", "compressed"))
    assert kept == len(out)
    # every compressed output recoverable byte for byte
    for d in decisions:
        if d.action == "compressed":
            assert d.artifact_ref is not None
            assert pruner.artifacts.get(d.artifact_ref) == history[d.index].text


@settings(max_examples=60, deadline=None)
@given(history=histories(), budget=st.integers(40, 2000))
def test_prune_never_orphans_a_tool_result(history: list[Message], budget: int) -> None:
    try:
        out = TokenPruner(budget, 4, counter=COUNTER).prune(history)
    except BudgetExceededError:
        return
    ids_called = {tc.id for m in out for tc in m.tool_calls}
    for m in out:
        if m.role == "tool":
            assert m.tool_call_id in ids_called


# -- behaviours ------------------------------------------------------------------------------


def test_history_that_fits_is_returned_whole() -> None:
    msgs = _big_history(steps=2, size=5)
    out = TokenPruner(100_000, 6, counter=COUNTER).prune(msgs)
    assert out == msgs


def test_output_messages_are_copies() -> None:
    msgs = _big_history(steps=2, size=5)
    out = TokenPruner(100_000, 6, counter=COUNTER).prune(msgs)
    assert all(a is not b for a, b in zip(out, msgs, strict=True))


def test_old_tool_outputs_are_compressed_and_recoverable() -> None:
    msgs = _big_history()
    pruner = TokenPruner(6000, 6, counter=COUNTER)
    out, report = pruner.prune_with_report(msgs)
    compressed = [m for m in out if m.metadata.get("ctxkeep_compressed")]
    assert compressed
    for m in compressed:
        original = next(h for h in msgs if h.tool_call_id == m.tool_call_id)
        assert pruner.artifacts.get(m.artifact_refs[-1]) == original.content
        assert "read_artifact" in m.text
    assert report.count("compressed") == len(compressed)


def test_recent_messages_are_kept_in_full_when_they_fit() -> None:
    msgs = _big_history(size=150)  # ~900 tokens per output: the last 3 units fit
    out = TokenPruner(6000, 6, counter=COUNTER).prune(msgs)
    assert out[-6:] == msgs[-6:]


def test_recent_outputs_are_compressed_before_recent_units_are_dropped() -> None:
    msgs = _big_history(steps=4, size=2000)  # each output ~ 10k tokens
    out, report = TokenPruner(3000, 6, counter=COUNTER).prune_with_report(msgs)
    validate_sequence(out)
    assert COUNTER.count_messages(out) <= 3000
    assert any("compressed recent" in n for n in report.notes)
    assert out[-1].tool_call_id == msgs[-1].tool_call_id  # the newest unit survives


def test_budget_exceeded_names_what_is_in_the_way() -> None:
    msgs = [Message("system", "rules " * 3000), Message("user", "hi")]
    with pytest.raises(BudgetExceededError) as info:
        TokenPruner(500, 6, counter=COUNTER).prune(msgs)
    assert info.value.required > 500
    assert "system messages" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_oversized_newest_user_message_is_compressed_not_dropped() -> None:
    msgs = [Message("system", "be brief"), Message("user", "log line\n" * 5000)]
    pruner = TokenPruner(1000, 6, counter=COUNTER)
    out, report = pruner.prune_with_report(msgs)
    assert [m.role for m in out] == ["system", "user"]
    assert pruner.artifacts.get(out[1].artifact_refs[-1]) == msgs[1].content
    assert any("newest user" in n for n in report.notes)


def test_oversized_newest_user_message_raises_when_compression_is_off() -> None:
    msgs = [Message("system", "be brief"), Message("user", "log line\n" * 5000)]
    with pytest.raises(BudgetExceededError):
        TokenPruner(1000, 6, counter=COUNTER, compress_oversized_user=False).prune(msgs)


def test_parallel_tool_calls_are_kept_or_dropped_together() -> None:
    calls = [ToolCall(id=f"p{i}", name="f", arguments="{}") for i in range(3)]
    msgs = [
        Message("user", "go"),
        Message("assistant", None, tool_calls=calls),
        *[Message("tool", "out " * 300, tool_call_id=f"p{i}") for i in range(3)],
        Message("assistant", "done"),
        Message("user", "next"),
    ]
    for budget in range(60, 1200, 37):
        try:
            out = TokenPruner(budget, 2, counter=COUNTER).prune(msgs)
        except BudgetExceededError:
            continue
        validate_sequence(out)
        n_results = sum(1 for m in out if m.role == "tool")
        assert n_results in (0, 3)


def test_unanswered_call_mid_history_gets_a_synthetic_result() -> None:
    tc = ToolCall(id="lost", name="bash", arguments="{}")
    msgs = [
        Message("user", "go"),
        Message("assistant", "two actions", tool_calls=[tc]),
        Message("user", "format error: exactly one action please"),
        Message("assistant", "ok"),
    ]
    out, report = TokenPruner(5000, 6, counter=COUNTER).prune_with_report(msgs)
    validate_sequence(out)
    synthetic = [m for m in out if m.event_kind == "synthetic_tool_result"]
    assert [m.tool_call_id for m in synthetic] == ["lost"]
    assert any("synthetic" in n for n in report.notes)


def test_damaged_history_raises_without_repair() -> None:
    tc = ToolCall(id="lost", name="bash", arguments="{}")
    msgs = [Message("user", "go"), Message("assistant", "x", tool_calls=[tc]), Message("user", "y")]
    with pytest.raises(MissingToolResultError) as info:
        TokenPruner(5000, 6, counter=COUNTER, repair=False).prune(msgs)
    assert info.value.index == 1 and info.value.tool_call_id == "lost"
    orphan = [Message("user", "go"), Message("tool", "r", tool_call_id="ghost")]
    with pytest.raises(OrphanToolResultError):
        TokenPruner(5000, 6, counter=COUNTER, repair=False).prune(orphan)


def test_orphan_tool_result_is_dropped_and_reported() -> None:
    msgs = [Message("user", "go"), Message("tool", "r", tool_call_id="ghost")]
    out, report = TokenPruner(5000, 6, counter=COUNTER).prune_with_report(msgs)
    assert out == msgs[:1]
    assert report.decisions[1].action == "dropped"
    assert "no matching call" in report.decisions[1].reason


def test_trailing_pending_call_is_left_out_of_the_prompt() -> None:
    tc = ToolCall(id="now", name="bash", arguments="{}")
    msgs = [Message("user", "go"), Message("assistant", "running", tool_calls=[tc])]
    out, report = TokenPruner(5000, 6, counter=COUNTER).prune_with_report(msgs)
    assert out == msgs[:1]
    assert report.decisions[1].reason.startswith("tool call still waiting")


class _Summarizer:
    def __init__(self) -> None:
        self.seen: list[list[Message]] = []

    def summarize(self, messages: list[Message]) -> str:
        self.seen.append(messages)
        return f"{len(messages)} earlier messages about listing files"


class _Failing:
    def summarize(self, messages: list[Message]) -> str:
        raise RuntimeError("model unavailable")


class _Async:
    async def asummarize(self, messages: list[Message]) -> str:
        await asyncio.sleep(0)
        return "async summary"


def test_summary_stands_where_history_was_dropped() -> None:
    msgs = _big_history()
    summ = _Summarizer()
    out, report = TokenPruner(6000, 6, counter=COUNTER, summarizer=summ).prune_with_report(msgs)
    summaries = [m for m in out if m.event_kind == "summary"]
    assert len(summaries) == 1
    assert out.index(summaries[0]) == 2  # after system and the task
    assert COUNTER.count_messages(out) <= 6000
    assert report.count("summarised") == len(summ.seen[0])
    validate_sequence(out)


def test_failing_summarizer_prunes_as_if_none_and_says_so() -> None:
    msgs = _big_history()
    out, report = TokenPruner(6000, 6, counter=COUNTER, summarizer=_Failing()).prune_with_report(
        msgs
    )
    assert report.summary_error is not None and "model unavailable" in report.summary_error
    assert not any(m.event_kind == "summary" for m in out)
    validate_sequence(out)


def test_async_summarizer_through_aprune() -> None:
    msgs = _big_history()
    out = asyncio.run(TokenPruner(6000, 6, counter=COUNTER, summarizer=_Async()).aprune(msgs))
    assert any(m.event_kind == "summary" and "async summary" in m.text for m in out)


def test_report_sections_add_up_to_tokens_after() -> None:
    msgs = _big_history()
    out, report = TokenPruner(6000, 6, counter=COUNTER).prune_with_report(msgs)
    assert isinstance(report, PruneReport)
    assert sum(report.sections.values()) == report.tokens_after == COUNTER.count_messages(out)
    assert report.tokens_before == COUNTER.count_messages(msgs)


def test_compressed_outputs_persist_in_a_sqlite_artifact_store(tmp_path) -> None:
    store = SQLiteArtifactStore(tmp_path / "a.db")
    msgs = _big_history()
    out = TokenPruner(6000, 6, counter=COUNTER, artifacts=store).prune(msgs)
    ref = next(m for m in out if m.artifact_refs).artifact_refs[-1]
    reopened = SQLiteArtifactStore(tmp_path / "a.db")
    assert reopened.get(ref) in {m.content for m in msgs}


def test_accepts_openai_dicts() -> None:
    msgs = [m.to_openai() for m in _big_history(steps=3, size=5)]
    out = TokenPruner(100_000, 6, counter=COUNTER).prune(msgs)
    assert [m.to_openai() for m in out] == msgs


@pytest.mark.parametrize("bad", [0, -5, 1.5, "6000", True])
def test_bad_budget_is_a_config_error(bad: object) -> None:
    with pytest.raises(ValueError):
        TokenPruner(bad)  # type: ignore[arg-type]


def test_compressed_refs_resolve_in_every_new_store() -> None:
    msgs = _big_history(steps=4, size=400)
    for _ in range(5):
        from ctxkeep import MemoryArtifactStore

        store = MemoryArtifactStore()
        out = TokenPruner(2000, 2, counter=COUNTER, artifacts=store).prune(msgs)
        refs = [m.artifact_refs[-1] for m in out if m.artifact_refs]
        assert refs and all(r in store for r in refs)
        del store, out


def test_history_older_than_the_budget_is_not_read() -> None:
    # A damaged stretch far behind the budget does not stop a prune, even without repair:
    # the pruner reads only what it keeps (the report still accounts for every message).
    msgs = _big_history(steps=40, size=50)
    msgs.insert(3, Message("tool", "orphan", tool_call_id="ghost"))
    pruner = TokenPruner(2000, 4, counter=COUNTER, repair=False, cache_stable=False)
    out, report = pruner.prune_with_report(msgs)
    validate_sequence(out)
    assert len(report.decisions) == len(msgs)


def test_cache_stable_mode_reads_the_whole_history() -> None:
    # The cache-stable mode replays the history from its start, so without repair the same
    # damaged stretch is refused.
    msgs = _big_history(steps=40, size=50)
    msgs.insert(3, Message("tool", "orphan", tool_call_id="ghost"))
    with pytest.raises(OrphanToolResultError):
        TokenPruner(2000, 4, counter=COUNTER, repair=False, cache_stable=True).prune(msgs)


def test_cache_stable_is_the_default_without_a_summarizer() -> None:
    assert TokenPruner().cache_stable is True
    assert TokenPruner(summarizer=_Summarizer()).cache_stable is False

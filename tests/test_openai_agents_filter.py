"""ctxkeep_input_filter: every model call of an Agents SDK run within an exact budget.

The runs go through the SDK's real ``Runner`` and its own ``ScriptedModel``, whose recorded
calls are what a provider would have received: each is counted, validated against the
``openai`` SDK's Responses input type and checked for call/output pairs.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.extensions import ToolOutputTrimmer
from agents.run_config import CallModelData, ModelInputData
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem

from ctxkeep import BudgetExceededError, InvalidMessageError, Message, get_counter, open_episodic
from ctxkeep.artifacts import MemoryArtifactStore
from ctxkeep.integrations.openai_agents import (
    CtxkeepInputFilter,
    CtxkeepSession,
    ctxkeep_input_filter,
    read_artifact_function_tool,
)
from ctxkeep.responses import from_responses
from test_responses import assert_valid_items

COUNTER = get_counter("o200k_base")
REF = re.compile(r"sha256:[0-9a-f]{64}")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def listing(n: int) -> str:
    """A large, varied tool output (about 9k characters)."""
    return "\n".join(
        f"-rw-r--r-- 1 dev dev {n * 37 + i:7d} Dec  3 10:{i % 60:02d} module_{n}_{i}.py"
        for i in range(150)
    )


@function_tool
def list_dir(n: int) -> str:
    """List directory number n."""
    return listing(n)


def sent_tokens(call: Any, flt: CtxkeepInputFilter, agent: Agent[Any]) -> int:
    """What a provider would receive, counted as the filter promises to count it."""
    head = [Message("system", call.system_instructions)] if call.system_instructions else []
    items = [dict(i) if isinstance(i, dict) else i.model_dump() for i in call.input]
    return COUNTER.count_messages(head + from_responses(items)) + flt._tools_tokens(agent)


def assert_pairs(items: list[Any]) -> None:
    """Every function_call is answered later, and every output answers an earlier call."""
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(outputs)
    seen: set[str] = set()
    for item in items:
        if item.get("type") == "function_call":
            seen.add(item["call_id"])
        elif item.get("type") == "function_call_output":
            assert item["call_id"] in seen


def reasoning(n: int) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=f"rs_{n}", type="reasoning", summary=[], encrypted_content="gAAAA" + "Zx9" * 300
    )


def long_script(steps: int) -> list[Any]:
    script: list[Any] = [
        [reasoning(n), function_call("list_dir", {"n": n}, call_id=f"call_{n}")]
        for n in range(steps)
    ]
    script.append([assistant_message("Listed them all.", item_id="msg_done")])
    return script


def test_a_long_run_never_sends_more_than_the_budget_or_a_broken_pair(tmp_path: Path) -> None:
    steps, budget = 40, 6000
    model = ScriptedModel(long_script(steps))
    flt = ctxkeep_input_filter(max_tokens=budget, counter=COUNTER)
    agent = Agent(
        name="lister",
        instructions="List every directory, one call each.",
        model=model,
        tools=[list_dir, flt.read_artifact],
    )
    session = CtxkeepSession("run-1", f"sqlite:///{tmp_path}/s.db")
    try:
        result = run(
            Runner.run(
                agent,
                "List directories 0 to 39.",
                session=session,
                max_turns=steps + 5,
                run_config=RunConfig(call_model_input_filter=flt, tracing_disabled=True),
            )
        )
        assert result.final_output == "Listed them all."
        assert len(model.calls) == steps + 1
        sizes = [sent_tokens(call, flt, agent) for call in model.calls]
        assert max(sizes) <= budget
        unfiltered = sum(len(json.dumps(i)) for i in run(session.get_items()))
        assert unfiltered > 40 * 8000  # the history itself is far over the budget
        for call in model.calls:
            items = [dict(i) for i in call.input]
            assert_valid_items(items)
            assert_pairs(items)
            # A reasoning item is sent only just before the call it preceded.
            for k, item in enumerate(items):
                if item.get("type") == "reasoning":
                    n = item["id"].split("_")[1]
                    assert items[k + 1]["call_id"] == f"call_{n}"
        # Outputs are sent in full or compressed with the artifact holding them in full.
        last = [dict(i) for i in model.calls[-1].input]
        for item in last:
            if item.get("type") == "function_call_output":
                n = int(item["call_id"].split("_")[1])
                ref = REF.search(item["output"])
                full = flt.artifacts.get(ref.group(0)) if ref else item["output"]
                assert full == listing(n)
        assert any(REF.search(str(i.get("output", ""))) for i in last)
        # The session keeps everything, uncompressed: the filter changes only what is sent.
        stored = run(session.get_items())
        outputs = [i["output"] for i in stored if i.get("type") == "function_call_output"]
        assert outputs == [listing(n) for n in range(steps)]
        assert flt.last_report is not None
        assert flt.last_report.tokens_sent == sizes[-1] <= budget
    finally:
        session.close()


def test_the_agent_reads_a_compressed_output_back_through_read_artifact() -> None:
    flt = ctxkeep_input_filter(max_tokens=4000, counter=COUNTER, preserve_last_n=2)
    got: dict[str, Any] = {}

    def read_back(call: Any) -> list[Any]:
        refs = [
            REF.search(i["output"])
            for i in call.input
            if i.get("type") == "function_call_output" and isinstance(i["output"], str)
        ]
        ref = next(m.group(0) for m in refs if m)
        got["ref"] = ref
        return [function_call("read_artifact", {"ref": ref, "limit": 3000}, call_id="read_1")]

    def finish(call: Any) -> list[Any]:
        got["read"] = call.input[-1]["output"]
        return [assistant_message("done", item_id="msg_end")]

    script: list[Any] = [
        [function_call("list_dir", {"n": n}, call_id=f"call_{n}")] for n in range(4)
    ]
    script += [ModelStep.respond(read_back), ModelStep.respond(finish)]
    model = ScriptedModel(script)
    agent = Agent(name="a", model=model, tools=[list_dir, flt.read_artifact])
    run(
        Runner.run(
            agent,
            "List 0 to 3, then look at an early one again.",
            run_config=RunConfig(call_model_input_filter=flt, tracing_disabled=True),
        )
    )
    # The page it asked for arrives in full (it fits), with a note of what remains.
    full = flt.artifacts.get(got["ref"])
    assert full in {listing(n) for n in range(4)}
    assert got["read"].startswith(full[:3000] + "\n[")
    assert "call read_artifact with offset=3000" in got["read"]


def _data(items: list[Any], instructions: str | None = "Be brief.") -> CallModelData[Any]:
    agent: Agent[Any] = Agent(name="a", tools=[list_dir])
    return CallModelData(
        model_data=ModelInputData(input=items, instructions=instructions),
        agent=agent,
        context=None,
    )


def _history(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(turns):
        items.append({"role": "user", "content": f"list {n}"})
        items.append(
            {"type": "function_call", "call_id": f"c{n}", "name": "list_dir", "arguments": "{}"}
        )
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": listing(n)})
    items.append({"role": "user", "content": "thanks"})
    return items


def test_items_sent_unchanged_are_the_objects_given_and_the_input_is_not_mutated() -> None:
    items = _history(6)
    before = json.dumps(items)
    flt = ctxkeep_input_filter(max_tokens=3000, counter=COUNTER, cache_stable=False)
    out = flt(_data(items))
    assert json.dumps(items) == before
    by_id = {id(i) for i in items}
    unchanged = [i for i in out.input if id(i) in by_id]
    changed = [i for i in out.input if id(i) not in by_id]
    assert unchanged and items[-1] is out.input[-1]
    # What was rebuilt is a compressed output (with its ref), never an altered message.
    assert changed and all(i["type"] == "function_call_output" for i in changed)
    assert all(REF.search(i["output"]) for i in changed)
    assert out.instructions == "Be brief."


def test_a_history_that_fits_is_sent_as_given() -> None:
    items = _history(1)
    out = ctxkeep_input_filter(max_tokens=50_000)(_data(items))
    assert out.input == items and all(a is b for a, b in zip(out.input, items, strict=True))


def test_tool_definitions_are_counted_in_the_budget() -> None:
    items = _history(6)
    with_tools = ctxkeep_input_filter(max_tokens=3000, counter=COUNTER)
    without = ctxkeep_input_filter(max_tokens=3000, counter=COUNTER, count_tools=False)
    with_tools(_data(items))
    without(_data(items))
    assert with_tools.last_report is not None and without.last_report is not None
    assert with_tools.last_report.tools_tokens > 0 == without.last_report.tools_tokens
    assert with_tools.last_report.tokens_sent <= 3000
    assert with_tools.last_report.prune.budget == 3000 - with_tools.last_report.tools_tokens


def test_instructions_that_cannot_fit_raise_a_budget_error() -> None:
    flt = ctxkeep_input_filter(max_tokens=300, counter=COUNTER)
    with pytest.raises(BudgetExceededError):
        flt(_data(_history(1), instructions="word " * 2000))


def test_reasoning_items_are_counted() -> None:
    plain = [{"role": "user", "content": "hi"}]
    with_reasoning = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "Q" * 4000},
        *plain,
    ]
    assert (
        COUNTER.count_messages(from_responses(with_reasoning))
        > COUNTER.count_messages(from_responses(plain)) + 100
    )


def test_episodic_recall_goes_into_the_instructions_and_yields_to_the_conversation() -> None:
    store = open_episodic("memory://", embedder="hash")
    store.save_episode("old", "fix the zanzibar parser", "The zanzibar parser broke on tabs.")
    flt = ctxkeep_input_filter(max_tokens=20_000, episodic=store, counter=COUNTER)
    out = flt(_data([{"role": "user", "content": "the zanzibar parser fails again"}]))
    assert out.instructions is not None
    assert out.instructions.startswith("Be brief.\n\n### Prior Historical Context")
    assert "broke on tabs" in out.instructions
    assert flt.last_report is not None and flt.last_report.recalled == 1
    # No room for it beside what must be sent: nothing is recalled, the call still goes.
    tight = ctxkeep_input_filter(max_tokens=140, episodic=store, counter=COUNTER)
    out = tight(_data([{"role": "user", "content": "the zanzibar parser " * 10}]))
    assert out.instructions == "Be brief."
    assert tight.last_report is not None and tight.last_report.recalled == 0


def test_the_sdk_trimmer_on_the_same_input_stays_over_the_budget() -> None:
    """The anchor, side by side: the SDK's trimmer keeps recent turns whole and counts
    characters, so a run of large outputs in one turn is sent as it is."""
    items = [{"role": "user", "content": "list all"}]
    for n in range(12):
        items.append(
            {"type": "function_call", "call_id": f"c{n}", "name": "list_dir", "arguments": "{}"}
        )
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": listing(n)})
    trimmed = ToolOutputTrimmer()(_data(items))
    ours = ctxkeep_input_filter(max_tokens=6000, counter=COUNTER)(_data(items))

    def tokens(out: ModelInputData) -> int:
        head = [Message("system", out.instructions or "")]
        return COUNTER.count_messages(head + from_responses([dict(i) for i in out.input]))

    assert tokens(trimmed) > 6000 * 4
    assert tokens(ours) <= 6000


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_tokens": 0}, ValueError),
        ({"max_tokens": "big"}, TypeError),
        ({"max_tokens": 10, "artifacts": 3}, TypeError),
        ({"max_tokens": 10, "episodic": object()}, TypeError),
        ({"max_tokens": 10, "count_tools": "yes"}, TypeError),
        ({"max_tokens": 10, "recall_top_k": 0}, ValueError),
        ({"max_tokens": 10, "cache_stable": 1}, TypeError),
    ],
)
def test_bad_arguments_get_typed_errors(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        ctxkeep_input_filter(**kwargs)


def test_a_malformed_item_is_a_clear_error() -> None:
    flt = ctxkeep_input_filter(max_tokens=1000)
    with pytest.raises(InvalidMessageError, match="message 1: a Responses input item must be"):
        flt(_data([{"role": "user", "content": "hi"}, 42]))


def test_read_artifact_tool_answers_errors_as_text() -> None:
    from agents import RunContextWrapper
    from agents.tool_context import ToolContext

    store = MemoryArtifactStore()
    ref = store.put("the full text")
    tool = read_artifact_function_tool(store)
    ctx = ToolContext(
        context=None, tool_name="read_artifact", tool_call_id="t1", tool_arguments="{}"
    )
    assert isinstance(ctx, RunContextWrapper)
    assert run(tool.on_invoke_tool(ctx, json.dumps({"ref": ref}))) == "the full text"
    missing = run(tool.on_invoke_tool(ctx, json.dumps({"ref": "sha256:" + "0" * 64})))
    assert "error" in json.loads(missing)
    with pytest.raises(TypeError):
        read_artifact_function_tool("memory://")  # type: ignore[arg-type]


def test_the_example_runs_offline_within_its_budget(tmp_path: Path) -> None:
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[1] / "examples" / "openai_agents_app.py"
    spec = importlib.util.spec_from_file_location("openai_agents_app", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["openai_agents_app"] = module
    spec.loader.exec_module(module)
    root = Path(__file__).resolve().parents[1] / "src" / "ctxkeep"
    sent, whole = run(module.main(root, f"sqlite:///{tmp_path}/ex.db", 6000))
    assert len(sent) >= 10 and max(sent) <= 6000 < whole


def test_without_recall_the_must_keep_count_is_not_made(monkeypatch: pytest.MonkeyPatch) -> None:
    # It only sizes recall's room: without an episodic store it is work thrown away (issue 24).
    import ctxkeep.integrations.openai_agents as oa

    calls: list[int] = []
    real = oa.must_keep_tokens

    def counted(*args: Any) -> int:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(oa, "must_keep_tokens", counted)
    items = _history(2)
    plain = ctxkeep_input_filter(max_tokens=3000, counter=COUNTER, cache_stable=False)
    out = plain(_data(items))
    assert calls == []
    store = open_episodic("memory://", embedder="hash")
    recalling = ctxkeep_input_filter(
        max_tokens=3000, counter=COUNTER, cache_stable=False, episodic=store
    )
    again = recalling(_data(items))
    assert calls == [1]
    assert again.input == out.input and again.instructions == out.instructions

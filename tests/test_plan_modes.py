"""The plan stage's modes as values, and the builder's and pruner's settings as frozen configs."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from ctxkeep import (
    BuilderConfig,
    ConfigError,
    ContextBuilder,
    InvalidTypeError,
    Message,
    PrunerConfig,
    TokenPruner,
    ToolCall,
    open_memory,
)
from ctxkeep.prune.modes import CacheStableMode, FillMode


def _history(steps: int) -> list[Message]:
    msgs = [Message("system", "You are terse."), Message("user", "the task " * 30)]
    for i in range(steps):
        call = ToolCall(id=f"c{i}", name="ls", arguments="{}")
        msgs.append(Message("assistant", f"step {i}", tool_calls=[call]))
        msgs.append(Message("tool", f"output {i} " * 80, tool_call_id=call.id))
    return msgs


def test_the_mode_is_a_value_made_from_the_config() -> None:
    assert isinstance(TokenPruner().mode, CacheStableMode)
    assert isinstance(TokenPruner(cache_stable=False).mode, FillMode)
    assert TokenPruner().mode.keeps_budget and not TokenPruner(cache_stable=False).mode.keeps_budget
    assert TokenPruner(600).with_budget(500).mode.pruner.max_token_budget == 500


@pytest.mark.parametrize("stable", [True, False])
def test_a_copy_plans_with_its_own_budget(stable: bool) -> None:
    history = _history(40)
    pruner = TokenPruner(2000, 2, cache_stable=stable)
    pruner.prune(history)
    small = copy.copy(pruner)
    small.max_token_budget = 900
    assert small.mode is not pruner.mode and small.mode.pruner is small
    out, report = small.prune_with_report(history)
    assert report.tokens_after <= 900
    assert out == TokenPruner(900, 2, cache_stable=stable).prune(history)
    assert pruner.max_token_budget == 2000  # the original is not changed
    assert pruner.prune_with_report(history)[1].tokens_after > 900


def test_the_builder_keeps_its_settings_in_one_frozen_config() -> None:
    memory = open_memory("memory://")
    builder = ContextBuilder(
        memory, max_prompt_tokens=4000, reserve_output_tokens=500, recall_top_k=2
    )
    assert builder.config == BuilderConfig(
        max_prompt_tokens=4000, reserve_output_tokens=500, recall_top_k=2
    )
    assert (builder.max_prompt_tokens, builder.reserve_output_tokens, builder.prompt_limit) == (
        4000,
        500,
        3500,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        builder.config.recall_top_k = 5  # type: ignore[misc]
    # The section caps: their defaults, at most a quarter of the budget.
    assert (builder.max_fabric_tokens, builder.max_prior_tokens) == (
        BuilderConfig().section_caps(builder.prompt_budget)
    )
    assert BuilderConfig().section_caps(2000) == (500, 500)
    assert BuilderConfig(max_prior_tokens=7).section_caps(2000) == (500, 7)
    # Every field is a setting the constructor takes: none is left out.
    names = {f.name for f in dataclasses.fields(BuilderConfig)}
    assert names <= set(ContextBuilder.__init__.__code__.co_varnames)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"max_prompt_tokens": "8k"}, InvalidTypeError),
        ({"max_prompt_tokens": 1}, ConfigError),
        ({"reserve_output_tokens": 8192}, ConfigError),
        ({"recall_top_k": -1}, ConfigError),
        ({"recall_min_score": "high"}, InvalidTypeError),
        ({"recall_scope": "everything"}, ConfigError),
        ({"recall_current_session": 1}, ConfigError),
        ({"cache_stable": "yes"}, ConfigError),
        ({"max_prompt_length": -3}, ConfigError),
    ],
)
def test_a_bad_setting_is_the_same_error_in_the_config_and_the_builder(
    changes: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        BuilderConfig().replace(**changes)
    with pytest.raises(error):
        ContextBuilder(open_memory("memory://"), **changes)  # type: ignore[arg-type]


def test_the_builders_mode_is_its_pruners() -> None:
    memory = open_memory("memory://")
    assert ContextBuilder(memory).cache_stable
    assert not ContextBuilder(memory, cache_stable=False).cache_stable
    assert not ContextBuilder(memory, pruner=TokenPruner(cache_stable=False)).cache_stable
    with pytest.raises(ConfigError, match="configure the mode on the pruner"):
        ContextBuilder(memory, pruner=TokenPruner(1000), cache_stable=False)
    assert PrunerConfig().replace(cache_stable=False).cache_stable is False

"""A builder's settings, in one frozen value: what :class:`~ctxkeep.ContextBuilder` checks and
keeps as :attr:`~ctxkeep.ContextBuilder.config`.

Every setting that changes what a build outputs is a field of :class:`BuilderConfig`; the
objects a builder works with (its session store, episodic store, fabric, counter, pruner and
gate) are not settings and stay on the builder. A copy with a change is :meth:`replace`, checked
again, so no setting can be carried over by hand and forgotten. The pruner's own settings are
its :class:`~ctxkeep.prune.config.PrunerConfig`.

Checks: a value of the wrong type is an :class:`~ctxkeep.errors.InvalidTypeError` (a flag's an
:class:`~ctxkeep.errors.InvalidSettingError`), a value out of range a
:class:`~ctxkeep.errors.ConfigError`, each naming the setting: the same errors the pruner and
the framework adapters raise for the same mistakes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ctxkeep import _check
from ctxkeep.errors import ConfigError, describe

RecallScope: TypeAlias = Literal["all", "agent", "task"]

DEFAULT_MAX_PROMPT_TOKENS = 8192
DEFAULT_RESERVE_OUTPUT_TOKENS = 1024
DEFAULT_MAX_PRIOR_TOKENS = 1500
DEFAULT_MAX_FABRIC_TOKENS = 1000
SECTION_SHARE = 4
"""A section's default budget is also at most 1/4 of the prompt budget (small windows)."""


@dataclass(frozen=True, kw_only=True)
class BuilderConfig:
    """The settings of a :class:`~ctxkeep.ContextBuilder` (see it for what each one does)."""

    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    """The model's context window, in tokens (>= 2)."""
    reserve_output_tokens: int = DEFAULT_RESERVE_OUTPUT_TOKENS
    """Tokens of the window kept for the reply (>= 0, less than ``max_prompt_tokens``)."""
    max_prior_tokens: int | None = None
    """Most tokens for recalled context (>= 0; None: 1500, at most a quarter of the budget)."""
    max_fabric_tokens: int | None = None
    """Most tokens for the fabric view (>= 0; None: 1000, at most a quarter of the budget)."""
    recall_top_k: int = 3
    """Most episodes recalled (>= 0; 0 turns recall off)."""
    recall_min_score: float | None = 0.0
    """The least fused score of a recalled episode (with lexical evidence); None: any."""
    recall_scope: RecallScope = "all"
    """Where recall searches: ``"all"``, the session's ``"agent"`` or its ``"task"``."""
    recall_current_session: bool = False
    """Also recall episodes of the session being built."""
    max_prompt_length: int | None = None
    """The default gate's code-point limit (None: the environment's or the config file's)."""
    cache_stable: bool | None = None
    """The history's pruning mode (None: the pruner's, else TokenPruner's default)."""

    def __post_init__(self) -> None:
        _check.integer("max_prompt_tokens", self.max_prompt_tokens, minimum=2)
        _check.integer("reserve_output_tokens", self.reserve_output_tokens, minimum=0)
        if self.reserve_output_tokens >= self.max_prompt_tokens:
            raise ConfigError(
                f"reserve_output_tokens ({self.reserve_output_tokens}) must be less than "
                f"max_prompt_tokens ({self.max_prompt_tokens}): the prompt needs some of the "
                "window"
            )
        _check.optional_integer("max_prior_tokens", self.max_prior_tokens, minimum=0)
        _check.optional_integer("max_fabric_tokens", self.max_fabric_tokens, minimum=0)
        _check.integer("recall_top_k", self.recall_top_k, minimum=0)
        if self.recall_min_score is not None:
            score = _check.number("recall_min_score", self.recall_min_score)
            object.__setattr__(self, "recall_min_score", score)
        if self.recall_scope not in ("all", "agent", "task"):
            raise ConfigError(
                f"recall_scope must be 'all', 'agent' or 'task', got {describe(self.recall_scope)}"
            )
        _check.flag("recall_current_session", self.recall_current_session)
        _check.optional_flag("cache_stable", self.cache_stable)
        if self.max_prompt_length is not None and (
            isinstance(self.max_prompt_length, bool)
            or not isinstance(self.max_prompt_length, int)
            or self.max_prompt_length < 0
        ):
            raise ConfigError(
                "max_prompt_length must be a non-negative integer, got "
                f"{describe(self.max_prompt_length)}"
            )

    @property
    def prompt_limit(self) -> int:
        """``max_prompt_tokens - reserve_output_tokens``: the default gate's token limit."""
        return self.max_prompt_tokens - self.reserve_output_tokens

    def section_caps(self, budget: int) -> tuple[int, int]:
        """``(fabric, recall)``: the most tokens each section may take in a ``budget``-token
        prompt (a cap left out is its default, at most ``budget // SECTION_SHARE``).
        """
        return (
            _cap(self.max_fabric_tokens, DEFAULT_MAX_FABRIC_TOKENS, budget),
            _cap(self.max_prior_tokens, DEFAULT_MAX_PRIOR_TOKENS, budget),
        )

    def replace(self, **changes: Any) -> BuilderConfig:
        """This config with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def _cap(value: int | None, default: int, budget: int) -> int:
    return min(default, budget // SECTION_SHARE) if value is None else value


__all__ = [
    "DEFAULT_MAX_FABRIC_TOKENS",
    "DEFAULT_MAX_PRIOR_TOKENS",
    "DEFAULT_MAX_PROMPT_TOKENS",
    "DEFAULT_RESERVE_OUTPUT_TOKENS",
    "SECTION_SHARE",
    "BuilderConfig",
    "RecallScope",
]

"""A pruner's settings, in one frozen value: what :class:`~ctxkeep.TokenPruner` checks, what a
copy with another budget carries over, and what keys a cache-stable fold's snapshot.

Every setting that changes what a prune outputs is a field of :class:`PrunerConfig`; the
objects a pruner works with (its counter, artifact store and summarizer) are not settings and
stay on the pruner. So :meth:`TokenPruner.with_budget` (a pruner like this one with another
budget: the builder's history budget, pydantic-ai's room before a resumed response) and
:func:`fold_key` (the settings a fold snapshot is stored under) derive from
``dataclasses.fields`` and cannot leave a new setting out.

Checks: a value of the wrong type is an :class:`~ctxkeep.errors.InvalidSettingError` (a
``ConfigError`` and an ``InvalidTypeError``, so a ``ValueError`` and a ``TypeError``), a value
out of range a :class:`~ctxkeep.errors.ConfigError`, each naming the setting: the same errors
the builder and the framework adapters raise for the same mistakes (``ctxkeep._check.flag``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ctxkeep import _check
from ctxkeep.errors import ConfigError, InvalidSettingError, describe


@dataclass(frozen=True, kw_only=True)
class PrunerConfig:
    """The settings of a :class:`~ctxkeep.TokenPruner` (see it for what each one does)."""

    max_token_budget: int = 6000
    """The most tokens the output may count (overhead included; >= 1)."""
    preserve_last_n: int = 6
    """Conversation messages kept in full when they fit (a preference; >= 0)."""
    compress_threshold: int | None = 256
    """Old tool outputs over this many tokens are compressed (>= 0; None: only when needed)."""
    excerpt_tokens: int = 60
    """About how many tokens of head and of tail a compressed output keeps (>= 0)."""
    summary_max_tokens: int = 400
    """Room reserved for a summary of dropped history (>= 0)."""
    repair: bool = True
    """Make a damaged history valid instead of refusing it."""
    compress_oversized_user: bool = True
    """Compress a newest user message that alone does not fit, rather than refuse."""
    cache_stable: bool = True
    """Prune in jumps so consecutive prompts share their prefix."""
    low_water: float = 0.7
    """With ``cache_stable``: the fraction of the budget a cut prunes down to (0 < x <= 1)."""
    keep_first: int = 1
    """The conversation's head (units from the first user message) kept in every prompt."""

    def __post_init__(self) -> None:
        _integer("max_token_budget", self.max_token_budget, 1)
        _integer("preserve_last_n", self.preserve_last_n, 0)
        if self.compress_threshold is not None:
            _integer("compress_threshold", self.compress_threshold, 0)
        _integer("excerpt_tokens", self.excerpt_tokens, 0)
        _integer("summary_max_tokens", self.summary_max_tokens, 0)
        _integer("keep_first", self.keep_first, 0)
        for name in ("repair", "compress_oversized_user", "cache_stable"):
            _check.flag(name, getattr(self, name))
        low = self.low_water
        if isinstance(low, bool) or not isinstance(low, int | float):
            raise InvalidSettingError(f"low_water must be a number in (0, 1], got {describe(low)}")
        if not 0 < low <= 1:
            raise ConfigError(f"low_water must be a number in (0, 1], got {describe(low)}")
        object.__setattr__(self, "low_water", float(low))

    def replace(self, **changes: Any) -> PrunerConfig:
        """This config with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


class Configured:
    """The settings of a pruner as attributes, read from its :attr:`config` (the layers of
    :class:`~ctxkeep.TokenPruner` read them so; only the budget may be set, which replaces
    the config).
    """

    config: PrunerConfig

    @property
    def max_token_budget(self) -> int:
        """The most tokens the output may count."""
        return self.config.max_token_budget

    @max_token_budget.setter
    def max_token_budget(self, value: int) -> None:
        self.config = self.config.replace(max_token_budget=value)

    @property
    def preserve_last_n(self) -> int:
        """Conversation messages kept in full when they fit."""
        return self.config.preserve_last_n

    @property
    def compress_threshold(self) -> int | None:
        """Old tool outputs over this many tokens are compressed."""
        return self.config.compress_threshold

    @property
    def excerpt_tokens(self) -> int:
        """About how many tokens of head and of tail a compressed output keeps."""
        return self.config.excerpt_tokens

    @property
    def summary_max_tokens(self) -> int:
        """Room reserved for a summary of dropped history."""
        return self.config.summary_max_tokens

    @property
    def repair(self) -> bool:
        """Whether a damaged history is repaired rather than refused."""
        return self.config.repair

    @property
    def compress_oversized_user(self) -> bool:
        """Whether a newest user message that alone does not fit is compressed."""
        return self.config.compress_oversized_user

    @property
    def cache_stable(self) -> bool:
        """Whether consecutive prompts share their prefix (the cache-stable fold)."""
        return self.config.cache_stable

    @property
    def low_water(self) -> float:
        """With ``cache_stable``: the fraction of the budget a cut prunes down to."""
        return self.config.low_water

    @property
    def keep_first(self) -> int:
        """The conversation's head units kept in every prompt."""
        return self.config.keep_first


def is_plain_pruner(pruner: Any) -> bool:
    """Whether ``pruner`` is a :class:`~ctxkeep.TokenPruner` itself, not a subclass that may
    prune otherwise (the class says so in its own body: ``_plain_pruner = True``; a subclass
    that prunes alike may say it too). What the read strategies and fold snapshots, which
    rely on how a TokenPruner prunes, ask before they stand in for a whole read.
    """
    return bool(type(pruner).__dict__.get("_plain_pruner", False))


def _integer(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSettingError(f"{name} must be an int, got {describe(value)}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def fold_key(config: PrunerConfig) -> list[Any]:
    """Every setting of ``config`` that changes a cache-stable fold, JSON-ready, in field
    order (derived from the fields: a new setting is in it without anyone listing it).
    """
    return [getattr(config, f.name) for f in dataclasses.fields(config)]


__all__ = ["Configured", "PrunerConfig", "fold_key", "is_plain_pruner"]

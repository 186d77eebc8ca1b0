"""What ctxkeep knows about models: context windows and output limits, and the provider.

A client's gate refuses a prompt over ``context_window - output reserve`` tokens, so it needs
both numbers for its model. :data:`MODELS` holds them for the OpenAI and Anthropic models in
common use, matched by the longest name prefix (``claude-sonnet-4-5-20250929`` finds
``claude-sonnet-4-5``; a router's ``openai/gpt-4o`` finds ``gpt-4o``). Any model, a local
one behind an OpenAI-compatible server included, can be given its numbers explicitly
(``ChatClient(..., context_window=32768, max_output_tokens=2048)``).

``default_output_tokens`` is the reserve (and, for Anthropic, the ``max_tokens`` sent) when the
caller names none. It is deliberately below the model's ceiling where the ceiling is most of the
window (reasoning models, Claude 4): Anthropic refuses a request whose prompt plus
``max_tokens`` exceeds the window, so a 64k default would take a third of every prompt's room.
The figures are the providers' published ones (model pages, 2025).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from ctxkeep.errors import ConfigError

Provider: TypeAlias = Literal["openai", "anthropic"]
PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic")


@dataclass(frozen=True, kw_only=True)
class ModelLimits:
    """The token limits of one model."""

    context_window: int
    """Tokens of prompt and output together the model accepts."""
    max_output_tokens: int
    """The most output tokens the provider allows in one reply."""
    default_output_tokens: int
    """The output reserve (and Anthropic ``max_tokens``) when the caller names none."""


def _m(window: int, ceiling: int, default: int | None = None) -> ModelLimits:
    return ModelLimits(
        context_window=window,
        max_output_tokens=ceiling,
        default_output_tokens=min(ceiling, default or ceiling),
    )


MODELS: dict[str, ModelLimits] = {
    # OpenAI
    "gpt-3.5-turbo": _m(16_385, 4_096),
    "gpt-4": _m(8_192, 8_192, 4_096),
    "gpt-4-turbo": _m(128_000, 4_096),
    "gpt-4o": _m(128_000, 16_384),
    "chatgpt-4o": _m(128_000, 16_384),
    "gpt-4o-mini": _m(128_000, 16_384),
    "gpt-4.1": _m(1_047_576, 32_768),
    "gpt-4.5": _m(128_000, 16_384),
    "gpt-5": _m(400_000, 128_000, 32_768),
    "gpt-oss": _m(131_072, 131_072, 16_384),
    "o1": _m(200_000, 100_000, 32_768),
    "o1-mini": _m(128_000, 65_536, 32_768),
    "o3": _m(200_000, 100_000, 32_768),
    "o3-mini": _m(200_000, 100_000, 32_768),
    "o4-mini": _m(200_000, 100_000, 32_768),
    # Anthropic
    "claude-3-haiku": _m(200_000, 4_096),
    "claude-3-opus": _m(200_000, 4_096),
    "claude-3-5-haiku": _m(200_000, 8_192),
    "claude-3-5-sonnet": _m(200_000, 8_192),
    "claude-3-7-sonnet": _m(200_000, 64_000, 8_192),
    "claude-sonnet-4": _m(200_000, 64_000, 8_192),
    "claude-sonnet-4-5": _m(200_000, 64_000, 8_192),
    "claude-haiku-4-5": _m(200_000, 64_000, 8_192),
    "claude-opus-4": _m(200_000, 32_000, 8_192),
    "claude-opus-4-1": _m(200_000, 32_000, 8_192),
    "claude-opus-4-5": _m(200_000, 64_000, 8_192),
}
"""Known models by name prefix (the longest matching prefix wins)."""


def known_limits(model: str) -> ModelLimits | None:
    """The table's limits for ``model`` (longest prefix match), or None."""
    name = model.split("/")[-1].lower()
    best = max((p for p in MODELS if name.startswith(p)), key=len, default=None)
    return MODELS[best] if best is not None else None


def resolve_limits(
    model: str, *, context_window: int | None, max_output_tokens: int | None
) -> ModelLimits:
    """The limits a client uses: the explicit ones, else the table's.

    Raises:
        ConfigError: a model the table does not know and no ``context_window``, or an output
            reserve that leaves no room for a prompt.

    """
    known = known_limits(model)
    if context_window is None:
        if known is None:
            raise ConfigError(
                f"ctxkeep does not know the context window of {model!r}; pass "
                "context_window= (and max_output_tokens=) with the model's limits"
            )
        context_window = known.context_window
    ceiling = known.max_output_tokens if known is not None else context_window
    if max_output_tokens is None:
        default = known.default_output_tokens if known is not None else 4_096
        max_output_tokens = min(default, context_window // 4 or 1)
    if max_output_tokens >= context_window:
        raise ConfigError(
            f"max_output_tokens ({max_output_tokens}) must be less than the context window "
            f"({context_window}) of {model!r}: the reserve leaves no room for a prompt"
        )
    return ModelLimits(
        context_window=context_window,
        max_output_tokens=max(ceiling, max_output_tokens),
        default_output_tokens=max_output_tokens,
    )


def infer_provider(model: str) -> Provider:
    """``"anthropic"`` for ``claude-*`` models, else ``"openai"`` (OpenAI and compatibles)."""
    name = model.split("/")[-1].lower()
    return "anthropic" if name.startswith(("claude", "anthropic")) else "openai"


__all__ = [
    "MODELS",
    "PROVIDERS",
    "ModelLimits",
    "Provider",
    "infer_provider",
    "known_limits",
    "resolve_limits",
]

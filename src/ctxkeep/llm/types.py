"""What a call returns: the assistant's :class:`~ctxkeep.Message`, the usage, the model."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ctxkeep.messages import Message, ToolCall


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Tokens the provider reported for one call, in one shape for both providers.

    OpenAI's ``prompt_tokens`` already include cached tokens; Anthropic's ``input_tokens`` do
    not (cache reads and writes are reported beside them): here ``input_tokens`` is always
    the whole prompt, so that it can be compared with ctxkeep's own count.
    """

    input_tokens: int
    """Every prompt token the provider counted, cached ones included."""
    output_tokens: int
    """Tokens of the reply (reasoning included where the provider counts it there)."""
    cached_input_tokens: int = 0
    """Prompt tokens read from the provider's prompt cache."""
    cache_write_tokens: int = 0
    """Prompt tokens written to the provider's prompt cache (Anthropic)."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, int]:
        """A JSON-ready dict (as stored in a reply's metadata)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class ChatResult:
    """One completed call."""

    message: Message
    """The assistant's reply, tool calls and (Anthropic) thinking blocks included."""
    model: str
    """The model that answered, as the provider named it."""
    provider: str
    """``"openai"`` or ``"anthropic"``."""
    usage: Usage | None = None
    """Tokens the provider reported (None if it reported none, as some compatible servers)."""
    stop_reason: str | None = None
    """Why the reply ended, as the provider said (``stop``, ``tool_calls``, ``end_turn``,
    ``tool_use``, ``length``, ``max_tokens``...)."""
    id: str | None = None
    """The provider's id of the response."""
    raw: Any = field(default=None, repr=False, compare=False)
    """The SDK's response object (None for a stream), for what ctxkeep does not carry."""

    @property
    def text(self) -> str:
        """The reply's text."""
        return self.message.text

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls the reply requests."""
        return self.message.tool_calls

    def metadata(self) -> dict[str, Any]:
        """What a stored reply keeps of this call (JSON-ready): model, provider, usage,
        stop reason and response id.
        """
        return {
            "model": self.model,
            "provider": self.provider,
            "usage": self.usage.to_dict() if self.usage is not None else None,
            "stop_reason": self.stop_reason,
            "response_id": self.id,
        }


__all__ = ["ChatResult", "Usage"]

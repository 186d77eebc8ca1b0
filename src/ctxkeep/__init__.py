"""ctxkeep: keep a long-running LLM agent's context inside its window.

The public API is everything in ``__all__``; see ``docs`` in the README for a tour.
"""

from ctxkeep._version import __version__
from ctxkeep.errors import (
    ArtifactNotFoundError,
    BudgetExceededError,
    CognitiveStateSchemaVersionError,
    ConfigError,
    CtxkeepError,
    InvalidMessageError,
    InvalidSequenceError,
    MessageError,
    MissingDependencyError,
    MissingToolResultError,
    OrphanToolResultError,
    PromptTooLongError,
    SchemaVersionError,
    SessionNotFoundError,
    StorageError,
    TokenizerError,
    UnknownEncodingError,
    UnknownRoleError,
)
from ctxkeep.gate import PromptGate
from ctxkeep.messages import (
    AnthropicPayload,
    Message,
    ToolCall,
    coerce_messages,
    from_anthropic,
    from_openai,
    is_valid_sequence,
    to_anthropic,
    to_openai,
    validate_sequence,
)
from ctxkeep.tokens import (
    CalibratedCounter,
    HeuristicCounter,
    TiktokenCounter,
    TokenCounter,
    get_counter,
)

__all__ = [
    "AnthropicPayload",
    "ArtifactNotFoundError",
    "BudgetExceededError",
    "CalibratedCounter",
    "CognitiveStateSchemaVersionError",
    "ConfigError",
    "CtxkeepError",
    "HeuristicCounter",
    "InvalidMessageError",
    "InvalidSequenceError",
    "Message",
    "MessageError",
    "MissingDependencyError",
    "MissingToolResultError",
    "OrphanToolResultError",
    "PromptGate",
    "PromptTooLongError",
    "SchemaVersionError",
    "SessionNotFoundError",
    "StorageError",
    "TiktokenCounter",
    "TokenCounter",
    "TokenizerError",
    "ToolCall",
    "UnknownEncodingError",
    "UnknownRoleError",
    "__version__",
    "coerce_messages",
    "from_anthropic",
    "from_openai",
    "get_counter",
    "is_valid_sequence",
    "to_anthropic",
    "to_openai",
    "validate_sequence",
]

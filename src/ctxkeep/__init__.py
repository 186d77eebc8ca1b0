"""ctxkeep: keep a long-running LLM agent's context inside its window.

The public API is everything in ``__all__``; the README has a tour.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ctxkeep._version import __version__
from ctxkeep.agent import AgentRun, run_agent, tool_spec
from ctxkeep.artifacts import (
    READ_ARTIFACT_TOOL,
    ArtifactStore,
    DirectoryArtifactStore,
    MemoryArtifactStore,
    SQLiteArtifactStore,
    open_artifacts,
    read_artifact_tool,
)
from ctxkeep.builder import BuiltPrompt, ContextBuilder
from ctxkeep.cache import place_cache_breakpoints
from ctxkeep.checkpoints import Checkpoint, CheckpointStore, open_checkpoints
from ctxkeep.cognition import (
    CognitiveState,
    MigrationRegistry,
    decode_cognitive_state,
    encode_cognitive_state,
)
from ctxkeep.errors import (
    ArtifactNotFoundError,
    BudgetExceededError,
    CheckpointNotFoundError,
    CognitiveStateSchemaVersionError,
    ConfigError,
    ContextWindowExceededError,
    CorruptRecordError,
    CtxkeepError,
    EpisodeNotFoundError,
    InvalidFilterError,
    InvalidMessageError,
    InvalidSequenceError,
    InvalidTypeError,
    MessageError,
    MissingDependencyError,
    MissingToolResultError,
    OrphanToolResultError,
    PromptTooLongError,
    SchemaVersionError,
    SessionChangedError,
    SessionExistsError,
    SessionNotFoundError,
    StaleTaskStateError,
    StorageError,
    TokenizerError,
    UnknownAgentError,
    UnknownEncodingError,
    UnknownRoleError,
)
from ctxkeep.fabric import (
    ContextFabric,
    ContextLayer,
    ContextView,
    InProcessBus,
    IPCMessage,
    MessageBus,
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
from ctxkeep.prune import AsyncSummarizer, MessageDecision, PruneReport, Summarizer, TokenPruner
from ctxkeep.responses import from_responses, to_responses
from ctxkeep.sessions import (
    AsyncMemoryManager,
    Evicted,
    MemoryConfig,
    MemoryManager,
    SessionInfo,
    SessionMemory,
    default_memory_config,
    open_async_memory,
    open_memory,
)
from ctxkeep.tokens import (
    CalibratedCounter,
    HeuristicCounter,
    TiktokenCounter,
    TokenCounter,
    get_counter,
)

if _TYPE_CHECKING:
    from ctxkeep.episodic import (
        Embedder,
        Episode,
        EpisodeFilter,
        EpisodicMemoryStore,
        Hit,
        RetrievalConfig,
        format_prior_context,
        open_episodic,
    )
    from ctxkeep.llm import (
        AsyncChatClient,
        AsyncLLMSummarizer,
        ChatClient,
        ChatResult,
        LLMSummarizer,
    )

# Episodic memory needs numpy: it is imported on first use, so ``import ctxkeep`` stays light.
_LAZY = {
    name: "ctxkeep.episodic"
    for name in (
        "Embedder",
        "Episode",
        "EpisodeFilter",
        "EpisodicMemoryStore",
        "Hit",
        "RetrievalConfig",
        "format_prior_context",
        "open_episodic",
    )
}
# The LLM clients import their SDK (openai, anthropic) only when a client is made, and the
# module itself on first use.
_LAZY.update(
    dict.fromkeys(
        ("AsyncChatClient", "AsyncLLMSummarizer", "ChatClient", "ChatResult", "LLMSummarizer"),
        "ctxkeep.llm",
    )
)


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ctxkeep' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "READ_ARTIFACT_TOOL",
    "AgentRun",
    "AnthropicPayload",
    "ArtifactNotFoundError",
    "ArtifactStore",
    "AsyncChatClient",
    "AsyncLLMSummarizer",
    "AsyncMemoryManager",
    "AsyncSummarizer",
    "BudgetExceededError",
    "BuiltPrompt",
    "CalibratedCounter",
    "ChatClient",
    "ChatResult",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "CognitiveState",
    "CognitiveStateSchemaVersionError",
    "ConfigError",
    "ContextBuilder",
    "ContextFabric",
    "ContextLayer",
    "ContextView",
    "ContextWindowExceededError",
    "CorruptRecordError",
    "CtxkeepError",
    "DirectoryArtifactStore",
    "Embedder",
    "Episode",
    "EpisodeFilter",
    "EpisodeNotFoundError",
    "EpisodicMemoryStore",
    "Evicted",
    "HeuristicCounter",
    "Hit",
    "IPCMessage",
    "InProcessBus",
    "InvalidFilterError",
    "InvalidMessageError",
    "InvalidSequenceError",
    "InvalidTypeError",
    "LLMSummarizer",
    "MemoryArtifactStore",
    "MemoryConfig",
    "MemoryManager",
    "Message",
    "MessageBus",
    "MessageDecision",
    "MessageError",
    "MigrationRegistry",
    "MissingDependencyError",
    "MissingToolResultError",
    "OrphanToolResultError",
    "PromptGate",
    "PromptTooLongError",
    "PruneReport",
    "RetrievalConfig",
    "SQLiteArtifactStore",
    "SchemaVersionError",
    "SessionChangedError",
    "SessionExistsError",
    "SessionInfo",
    "SessionMemory",
    "SessionNotFoundError",
    "StaleTaskStateError",
    "StorageError",
    "Summarizer",
    "TiktokenCounter",
    "TokenCounter",
    "TokenPruner",
    "TokenizerError",
    "ToolCall",
    "UnknownAgentError",
    "UnknownEncodingError",
    "UnknownRoleError",
    "__version__",
    "coerce_messages",
    "decode_cognitive_state",
    "default_memory_config",
    "encode_cognitive_state",
    "format_prior_context",
    "from_anthropic",
    "from_openai",
    "from_responses",
    "get_counter",
    "is_valid_sequence",
    "open_artifacts",
    "open_async_memory",
    "open_checkpoints",
    "open_episodic",
    "open_memory",
    "place_cache_breakpoints",
    "read_artifact_tool",
    "run_agent",
    "to_anthropic",
    "to_openai",
    "to_responses",
    "tool_spec",
    "validate_sequence",
]

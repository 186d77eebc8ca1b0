"""ctxkeep: keep a long-running LLM agent's context inside its window.

The public API is everything in ``__all__``; the README has a tour.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ctxkeep._version import __version__
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
    InvalidSettingError,
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

if _TYPE_CHECKING:
    from ctxkeep.agent import (
        AgentRun,
        run_agent,
        tool_spec,
    )
    from ctxkeep.anthropic_cache import (
        place_cache_breakpoints,
    )
    from ctxkeep.artifacts import (
        READ_ARTIFACT_TOOL,
        ArtifactStore,
        DirectoryArtifactStore,
        MemoryArtifactStore,
        SQLiteArtifactStore,
        open_artifacts,
        read_artifact_tool,
    )
    from ctxkeep.builder import (
        BuiltPrompt,
        ContextBuilder,
    )
    from ctxkeep.checkpoints import (
        Checkpoint,
        CheckpointStore,
        open_checkpoints,
    )
    from ctxkeep.cognition import (
        CognitiveState,
        MigrationRegistry,
        decode_cognitive_state,
        encode_cognitive_state,
    )
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
    from ctxkeep.fabric import (
        ContextFabric,
        ContextLayer,
        ContextView,
        InProcessBus,
        IPCMessage,
        MessageBus,
    )
    from ctxkeep.gate import (
        PromptGate,
    )
    from ctxkeep.llm import (
        AsyncChatClient,
        AsyncLLMSummarizer,
        ChatClient,
        ChatResult,
        LLMSummarizer,
    )
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
    from ctxkeep.prune import (
        AsyncSummarizer,
        MessageDecision,
        PruneReport,
        Summarizer,
        TokenPruner,
    )
    from ctxkeep.responses import (
        from_responses,
        to_responses,
    )
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

# Every other public name is imported on first use, so ``import ctxkeep`` (and a command such
# as ``ctxkeep count``) loads only the parts it uses: the errors above are the only eager
# import. Type checkers read the imports above.
_LAZY: dict[str, str] = {
    "AgentRun": "ctxkeep.agent",
    "run_agent": "ctxkeep.agent",
    "tool_spec": "ctxkeep.agent",
    "READ_ARTIFACT_TOOL": "ctxkeep.artifacts",
    "ArtifactStore": "ctxkeep.artifacts",
    "DirectoryArtifactStore": "ctxkeep.artifacts",
    "MemoryArtifactStore": "ctxkeep.artifacts",
    "SQLiteArtifactStore": "ctxkeep.artifacts",
    "open_artifacts": "ctxkeep.artifacts",
    "read_artifact_tool": "ctxkeep.artifacts",
    "BuiltPrompt": "ctxkeep.builder",
    "ContextBuilder": "ctxkeep.builder",
    "place_cache_breakpoints": "ctxkeep.anthropic_cache",
    "Checkpoint": "ctxkeep.checkpoints",
    "CheckpointStore": "ctxkeep.checkpoints",
    "open_checkpoints": "ctxkeep.checkpoints",
    "CognitiveState": "ctxkeep.cognition",
    "MigrationRegistry": "ctxkeep.cognition",
    "decode_cognitive_state": "ctxkeep.cognition",
    "encode_cognitive_state": "ctxkeep.cognition",
    "ContextFabric": "ctxkeep.fabric",
    "ContextLayer": "ctxkeep.fabric",
    "ContextView": "ctxkeep.fabric",
    "InProcessBus": "ctxkeep.fabric",
    "IPCMessage": "ctxkeep.fabric",
    "MessageBus": "ctxkeep.fabric",
    "PromptGate": "ctxkeep.gate",
    "AnthropicPayload": "ctxkeep.messages",
    "Message": "ctxkeep.messages",
    "ToolCall": "ctxkeep.messages",
    "coerce_messages": "ctxkeep.messages",
    "from_anthropic": "ctxkeep.messages",
    "from_openai": "ctxkeep.messages",
    "is_valid_sequence": "ctxkeep.messages",
    "to_anthropic": "ctxkeep.messages",
    "to_openai": "ctxkeep.messages",
    "validate_sequence": "ctxkeep.messages",
    "AsyncSummarizer": "ctxkeep.prune",
    "MessageDecision": "ctxkeep.prune",
    "PruneReport": "ctxkeep.prune",
    "Summarizer": "ctxkeep.prune",
    "TokenPruner": "ctxkeep.prune",
    "from_responses": "ctxkeep.responses",
    "to_responses": "ctxkeep.responses",
    "AsyncMemoryManager": "ctxkeep.sessions",
    "Evicted": "ctxkeep.sessions",
    "MemoryConfig": "ctxkeep.sessions",
    "MemoryManager": "ctxkeep.sessions",
    "SessionInfo": "ctxkeep.sessions",
    "SessionMemory": "ctxkeep.sessions",
    "default_memory_config": "ctxkeep.sessions",
    "open_async_memory": "ctxkeep.sessions",
    "open_memory": "ctxkeep.sessions",
    "CalibratedCounter": "ctxkeep.tokens",
    "HeuristicCounter": "ctxkeep.tokens",
    "TiktokenCounter": "ctxkeep.tokens",
    "TokenCounter": "ctxkeep.tokens",
    "get_counter": "ctxkeep.tokens",
    "Embedder": "ctxkeep.episodic",
    "Episode": "ctxkeep.episodic",
    "EpisodeFilter": "ctxkeep.episodic",
    "EpisodicMemoryStore": "ctxkeep.episodic",
    "Hit": "ctxkeep.episodic",
    "RetrievalConfig": "ctxkeep.episodic",
    "format_prior_context": "ctxkeep.episodic",
    "open_episodic": "ctxkeep.episodic",
    "AsyncChatClient": "ctxkeep.llm",
    "AsyncLLMSummarizer": "ctxkeep.llm",
    "ChatClient": "ctxkeep.llm",
    "ChatResult": "ctxkeep.llm",
    "LLMSummarizer": "ctxkeep.llm",
}


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
    "InvalidSettingError",
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

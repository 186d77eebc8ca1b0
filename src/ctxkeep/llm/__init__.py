"""Gated calls to OpenAI (and OpenAI-compatible servers) and Anthropic.

The gate sits inside the client: every request is checked against the model's context window
less the output reserve (and a code-point limit, when one is configured) before anything is
sent, so an over-long prompt never reaches the provider::

    from ctxkeep.llm import ChatClient

    client = ChatClient("gpt-4o-mini")                   # or "claude-sonnet-4-5", or
    # ChatClient("qwen3", base_url="http://127.0.0.1:8000/v1", context_window=32768)
    result = client.complete([{"role": "user", "content": "Hello"}])
    result.message, result.usage, result.model

    with client.stream(messages) as stream:              # text deltas, then the same result
        for delta in stream: ...
    stream.result

    client = ChatClient("gpt-4o-mini", memory=open_memory())
    client.chat(session_id, "Next question")             # store, build, call, store

Parts: :mod:`~ctxkeep.llm.models` (the window table), :mod:`~ctxkeep.llm.types` (results),
:mod:`~ctxkeep.llm._base` (everything the sync and async clients share),
:mod:`~ctxkeep.llm.client` (the clients and streams; the only I/O), one I/O-free adapter per
provider (``_openai``, ``_anthropic``), and :mod:`~ctxkeep.llm.summarizer` (a pruner
summarizer on a client). The SDKs are imported when a client is made, never on import:
a missing one raises :class:`~ctxkeep.errors.MissingDependencyError` naming the extra.
"""

from ctxkeep.llm.client import AsyncChatClient, AsyncChatStream, ChatClient, ChatStream
from ctxkeep.llm.models import MODELS, ModelLimits, infer_provider, known_limits
from ctxkeep.llm.summarizer import AsyncLLMSummarizer, LLMSummarizer
from ctxkeep.llm.types import ChatResult, Usage

__all__ = [
    "MODELS",
    "AsyncChatClient",
    "AsyncChatStream",
    "AsyncLLMSummarizer",
    "ChatClient",
    "ChatResult",
    "ChatStream",
    "LLMSummarizer",
    "ModelLimits",
    "Usage",
    "infer_provider",
    "known_limits",
]

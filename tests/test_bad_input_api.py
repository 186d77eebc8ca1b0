"""Malformed input through every public entry point: whatever is raised is a CtxkeepError.

Each entry of :data:`CALLS` is a valid call of a public function, constructor or method (built
fresh for each case); the test first checks it succeeds, then replaces one argument at a time
with each value of :data:`BAD` (wrong types, ``None``, empty, huge, NaN, lone surrogates,
NUL, integers beyond 64 bits, data nested 900 deep, unknown keys...). The call may succeed
(a value can be acceptable) or raise, but what it raises must be a
:class:`~ctxkeep.errors.CtxkeepError` (which is also the builtin a Python user expects, such
as ``ValueError`` or ``TypeError``): no bare builtin error escapes.

A test checks that every callable name in ``ctxkeep.__all__`` has at least one entry here.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import ctxkeep
from ctxkeep.errors import CtxkeepError


@pytest.fixture(autouse=True)
def _in_a_scratch_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A bad URL may be read as a path: whatever it creates lands in the test's folder.
    monkeypatch.chdir(tmp_path)


def _nested(depth: int) -> dict[str, Any]:
    """``{"a": {"a": ... {}}}``, ``depth`` levels deep: deeper than a copy can recurse."""
    out: dict[str, Any] = {}
    for _ in range(depth):
        out = {"a": out}
    return out


BAD: dict[str, Any] = {
    "object": object(),
    "none": None,
    "empty-str": "",
    "float": 3.5,
    "nan": math.nan,
    "inf": math.inf,
    "negative": -1,
    "huge-int": 10**30,
    "bool": True,
    "surrogate": "\ud800",
    "empty-list": [],
    "list-of-junk": [object()],
    "list-of-ints": [1, 2],
    "unknown-keys": {"bogus": 1},
    "nested-junk": {"role": "user", "content": {"no": object()}},
    "bytes": b"\xff\xfe",
    "huge-str": "x" * 200_000,
    "nul": "a\x00b",
    "int64-overflow": 2**63,
    "deep": _nested(900),
}

MSG = {"role": "user", "content": "hello"}
CALL_MSGS = [
    {"role": "user", "content": "go"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "done"},
]
ANTHROPIC = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
RESPONSES = [
    {"role": "user", "content": "go"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
    {"type": "function_call_output", "call_id": "c1", "output": "done"},
]


@dataclass
class Call:
    """A valid call: ``target()`` gives the callable (fresh), ``kwargs`` its valid arguments."""

    name: str
    target: Callable[[], Callable[..., Any]]
    kwargs: dict[str, Any]
    skip: set[str] = field(default_factory=set)
    """Arguments not fuzzed (callbacks and the like, whose misuse is the caller's code)."""


def _mem() -> Any:
    mem = ctxkeep.open_memory("memory://")
    mem.create_session("agent", session_id="s")
    mem.add_message("s", "user", "hello")
    return mem


def _mem_with_newest(newest_id: str) -> Any:
    mem = ctxkeep.open_memory("memory://")
    mem.create_session("agent", session_id="s")
    mem.add_messages("s", [ctxkeep.Message("user", "hello", id=newest_id)])
    return mem


def _episodic() -> Any:
    store = ctxkeep.open_episodic("memory://", embedder="hash")
    store.save_episode("s", "goal", "summary", metadata={"k": 1}, agent_id="a")
    return store


def _fabric() -> Any:
    fabric = ctxkeep.ContextFabric()
    fabric.set_task_context("a", {"k": 1}, task_id="t")
    return fabric


def _checkpoints() -> Any:
    store = ctxkeep.open_checkpoints("memory://")
    store.save("a", ctxkeep.CognitiveState(context={"k": 1}))
    return store


def _artifacts() -> Any:
    store = ctxkeep.open_artifacts("memory://")
    store.put("text")
    return store


REF = ctxkeep.open_artifacts("memory://").put("text")


_LLM_SERVER: list[Any] = []


def _llm_url() -> str:
    """A local OpenAI-compatible server (tests/_llm_servers.py), started on first use."""
    if not _LLM_SERVER:
        from _llm_servers import ScriptedServer, openai_default

        _LLM_SERVER.append(ScriptedServer(openai_default).start())
    return f"{_LLM_SERVER[0].url}/v1"


LLM_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _llm_kwargs() -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "provider": "openai",
        "api_key": "test",
        "base_url": _llm_url(),
        "client": None,
        "max_retries": 0,
        "timeout": 10.0,
        "context_window": 8000,
        "max_output_tokens": 1000,
        "max_prompt_length": 20_000,
        "max_prompt_tokens": 6000,
        "counter": None,
        "memory": None,
        "builder": None,
    }


def _echo(text: str = "") -> str:
    """Echo the text."""
    return text


def _chat_client(**changes: Any) -> Any:
    return ctxkeep.ChatClient(**{**_llm_kwargs(), **changes})


CALLS: list[Call] = [
    # messages
    Call("Message", lambda: ctxkeep.Message, {"role": "user", "content": "hi", "name": None}),
    Call("ToolCall", lambda: ctxkeep.ToolCall, {"id": "c1", "name": "f", "arguments": "{}"}),
    Call("Message.from_openai", lambda: ctxkeep.Message.from_openai, {"d": MSG}),
    Call("from_openai", lambda: ctxkeep.from_openai, {"messages": CALL_MSGS}),
    Call("to_openai", lambda: ctxkeep.to_openai, {"messages": CALL_MSGS}),
    Call("from_anthropic", lambda: ctxkeep.from_anthropic, {"messages": ANTHROPIC, "system": "s"}),
    Call("to_anthropic", lambda: ctxkeep.to_anthropic, {"messages": CALL_MSGS}),
    Call("from_responses", lambda: ctxkeep.from_responses, {"items": RESPONSES}),
    Call("to_responses", lambda: ctxkeep.to_responses, {"messages": CALL_MSGS}),
    Call(
        "to_responses (from items)",
        lambda: ctxkeep.to_responses,
        {"messages": ctxkeep.from_responses(RESPONSES)},
    ),
    Call("validate_sequence", lambda: ctxkeep.validate_sequence, {"messages": CALL_MSGS}),
    Call("is_valid_sequence", lambda: ctxkeep.is_valid_sequence, {"messages": CALL_MSGS}),
    Call("coerce_messages", lambda: ctxkeep.coerce_messages, {"messages": CALL_MSGS}),
    # tokens
    Call("get_counter", lambda: ctxkeep.get_counter, {"name": "o200k_base"}),
    Call("TiktokenCounter", lambda: ctxkeep.TiktokenCounter, {"encoding": "cl100k_base"}),
    Call("HeuristicCounter", lambda: ctxkeep.HeuristicCounter, {"chars_per_token": 4.0}),
    Call(
        "CalibratedCounter",
        lambda: ctxkeep.CalibratedCounter,
        {"model": "claude", "ratio": 1.15, "base": "o200k_base", "smoothing": 0.3},
    ),
    Call("count_text", lambda: ctxkeep.get_counter().count_text, {"text": "hello"}),
    Call("count_message", lambda: ctxkeep.get_counter().count_message, {"message": MSG}),
    Call("count_messages", lambda: ctxkeep.get_counter().count_messages, {"messages": CALL_MSGS}),
    # the gate
    Call(
        "PromptGate",
        lambda: ctxkeep.PromptGate,
        {"max_prompt_length": 100, "max_prompt_tokens": 50},
    ),
    Call("PromptGate.check", lambda: ctxkeep.PromptGate(1000).check, {"prompt": CALL_MSGS}),
    # pruning
    Call(
        "TokenPruner",
        lambda: ctxkeep.TokenPruner,
        {"max_token_budget": 1000, "preserve_last_n": 2, "counter": None, "artifacts": None},
    ),
    Call("TokenPruner.prune", lambda: ctxkeep.TokenPruner(1000).prune, {"messages": CALL_MSGS}),
    Call(
        "PrunerConfig",
        lambda: ctxkeep.PrunerConfig,
        {"max_token_budget": 1000, "preserve_last_n": 2, "low_water": 0.5, "keep_first": 1},
    ),
    Call(
        "BuilderConfig",
        lambda: ctxkeep.BuilderConfig,
        {"max_prompt_tokens": 4000, "reserve_output_tokens": 500, "recall_scope": "agent"},
    ),
    Call(
        "TokenPruner.prune_with_report",
        lambda: ctxkeep.TokenPruner(1000).prune_with_report,
        {"messages": CALL_MSGS},
    ),
    Call(
        "TokenPruner.compress",
        lambda: ctxkeep.TokenPruner(1000).compress,
        {"message": ctxkeep.Message("tool", "x" * 5000, tool_call_id="c1")},
    ),
    # session memory
    Call(
        "MemoryConfig",
        lambda: ctxkeep.MemoryConfig,
        {"max_history": 10, "session_ttl": 60.0, "max_sessions": 5, "archive_evicted": True},
    ),
    Call("open_memory", lambda: ctxkeep.open_memory, {"url": "memory://", "config": None}),
    Call("SessionMemory", lambda: ctxkeep.SessionMemory, {"max_size": 3, "ttl": 60.0}),
    Call(
        "create_session",
        lambda: _mem().create_session,
        {"agent_id": "a", "task_id": "t", "metadata": {"k": 1}, "session_id": "new"},
    ),
    Call(
        "add_message",
        lambda: _mem().add_message,
        {"session_id": "s", "role": "assistant", "content": "ok"},
    ),
    Call("add_messages", lambda: _mem().add_messages, {"session_id": "s", "messages": [MSG]}),
    Call(
        "add_structured_message",
        lambda: _mem().add_structured_message,
        {"session_id": "s", "message": MSG},
    ),
    Call("get_messages", lambda: _mem().get_messages, {"session_id": "s", "limit": 5}),
    Call("get_session", lambda: _mem().get_session, {"session_id": "s"}),
    Call("has_session", lambda: _mem().has_session, {"session_id": "s"}),
    Call(
        "build_prompt_messages",
        lambda: _mem().build_prompt_messages,
        {"session_id": "s", "system": "be brief", "pruner": None},
    ),
    Call(
        "list_sessions",
        lambda: _mem().list_sessions,
        {"agent_id": "agent", "task_id": None, "limit": 5, "offset": 0},
    ),
    Call("delete_session", lambda: _mem().delete_session, {"session_id": "s"}),
    Call(
        "get_latest_session_for_agent",
        lambda: _mem().get_latest_session_for_agent,
        {"agent_id": "agent"},
    ),
    Call("archived_messages", lambda: _mem().archived_messages, {"session_id": "s"}),
    Call("pop_message", lambda: _mem().pop_message, {"session_id": "s"}),
    Call(
        "replace_newest",
        lambda: _mem_with_newest("n").replace_newest,
        {"session_id": "s", "messages": [{"role": "user", "content": "x"}], "newest_id": "n"},
    ),
    # the fabric
    Call("ContextFabric", lambda: ctxkeep.ContextFabric, {}),
    Call(
        "set_task_context",
        lambda: _fabric().set_task_context,
        {"agent_id": "b", "mapping": {"x": 1}, "task_id": "t2"},
    ),
    Call("task_context", lambda: _fabric().task_context, {"agent_id": "a"}),
    Call(
        "update_task_context",
        lambda: _fabric().update_task_context,
        {"agent_id": "a", "changes": {"x": 2}, "expected_version": 1},
    ),
    Call(
        "set_private",
        lambda: _fabric().set_private,
        {"agent_id": "a", "key": "k", "value": [1]},
    ),
    Call("private", lambda: _fabric().private, {"agent_id": "a"}),
    Call("context_view", lambda: _fabric().context_view, {"agent_id": "a"}),
    Call(
        "fabric.send",
        lambda: _fabric().send,
        {"sender": "a", "payload": {"x": 1}, "recipient": "a", "topic": None},
    ),
    Call(
        "set_cognitive_state",
        lambda: _fabric().set_cognitive_state,
        {"agent_id": "a", "state": {"schema_version": 1, "context": {"k": 1}}},
    ),
    Call(
        "IPCMessage",
        lambda: ctxkeep.IPCMessage,
        {"sender": "a", "payload": {"x": 1}, "task_id": "t", "recipient": "b", "topic": None},
    ),
    # cognition and checkpoints
    Call(
        "CognitiveState",
        lambda: ctxkeep.CognitiveState,
        {"schema_version": 1, "context": {"k": 1}, "decision": "go"},
    ),
    Call(
        "encode_cognitive_state",
        lambda: ctxkeep.encode_cognitive_state,
        {"state": ctxkeep.CognitiveState(context={"k": (1, 2)})},
    ),
    Call(
        "decode_cognitive_state",
        lambda: ctxkeep.decode_cognitive_state,
        {"obj": {"schema_version": 1, "context": {"k": 1}}},
    ),
    Call("open_checkpoints", lambda: ctxkeep.open_checkpoints, {"url": "memory://"}),
    Call(
        "CheckpointStore.save",
        lambda: _checkpoints().save,
        {"agent_id": "a", "state": {"context": {"k": 1}}, "session_id": "s", "metadata": {}},
    ),
    Call("CheckpointStore.latest", lambda: _checkpoints().latest, {"agent_id": "a"}),
    Call(
        "CheckpointStore.history",
        lambda: _checkpoints().history,
        {"agent_id": "a", "limit": 5},
    ),
    Call("CheckpointStore.load", lambda: _checkpoints().load, {"checkpoint_id": "nope"}),
    # artifacts
    Call("open_artifacts", lambda: ctxkeep.open_artifacts, {"url": "memory://"}),
    Call("ArtifactStore.put", lambda: _artifacts().put, {"text": "hello"}),
    Call("ArtifactStore.get", lambda: _artifacts().get, {"ref": REF}),
    Call(
        "read_artifact_tool",
        lambda: ctxkeep.read_artifact_tool,
        {"store": _artifacts(), "arguments": {"ref": REF}},
    ),
    # episodic memory
    Call(
        "open_episodic",
        lambda: ctxkeep.open_episodic,
        {"url": "memory://", "embedder": "hash"},
    ),
    Call(
        "save_episode",
        lambda: _episodic().save_episode,
        {
            "session_id": "s",
            "task_goal": "goal",
            "summary": "done",
            "metadata": {"k": 1},
            "agent_id": "a",
            "task_id": "t",
            "created_at": 1_700_000_000.0,
        },
    ),
    Call(
        "search",
        lambda: _episodic().search,
        {"query": "goal", "top_k": 3, "filters": {"agent_id": "a"}},
    ),
    Call(
        "search_relevant_context",
        lambda: _episodic().search_relevant_context,
        {"query": "goal", "top_k": 3, "filters": None},
    ),
    Call("episodic.get", lambda: _episodic().get, {"episode_id": "nope"}),
    Call("episodic.count", lambda: _episodic().count, {"filters": {"agent_id": "a"}}),
    Call(
        "episodic.forget",
        lambda: _episodic().forget,
        {"episode_id": None, "session_id": "s", "agent_id": None},
    ),
    Call(
        "format_prior_context",
        lambda: ctxkeep.format_prior_context,
        {"hits": [], "header": "### Prior Historical Context"},
    ),
    Call("RetrievalConfig", lambda: ctxkeep.RetrievalConfig, {"window": 2, "self_weight": 3}),
    Call(
        "EpisodeFilter.parse",
        lambda: ctxkeep.EpisodeFilter.parse,
        {"filters": {"agent_id": ["a", "b"], "metadata": {"k": [1]}, "since": 0}},
    ),
    # the builder
    Call(
        "ContextBuilder",
        lambda: ctxkeep.ContextBuilder,
        {
            "memory": _mem(),
            "episodic": _episodic(),
            "counter": None,
            "max_prompt_tokens": 1000,
            "reserve_output_tokens": 100,
            "gate": None,
            "fabric": _fabric(),
            "pruner": None,
            "max_prior_tokens": 200,
            "max_fabric_tokens": 200,
            "recall_top_k": 3,
            "recall_min_score": 0.0,
            "recall_scope": "all",
            "recall_current_session": False,
            "max_prompt_length": None,
            "cache_stable": None,
        },
    ),
    Call(
        "ContextBuilder.build",
        lambda: ctxkeep.ContextBuilder(_mem(), episodic=_episodic(), fabric=_fabric()).build,
        {"session_id": "s", "system": "be brief", "query": "goal", "agent_id": "agent"},
    ),
    Call(
        "open_async_memory",
        lambda: ctxkeep.open_async_memory,
        {"url": "memory://", "config": None},
    ),
    # LLM clients (against a local server)
    Call(
        "run_agent",
        lambda: ctxkeep.run_agent,
        {
            "session_id": None,
            "task": "say hi",
            "tools": [_echo],
            "client": _chat_client(memory=ctxkeep.open_memory("memory://")),
            "max_steps": 2,
            "agent_id": "a",
            "system": None,
        },
    ),
    Call("tool_spec", lambda: ctxkeep.tool_spec, {"fn": _echo}),
    Call(
        "place_cache_breakpoints",
        lambda: ctxkeep.place_cache_breakpoints,
        {"messages": CALL_MSGS, "stable_prefix": 1, "ttl": "5m", "max_breakpoints": 4},
    ),
    Call("ChatClient", lambda: ctxkeep.ChatClient, _llm_kwargs()),
    Call("AsyncChatClient", lambda: ctxkeep.AsyncChatClient, _llm_kwargs()),
    Call(
        "ChatClient.complete",
        lambda: _chat_client().complete,
        {
            "messages": CALL_MSGS,
            "system": "be brief",
            "tools": LLM_TOOLS,
            "tool_choice": "auto",
            "max_tokens": 50,
            "options": {"user": "u"},
        },
    ),
    Call(
        "ChatClient.chat",
        lambda: _chat_client(memory=_mem()).chat,
        {
            "session_id": "s",
            "text": "hi",
            "system": "be brief",
            "tools": LLM_TOOLS,
            "tool_choice": "auto",
            "max_tokens": 50,
            "options": {"user": "u"},
        },
    ),
    Call(
        "LLMSummarizer",
        lambda: ctxkeep.LLMSummarizer,
        {
            "client": _chat_client(),
            "instructions": "Summarise.",
            "max_tokens": 100,
            "max_message_chars": 1000,
        },
    ),
    Call(
        "LLMSummarizer.summarize",
        lambda: ctxkeep.LLMSummarizer(_chat_client()).summarize,
        {"messages": CALL_MSGS},
    ),
    Call(
        "AsyncLLMSummarizer",
        lambda: ctxkeep.AsyncLLMSummarizer,
        {
            "client": ctxkeep.AsyncChatClient(**_llm_kwargs()),
            "instructions": "Summarise.",
            "max_tokens": 100,
            "max_message_chars": 1000,
        },
    ),
]

# Calls whose valid form raises a typed error on purpose (an unknown id).
EXPECTED_ERRORS = {"CheckpointStore.load", "episodic.get"}

CASES = [
    pytest.param(call, arg, bad, id=f"{call.name}-{arg}-{label}")
    for call in CALLS
    for arg in call.kwargs
    if arg not in call.skip
    for label, bad in BAD.items()
]


@pytest.mark.parametrize("call", CALLS, ids=[c.name for c in CALLS])
def test_the_valid_call_succeeds(call: Call) -> None:
    if call.name in EXPECTED_ERRORS:
        with pytest.raises(CtxkeepError):
            call.target()(**call.kwargs)
    else:
        call.target()(**call.kwargs)


@pytest.mark.parametrize(("call", "arg", "bad"), CASES)
def test_malformed_input_raises_only_ctxkeep_errors(call: Call, arg: str, bad: Any) -> None:
    fn = call.target()
    try:
        fn(**{**call.kwargs, arg: bad})
    except CtxkeepError:
        pass
    except Exception as exc:  # the failure this test exists to find
        pytest.fail(f"{call.name}({arg}={bad!r:.40}) raised {type(exc).__name__}: {exc}")


def test_every_public_callable_is_covered() -> None:
    covered = {c.name.split(".")[0] for c in CALLS}
    exempt = {
        # protocols, abstract bases and plain records without validation of their own
        "AgentRun", "AnthropicPayload", "ArtifactStore", "AsyncMemoryManager", "AsyncSummarizer",
        "BuiltPrompt",
        "Checkpoint", "CheckpointStore", "ContextLayer", "ContextView", "DirectoryArtifactStore",
        "Embedder", "Episode", "EpisodicMemoryStore", "Evicted", "Hit", "InProcessBus",
        "MemoryArtifactStore", "MemoryManager", "MessageBus", "MessageDecision",
        "MigrationRegistry", "PruneReport", "SQLiteArtifactStore", "SessionInfo", "Summarizer",
        "TokenCounter", "default_memory_config", "ChatResult",
    }  # fmt: skip
    names = {
        n
        for n in ctxkeep.__all__
        if callable(getattr(ctxkeep, n))
        and not (
            inspect.isclass(getattr(ctxkeep, n)) and issubclass(getattr(ctxkeep, n), BaseException)
        )
    }
    assert names - covered - exempt == set()

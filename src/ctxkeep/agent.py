"""A resumable tool-calling agent loop on a :class:`~ctxkeep.llm.ChatClient`: :func:`run_agent`.

Each step is one :meth:`ChatClient.chat` turn over a stored session (the builder prunes the
history into the model's window, compressing old tool outputs; the gate checks every request).
When the model calls tools, each call is run and its result stored as a structured ``tool``
message (its turn id, its call's id, the assistant message as ``parent_id``); then the
agent's :class:`~ctxkeep.CognitiveState` is saved as a checkpoint.

Resuming. The session is the record of what happened: a call is *finished* once its result is
stored. On start, :func:`run_agent` takes the agent's latest session
(:meth:`MemoryManager.get_latest_session_for_agent`) when its latest checkpoint says the run is
still going, and continues from what the session holds: calls still waiting for results are run
(only those), a turn whose reply never arrived is asked again, and the step count comes from the
checkpoint. A process killed at any moment therefore never repeats a finished call; a call that
was running when the process died (its result not stored) runs again, so tools should be safe
to retry.

Tools are plain Python callables. Their OpenAI function definitions are derived from their
signatures (``str``, ``int``, ``float``, ``bool``, ``list``, ``dict`` parameters; parameters
with defaults are optional) and the first paragraph of their docstrings (:func:`tool_spec`).
A tool that raises answers the model with the error's text instead of ending the run.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_type_hints

from ctxkeep import _check
from ctxkeep.cognition import CognitiveState
from ctxkeep.errors import ConfigError, InvalidTypeError
from ctxkeep.messages import Message, ToolCall

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
}

RUNNING = "running"
DONE = "done"


@dataclass(frozen=True, kw_only=True)
class AgentRun:
    """What :func:`run_agent` did."""

    session_id: str
    """The session the run is stored in."""
    agent_id: str
    """The agent."""
    status: Literal["done", "max_steps"]
    """``done``: the model answered without calling a tool; ``max_steps``: the step limit."""
    steps: int
    """Model calls made for this task, over every process that worked on it."""
    tool_calls: int
    """Tool calls run by this process."""
    resumed: bool
    """True if the run continued a session an earlier process left unfinished."""
    answer: Message | None
    """The model's final reply (None when the step limit stopped the run)."""


def tool_spec(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI function-tool definition of a Python callable.

    Raises:
        InvalidTypeError: ``fn`` is not callable, or a parameter's type has no JSON form.

    """
    if not callable(fn):
        raise InvalidTypeError(f"a tool must be a callable, got {type(fn).__name__}")
    name = getattr(fn, "__name__", type(fn).__name__)
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to strings
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(param.name, str)
        origin = getattr(hint, "__origin__", hint)
        kind = _JSON_TYPES.get(origin)
        if kind is None:
            raise InvalidTypeError(
                f"tool {name!r}: parameter {param.name!r} has type {hint!r}; use str, int, "
                "float, bool, list or dict"
            )
        properties[param.name] = {"type": kind}
        if param.default is param.empty:
            required.append(param.name)
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n", 1)[0].strip() or name
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def run_tool(tools: Mapping[str, Callable[..., Any]], call: ToolCall) -> str:
    """Run one call; its result as text (an error's text if the tool raised or was unknown)."""
    fn = tools.get(call.name)
    if fn is None:
        return f"error: no tool named {call.name!r}; available: {', '.join(sorted(tools))}"
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError as exc:
        return f"error: the arguments are not JSON ({exc})"
    if not isinstance(args, dict):
        return "error: the arguments must be a JSON object"
    try:
        result = fn(**args)
    except Exception as exc:  # the model sees the failure and may try otherwise
        return f"error: {type(exc).__name__}: {exc}"
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def _tools_by_name(
    tools: Iterable[Callable[..., Any]],
) -> tuple[dict[str, Callable[..., Any]], list[dict[str, Any]]]:
    """The tools by name, and their function definitions (names must be unique)."""
    by_name: dict[str, Callable[..., Any]] = {}
    specs: list[dict[str, Any]] = []
    for fn in _check.iterable("tools", tools):
        spec = tool_spec(fn)
        name = spec["function"]["name"]
        if name in by_name:
            raise ConfigError(f"two tools are named {name!r}")
        by_name[name] = fn
        specs.append(spec)
    return by_name, specs


def _default_checkpoints(memory: Any) -> Any:
    from ctxkeep.checkpoints import open_checkpoints

    path = getattr(memory.backend, "path", None)
    return open_checkpoints(f"sqlite:///{path}" if path is not None else "memory://")


def run_agent(
    session_id: str | None,
    task: str,
    tools: Sequence[Callable[..., Any]] = (),
    *,
    client: Any,
    max_steps: int = 50,
    agent_id: str = "agent",
    system: str | None = None,
    checkpoints: Any = None,
    max_tokens: int | None = None,
    on_step: Callable[[int, Message], None] | None = None,
) -> AgentRun:
    """Run ``task`` with ``tools`` until the model answers without calling one, or for
    ``max_steps`` model calls; resumable (see the module docstring).

    Args:
        session_id: the session to work in; ``None``: the agent's latest unfinished session,
            else a new one. A given id that does not exist yet is created.
        task: the user's request (stored as the session's first user message).
        tools: Python callables the model may call.
        client: a :class:`~ctxkeep.llm.ChatClient` made with ``memory=`` (the session store).
        max_steps: model calls at most, counted over every process that worked on the task.
        agent_id: the agent (sessions and checkpoints are found by it).
        system: the system prompt of every call.
        checkpoints: the :class:`~ctxkeep.CheckpointStore` for the agent's state (default:
            the session store's SQLite file, or memory).
        max_tokens: the output limit of each call.
        on_step: called with the step number and the model's reply after each call.

    Raises:
        ConfigError / InvalidTypeError: bad arguments.
        PromptTooLongError, ContextWindowExceededError, StorageError: from the call path.

    """
    memory = getattr(client, "memory", None)
    if memory is None:
        raise ConfigError("run_agent needs a client made with memory=open_memory(...)")
    task = _check.text("task", task)
    agent_id = _check.text("agent_id", agent_id)
    max_steps = _check.integer("max_steps", max_steps, minimum=1)
    _check.optional_text("session_id", session_id)
    by_name, definitions = _tools_by_name(tools)
    specs = definitions or None
    store = checkpoints if checkpoints is not None else _default_checkpoints(memory)

    sid, step, resumed = _resume(memory, store, agent_id, session_id)
    if sid is None:
        sid = memory.create_session(agent_id, session_id=session_id)
    ran = 0

    def save(status: str, observation: Any = None, decision: Any = None) -> None:
        state = CognitiveState(
            context={"task": task},
            observation=observation,
            working_memory={"steps": step, "tool_calls_run": ran},
            decision=decision,
            tool_state={"tools": sorted(by_name)},
            checkpoint={"status": status, "step": step, "session_id": sid},
        )
        store.save(agent_id, state, session_id=sid)

    if not resumed:
        save(RUNNING)
    answer: Message | None = None
    while True:
        pending = _waiting_calls(memory, sid)
        if pending:  # a reply whose calls are not all answered: answer them first
            assistant, calls = pending
            outputs = []
            for call in calls:
                output = run_tool(by_name, call)
                memory.add_message(
                    sid,
                    "tool",
                    output,
                    tool_call_id=call.id,
                    metadata={"tool": call.name},  # not `name`: OpenAI's tool messages have none
                    turn_id=assistant.turn_id,
                    parent_id=assistant.id,
                )
                ran += 1
                outputs.append({"call": call.id, "tool": call.name, "chars": len(output)})
            save(RUNNING, observation=outputs, decision=[c.name for c in calls])
            continue
        last = _last_message(memory, sid)
        if last is not None and last.role == "assistant" and not last.tool_calls:
            answer = last  # answered (perhaps by an earlier process)
            break
        if step >= max_steps:
            break
        text = task if last is None else None  # a new session: the task is the first turn
        result = client.chat(sid, text, system=system, tools=specs, max_tokens=max_tokens)
        step += 1
        if on_step is not None:
            on_step(step, result.message)
        save(RUNNING, decision=[c.name for c in result.message.tool_calls] or "answer")
    status: Literal["done", "max_steps"] = "done" if answer is not None else "max_steps"
    save(DONE if answer is not None else RUNNING, decision="answer" if answer else None)
    return AgentRun(
        session_id=sid,
        agent_id=agent_id,
        status=status,
        steps=step,
        tool_calls=ran,
        resumed=resumed,
        answer=answer,
    )


def _resume(
    memory: Any, store: Any, agent_id: str, session_id: str | None
) -> tuple[str | None, int, bool]:
    """``(session to continue or None, steps already made, whether it is a resumption)``."""
    latest = store.latest(agent_id)
    cp = latest.state.checkpoint if latest is not None else None
    cp = cp if isinstance(cp, dict) else {}
    if session_id is None:
        candidate = memory.get_latest_session_for_agent(agent_id)
        if candidate is None or cp.get("session_id") != candidate or cp.get("status") != RUNNING:
            return None, 0, False
        return candidate, int(cp.get("step", 0)), True
    if not memory.has_session(session_id):
        return None, 0, False
    step = int(cp.get("step", 0)) if cp.get("session_id") == session_id else 0
    return session_id, step, True


def _last_message(memory: Any, sid: str) -> Message | None:
    msgs: list[Message] = memory.get_messages(sid, limit=1)
    return msgs[0] if msgs else None


def _waiting_calls(memory: Any, sid: str) -> tuple[Message, list[ToolCall]] | None:
    """The assistant message whose calls still wait for results, and those calls.

    It is the newest message with tool calls (only its results can follow it), so the newest
    few messages are read first and the whole session only if it lies further back.
    """
    info = memory.get_session(sid)
    if not info.pending:
        return None
    waiting = set(info.pending)
    for limit in (2 * len(info.pending) + 1, None):
        for m in reversed(memory.get_messages(sid, limit=limit)):
            if m.tool_calls:
                return m, [c for c in m.tool_calls if c.id in waiting]
    return None

"""ctxkeep's pruner as a pydantic-ai history processor.

:class:`ProcessHistory` fits an agent's ``list[ModelMessage]`` into an exact token budget before
every model request, with :class:`~ctxkeep.TokenPruner`'s guarantees: system prompts and the
newest user prompt are kept, recent turns are preferred, a ``ToolCallPart`` is never kept
without its ``ToolReturnPart`` (nor a return without its call), old tool returns are compressed
losslessly (head, tail and a ref to the full text in an
:class:`~ctxkeep.artifacts.ArtifactStore`), and the history it returns never exceeds the budget.
pydantic-ai 2 takes it through its ``ProcessHistory`` capability, 1.x as a history processor::

    from pydantic_ai import Agent
    from ctxkeep.integrations.pydantic_ai import ProcessHistory

    keep = ProcessHistory(max_tokens=8000)
    agent = Agent("openai:gpt-5", capabilities=[keep.as_capability()])  # pydantic-ai 2
    agent = Agent("openai:gpt-5", history_processors=[keep])            # pydantic-ai 1.x

How a history maps to ctxkeep messages (:func:`to_messages`, and back with
:func:`from_messages`):

* a ``ModelResponse`` is one ``assistant`` message; its ``ToolCallPart`` s (function tools,
  answered in the next request) are its ``tool_calls``, every other part (text, thinking,
  provider-side tool calls and returns, files) is content it is counted by;
* a ``ModelRequest`` is one message per part, its tool answers first: a ``ToolReturnPart`` (or a
  legacy ``RetryPromptPart`` naming a tool) is a ``tool`` message answering its
  ``tool_call_id``; a ``SystemPromptPart`` and pydantic-ai's instruction, tool-availability,
  capability and settings records are ``system`` messages (always kept, in place); every other
  part (``UserPromptPart``, ``RetryFeedbackPart``, a summary's ``CompactionPart``...) is a
  ``user`` message. A request with no parts is one empty ``user`` message.

Each ctxkeep message holds its source, the original pydantic-ai message and part index, by
reference in ``metadata["pydantic_ai"]`` (copies of the message share it). Coming back, the
parts of one request are regrouped into that request in their original order: a message whose
parts all survived unchanged comes back as the very object it was, a request that lost some
parts as a copy (``dataclasses.replace``) with the rest, and a compressed part as a copy of the
part with the compressed text, so timestamps, ids, kinds, instructions and provider details are
never lost. pydantic-ai treats a history as immutable (build new objects to change one), and
so does this module: the input is never modified.

What the budget counts: every message as ``TokenCounter.count_messages`` counts the converted
messages (OpenAI's per-message accounting). Instructions and tool definitions are not part of
the history (pydantic-ai sends the ones resolved for each step), so leave room for them. Images
count by OpenAI's tile formula; audio, video and documents count as a short placeholder.

pydantic-ai 2 keeps what the processor returns as the run's history, so a dropped message is
gone from ``all_messages()`` too; a compressed tool return can be read back in full from
:attr:`ProcessHistory.artifacts` under the ref its text names. A history that ends with a
``ModelResponse`` (resuming a suspended response) keeps that response at its end.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ctxkeep.artifacts import ArtifactStore
from ctxkeep.errors import (
    BudgetExceededError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    MissingDependencyError,
    describe,
)
from ctxkeep.messages import Content, ContentPart, Message, ToolCall, coerce_messages
from ctxkeep.prune import PruneReport, TokenPruner
from ctxkeep.tokens import TokenCounter, get_counter

try:
    from pydantic_ai.messages import (
        BinaryContent,
        CompactionPart,
        FileUrl,
        ImageUrl,
        ModelMessage,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        SystemPromptPart,
        TextContent,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("pydantic-ai-slim", "pydantic-ai") from exc

__all__ = ["ProcessHistory", "count_tokens", "from_messages", "to_messages"]

METADATA_KEY = "pydantic_ai"
"""The key of a converted message's :class:`Source` in its ``metadata``."""

_SYSTEM_KINDS = frozenset(
    {
        "system-prompt",
        "instruction-delta",
        "instruction-baseline",
        "tool-availability-delta",
        "capability-load-delta",
        "model-settings-delta",
    }
)
"""Request parts that are the application's instructions or pydantic-ai's own records of what
changed (tools, capabilities, settings): kept in place like system messages, because the
framework reads its state back from them."""


@dataclass(frozen=True, eq=False)
class Source:
    """Where a converted ctxkeep message came from, held by reference.

    A deep copy of a message (ctxkeep copies messages at every boundary) shares its source, so
    the original objects come back unchanged however often the message is copied.
    """

    message: ModelMessage
    """The original ``ModelRequest`` or ``ModelResponse``."""
    part: int | None
    """For a request: the index of the part this message stands for (None for a request with
    no parts); None for a response, which is one message."""
    content: Content
    """The content the message was converted with (a change means it was compressed)."""
    call_ids: tuple[str, ...]
    """The tool call ids the message was converted with (its calls, or the id it answers)."""

    def __deepcopy__(self, memo: dict[int, Any]) -> Source:
        return self

    def __copy__(self) -> Source:
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Source):
            return NotImplemented
        return self.part == other.part and (
            self.message is other.message or self.message == other.message
        )


# -- pydantic-ai -> ctxkeep --------------------------------------------------------------------


def _json_text(value: Any) -> str:
    """A JSON rendering of ``value`` to count it by (dataclasses and pydantic models too)."""
    import pydantic_core

    return pydantic_core.to_json(value, fallback=repr).decode()


def _media_part(item: Any) -> ContentPart:
    if isinstance(item, ImageUrl):
        return {"type": "image_url", "image_url": {"url": item.url}}
    if isinstance(item, BinaryContent) and item.is_image:
        return {"type": "image_url", "image_url": {"url": item.data_uri}}
    if isinstance(item, FileUrl):
        return {"type": "text", "text": f"[{type(item).__name__}: {item.url}]"}
    if isinstance(item, BinaryContent):
        return {"type": "text", "text": f"[{item.kind}: {item.media_type}, {len(item.data)} bytes]"}
    if isinstance(item, TextContent):
        return {"type": "text", "text": item.content}
    if isinstance(item, str):
        return {"type": "text", "text": item}
    return {"type": "text", "text": _json_text(item)}


def _content(items: Sequence[Any]) -> Content:
    """Content from a list of user-content items: a string if they are one string."""
    if len(items) == 1 and isinstance(items[0], str):
        return items[0]
    parts = [_media_part(i) for i in items if type(i).__name__ != "CachePoint"]
    return parts or ""


def _part_content(part: Any) -> Content:
    """What a part sends the model, as ctxkeep content to count."""
    if isinstance(part, ToolReturnPart):
        return _content(part.content_items(mode="str"))
    if isinstance(part, RetryPromptPart) or callable(getattr(part, "model_response", None)):
        return str(part.model_response())
    if isinstance(part, UserPromptPart):
        return part.content if isinstance(part.content, str) else _content(list(part.content))
    if isinstance(part, TextPart | SystemPromptPart):
        return part.content
    content = getattr(part, "content", None)
    if isinstance(content, str) and content:
        return content
    if isinstance(content, BinaryContent):  # a FilePart
        return [_media_part(content)]
    return _json_text(part)


def _tool_call_id(part: Any) -> str | None:
    """The id of the call ``part`` answers, or None if it answers none."""
    if isinstance(part, ToolReturnPart) or (
        isinstance(part, RetryPromptPart) and part.tool_name is not None
    ):
        return str(part.tool_call_id)
    return None


def _request_messages(req: ModelRequest) -> list[Message]:
    if not req.parts:
        return [Message("user", "", metadata={METADATA_KEY: Source(req, None, "", ())})]
    tools: list[Message] = []
    others: list[Message] = []
    for j, part in enumerate(req.parts):
        content = _part_content(part)
        tid = _tool_call_id(part)
        if tid is not None:
            src = Source(req, j, content, (tid,))
            tools.append(Message("tool", content, tool_call_id=tid, metadata={METADATA_KEY: src}))
        else:
            role = "system" if getattr(part, "part_kind", None) in _SYSTEM_KINDS else "user"
            src = Source(req, j, content, ())
            others.append(Message(role, content, metadata={METADATA_KEY: src}))
    return tools + others  # a request's tool answers lead it, as providers require


def _response_message(resp: ModelResponse) -> Message:
    calls: list[ToolCall] = []
    parts: list[ContentPart] = []
    for part in resp.parts:
        if isinstance(part, ToolCallPart):
            calls.append(ToolCall(part.tool_call_id, part.tool_name, part.args_as_json_str()))
            continue
        c = _part_content(part)
        parts.extend([{"type": "text", "text": c}] if isinstance(c, str) else c or [])
    content: Content
    if len(parts) == 1 and parts[0]["type"] == "text":
        content = str(parts[0]["text"])
    else:
        content = parts or (None if calls else "")
    src = Source(resp, None, content, tuple(c.id for c in calls))
    return Message("assistant", content, tool_calls=calls, metadata={METADATA_KEY: src})


def _convert(message: Any, index: int) -> list[Message]:
    try:
        if isinstance(message, ModelRequest):
            return _request_messages(message)
        if isinstance(message, ModelResponse):
            return [_response_message(message)]
    except InvalidMessageError as exc:
        raise InvalidMessageError(str(exc), index=index) from exc
    raise InvalidMessageError(
        f"expected a pydantic-ai ModelRequest or ModelResponse, got {type(message).__name__} "
        f"{describe(message)}",
        index=index,
    )


def _check_list(messages: Any) -> Sequence[Any]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise InvalidTypeError(
            f"messages must be a list of pydantic-ai ModelMessage objects, got "
            f"{type(messages).__name__}"
        )
    return messages


def to_messages(messages: Sequence[ModelMessage]) -> list[Message]:
    """The ctxkeep messages of a pydantic-ai history (see the module docstring for the mapping).

    Raises:
        InvalidTypeError: ``messages`` is not a list.
        InvalidMessageError: an item is not a ``ModelRequest`` or ``ModelResponse``, or a part
            is malformed (an empty ``tool_call_id``); the error names the message's index.

    """
    out: list[Message] = []
    for i, m in enumerate(_check_list(messages)):
        out.extend(_convert(m, i))
    return out


def count_tokens(messages: Sequence[ModelMessage], counter: TokenCounter | None = None) -> int:
    """The tokens of a pydantic-ai history as a prompt, as :class:`ProcessHistory` counts them
    (``counter`` defaults to ``get_counter()``, o200k_base).
    """
    return (counter or get_counter()).count_messages(to_messages(messages))


# -- ctxkeep -> pydantic-ai --------------------------------------------------------------------


def _source(m: Message) -> Source | None:
    src = m.metadata.get(METADATA_KEY)
    return src if isinstance(src, Source) else None


def _changed(m: Message, src: Source) -> bool:
    ids = tuple(c.id for c in m.tool_calls) if m.role == "assistant" else ()
    if m.role == "tool":
        ids = (m.tool_call_id or "",)
    return m.content != src.content or ids != src.call_ids


def _response_from(m: Message, src: Source | None) -> ModelResponse:
    if src is not None and isinstance(src.message, ModelResponse):
        if not _changed(m, src):
            return src.message
        # The pruner only renames duplicate call ids of one response: rename the parts in order.
        ids = iter(c.id for c in m.tool_calls)
        parts = [
            dataclasses.replace(p, tool_call_id=next(ids)) if isinstance(p, ToolCallPart) else p
            for p in src.message.parts
        ]
        return dataclasses.replace(src.message, parts=parts)
    calls = [
        ToolCallPart(c.name, c.arguments, tool_call_id=c.id) for c in m.tool_calls
    ]  # a message ctxkeep wrote itself
    text = [TextPart(m.text)] if m.text else []
    return ModelResponse(parts=[*text, *calls])


def _part_from(m: Message, src: Source | None, names: dict[str, str]) -> Any:
    """The request part for message ``m``: its original part, a copy with the pruner's change,
    or (a message ctxkeep wrote itself) a new part.
    """
    if src is None:
        if m.role == "tool":
            tid = m.tool_call_id or ""
            return ToolReturnPart(names.get(tid, "unknown"), m.text, tid)
        if m.role in ("system", "developer"):
            return SystemPromptPart(m.text)
        if m.event_kind == "summary":
            return CompactionPart(m.text)
        return UserPromptPart(m.text if isinstance(m.content, str) else m.text or "")
    assert isinstance(src.message, ModelRequest) and src.part is not None
    part = src.message.parts[src.part]
    if not _changed(m, src):
        return part
    text = m.text
    if isinstance(part, RetryPromptPart):  # deprecated: rebuilt as what pydantic-ai reads it as
        return ToolReturnPart(
            part.tool_name or "unknown",
            text,
            m.tool_call_id or part.tool_call_id,
            timestamp=part.timestamp,
            outcome="retried",
        )
    changeable: Any = part  # the part types' content fields differ; each takes a string
    if isinstance(part, ToolReturnPart):
        return dataclasses.replace(changeable, content=text, tool_call_id=m.tool_call_id)
    if isinstance(getattr(part, "content", None), str | list):
        return dataclasses.replace(changeable, content=text)
    return UserPromptPart(text)


@dataclass
class _Group:
    """The parts of one request being reassembled, each with its sort key."""

    source: ModelRequest | None
    parts: list[tuple[float, Any]]
    empty: bool = False  # stands for a request that had no parts

    def build(self) -> ModelRequest:
        parts = [p for _, p in sorted(self.parts, key=lambda kp: kp[0])]
        src = self.source
        if src is None:
            return ModelRequest(parts=parts)
        if len(parts) == len(src.parts) and all(map(lambda a, b: a is b, parts, src.parts)):
            return src
        return dataclasses.replace(src, parts=parts)


def from_messages(messages: Sequence[Any]) -> list[ModelMessage]:
    """A pydantic-ai history from ctxkeep messages (the inverse of :func:`to_messages`).

    Messages converted by :func:`to_messages` come back as their original objects when
    nothing changed, as copies with the change otherwise (a compressed tool return, a request
    that lost some parts); messages ctxkeep wrote itself (a synthetic result for an unanswered
    call, a summary) become new parts. A run of request parts becomes one ``ModelRequest``.

    Raises:
        InvalidMessageError: a malformed message (ctxkeep dicts are accepted too).

    """
    out: list[ModelMessage] = []
    group: _Group | None = None
    names: dict[str, str] = {}  # tool call id -> tool name, for results ctxkeep made up

    def flush() -> None:
        nonlocal group
        if group is not None and (group.parts or group.empty):
            out.append(group.build())
        group = None

    for m in coerce_messages(_check_list(messages)):
        src = _source(m)
        if m.role == "assistant":
            flush()
            resp = _response_from(m, src)
            names.update(
                (p.tool_call_id, p.tool_name) for p in resp.parts if isinstance(p, ToolCallPart)
            )
            out.append(resp)
            continue
        req = src.message if src is not None and isinstance(src.message, ModelRequest) else None
        other = group is not None and group.source is not None and group.source is not req
        if group is None or (req is not None and other):
            flush()
            group = _Group(req, [])
        elif req is not None and group.source is None:
            group.source = req  # parts ctxkeep added join the request that follows them
        if src is not None and src.part is None:
            group.empty = True
            continue
        last = group.parts[-1][0] if group.parts else -1.0
        key = float(src.part) if src is not None and src.part is not None else last + 1e-3
        group.parts.append((key, _part_from(m, src, names)))
    flush()
    return out


# -- the processor -----------------------------------------------------------------------------


class ProcessHistory:
    """A pydantic-ai history processor that keeps the history within an exact token budget.

    Call it with a ``list[ModelMessage]`` (it is a sync processor, which pydantic-ai runs in a
    worker thread); pass :meth:`as_capability` to ``Agent(capabilities=...)`` in pydantic-ai 2,
    or the processor itself to ``Agent(history_processors=...)`` in 1.x. One processor may serve
    many agents and runs at once; it remembers the conversion of the last few thousand
    messages it saw (by identity), so a step costs the messages added since the last one.

    Args:
        max_tokens: the most tokens the processed history may count (>= 1; default 6000).
        preserve_last_n: conversation messages to keep in full when they fit (see
            :class:`~ctxkeep.TokenPruner`).
        counter: the token counter, or the name of an encoding or model (default o200k_base).
        artifacts: where compressed tool returns' full texts go (default: an in-memory store
            owned by this processor).
        compress_threshold: old tool returns over this many tokens are compressed.
        excerpt_tokens: about how many tokens of head and tail a compressed return keeps.
        cache_stable: prune in jumps so that consecutive requests share their prefix (what
            provider prompt caches discount); see :class:`~ctxkeep.TokenPruner`.
        pruner: a configured :class:`~ctxkeep.TokenPruner` to use instead of the settings above
            (for a summarizer, say); pass either it or the settings.

    Raises:
        ConfigError: a bad setting, or ``pruner`` together with settings.

    """

    _CACHE_SIZE = 4096

    def __init__(
        self,
        max_tokens: int | None = None,
        *,
        preserve_last_n: int | None = None,
        counter: TokenCounter | str | None = None,
        artifacts: ArtifactStore | None = None,
        compress_threshold: int | None = 256,
        excerpt_tokens: int | None = None,
        cache_stable: bool | None = None,
        pruner: TokenPruner | None = None,
    ) -> None:
        if pruner is not None:
            given = [
                name
                for name, value in (
                    ("max_tokens", max_tokens),
                    ("preserve_last_n", preserve_last_n),
                    ("counter", counter),
                    ("artifacts", artifacts),
                    ("excerpt_tokens", excerpt_tokens),
                    ("cache_stable", cache_stable),
                )
                if value is not None
            ]
            if given or compress_threshold != 256:
                raise ConfigError(
                    "pass either pruner or the pruner's settings, not both (got pruner and "
                    + ", ".join(given or ["compress_threshold"])
                    + ")"
                )
            if not isinstance(pruner, TokenPruner):
                raise ConfigError(f"pruner must be a ctxkeep TokenPruner, got {describe(pruner)}")
            self.pruner = pruner
        else:
            if isinstance(counter, str):
                counter = get_counter(counter)
            self.pruner = TokenPruner(
                6000 if max_tokens is None else max_tokens,
                6 if preserve_last_n is None else preserve_last_n,
                counter,
                artifacts,
                compress_threshold=compress_threshold,
                excerpt_tokens=60 if excerpt_tokens is None else excerpt_tokens,
                cache_stable=cache_stable,
            )
        self.last_report: PruneReport | None = None
        """The report of the last call: what was kept, compressed and dropped, and why."""
        self._cache: OrderedDict[int, tuple[Any, list[Message]]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def max_tokens(self) -> int:
        """The token budget."""
        return self.pruner.max_token_budget

    @property
    def counter(self) -> TokenCounter:
        """The counter the budget is counted with."""
        return self.pruner.counter

    @property
    def artifacts(self) -> ArtifactStore:
        """The store that holds the full text of every compressed tool return."""
        return self.pruner.artifacts

    def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The history, pruned to the budget (the history processor)."""
        return self.process_with_report(messages)[0]

    def count_tokens(self, messages: Sequence[ModelMessage]) -> int:
        """The tokens of ``messages`` as this processor counts them against its budget."""
        return self.counter.count_messages(self._to_messages(messages))

    def process_with_report(
        self, messages: Sequence[ModelMessage]
    ) -> tuple[list[ModelMessage], PruneReport]:
        """Prune ``messages`` and say what happened to each converted message.

        The result is never empty and ends as the input does (a ``ModelRequest``, or the
        ``ModelResponse`` being resumed); the input is not modified.

        Raises:
            InvalidTypeError / InvalidMessageError: ``messages`` is not a list of pydantic-ai
                messages.
            BudgetExceededError: the system prompts and the newest user prompt alone (or the
                response being resumed) do not fit the budget.

        """
        history = list(_check_list(messages))
        if not history:
            raise InvalidMessageError("the history is empty: there is no request to send")
        tail: ModelResponse | None = None
        if isinstance(history[-1], ModelResponse):
            tail = history.pop()  # resuming a suspended response: it must stay last
        converted = self._to_messages(history)
        pruner = self.pruner if tail is None else self._pruner_before(tail)
        pruned, report = pruner.prune_with_report(converted)
        out = from_messages(pruned)
        if tail is not None:
            out.append(tail)
        elif not out or not isinstance(out[-1], ModelRequest):
            # Only when the last request was tool returns that did not fit, with no system or
            # user prompt to fall back on: there would be no request to send.
            last = converted[-1]
            if last.role == "tool":
                last = self.pruner.compress(last)
            raise BudgetExceededError(
                budget=self.max_tokens,
                required=self.counter.count_messages([last]),
                blocking=[
                    f"the last request's {last.role} message ({self.pruner.tokens(last)} tokens), "
                    "with no system or user prompt to send instead"
                ],
            )
        self.last_report = report
        return out, report

    def _pruner_before(self, tail: ModelResponse) -> TokenPruner:
        """A pruner like :attr:`pruner` whose budget leaves room for ``tail``, the response
        being resumed, which must stay last.
        """
        p = self.pruner
        room = p.max_token_budget - p.tokens(self._to_messages([tail])[0])
        if room < 1:
            raise BudgetExceededError(
                budget=p.max_token_budget,
                required=p.max_token_budget - room + 1,
                blocking=["the ModelResponse being resumed, which must stay last"],
            )
        return p.with_budget(room)

    def as_capability(self) -> Any:
        """This processor wrapped in pydantic-ai 2's ``ProcessHistory`` capability, for
        ``Agent(capabilities=[...])``.

        Raises:
            MissingDependencyError: the installed pydantic-ai has no capabilities (1.x: pass
                the processor to ``history_processors`` instead).

        """
        try:
            from pydantic_ai.capabilities import ProcessHistory as Capability
        except ImportError as exc:  # pragma: no cover - pydantic-ai 1.x
            raise MissingDependencyError("pydantic-ai-slim>=2", "pydantic-ai") from exc
        return Capability(self)

    def _to_messages(self, messages: Sequence[ModelMessage]) -> list[Message]:
        """:func:`to_messages`, each message's conversion reused while it is the same object
        (the same ctxkeep messages then keep their cached token counts).
        """
        out: list[Message] = []
        cache = self._cache
        for i, m in enumerate(_check_list(messages)):
            with self._lock:
                hit = cache.get(id(m))
                if hit is not None and hit[0] is m:
                    cache.move_to_end(id(m))
                    out.extend(hit[1])
                    continue
            converted = _convert(m, i)
            with self._lock:
                cache[id(m)] = (m, converted)  # the object is held, so its id stays its own
                if len(cache) > self._CACHE_SIZE:
                    cache.popitem(last=False)
            out.extend(converted)
        return out

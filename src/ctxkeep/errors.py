"""The errors ctxkeep raises: one root, typed leaves, messages that say what to do.

Every error derives from :class:`CtxkeepError`. Misuse errors are also ``ValueError``,
``TypeError`` or ``LookupError`` where that is what a Python user would catch::

    CtxkeepError
    ├── ConfigError (ValueError)                  a bad setting or config file
    │   ├── InvalidFilterError                    a search filter with an unknown key or bad value
    │   └── InvalidSettingError (+ InvalidTypeError) a setting of the wrong type
    ├── InvalidTypeError (TypeError)              an argument of the wrong type
    ├── MessageError (ValueError)                 a message ctxkeep cannot accept
    │   ├── InvalidMessageError                   malformed fields, wrong types, bad JSON
    │   │   └── UnknownRoleError                  a role no provider knows
    │   └── InvalidSequenceError                  not a valid provider sequence
    │       ├── OrphanToolResultError             a tool result without its call
    │       └── MissingToolResultError            a tool call without all its results
    ├── TokenizerError                            an encoding cannot be loaded
    │   └── UnknownEncodingError (ValueError)     an encoding or model name ctxkeep does not know
    ├── PromptTooLongError (ValueError)           the gate refused a prompt (carries a breakdown)
    ├── ContextWindowExceededError (ValueError)   the provider said the prompt overflows its window
    ├── BudgetExceededError (ValueError)          pruning cannot fit the must-keep messages
    ├── StaleTaskStateError (ValueError)          a task-state write based on an old version
    ├── UnknownAgentError (LookupError)           an agent the fabric does not know
    ├── ArtifactNotFoundError (LookupError)       no artifact under that ref
    ├── StorageError                              a backend failed (driver errors wrapped here)
    │   ├── SessionNotFoundError (LookupError)    no session with that id
    │   ├── SessionExistsError (ValueError)       a session with that id already exists
    │   ├── SessionChangedError                   a session changed under an atomic replace
    │   ├── MessageIdConflictError (ValueError)   another message is stored under that id
    │   ├── CheckpointNotFoundError (LookupError) no checkpoint with that id
    │   ├── EpisodeNotFoundError (LookupError)    no episode with that id
    │   ├── CorruptRecordError (ValueError)       a stored or encoded value that cannot be decoded
    │   ├── SchemaVersionError                    a stored record of an unknown version
    │   │   └── CognitiveStateSchemaVersionError  a CognitiveState newer than this ctxkeep
    │   └── RemoteError                           the service refused a request or is unreachable
    │       └── AuthenticationError               the service refused the API key (401)
    └── MissingDependencyError (ImportError)      an optional extra is not installed
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CtxkeepError(Exception):
    """The root of every error ctxkeep raises."""


class ConfigError(CtxkeepError, ValueError):
    """A setting (argument, environment variable or config file) is invalid."""


class InvalidFilterError(ConfigError):
    """A search filter names an unknown key or holds a value of the wrong kind."""


class InvalidTypeError(CtxkeepError, TypeError):
    """An argument has the wrong type; the message names the parameter and what it takes."""


class InvalidSettingError(ConfigError, InvalidTypeError):
    """A setting (a pruner's, a builder's, an adapter's) has the wrong type: a bad setting
    (``ConfigError``, ``ValueError``) and a wrong type (``InvalidTypeError``, ``TypeError``) at
    once, so the same mistake raises the same error wherever it is made, whichever of the two
    a caller catches.
    """


class MessageError(CtxkeepError, ValueError):
    """A message or message sequence cannot be accepted."""


class InvalidMessageError(MessageError):
    """A single message is malformed.

    Attributes:
        index: position of the message in the input list, when known.

    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        self.index = index
        prefix = f"message {index}: " if index is not None else ""
        super().__init__(prefix + message)


class UnknownRoleError(InvalidMessageError):
    """A message has a role no provider accepts."""


class InvalidSequenceError(MessageError):
    """A message list is not a valid provider sequence.

    Attributes:
        index: position of the first offending message.
        tool_call_id: the tool call id involved, if any.

    """

    def __init__(self, message: str, *, index: int, tool_call_id: str | None = None) -> None:
        self.index = index
        self.tool_call_id = tool_call_id
        super().__init__(f"message {index}: {message}")


class OrphanToolResultError(InvalidSequenceError):
    """A tool result has no matching tool call right before it."""


class MissingToolResultError(InvalidSequenceError):
    """An assistant tool call is not followed by a result for each of its ids."""


class TokenizerError(CtxkeepError):
    """A tokenizer could not be loaded."""


class UnknownEncodingError(TokenizerError, ValueError):
    """An encoding or model name that ctxkeep does not know."""


class PromptTooLongError(CtxkeepError, ValueError):
    """The gate refused a prompt that is over its limit.

    Attributes:
        limit: the maximum allowed, in ``unit``.
        actual: the size of the refused prompt, in ``unit``.
        unit: ``"characters"`` (code points) or ``"tokens"``.
        breakdown: the size of each role or section, in ``unit``.

    """

    def __init__(
        self, *, limit: int, actual: int, unit: str, breakdown: Mapping[str, int] | None = None
    ) -> None:
        self.limit = limit
        self.actual = actual
        self.unit = unit
        self.breakdown: dict[str, int] = dict(breakdown or {})
        parts = ", ".join(f"{k}={v}" for k, v in self.breakdown.items())
        detail = f" ({parts})" if parts else ""
        super().__init__(
            f"prompt exceeds maximum length of {limit} {unit}: it has {actual}, "
            f"{actual - limit} over{detail}"
        )

    @property
    def excess(self) -> int:
        """By how much the prompt is over the limit."""
        return self.actual - self.limit


class ContextWindowExceededError(CtxkeepError, ValueError):
    """The provider refused a prompt as longer than the model's context window.

    ctxkeep's gate let the prompt through (its count was an estimate, or the window it was
    given is larger than the model's), and the provider said no. The provider's own error is
    chained as ``__cause__``.

    Attributes:
        provider: ``"openai"`` or ``"anthropic"``.
        model: the model the request named.
        limit: the window the provider reported, in tokens, when it said.
        actual: the prompt's size the provider reported, in tokens, when it said.
        detail: the provider's error message.

    """

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        detail: str,
        limit: int | None = None,
        actual: int | None = None,
    ) -> None:
        self.provider = provider
        self.model = model
        self.detail = detail
        self.limit = limit
        self.actual = actual
        size = f" ({actual} tokens > {limit})" if limit is not None and actual is not None else ""
        super().__init__(
            f"{provider} refused the prompt as too long for {model}'s context window{size}: "
            f"{detail}. Give the client the model's real context_window (or a smaller "
            "max_prompt_tokens) so the gate stops such prompts, or prune the history harder."
        )


class BudgetExceededError(CtxkeepError, ValueError):
    """The messages that must be kept do not fit the token budget.

    Attributes:
        budget: the token budget.
        required: tokens the must-keep messages need after all compression.
        blocking: a description of each message in the way.

    """

    def __init__(self, *, budget: int, required: int, blocking: list[str]) -> None:
        self.budget = budget
        self.required = required
        self.blocking = list(blocking)
        super().__init__(
            f"cannot fit the prompt in {budget} tokens: the messages that are never dropped "
            f"need {required} tokens ({required - budget} over) after compression; in the way: "
            + "; ".join(self.blocking)
            + ". Raise the budget or shorten the system prompt / newest user message."
        )


class StaleTaskStateError(CtxkeepError, ValueError):
    """A compare-and-set update of shared task state was based on an old version.

    Attributes:
        task_id: the task.
        expected: the version the writer had read.
        current: the version the task is at now.

    """

    def __init__(self, task_id: str, expected: int, current: int) -> None:
        self.task_id = task_id
        self.expected = expected
        self.current = current
        super().__init__(
            f"task {task_id!r} is at version {current}, not {expected}: re-read the task "
            "context, re-apply the change and try again"
        )


class UnknownAgentError(CtxkeepError, LookupError):
    """The fabric or bus does not know this agent (it has joined no task)."""


class ArtifactNotFoundError(CtxkeepError, LookupError):
    """No artifact is stored under the given ref."""


class StorageError(CtxkeepError):
    """A storage backend failed; the driver's error is chained as ``__cause__``."""


class SessionNotFoundError(StorageError, LookupError):
    """No session with the given id."""


class SessionChangedError(StorageError):
    """The newest message of a session was no longer the one an atomic replace was based on
    (another writer appended or took one back meanwhile): nothing was changed; read again and
    retry.

    Attributes:
        session_id: the session.

    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} changed since its newest message was read; nothing was "
            "replaced: read it again and retry"
        )


class MessageIdConflictError(StorageError, ValueError):
    """A session already holds a different message under an id being appended. Appends are
    idempotent by message id (a retry of a stored message returns it and stores nothing), so
    an id may name one message only: nothing was stored; give the new message another id.

    Attributes:
        session_id: the session.
        message_id: the id in use.

    """

    def __init__(self, session_id: str, message_id: str) -> None:
        self.session_id = session_id
        self.message_id = message_id
        super().__init__(
            f"session {session_id!r} already holds another message with id {message_id!r}; "
            "nothing was stored: give the new message another id"
        )


class SessionExistsError(StorageError, ValueError):
    """A session with the given id already exists (pick another id, or delete it first).

    Attributes:
        session_id: the id in use.

    """

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} already exists; use another id")


class CheckpointNotFoundError(StorageError, LookupError):
    """No checkpoint with the given id."""


class EpisodeNotFoundError(StorageError, LookupError):
    """No episode with the given id (or id prefix)."""


class CorruptRecordError(StorageError, ValueError):
    """A stored or encoded value is corrupt: it is refused, never decoded into another value."""


class SchemaVersionError(StorageError):
    """A stored record has a schema version this ctxkeep cannot read."""


class CognitiveStateSchemaVersionError(SchemaVersionError):
    """A CognitiveState is newer than this ctxkeep knows how to read."""


class RemoteError(StorageError):
    """The service (``ctxkeep serve``) refused a request or could not be reached.

    Attributes:
        status: the HTTP status (None: no response).
        problem: the problem details the service sent (empty if none).

    """

    def __init__(
        self, message: str, *, status: int | None = None, problem: Mapping[str, Any] | None = None
    ) -> None:
        self.status = status
        self.problem: dict[str, Any] = dict(problem or {})
        super().__init__(message)


class AuthenticationError(RemoteError):
    """The service refused the API key (401): unknown, revoked or missing."""


class MissingDependencyError(CtxkeepError, ImportError):
    """An optional dependency is not installed; the message names the extra, and the pip
    command that installs it where this ctxkeep came from (:func:`install_command`).
    """

    def __init__(self, package: str, extra: str) -> None:
        self.package = package
        self.extra = extra
        super().__init__(
            f"{package} is not installed; it comes with the extra ctxkeep[{extra}]: "
            f"{install_command(extra)}"
        )


def install_command(extra: str | None = None) -> str:
    """The pip command that installs ctxkeep's ``extra`` (or ctxkeep itself) the way this
    ctxkeep was installed, so that it works where the user stands.

    ``pip install 'ctxkeep[server]'`` works only for a ctxkeep installed from a package index;
    a clone answers ``Could not find a version that satisfies the requirement``. pip records
    where a distribution came from in its ``direct_url.json`` (PEP 610), read here:

    ================================  ==================================================
    installed from                    command
    ================================  ==================================================
    a package index (no record)       ``pip install 'ctxkeep[server]'``
    a clone, editable (``-e .``)      ``pip install -e '.[server]'`` (the clone's path
                                      when the current directory is elsewhere)
    a clone (``pip install .``)       ``pip install '.[server]'`` (or the path)
    a wheel or sdist file             ``pip install 'ctxkeep[server] @ file:///...whl'``;
                                      the extra's own requirements once the file is gone
    a VCS URL (``git+https://...``)   ``pip install 'ctxkeep[server] @ git+https://...@REV'``
    a source tree on ``sys.path``     ``pip install -e '.[server]'`` (or the path)
    ================================  ==================================================
    """
    import json
    import shlex
    from importlib import metadata
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    suffix = f"[{extra}]" if extra else ""
    try:
        dist = metadata.distribution("ctxkeep")
    except metadata.PackageNotFoundError:
        root = Path(__file__).resolve().parents[2]  # src/ctxkeep/errors.py -> the tree
        if (root / "pyproject.toml").is_file():
            return f"pip install -e {shlex.quote(_here_or(root) + suffix)}"
        return f"pip install {shlex.quote('ctxkeep' + suffix)}"
    try:
        origin = json.loads(dist.read_text("direct_url.json") or "null")
    except ValueError:
        origin = None
    if not isinstance(origin, dict) or not isinstance(origin.get("url"), str):
        return f"pip install {shlex.quote('ctxkeep' + suffix)}"
    url: str = origin["url"]
    parsed = urlparse(url)
    local = Path(unquote(parsed.path)) if parsed.scheme == "file" else None
    if isinstance(origin.get("dir_info"), dict) and local is not None:
        editable = "-e " if origin["dir_info"].get("editable") else ""
        return f"pip install {editable}{shlex.quote(_here_or(local) + suffix)}"
    if isinstance(origin.get("vcs_info"), dict):
        vcs = origin["vcs_info"]
        rev = vcs.get("requested_revision") or vcs.get("commit_id")
        url = f"{vcs.get('vcs', 'git')}+{url}" + (f"@{rev}" if rev else "")
    elif local is not None and not local.exists():  # a wheel since deleted
        wanted = _extra_requirements(dist.requires or [], extra) if extra else ["ctxkeep"]
        return "pip install " + " ".join(shlex.quote(r) for r in wanted)
    return f"pip install {shlex.quote(f'ctxkeep{suffix} @ {url}')}"


def _here_or(path: Any) -> str:
    """``.`` when ``path`` is the current directory, else ``path`` itself."""
    from pathlib import Path

    try:
        return "." if Path(path).resolve() == Path.cwd().resolve() else str(path)
    except OSError:  # the current directory was removed
        return str(path)


def _extra_requirements(requires: list[str], extra: str) -> list[str]:
    """The requirements an extra adds (``Requires-Dist: x; extra == "name"``), ctxkeep's own
    extras it names (``ctxkeep[static]``) expanded.
    """
    import re

    out: list[str] = []
    todo, seen = [extra], set()
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        marker = re.compile(rf"""extra\s*==\s*["']{re.escape(name)}["']""")
        for line in requires:
            spec, _, condition = line.partition(";")
            if not marker.search(condition):
                continue
            spec = spec.strip()
            own = re.fullmatch(r"ctxkeep\s*\[([^\]]+)\]", spec)
            if own:
                todo.extend(e.strip() for e in own.group(1).split(","))
            elif spec not in out:
                out.append(spec)
    return out


def describe(value: Any, limit: int = 60) -> str:
    """A short repr of ``value`` for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

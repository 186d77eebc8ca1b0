"""The parts of :class:`~ctxkeep.integrations.langgraph.CtxkeepSaver` that hold no I/O.

The encoded rows a backend stores and returns (:class:`_Row`, :class:`_Write`, :class:`_Loaded`),
what a read asks for (:class:`_Query`), the primitives every backend implements
(:class:`_Backend`, written for SQL in ``_saver_sql`` and for Redis in ``_saver_redis``), and
the checks that turn a LangGraph config into ids (:class:`_Target`, :func:`_identifier`).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ctxkeep import _check
from ctxkeep.errors import ConfigError, InvalidTypeError, describe

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

META_KEY = "langgraph"
"""The saver's row in ``ctxkeep_meta`` (and field in the Redis meta hash)."""

Typed = tuple[str, bytes]
"""A value as ``serde.dumps_typed`` gives it: ``(type, bytes)``."""

EMPTY: Typed = ("empty", b"")
"""The blob of a channel that has a new version but no value (skipped when read)."""

NO_BLOBS: dict[str, Any] = {}
"""No channel versions to load, no blobs loaded: one shared empty dict, never changed, for
the usual row, whose values are all in it (a new one per row of a ``list`` was an object
more for the garbage collector to count)."""


# -- rows, free of I/O ------------------------------------------------------------------------


class _Row(NamedTuple):
    """One stored checkpoint, encoded (a named tuple: many are made per ``list``)."""

    thread_id: str
    """The thread."""
    checkpoint_ns: str
    """The namespace (``""``: the root graph)."""
    checkpoint_id: str
    """The checkpoint's id (ordered: a later checkpoint has a larger id)."""
    parent_id: str | None
    """The id of the checkpoint it continues."""
    run_id: str | None
    """The metadata's ``run_id``, kept apart for ``delete_for_runs``."""
    checkpoint: Typed
    """The checkpoint: without its channel values where ``blob_channels`` is ``None``, else
    with those held in the row (see :attr:`_Backend.inline_values`)."""
    metadata: Typed
    """The checkpoint's metadata."""
    blob_channels: str | None = None
    """``None``: every channel value is a blob (the first layout, and Redis's). Else the
    channels whose values are blobs (unchanged values too large to copy into each row), as a
    JSON list, ``""`` for none; the other values are in ``checkpoint``."""


class _Write(NamedTuple):
    """One pending write, encoded."""

    task_id: str
    """The task that wrote it."""
    idx: int
    """Its position in the task's writes (negative for the special channels)."""
    channel: str
    """The channel written."""
    value: Typed
    """The value."""
    task_path: str = ""
    """The task's path (the first sort key of a super-step's writes)."""


class _Query(NamedTuple):
    """Which checkpoints a read wants, newest first (a named tuple: one is made per
    ``get_tuple``, a frozen dataclass took 2.7 µs).
    """

    thread_id: str | None = None
    """One thread, or every thread."""
    checkpoint_ns: str | None = None
    """One namespace, or every namespace."""
    checkpoint_id: str | None = None
    """One checkpoint."""
    before: str | None = None
    """Only checkpoints with a smaller id."""
    limit: int | None = None
    """At most this many accepted checkpoints."""
    filtered: bool = False
    """Whether ``accept`` may refuse rows (then no row limit is pushed to the engine)."""


class _Loaded(NamedTuple):
    """A checkpoint row with the blobs and writes it needs."""

    row: _Row
    """The checkpoint."""
    decoded: Any
    """What ``accept`` decoded of the row."""
    blobs: dict[str, Typed]
    """Channel → value, for the checkpoint's channel versions found."""
    writes: list[_Write]
    """Its pending writes, unordered."""


Accept = Callable[[_Row], "tuple[dict[str, str], Any] | None"]
"""Decides on a row: ``None`` skips it, else ``(the channel versions to load with it, what
was decoded of it)``."""


class _Backend(ABC):
    """The storage primitives of one engine, over encoded rows."""

    inline_values = False
    """Whether the checkpoint's row holds its channel values (``_Row.blob_channels`` set):
    then ``put``'s blobs are only unchanged values too large to copy into each row, each
    stored if its version has none yet."""

    @abstractmethod
    def put(self, row: _Row, blobs: dict[str, tuple[str, Typed]]) -> None:
        """Store a checkpoint and blobs (channel → (version, value)): the values of its new
        versions, replacing any stored under them; where :attr:`inline_values`, the large
        unchanged values, kept where stored.
        """

    @abstractmethod
    def put_writes(self, thread_id: str, ns: str, checkpoint_id: str, writes: list[_Write]) -> None:
        """Store writes: a write with ``idx >= 0`` that exists is kept, a special one replaced."""

    @abstractmethod
    def read(self, query: _Query, accept: Accept) -> Iterable[_Loaded]:
        """The checkpoints ``query`` asks for and ``accept`` takes, newest first, loaded (an
        iterator may make each as it is taken, after the engine was read; where no row can be
        refused, ``not query.filtered``, it may call ``accept`` on each row then).
        """

    @abstractmethod
    def delete_thread(self, thread_id: str) -> None:
        """Delete everything of a thread."""

    @abstractmethod
    def delete_runs(self, run_ids: list[str]) -> None:
        """Delete the checkpoints (and their writes) made by these runs."""

    @abstractmethod
    def copy_thread(self, source: str, target: str) -> None:
        """Copy every checkpoint, blob and write of ``source`` to ``target``."""

    @abstractmethod
    def keep_latest(self, thread_id: str, versions: Callable[[Typed], dict[str, str]]) -> None:
        """Keep the newest checkpoint of each namespace of a thread, its writes and the blobs
        it needs (``versions`` reads a stored checkpoint's channel versions); drop the rest.
        """

    @abstractmethod
    def close(self) -> None:
        """Release connections."""


# -- configs and values, free of I/O -------------------------------------------------------------


def _identifier(name: str, value: Any) -> str:
    """An id of a config (a string; a thread id may also be an int or a UUID, kept as text)."""
    if (  # the usual id, at once (ASCII: no lone surrogate to look for)
        type(value) is str
        and value.isascii()
        and "\0" not in value
        and (value or name == "checkpoint_ns")
    ):
        return value
    if isinstance(value, bool):
        raise InvalidTypeError(f"{name} must be a string, got bool")
    if name in ("thread_id", "run_id") and isinstance(value, int | uuid.UUID):
        value = str(value)
    _check.text(name, value, empty=name == "checkpoint_ns")
    if "\0" in value:
        raise ConfigError(f"{name} must not hold a NUL character: {describe(value)}")
    return cast(str, value)


def _configurable(config: Any, what: str = "config") -> Mapping[str, Any]:
    if type(config) is not dict and not isinstance(config, Mapping):  # a dict: no ABC check
        raise InvalidTypeError(f"{what} must be a RunnableConfig mapping, got {describe(config)}")
    conf = config.get("configurable")
    if (type(conf) is not dict and not isinstance(conf, Mapping)) or conf.get("thread_id") is None:
        raise ConfigError(
            f"{what} needs a thread id: pass {{'configurable': {{'thread_id': ...}}}}, "
            f"got {describe(config)}"
        )
    return conf


def _ids(name: str, value: Any, item: str) -> list[str]:
    """A sequence of ids (``thread_ids``, ``run_ids``), each checked."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | AbstractSet):
        raise InvalidTypeError(f"{name} must be a sequence of ids, got {describe(value)}")
    return [_identifier(item, v) for v in value]


class _Target(NamedTuple):
    """What a config names: a thread, a namespace (``None``: any) and maybe one checkpoint
    (a named tuple: a step makes three).
    """

    thread_id: str
    """The thread."""
    checkpoint_ns: str | None
    """The namespace, ``None`` for any (only ``list`` asks for that)."""
    checkpoint_id: str | None
    """One checkpoint (for ``put``: the parent of the new one)."""

    @classmethod
    def of(cls, config: Any, *, default_ns: str | None = "", what: str = "config") -> _Target:
        conf = _configurable(config, what)
        ns = conf.get("checkpoint_ns", default_ns)
        cid = conf.get("checkpoint_id") or None
        thread_id = conf["thread_id"]
        if type(thread_id) is str and type(ns) is str and type(cid) is str and thread_id:
            # A step's configs (three ids, each a string: a namespace may be empty, the
            # others are not) checked at once, as _identifier checks each: a step named
            # nine ids by nine calls, a third of its configs' checking.
            ids = thread_id + ns + cid
            if ids.isascii() and "\0" not in ids:
                return tuple.__new__(cls, (thread_id, ns, cid))
        return cls(
            thread_id=_identifier("thread_id", conf["thread_id"]),
            checkpoint_ns=None if ns is None else _identifier("checkpoint_ns", ns),
            checkpoint_id=None if cid is None else _identifier("checkpoint_id", cid),
        )


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _versions(checkpoint: Mapping[str, Any]) -> dict[str, str]:
    """A checkpoint's channel versions as the text its blobs are keyed by."""
    versions = checkpoint.get("channel_versions") or {}
    return {str(ch): str(v) for ch, v in versions.items()}

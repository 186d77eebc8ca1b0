"""A LangGraph checkpointer over ctxkeep's engine clients: SQLite, PostgreSQL and Redis.

:class:`CtxkeepSaver` is a ``BaseCheckpointSaver`` (sync and async) that passes LangGraph's
own conformance suite (``langgraph-checkpoint-conformance``, base and extended capabilities)
on every engine::

    from ctxkeep.integrations.langgraph import CtxkeepSaver

    with CtxkeepSaver("postgresql://localhost/app") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "user-42"}})

What is stored: a checkpoint, its metadata and its parent's id; its channel values; and the
pending writes of each checkpoint, keyed by ``(task_id, idx)``. On Redis each channel value is
a *blob*, stored once per ``(thread, namespace, channel, version)``, the checkpoint without
its values (as LangGraph's ``PostgresSaver`` stores them). On SQLite and PostgreSQL the
checkpoint's row holds its values (as ``SqliteSaver``'s does: a step writes one row and a read
joins nothing; issue 26), but an unchanged value larger than :data:`INLINE_UNCHANGED`, which
is a blob of its version, so a step that changes one channel does not copy a large state
again; rows of the first layout (every value a blob) are read as they were. Every value goes
through the saver's ``serde`` (LangGraph's ``JsonPlusSerializer`` by default) as a
``(type, bytes)`` pair. Channel versions are strings
with a random fraction (as ``InMemorySaver`` makes them), so two forks of one thread never
write one blob key with different values.

How the parts fit. The saver validates configs, encodes and decodes values and filters
metadata, free of I/O (with the checks in ``_saver_common``); a backend (:class:`_SQLBackend`
in ``_saver_sql`` for SQLite and PostgreSQL, written once with ``?`` placeholders, and
:class:`_RedisBackend` in ``_saver_redis``) implements a few primitives over encoded
rows: ``put``, ``put_writes``, ``read``, ``delete_thread``, ``delete_runs``, ``copy_thread``
and ``keep_latest``. Connections, transactions, driver-error translation and schema versions are the
engine clients' (``ctxkeep._sqlite``, ``ctxkeep._pg``, ``ctxkeep._redis``): the layout's
version is the ``langgraph`` row of ``ctxkeep_meta`` (the ``langgraph`` field of the Redis
``{prefix}meta`` hash), and a newer one is refused with
:class:`~ctxkeep.errors.SchemaVersionError`.

SQL tables: ``ctxkeep_lg_checkpoints`` (``blob_channels``: which of its values are blobs;
``NULL`` in a row of the first layout; the checkpoint stored with an empty ``id``, the row's
``checkpoint_id`` saying it, since schema 3), ``ctxkeep_lg_blobs`` and ``ctxkeep_lg_writes``. A read
(``get_tuple``, ``list``) runs in one read transaction (a snapshot), a write in one write
transaction. Redis keys, under the URL's ``?prefix=`` (``ctxkeep:`` by default), with each id
percent-encoded so that no id can forge another key:

======================================================  ======  ==================================
key                                                     type    holds
======================================================  ======  ==================================
``langgraph:threads``                                   set     every thread id
``langgraph:thread:{t}:namespaces``                     set     the thread's namespaces
``langgraph:thread:{t}:ns:{n}:checkpoints``             zset    checkpoint ids (score 0, lex order)
``langgraph:thread:{t}:ns:{n}:checkpoint:{id}``         hash    parent, run id, checkpoint, metadata
``langgraph:thread:{t}:ns:{n}:writes:{id}``             hash    ``{task}:{idx}`` → pending write
``langgraph:thread:{t}:ns:{n}:blobs``                   hash    ``{channel}:{version}`` → value
``langgraph:run:{run_id}``                              set     the run's checkpoints
======================================================  ======  ==================================

Bytes are base64 text in Redis (the engine client speaks strings). A Redis write is one
``MULTI``/``EXEC``; a read takes a few round trips and is not a snapshot.

Costs and limits: the ``a*`` methods run the sync ones in a worker thread
(``asyncio.to_thread``; ``alist`` gathers its results there first). ``list`` filters metadata
in Python by equality, after reading the candidate rows. ``delete_for_runs`` leaves the blobs
of deleted checkpoints (other checkpoints may share them) until the thread is pruned or
deleted; ``prune(strategy="keep_latest")`` keeps the newest checkpoint of each namespace and
the blobs it needs, and drops the rest, ancestors included (LangGraph's beta ``DeltaChannel``
would then rebuild from the kept checkpoint alone).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from operator import attrgetter
from typing import Any
from urllib.parse import urlparse

from ctxkeep import _check
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidTypeError,
    MissingDependencyError,
    describe,
)
from ctxkeep.integrations.langgraph._saver_common import (
    EMPTY,
    NO_BLOBS,
    Typed,
    _Backend,
    _config,
    _identifier,
    _ids,
    _Loaded,
    _Query,
    _Row,
    _Target,
    _versions,
    _Write,
)
from ctxkeep.integrations.langgraph._saver_common import META_KEY as META_KEY
from ctxkeep.integrations.langgraph._saver_redis import _RedisBackend
from ctxkeep.integrations.langgraph._saver_sql import POSTGRES_MIGRATIONS as POSTGRES_MIGRATIONS
from ctxkeep.integrations.langgraph._saver_sql import SQLITE_MIGRATIONS as SQLITE_MIGRATIONS
from ctxkeep.integrations.langgraph._saver_sql import _PostgresBackend, _SQLiteBackend

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langgraph", "langgraph") from exc

__all__ = ["CtxkeepSaver"]
# META_KEY, SQLITE_MIGRATIONS and POSTGRES_MIGRATIONS (imported above ``as`` themselves) live
# with the parts that use them and stay importable from here, where they were first defined.

PRUNE_STRATEGIES = ("keep_latest", "delete")

INLINE_UNCHANGED = 2048
"""The largest unchanged channel value (serialized bytes) a SQL checkpoint's row copies; a
larger one stays a blob of its version (see :meth:`CtxkeepSaver._inline`)."""


WRITE_ORDER = attrgetter("task_path", "task_id", "idx")
"""The order of a checkpoint's writes: LangGraph's ``writes_sort_key(task_path, task_id, idx)``
(which is that tuple) read in C from a stored write, no Python call per write."""

_PAIRS = (tuple, list)


def _corrupt(what: str, name: str | None, exc: BaseException) -> CorruptRecordError:
    """The error of a stored value the serde refused: ``what`` (``name`` quoted after it)."""
    named = what if name is None else f"{what} {name!r}"
    return CorruptRecordError(f"stored {named} cannot be decoded: {exc}")


# -- opening ------------------------------------------------------------------------------------


def _open_backend(url: str | None) -> _Backend:
    """The backend for a URL (``None``: the embedded default SQLite file)."""
    if url is None:
        from ctxkeep.sessions import default_url

        url = default_url()
    _check.url("url", url)
    scheme = urlparse(url).scheme
    if scheme == "sqlite":
        path = url[len("sqlite:///") :].split("?", 1)[0] if url.startswith("sqlite:///") else ""
        if not path:
            raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
        if path == ":memory:":  # one database per thread: the a* methods would not share it
            raise ConfigError("an in-memory SQLite saver is not shared between threads; use a file")
        return _SQLiteBackend(path)
    if scheme in ("postgresql", "postgres"):
        return _PostgresBackend(url)
    if scheme in ("redis", "rediss", "unix"):
        return _RedisBackend(url)
    hint = " (for a saver in this process only, use LangGraph's InMemorySaver)"
    raise ConfigError(
        f"unsupported LangGraph checkpointer URL {url!r}; use sqlite:///path, "
        "postgresql://... or redis://host:port/db" + (hint if scheme == "memory" else "")
    )


# -- the saver ------------------------------------------------------------------------------------


class CtxkeepSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer over SQLite, PostgreSQL or Redis (see the module docstring).

    Args:
        url: ``sqlite:///path.db``, ``postgresql://...`` or ``redis://host:port/db`` (with
            ``?prefix=`` for the keys); ``None``: the embedded default SQLite file, as every
            ctxkeep store resolves it (``CTXKEEP_DB`` or the user's data folder).
        serde: how checkpoints, channel values, metadata and writes become bytes (default:
            LangGraph's ``JsonPlusSerializer``).

    Raises:
        ConfigError: an unsupported or malformed URL.
        MissingDependencyError: the engine's extra (``redis``, ``postgres``) is not installed.
        StorageError: the engine does not answer or cannot be set up.
        SchemaVersionError: the store holds LangGraph checkpoints of a newer ctxkeep.

    Configs are LangGraph's: ``{"configurable": {"thread_id", "checkpoint_ns",
    "checkpoint_id"}}``. A config without a thread id raises ``ConfigError``, one of the wrong
    shape ``InvalidTypeError``; a stored value that cannot be decoded raises
    ``CorruptRecordError``.

    """

    def __init__(self, url: str | None = None, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._backend = _open_backend(url)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engine's connections (idempotent)."""
        self._backend.close()

    def __enter__(self) -> CtxkeepSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CtxkeepSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- encoding -------------------------------------------------------------------------

    def _dump(self, value: Any, what: str, name: str | None = None) -> Typed:
        """``value`` encoded; ``what`` and ``name`` as :meth:`_load`'s."""
        try:
            return self.serde.dumps_typed(value)
        except (TypeError, ValueError) as exc:
            named = what if name is None else f"{what} {name!r}"
            raise InvalidTypeError(
                f"{named} cannot be serialized by {type(self.serde).__name__}: {exc}"
            ) from exc

    def _load(self, value: Typed, what: str, name: str | None = None) -> Any:
        """``value`` decoded; ``what`` (and ``name``, quoted after it) says what it is in the
        error, written only then (not an f-string per value).
        """
        try:
            return self.serde.loads_typed(value)
        except Exception as exc:  # any decoder's refusal: the record is corrupt
            raise _corrupt(what, name, exc) from exc

    def _tuple(self, loaded: _Loaded, checkpoint: Checkpoint, metadata: Any) -> CheckpointTuple:
        """The result of a read checkpoint. Its writes and its row's decoding call the serde
        in place, not through :meth:`_load` (a call less each, and no sort key in Python):
        with ``_config``'s dicts written out, ten Python calls fewer a checkpoint (callgrind,
        bench/peers.py's thread of 1,000: its ``list`` 398 -> 392 million instructions, a
        step 847,000 -> 837,000).
        """
        if loaded.blobs or "channel_values" not in checkpoint:  # else all in the row, decoded
            checkpoint = {
                **checkpoint,
                "channel_values": {
                    **(checkpoint.get("channel_values") or {}),
                    **{
                        ch: self._load(v, "value of channel", ch)
                        for ch, v in loaded.blobs.items()
                        if v[0] != EMPTY[0]
                    },
                },
            }
        writes = loaded.writes
        if len(writes) > 1:
            writes = sorted(writes, key=WRITE_ORDER)
        loads = self.serde.loads_typed
        pending = []
        for task_id, _, channel, value, _ in writes:
            try:
                pending.append((task_id, channel, loads(value)))
            except Exception as exc:  # as _load raises it
                raise _corrupt("write to", channel, exc) from exc
        t, ns, cid, parent = loaded.row[:4]
        return CheckpointTuple(  # by position: keywords cost a named tuple's constructor more
            {"configurable": {"thread_id": t, "checkpoint_ns": ns, "checkpoint_id": cid}},
            checkpoint,
            metadata,
            (
                {"configurable": {"thread_id": t, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent
                else None
            ),
            pending,
        )

    def _read(
        self, query: _Query, filter: Mapping[str, Any] | None = None
    ) -> list[CheckpointTuple]:
        if query.limit == 0:
            return []

        loads = self.serde.loads_typed

        def accept(row: _Row) -> tuple[dict[str, str], Any] | None:
            try:
                metadata = loads(row.metadata)
            except Exception as exc:  # as _load raises it
                raise _corrupt("checkpoint metadata", None, exc) from exc
            if filter and not (
                isinstance(metadata, Mapping)
                and all(k in metadata and metadata[k] == v for k, v in filter.items())
            ):
                return None
            try:
                checkpoint = loads(row.checkpoint)
            except Exception as exc:
                raise _corrupt("checkpoint", None, exc) from exc
            if type(checkpoint) is dict and checkpoint.get("id") == "":  # stored without it
                checkpoint["id"] = row.checkpoint_id
            if row.blob_channels is None:  # every value a blob
                return _versions(checkpoint), (checkpoint, metadata)
            if not row.blob_channels:
                return NO_BLOBS, (checkpoint, metadata)
            versions = checkpoint.get("channel_versions") or {}
            apart = {str(ch): str(versions[ch]) for ch in json.loads(row.blob_channels)}
            return apart, (checkpoint, metadata)

        return [self._tuple(x, *x.decoded) for x in self._backend.read(query, accept)]

    # -- the sync interface ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, else the thread's newest in
        its namespace), with its pending writes in ``writes_sort_key`` order; ``None`` if none.
        """
        target = _Target.of(config)
        # thread, namespace, checkpoint (None: the newest), before, limit, filtered; made as
        # _Target.of makes its tuple (a named tuple's own constructor cost 2,000 instructions)
        found = self._read(tuple.__new__(_Query, (*target, None, 1, False)))
        return found[0] if found else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (every thread if ``None``), of its
        ``checkpoint_ns`` if it has one (else every namespace), whose metadata equals
        ``filter`` on each of its keys, older than ``before``'s checkpoint, at most ``limit``.
        """
        return iter(self._read(self._list_query(config, filter, before, limit), filter))

    def _list_query(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> _Query:
        target = None if config is None else _Target.of(config, default_ns=None)
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidTypeError(f"filter must be a mapping, got {describe(filter)}")
        before_id = None
        if before is not None:
            if not isinstance(before, Mapping):
                raise InvalidTypeError(f"before must be a RunnableConfig, got {describe(before)}")
            raw = (
                get_checkpoint_id(before)
                if isinstance(before.get("configurable"), Mapping)
                else None
            )
            before_id = None if raw is None else _identifier("checkpoint_id", raw)
        return _Query(
            thread_id=None if target is None else target.thread_id,
            checkpoint_ns=None if target is None else target.checkpoint_ns,
            checkpoint_id=None if target is None else target.checkpoint_id,
            before=before_id,
            limit=_check.optional_integer("limit", limit, minimum=0),
            filtered=bool(filter),
        )

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint (its parent is ``config``'s ``checkpoint_id``) with the values of
        the channels in ``new_versions``; the config that names it.
        """
        target = _Target.of(config)
        # a dict at once: isinstance(..., Mapping) asks the ABC in Python (2,500 instructions)
        if (type(checkpoint) is not dict and not isinstance(checkpoint, Mapping)) or type(
            checkpoint.get("id")
        ) is not str:
            raise InvalidTypeError(
                f"checkpoint must be a Checkpoint dict, got {describe(checkpoint)}"
            )
        if type(new_versions) is not dict and not isinstance(new_versions, Mapping):
            raise InvalidTypeError(f"new_versions must be a mapping, got {describe(new_versions)}")
        cid = _identifier("checkpoint id", checkpoint["id"])
        ns = target.checkpoint_ns or ""
        if self._backend.inline_values:
            stored, blobs, apart = self._inline(checkpoint, new_versions)
        else:
            stored = {k: v for k, v in checkpoint.items() if k != "channel_values"}
            values = checkpoint.get("channel_values") or {}
            blobs = {
                str(ch): (
                    str(ver),
                    self._dump(values[ch], "channel", ch) if ch in values else EMPTY,
                )
                for ch, ver in new_versions.items()
            }
            apart = None
        md = get_serializable_checkpoint_metadata(config, metadata)
        run_id = md.get("run_id")
        row = tuple.__new__(  # every field, in order (as get_tuple makes its _Query)
            _Row,
            (
                target.thread_id,
                ns,
                cid,
                target.checkpoint_id,
                None if run_id is None else _identifier("run_id", str(run_id)),
                self._dump(stored, "checkpoint"),
                self._dump(md, "metadata"),
                apart,
            ),
        )
        self._backend.put(row, blobs)
        return _config(target.thread_id, ns, cid)

    def _inline(
        self, checkpoint: Checkpoint, new_versions: ChannelVersions
    ) -> tuple[dict[str, Any], dict[str, tuple[str, Typed]], str]:
        """What a backend that keeps values in the row stores (``inline_values``): the
        checkpoint with the values it keeps there, the blobs of the rest, and the JSON list of
        their channels.

        The row keeps the values of the checkpoint's new versions (each stored once, wherever
        it goes: in the row it costs no row of its own to write and read) and the unchanged
        values of up to :data:`INLINE_UNCHANGED` bytes (each copied into every row, as
        ``SqliteSaver`` copies the whole state). A larger unchanged value is a blob of its
        version, written if none is stored (a value first stored in a row has none), so a
        step copies it no more. A channel with a version and no value has none to store.
        """
        values = checkpoint.get("channel_values") or {}
        kept: dict[str, Any] = {}
        blobs: dict[str, tuple[str, Typed]] = {}
        for ch, ver in (checkpoint.get("channel_versions") or {}).items():
            if ch not in values:
                continue
            if ch in new_versions:
                kept[ch] = values[ch]
                continue
            typed = self._dump(values[ch], "channel", ch)
            if len(typed[1]) <= INLINE_UNCHANGED:
                kept[ch] = values[ch]
            else:
                blobs[str(ch)] = (str(ver), typed)
        # The id once, in the row's checkpoint_id: an empty one here (where it was, so the
        # dict read back keeps its order), set again when read (38 bytes a row: schema 3).
        stored = {**checkpoint, "id": "", "channel_values": kept}
        return stored, blobs, json.dumps(list(blobs)) if blobs else ""

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes for the checkpoint ``config`` names: a regular write already
        stored under ``(task_id, idx)`` is kept, a special one (error, interrupt...) replaced.
        """
        target = _Target.of(config)
        if target.checkpoint_id is None:
            raise ConfigError("put_writes needs the config of a checkpoint (a checkpoint_id)")
        task_id = _identifier("task_id", task_id)
        task_path = _identifier("task_path", task_path) if task_path else ""
        rows: list[_Write] = []
        for idx, pair in enumerate(writes):
            if not isinstance(pair, _PAIRS) or len(pair) != 2:  # a tuple of types: no union made
                raise InvalidTypeError(f"writes[{idx}] must be a (channel, value) pair")
            channel = _identifier("channel", pair[0])
            rows.append(  # every field, in order (as get_tuple makes its _Query)
                tuple.__new__(
                    _Write,
                    (
                        task_id,
                        WRITES_IDX_MAP.get(channel, idx),
                        channel,
                        self._dump(pair[1], "write to", channel),
                        task_path,
                    ),
                )
            )
        if rows:
            ns = target.checkpoint_ns or ""
            self._backend.put_writes(target.thread_id, ns, target.checkpoint_id, rows)

    def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, value and write of a thread (nothing if it has none)."""
        self._backend.delete_thread(_identifier("thread_id", thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints made by these runs (their metadata's ``run_id``), with their
        writes, in every thread and namespace.
        """
        ids = _ids("run_ids", run_ids, "run_id")
        if ids:
            self._backend.delete_runs(ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value and write of one thread to another (a checkpoint the
        target already has under the same id is replaced).
        """
        source = _identifier("thread_id", source_thread_id)
        target = _identifier("thread_id", target_thread_id)
        if source != target:
            self._backend.copy_thread(source, target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``"keep_latest"`` keeps the newest checkpoint of each namespace (its
        writes and values), ``"delete"`` deletes the threads.

        Raises:
            ConfigError: an unknown strategy.

        """
        if strategy not in PRUNE_STRATEGIES:
            raise ConfigError(
                f"strategy must be one of {', '.join(PRUNE_STRATEGIES)}, got {strategy!r}"
            )
        ids = _ids("thread_ids", thread_ids, "thread_id")
        for t in ids:
            if strategy == "delete":
                self._backend.delete_thread(t)
            else:
                self._backend.keep_latest(t, lambda c: _versions(self._load(c, "checkpoint")))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """The version after ``current``: the next integer with a random fraction, so that two
        forks of one thread never give one channel the same version.
        """
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- the async interface: the sync methods in a worker thread -------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`get_tuple` in a worker thread."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """:meth:`list`, its results gathered in a worker thread."""
        query = self._list_query(config, filter, before, limit)
        for item in await asyncio.to_thread(self._read, query, filter):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`put` in a worker thread."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """:meth:`put_writes` in a worker thread."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """:meth:`delete_thread` in a worker thread."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`delete_for_runs` in a worker thread."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`copy_thread` in a worker thread."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`prune` in a worker thread."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

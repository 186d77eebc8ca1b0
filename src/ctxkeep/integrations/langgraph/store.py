"""A LangGraph ``BaseStore`` over ctxkeep's episodic stores: :class:`CtxkeepStore`.

LangGraph agents keep long-term memories in a store (``graph.compile(store=...)``, then
``get_store()`` or a node's ``store`` argument). LangGraph's own stores recall by dense
similarity alone; this one recalls through :meth:`EpisodicMemoryStore.search
<ctxkeep.episodic.EpisodicMemoryStore.search>`, so a query finds an item by its exact rare
words (BM25) as well as by meaning, the two scores fused::

    from ctxkeep.integrations.langgraph import CtxkeepStore

    store = CtxkeepStore("sqlite:///memories.db", index={"fields": ["text"]})
    store.put(("user-42", "memories"), "m1", {"text": "allergic to penicillin"})
    store.search(("user-42",), query="which antibiotics to avoid?")

How an item is kept. Two parts, both in the store the URL names (``memory://``,
``sqlite:///path`` or ``postgresql://...``):

* the **item table** (``ctxkeep_langgraph_items``, beside the episodes in the same SQLite file
  or PostgreSQL database; a dict for ``memory://``) holds each item's namespace, key, value
  (JSON), times, TTL and the id of its episode. It is the truth: ``get``, filters, namespace
  listings and TTL read only it, and a TTL refresh is one ``UPDATE``;
* the **episodic store** holds one episode per indexed item version: its text is the item's
  indexed fields (``index["fields"]``, default ``["$"]``: the whole value as JSON), joined by
  newlines into one document, which BM25 and the embedder both see (LangGraph embeds each
  field separately and keeps the best; one document per item lets the words of every field
  count together). Each episode has a session of its own, so no item's words or vector leak
  into another's (ctxkeep smooths scores over a session's neighbours).

A put saves the new episode, then writes the row (keeping ``created_at`` of a live item), then
forgets the episode the row pointed at; a crash in between leaves at most an orphan episode,
which no search returns (searches are scoped to the episodes live rows point at). An item put
with ``index=False``, or whose fields hold no text, has no episode.

Semantics, as ``InMemoryStore`` unless said:

* a batch's reads (gets, searches, listings) see the store as it was before the batch's puts;
  puts to one key keep the last;
* ``search`` without a query returns the matching items newest-updated first (as LangGraph's
  SQLite and PostgreSQL stores), with ``score=None``; with a query, the items with an episode
  ranked best first, ``score`` being the fused z-score (not a cosine: unbounded, comparable
  within one search only), then every other matching item with ``score=None``, so pages
  (``offset``, ``limit``) cover every match exactly once;
* filters compare value fields: a plain value must equal (JSON equality: ``1`` equals ``1.0``
  but ``true`` is not ``1``), a mapping without operators matches the fields it names, a list
  matches item by item, and ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte`` compare
  (order only between two numbers or two strings; anything else does not match, where
  ``InMemoryStore`` raises);
* TTLs are in minutes; an expired item is never returned or listed, even before
  :meth:`CtxkeepStore.sweep_ttl` deletes it; a read refreshes the TTL of what it returns when
  its ``refresh_ttl`` says so; a put over an expired item creates a new one;
* a namespace whose items were all deleted or expired is not listed (``InMemoryStore`` keeps
  listing it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import math
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from ctxkeep import _check
from ctxkeep._db import Database, placeholders
from ctxkeep.episodic import EpisodicMemoryStore, MemoryEpisodicStore, open_episodic
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.episodic.filters import json_equal
from ctxkeep.errors import ConfigError, InvalidFilterError, InvalidTypeError, MissingDependencyError
from ctxkeep.sessions.records import dumps, loads

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        MatchCondition,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        get_text_at_path,
        tokenize_path,
        validate_op_namespace,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("langgraph", "langgraph") from exc

__all__ = ["CtxkeepStore"]

logger = logging.getLogger(__name__)

AGENT = "langgraph-store"
"""The ``agent_id`` of every episode the store saves."""
TABLE = "ctxkeep_langgraph_items"
"""The item table."""
MIGRATIONS = [
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        namespace TEXT NOT NULL,
        item_key TEXT NOT NULL,
        value TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        ttl_minutes DOUBLE PRECISION,
        episode_id TEXT,
        PRIMARY KEY (namespace, item_key)
    );
    CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (expires_at)""",
]
"""The item table's schema, one SQL text for SQLite and PostgreSQL (position = version)."""

OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
"""The comparison operators a filter may use."""

Key = tuple[str, str]
"""An item's address: its namespace as text (labels joined by ``.``) and its key."""


# -- rows: the item table's records, I/O-free --------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Row:
    """One stored item, as the item table keeps it."""

    namespace: str
    """The namespace's labels joined by ``.`` (labels cannot hold one)."""
    key: str
    """The item's key."""
    value: str
    """The value as JSON text."""
    created_at: float
    """Unix time the item was first put (kept across updates)."""
    updated_at: float
    """Unix time of the last put."""
    expires_at: float | None = None
    """Unix time it expires (``None``: never)."""
    ttl: float | None = None
    """Its TTL in minutes, to refresh ``expires_at`` by (``None``: none)."""
    episode_id: str | None = None
    """The episode that indexes it (``None``: not indexed)."""

    @property
    def address(self) -> Key:
        """``(namespace, key)``."""
        return self.namespace, self.key

    def live(self, now: float) -> bool:
        """Whether the item has not expired at ``now``."""
        return self.expires_at is None or self.expires_at > now

    def item(self, score: float | None = None, *, search: bool = False) -> Item:
        """The LangGraph item (a :class:`SearchItem` with ``score`` if ``search``)."""
        fields = {
            "namespace": _ns_tuple(self.namespace),
            "key": self.key,
            "value": loads(self.value),
            "created_at": datetime.fromtimestamp(self.created_at, UTC),
            "updated_at": datetime.fromtimestamp(self.updated_at, UTC),
        }
        return SearchItem(**fields, score=score) if search else Item(**fields)


COLUMNS = (
    "namespace",
    "item_key",
    "value",
    "created_at",
    "updated_at",
    "expires_at",
    "ttl_minutes",
    "episode_id",
)
"""The item table's columns, in the order of :class:`Row`'s fields."""


def _ns_text(namespace: tuple[str, ...]) -> str:
    return ".".join(namespace)


def _ns_tuple(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))


# -- the item tables: a few primitives per backend ------------------------------------------------


Merge = Callable[[Row | None, Row | None], Row | None]
"""Given the stored row (or ``None``) and the one put (``None``: delete), what to store."""


class Items(ABC):
    """The item table of one backend: storage primitives only; every rule is the store's."""

    @abstractmethod
    def get(self, keys: Sequence[Key]) -> dict[Key, Row]:
        """The stored rows of ``keys`` (expired ones too)."""

    @abstractmethod
    def scan(self, prefix: str | None) -> list[Row]:
        """Every row whose namespace is ``prefix`` or below it (``None``: every row; expired
        ones too; a backend may return more, the store checks).
        """

    @abstractmethod
    def namespaces(self) -> list[tuple[str, int, float | None]]:
        """Per namespace: its text, how many of its rows never expire, the latest expiry."""

    @abstractmethod
    def write(self, puts: Sequence[tuple[Key, Row | None]], merge: Merge) -> list[Row]:
        """In one transaction, store ``merge(stored, put)`` for each put (``None``: delete);
        returns the stored rows that were replaced or deleted.
        """

    @abstractmethod
    def refresh(self, expiries: Sequence[tuple[Key, float]]) -> None:
        """Set the expiry of rows that have a TTL."""

    @abstractmethod
    def sweep(self, now: float) -> list[Row]:
        """Delete the rows expired at ``now``; returns them."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release resources."""


class MemoryItems(Items):
    """Items in a dict (``memory://``); thread-safe."""

    def __init__(self) -> None:
        self._rows: dict[Key, Row] = {}
        self._lock = threading.Lock()

    def get(self, keys: Sequence[Key]) -> dict[Key, Row]:
        """The stored rows of ``keys``."""
        with self._lock:
            return {k: self._rows[k] for k in keys if k in self._rows}

    def scan(self, prefix: str | None) -> list[Row]:
        """Every row (the store checks the prefix)."""
        with self._lock:
            return list(self._rows.values())

    def namespaces(self) -> list[tuple[str, int, float | None]]:
        """Per namespace: rows that never expire, the latest expiry."""
        out: dict[str, tuple[int, float | None]] = {}
        with self._lock:
            for row in self._rows.values():
                forever, latest = out.get(row.namespace, (0, None))
                if row.expires_at is None:
                    forever += 1
                else:
                    latest = max(latest or row.expires_at, row.expires_at)
                out[row.namespace] = (forever, latest)
        return [(ns, forever, latest) for ns, (forever, latest) in out.items()]

    def write(self, puts: Sequence[tuple[Key, Row | None]], merge: Merge) -> list[Row]:
        """Store the merged rows."""
        replaced = []
        with self._lock:
            for key, put in puts:
                old = self._rows.get(key)
                new = merge(old, put)
                if new is None:
                    self._rows.pop(key, None)
                else:
                    self._rows[key] = new
                if old is not None:
                    replaced.append(old)
        return replaced

    def refresh(self, expiries: Sequence[tuple[Key, float]]) -> None:
        """Set expiries of rows with a TTL."""
        with self._lock:
            for key, expires_at in expiries:
                row = self._rows.get(key)
                if row is not None and row.ttl is not None:
                    self._rows[key] = dataclasses.replace(row, expires_at=expires_at)

    def sweep(self, now: float) -> list[Row]:
        """Delete expired rows."""
        with self._lock:
            gone = [r for r in self._rows.values() if not r.live(now)]
            for row in gone:
                del self._rows[row.address]
        return gone


class SQLItems(Items):
    """Items in a table of SQLite or PostgreSQL, through the engine's ctxkeep client.

    Args:
        db: the engine client (``SQLiteClient`` or ``PgClient``), its schema set up.
        mark: the engine's parameter placeholder (``?`` or ``%s``).

    """

    def __init__(self, db: Database, mark: str) -> None:
        self._db = db
        self._mark = mark
        self._select = f"SELECT {', '.join(COLUMNS)} FROM {TABLE}"

    def _sql(self, text: str) -> str:
        return placeholders(text, self._mark)

    @staticmethod
    def _row(values: Sequence[Any]) -> Row:
        names = [f.name for f in dataclasses.fields(Row)]
        return Row(**dict(zip(names, values, strict=True)))

    def get(self, keys: Sequence[Key]) -> dict[Key, Row]:
        """The stored rows of ``keys``."""
        out: dict[Key, Row] = {}
        sql = self._sql(f"{self._select} WHERE namespace = ? AND item_key = ?")
        for key in dict.fromkeys(keys):
            for values in self._db.q("read items", sql, key):
                out[key] = self._row(values)
        return out

    def scan(self, prefix: str | None) -> list[Row]:
        """The rows of ``prefix`` and below it (``substr`` counts characters in both engines,
        as ``len`` does).
        """
        if prefix is None:
            rows = self._db.q("read items", self._select)
        else:
            below = prefix + "."
            sql = f"{self._select} WHERE namespace = ? OR substr(namespace, 1, {len(below)}) = ?"
            rows = self._db.q("read items", self._sql(sql), (prefix, below))
        return [self._row(values) for values in rows]

    def namespaces(self) -> list[tuple[str, int, float | None]]:
        """Per namespace: rows that never expire, the latest expiry."""
        rows = self._db.q(
            "list namespaces",
            f"SELECT namespace, count(*) - count(expires_at), max(expires_at) FROM {TABLE} "
            "GROUP BY namespace",
        )
        return [(str(ns), int(forever), latest) for ns, forever, latest in rows]

    def write(self, puts: Sequence[tuple[Key, Row | None]], merge: Merge) -> list[Row]:
        """Store the merged rows in one transaction."""
        replaced = []
        names = ", ".join(COLUMNS)
        upsert = self._sql(
            f"INSERT INTO {TABLE} ({names}) VALUES ({', '.join('?' for _ in COLUMNS)}) "
            "ON CONFLICT (namespace, item_key) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[2:])
        )
        select = self._sql(f"{self._select} WHERE namespace = ? AND item_key = ?")
        delete = self._sql(f"DELETE FROM {TABLE} WHERE namespace = ? AND item_key = ?")
        with self._db.tx("write items") as conn:
            for key, put in puts:
                got = conn.execute(select, key).fetchone()
                old = self._row(got) if got is not None else None
                new = merge(old, put)
                if new is None:
                    conn.execute(delete, key)
                else:
                    conn.execute(
                        upsert, tuple(getattr(new, f.name) for f in dataclasses.fields(Row))
                    )
                if old is not None:
                    replaced.append(old)
        return replaced

    def refresh(self, expiries: Sequence[tuple[Key, float]]) -> None:
        """Set expiries of rows with a TTL, in one transaction."""
        sql = self._sql(
            f"UPDATE {TABLE} SET expires_at = ? "
            "WHERE namespace = ? AND item_key = ? AND ttl_minutes IS NOT NULL"
        )
        with self._db.tx("refresh TTLs") as conn:
            for (ns, key), expires_at in expiries:
                conn.execute(sql, (expires_at, ns, key))

    def sweep(self, now: float) -> list[Row]:
        """Delete expired rows (``RETURNING`` what was deleted, not what a read saw)."""
        with self._db.tx("sweep expired items") as conn:
            rows = conn.execute(
                self._sql(
                    f"DELETE FROM {TABLE} WHERE expires_at IS NOT NULL AND expires_at <= ? "
                    f"RETURNING {', '.join(COLUMNS)}"
                ),
                (now,),
            ).fetchall()
        return [self._row(values) for values in rows]

    def close(self) -> None:
        """Close the engine client."""
        self._db.close()


def _items_at(url: str) -> Items:
    """The item table a URL names (its schema set up).

    Raises:
        ConfigError: an unsupported URL.

    """
    if url == "memory://":
        return MemoryItems()
    if url.startswith("sqlite:///"):
        from ctxkeep._sqlite import SQLiteClient

        path = url[len("sqlite:///") :].split("?", 1)[0]
        if not path:
            raise ConfigError(f"sqlite URL needs a path: sqlite:///path/to.db, got {url!r}")
        return SQLItems(SQLiteClient(path, meta_key="langgraph_store", migrations=MIGRATIONS), "?")
    if url.startswith(("postgresql://", "postgres://")):
        from ctxkeep._pg import PgClient

        client = PgClient(
            url, name="ctxkeep-langgraph-store", meta_key="langgraph_store", migrations=MIGRATIONS
        )
        return SQLItems(client, "%s")
    raise ConfigError(
        f"unsupported store URL {url!r}; use memory://, sqlite:///path or postgresql://..."
    )


# -- input checks, filters and namespace matching, I/O-free --------------------------------------


def _json_value(where: str, value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON data (tuples become lists), or a typed error naming where."""
    if depth > 200:
        raise ConfigError(f"{where} is nested more than 200 levels deep")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where} is {value}, which JSON cannot hold")
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidTypeError(f"{where} has a key {k!r} that is not a string")
            out[k] = _json_value(f"{where}[{k!r}]", v, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_json_value(f"{where}[{i}]", v, depth + 1) for i, v in enumerate(value)]
    raise InvalidTypeError(
        f"{where} is a {type(value).__name__}; store values are JSON "
        "(dict, list, str, int, float, bool, None)"
    )


def _value_text(value: Any) -> str:
    """The JSON text of a put's value.

    Raises:
        InvalidTypeError: not a mapping with string keys, or a part JSON cannot hold.
        ConfigError: NaN or infinity, an integer too large, a string that is not Unicode.

    """
    if not isinstance(value, Mapping):
        raise InvalidTypeError(f"value must be a mapping (or None to delete), got {value!r:.60}")
    plain = _json_value("value", value)
    try:
        return dumps(plain)
    except (TypeError, ValueError) as exc:  # orjson: ints over 64 bits, lone surrogates
        raise ConfigError(f"value cannot be stored as JSON: {exc}") from exc


def _filter(flt: Any) -> dict[str, Any] | None:
    """A search filter as plain JSON data (tuples become lists), checked.

    Raises:
        InvalidFilterError: not a mapping of string keys to JSON values, an unknown
            operator, or an order operator given something other than a number or a string.

    """
    if flt is None:
        return None
    if not isinstance(flt, Mapping):
        raise InvalidFilterError(f"filter must be a mapping or None, got {flt!r:.60}")
    try:
        plain: dict[str, Any] = _json_value("filter", flt)
    except (InvalidTypeError, ConfigError) as exc:
        raise InvalidFilterError(str(exc)) from None
    _check_operators(plain)
    return plain


def _check_operators(flt: Mapping[str, Any]) -> None:
    for key, want in flt.items():
        if isinstance(want, Mapping) and any(k.startswith("$") for k in want):
            for op, arg in want.items():
                if op not in OPERATORS:
                    raise InvalidFilterError(
                        f"filter {key!r}: unknown operator {op!r}; use {', '.join(OPERATORS)}"
                    )
                if op not in ("$eq", "$ne") and (
                    isinstance(arg, bool) or not isinstance(arg, int | float | str)
                ):
                    raise InvalidFilterError(
                        f"filter {key!r}: {op} compares with a number or a string, got {arg!r}"
                    )
        elif isinstance(want, Mapping):
            _check_operators(want)


def matches_filter(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether an item's value passes a LangGraph filter (see the module docstring); the
    filter is plain JSON data (as :func:`_filter` gives).
    """
    return all(_compare(value.get(k), want) for k, want in (flt or {}).items())


def _compare(got: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        if any(k.startswith("$") for k in want):
            return all(_operator(got, op, arg) for op, arg in want.items())
        return isinstance(got, dict) and all(_compare(got.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(got, list)
            and len(got) == len(want)
            and all(_compare(g, w) for g, w in zip(got, want, strict=True))
        )
    return json_equal(got, want)


def _operator(got: Any, op: str, arg: Any) -> bool:
    if op == "$eq":
        return json_equal(got, arg)
    if op == "$ne":
        return not json_equal(got, arg)
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (got, arg))
    if not numbers and not (isinstance(got, str) and isinstance(arg, str)):
        return False
    if op == "$gt":
        return bool(got > arg)
    if op == "$gte":
        return bool(got >= arg)
    if op == "$lt":
        return bool(got < arg)
    return bool(got <= arg)


def matches_namespace(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with the condition's
    path, where a ``"*"`` label matches any label.
    """
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(p in ("*", n) for p, n in zip(path, part, strict=True)) if path else True


def _check_op(op: Any) -> None:
    """Refuse a malformed operation before any operation of its batch runs.

    Raises:
        InvalidNamespaceError: a namespace label that is empty, not a string or holds ``.``;
            a put to the empty namespace or under ``langgraph``.
        InvalidTypeError / ConfigError / InvalidFilterError: another malformed field.

    """
    if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
        raise InvalidTypeError(
            f"unknown store operation {op!r:.60}; use GetOp, PutOp, SearchOp or ListNamespacesOp"
        )
    if not isinstance(getattr(op, "namespace", getattr(op, "namespace_prefix", ())), tuple):
        raise InvalidNamespaceError(f"a namespace must be a tuple of strings, got {op!r:.80}")
    validate_op_namespace(op)
    if isinstance(op, GetOp | PutOp):
        _check.text("key", op.key, empty=True)
    if isinstance(op, PutOp) and op.value is not None:
        if not op.namespace:
            raise InvalidNamespaceError("Namespace cannot be empty.")
        if op.namespace[0] == "langgraph":
            raise InvalidNamespaceError(
                f'Root label for namespace cannot be "langgraph". Got: {op.namespace}'
            )
        if (
            op.index is not None
            and op.index is not False
            and (not isinstance(op.index, list) or not all(isinstance(p, str) for p in op.index))
        ):
            raise InvalidTypeError(f"index must be False, None or a list of paths: {op.index!r}")
        if op.ttl is not None:
            _check.number("ttl", op.ttl, positive=True)
    if isinstance(op, SearchOp):
        _filter(op.filter)
        _check.optional_text("query", op.query, empty=True)
        _check.integer("limit", op.limit, minimum=0)
        _check.integer("offset", op.offset, minimum=0)
    if isinstance(op, ListNamespacesOp):
        for cond in op.match_conditions or ():
            if cond.match_type not in ("prefix", "suffix"):
                raise ConfigError(f"match_type must be 'prefix' or 'suffix', got {cond!r}")
        _check.optional_integer("max_depth", op.max_depth, minimum=1)
        _check.integer("limit", op.limit, minimum=0)
        _check.integer("offset", op.offset, minimum=0)


def _index_fields(index: Any, dim: int) -> list[tuple[str, str | list[str]]]:
    """The (path, tokenized path) pairs the ``index`` config names (default: the whole value).

    Raises:
        ConfigError: an unknown key, an ``embed`` (ctxkeep embeds: pass ``embedder=``), or
            ``dims`` other than the embedder's.

    """
    cfg = _check.mapping("index", index)
    unknown = set(cfg) - {"fields", "dims", "embed"}
    if unknown:
        raise ConfigError(f"unknown index keys {sorted(unknown)}; CtxkeepStore reads 'fields'")
    if "embed" in cfg:
        raise ConfigError(
            "CtxkeepStore embeds with ctxkeep's embedders: pass embedder='local', 'openai' or "
            "an Embedder instead of index['embed']"
        )
    if cfg.get("dims") is not None and cfg["dims"] != dim:
        raise ConfigError(f"index['dims'] is {cfg['dims']}, but the embedder gives {dim}")
    fields = cfg.get("fields") or ["$"]
    if not isinstance(fields, list) or not all(isinstance(f, str) and f for f in fields):
        raise ConfigError(f"index['fields'] must be a list of paths, got {fields!r}")
    return [(p, p if p == "$" else tokenize_path(p)) for p in fields]


def _ttl_config(ttl: Any) -> TTLConfig | None:
    """``ttl`` checked: a TTLConfig mapping or None."""
    if ttl is None:
        return None
    cfg = _check.mapping("ttl", ttl)
    known = {"default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired"}
    if set(cfg) - known:
        raise ConfigError(f"unknown ttl keys {sorted(set(cfg) - known)}; use {sorted(known)}")
    for name in ("default_ttl", "sweep_interval_minutes"):
        if cfg.get(name) is not None:
            _check.number(f"ttl[{name!r}]", cfg[name], positive=True)
    for name in ("refresh_on_read", "omit_expired"):
        if name in cfg and not isinstance(cfg[name], bool):
            raise InvalidTypeError(f"ttl[{name!r}] must be a bool, got {cfg[name]!r}")
    return cast(TTLConfig, cfg)


# -- the store ------------------------------------------------------------------------------------


class CtxkeepStore(BaseStore):
    """A LangGraph store whose search is ctxkeep's hybrid (lexical + dense) recall.

    Args:
        url: where items and episodes live: ``memory://``, ``sqlite:///path`` or
            ``postgresql://...`` (default: ctxkeep's embedded SQLite file). With ``episodic``,
            where the item table lives (default: that store's own file, or memory).
        episodic: an episodic store to index items in (it stays the caller's to close);
            default: :func:`~ctxkeep.episodic.open_episodic` of ``url`` with ``embedder``.
        embedder: ``local`` (the default), ``openai``, ``hash`` (tests only) or an
            :class:`~ctxkeep.episodic.Embedder`; not with ``episodic`` (it has its own).
        index: LangGraph's index config; ``fields`` (default ``["$"]``, the whole value) are
            the paths whose text is indexed; ``dims`` must be the embedder's if given.
        ttl: LangGraph's TTL config: ``default_ttl`` (minutes, for puts that give none),
            ``refresh_on_read`` (default True), ``sweep_interval_minutes`` (for
            :meth:`start_ttl_sweeper`). Expired items are never returned.
        clock: the time source, unix seconds (tests pass one they move).

    Raises:
        ConfigError: an unsupported URL, a bad ``index`` or ``ttl``, or ``embedder`` given
            with ``episodic``.
        InvalidTypeError: an argument of the wrong type.

    """

    supports_ttl = True
    exact_scope = 1000
    """Up to this many indexed items in a search's scope, the episodic search is scoped to
    their episodes exactly; beyond, to their namespaces, keeping the hits among them
    (asking for more until enough are found)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        episodic: EpisodicMemoryStore | None = None,
        embedder: str | Embedder | None = None,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        url = _check.optional_text("url", url)
        if episodic is not None:
            _check.instance("episodic", episodic, EpisodicMemoryStore, "an EpisodicMemoryStore")
            if embedder is not None:
                raise ConfigError("pass embedder= or episodic=, not both: the store embeds")
        if not callable(clock):
            raise InvalidTypeError(f"clock must be callable, got {clock!r:.60}")
        self.ttl_config = _ttl_config(ttl)
        self.clock = clock
        self._sweeper: threading.Thread | None = None
        self._sweeping: concurrent.futures.Future[None] | None = None
        self._stop = threading.Event()
        if episodic is None:
            if url is None:
                from ctxkeep.sessions import default_url

                url = default_url()
            self._owns_episodic = True
            self.episodic = open_episodic(url, embedder if embedder is not None else "local")
        else:
            self._owns_episodic = False
            self.episodic = episodic
            url = url if url is not None else _url_of(episodic)
        try:
            self._fields = _index_fields(index, self.episodic.embedder.dim)
            self._items = _items_at(url)
        except BaseException:
            if self._owns_episodic:
                self.episodic.close()
            raise
        self.index_config = index
        """The index config as given."""

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the TTL sweeper, close the item table and the episodic store it opened."""
        self.stop_ttl_sweeper()
        self._items.close()
        if self._owns_episodic:
            self.episodic.close()

    def __enter__(self) -> CtxkeepStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations -------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops``: every read sees the store before the batch's puts (see the module
        docstring); results in the order of ``ops``.

        Raises:
            InvalidNamespaceError: a bad namespace (nothing of the batch is done).
            InvalidTypeError, ConfigError, InvalidFilterError: another malformed operation
                (nothing of the batch is done).
            StorageError: the backend failed.

        """
        ops = _check.iterable("ops", ops)
        for op in ops:
            _check_op(op)
        now = self.clock()
        results: list[Result] = [None] * len(ops)
        refresh: dict[Key, Row] = {}
        gets = [op for op in ops if isinstance(op, GetOp)]
        stored = self._items.get([(_ns_text(op.namespace), op.key) for op in gets])
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                row = stored.get((_ns_text(op.namespace), op.key))
                if row is not None and row.live(now):
                    results[i] = row.item()
                    if op.refresh_ttl:
                        refresh[row.address] = row
            elif isinstance(op, SearchOp):
                found = self._search(op, now)
                results[i] = [row.item(score, search=True) for row, score in found]
                if op.refresh_ttl:
                    refresh.update((row.address, row) for row, _ in found)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op, now)
        expiries = [(k, now + r.ttl * 60) for k, r in refresh.items() if r.ttl is not None]
        if expiries:
            self._items.refresh(expiries)
        puts = {(_ns_text(op.namespace), op.key): op for op in ops if isinstance(op, PutOp)}
        if puts:
            self._put(puts, now)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` in a worker thread (the backends' drivers are synchronous)."""
        return await asyncio.to_thread(self.batch, list(ops))

    # -- puts -------------------------------------------------------------------------------

    def _text(self, value: Mapping[str, Any], index: Literal[False] | list[str] | None) -> str:
        """The text an item's episode holds ("" when it is not to be indexed)."""
        if index is False:
            return ""
        fields = self._fields if index is None else [(p, tokenize_path(p)) for p in index]
        texts = [t for _, path in fields for t in get_text_at_path(value, path)]
        return "\n".join(t for t in texts if t.strip())

    def _put(self, puts: Mapping[Key, PutOp], now: float) -> None:
        """Save the new episodes, write the rows, then forget what they replaced."""
        rows: dict[Key, Row] = {}
        docs: dict[Key, dict[str, Any]] = {}
        for (ns, key), op in puts.items():
            if op.value is None:
                continue
            ttl = float(op.ttl) if op.ttl is not None else None
            rows[ns, key] = Row(
                namespace=ns,
                key=key,
                value=_value_text(op.value),
                created_at=now,
                updated_at=now,
                expires_at=now + ttl * 60 if ttl is not None else None,
                ttl=ttl,
            )
            text = self._text(op.value, op.index)
            if text:
                docs[ns, key] = {
                    "session_id": f"{AGENT}/{uuid.uuid4().hex}",  # no neighbours
                    "task_goal": "",
                    "summary": text,
                    "metadata": {"namespace": list(_ns_tuple(ns)), "key": key},
                    "agent_id": AGENT,
                    "task_id": ns,
                    "created_at": now,
                }
        ids = dict(zip(docs, self.episodic.save_episodes(docs.values()), strict=True))
        for k, eid in ids.items():
            rows[k] = dataclasses.replace(rows[k], episode_id=eid)

        def merge(old: Row | None, new: Row | None) -> Row | None:
            if new is not None and old is not None and old.live(now):
                return dataclasses.replace(new, created_at=old.created_at)
            return new

        try:
            replaced = self._items.write([(k, rows.get(k)) for k in puts], merge)
        except BaseException:
            if ids:
                self.episodic.forget(episode_id=list(ids.values()))
            raise
        self._forget(replaced)

    def _forget(self, rows: Iterable[Row]) -> None:
        gone = [r.episode_id for r in rows if r.episode_id is not None]
        if gone:
            self.episodic.forget(episode_id=gone)

    # -- reads ------------------------------------------------------------------------------

    def _search(self, op: SearchOp, now: float) -> list[tuple[Row, float | None]]:
        """One page of matches: ranked by recall if there is a query, then the rest."""
        prefix = op.namespace_prefix
        flt = _filter(op.filter)
        rows = []
        for row in self._items.scan(_ns_text(prefix) if prefix else None):
            if not row.live(now) or _ns_tuple(row.namespace)[: len(prefix)] != prefix:
                continue
            if flt and not matches_filter(loads(row.value), flt):
                continue
            rows.append(row)
        rows.sort(key=lambda r: (-r.updated_at, r.namespace, r.key))
        want = op.offset + op.limit
        ranked = self._recall(op.query, rows, want) if op.query and want else []
        seen = {row.address for row, _ in ranked}
        rest: list[tuple[Row, float | None]] = [(r, None) for r in rows if r.address not in seen]
        return (ranked + rest)[op.offset : want]

    def _recall(self, query: str, rows: Sequence[Row], want: int) -> list[tuple[Row, float | None]]:
        """The best ``want`` of ``rows`` for ``query`` by hybrid recall, with their scores."""
        by_episode = {r.episode_id: r for r in rows if r.episode_id is not None}
        if not by_episode:
            return []
        if len(by_episode) <= self.exact_scope:
            hits = self.episodic.search(query, want, filters={"episode_id": list(by_episode)})
        else:
            scope = {"agent_id": AGENT, "task_id": sorted({r.namespace for r in rows})}
            top_k = want
            while True:
                found = self.episodic.search(query, top_k, filters=scope)
                hits = [h for h in found if h.episode.episode_id in by_episode]
                if len(hits) >= want or len(found) < top_k:
                    break
                top_k *= 4
        return [(by_episode[h.episode.episode_id], h.score) for h in hits[:want]]

    def _list_namespaces(self, op: ListNamespacesOp, now: float) -> list[tuple[str, ...]]:
        live = [
            _ns_tuple(ns)
            for ns, forever, latest in self._items.namespaces()
            if forever or (latest is not None and latest > now)
        ]
        found = [
            ns for ns in live if all(matches_namespace(c, ns) for c in op.match_conditions or ())
        ]
        if op.max_depth is not None:
            found = list({ns[: op.max_depth] for ns in found})
        return sorted(found)[op.offset : op.offset + op.limit]

    # -- TTL --------------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Delete the items that have expired (and their episodes); returns how many."""
        gone = self._items.sweep(self.clock())
        self._forget(gone)
        return len(gone)

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Run :meth:`sweep_ttl` every ``sweep_interval_minutes`` (default: the TTL config's,
        else 5) in a daemon thread, until :meth:`stop_ttl_sweeper` or :meth:`close`.

        Returns:
            A future that completes when the sweeper stops; cancelling it stops the sweeper.

        """
        cfg = self.ttl_config or {}
        interval = _check.number(
            "sweep_interval_minutes",
            sweep_interval_minutes or cfg.get("sweep_interval_minutes") or 5,
            positive=True,
        )
        if self._sweeper is not None and self._sweeper.is_alive() and self._sweeping:
            return self._sweeping  # one sweeper per store
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        stop = self._stop = threading.Event()

        def loop() -> None:
            while not stop.wait(interval * 60):
                try:
                    swept = self.sweep_ttl()
                    if swept:
                        logger.info("swept %d expired store items", swept)
                except Exception:  # the sweeper must outlive a failed sweep
                    logger.exception("TTL sweep of the store failed")
            if not future.done():
                future.set_result(None)

        future.add_done_callback(lambda f: stop.set() if f.cancelled() else None)
        self._sweeping = future
        self._sweeper = threading.Thread(target=loop, name="ctxkeep-store-ttl", daemon=True)
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; whether it stopped within ``timeout`` seconds."""
        thread = self._sweeper
        if thread is None or not thread.is_alive():
            return True
        self._stop.set()
        thread.join(timeout)
        if thread.is_alive():
            return False
        self._sweeper = None
        return True


def _url_of(episodic: EpisodicMemoryStore) -> str:
    """Where the item table of a store over ``episodic`` lives by default.

    Raises:
        ConfigError: a store whose location is not known (pass ``url=``).

    """
    if isinstance(episodic, MemoryEpisodicStore):
        return "memory://"
    path = getattr(episodic, "path", None)
    if episodic.name == "sqlite" and path is not None:
        return f"sqlite:///{path}"
    raise ConfigError(
        f"pass url= (where the item table lives) with a {type(episodic).__name__}, "
        "for instance the same postgresql://... URL it was opened with"
    )

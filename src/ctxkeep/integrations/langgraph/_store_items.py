"""The item tables of :class:`~ctxkeep.integrations.langgraph.CtxkeepStore`, one per backend.

An item as the table keeps it (:class:`Row`, free of I/O), the few storage primitives every
backend implements (:class:`Items`), and the two backends: a dict for ``memory://``
(:class:`MemoryItems`) and one table shared by SQLite and PostgreSQL (:class:`SQLItems`,
written once with ``?`` placeholders, its schema in :data:`MIGRATIONS`). :func:`_items_at`
opens the one a URL names. Every rule (TTL, filters, what a put keeps) is the store's.

Imports LangGraph: import it through ``store``, which says which extra to install when it is
missing.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

from langgraph.store.base import Item, SearchItem

from ctxkeep._db import ANALYZE_AFTER, Database, executemany, placeholders
from ctxkeep.errors import ConfigError
from ctxkeep.integrations.langgraph._store_filters import Engine, matches_filter, sql_filter
from ctxkeep.sessions.records import loads

TABLE = "ctxkeep_langgraph_items"
"""The item table."""
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
_COLUMNS_SQL = """namespace TEXT NOT NULL,
        item_key TEXT NOT NULL,
        value TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        ttl_minutes DOUBLE PRECISION,
        episode_id TEXT,
        PRIMARY KEY (namespace, item_key)"""
_TABLE_SQL = f"""CREATE TABLE IF NOT EXISTS {TABLE} ({_COLUMNS_SQL});
    CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (expires_at)"""
_EXPIRY_SQL = (
    f"CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (expires_at) "
    "WHERE expires_at IS NOT NULL"
)
SQLITE_MIGRATIONS = [
    _TABLE_SQL,
    f"CREATE INDEX IF NOT EXISTS {TABLE}_order ON {TABLE} (updated_at DESC, namespace, item_key)",
    f"""CREATE TABLE {TABLE}_v3 ({_COLUMNS_SQL}) WITHOUT ROWID;
    INSERT INTO {TABLE}_v3 SELECT {", ".join(COLUMNS)} FROM {TABLE} ORDER BY namespace, item_key;
    DROP TABLE {TABLE};
    ALTER TABLE {TABLE}_v3 RENAME TO {TABLE};
    {_EXPIRY_SQL};
    CREATE INDEX {TABLE}_order ON {TABLE} (updated_at DESC, namespace, item_key)""",
]
"""The item table's schema on SQLite (position = version). Version 2 indexes the order a
search returns (newest updated, then namespace and key by code point), so that a page is read
from the index's start, not sorted out of every row. Version 3 keeps the rows in the primary
key's b-tree (``WITHOUT ROWID``: a rowid table kept them once in its rowid order and their
addresses again in the primary key's index, a fifth of the file and one more b-tree insert
per put) and indexes only the expiries there are (the sweep's ``expires_at IS NOT NULL``:
an item without a TTL was an entry of that index too)."""
POSTGRES_MIGRATIONS = [
    _TABLE_SQL,
    f"CREATE INDEX IF NOT EXISTS {TABLE}_order ON {TABLE} "
    '(updated_at DESC, namespace COLLATE "C", item_key COLLATE "C")',
    f"DROP INDEX IF EXISTS {TABLE}_expiry; {_EXPIRY_SQL}",
]
"""The same on PostgreSQL (its index of the order collates by code point, as the order does;
version 3: the expiry index partial, as on SQLite)."""
MIGRATIONS = SQLITE_MIGRATIONS
"""The SQLite schema, under the name it had when both engines shared one."""

CHUNK = 400
"""Keys read per statement when a write reads the stored rows (800 parameters: far below
SQLite's and PostgreSQL's bounds)."""

BULK_ORDER = 32
"""Addresses of one time from which a ``memory://`` write edits that time's run of the search
order in one pass (a filter, or an extend and one sort), not one by one
(:meth:`MemoryItems._drop`, :meth:`MemoryItems._add`)."""

ROWS_PER_INSERT = 1000
"""Rows per ``INSERT`` of a batch on SQLite (8,000 parameters), fewer where the connection's
limit of parameters is lower (999 in SQLite builds before 3.32; 32,766 since): a batch of
10,000 rows in 10 statements, not 100, 4% less CPU (:meth:`SQLItems._upserts`)."""

Key = tuple[str, str]
"""An item's address: its namespace as text (labels joined by ``.``) and its key."""


# -- rows: the item table's records, I/O-free --------------------------------------------------


class Row(NamedTuple):
    """One stored item, as the item table keeps it: its fields in the order of
    :data:`COLUMNS`, so a table record is a row as it is (a tuple: built in one call, where a
    frozen dataclass set each of eight fields through ``object.__setattr__``, a fifth of a
    ``memory://`` put).
    """

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
        """The LangGraph item (a :class:`SearchItem` with ``score`` if ``search``), its value
        decoded afresh: the caller's to change.
        """
        # built without the constructors (SearchItem's calls Item's, which checks each time
        # for ISO text): half of building one; ITEM_SLOTS and a test keep to their slots
        item = _new(SearchItem if search else Item)
        item.value = loads(self.value)
        item.key = self.key
        item.namespace = _ns_tuple(self.namespace)
        item.created_at = _stamp(self.created_at)
        item.updated_at = _stamp(self.updated_at)
        if search:
            item.score = score  # type: ignore[attr-defined]
        return item


Fields = tuple[str, str, str, float, float, float | None, float | None, str | None]
"""A row's eight fields as a plain tuple, as a put makes them: what :meth:`Items.write` takes
(SQL sends them as they are; ``memory://`` keeps a :class:`Row` of them). Not a row itself:
CPython's collector stops tracking a plain tuple of strings and numbers at its first
collection, but never a tuple subclass, so each row a batch made stayed tracked and was
moved to the oldest generation, and those of a batch of 10,000 puts to SQLite (freed after
it) counted towards the next full collection of the process's every object, which a batch
of puts thus brought about (bench/peers.py at 10,000 items: two in four of ctxkeep's SQLite
batches, about 450 ms each; none in SqliteStore's)."""

_new = object.__new__
_new_row: Callable[[tuple[Any, ...]], Row] = functools.partial(tuple.__new__, Row)
"""A :class:`Row` of its eight fields as one tuple, built without ``Row.__new__``'s Python
frame (``memory://`` keeps one per item)."""


def with_episode(fields: Fields, episode_id: str | None) -> Fields:
    """``fields`` with another episode id."""
    return (*fields[:7], episode_id)


ITEM_SLOTS = {
    Item: ("value", "key", "namespace", "created_at", "updated_at"),
    SearchItem: ("value", "key", "namespace", "created_at", "updated_at", "score"),
}
"""The slots :meth:`Row.item` and :func:`search_items` set of each class, which must be every
slot it has."""

_loads: Callable[[str], Any] = loads
try:
    import orjson

    _loads = orjson.loads  # without the wrapper's frame: one call per item
except ImportError:  # pragma: no cover - orjson is a dependency
    pass


def search_items(found: Iterable[tuple[Row, float | None]]) -> list[SearchItem]:
    """The LangGraph search items of a page's rows and scores, as :meth:`Row.item` builds them
    (each value decoded afresh: the caller's to change), with the namespace tuple of each
    namespace made once for the page (tuples: shared as the times are).
    """
    out: list[SearchItem] = []
    names: dict[str, tuple[str, ...]] = {}
    stamps = _STAMPS
    for row, score in found:
        item = _new(SearchItem)
        item.value = _loads(row[2])
        item.key = row[1]
        ns = names.get(row[0])
        if ns is None:
            ns = names[row[0]] = tuple(row[0].split("."))
        item.namespace = ns
        # _stamp's map read here: a call of it was twice a lookup, 20 calls a page of ten
        item.created_at = stamps.get(row[3]) or _stamp(row[3])
        item.updated_at = stamps.get(row[4]) or _stamp(row[4])
        item.score = score
        out.append(item)
    return out


STAMPS = 4096
"""How many datetimes :func:`_stamp` keeps; when full, it forgets them all and starts again."""
_STAMPS: dict[float, datetime] = {}
"""Unix time -> its datetime, as :func:`_stamp` made it."""


def _stamp(at: float) -> datetime:
    """The UTC datetime of unix time ``at``, kept in :data:`_STAMPS`. Datetimes are
    immutable, so items share them; rows read again (the same page searched twice, the items
    of one batch put, which share their times) skip ``fromtimestamp``, two of which were a
    fifth of building an item. :func:`search_items` reads the map itself, then calls this on
    a miss.
    """
    made = _STAMPS.get(at)
    if made is None:
        if len(_STAMPS) >= STAMPS:
            _STAMPS.clear()
        made = _STAMPS[at] = datetime.fromtimestamp(at, UTC)
    return made


def _row(values: Sequence[Any]) -> Row:
    """The row of a table record (its values in the order of :data:`COLUMNS`)."""
    return Row._make(values)


_UPSERT_SET = ", ".join(
    f"{c} = excluded.{c}"
    if c != "created_at"
    else f"created_at = CASE WHEN {TABLE}.expires_at IS NULL OR {TABLE}.expires_at > %s "
    f"THEN {TABLE}.created_at ELSE excluded.created_at END"
    for c in COLUMNS[2:]
)
"""The upsert's update on PostgreSQL: the new values, keeping the ``created_at`` of a live stored
row as :func:`merged` does (its parameter: ``now``)."""

_PG_PUT_ONE = (
    f"WITH old AS (SELECT {', '.join(COLUMNS)} FROM {TABLE} "
    "WHERE namespace = %s AND item_key = %s{lock}), "
    f"up AS (INSERT INTO {TABLE} ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('%s' for _ in COLUMNS)}) "
    f"ON CONFLICT (namespace, item_key) DO UPDATE SET {_UPSERT_SET}"
    ")"
)
PG_PUT_ONE = f"{_PG_PUT_ONE.replace('{lock}', '')} SELECT {', '.join(COLUMNS)} FROM old"
"""One put on PostgreSQL in one statement: the upsert keeps the ``created_at`` of a live stored
row as :func:`merged` does (parameters: the address, the row's values, ``now``), and the row
it replaced comes back (read in the statement's snapshot: a put of the same key committed
meanwhile by another process is replaced without being returned, so its episode, if any, is
left to no item, which no search returns)."""

_ARRAYS = ", ".join(
    f"%b::{'float8' if c.endswith(('_at', '_minutes')) else 'text'}[]" for c in COLUMNS
)
_PG_PUT_MANY = (
    f"WITH new AS (SELECT * FROM unnest({_ARRAYS}) AS n({', '.join(COLUMNS)})), "
    f"old AS (SELECT {', '.join('i.' + c for c in COLUMNS)} FROM {TABLE} i JOIN new n "
    "ON i.namespace = n.namespace AND i.item_key = n.item_key{lock}), "
    f"up AS (INSERT INTO {TABLE} ({', '.join(COLUMNS)}) "
    f"SELECT {', '.join(COLUMNS)} FROM new WHERE value IS NOT NULL "
    "ORDER BY namespace, item_key "
    f"ON CONFLICT (namespace, item_key) DO UPDATE SET {_UPSERT_SET}), "
    f"gone AS (DELETE FROM {TABLE} i USING new n WHERE n.value IS NULL "
    "AND i.namespace = n.namespace AND i.item_key = n.item_key)"
)
PG_PUT_MANY = f"{_PG_PUT_MANY.replace('{lock}', '')} SELECT {', '.join(COLUMNS)} FROM old"
"""The puts of a batch (distinct addresses) on PostgreSQL in one statement: the rows' columns
as arrays (a delete: a row whose value is NULL; parameters: the eight arrays, ``now``),
upserted as :data:`PG_PUT_ONE` does, in primary key order (its leaf pages filled in turn, not
split all over: 488 -> 328 kB for a load of 10,000 items), and the stored rows they replaced
or deleted come back. The arrays go in binary (as text, psycopg escaped every value with a
regular expression). Before, the transaction read the stored rows by chunks, then sent an
upsert per row (pipelined): 1,000 puts were 1,003 statements, each bound and executed
(client CPU 31 -> 7.6 ms a batch of 1,000)."""


def pg_put_forgetting(forgets: Callable[[str], str], many: bool) -> str:
    """:data:`PG_PUT_ONE` (``many``: :data:`PG_PUT_MANY`) that also forgets, in the same
    statement, the episodes of the rows it replaces or deletes: ``forgets`` gives the
    episodic store's CTEs that delete the episodes of the ids a query selects
    (``PostgresEpisodicStore.forgets``: those alone in their session, as every episode of the
    store is, their ids in a CTE ``forgot``). Comes back: the replaced rows whose episode it
    left (one whose session holds more, for the episodic store's own forgetting, which
    renumbers the session), so a put waits for nothing before its commit (a read of the
    replaced row, then the episodic store's read, delete and renumbering read were four
    waits before the commit's).

    The replaced rows are read locked (``FOR UPDATE``, in primary key order, as the upsert
    writes them), so a put of the same key that another transaction commits meanwhile is
    waited for and read as it is now, not as the statement's snapshot had it: its episode
    comes back (the snapshot's delete cannot see it) and is forgotten after the commit,
    where a row read unlocked left it to no item (3 threads putting one key 15 times each
    left 7-15 such episodes).
    """
    head = (_PG_PUT_MANY if many else _PG_PUT_ONE).replace(
        "{lock}",
        " ORDER BY i.namespace, i.item_key FOR UPDATE OF i" if many else " FOR UPDATE",
    )
    forgot = forgets("SELECT episode_id FROM old WHERE episode_id IS NOT NULL")
    return (
        f"{head}, {forgot} SELECT {', '.join(COLUMNS)} FROM old WHERE episode_id IS NOT NULL "
        "AND episode_id NOT IN (SELECT episode_id FROM forgot)"
    )


_GONE = (None,) * (len(COLUMNS) - 2)
"""The columns after the address of a delete's row in :data:`PG_PUT_MANY`."""


def _ns_text(namespace: tuple[str, ...]) -> str:
    return ".".join(namespace)


def _under(namespace: str, prefix: str | None) -> bool:
    """Whether ``namespace`` is ``prefix`` or below it (any namespace for ``None``)."""
    return prefix is None or namespace == prefix or namespace.startswith(prefix + ".")


def _ns_tuple(text: str) -> tuple[str, ...]:
    return tuple(text.split("."))


_NEVER = -math.inf
"""Earlier than every time."""
_NAMESPACE = operator.itemgetter(0)
_KEY = operator.itemgetter(1)


def _sort_addressed(entries: list[Any]) -> None:
    """Sort ``entries`` in place by address: tuples whose first two items are a namespace and
    a key (addresses, rows), each address once. When all share one namespace (a batch's puts
    mostly do), by key alone: two strings compared where two tuples were compared item by
    item (10,000 keys: 2.7 -> 1.0 ms in order, 20 -> 7 ms shuffled).
    """
    if len(set(map(_NAMESPACE, entries))) == 1:
        entries.sort(key=_KEY)
    else:
        entries.sort()


# -- the item tables: a few primitives per backend ------------------------------------------------


def merged(old: Row | None, new: Fields | None, now: float) -> Fields | None:
    """What a put of ``new`` (``None``: a delete) over the stored ``old`` (or ``None``) stores
    at ``now``: ``new``, keeping the ``created_at`` of an ``old`` still live (a put over an
    expired item creates a new one). :data:`PG_PUT_ONE` says the same in SQL.
    """
    if new is not None and old is not None:
        return _over(old, new, now)
    return new


def _over(old: Row, new: Fields, now: float) -> Fields:
    """:func:`merged` of a put ``new`` over a stored ``old``."""
    if old.live(now):
        # the fields spelt out: ``_replace`` (a dict of keywords, a map over the fields)
        # was a tenth of a put over a stored item
        return (new[0], new[1], new[2], old[3], new[4], new[5], new[6], new[7])
    return new


T = TypeVar("T")

Filter = Mapping[str, Any] | None
"""A search's filter, plain JSON data as ``_store_filters._filter`` checks it (``None``: all)."""
Keep = Callable[[str], bool]
"""Given a row's value (JSON text), whether a scan keeps it."""


def _keep(flt: Filter) -> Keep | None:
    """The filter as a test of a row's value text, in Python (``None``: keep all)."""
    return (lambda text: matches_filter(loads(text), flt)) if flt else None


def _page(
    records: Iterable[T],
    value_of: Callable[[T], str],
    keep: Keep | None,
    offset: int,
    limit: int | None,
) -> Iterator[T]:
    """The records ``keep`` accepts (all if ``None``), from ``offset`` on, at most ``limit``;
    lazily, so nothing past the page is looked at.
    """
    if keep is not None:
        records = (r for r in records if keep(value_of(r)))
    return itertools.islice(records, offset, None if limit is None else offset + limit)


class Items(ABC):
    """The item table of one backend: storage primitives only; every rule is the store's."""

    @abstractmethod
    def get(self, keys: Sequence[Key]) -> dict[Key, Row]:
        """The stored rows of ``keys`` (expired ones too)."""

    @abstractmethod
    def scan(
        self,
        prefix: str | None,
        now: float,
        flt: Filter = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[Row]:
        """The rows live at ``now`` whose namespace is ``prefix`` or below it (``None``: any)
        and whose value matches ``flt`` (``None``: any), newest updated first, then by
        namespace and key (code point order); from ``offset`` on, at most ``limit``
        (``None``: all). Rows are built only for what is returned.
        """

    @abstractmethod
    def indexed(self, prefix: str | None, now: float, flt: Filter = None) -> dict[str, Key]:
        """The episode id and address of each row :meth:`scan` would return that has an
        episode, in no order (no row is built).
        """

    @abstractmethod
    def namespaces(self) -> list[tuple[str, int, float | None]]:
        """Per namespace: its text, how many of its rows never expire, the latest expiry."""

    @abstractmethod
    def write(self, puts: Mapping[Key, Fields | None], now: float, conn: Any = None) -> list[Row]:
        """In one transaction, store :func:`merged` ``(stored, put, now)`` for each address's
        put (``None``: delete); returns the stored rows that were replaced or deleted.
        ``conn``: a connection inside a transaction the caller holds (:meth:`joins` said
        yes), to write in.
        """

    def joins(self, db: Any) -> bool:
        """Whether the item table can be written in a transaction of ``db`` (an engine
        client of another store): the same database, reached the same way.
        """
        return False

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
        self._times: list[float] = []
        """The ``updated_at`` of the rows, each time once, ascending: one per run of
        :attr:`_runs`."""
        self._runs: list[list[Key]] = []
        """The search order as runs: the addresses of the rows updated at the time of the same
        position in :attr:`_times`, each run in code point order. A page is read from the last
        run back (newest first, ties by namespace, then key: the SQL tables' order), a put
        appends a run of its own, a batch one run sorted once; taking a row out edits its run
        alone (an emptied run stays, skipped, until :meth:`_compact`). One list of every
        ``(updated_at, namespace, key)`` moved the entries behind each one taken out (O(rows)
        a put that replaced an item) and cost a search a bisect per entry it passed."""
        self._empty = 0
        """How many runs are empty."""
        self._newest: dict[str, float] = {}
        """Each namespace written and each of its prefixes (labels joined by ``.``) -> a time
        after which no row under it was updated: raised by every write, never lowered (a
        delete leaves it as it was, still a bound). A scan of a prefix starts at the last run
        not newer than its bound, passing over the newer rows of other namespaces without
        looking at them (a search of the bench's namespaces passed every newer put's row
        elsewhere, a Python test each; a user's search every other user's newer rows). Its
        entries are as many as the namespaces ever written, as ``InMemoryStore`` keeps
        every namespace it was given."""
        self._names: dict[str, tuple[str, ...]] = {}
        """Each namespace written -> it and its prefixes, longest first (:meth:`_bound`)."""
        self._lock = threading.Lock()
        self._decoded: dict[Key, tuple[str, Any]] = {}
        """Each row's value text and its decoded value, for filters only (never handed out):
        valid while the row holds that very text object (a put stores a new one)."""

    def _matches(self, row: Row, flt: Filter) -> bool:
        """Whether ``row``'s value matches ``flt``, each value decoded once per version (a
        JSON decode of every row per filtered search was half of it).
        """
        if not flt:
            return True
        held = self._decoded.get(row.address)
        if held is None or held[0] is not row.value:
            held = self._decoded[row.address] = (row.value, loads(row.value))
        return matches_filter(held[1], flt)

    def _matching(self, rows: list[Row], flt: Filter) -> list[Row]:
        """The rows whose value matches ``flt``."""
        return rows if not flt else [r for r in rows if self._matches(r, flt)]

    def _drop(self, gone: Mapping[float, list[Key]]) -> None:
        """Take the entries ``gone`` (``updated_at`` -> the addresses of stored rows updated
        then, distinct) out of the order; under the lock. A run loses a few by bisection,
        more (:data:`BULK_ORDER` on) in one pass.
        """
        times, runs = self._times, self._runs
        for at, keys in gone.items():
            i = bisect.bisect_left(times, at)
            run = runs[i]
            if len(keys) >= len(run):  # every entry of the run
                run.clear()
                self._empty += 1
            elif len(keys) < BULK_ORDER:
                for key in keys:
                    del run[bisect.bisect_left(run, key)]
            else:
                out = set(keys)
                run[:] = [key for key in run if key not in out]

    def _add(self, by_time: Mapping[float, list[Key]]) -> None:
        """Put the entries ``by_time`` (``updated_at`` -> the addresses of stored rows updated
        then, distinct, none in the order; the lists become the order's) into the order;
        under the lock. Entries newer than every run (a put, a batch: all at one time) are
        one run appended; a run of an earlier time takes a few by bisection, more in one
        sort.
        """
        times, runs = self._times, self._runs
        if len(by_time) == 1:  # one put's row, the newest: a run of its own
            ((at, keys),) = by_time.items()
            if len(keys) == 1 and (not times or at > times[-1]):
                self._bound(keys[0][0], at)
                times.append(at)
                runs.append(keys)
                return
        for at, keys in by_time.items():
            if len(keys) == 1:
                self._bound(keys[0][0], at)
            else:
                for name in set(map(_NAMESPACE, keys)):
                    self._bound(name, at)
        for at, keys in by_time.items():
            if not times or at > times[-1]:
                _sort_addressed(keys)
                times.append(at)
                runs.append(keys)
                continue
            i = bisect.bisect_left(times, at)
            if times[i] != at:  # an earlier time than the last (a clock moved back)
                _sort_addressed(keys)
                times.insert(i, at)
                runs.insert(i, keys)
                continue
            run = runs[i]
            if not run:
                self._empty -= 1
            if len(keys) < BULK_ORDER:
                for key in keys:
                    bisect.insort(run, key)
            else:
                run += keys
                _sort_addressed(run)

    def _bound(self, namespace: str, at: float) -> None:
        """Raise the bound (:attr:`_newest`) of ``namespace`` and its prefixes to ``at``."""
        names = self._names.get(namespace)
        if names is None:
            labels = namespace.split(".")
            names = self._names[namespace] = tuple(
                ".".join(labels[:n]) for n in range(len(labels), 0, -1)
            )
        newest = self._newest
        for name in names:
            if newest.get(name, _NEVER) >= at:  # a prefix's bound is at least its names'
                break
            newest[name] = at

    def _compact(self) -> None:
        """Drop the empty runs once they are most of the runs (so a search passes few)."""
        if self._empty > 32 and 2 * self._empty > len(self._runs):
            keep = [i for i, run in enumerate(self._runs) if run]
            self._times = [self._times[i] for i in keep]
            self._runs = [self._runs[i] for i in keep]
            self._empty = 0

    def newest_first(self) -> Iterator[tuple[float, str, str]]:
        """``(updated_at, namespace, key)`` of every row in the search order: newest first,
        ties by namespace, then key; the caller holds the lock.
        """
        for at, run in zip(reversed(self._times), reversed(self._runs), strict=True):
            for ns, key in run:
                yield at, ns, key

    def get(self, keys: Sequence[Key]) -> dict[Key, Row]:
        """The stored rows of ``keys``."""
        with self._lock:
            return {k: self._rows[k] for k in keys if k in self._rows}

    def _live(self, prefix: str | None, now: float) -> list[Row]:
        with self._lock:
            rows = list(self._rows.values())
        return [r for r in rows if r.live(now) and _under(r.namespace, prefix)]

    def scan(
        self,
        prefix: str | None,
        now: float,
        flt: Filter = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[Row]:
        """The live rows of ``prefix`` and below it, filtered, ordered, one page: read from the
        newest run back until the page is full (each namespace tested against ``prefix``
        once a scan).
        """
        want = None if limit is None else offset + limit
        out: list[Row] = []
        if want == 0:
            return out
        rows = self._rows
        under: dict[str, bool] = {}
        with self._lock:
            runs: Iterator[list[Key]] = reversed(self._runs)
            if prefix is not None:
                bound = self._newest.get(prefix)
                if bound is None:  # nothing was ever written under it
                    return out
                newer = len(self._times) - bisect.bisect_right(self._times, bound)
                runs = itertools.islice(runs, newer, None)
            # one loop over the runs (chained in C: most runs are one put's)
            for address in itertools.chain.from_iterable(runs):
                if prefix is not None:
                    ok = under.get(address[0])
                    if ok is None:
                        ok = under[address[0]] = _under(address[0], prefix)
                    if not ok:
                        continue
                row = rows[address]
                if (row.expires_at is None or row.expires_at > now) and (
                    not flt or self._matches(row, flt)
                ):
                    out.append(row)
                    if len(out) == want:
                        break
        return out[offset:]

    def indexed(self, prefix: str | None, now: float, flt: Filter = None) -> dict[str, Key]:
        """Episode id -> address of the live rows with an episode."""
        rows = self._matching(self._live(prefix, now), flt)
        return {r.episode_id: r.address for r in rows if r.episode_id is not None}

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

    def write(self, puts: Mapping[Key, Fields | None], now: float, conn: Any = None) -> list[Row]:
        """Store the merged rows, then move them in the order (:meth:`_drop`, :meth:`_add`):
        the replaced and deleted rows out, the stored ones in.
        """
        if len(puts) == 1:
            ((key, put),) = puts.items()
            if put is not None and self.append(key, put):
                return []
        replaced: list[Row] = []
        # updated_at -> addresses, each list found once a run of one time (a batch's rows
        # share theirs): no tuple a row, so fewer collections of the garbage collector
        gone: dict[float, list[Key]] = {}
        added: dict[float, list[Key]] = {}
        gone_at = added_at = math.nan  # never equal
        gone_keys: list[Key] = []
        added_keys: list[Key] = []
        rows = self._rows
        with self._lock:
            for key, put in puts.items():
                old = rows.get(key)
                if old is not None:
                    replaced.append(old)
                    if old[4] != gone_at:
                        gone_at = old[4]
                        gone_keys = gone.setdefault(gone_at, [])
                    gone_keys.append(key)
                    if put is None:
                        del rows[key]
                        self._decoded.pop(key, None)
                        continue
                    put = _over(old, put, now)
                elif put is None:
                    continue
                rows[key] = _new_row(put)
                if put[4] != added_at:
                    added_at = put[4]
                    added_keys = added.setdefault(added_at, [])
                added_keys.append(key)
            if gone:
                self._drop(gone)
                self._compact()
            if added:
                self._add(added)
        return replaced

    def append(self, key: Key, row: Fields) -> bool:
        """Store ``row`` as the item at ``key`` if there is none and its time is newer than
        every row's (a put of a new key: most puts), in a run of its own; whether it was
        (else nothing is done). The loop of :meth:`write`, with its maps of times to
        addresses, was a third of such a put. The row is newer than every row, so it is
        every bound of its namespace and its prefixes (:attr:`_newest`): they are set, not
        compared (a bound above it, left by rows since deleted, is lowered to it, still a
        bound: no row is newer).
        """
        with self._lock:
            rows, times, at = self._rows, self._times, row[4]
            if key in rows or (times and at <= times[-1]):
                return False
            rows[key] = _new_row(row)
            names = self._names.get(key[0])
            if names is None:
                self._bound(key[0], at)
            else:
                newest = self._newest
                for name in names:
                    newest[name] = at
            times.append(at)
            self._runs.append([key])
        return True

    def settle(self, ids: Sequence[tuple[Key, str, str | None]]) -> list[str]:
        """Point each row still holding a mark at its episode (``(address, mark, episode
        id)``, ``None``: no episode); returns the episode ids whose row holds another
        (replaced meanwhile).
        """
        stale = []
        with self._lock:
            for key, mark, eid in ids:
                row = self._rows.get(key)
                if row is not None and row.episode_id == mark:
                    self._rows[key] = row._replace(episode_id=eid)
                elif eid is not None:
                    stale.append(eid)
        return stale

    def refresh(self, expiries: Sequence[tuple[Key, float]]) -> None:
        """Set expiries of rows with a TTL."""
        with self._lock:
            for key, expires_at in expiries:
                row = self._rows.get(key)
                if row is not None and row.ttl is not None:
                    self._rows[key] = row._replace(expires_at=expires_at)

    def sweep(self, now: float) -> list[Row]:
        """Delete expired rows."""
        with self._lock:
            gone = [r for r in self._rows.values() if not r.live(now)]
            for row in gone:
                del self._rows[row.address]
                self._decoded.pop(row.address, None)
            if gone:
                by_time: dict[float, list[Key]] = {}
                for row in gone:
                    by_time.setdefault(row.updated_at, []).append(row.address)
                self._drop(by_time)
                self._compact()
        return gone


class SQLItems(Items):
    """Items in a table of SQLite or PostgreSQL, through the engine's ctxkeep client.

    Args:
        db: the engine client (``SQLiteClient`` or ``PgClient``), its schema set up.
        engine: ``sqlite`` or ``postgres``: how filters are written
            (:func:`~ctxkeep.integrations.langgraph._store_filters.sql_filter`).
        mark: the engine's parameter placeholder (``?`` or ``%s``).
        collate: the engine's collation that orders text by code point, as Python does
            (``BINARY`` in SQLite, ``"C"`` in PostgreSQL, whose default follows the locale).

    """

    def __init__(self, db: Database, engine: Engine, mark: str, collate: str) -> None:
        self._db = db
        self._engine = engine
        self._analyzed = False
        """Whether this object has analyzed the table (:data:`~ctxkeep._db.ANALYZE_AFTER`)."""
        self._forgetting: dict[Callable[[str], str], tuple[str, str]] = {}
        """The statements of :meth:`write_forgetting`, per episodic store's ``forgets``."""
        self._mark = mark
        self._select = f"SELECT {', '.join(COLUMNS)} FROM {TABLE}"
        self._collate = collate
        self._order = (
            f" ORDER BY updated_at DESC, namespace COLLATE {collate}, item_key COLLATE {collate}"
        )

    def _sql(self, text: str) -> str:
        return placeholders(text, self._mark)

    def _where(
        self, prefix: str | None, now: float, flt: Filter
    ) -> tuple[str, tuple[Any, ...], Keep | None]:
        """The condition (and its parameters) of the rows live at ``now`` of ``prefix`` and
        below it whose value matches ``flt`` (``substr`` counts characters in both engines,
        as ``len`` does; labels hold no ``.``, so the prefix test is exact), and the test
        left to Python of a filter SQL cannot write exactly (``None``: none).
        """
        where = "(expires_at IS NULL OR expires_at > ?)"
        params: tuple[Any, ...] = (now,)
        if prefix is not None:
            below = prefix + "."
            if self._engine == "postgres":
                # the names below ``prefix.`` are those from it up to ``prefix/`` (``/`` is
                # the code point after ``.``), a range PostgreSQL's statistics estimate: with
                # substr it guessed a handful of rows and sorted every row of a small table
                # (casting each value to jsonb for a filter) instead of walking the order's
                # index until the page was full (EXPLAIN ANALYZE at 1,000 items: 2.3 ms ->
                # 0.07 ms)
                c = f"namespace COLLATE {self._collate}"
                where += f" AND (namespace = ? OR ({c} >= ? AND {c} < ?))"
                params += (prefix, below, prefix + "/")
            else:
                where += f" AND (namespace = ? OR substr(namespace, 1, {len(below)}) = ?)"
                params += (prefix, below)
        if not flt:
            return where, params, None
        translated = sql_filter(flt, self._engine)
        if translated is None:
            return where, params, _keep(flt)
        return f"{where} AND {translated[0]}", params + translated[1], None

    def _chunks(
        self, keys: Sequence[Key], distinct: bool = False
    ) -> Iterator[tuple[str, tuple[str, ...]]]:
        """The statements (and parameters) that read the rows of ``keys``, :data:`CHUNK`
        keys each. On SQLite the keys of each namespace are one ``item_key IN (...)`` term and
        the terms are OR-ed, each looked up in the primary key (a row value ``IN (VALUES
        ...)`` made it scan the whole table: 0.9 ms a read at 10,000 items; a term per key
        cost SQLite's planner a quarter of a batch read of 1,000 keys of one namespace);
        PostgreSQL joins the ``VALUES`` to its index (400 OR-ed pairs cost it more to plan).
        ``distinct``: the keys are known to be (a write's, the keys of a mapping), so they are
        not made so again (a tuple's hash is not kept: 10,000 keys were 2.7 ms to dedupe).
        """
        keys = list(keys) if distinct else list(dict.fromkeys(keys))
        if self._engine == "sqlite":
            yield from self._lite_chunks(keys)
            return
        for start in range(0, len(keys), CHUNK):
            chunk = keys[start : start + CHUNK]
            pairs = f"(namespace, item_key) IN (VALUES {', '.join(['(?, ?)'] * len(chunk))})"
            sql = f"{self._select} WHERE {pairs}"
            yield self._sql(sql), tuple([part for key in chunk for part in key])

    def _lite_chunks(self, keys: list[Key]) -> Iterator[tuple[str, tuple[str, ...]]]:
        """:meth:`_chunks` on SQLite: ``(namespace = ? AND item_key IN (...)) OR ...``. Keys
        that share one namespace (a batch's puts mostly do) are its list as it is, not grouped
        key by key (10,000 keys: 2.3 -> 1.0 ms).
        """
        by_ns: dict[str, list[str]] = {}
        spaces = set(map(_NAMESPACE, keys))
        if len(spaces) == 1:
            by_ns[spaces.pop()] = list(map(_KEY, keys))
        else:
            for ns, key in keys:
                by_ns.setdefault(ns, []).append(key)
        terms: list[str] = []
        params: list[str] = []
        held = 0
        for ns, names in by_ns.items():
            for start in range(0, len(names), CHUNK):
                part = names[start : start + CHUNK]
                if held + len(part) > CHUNK:
                    yield f"{self._select} WHERE {' OR '.join(terms)}", tuple(params)
                    terms, params, held = [], [], 0
                terms.append(f"(namespace = ? AND item_key IN ({', '.join('?' * len(part))}))")
                params += (ns, *part)
                held += len(part)
        if terms:
            yield f"{self._select} WHERE {' OR '.join(terms)}", tuple(params)

    def get(self, keys: Sequence[Key]) -> dict[Key, Row]:
        """The stored rows of ``keys``, :data:`CHUNK` keys a statement."""
        rows = (
            _row(v)
            for sql, params in self._chunks(keys)
            for v in self._db.q("read items", sql, params)
        )
        return {row.address: row for row in rows}

    def scan(
        self,
        prefix: str | None,
        now: float,
        flt: Filter = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> list[Row]:
        """The live rows of ``prefix`` and below it, filtered, ordered and paged by the
        engine (along its index of the order); with a filter SQL cannot write, the page is
        taken here, building rows only for it.
        """
        where, params, keep = self._where(prefix, now, flt)
        sql = f"{self._select} WHERE {where}{self._order}"
        if keep is None and limit is not None:
            sql += " LIMIT ? OFFSET ?"
            params += (limit, offset)
            keep_offset, keep_limit = 0, None
        else:
            keep_offset, keep_limit = offset, limit
        rows = self._db.q("read items", self._sql(sql), params)
        return [
            _row(values)
            for values in _page(rows, lambda v: str(v[2]), keep, keep_offset, keep_limit)
        ]

    def indexed(self, prefix: str | None, now: float, flt: Filter = None) -> dict[str, Key]:
        """Episode id -> address of the live rows with an episode (their values read only
        for a filter SQL cannot write; no order: sorting every row was half of this read).
        """
        where, params, keep = self._where(prefix, now, flt)
        value = ", value" if keep is not None else ""
        sql = (
            f"SELECT episode_id, namespace, item_key{value} FROM {TABLE} "
            f"WHERE episode_id IS NOT NULL AND {where}"
        )
        rows = self._db.q("read items", self._sql(sql), params)
        return {
            str(eid): (str(ns), str(key))
            for eid, ns, key, *_ in _page(rows, lambda v: str(v[3]), keep, 0, None)
        }

    def namespaces(self) -> list[tuple[str, int, float | None]]:
        """Per namespace: rows that never expire, the latest expiry."""
        rows = self._db.q(
            "list namespaces",
            f"SELECT namespace, count(*) - count(expires_at), max(expires_at) FROM {TABLE} "
            "GROUP BY namespace",
        )
        return [(str(ns), int(forever), latest) for ns, forever, latest in rows]

    def beside(self) -> tuple[str, str]:
        """The columns of a row (:data:`COLUMNS`) and the join that reads them beside each
        hit of an episodic search on PostgreSQL (an episode ``e``: its ``task_id`` the
        namespace, its metadata's ``key`` the key; :meth:`PostgresEpisodicStore.beside
        <ctxkeep.episodic.postgres.PostgresEpisodicStore.beside>`).
        """
        return ", ".join(f"i.{c}" for c in COLUMNS), (
            f"LEFT JOIN {TABLE} i ON i.namespace = e.task_id "
            "AND i.item_key = (e.record::json -> 'metadata' ->> 'key')"
        )

    def joins(self, db: Any) -> bool:
        """Whether ``db`` is a PostgreSQL client of the same pool and ``search_path``."""
        pool = getattr(self._db, "pool", None)
        return (
            pool is not None
            and getattr(db, "pool", None) is pool
            and getattr(db, "search_path", None) == getattr(self._db, "search_path", None)
        )

    def write(self, puts: Mapping[Key, Fields | None], now: float, conn: Any = None) -> list[Row]:
        """Store the merged rows in one transaction (``conn``'s, if given). On SQLite the
        stored rows are read by chunks of :data:`CHUNK` keys and the writes sent in bulk
        (:meth:`_upserts`); on PostgreSQL puts to distinct keys are one statement
        (:meth:`_pg_write`). One put of its own on PostgreSQL is one statement
        (:data:`PG_PUT_ONE`, or a ``DELETE ... RETURNING``) in one round trip, where the
        transaction took four.
        """
        pairs = list(puts.items())
        if conn is None and self._engine == "postgres" and len(pairs) == 1:
            (ns, key), put = pairs[0]
            pg: Any = self._db  # a PgClient, whose q() prepares
            if put is None:
                sql = f"DELETE FROM {TABLE} WHERE namespace = %s AND item_key = %s RETURNING "
                sql += ", ".join(COLUMNS)
                found = pg.q("delete an item", sql, (ns, key), prepare=True)
            else:
                found = pg.q("write an item", PG_PUT_ONE, (ns, key, *put, now), prepare=True)
            return [_row(values) for values in found]
        if conn is None:
            with self._db.tx("write items") as conn:
                return self._write(conn, pairs, now)
        return self._write(conn, pairs, now)

    def _upserts(self, conn: Any, rows: list[tuple[Any, ...]]) -> None:
        """Insert or replace ``rows`` (:class:`Row` values, distinct addresses). SQLite takes them
        :data:`ROWS_PER_INSERT` to a statement (one ``executemany`` step per row was twice
        the CPU of the engine's own work: 5.6 -> 4.5 ms for 1,000 rows); PostgreSQL (puts to one
        key more than once, which the store never sends: :meth:`_pg_write` takes the rest)
        through ``executemany``, which psycopg pipelines.
        """
        one = f"({', '.join('?' for _ in COLUMNS)})"
        head = f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES "
        tail = " ON CONFLICT (namespace, item_key) DO UPDATE SET " + ", ".join(
            f"{c} = excluded.{c}" for c in COLUMNS[2:]
        )
        if self._engine != "sqlite":
            executemany(conn, self._sql(head + one + tail), rows)
            return
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        per = min(ROWS_PER_INSERT, limit // len(COLUMNS))
        for start in range(0, len(rows), per):
            chunk = rows[start : start + per]
            sql = head + ", ".join([one] * len(chunk)) + tail
            conn.execute(sql, list(itertools.chain.from_iterable(chunk)))

    def _write(self, conn: Any, puts: Sequence[tuple[Key, Fields | None]], now: float) -> list[Row]:
        if self._engine == "postgres" and len({key for key, _ in puts}) == len(puts):
            return self._pg_write(conn, puts, now)
        delete = self._sql(f"DELETE FROM {TABLE} WHERE namespace = ? AND item_key = ?")
        stored: dict[Key, Row] = {}
        # the items of write()'s mapping: distinct addresses, so each stored row is replaced
        # once and only those are merged, where each put was (with :meth:`_chunks`' savings,
        # the Python of a write of 10,000 puts to new keys: 3.5 -> 2.6 ms)
        for sql, params in self._chunks([key for key, _ in puts], distinct=True):
            for values in conn.execute(sql, params).fetchall():
                row = _row(values)
                stored[row.address] = row
        final = dict(puts)
        for key, old in stored.items():
            final[key] = merged(old, final[key], now)
        replaced = list(stored.values())
        deletes = [key for key, row in final.items() if row is None]
        # in primary key order: SQLite keeps the rows in that b-tree (WITHOUT ROWID), which
        # then fills page after page instead of splitting pages all over it
        upserts: list[tuple[Any, ...]] = [row for row in final.values() if row is not None]
        _sort_addressed(upserts)
        if deletes:
            executemany(conn, delete, deletes)
        if upserts:
            self._upserts(conn, upserts)
        if self._engine == "postgres" and len(upserts) >= ANALYZE_AFTER and not self._analyzed:
            self._analyzed = True
            conn.execute(f"ANALYZE {TABLE}")
        return replaced

    def _pg_write(
        self, conn: Any, puts: Sequence[tuple[Key, Fields | None]], now: float
    ) -> list[Row]:
        """:meth:`_write` on PostgreSQL of puts to distinct addresses: one statement
        (:data:`PG_PUT_ONE` for one put, else :data:`PG_PUT_MANY`).
        """
        found = self._pg_put(conn, puts, now, PG_PUT_ONE, PG_PUT_MANY)
        return [_row(values) for values in found.fetchall()]

    def _pg_put(
        self, conn: Any, puts: Sequence[tuple[Key, Fields | None]], now: float, one: str, many: str
    ) -> Any:
        """Send the statement of ``puts`` (``one`` for a put, else ``many``, which take their
        parameters as :data:`PG_PUT_ONE` and :data:`PG_PUT_MANY` do); its cursor, not read.
        """
        rows = [put if put is not None else (*key, *_GONE) for key, put in puts]
        if len(rows) == 1 and rows[0][2] is not None:
            found = conn.execute(one, (*rows[0][:2], *rows[0], now), prepare=True)
        else:
            columns = [list(column) for column in zip(*rows, strict=True)]
            found = conn.execute(many, (*columns, now), prepare=True)
        if not self._analyzed and sum(put is not None for _, put in puts) >= ANALYZE_AFTER:
            self._analyzed = True
            conn.execute(f"ANALYZE {TABLE}")
        return found

    def write_forgetting(
        self,
        puts: Mapping[Key, Fields | None],
        now: float,
        conn: Any,
        forgets: Callable[[str], str],
    ) -> Callable[[], list[Row]]:
        """:meth:`write` in ``conn``'s pipelined transaction on PostgreSQL (:meth:`joins`
        said yes), the episodes of the rows it replaces or deletes forgotten in the same
        statement (:func:`pg_put_forgetting`; ``forgets``: the episodic store's CTEs).
        Nothing is read: the put waits for the server once, at its commit. Returns what to
        call once the transaction is over: the replaced rows whose episode is left to forget.
        """
        statements = self._forgetting.get(forgets)
        if statements is None:
            statements = self._forgetting[forgets] = (
                pg_put_forgetting(forgets, many=False),
                pg_put_forgetting(forgets, many=True),
            )
        found = self._pg_put(conn, list(puts.items()), now, *statements)
        return lambda: [_row(values) for values in found.fetchall()]

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
        return [_row(values) for values in rows]

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
        lite = SQLiteClient(path, meta_key="langgraph_store", migrations=SQLITE_MIGRATIONS)
        return SQLItems(lite, "sqlite", "?", "BINARY")
    if url.startswith(("postgresql://", "postgres://")):
        from ctxkeep._pg import PgClient

        client = PgClient(
            url,
            name="ctxkeep-langgraph-store",
            meta_key="langgraph_store",
            migrations=POSTGRES_MIGRATIONS,
        )
        return SQLItems(client, "postgres", "%s", '"C"')
    raise ConfigError(
        f"unsupported store URL {url!r}; use memory://, sqlite:///path or postgresql://..."
    )

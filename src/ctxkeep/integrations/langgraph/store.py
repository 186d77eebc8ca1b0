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
forgets the episode the row pointed at. On ``memory://`` (with the episodic store the store
opened) a put writes its row alone and its episode waits: every search with a query first saves
the episodes of the puts since the last one, in one batch (so it finds them), and an item
replaced or deleted before then is never embedded. On PostgreSQL, where the item table and the
episodes share a database, the three are one transaction (one commit a batch), the rows written
and the episodes they replace forgotten in one statement, nothing read before the commit (one
wait for the server a put, :meth:`SQLItems.write_forgetting
<ctxkeep.integrations.langgraph._store_items.SQLItems.write_forgetting>`); elsewhere a crash in
between leaves at most an orphan episode, which no search returns (searches are scoped to the
episodes live rows point at). An item put with ``index=False``, or whose fields hold no text,
has no episode.

A store opened with ``index=False`` keeps no episodes at all, as LangGraph's own stores do
without an index config: a put writes its row alone, a query does not rank (the matches come
newest-updated first, ``score=None``) and the episodic store and its embedder are not opened
(only if rows an indexed store wrote before are replaced, deleted or expire, to forget their
episodes).

How the parts fit: this module holds the store's rules (batches, puts, recall, TTL); the item
tables (the ``memory://`` dict and the one SQL table of SQLite and PostgreSQL, with its
migrations) are in ``_store_items``, and the I/O-free checks of values, filters, operations
and configs, with filter and namespace matching, in ``_store_filters``.

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
import functools
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Literal

from ctxkeep import _check
from ctxkeep.episodic import (
    EpisodicMemoryStore,
    Hit,
    MemoryEpisodicStore,
    RetrievalConfig,
    open_episodic,
)
from ctxkeep.episodic import (
    IndexConfig as VectorIndexConfig,
)
from ctxkeep.episodic.embedders import Embedder
from ctxkeep.errors import ConfigError, InvalidTypeError, MissingDependencyError
from ctxkeep.sessions.records import loads

try:
    from langgraph.store.base import (
        NOT_PROVIDED,
        BaseStore,
        GetOp,
        IndexConfig,
        ListNamespacesOp,
        NotProvided,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        get_text_at_path,
        tokenize_path,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingDependencyError("langgraph", "langgraph") from exc

from ctxkeep.integrations.langgraph._store_filters import (
    _check_op,
    _check_put,
    _check_search,
    _filter,
    _index_fields,
    _plain_text,
    _ttl_config,
    _value_text,
    matches_filter,
    matches_namespace,
)
from ctxkeep.integrations.langgraph._store_items import MIGRATIONS as MIGRATIONS
from ctxkeep.integrations.langgraph._store_items import TABLE as TABLE
from ctxkeep.integrations.langgraph._store_items import (
    Fields,
    Filter,
    Key,
    MemoryItems,
    Row,
    SQLItems,
    _items_at,
    _ns_text,
    _ns_tuple,
    _row,
    search_items,
    with_episode,
)

__all__ = ["CtxkeepStore"]
# TABLE and MIGRATIONS (imported above ``as`` themselves) live with the item tables and stay
# importable from here, where they were first defined.

logger = logging.getLogger(__name__)

AGENT = "langgraph-store"
"""The ``agent_id`` of every episode the store saves."""

RECALL = RetrievalConfig(smooth=(0.0, 0.0), session_weight=0.0)
"""How the episodic store the store opens searches. Every item's episode is alone in its
session, so the session knobs cannot change a ranking: smoothing with no neighbours scales
every dense score alike, and the session prior of one episode adds a z-score of its own fused
score (both monotone). Turned off, a search skips reading neighbours: on PostgreSQL a round
trip of each search."""

PENDING = "pending:"
"""How a row's ``episode_id`` starts while its episode waits to be saved
(:meth:`CtxkeepStore._settle`)."""

VECTORS = VectorIndexConfig(hnsw_from=50_000)
"""The in-process vector index of the episodic store the store opens (``memory://``,
SQLite): exact up to 50,000 items, not the episodic default's 20,000. A store's batches
come in thousands (LangGraph's ``batch``, a user's import): at 10,000 items one batch of
10,000 more crossed 20,000 and built the HNSW graph, three quarters of that batch on
``memory://`` (then every later batch added to the graph at about 1 ms an item), where
adding to the exact index is a copy. Exact search costs about 3.9 ms at 20,000 vectors
(BENCHMARKS.md), so about 10 ms at 50,000."""


_new_put: Callable[[tuple[Any, ...]], PutOp] = functools.partial(tuple.__new__, PutOp)
"""A :class:`PutOp` of its five fields as one tuple, built without ``PutOp.__new__``'s Python
frame and keywords (less than half the time of building one)."""
_new_search: Callable[[tuple[Any, ...]], SearchOp] = functools.partial(tuple.__new__, SearchOp)
"""A :class:`SearchOp` of its six fields as one tuple, as :data:`_new_put`."""


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
            ``False``: no index (no episodes, no embedder; a query does not rank), as
            LangGraph's stores without one; not with ``episodic``.
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
        index: IndexConfig | Literal[False] | None = None,
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
        self._indexed = index is not False
        if not self._indexed and episodic is not None:
            raise ConfigError(
                "index=False keeps no episodes: pass episodic= or index=False, not both"
            )
        if episodic is not None:
            url = url if url is not None else _url_of(episodic)
        elif url is None:
            from ctxkeep.sessions import default_url

            url = default_url()
        self._url = url
        self._embedder = embedder
        self._episodic_lock = threading.Lock()
        self._owns_episodic = episodic is None
        self._episodic: EpisodicMemoryStore | None = episodic
        if episodic is None and self._indexed:
            self._episodic = self._open_episodic()
        self._pending: dict[str, tuple[Key, Literal[False] | list[str] | None, str, float]] = {}
        """Episodes not saved yet (:meth:`_defers`): mark -> the item's address, its put's
        ``index``, its value's JSON text, the time of the put."""
        self._pending_lock = threading.RLock()
        self._marks = itertools.count()
        self._known: dict[tuple[str, ...], str] = {}
        """Namespaces checked for puts, each with its text (:func:`_check_put`)."""
        try:
            self._fields = _index_fields(index, self._epi.embedder.dim) if self._indexed else []
            self._items = _items_at(url)
            self._rows_alone = (
                self._items if not self._indexed and isinstance(self._items, MemoryItems) else None
            )
            """The item table when a put is its row alone and never waits on I/O
            (``memory://`` with ``index=False``), for :meth:`put`'s short path; else None."""
        except BaseException:
            self._close_episodic()
            raise
        self.index_config = index
        """The index config as given."""

    def _open_episodic(self) -> EpisodicMemoryStore:
        """The episodic store of ``url`` this store opens (and closes)."""
        return open_episodic(
            self._url,
            self._embedder if self._embedder is not None else "local",
            config=RECALL,
            index=VECTORS,
        )

    @property
    def episodic(self) -> EpisodicMemoryStore:
        """The episodic store the items are indexed in, every put's episode saved in it. A
        store opened with ``index=False`` opens it on first use only: to forget the episodes
        of rows an indexed store wrote.
        """
        self._settle()
        return self._epi

    @property
    def _epi(self) -> EpisodicMemoryStore:
        """:attr:`episodic` as it is: the episodes of deferred puts not saved yet."""
        if self._episodic is None:
            with self._episodic_lock:
                if self._episodic is None:
                    self._episodic = self._open_episodic()
        return self._episodic

    def _close_episodic(self) -> None:
        if self._owns_episodic and self._episodic is not None:
            self._episodic.close()

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the TTL sweeper, close the item table and the episodic store it opened."""
        self.stop_ttl_sweeper()
        self._items.close()
        self._close_episodic()

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
        ops = ops if type(ops) is list else _check.iterable("ops", ops)
        known = self._known
        gets: list[Key] = []
        for op in ops:
            if type(op) is PutOp:
                _check_put(op, known)
            else:
                _check_op(op, known)
                if isinstance(op, GetOp):
                    gets.append((_ns_text(op.namespace), op.key))
        now = self.clock()
        results: list[Result] = [None] * len(ops)
        refresh: dict[Key, Row] = {}
        stored = self._items.get(gets) if gets else {}
        puts: dict[Key, PutOp] = {}
        names = known  # the puts' namespaces as text, each joined once
        for i, op in enumerate(ops):
            if type(op) is PutOp or isinstance(op, PutOp):
                name = names.get(op.namespace)
                if name is None:  # a delete's namespace (not kept: a put may not go there)
                    name = _ns_text(op.namespace)
                puts[name, op.key] = op
            elif isinstance(op, GetOp):
                row = stored.get((_ns_text(op.namespace), op.key))
                if row is not None and row.live(now):
                    results[i] = row.item()
                    if op.refresh_ttl and row.ttl is not None:
                        refresh[row.address] = row
            elif isinstance(op, SearchOp):
                found = self._search(op, now, _filter(op.filter))
                results[i] = search_items(found)
                if op.refresh_ttl:
                    refresh.update((row.address, row) for row, _ in found if row.ttl is not None)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op, now)
        if refresh:
            ttls = [(k, now + r.ttl * 60) for k, r in refresh.items() if r.ttl is not None]
            self._items.refresh(ttls)
        if puts:
            self._put(puts, now)
        return results

    def put(
        self,
        namespace: tuple[str, ...],
        key: str,
        value: Mapping[str, Any],
        index: Literal[False] | list[str] | None = None,
        *,
        ttl: float | NotProvided | None = NOT_PROVIDED,
    ) -> None:
        """Store or update an item: ``BaseStore.put`` (the same checks, TTL default and
        errors), the one put checked once and written without a batch's other steps.
        """
        if ttl is NOT_PROVIDED:
            ttl = self.ttl_config.get("default_ttl") if self.ttl_config else None
        items = self._rows_alone
        if items is not None and ttl is None and type(value) is dict and type(key) is str:
            # memory:// without an index: a new item is its row appended, checked as
            # _check_put and _value_text check it (a namespace known to be valid, an ASCII
            # key, ``index`` None or False, plain JSON in one encoding), without their frames,
            # the PutOp, or the text of the namespace made again (InMemoryStore keeps the
            # caller's dict; this copy of it, the JSON text, costs the same as its put)
            try:
                name = self._known.get(namespace) if type(namespace) is tuple else None
            except TypeError:  # an unhashable label: checked (and refused) below
                name = None
            if (
                name is not None
                and key.isascii()
                and (index is None or index is False)
                and (text := _plain_text(value)) is not None
            ):
                now = self.clock()
                if items.append((name, key), (name, key, text, now, now, None, None, None)):
                    return
        op = _new_put((namespace, key if type(key) is str else str(key), value, index, ttl))
        _check_put(op, self._known, strict=True)
        self._put({(".".join(namespace), op.key): op}, self.clock())

    def search(
        self,
        namespace_prefix: tuple[str, ...],
        /,
        *,
        query: str | None = None,
        filter: dict[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool | None = None,
    ) -> list[SearchItem]:
        """Search for items within a namespace prefix: ``BaseStore.search`` (the same checks
        and errors, see :meth:`batch` for the order and scores), the one search run without
        a batch's other steps.
        """
        if refresh_ttl is None:
            refresh_ttl = self.ttl_config.get("refresh_on_read", True) if self.ttl_config else True
        op = _new_search((namespace_prefix, filter, limit, offset, query, refresh_ttl))
        flt = _check_search(op)
        now = self.clock()
        found = self._search(op, now, flt)
        if refresh_ttl:
            ttls = {row.address: now + row.ttl * 60 for row, _ in found if row.ttl is not None}
            if ttls:
                self._items.refresh(list(ttls.items()))
        return search_items(found)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` in a worker thread (the backends' drivers are synchronous)."""
        return await asyncio.to_thread(self.batch, list(ops))

    # -- puts -------------------------------------------------------------------------------

    def _text(self, value: Mapping[str, Any], index: Literal[False] | list[str] | None) -> str:
        """The text an item's episode holds ("" when it is not to be indexed)."""
        if index is False or not self._indexed:
            return ""
        fields = self._fields if index is None else [(p, tokenize_path(p)) for p in index]
        texts = [t for _, path in fields for t in get_text_at_path(value, path)]
        return "\n".join(t for t in texts if t.strip())

    def _doc(self, address: Key, text: str, now: float) -> dict[str, Any]:
        """The episode of the item at ``address`` whose indexed text is ``text``."""
        ns, key = address
        return {
            "session_id": _session_id(),  # no neighbours
            "task_goal": "",
            "summary": text,
            "metadata": {"namespace": list(_ns_tuple(ns)), "key": key},
            "agent_id": AGENT,
            "task_id": ns,
            "created_at": now,
        }

    def _put(self, puts: Mapping[Key, PutOp], now: float) -> None:
        """Save the new episodes, write the rows, then forget what they replaced."""
        rows: dict[Key, Fields | None] = {}  # None: a delete; plain tuples (see Fields)
        docs: dict[Key, dict[str, Any]] = {}
        indexes = self._indexed and not self._defers()
        for address, op in puts.items():  # the addresses as they are: one tuple a put
            value = op.value
            if value is None:
                rows[address] = None
                continue
            ns, key = address
            if op.ttl is None:
                rows[address] = (ns, key, _value_text(value), now, now, None, None, None)
            else:
                ttl = float(op.ttl)
                rows[address] = (ns, key, _value_text(value), now, now, now + ttl * 60, ttl, None)
            if indexes and (text := self._text(value, op.index)):
                docs[address] = self._doc(address, text, now)
        defers = self._indexed and not indexes
        if not defers and not docs and self._episodic is None:
            # no episode to save, no transaction to join (index=False before any forgetting)
            replaced = self._items.write(rows, now)
            if replaced:
                self._forget(replaced)
            return

        def save() -> dict[Key, str]:
            if not docs:
                return {}
            # each item's session is its own, made above: nothing of it to look up
            saved = self._epi._save_episodes(docs.values(), new_sessions=True)
            ids = dict(zip(docs, saved, strict=True))
            for k, eid in ids.items():
                rows[k] = with_episode(rows[k], eid)  # type: ignore[arg-type]
            return ids

        if defers:
            # the episodes, and the texts they index, wait for the next read of the index
            # (:meth:`_settle`); each row points at its episode's mark until then
            with self._pending_lock:
                for k, op in puts.items():
                    row = rows[k]
                    if row is not None and op.index is not False:
                        mark = f"{PENDING}{next(self._marks)}"
                        rows[k] = with_episode(row, mark)
                        self._pending[mark] = (k, op.index, row[2], now)
                replaced = self._items.write(rows, now)
                self._forget(replaced)
            return
        joined = self._joined()
        if joined is not None:
            # one transaction: the episodes, the rows, the forgetting (all or nothing)
            forgets = getattr(self._episodic, "forgets", None)
            if forgets is None or not isinstance(self._items, SQLItems):
                with joined("put items") as conn:
                    save()
                    replaced = self._items.write(rows, now, conn)
                    self._forget(replaced)
                return
            # the replaced rows' episodes forgotten in the rows' statement, nothing read
            # before the commit: one wait for the server (SQLItems.write_forgetting)
            with joined("put items") as conn:
                save()
                left = self._items.write_forgetting(rows, now, conn, forgets)
            # episodes that share a session (none of the store's own): forgotten apart
            self._forget(left())
            return
        ids = save()
        try:
            replaced = self._items.write(rows, now)
        except BaseException:
            if ids:
                self._epi.forget(episode_id=list(ids.values()))
            raise
        self._forget(replaced)

    def _joined(self) -> Callable[[str], AbstractContextManager[Any]] | None:
        """The episodic store's joinable transaction, when the item table is in the same
        database (PostgreSQL: the same pool and ``search_path``), else None.
        """
        if self._episodic is None:
            return None
        transaction = getattr(self._episodic, "transaction", None)
        db = getattr(self._episodic, "db", None)
        if transaction is None or db is None or not self._items.joins(db):
            return None
        return transaction  # type: ignore[no-any-return]

    def _forget(self, rows: Iterable[Row]) -> None:
        """Forget the episodes of ``rows`` (replaced, deleted or expired): a deferred one is
        dropped before it is saved.
        """
        gone = [r.episode_id for r in rows if r.episode_id is not None]
        if gone and self._pending:
            with self._pending_lock:
                gone = [e for e in gone if self._pending.pop(e, None) is None]
        if gone:
            self._epi.forget(episode_id=gone)

    def _defers(self) -> bool:
        """Whether puts defer their episodes to the next read of the index (:meth:`_settle`):
        on ``memory://`` with the episodic store this store opened, where nothing is durable
        and nobody else reads the episodes. A put then writes its row alone, as
        ``index=False`` does, and the episodes of every put since the last search are saved
        in one batch: one pass of the episodic pipeline (embedding, postings, vectors) for
        many puts, and none for an item replaced or deleted before it was searched.
        """
        return self._owns_episodic and isinstance(self._items, MemoryItems)

    def _settle(self) -> None:
        """Save the deferred episodes (one batch) and point their rows at them; an episode
        whose row has moved on meanwhile (another thread's put) is forgotten. Every read of
        the index runs this first: a search right after a put finds it.
        """
        if not self._pending:
            return
        with self._pending_lock:
            pending, self._pending = self._pending, {}
            if not pending:
                return
            try:
                texts = [
                    (mark, k, self._text(loads(value), index), at)
                    for mark, (k, index, value, at) in pending.items()
                ]
                docs = [self._doc(k, text, at) for _, k, text, at in texts if text]
                saved = iter(self._epi._save_episodes(docs, new_sessions=True))
            except BaseException:
                self._pending = pending | self._pending
                raise
            assert isinstance(self._items, MemoryItems)
            # an item whose indexed fields hold no text has no episode
            ids = [(k, mark, next(saved) if text else None) for mark, k, text, _ in texts]
            stale = self._items.settle(ids)
            if stale:
                self._epi.forget(episode_id=stale)

    # -- reads ------------------------------------------------------------------------------

    def _search(self, op: SearchOp, now: float, flt: Filter) -> list[tuple[Row, float | None]]:
        """One page of matches: ranked by recall if there is a query, then the rest
        (``flt``: the op's filter as :func:`_check_search` gave it).

        Without a query, the item table filters, orders and pages (rows are built for the
        page only); with one, recall ranks (:meth:`_recall`), and rows are built for its hits
        and, when they do not fill the page, for the first ``offset + limit`` of the order.
        """
        prefix = _ns_text(op.namespace_prefix) if op.namespace_prefix else None
        want = op.offset + op.limit
        if not (op.query and want and self._indexed):
            page = self._items.scan(prefix, now, flt, op.offset, op.limit)
            return [(row, None) for row in page]
        ranked = self._recall(op.query, prefix, flt, want, now)
        if len(ranked) >= want:
            return ranked[op.offset : want]
        seen = {row.address for row, _ in ranked}
        # The first ``want`` of the order hold every row of the page not ranked.
        rest = [
            (r, None) for r in self._items.scan(prefix, now, flt, 0, want) if r.address not in seen
        ]
        return list(itertools.islice(itertools.chain(ranked, rest), op.offset, want))

    def _recall(
        self, query: str, prefix: str | None, flt: Filter, want: int, now: float
    ) -> list[tuple[Row, float | None]]:
        """The best ``want`` items of the search's scope for ``query`` by hybrid recall, with
        their scores; rows are read for the hits only.

        First the episodic store is searched whole (no filter: its index answers, where a
        filter made it list the scope's rows first; at 10,000 items that listing and the
        item table's were most of a search), and the hits are kept that are the current
        episode of a live row of the scope; asked once more for ``4 * want`` hits if too
        few were. A scope that is a small part of the store is then searched within it:
        the episode ids of its rows, up to :attr:`exact_scope` of them, else their
        namespaces, asking for more until enough hits are found.
        """
        self._settle()
        checked: dict[str, Row | None] = {}
        top_k = want
        for _ in range(2):
            found, read = self._found(query, top_k)
            hits = self._in_scope(found, prefix, flt, want, now, checked, read)
            if len(hits) >= want or len(found) < top_k:
                return hits
            top_k *= 4
        indexed = self._items.indexed(prefix, now, flt)
        if self._pending:  # put since the settling above: not searchable yet
            indexed = {e: at for e, at in indexed.items() if not e.startswith(PENDING)}
        if not indexed:
            return []
        if len(indexed) <= self.exact_scope:
            found, read = self._found(query, want, {"episode_id": list(indexed)})
            return self._in_scope(found, prefix, flt, want, now, checked, read)
        scope = {"agent_id": AGENT, "task_id": sorted({ns for ns, _ in indexed.values()})}
        while True:
            found, read = self._found(query, top_k, scope)
            hits = self._in_scope(found, prefix, flt, want, now, checked, read)
            if len(hits) >= want or len(found) < top_k:
                return hits
            top_k *= 4

    def _found(
        self, query: str, top_k: int, filters: dict[str, Any] | None = None
    ) -> tuple[list[Hit], dict[Key, Row] | None]:
        """The episodic search's hits, and where the item table is in the episodes'
        PostgreSQL database (:meth:`_joined`), the rows at the hits' addresses read in the
        same statement (``PostgresEpisodicStore.beside``); else None: :meth:`_in_scope`
        reads them, a round trip more on PostgreSQL.
        """
        beside = getattr(self._episodic, "beside", None)
        items = self._items
        if beside is None or not isinstance(items, SQLItems) or self._joined() is None:
            return self._epi.search(query, top_k, filters=filters), None
        with beside(*items.beside()) as got:
            found = self._epi.search(query, top_k, filters=filters)
        if got.rows is None:
            return found, None
        rows = (_row(values) for values in got.rows if values[0] is not None)
        return found, {row.address: row for row in rows}

    def _in_scope(
        self,
        found: list[Hit],
        prefix: str | None,
        flt: Filter,
        want: int,
        now: float,
        checked: dict[str, Row | None],
        read: dict[Key, Row] | None = None,
    ) -> list[tuple[Row, float | None]]:
        """The first ``want`` hits that are the current episode of a live row of the scope
        (``prefix``, ``flt``), with that row, in the order found.

        Each put saves a new episode, so the same episode id is the same version of the
        item; an episode of another version, of no item (another user of the episodic
        store) or out of the scope is left out. Rows are read only for the hits needed, in
        the order found (``checked`` keeps what was decided: episode id -> its row, or
        ``None``, across the searches of one recall), unless the search read them
        (``read``: the row at each hit's address, :meth:`_found`).
        """
        below = None if prefix is None else prefix + "."

        def address(hit: Hit) -> Key | None:
            e = hit.episode
            ns, key = e.task_id, e.metadata.get("key")
            if e.agent_id != AGENT or ns is None or not isinstance(key, str):
                return None
            if below is not None and ns != prefix and not ns.startswith(below):
                return None
            return ns, key

        out: list[tuple[Row, float | None]] = []
        pos = 0
        while pos < len(found) and len(out) < want:
            chunk: list[Hit] = []
            unread: dict[str, Key] = {}
            hopeful = 0  # hits of the chunk that may be kept
            while pos < len(found) and hopeful < want - len(out):
                hit = found[pos]
                pos += 1
                chunk.append(hit)
                eid = hit.episode.episode_id
                if eid in checked:
                    hopeful += checked[eid] is not None
                elif (at := address(hit)) is not None:
                    unread[eid] = at
                    hopeful += 1
                else:
                    checked[eid] = None
            if read is not None:
                rows = read
            else:
                rows = self._items.get(list(unread.values())) if unread else {}
            for eid, at in unread.items():
                row = rows.get(at)
                keep = (
                    row is not None
                    and row.episode_id == eid
                    and row.live(now)
                    and (not flt or matches_filter(loads(row.value), flt))
                )
                checked[eid] = row if keep else None
            for hit in chunk:
                row = checked[hit.episode.episode_id]
                if row is not None and len(out) < want:
                    out.append((row, hit.score))
        return out

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


def _session_id() -> str:
    """A new session for one item's episode: ``langgraph-store/``, the time in nanoseconds,
    then 64 random bits (32 hex digits). Unique, and in the order made, so the episodes'
    index of sessions grows at its end: random ids (32 random hex digits before) split its
    pages all over it, about two thirds full (PostgreSQL, 10,000 items: 1.04 -> 0.79 MB).
    Nothing names these sessions by a prefix (episode ids stay random for that).
    """
    return f"{AGENT}/{time.time_ns():016x}{os.urandom(8).hex()}"


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

"""The context fabric on PostgreSQL: task state and the inter-agent bus for processes on many
machines, on tables, with ``LISTEN``/``NOTIFY`` to wake waiting receivers.

:class:`PostgresBus` keeps the delivery rules of ``ctxkeep.fabric.bus`` and the semantics of
the Redis Streams bus (``ctxkeep.fabric.redis_bus``), with every piece of state in tables, so
any number of processes agree on who belongs to which task, who listens to what, and what is
pending:

* An agent's inbox is its rows of ``ctxkeep_bus_inbox``, taken in ``entry_id`` order (an
  identity: messages one sender sends to one agent arrive in the order they were sent).
  ``send`` inserts one row for a direct message, one per subscriber for a topic message, in
  one statement (all or none), and ``pg_notify`` in that statement wakes the recipients'
  waiting receivers when it commits.
* ``receive`` takes, in one statement (``UPDATE ... FOR UPDATE SKIP LOCKED``, so concurrent
  consumers never take the same row): first this consumer's rows that :meth:`PostgresBus.recover`
  marked for replay, then rows another consumer (or this one) received and left unacked for
  ``claim_idle_ms`` (that consumer is presumed dead), then rows never delivered. A taken row
  names its consumer and the database's time of delivery; it stays pending until ``ack``
  deletes it. At least once: a consumer killed with messages pending loses none of them.
* ``handle`` skips messages already marked handled for the agent (``ctxkeep_bus_handled``),
  runs the handler on the rest, then marks and acks each in one statement. For exactly-once
  effects, commit the effect with the mark: pass :meth:`PostgresBus.handled_mark` to
  :meth:`PostgresTaskState.update_with`, which writes nothing if the mark is already set.
* A row no ctxkeep can decode (corrupt, written by a newer ctxkeep, a payload
  :class:`~ctxkeep.fabric.bus.IPCMessage` refuses) is moved by the receive that meets it to
  ``ctxkeep_bus_dead`` with the reason, in one statement, so the messages behind it flow.
* :meth:`PostgresBus.stats` counts the inbox rows not yet taken (depth), those taken and not
  acked (pending) and the dead letters, in one statement.
* :class:`~ctxkeep.fabric.postgres_state.PostgresTaskState` (``ctxkeep.fabric.postgres_state``,
  exported here too) is a task's shared state with compare-and-set versions;
  :meth:`PostgresBus.task_state` gives one over the bus's connections.

Waiting. A receive with a ``timeout`` sleeps on a condition that a listener thread (one
connection per bus, ``LISTEN ctxkeep_bus``, opened at the first waiting receive) signals when a
notification for the agent arrives; the payload is the md5 of the schema and the agent's id,
so tenants in other schemas of the database wake no one here, and an agent id of any length
fits ``NOTIFY``'s 8000 bytes. A waiting receive reads the inbox again only when woken, or
every ``block_ms`` (default 5 s) to claim messages that became idle and to cover a listener
connection that was lost (a notification sent while it reconnects is not delivered).

The tables, the statements and the stored forms are in ``ctxkeep.fabric.postgres_sql`` (free of
I/O); they live in the connection's ``search_path`` schema, as every PostgreSQL store of
ctxkeep's (the server gives each tenant its own). The connection pool, error translation and
schema versions are :class:`~ctxkeep._pg.PgClient`'s; each inbox row and task row carries the
version of its own record too, so one written by a newer ctxkeep is refused by name even in a
schema set up by an older one.

Times that decide redelivery (idle, handled marks' age) are the database server's, so hosts
with skewed clocks agree.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ctxkeep import _check
from ctxkeep._pg import PgClient
from ctxkeep.errors import ConfigError, InvalidMessageError, SchemaVersionError, UnknownAgentError
from ctxkeep.fabric.bus import (
    BusStats,
    DeadLetter,
    IPCMessage,
    check_ids,
    check_limit,
    check_message,
    check_receive,
)
from ctxkeep.fabric.postgres_sql import (
    ACK_SQL,
    CHANNEL,
    DEAD_LETTER_SQL,
    MAX_ID,
    MESSAGE_VERSION,
    META_KEY,
    MIGRATIONS,
    RECOVER_SQL,
    SEND_DIRECT_SQL,
    SEND_TOPIC_SQL,
    SETTLE_SQL,
    STATS_SQL,
    SUBSCRIBE_SQL,
    TAKE_SQL,
    check_name,
    decode_message,
    encode_message,
    message_names,
    wake_key,
)
from ctxkeep.fabric.postgres_state import PgHandledMark, PostgresTaskState

log = logging.getLogger(__name__)


# -- the listener -------------------------------------------------------------------------------


class _Listener:
    """One ``LISTEN`` connection in a daemon thread; receivers wait on its condition.

    Each wake key counts the notifications seen for it; ``epoch`` counts (re)connections (a
    reconnection may have missed notifications, so it wakes everyone).
    """

    TICK = 0.25
    """How often the thread checks whether it should stop (seconds)."""

    def __init__(self, url: str, where: str) -> None:
        self._url = url
        self._where = where
        self._cond = threading.Condition()
        self._seen: dict[str, int] = {}
        self._epoch = 0
        self._listening = False
        self._stop = False
        self._thread = threading.Thread(
            target=self._run, name=f"ctxkeep-bus-listener-{where}", daemon=True
        )
        self._thread.start()

    def ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the ``LISTEN`` to be in place."""
        with self._cond:
            return self._cond.wait_for(lambda: self._listening or self._stop, timeout)

    def mark(self, key: str) -> tuple[int, int]:
        """Where the notifications for ``key`` stand now (pass it to :meth:`wait`); from now
        on they are counted (only the keys of agents received for here are, so the counts stay
        as many as this process's agents, whatever the database's other agents).
        """
        with self._cond:
            return self._epoch, self._seen.setdefault(key, 0)

    def wait(self, key: str, since: tuple[int, int], timeout: float) -> None:
        """Return when a notification for ``key`` came after ``since``, or after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self.mark(key) != since or self._stop, timeout)

    def _run(self) -> None:
        import psycopg  # present: ctxkeep._pg imported it (or named the extra to install)

        failures = 0
        while not self._stop:
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    failures = 0
                    with self._cond:
                        self._listening = True
                        self._epoch += 1
                        self._cond.notify_all()
                    while not self._stop:
                        for note in conn.notifies(timeout=self.TICK):
                            with self._cond:
                                if note.payload in self._seen:
                                    self._seen[note.payload] += 1
                                    self._cond.notify_all()
            except psycopg.Error as exc:
                if not failures:
                    log.warning("bus listener on %s lost its connection: %s", self._where, exc)
                failures += 1
            with self._cond:
                self._listening = False
            if not self._stop:  # try again, backing off to one attempt in 5 s
                with self._cond:
                    self._cond.wait_for(lambda: self._stop, min(5.0, self.TICK * 2**failures))

    def close(self) -> None:
        """Stop the thread (it closes its connection) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()


# -- the bus ------------------------------------------------------------------------------------


class PostgresBus:
    """A :class:`~ctxkeep.fabric.bus.MessageBus` on PostgreSQL tables (see the module
    docstring).

    Args:
        url: a libpq URI; its ``search_path`` schema holds the tables.
        consumer: this process's name among the processes serving the same agents (a process
            restarted under its old name can :meth:`recover` its pending messages at once;
            processes that share a name share them).
        claim_idle_ms: a message received and not acked for this long is redelivered to the
            next receive of any consumer (keep it above the longest handler).
        block_ms: how long a waiting receive sleeps at most between two reads when no
            notification wakes it (a check for idle messages to claim).
        handled_ttl: how long (seconds) handled ids are remembered to skip redeliveries.
        min_size: connections the pool keeps open when idle (0: an idle bus holds none after
            the pool's ``max_idle``, 10 minutes; a service with many tenants holds one bus
            each).
        max_size: the most connections the bus's pool opens (the listener has one more).

    Raises:
        ConfigError: a missing consumer name, a bad setting or URL.
        StorageError: PostgreSQL does not answer.
        SchemaVersionError: the schema holds fabric tables of a newer ctxkeep.

    """

    def __init__(
        self,
        url: str,
        *,
        consumer: str,
        claim_idle_ms: int = 30_000,
        block_ms: int = 5_000,
        handled_ttl: float = 7 * 24 * 3600,
        min_size: int = 0,
        max_size: int = 4,
    ) -> None:
        if not isinstance(consumer, str) or not consumer or "\x00" in consumer:
            raise ConfigError("PostgresBus needs a consumer name (e.g. f'{host}-{pid}')")
        for name, value in (
            ("claim_idle_ms", claim_idle_ms),
            ("block_ms", block_ms),
            ("handled_ttl", handled_ttl),
        ):
            if _check.number(name, value) <= 0:
                raise ConfigError(f"{name} must be positive, got {value!r}")
        _check.integer("min_size", min_size, minimum=0)
        _check.integer("max_size", max_size, minimum=max(min_size, 1))
        self.url = url
        self.db = PgClient(
            url, name="ctxkeep-fabric", meta_key=META_KEY, migrations=MIGRATIONS,
            min_size=min_size, max_size=max_size,
        )  # fmt: skip
        self.where = self.db.where
        self.consumer = consumer
        self.claim_idle_ms = int(claim_idle_ms)
        self.block_ms = int(block_ms)
        self.handled_ttl = float(handled_ttl)
        try:
            self.schema = str(self.db.q("read the schema", "SELECT current_schema()")[0][0])
        except BaseException:
            self.db.close()
            raise
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self._closed = False

    def close(self) -> None:
        """Stop the listener and close the connection pool."""
        with self._lock:
            listener, self._listener, self._closed = self._listener, None, True
        if listener is not None:
            listener.close()
        self.db.close()

    def __enter__(self) -> PostgresBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def task_state(self, task_id: str) -> PostgresTaskState:
        """The shared state of ``task_id`` over this bus's connections (same schema, so an
        effect and a handled mark commit together).
        """
        return PostgresTaskState(self.url, task_id, db=self.db)

    # -- membership ----------------------------------------------------------------------

    def register(self, agent_id: str, task_id: str | None) -> None:
        """Make ``agent_id`` a member of ``task_id`` (moving drops its old subscriptions)."""
        check_name("agent_id", agent_id)
        if task_id is not None:
            check_name("task_id", task_id)
        with self.db.tx("register an agent") as conn:
            row = conn.execute(
                "SELECT task_id FROM ctxkeep_bus_agents WHERE agent_id = %s FOR UPDATE",
                (agent_id,),
            ).fetchone()
            if row is None or row[0] != task_id:
                conn.execute(
                    "DELETE FROM ctxkeep_bus_subscriptions WHERE agent_id = %s", (agent_id,)
                )
            conn.execute(
                "INSERT INTO ctxkeep_bus_agents (agent_id, task_id) VALUES (%s, %s) "
                "ON CONFLICT (agent_id) DO UPDATE SET task_id = excluded.task_id",
                (agent_id, task_id),
            )

    def task_of(self, agent_id: str) -> str | None:
        """The task ``agent_id`` belongs to.

        Raises:
            UnknownAgentError: the agent never registered.

        """
        check_name("agent_id", agent_id)
        rows = self.db.q(
            "read an agent's task",
            "SELECT task_id FROM ctxkeep_bus_agents WHERE agent_id = %s",
            (agent_id,),
        )
        if not rows:
            raise UnknownAgentError(f"agent {agent_id!r} has not joined a task")
        return rows[0][0]  # type: ignore[no-any-return]

    def subscribe(self, agent_id: str, topic: str) -> None:
        """Deliver ``topic`` messages of the agent's task to it."""
        check_name("agent_id", agent_id)
        check_name("topic", topic)
        rows = self.db.q("subscribe", SUBSCRIBE_SQL, {"agent": agent_id, "topic": topic})
        if not rows[0][0]:
            raise UnknownAgentError(f"agent {agent_id!r} has not joined a task")

    # -- sending -------------------------------------------------------------------------

    def send(self, message: IPCMessage) -> str:
        """Store the message in its recipient's inbox, or in every subscriber's (one
        statement: all or none); returns its id.
        """
        check_message(message)
        message_names(message)
        params = {
            "id": message.id,
            "version": MESSAGE_VERSION,
            "message": encode_message(message),
            "recipient": message.recipient,
            "topic": message.topic,
            "task": message.task_id,
            "sender": message.sender,
        }
        sql = SEND_DIRECT_SQL if message.recipient is not None else SEND_TOPIC_SQL
        self.db.q("send a message", sql, params)
        return message.id

    # -- receiving -----------------------------------------------------------------------

    def receive(
        self, agent_id: str, *, max_messages: int = 100, timeout: float = 0
    ) -> list[IPCMessage]:
        """Up to ``max_messages`` for ``agent_id``: first those :meth:`recover` put back,
        then those left unacked for ``claim_idle_ms``, then new ones, waiting up to
        ``timeout`` s (woken by ``NOTIFY``). They stay pending until acked.
        """
        check_name("agent_id", agent_id)
        max_messages, timeout = check_receive(max_messages, timeout)
        return self._read(agent_id, max_messages, timeout)

    def ack(self, agent_id: str, ids: Iterable[str]) -> None:
        """Mark received messages handled: they leave the inbox for good, whichever consumer
        received them. Ids of messages not received are ignored.
        """
        check_name("agent_id", agent_id)
        found = check_ids(ids)
        if found:
            self._run("ack", ACK_SQL, {"agent": agent_id, "ids": found})

    def handle(
        self,
        agent_id: str,
        handler: Callable[[IPCMessage], None],
        *,
        timeout: float = 0,
        max_messages: int = 100,
    ) -> int:
        """Receive, run ``handler`` on each message not yet handled by this agent, then mark
        and ack it; returns how many the handler ran on.

        An exception from the handler propagates; that message and the rest of the batch stay
        pending and are redelivered (after ``claim_idle_ms``, or at once after
        :meth:`recover`).
        """
        check_name("agent_id", agent_id)
        _check.has_method("handler", handler, "__call__", "function")
        max_messages, timeout = check_receive(max_messages, timeout)
        taken = self._read(agent_id, max_messages, timeout)
        if not taken:
            return 0
        seen = self._handled_ids(agent_id, [m.id for m in taken])
        n = 0
        for message in taken:
            if message.id in seen:
                self.ack(agent_id, [message.id])
                continue
            handler(message)
            seen.add(message.id)
            self._run(
                "mark a message handled",
                SETTLE_SQL,
                {"agent": agent_id, "id": message.id, "ttl": self.handled_ttl},
            )
            n += 1
        return n

    def handled_mark(self, agent_id: str, message_id: str) -> PgHandledMark:
        """The mark :meth:`handle` checks, to commit in the same transaction as an effect."""
        check_name("agent_id", agent_id)
        check_name("message_id", message_id)
        return PgHandledMark(agent_id, message_id)

    def was_handled(self, agent_id: str, message_id: str) -> bool:
        """Whether ``agent_id`` has handled ``message_id`` (within ``handled_ttl``)."""
        mark = self.handled_mark(agent_id, message_id)
        with self.db.errors("read a handled mark"), self.db.connection() as conn:
            return mark.is_set(conn)

    def recover(self, agent_id: str) -> int:
        """Redeliver this consumer's unacked messages first, on the next receive, without
        waiting ``claim_idle_ms`` (after a crash, under the old consumer name); returns how
        many there are.
        """
        check_name("agent_id", agent_id)
        rows = self.db.q(
            "recover pending messages", RECOVER_SQL, {"agent": agent_id, "me": self.consumer}
        )
        return int(rows[0][0])

    # -- dead letters --------------------------------------------------------------------

    def dead_letters(self, agent_id: str, *, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` inbox rows of the agent that could not be decoded (moved aside by
        a receive, with the reason), oldest first.
        """
        check_name("agent_id", agent_id)
        rows = self.db.q(
            "read dead letters",
            "SELECT dead_id, reason, record FROM ctxkeep_bus_dead WHERE agent_id = %s "
            "ORDER BY dead_id LIMIT %s",
            (agent_id, check_limit(limit)),
        )
        return [DeadLetter(id=str(d), reason=r, record=_record(rec)) for d, r, rec in rows]

    def delete_dead_letters(self, agent_id: str, ids: Iterable[str]) -> int:
        """Remove dead letters by id (unknown ids are ignored); returns how many were removed."""
        check_name("agent_id", agent_id)
        digits = [i for i in check_ids(ids) if i.isascii() and i.isdigit() and len(i) <= 19]
        found = [n for n in map(int, digits) if n <= MAX_ID]
        if not found:
            return 0
        return self._run(
            "delete dead letters",
            "DELETE FROM ctxkeep_bus_dead WHERE agent_id = %s AND dead_id = ANY(%s)",
            (agent_id, found),
        )

    # -- counts --------------------------------------------------------------------------

    def stats(self) -> BusStats:
        """The messages of every agent in the schema: undelivered (depth), received and not
        acked (pending) and dead letters, in one statement.
        """
        depth, pending, dead = self.db.q("count the bus's messages", STATS_SQL)[0]
        return BusStats(depth=int(depth), pending=int(pending), dead_letters=int(dead))

    # -- internals -----------------------------------------------------------------------

    def _run(self, doing: str, sql: str, params: tuple[Any, ...] | Mapping[str, Any]) -> int:
        """Run one statement that returns no rows (autocommit); how many rows it changed."""
        with self.db.errors(doing), self.db.connection() as conn:
            return int(conn.execute(sql, params).rowcount)

    def _listening(self, timeout: float) -> _Listener | None:
        """The listener, started on first use, after waiting up to ``timeout`` s for its
        ``LISTEN`` to be in place (a listener that cannot connect leaves the receive to read
        every ``block_ms``).
        """
        with self._lock:
            if self._closed:
                return None
            if self._listener is None:
                self._listener = _Listener(self.url, self.where)
            listener = self._listener
        listener.ready(timeout)
        return listener

    def _read(self, agent_id: str, max_messages: int, timeout: float) -> list[IPCMessage]:
        if max_messages <= 0:
            return []
        deadline = time.monotonic() + timeout
        listener = self._listening(min(timeout, 10.0)) if timeout > 0 else None
        key = wake_key(self.schema, agent_id)
        while True:
            since = listener.mark(key) if listener is not None else (0, 0)
            got = self._take(agent_id, max_messages)
            left = deadline - time.monotonic()
            if got or left <= 0 or listener is None:
                return got
            listener.wait(key, since, min(left, self.block_ms / 1000))

    def _take(self, agent_id: str, max_messages: int) -> list[IPCMessage]:
        """One read of the inbox: the rows taken, decoded; undecodable ones dead-lettered."""
        rows = self.db.q(
            "receive",
            TAKE_SQL,
            {
                "agent": agent_id,
                "me": self.consumer,
                "idle_ms": self.claim_idle_ms,
                "n": max_messages,
            },
        )
        out: list[IPCMessage] = []
        for _, entry_id, message_id, version, text in sorted(rows, key=lambda r: (r[0], r[1])):
            try:
                out.append(decode_message(message_id, version, text))
            except (InvalidMessageError, SchemaVersionError) as exc:
                log.warning("bus entry %s of %s moved to dead letters: %s", entry_id, agent_id, exc)
                record = {"v": str(version), "m": text, "entry_id": str(entry_id), "id": message_id}
                self._run(
                    "move an entry to dead letters",
                    DEAD_LETTER_SQL,
                    {"entry": entry_id, "reason": str(exc), "record": json.dumps(record)},
                )
        return out

    def _handled_ids(self, agent_id: str, ids: list[str]) -> set[str]:
        rows = self.db.q(
            "read handled marks",
            "SELECT message_id FROM ctxkeep_bus_handled "
            "WHERE agent_id = %s AND message_id = ANY(%s)",
            (agent_id, ids),
        )
        return {r[0] for r in rows}


def _record(text: str) -> dict[str, str]:
    """A dead letter's stored record (the inbox row as it was found)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"record": text}
    if not isinstance(value, dict):
        return {"record": text}
    return {str(k): str(v) for k, v in value.items()}


__all__ = ["PgHandledMark", "PostgresBus", "PostgresTaskState"]

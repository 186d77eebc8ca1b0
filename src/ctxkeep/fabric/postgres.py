"""The context fabric on PostgreSQL: task state and the inter-agent bus for processes on many
machines, on tables, with ``LISTEN``/``NOTIFY`` to wake waiting receivers.

:class:`PostgresBus` keeps the delivery rules of ``ctxkeep.fabric.bus`` and the semantics of
the Redis Streams bus (``ctxkeep.fabric.redis_bus``), with every piece of state in tables, so
any number of processes agree on who belongs to which task, who listens to what, and what is
pending:

* An agent's inbox is its rows of ``ctxkeep_bus_inbox``, in ``entry_id`` order (a sequence:
  messages to one agent arrive in the order they were sent). ``send`` inserts one row for a
  direct message, one per subscriber for a topic message, in one statement (all or none), and
  ``pg_notify`` in that statement wakes the recipients' waiting receivers when it commits.
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
* :class:`PostgresTaskState` is a task's shared state: one row of ``ctxkeep_fabric_tasks``
  with a version; every write locks the row (``SELECT ... FOR UPDATE``) and bumps the version,
  so :meth:`PostgresTaskState.update` is compare-and-set (a write based on an old version is
  refused with :class:`~ctxkeep.errors.StaleTaskStateError`; of two racing writers exactly one
  wins) and :meth:`PostgresTaskState.update_with` re-reads under the lock instead.

Waiting. A receive with a ``timeout`` sleeps on a condition that a listener thread (one
connection per bus, ``LISTEN ctxkeep_bus``, opened at the first waiting receive) signals when a
notification for the agent arrives; the payload is the md5 of the schema and the agent's id,
so tenants in other schemas of the database wake no one here, and an agent id of any length
fits ``NOTIFY``'s 8000 bytes. A waiting receive reads the inbox again only when woken, or
every ``block_ms`` (default 5 s) to claim messages that became idle and to cover a listener
connection that was lost (a notification sent while it reconnects is not delivered).

Tables (in the connection's ``search_path`` schema, as every PostgreSQL store of ctxkeep; the
server gives each tenant its own): ``ctxkeep_fabric_tasks``, ``ctxkeep_bus_agents`` (agent ->
task), ``ctxkeep_bus_subscriptions`` (agent, topic), ``ctxkeep_bus_inbox``,
``ctxkeep_bus_handled``, ``ctxkeep_bus_dead``. Their version is the ``fabric`` row of
``ctxkeep_meta`` (:data:`MIGRATIONS`, applied by :class:`~ctxkeep._pg.PgClient`); each inbox
row and task row carries the version of its own record too, so one written by a newer ctxkeep
is refused by name even in a schema set up by an older one.

Times that decide redelivery (idle, handled marks' age) are the database server's, so hosts
with skewed clocks agree.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ctxkeep import _check
from ctxkeep._pg import PgClient
from ctxkeep.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidMessageError,
    SchemaVersionError,
    StaleTaskStateError,
    UnknownAgentError,
)
from ctxkeep.fabric.bus import (
    DeadLetter,
    IPCMessage,
    check_ids,
    check_limit,
    check_message,
    check_receive,
)
from ctxkeep.fabric.jsondata import check_json, json_copy

log = logging.getLogger(__name__)

META_KEY = "fabric"
"""The ``ctxkeep_meta`` row that holds the fabric tables' schema version."""

MESSAGE_VERSION = 1
"""The version of an inbox row's record (column ``version``)."""

TASK_STATE_VERSION = 1
"""The version of a task-state row (column ``schema_version``)."""

CHANNEL = "ctxkeep_bus"
"""The ``NOTIFY`` channel of every bus; the payload names schema and agent (see
:func:`wake_key`)."""

MAX_ID = 2**63 - 1
"""The largest ``bigint``: no dead letter has a greater id."""

# Position i brings the fabric tables from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE IF NOT EXISTS ctxkeep_fabric_tasks (
        task_id TEXT PRIMARY KEY,
        version BIGINT NOT NULL,
        schema_version INTEGER NOT NULL,
        data TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS ctxkeep_bus_agents (
        agent_id TEXT PRIMARY KEY,
        task_id TEXT
    );
    CREATE TABLE IF NOT EXISTS ctxkeep_bus_subscriptions (
        agent_id TEXT NOT NULL,
        topic TEXT NOT NULL,
        PRIMARY KEY (agent_id, topic)
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_bus_subscriptions_topic
        ON ctxkeep_bus_subscriptions (topic);
    CREATE TABLE IF NOT EXISTS ctxkeep_bus_inbox (
        entry_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        agent_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        message TEXT NOT NULL,
        consumer TEXT,
        delivered_at TIMESTAMPTZ,
        deliveries INTEGER NOT NULL DEFAULT 0,
        replay BOOLEAN NOT NULL DEFAULT false
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_bus_inbox_agent
        ON ctxkeep_bus_inbox (agent_id, entry_id);
    CREATE INDEX IF NOT EXISTS ctxkeep_bus_inbox_message
        ON ctxkeep_bus_inbox (agent_id, message_id);
    CREATE TABLE IF NOT EXISTS ctxkeep_bus_handled (
        agent_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        handled_at TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (agent_id, message_id)
    );
    CREATE TABLE IF NOT EXISTS ctxkeep_bus_dead (
        dead_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        agent_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        record TEXT NOT NULL,
        dead_at TIMESTAMPTZ NOT NULL
    );
    CREATE INDEX IF NOT EXISTS ctxkeep_bus_dead_agent ON ctxkeep_bus_dead (agent_id, dead_id);
    """,
]

# -- the statements, free of I/O ----------------------------------------------------------------

_WAKE = f"pg_notify('{CHANNEL}', md5(current_schema() || ':' || agent_id))"

SEND_DIRECT_SQL = f"""
WITH ins AS (
    INSERT INTO ctxkeep_bus_inbox (agent_id, message_id, version, message)
    VALUES (%(recipient)s, %(id)s, %(version)s, %(message)s)
    RETURNING agent_id
)
SELECT {_WAKE} FROM ins
"""

# The subscribers of the sender's task, never the sender, all in one statement (all or none).
SEND_TOPIC_SQL = f"""
WITH ins AS (
    INSERT INTO ctxkeep_bus_inbox (agent_id, message_id, version, message)
    SELECT s.agent_id, %(id)s, %(version)s, %(message)s
    FROM ctxkeep_bus_subscriptions s JOIN ctxkeep_bus_agents a ON a.agent_id = s.agent_id
    WHERE s.topic = %(topic)s AND a.task_id = %(task)s AND s.agent_id <> %(sender)s
    ORDER BY s.agent_id
    RETURNING agent_id
)
SELECT {_WAKE} FROM ins
"""

# What a receive takes, in priority order: 0, this consumer's rows marked by recover(); 1, rows
# any consumer left unacked for claim_idle_ms; 2, rows never delivered. Rows another
# transaction holds are skipped (a concurrent consumer is taking them).
TAKE_SQL = """
WITH picked AS (
    SELECT entry_id,
        CASE WHEN consumer = %(me)s AND replay THEN 0 WHEN consumer IS NOT NULL THEN 1 ELSE 2
        END AS rank
    FROM ctxkeep_bus_inbox
    WHERE agent_id = %(agent)s AND (
        consumer IS NULL
        OR (consumer = %(me)s AND replay)
        OR delivered_at <= clock_timestamp() - %(idle_ms)s * interval '1 millisecond')
    ORDER BY rank, entry_id
    LIMIT %(n)s
    FOR UPDATE SKIP LOCKED
)
UPDATE ctxkeep_bus_inbox i
SET consumer = %(me)s, replay = false, delivered_at = clock_timestamp(),
    deliveries = i.deliveries + 1
FROM picked WHERE i.entry_id = picked.entry_id
RETURNING picked.rank, i.entry_id, i.version, i.message
"""

DEAD_LETTER_SQL = """
WITH gone AS (
    DELETE FROM ctxkeep_bus_inbox WHERE entry_id = %(entry)s RETURNING agent_id
)
INSERT INTO ctxkeep_bus_dead (agent_id, reason, record, dead_at)
SELECT agent_id, %(reason)s, %(record)s, clock_timestamp() FROM gone
"""

ACK_SQL = """
DELETE FROM ctxkeep_bus_inbox
WHERE agent_id = %(agent)s AND message_id = ANY(%(ids)s) AND consumer IS NOT NULL
"""

# Mark handled (trimming marks older than handled_ttl) and ack, in one statement.
SETTLE_SQL = """
WITH mark AS (
    INSERT INTO ctxkeep_bus_handled (agent_id, message_id, handled_at)
    VALUES (%(agent)s, %(id)s, clock_timestamp())
    ON CONFLICT DO NOTHING
), trimmed AS (
    DELETE FROM ctxkeep_bus_handled
    WHERE agent_id = %(agent)s AND handled_at < clock_timestamp() - %(ttl)s * interval '1 second'
)
DELETE FROM ctxkeep_bus_inbox
WHERE agent_id = %(agent)s AND message_id = %(id)s AND consumer IS NOT NULL
"""

RECOVER_SQL = f"""
WITH marked AS (
    UPDATE ctxkeep_bus_inbox SET replay = true
    WHERE agent_id = %(agent)s AND consumer = %(me)s
    RETURNING agent_id
)
SELECT count(*), pg_notify('{CHANNEL}', md5(current_schema() || ':' || %(agent)s)) FROM marked
"""

SUBSCRIBE_SQL = """
WITH agent AS (
    SELECT agent_id FROM ctxkeep_bus_agents WHERE agent_id = %(agent)s
), ins AS (
    INSERT INTO ctxkeep_bus_subscriptions (agent_id, topic)
    SELECT agent_id, %(topic)s FROM agent ON CONFLICT DO NOTHING
)
SELECT count(*) FROM agent
"""


def encode_message(message: IPCMessage) -> str:
    """The stored record of a message (its JSON)."""
    return json.dumps(message.to_dict(), allow_nan=False)


def decode_message(version: int, text: str) -> IPCMessage:
    """The message an inbox row holds (a fresh copy).

    Raises:
        SchemaVersionError: a row written by a newer ctxkeep.
        InvalidMessageError: a corrupt row (not JSON, not a message, or a payload no receiver
            could be handed: a lone surrogate, nesting too deep).

    """
    if version > MESSAGE_VERSION:
        raise SchemaVersionError(
            f"bus entry version {version} is newer than this ctxkeep reads "
            f"({MESSAGE_VERSION}); upgrade ctxkeep"
        )
    try:
        return IPCMessage.from_dict(json.loads(text))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessageError(f"corrupt bus entry: {exc}") from exc


def wake_key(schema: str, agent_id: str) -> str:
    """The ``NOTIFY`` payload that wakes ``agent_id``'s receivers in ``schema`` (as
    :data:`SEND_DIRECT_SQL` computes it).
    """
    return hashlib.md5(f"{schema}:{agent_id}".encode(), usedforsecurity=False).hexdigest()


def check_name(what: str, value: Any) -> str:
    """``value`` if it is a non-empty string PostgreSQL's ``TEXT`` can hold (no NUL)."""
    _check.text(what, value)
    if "\x00" in value:
        raise ConfigError(f"{what} must not contain NUL characters (PostgreSQL text cannot)")
    return str(value)


def _message_names(message: IPCMessage) -> None:
    """Refuse a message whose ids the tables cannot hold (NUL), before anything is stored."""
    for name in ("sender", "recipient", "topic", "task_id", "id"):
        value = getattr(message, name)
        if value is not None and "\x00" in value:
            raise InvalidMessageError(f"the message's {name} must not contain NUL characters")


@dataclass(frozen=True)
class PgHandledMark:
    """The mark that says ``agent_id`` handled ``message_id``, to commit with an effect in
    the same transaction (:meth:`PostgresTaskState.update_with`).
    """

    agent_id: str
    """The agent."""
    message_id: str
    """The message handled."""

    def set(self, conn: Any) -> bool:
        """Set the mark in ``conn``'s transaction; False if it was already set (then the
        caller writes nothing). A concurrent setter of the same mark waits for this
        transaction and then finds it set.
        """
        cur = conn.execute(
            "INSERT INTO ctxkeep_bus_handled (agent_id, message_id, handled_at) "
            "VALUES (%s, %s, clock_timestamp()) ON CONFLICT DO NOTHING",
            (self.agent_id, self.message_id),
        )
        return bool(cur.rowcount)

    def is_set(self, conn: Any) -> bool:
        """Whether the mark is there."""
        row = conn.execute(
            "SELECT 1 FROM ctxkeep_bus_handled WHERE agent_id = %s AND message_id = %s",
            (self.agent_id, self.message_id),
        ).fetchone()
        return row is not None


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
        """Where the notifications for ``key`` stand now (pass it to :meth:`wait`)."""
        with self._cond:
            return self._epoch, self._seen.get(key, 0)

    def wait(self, key: str, since: tuple[int, int], timeout: float) -> None:
        """Return when a notification for ``key`` came after ``since``, or after ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self.mark(key) != since or self._stop, timeout)

    def _run(self) -> None:
        import psycopg  # present: ctxkeep._pg imported it (or named the extra to install)

        while not self._stop:
            try:
                with psycopg.connect(self._url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    with self._cond:
                        self._listening = True
                        self._epoch += 1
                        self._cond.notify_all()
                    while not self._stop:
                        for note in conn.notifies(timeout=self.TICK):
                            with self._cond:
                                self._seen[note.payload] = self._seen.get(note.payload, 0) + 1
                                self._cond.notify_all()
            except psycopg.Error as exc:
                log.warning("bus listener on %s lost its connection: %s", self._where, exc)
            with self._cond:
                self._listening = False
            if not self._stop:
                time.sleep(self.TICK)

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
        _check.integer("max_size", max_size, minimum=1)
        self.url = url
        self.db = PgClient(
            url, name="ctxkeep-fabric", meta_key=META_KEY, migrations=MIGRATIONS, max_size=max_size
        )
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
        _message_names(message)
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

    # -- internals -----------------------------------------------------------------------

    def _run(self, doing: str, sql: str, params: tuple[Any, ...] | Mapping[str, Any]) -> int:
        """Run one statement that returns no rows (autocommit); how many rows it changed."""
        with self.db.errors(doing), self.db.connection() as conn:
            return int(conn.execute(sql, params).rowcount)

    def _listening(self) -> _Listener | None:
        """The listener, started (and its ``LISTEN`` in place) on first use."""
        with self._lock:
            if self._closed:
                return None
            if self._listener is None:
                self._listener = _Listener(self.url, self.where)
            listener = self._listener
        listener.ready(timeout=10)
        return listener

    def _read(self, agent_id: str, max_messages: int, timeout: float) -> list[IPCMessage]:
        if max_messages <= 0:
            return []
        deadline = time.monotonic() + timeout
        listener = self._listening() if timeout > 0 else None
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
        for _, entry_id, version, text in sorted(rows, key=lambda r: (r[0], r[1])):
            try:
                out.append(decode_message(version, text))
            except (InvalidMessageError, SchemaVersionError) as exc:
                log.warning("bus entry %s of %s moved to dead letters: %s", entry_id, agent_id, exc)
                record = {"v": str(version), "m": text, "entry_id": str(entry_id)}
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


# -- the task state -----------------------------------------------------------------------------


class PostgresTaskState:
    """A task's shared state for agents in many processes: a row with a version.

    Writes are compare-and-set: :meth:`update` refuses a write based on an old version
    (:class:`~ctxkeep.errors.StaleTaskStateError`), :meth:`update_with` reads and writes under
    the row's lock. Values must be JSON data. Only what is written here is shared; an agent's
    private layer never goes here.

    Args:
        url: a libpq URI (the same schema as the bus, to commit handled marks with effects).
        task_id: the task.
        db: a client to share (:meth:`PostgresBus.task_state` passes the bus's; it is not
            closed by :meth:`close`); by default the state opens its own.

    Raises:
        StorageError: PostgreSQL does not answer.
        SchemaVersionError: the schema holds fabric tables of a newer ctxkeep.

    """

    def __init__(self, url: str, task_id: str, *, db: PgClient | None = None) -> None:
        check_name("task_id", task_id)
        self.task_id = task_id
        self._owned = db is None
        self.db = db if db is not None else PgClient(
            url, name="ctxkeep-fabric", meta_key=META_KEY, migrations=MIGRATIONS, max_size=2
        )  # fmt: skip
        self.where = self.db.where

    def close(self) -> None:
        """Close the connection pool (if this state opened it)."""
        if self._owned:
            self.db.close()

    # -- the stored form -----------------------------------------------------------------

    def _decode(self, row: tuple[int, int, str] | None) -> tuple[int, dict[str, Any]]:
        if row is None:
            return 0, {}
        version, schema, text = row
        where = f"task state {self.task_id!r}"
        if schema > TASK_STATE_VERSION:
            raise SchemaVersionError(
                f"{where} has schema {schema}, newer than this ctxkeep reads "
                f"({TASK_STATE_VERSION}); upgrade ctxkeep"
            )
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecordError(f"{where} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise CorruptRecordError(f"{where} is not a JSON object")
        for key, value in data.items():
            check_json(f"{where}, key {key!r}", value, error=CorruptRecordError)
        return int(version), data

    @staticmethod
    def _encode(name: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``changes``, checked by the fabric's one rule for JSON data before
        anything is written.
        """
        return json_copy(name, _check.mapping(name, changes))  # type: ignore[no-any-return]

    def _locked(self, conn: Any) -> tuple[int, dict[str, Any]]:
        """The state, its row locked until the transaction ends (created at version 0 if the
        task has none; rolled back with the transaction if nothing is written).
        """
        conn.execute(
            "INSERT INTO ctxkeep_fabric_tasks (task_id, version, schema_version, data) "
            "VALUES (%s, 0, %s, '{}') ON CONFLICT (task_id) DO NOTHING",
            (self.task_id, TASK_STATE_VERSION),
        )
        row = conn.execute(
            "SELECT version, schema_version, data FROM ctxkeep_fabric_tasks "
            "WHERE task_id = %s FOR UPDATE",
            (self.task_id,),
        ).fetchone()
        return self._decode(row)

    def _write(self, conn: Any, version: int, data: dict[str, Any]) -> int:
        conn.execute(
            "UPDATE ctxkeep_fabric_tasks SET version = %s, schema_version = %s, data = %s "
            "WHERE task_id = %s",
            (version + 1, TASK_STATE_VERSION, json.dumps(data, allow_nan=False), self.task_id),
        )
        return version + 1

    # -- reads and writes ----------------------------------------------------------------

    def read(self) -> tuple[int, dict[str, Any]]:
        """``(version, a copy of the state)``; version 0 for a task never written.

        Raises:
            CorruptRecordError: a stored value that is not JSON data the fabric can deliver.
            SchemaVersionError: a state written by a newer ctxkeep.

        """
        rows = self.db.q(
            "read a task state",
            "SELECT version, schema_version, data FROM ctxkeep_fabric_tasks WHERE task_id = %s",
            (self.task_id,),
        )
        return self._decode(rows[0] if rows else None)

    def update(self, changes: Mapping[str, Any], *, expected_version: int) -> int:
        """Merge ``changes`` only if the state is still at ``expected_version``.

        Returns:
            The new version.

        Raises:
            StaleTaskStateError: someone wrote since ``expected_version`` was read.
            InvalidTypeError: ``changes`` is not a mapping with string keys, a value is not
                JSON data, or ``expected_version`` is not an int (nothing is written).

        """
        data = self._encode("changes", changes)
        _check.integer("expected_version", expected_version, minimum=0)
        with self.db.tx("update a task state") as conn:
            version, current = self._locked(conn)
            if version != expected_version:
                raise StaleTaskStateError(self.task_id, expected_version, version)
            return self._write(conn, version, {**current, **data})

    def update_with(
        self,
        change: Callable[[dict[str, Any]], Mapping[str, Any] | None],
        *,
        once: PgHandledMark | None = None,
    ) -> int | None:
        """Read under the row's lock, compute ``change(state)`` and write it. With ``once``,
        the mark is committed with the change, and if it is already set nothing is written
        (the message was handled before). Keep ``change`` pure.

        Returns:
            The new version, or None if nothing was written.

        """
        _check.has_method("change", change, "__call__", "function")
        _check.instance("once", once, (PgHandledMark, type(None)), "a PgHandledMark or None")
        with self.db.tx("update a task state") as conn:
            if once is not None and not once.set(conn):
                return None
            version, current = self._locked(conn)
            changes = change(current)
            if not changes and once is None:
                return None
            data = self._encode("changes", changes or {})
            return self._write(conn, version, {**current, **data})

    def join(self, state: Mapping[str, Any]) -> int:
        """The rule of ``ContextFabric.set_task_context`` for a joining agent: a task never
        written starts from ``state`` (version 1; 0 if ``state`` is empty); joining an
        existing task may only repeat what it holds. Returns the task's version.

        Raises:
            StaleTaskStateError: the task exists and ``state`` would change it.

        """
        data = self._encode("state", state)
        with self.db.tx("join a task") as conn:
            version, current = self._locked(conn)
            if all(k in current and current[k] == v for k, v in data.items()):
                return version
            if version != 0:
                raise StaleTaskStateError(self.task_id, 0, version)
            return self._write(conn, version, {**current, **data})


__all__ = [
    "MIGRATIONS",
    "PgHandledMark",
    "PostgresBus",
    "PostgresTaskState",
]

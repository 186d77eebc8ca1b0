"""The PostgreSQL fabric's tables, statements and stored forms, free of I/O: what
``ctxkeep.fabric.postgres`` (the bus) and ``ctxkeep.fabric.postgres_state`` (task states) run.

Tables (in the connection's ``search_path`` schema, as every PostgreSQL store of ctxkeep):

================================  ==============================================================
table                             holds
================================  ==============================================================
``ctxkeep_fabric_tasks``          a task's shared state: version, record version, JSON object
``ctxkeep_bus_agents``            agent -> its task (NULL for none)
``ctxkeep_bus_subscriptions``     (agent, topic): the agent's topics, within its task
``ctxkeep_bus_inbox``             one row per message per recipient, in ``entry_id`` order:
                                  the record (IPCMessage JSON) and its version; once received,
                                  the consumer holding it, when (the database's clock), how
                                  often, and whether ``recover`` put it back for replay
``ctxkeep_bus_handled``           (agent, message id, when): the messages the agent handled
``ctxkeep_bus_dead``              inbox rows no ctxkeep could decode, with the reason
================================  ==============================================================

Their version is the ``fabric`` row of ``ctxkeep_meta``: :data:`MIGRATIONS` are applied in
order by :class:`~ctxkeep._pg.PgClient` under its advisory lock; a schema written by a newer
ctxkeep is refused.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ctxkeep import _check
from ctxkeep.errors import ConfigError, InvalidMessageError, SchemaVersionError
from ctxkeep.fabric.bus import IPCMessage

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
    CREATE INDEX IF NOT EXISTS ctxkeep_bus_handled_age
        ON ctxkeep_bus_handled (agent_id, handled_at);
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
RETURNING picked.rank, i.entry_id, i.message_id, i.version, i.message
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

# Every agent's messages: undelivered (no consumer yet), delivered and unacked, dead letters.
STATS_SQL = """
SELECT count(*) FILTER (WHERE consumer IS NULL),
    count(*) FILTER (WHERE consumer IS NOT NULL),
    (SELECT count(*) FROM ctxkeep_bus_dead)
FROM ctxkeep_bus_inbox
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


def decode_message(message_id: str, version: int, text: str) -> IPCMessage:
    """The message an inbox row holds (a fresh copy).

    Raises:
        SchemaVersionError: a row written by a newer ctxkeep.
        InvalidMessageError: a corrupt row (not JSON, not a message, a payload no receiver
            could be handed: a lone surrogate, nesting too deep; or another id than the row's,
            by which no ack could find it).

    """
    if version > MESSAGE_VERSION:
        raise SchemaVersionError(
            f"bus entry version {version} is newer than this ctxkeep reads "
            f"({MESSAGE_VERSION}); upgrade ctxkeep"
        )
    try:
        message = IPCMessage.from_dict(json.loads(text))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessageError(f"corrupt bus entry: {exc}") from exc
    if message.id != message_id:
        raise InvalidMessageError(
            f"corrupt bus entry: its record's id {message.id!r} is not the row's {message_id!r}"
        )
    return message


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


def message_names(message: IPCMessage) -> None:
    """Refuse a message whose ids the tables cannot hold (NUL), before anything is stored."""
    for name in ("sender", "recipient", "topic", "task_id", "id"):
        value = getattr(message, name)
        if value is not None and "\x00" in value:
            raise InvalidMessageError(f"the message's {name} must not contain NUL characters")

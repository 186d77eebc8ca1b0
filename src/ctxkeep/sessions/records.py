"""Stored forms of messages and sessions, with their schema versions and migrations.

Every backend stores a message as the JSON of :func:`message_to_record`, parses a stored
row with :func:`load_record` and the manager decodes it with :func:`record_to_message`: a row
that is not a message's record is a :class:`~ctxkeep.errors.CorruptRecordError` naming the
session and seq (:func:`corrupt_record`; a session's own row, :func:`corrupt_session`), never
a driver's or a parser's error, nor a 4xx that would blame the caller. A record carries ``v``
(its schema version), then the fields of :class:`~ctxkeep.Message` in order (derived from
its dataclass fields; the few whose type JSON lacks are converted by :data:`_TO_RECORD` and
:data:`_FROM_RECORD`), each but ``role`` only where it differs from its default: a field a
record lacks means its default, as every reader of version 1 has taken it (the full shape,
every field, is what writers before the compact one stored, and is read as well;
:func:`full_record` gives it). Old records are
upgraded by :data:`RECORD_MIGRATIONS` (position ``i`` upgrades version ``i`` to ``i + 1``);
a record newer than this ctxkeep is refused with :class:`SchemaVersionError`.

The tool-call bookkeeping that keeps stored histories valid also lives here, free of I/O:
:func:`advance_pending` checks a batch of appended messages against the calls still waiting
for results, :func:`trim_point` finds where to cut a history to ``max_history`` in whole
tool units, and :func:`settle_ids` makes appends idempotent by message id: each backend looks
up the batch's ids inside its append transaction and lets it decide (a retry, a conflict, or
a new append).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from operator import itemgetter
from typing import Any

from ctxkeep.errors import (
    CorruptRecordError,
    InvalidMessageError,
    MessageIdConflictError,
    MissingToolResultError,
    OrphanToolResultError,
    SchemaVersionError,
)
from ctxkeep.messages import FIELDS, ROLES, TEXT_FIELDS, Message, ToolCall, _check_content

RECORD_VERSION = 1

try:  # orjson parses stored records about 3x faster; the stdlib is the fallback
    import orjson as _orjson

    def loads(text: str | bytes) -> Any:
        """Parse stored JSON."""
        return _orjson.loads(text)

    def dumps(value: Any) -> str:
        """Serialise to JSON text (UTF-8, no NaN)."""
        return _orjson.dumps(value).decode("utf-8")

except ImportError:  # pragma: no cover - orjson is a dependency; kept for vendored installs

    def loads(text: str | bytes) -> Any:
        """Parse stored JSON."""
        return json.loads(text)

    def dumps(value: Any) -> str:
        """Serialise to JSON text (UTF-8, no NaN)."""
        return json.dumps(value, ensure_ascii=False, allow_nan=False)


# Position i upgrades a record of version i to version i + 1. Version 0 records (written
# before versioning) had "tool_calls" in OpenAI's nested form.
RECORD_MIGRATIONS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [
    lambda r: {
        **r,
        "v": 1,
        "tool_calls": [
            tc if "name" in tc else {"id": tc["id"], **tc["function"]}
            for tc in r.get("tool_calls") or []
        ],
    },
]


def _tool_calls_to_record(calls: tuple[ToolCall, ...]) -> list[dict[str, str]]:
    return [{"id": t.id, "name": t.name, "arguments": t.arguments} for t in calls]


def _time_to_record(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


_TO_RECORD: dict[str, Callable[[Any], Any]] = {
    "tool_calls": _tool_calls_to_record,
    "artifact_refs": list,
    "metadata": dict,
    "extra": dict,
    "created_at": _time_to_record,
}
"""How the fields JSON has no type for are written; every other field is written as it is."""
_JSON_EXACT = frozenset(
    {"str", "str | None", "tuple[str, ...]", "tuple[ToolCall, ...]", "datetime | None"}
)
"""Declared types whose records are strings, None or lists of them: JSON gives them back."""
_MAY_CHANGE = tuple(f.name for f in fields(Message) if f.type not in _JSON_EXACT)
"""The fields whose record JSON might not give back exactly (content parts, metadata, extra:
tuples become lists, int keys strings). Only a record where one of them holds something but a
string is read back and compared."""


_NO_VALUE: Any = object()
_RECORD_DEFAULTS = tuple(
    _NO_VALUE
    if f.default is MISSING and f.default_factory is MISSING
    else f.default
    if f.default_factory is MISSING
    else f.default_factory()
    for f in fields(Message)
)
"""Each field's default in field order (:data:`_NO_VALUE` for a required one, which no value
is), compared, never handed out (the ``{}`` of metadata and extra is shared by nothing)."""
_ENCODERS = tuple(
    (name, default, _TO_RECORD.get(name))
    for name, default in zip(FIELDS, _RECORD_DEFAULTS, strict=True)
)
"""Each field with its default and its converter (None: written as it is), in field order."""


def message_to_record(m: Message) -> dict[str, Any]:
    """A JSON-ready dict of ``m``: ``v``, then each field of ``m`` that is not at its
    default (:data:`~ctxkeep.messages.FIELDS`, in order; ``role`` always).

    Raises:
        InvalidMessageError: metadata or extra that JSON cannot hold exactly.

    """
    return encoded_record(m)[0]


def encoded_record(m: Message) -> tuple[dict[str, Any], str]:
    """:func:`message_to_record` and the record's JSON (``dumps(record)``), which its check
    encodes anyway: an append hands the text to the backend (:attr:`Append.texts`), so a
    record is encoded once, not again by the backend (3.8 kB records: a few us an add).

    Raises:
        InvalidMessageError: as :func:`message_to_record`.

    """
    # The fields (in field order; the message's attributes may hold caches beside them) but
    # those at their default. A field is at its default where it is the default object
    # (None, the empty tuple) or, empty, equals it (a new empty dict): so a content of "" or []
    # is kept, and no string is compared with None. A record without its defaults is about
    # 120 bytes shorter (bench/peers.py's Agents items as stored: median 478 bytes, now 351):
    # fewer pages a write on SQLite, fewer bytes for Redis's scripts to read. Built in
    # one pass, converting as it goes (a loop of more bytecodes, 407 against 251 for the full
    # record's copy-then-convert, but fewer instructions than either that or a filter in C
    # with itertools): the whole encode, JSON and checks included, 58.9k instructions a
    # stored Agents item and 75.0k a LangChain message of bench/peers.py's data, where the
    # full record took 64.1k and 79.9k (callgrind, medians of 1,000 each).
    state = m.__dict__
    record: dict[str, Any] = {"v": RECORD_VERSION}
    for name, default, convert in _ENCODERS:
        value = state[name]
        if value is default or (not value and value == default):
            continue
        record[name] = value if convert is None else convert(value)
    # Refuse what JSON would silently change (tuples become lists, int keys become strings)
    # and text that is not valid Unicode (lone surrogates).
    try:
        text = dumps(record)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"message {m.id or ''} cannot be stored ({exc}): text must be valid Unicode "
            "and metadata/extra JSON values"
        ) from exc
    # Only a field that holds something but a string can come back changed: each such one
    # is encoded and read back by itself (metadata of a few hundred bytes beside a content of
    # kilobytes: decoding the whole record was three times the work, 4.7 against 1.7 us for a
    # LangChain message of 3.9 kB), or the whole record where the content is one of them.
    suspect = [
        name for name in _MAY_CHANGE if (value := record.get(name)) and type(value) is not str
    ]
    if suspect and (
        loads(text) != record
        if suspect[0] == "content"
        else any(loads(dumps(record[name])) != record[name] for name in suspect)
    ):
        raise InvalidMessageError(
            f"message {m.id or ''} cannot be stored exactly: metadata/extra hold values "
            "JSON does not round-trip (tuples, non-string keys); use lists and string keys"
        )
    return record, text


def full_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (of the current version) with every field, those it leaves out at their
    default: the shape writers before the compact one stored, and the service's wire form.
    A fresh dict (a default list or dict is made for it).
    """
    full = {**_FULL_BLANK, **record}
    for name, make in _MADE_BLANKS:
        if name not in record:
            full[name] = make()
    return full


_FULL_BLANK: dict[str, Any] = {
    "v": RECORD_VERSION,
    **{
        name: None
        if default is _NO_VALUE
        else _TO_RECORD[name](default)
        if name in _TO_RECORD
        else default
        for name, default in zip(FIELDS, _RECORD_DEFAULTS, strict=True)
    },
}
"""A full record of defaults (None for the required ``role``, which every record has)."""
_MADE_BLANKS = tuple(
    (name, type(value)) for name, value in _FULL_BLANK.items() if type(value) in (list, dict)
)
"""The fields whose default in a record is a list or a dict: made new for each full record."""


def load_record(session_id: str | None, seq: int | None, text: str | bytes) -> dict[str, Any]:
    """The record stored as ``text`` for message ``seq`` of ``session_id``: every backend
    reads its message rows through this, so a damaged row fails the same way everywhere.

    Raises:
        CorruptRecordError: ``text`` is not a JSON object (a damaged row, a hand edit).

    """
    try:
        record = loads(text)
    except (ValueError, RecursionError) as exc:  # orjson's and json's JSONDecodeError
        raise corrupt_record(session_id, seq, f"not JSON: {exc}") from None
    if type(record) is not dict:
        raise corrupt_record(session_id, seq, f"not a JSON object: {str(text)[:40]!r}")
    return record


def corrupt_record(session_id: str | None, seq: int | None, detail: str) -> CorruptRecordError:
    """The error for a stored message that cannot be read, naming the session and seq (when
    the reader knows them) so an operator can find the row. A storage error, not the
    caller's: the service answers 500 ``corrupt-record``, and retrying does not help.
    """
    where = "a stored message" if seq is None else f"the stored message at seq {seq}"
    of = "" if session_id is None else f"session {session_id!r}: "
    return CorruptRecordError(f"{of}{where} is corrupt ({detail}); repair or delete that row")


def dumps_record(m: Message) -> str:
    """The stored JSON text of a message."""
    return dumps(message_to_record(m))


def upgrade_record(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` upgraded to :data:`RECORD_VERSION`.

    Raises:
        SchemaVersionError: a version newer than this ctxkeep knows.

    """
    v = record.get("v", 0)
    if not isinstance(v, int) or v < 0:
        raise SchemaVersionError(f"stored message has an invalid schema version {v!r}")
    if v > RECORD_VERSION:
        raise SchemaVersionError(
            f"stored message has schema version {v}, newer than this ctxkeep reads "
            f"({RECORD_VERSION}); upgrade ctxkeep"
        )
    while v < RECORD_VERSION:
        record = RECORD_MIGRATIONS[v](record)
        v += 1
    return record


def corrupt_session(session_id: str, detail: str) -> CorruptRecordError:
    """The error for a stored session (its row or hash, not a message) that cannot be read:
    like :func:`corrupt_record`, the store's fault, named for an operator to repair.
    """
    return CorruptRecordError(
        f"session {session_id!r}: the stored session is corrupt ({detail}); repair or delete it"
    )


def record_to_message(
    record: dict[str, Any] | str | bytes, *, session_id: str | None = None, seq: int | None = None
) -> Message:
    """The message a stored record describes (upgraded first if old); ``session_id`` and
    ``seq``, where the caller knows them, name the record in an error.

    A record of the current version with no key but ``v`` and fields (the compact shape
    :func:`message_to_record` writes, or the full one older writers wrote) is decoded on a
    fast path (:func:`_decode_current`): its values were validated when the message was
    stored, so only their types and the role's rules are checked again (enough that a corrupt
    record can never make an invalid :class:`Message`), and the decoded values become the
    message's attributes without copies. Anything else takes the checked path.

    Raises:
        SchemaVersionError: a record newer than this ctxkeep.
        CorruptRecordError: a record that describes no valid message (stored records were
            valid when written: this one was damaged since).

    """
    if isinstance(record, (str, bytes)):
        record = load_record(session_id, seq, record)
    elif not isinstance(record, dict):
        raise corrupt_record(session_id, seq, f"not a JSON object: {record!r:.40}")
    if record.get("v") == RECORD_VERSION:
        try:
            fast = _decode_current(record)
        except (KeyError, ValueError):  # another shape, a created_at that is not a date...
            fast = None
        if fast is not None:
            return fast
    try:
        r = upgrade_record(record) if record.get("v") != RECORD_VERSION else record
        return Message._from_owned(_state_from_record(r))
    except (KeyError, TypeError, ValueError) as exc:
        detail = (
            str(exc) if isinstance(exc, InvalidMessageError) else f"{type(exc).__name__}: {exc}"
        )
        raise corrupt_record(session_id, seq, detail) from exc


def _tool_calls_from_record(value: Any) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(tc["id"], tc["name"], tc["arguments"]) for tc in value or ())


def _time_from_record(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _object_from_record(key: str) -> Callable[[Any], dict[str, Any]]:
    def decode(value: Any) -> dict[str, Any]:
        value = value or {}
        if not isinstance(value, dict):
            raise InvalidMessageError(f"{key} must be an object")
        return value

    return decode


_FROM_RECORD: dict[str, Callable[[Any], Any]] = {
    "tool_calls": _tool_calls_from_record,
    "artifact_refs": lambda value: value or (),
    "metadata": _object_from_record("metadata"),
    "extra": _object_from_record("extra"),
    "created_at": _time_from_record,
}
"""How the fields :data:`_TO_RECORD` writes are read back; every other field is read as it is."""


_REQUIRED = tuple(
    f.name for f in fields(Message) if f.default is MISSING and f.default_factory is MISSING
)
"""The fields every record must have (else ``KeyError``: a corrupt record)."""
_DEFAULTS = tuple(
    (f.name, _NO_VALUE if f.default is MISSING else f.default) for f in fields(Message)
)
"""Every field with what a record that lacks it (an older writer's) means."""
_FACTORIES = tuple(
    (f.name, f.default_factory) for f in fields(Message) if f.default_factory is not MISSING
)
_DECODERS = tuple(_FROM_RECORD.items())


def _state_from_record(r: dict[str, Any]) -> dict[str, Any]:
    """Every field of a message from a record of the current version, for the checked path."""
    for name in _REQUIRED:
        if name not in r:
            raise KeyError(name)
    state = {name: r.get(name, default) for name, default in _DEFAULTS}
    for name, factory in _FACTORIES:
        if state[name] is _NO_VALUE:
            state[name] = factory()
    for name, decode in _DECODERS:
        state[name] = decode(state[name])
    return state


_FREE_TEXT = tuple(name for name in TEXT_FIELDS if name != "tool_call_id")
_OPTIONAL_TEXT = itemgetter(*_FREE_TEXT)
_TEXT_OR_NONE = frozenset({str, type(None)})
_FAST_CHECKS = frozenset(
    {"role", "content", "tool_call_id", "tool_calls", "artifact_refs", "metadata", "extra"}
    | {"created_at", *_FREE_TEXT}
)
"""The fields :func:`_decode_current` checks."""
FAST_PATH = frozenset(FIELDS) == _FAST_CHECKS
"""Whether :func:`_decode_current` checks every field of :class:`Message`. A field it does not
know (added to the class, not to the fast path) turns the fast path off: records are still
read right, by the checked path, only slower (and tests/test_messages_fields.py fails)."""
_FAST_LEN = 1 + len(FIELDS) if FAST_PATH else -1
"""How many keys :func:`_decode_current`'s state holds before ``v`` is taken out (``v`` and
every field: a record with any other key has more), or -1 (no state's length) when the fast
path is off."""
_BLANK = dict(_DEFAULTS)
"""The state of a record that holds no field: what :func:`_decode_current` starts from (every
field in order, at its default; :data:`_NO_VALUE` where a record must hold the field, ``role``,
or where the default is made new for each message, ``metadata`` and ``extra``)."""


def _parts(content: Any, role: str) -> bool:
    """Whether ``content`` is a list of content parts :class:`Message` takes for ``role``
    (the same check, on the decoded list itself: it is the caller's, fresh from JSON).
    """
    if type(content) is not list:
        return False
    try:
        _check_content(content, role)
    except InvalidMessageError:
        return False
    return True


def _decode_current(record: dict[str, Any]) -> Message | None:
    """The message of a current-version record (compact or full, :func:`record_to_message`),
    or None where anything is unusual (a key that is no field, content parts
    :class:`Message` would refuse, an unexpected type: the checked path decides and names it).

    A compact record's values are laid over :data:`_BLANK`, so a field it leaves out holds
    its default (in field order, as every constructor writes them), and a state with more
    keys than ``v`` and the fields had a key that is no field. A decoded record is owned by
    the caller's process (fresh from JSON), so its values are taken without copies; the
    checks are what :class:`Message` would refuse, by type.
    """
    # A full record (an older writer's) is copied as the old decoder did, and a key that is
    # no field in place of one is a KeyError below (every field is read); a compact one is
    # laid over the blank. Laying a full record over it too cost 1% more a read (callgrind,
    # parse included: 59.9k against 59.3k instructions a stored Agents item).
    if len(record) == _FAST_LEN:
        state = dict(record)
    else:
        state = {**_BLANK, **record}
        if len(state) != _FAST_LEN:
            return None
    del state["v"]
    role = state["role"]
    content = state["content"]
    tool_call_id = state["tool_call_id"]
    if not (
        type(role) is str
        and role in ROLES
        and (content is None or type(content) is str or _parts(content, role))
        and set(map(type, _OPTIONAL_TEXT(state))) <= _TEXT_OR_NONE
        and (
            (type(tool_call_id) is str and tool_call_id != "")
            if role == "tool"
            else tool_call_id is None
        )
    ):
        return None
    # Where a field was left out, the blank's value is there: the empty tuple or _NO_VALUE,
    # which no JSON value is (nor is any other tuple: a caller's dict is refused here).
    calls = state["tool_calls"]
    if type(calls) is list:
        if calls:
            if role != "assistant":
                return None
            out = []
            for tc in calls:
                if not (
                    type(tc) is dict
                    and len(tc) == 3
                    and type(tc["id"]) is str
                    and tc["id"] != ""
                    and type(tc["name"]) is str
                    and type(tc["arguments"]) is str
                ):
                    return None
                out.append(ToolCall._unchecked(tc["id"], tc["name"], tc["arguments"]))
            state["tool_calls"] = tuple(out)
        else:
            state["tool_calls"] = ()
    elif type(calls) is not tuple or calls:
        return None
    refs = state["artifact_refs"]
    if type(refs) is list:
        if not refs:
            state["artifact_refs"] = ()
        elif set(map(type, refs)) == {str}:
            state["artifact_refs"] = tuple(refs)
        else:
            return None
    elif type(refs) is not tuple or refs:
        return None
    if type(state["metadata"]) is not dict:
        if state["metadata"] is not _NO_VALUE:
            return None
        state["metadata"] = {}
    if type(state["extra"]) is not dict:
        if state["extra"] is not _NO_VALUE:
            return None
        state["extra"] = {}
    created = state["created_at"]
    if created is not None:
        if type(created) is not str:
            return None
        state["created_at"] = datetime.fromisoformat(created)
    return Message._unchecked(state)


@dataclass(frozen=True, kw_only=True)
class SessionInfo:
    """What a store knows about a session, besides its messages."""

    session_id: str
    """The session's id."""
    agent_id: str
    """The agent that owns it."""
    task_id: str | None = None
    """The task it belongs to, if any."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Caller data, JSON values."""
    created_at: float = 0.0
    """Unix time of creation."""
    accessed_at: float = 0.0
    """Unix time of the last read or write (LRU and TTL use it)."""
    message_count: int = 0
    """Messages currently stored."""
    next_seq: int = 1
    """The sequence number the next appended message gets (gapless per session)."""
    pending: tuple[str, ...] = ()
    """Tool call ids still waiting for their results."""
    generation: str = ""
    """A random stamp set when the session is created: a session deleted (or expired, or
    evicted) and created again under the same id has another one, so every cache is keyed by
    ``(session_id, generation)`` and never shows an earlier session's history."""
    first_seq: int = 1
    """The sequence number of the oldest message held (moved forward by trimming)."""
    revision: int = 0
    """How many times messages were taken back from the end (:meth:`MemoryManager.pop_message`):
    part of a cache's key with the generation, since a popped sequence number is not held."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["metadata"] = dict(self.metadata)
        out["pending"] = list(self.pending)
        return out


def info_with(base: SessionInfo, changes: dict[str, Any]) -> SessionInfo:
    """``dataclasses.replace(base, **changes)`` for the state a write leaves (moved
    counters, pending calls, access time), made as a copy of ``base``'s attributes:
    ``replace`` runs the frozen dataclass's ``__init__``, twelve ``object.__setattr__`` calls
    after checking its arguments, about 10 us of an append's client time, for a class whose
    ``__init__`` only stores them.
    """
    out = object.__new__(SessionInfo)
    state = base.__dict__.copy()
    state.update(changes)
    object.__setattr__(out, "__dict__", state)
    return out


def new_generation() -> str:
    """A fresh session generation stamp (128 random bits, hex)."""
    return secrets.token_hex(16)


@dataclass(frozen=True, kw_only=True)
class Append:
    """One atomic append, as the manager hands it to :meth:`Backend.append`."""

    records: list[dict[str, Any]]
    """The messages' records, oldest first."""
    texts: list[str] | None = None
    """The records' JSON (``dumps`` of each, in order) where the manager has it
    (:func:`encoded_record`); None: a backend encodes them (:meth:`encoded`)."""
    check: Callable[[SessionInfo], tuple[str, ...]]
    """Run inside the backend's transaction on the session as stored: returns the tool call ids
    still waiting after the append, or raises (then nothing is stored)."""
    now: float
    """The append's time (the session's new ``accessed_at``, if later)."""
    ttl: float | None
    """The native expiry to set, for backends that declare ``supports_native_ttl``."""
    replaces: int | None = None
    """The sequence number of the session's newest message, which this append takes the place
    of in the same transaction: the backend removes it as :meth:`Backend.pop_newest` does
    (``pending`` as :func:`pending_after_pop` says, ``revision`` + 1) before ``check`` runs,
    or raises :class:`~ctxkeep.errors.SessionChangedError` if the newest message is no longer
    that one."""
    replaces_id: str | None = None
    """Like :attr:`replaces`, by the ``id`` of the message the caller read as the newest: the
    backend reads the newest message inside its transaction and takes it only if it has this
    id (one round trip where the caller would otherwise read the newest seq first)."""
    fresh_ids: bool = False
    """Every message's id was made for this append by the manager (a random one where the
    caller gave none): none can be stored already, so a backend may skip looking them up
    (:func:`settle_ids` would find none; the per-session unique index still stands behind
    it)."""
    creates: Callable[[], SessionInfo] | None = None
    """The session to make where the append finds none (the manager's
    :meth:`~ctxkeep.sessions.base.MemoryManager.add_messages_creating`: called only then). A
    backend that can insert it in the append's own transaction does, and appends to it there
    (one transaction for a session's first add); one that does not raises
    SessionNotFoundError, as without it, and the manager makes the session first."""
    touch_after: float = 0.0
    """The session's ``accessed_at`` moves to :attr:`now` only where it is at least this many
    seconds older (the manager's touch resolution, as for reads; 0: always). A backend may
    leave a fresher ``accessed_at`` as it is: on SQL, an append that does not move it leaves
    the ``accessed_at`` index alone (fewer pages written a commit on SQLite, a HOT update on
    PostgreSQL)."""

    def touches(self, accessed_at: float) -> bool:
        """Whether the append moves an ``accessed_at`` of this value to :attr:`now`."""
        return self.now - accessed_at >= self.touch_after

    @property
    def replacing(self) -> bool:
        """Whether this append takes the newest message's place."""
        return self.replaces is not None or self.replaces_id is not None

    def takes(self, seq: int, record: dict[str, Any]) -> bool:
        """Whether the newest message, ``seq`` holding ``record``, is the one to replace."""
        return (self.replaces is None or seq == self.replaces) and (
            self.replaces_id is None or record.get("id") == self.replaces_id
        )

    def __post_init__(self) -> None:
        if self.texts is not None and len(self.texts) != len(self.records):
            raise ValueError("an Append's texts must be its records' JSON, one each")
        if len(self.records) < 2:
            return  # no id can appear twice
        seen: set[str] = set()
        for i, message_id in enumerate(self.message_ids):
            if message_id in seen:
                raise InvalidMessageError(
                    f"id {message_id!r} appears twice in one append; give each message its own id",
                    index=i,
                )
            seen.add(message_id)

    def encoded(self) -> list[str]:
        """The records as a backend stores them: :attr:`texts`, else each record's JSON."""
        return self.texts if self.texts is not None else [dumps(r) for r in self.records]

    @property
    def message_ids(self) -> tuple[str, ...]:
        """The ids of the batch's messages that have one, oldest first (the manager gives
        every message one; a record without is stored, never matched). Unique within the
        batch (checked when the batch is made, before any I/O): a batch repeating an id cannot
        be a retry of anything and would store one id twice, so it is refused as a whole with
        InvalidMessageError.
        """
        return tuple(i for r in self.records if isinstance(i := r.get("id"), str))


class AlreadyStored(Exception):
    """Raised by :func:`settle_ids` inside a backend's append: every message of the batch is
    in the session already (a retried append). Nothing was written; the manager answers with
    ``rows``, the stored messages in the batch's order.
    """

    def __init__(self, rows: list[tuple[int, dict[str, Any]]]) -> None:
        super().__init__("append already stored")
        self.rows = rows


def _same_message(new: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Whether two records are one message: equal in every field but ``created_at``, which a
    retry stamps anew when the caller gave none (compared in the full shape: a stored record
    may be compact or, an older writer's, full).
    """
    old = full_record(upgrade_record(dict(stored)))
    new = full_record(new)
    del old["created_at"], new["created_at"]
    return new == old


def settle_ids(
    session_id: str,
    records: Sequence[dict[str, Any]],
    stored: Collection[tuple[int, dict[str, Any]]],
) -> None:
    """Decide an append by message id: the one rule every backend runs inside its append
    transaction, before the batch's check, on ``stored``: the session's messages (seq,
    record) whose ids are among the batch's (a backend may pass more; any order).

    Returns (None) when no id of the batch is stored: a new append, to go on with.

    Raises:
        AlreadyStored: every message of the batch is stored under its id, each the same
            message (but for ``created_at``): a retry of an append that was stored. The
            backend stores nothing and the stored rows are the answer.
        MessageIdConflictError: an id is stored with another message, or only some of the
            batch's ids are stored. An append is all or nothing, so a retry finds all its
            messages stored or none; a batch that finds some is another batch reusing ids.

    """
    by_id = {r.get("id"): (seq, r) for seq, r in stored}
    found = [by_id.get(r.get("id")) for r in records]
    if not any(found):
        return
    for new, old in zip(records, found, strict=True):
        if old is not None and not _same_message(new, old[1]):
            raise MessageIdConflictError(session_id, new["id"])
    rows = [old for old in found if old is not None]
    if len(rows) < len(records):  # some stored, some not: not a retry
        raise MessageIdConflictError(session_id, rows[0][1]["id"])
    raise AlreadyStored(rows)


def advance_pending(pending: Sequence[str], messages: Sequence[Message]) -> tuple[str, ...]:
    """The calls still waiting for results after appending ``messages``.

    Raises:
        OrphanToolResultError: a tool result that answers no waiting call.
        MissingToolResultError: a non-tool message while calls still wait for results.

    """
    waiting = list(pending)
    for i, m in enumerate(messages):
        if m.role == "tool":
            if m.tool_call_id not in waiting:
                raise OrphanToolResultError(
                    f"tool result for {m.tool_call_id!r} answers no call waiting in this "
                    f"session (waiting: {waiting or 'none'})",
                    index=i,
                    tool_call_id=m.tool_call_id,
                )
            waiting.remove(m.tool_call_id)
            continue
        if waiting:
            raise MissingToolResultError(
                f"cannot add a {m.role} message: tool call {waiting[0]!r} is still waiting "
                "for its result; add the tool results first",
                index=i,
                tool_call_id=waiting[0],
            )
        if m.tool_calls:
            ids = [tc.id for tc in m.tool_calls]
            if len(set(ids)) != len(ids):
                raise InvalidMessageError("duplicate tool call ids in one message", index=i)
            waiting = ids
    return tuple(waiting)


def pending_after_pop(pending: Sequence[str], record: dict[str, Any]) -> tuple[str, ...]:
    """The calls waiting for results once ``record``, the newest message, is taken back: a
    tool result's call waits again; an assistant message's calls wait no more.
    """
    if record.get("role") == "tool" and record.get("tool_call_id"):
        return (*pending, record["tool_call_id"])
    if record.get("tool_calls"):
        return ()
    return tuple(pending)


def trim_point(roles: Sequence[str], max_history: int, *, held: int | None = None) -> int:
    """How many of the oldest messages to remove so at most ``max_history`` remain.

    The cut never leaves a tool result first: it moves later, past the rest of its unit, so
    the kept history starts at a whole unit (and may be shorter than ``max_history``).
    ``roles`` are the stored messages' roles, oldest first: all of them, or (with ``held``,
    how many there are) the oldest few; then ``len(roles)`` means the cut lies past them.
    """
    n = len(roles) if held is None else held
    if n <= max_history:
        return 0
    cut = n - max_history
    while cut < len(roles) and roles[cut] == "tool":
        cut += 1
    return cut

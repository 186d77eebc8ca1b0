"""Which episodes a search, count or forget looks at: :class:`EpisodeFilter`, written once.

A filter is parsed and validated here, without I/O, from the mapping a caller passes
(``{"agent_id": "a1", "metadata": {"lang": "en"}}``); every store then either asks
:meth:`EpisodeFilter.matches` (the memory store) or translates the filter to SQL through
:meth:`EpisodeFilter.where` and a :class:`Dialect` (SQLite, PostgreSQL). The semantics are
this module's, and the contract suite checks that every store gives the same answers.

Metadata is compared as JSON values (:func:`json_equal`): ``{"k": v}`` matches an episode
whose metadata has the key ``k`` with a value equal to ``v``, where a list equals only a list
of equal items in the same order, an object only an object with the same keys and equal
values, a number any equal number (``1`` is ``1.0``), and a boolean only the same boolean
(``true`` is not ``1``). Containment is not matching: ``{"k": [1]}`` does not match
``{"k": [1, 2]}``. Every key of the filter must match.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ctxkeep import _check
from ctxkeep.errors import ConfigError, InvalidFilterError

if TYPE_CHECKING:
    from ctxkeep.episodic.base import Episode

_ID_KEYS = ("episode_id", "session_id", "agent_id", "task_id")

MAX_FILTER_IDS = 10_000
"""Ids one id filter may list: each is a query parameter, and SQLite takes at most 32,766 in
one statement, PostgreSQL 65,535 (beyond that the store failed: 503, issue 25)."""
MAX_METADATA_DEPTH = 6
"""Levels of lists and objects a metadata filter's value may nest (``{"k": [[1]]}``: 2). On
SQLite each level is a nested ``json_each`` subquery, and 9 overflowed its parser's stack
(503, issue 25); metadata worth filtering on is flat."""
MAX_METADATA_VALUES = 100
"""Values (at every level) a metadata filter may compare: each is a condition, and SQLite's
expression tree (at most 1,000 deep) overflowed at 500 values side by side, and at 150 in a
list 5 levels down (503, issue 25); 120 there still passed."""


def json_equal(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are equal as JSON values (see the module docstring)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(v, b[k]) for k, v in a.items())
    if a is None or b is None:
        return a is None and b is None
    return type(a) is type(b) is str and a == b


def _ids(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, list | tuple | Set) and len(value) > MAX_FILTER_IDS:
        raise InvalidFilterError(
            f"filter {key!r} lists {len(value)} ids; at most {MAX_FILTER_IDS} are taken: "
            "search in parts"
        )
    if isinstance(value, list | tuple | Set) and all(isinstance(v, str) for v in value):
        try:
            _check.identifier(f"filter {key!r}", "".join(value), empty=True)
        except ConfigError as exc:
            raise InvalidFilterError(str(exc)) from None
        return tuple(sorted(value)) if isinstance(value, Set) else tuple(value)
    raise InvalidFilterError(
        f"filter {key!r} takes a string or a list of strings, got {value!r} "
        "(to not filter on it, leave the key out)"
    )


def _time(key: str, value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise InvalidFilterError(
        f"filter {key!r} takes a unix time (a number) or a datetime, got {value!r}"
    )


def _metadata(value: Any) -> dict[str, Any]:
    from ctxkeep.sessions.records import dumps, loads

    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidFilterError(
            f"filter 'metadata' takes a mapping of string keys to JSON values, got {value!r}"
        )
    try:
        out: dict[str, Any] = loads(dumps(dict(value)))
    except (TypeError, ValueError) as exc:
        raise InvalidFilterError(
            f"filter 'metadata' holds a value that is not JSON: {exc}"
        ) from exc
    if not json_equal(out, dict(value)):  # NaN, a tuple key... anything JSON does not keep
        raise InvalidFilterError(f"filter 'metadata' holds a value that is not JSON: {value!r}")
    _within_bounds(out)
    return out


def _no_nul(texts: Any) -> None:
    r"""Raise InvalidFilterError if a text of ``texts`` (strings, or a mapping's keys) holds
    NUL, which PostgreSQL cannot compare (jsonb holds no ``\u0000``: a 503 there), so no
    store is asked to: the NUL rule of ids and filters (:func:`ctxkeep._check.identifier`).
    """
    for text in texts:
        if "\x00" in text:
            raise InvalidFilterError(
                f"filter 'metadata' must not contain NUL (\\x00): {text[:40]!r}"
            )


def _within_bounds(metadata: dict[str, Any]) -> None:
    """Raise InvalidFilterError unless every store can compare ``metadata`` (already JSON):
    within :data:`MAX_METADATA_DEPTH` and :data:`MAX_METADATA_VALUES`, integers within 64
    bits (SQLite binds no larger one: ``OverflowError``, a 500), and no NUL in a key or text.
    """
    values = 0
    stack: list[tuple[Any, int]] = [(v, 0) for v in metadata.values()]
    _no_nul(metadata)
    while stack:
        value, depth = stack.pop()
        values += 1
        if isinstance(value, str):
            _no_nul([value])
        elif isinstance(value, dict):
            _no_nul(value)
        if values > MAX_METADATA_VALUES:
            raise InvalidFilterError(
                f"filter 'metadata' compares more than {MAX_METADATA_VALUES} values; "
                "filter on fewer keys or smaller values"
            )
        if isinstance(value, int) and not isinstance(value, bool):
            if not _check.INT64_MIN <= value <= _check.INT64_MAX:
                raise InvalidFilterError(
                    f"filter 'metadata' holds an integer beyond 64 bits ({value}); no stored "
                    "metadata can equal it"
                )
        elif isinstance(value, list | dict):
            if depth >= MAX_METADATA_DEPTH:
                raise InvalidFilterError(
                    f"filter 'metadata' nests values more than {MAX_METADATA_DEPTH} levels "
                    "deep; filter on a flatter value"
                )
            items = value if isinstance(value, list) else value.values()
            stack.extend((v, depth + 1) for v in items)


class Dialect(ABC):
    """How one SQL engine writes what a filter needs; a store subclasses it.

    Args:
        mark: the parameter placeholder (``?`` or ``%s``).
        true: the always-true condition.
        false: the always-false condition.

    """

    def __init__(self, mark: str, true: str, false: str) -> None:
        self.mark, self.true, self.false = mark, true, false

    def one_of(self, column: str, values: tuple[Any, ...]) -> tuple[str, list[Any]]:
        """``column`` equals one of ``values`` (at least one)."""
        return f"{column} IN ({', '.join(self.mark for _ in values)})", list(values)

    @abstractmethod
    def metadata_equals(self, record: str, key: str, value: Any) -> tuple[str, list[Any]]:
        """The JSON text column ``record`` has ``metadata[key]`` JSON-equal to ``value``."""


@dataclass(frozen=True, kw_only=True)
class EpisodeFilter:
    """Which episodes an operation looks at; every field left ``None`` does not filter.

    Build one with :meth:`parse` from the mapping callers pass as ``filters=``; the
    constructor takes the normalised fields and validates them alike.
    """

    episode_id: tuple[str, ...] | None = None
    """Episodes with one of these ids (a string or a list is accepted)."""
    session_id: tuple[str, ...] | None = None
    """Episodes of one of these sessions (a string or a list is accepted)."""
    agent_id: tuple[str, ...] | None = None
    """Episodes of one of these agents (a string or a list; an episode saved without an
    agent matches no agent filter)."""
    task_id: tuple[str, ...] | None = None
    """Episodes of one of these tasks (a string or a list; an episode saved without a task
    matches no task filter)."""
    since: float | None = None
    """Episodes created at or after this unix time (a number or a datetime is accepted)."""
    until: float | None = None
    """Episodes created at or before this unix time (a number or a datetime is accepted)."""
    metadata: Mapping[str, Any] | None = None
    """Episodes whose metadata has each of these keys with a JSON-equal value (see
    :func:`json_equal`: no containment, ``true`` is not ``1``)."""

    def __post_init__(self) -> None:
        for key in _ID_KEYS:
            if getattr(self, key) is not None:
                object.__setattr__(self, key, _ids(key, getattr(self, key)))
        for key in ("since", "until"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, _time(key, getattr(self, key)))
        if self.metadata is not None:  # no key to match: every episode matches
            object.__setattr__(self, "metadata", _metadata(self.metadata) or None)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The keys a filter mapping may hold."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, filters: Mapping[str, Any] | EpisodeFilter | None) -> EpisodeFilter:
        """The filter a caller's ``filters=`` argument describes (``None``: every episode).

        An id key given as ``None`` is refused rather than ignored: a search meant for one
        agent must not return every agent's episodes because the agent was unknown.

        Raises:
            InvalidFilterError: an unknown key (the message lists the allowed ones) or a
                value of the wrong kind.

        """
        if isinstance(filters, EpisodeFilter):
            return filters
        if filters is None:
            return cls()
        if not isinstance(filters, Mapping):
            raise InvalidFilterError(
                f"filters must be a mapping or an EpisodeFilter, got {type(filters).__name__}"
            )
        allowed = cls.keys()
        for key, value in filters.items():
            if key not in allowed:
                raise InvalidFilterError(
                    f"unknown filter key {key!r}; allowed keys: {', '.join(allowed)}"
                )
            if key in _ID_KEYS and value is None:  # ignoring it would widen the search
                _ids(key, value)
        return cls(**filters)

    @property
    def selects_all(self) -> bool:
        """Whether the filter selects every episode."""
        return all(getattr(self, k) is None for k in self.keys())

    @functools.cached_property
    def _id_sets(self) -> tuple[tuple[str, frozenset[str | None]], ...]:
        """The id keys given, each with its values as a set (a tuple's ``in`` made a
        filter of 10,000 episode ids cost a scan of them per episode matched).
        """
        return tuple(
            (key, frozenset(want)) for key in _ID_KEYS if (want := getattr(self, key)) is not None
        )

    def matches(self, e: Episode) -> bool:
        """Whether episode ``e`` passes the filter."""
        for key, want in self._id_sets:
            if getattr(e, key) not in want:
                return False
        if self.since is not None and e.created_at < self.since:
            return False
        if self.until is not None and e.created_at > self.until:
            return False
        meta = self.metadata or {}
        return all(k in e.metadata and json_equal(e.metadata[k], v) for k, v in meta.items())

    def where(self, dialect: Dialect, column: Callable[[str], str] = str) -> tuple[str, list[Any]]:
        """The filter as one SQL condition and its parameters.

        Args:
            dialect: the engine's way of writing lists and metadata comparisons.
            column: the SQL name of a column (``episode_id``, ``session_id``, ``agent_id``,
                ``task_id``, ``created_at``, ``record``: the episode's JSON), for instance
                with a table alias.

        """
        conds: list[str] = []
        params: list[Any] = []

        def add(cond: str, *values: Any) -> None:
            conds.append(cond)
            params.extend(values)

        for key in _ID_KEYS:
            want = getattr(self, key)
            if want is not None:
                cond, values = dialect.one_of(column(key), want) if want else (dialect.false, [])
                add(cond, *values)
        if self.since is not None:
            add(f"{column('created_at')} >= {dialect.mark}", self.since)
        if self.until is not None:
            add(f"{column('created_at')} <= {dialect.mark}", self.until)
        for k, v in (self.metadata or {}).items():
            cond, values = dialect.metadata_equals(column("record"), k, v)
            add(cond, *values)
        return (" AND ".join(conds) if conds else dialect.true), params

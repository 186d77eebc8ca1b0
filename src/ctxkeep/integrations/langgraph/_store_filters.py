"""The I/O-free checks of :class:`~ctxkeep.integrations.langgraph.CtxkeepStore`: input, filters.

What a put's value may be (:func:`_value_text`: plain JSON), how a search filter is checked
(:func:`_filter`) and matched against a value (:func:`matches_filter`), how a namespace
listing's conditions match (:func:`matches_namespace`), and the checks that refuse a malformed
operation (:func:`_check_op`) or config (:func:`_index_fields`, :func:`_ttl_config`) before
anything is done; and :func:`sql_filter`, the SQL condition of SQLite and PostgreSQL that
selects exactly the values :func:`matches_filter` accepts, where one exists (then the engine
filters, orders and pages in one statement).

Imports LangGraph: import it through ``store``, which says which extra to install when it is
missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, cast

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
    TTLConfig,
    tokenize_path,
    validate_op_namespace,
)

from ctxkeep import _check
from ctxkeep.episodic.filters import json_equal
from ctxkeep.errors import ConfigError, InvalidFilterError, InvalidTypeError
from ctxkeep.sessions.records import dumps

OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
"""The comparison operators a filter may use."""

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


try:
    import orjson as _orjson

    _PLAIN = (
        _orjson.OPT_PASSTHROUGH_DATACLASS
        | _orjson.OPT_PASSTHROUGH_DATETIME
        | _orjson.OPT_PASSTHROUGH_SUBCLASS
    )
except ImportError:  # pragma: no cover - orjson is a dependency
    _orjson = None  # type: ignore[assignment]


def _refuse(value: Any) -> Any:
    raise TypeError(type(value).__name__)


def _plain_text(value: Any) -> str | None:
    """The JSON text of ``value`` in one ``orjson`` call when it is plain JSON data that
    :func:`_json_value` would take as it is, else None (then the checked path decides, and
    names what is wrong). ``orjson`` refuses what is not a dict, list, tuple, str, int,
    float, bool or None (subclasses included), lone surrogates and integers over 64 bits;
    nesting past 200 levels (it allows 254) is told by the text (fewer than 200 brackets and
    braces), and what it writes for NaN or infinity (``null``) by the text too: a value
    whose text holds ``null`` is searched once for a float that is not finite
    (:func:`_not_finite`), not checked and encoded again.
    """
    if _orjson is None:
        return None
    try:
        # positional arguments, and the text searched as str: orjson parses keywords, and
        # ``in`` on bytes takes a buffer first (0.31 -> 0.21 us and 0.45 -> 0.07 us)
        text: str = _orjson.dumps(value, _refuse, _PLAIN).decode()
    except TypeError:
        return None
    if len(text) >= 400 and text.count("[") + text.count("{") >= 200:
        return None
    if "null" in text and _not_finite(value):
        return None
    return text


def _not_finite(value: Any) -> bool:
    """Whether ``value`` (data ``orjson`` took: exact dicts, lists, tuples, floats) holds a
    float that is NaN or infinite.
    """
    kind = type(value)
    if kind is float:
        return not math.isfinite(value)
    if kind is dict:
        return any(_not_finite(v) for v in value.values())
    if kind is list or kind is tuple:
        return any(_not_finite(v) for v in value)
    return False


def _value_text(value: Any) -> str:
    """The JSON text of a put's value.

    Raises:
        InvalidTypeError: not a mapping with string keys, or a part JSON cannot hold.
        ConfigError: NaN or infinity, an integer too large, a string that is not Unicode.

    """
    if type(value) is not dict and not isinstance(value, Mapping):  # dict: no ABC check
        raise InvalidTypeError(f"value must be a mapping (or None to delete), got {value!r:.60}")
    text = _plain_text(value)
    if text is not None:
        return text
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


Engine = Literal["sqlite", "postgres"]
"""The SQL engines of the item table."""

_ORDER_SQL = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def sql_filter(flt: Mapping[str, Any] | None, engine: Engine) -> tuple[str, tuple[Any, ...]] | None:
    """The condition over the item table's ``value`` column (JSON text; ``?`` placeholders)
    that holds for exactly the values :func:`matches_filter` accepts, with its parameters;
    ``None`` when a part of the filter has no exact translation here (a list, a mapping
    without operators, a key SQLite's JSON paths cannot quote): the caller then filters in
    Python.

    Each part is one top-level key compared with a scalar: equality is JSON equality (a
    number equals a number of the same value, ``true`` is not ``1``, a missing key equals
    ``None``), order holds only between two numbers or two strings (strings by code point:
    SQLite's ``BINARY``, PostgreSQL's ``"C"``), and every condition is true or false, never
    NULL, so ``$ne`` is its negation.
    """
    conds: list[str] = []
    params: list[Any] = []
    for key, want in (flt or {}).items():
        ops = (
            list(want.items())
            if isinstance(want, Mapping) and any(k.startswith("$") for k in want)
            else [("$eq", want)]
        )
        for op, arg in ops:
            made = _sql_compare(key, op, arg, engine)
            if made is None:
                return None
            conds.append(made[0])
            params += made[1]
    return (" AND ".join(conds) or "1 = 1"), tuple(params)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def _sql_compare(key: str, op: str, arg: Any, engine: Engine) -> tuple[str, list[Any]] | None:
    """One comparison of a top-level field (see :func:`sql_filter`), or ``None``."""
    if not _scalar(arg) or "\0" in key or (isinstance(arg, str) and "\0" in arg):
        return None  # PostgreSQL's text holds no NUL
    if engine == "sqlite":
        if any(c in key for c in '"\\') or not key.isprintable():
            return None  # not a path SQLite quotes as one key
        if isinstance(arg, int) and not -(2**63) <= arg < 2**63:
            return None  # sqlite3 binds 64-bit integers only
        path = f'$."{key}"'
        kind = "coalesce(json_type(value, ?), 'null')"
        if op in ("$eq", "$ne"):
            if arg is None:
                cond, params = f"{kind} = 'null'", [path]
            elif isinstance(arg, bool):
                cond, params = f"{kind} = ?", [path, "true" if arg else "false"]
            elif isinstance(arg, str):
                cond = f"({kind} = 'text' AND json_extract(value, ?) = ?)"
                params = [path, path, arg]
            else:
                cond = f"({kind} IN ('integer', 'real') AND json_extract(value, ?) = ?)"
                params = [path, path, arg]
        else:
            types = "= 'text'" if isinstance(arg, str) else "IN ('integer', 'real')"
            cond = f"({kind} {types} AND json_extract(value, ?) {_ORDER_SQL[op]} ?)"
            params = [path, path, arg]
        return (f"NOT {cond}" if op == "$ne" else cond), params
    field = "(value::jsonb -> ?)"
    if op in ("$eq", "$ne"):
        if arg is None:
            cond, params = f"coalesce({field}, 'null'::jsonb) = 'null'::jsonb", [key]
        else:
            cond, params = f"coalesce({field} = ?::jsonb, FALSE)", [key, dumps(arg)]
        return (f"NOT {cond}" if op == "$ne" else cond), params
    if isinstance(arg, str):
        kind, text = "string", '(value::jsonb ->> ?) COLLATE "C"'
    else:
        kind, text = "number", "(value::jsonb ->> ?)::numeric"
    cond = (
        f"CASE WHEN jsonb_typeof({field}) = '{kind}' THEN {text} {_ORDER_SQL[op]} ? ELSE FALSE END"
    )
    return cond, [key, key, arg]


def matches_namespace(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with the condition's
    path, where a ``"*"`` label matches any label.
    """
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(p in ("*", n) for p, n in zip(path, part, strict=True)) if path else True


KNOWN_NAMESPACES = 4096
"""How many namespaces a store remembers as checked for a put (:func:`_check_put`); when
full, it forgets them all and starts again (bounded, whatever the namespaces put)."""


def _check_op(op: Any, known: dict[tuple[str, ...], str] | None = None) -> None:
    """Refuse a malformed operation before any operation of its batch runs (one test of the
    operation's type, then its fields: this runs for every operation of every batch, and a
    test of each type in turn was a tenth of a ``memory://`` put). ``known``: namespaces a
    put may write to, checked before (:func:`_check_put`).

    Raises:
        InvalidNamespaceError: a namespace label that is empty, not a string or holds ``.``;
            a put to the empty namespace or under ``langgraph``.
        InvalidTypeError / ConfigError / InvalidFilterError: another malformed field.

    """
    if type(op) is PutOp or isinstance(op, PutOp):
        _check_put(op, known)
    elif isinstance(op, GetOp):
        _check_namespace(op, op.namespace)
        _check.text("key", op.key, empty=True)
    elif isinstance(op, SearchOp):
        _check_search(op)
    elif isinstance(op, ListNamespacesOp):
        validate_op_namespace(op)
        for cond in op.match_conditions or ():
            if cond.match_type not in ("prefix", "suffix"):
                raise ConfigError(f"match_type must be 'prefix' or 'suffix', got {cond!r}")
        _check.optional_integer("max_depth", op.max_depth, minimum=1)
        _check.integer("limit", op.limit, minimum=0)
        _check.integer("offset", op.offset, minimum=0)
    else:
        raise InvalidTypeError(
            f"unknown store operation {op!r:.60}; use GetOp, PutOp, SearchOp or ListNamespacesOp"
        )


def _check_search(op: SearchOp) -> dict[str, Any] | None:
    """Refuse a malformed search (:func:`_check_op` of a :class:`SearchOp`); returns its
    filter as :func:`_filter` gives it. A query of ASCII text and a limit and offset that are
    plain ints in range are taken as they are, without the checks' calls (with the one test
    of the op's type: 1.2 -> 0.7 us a search).

    Raises:
        InvalidNamespaceError: a namespace label that is empty, not a string or holds ``.``.
        InvalidTypeError / ConfigError / InvalidFilterError: another malformed field.

    """
    _check_namespace(op, op.namespace_prefix)
    flt = _filter(op.filter)
    query = op.query
    if query is not None and (type(query) is not str or not query.isascii()):
        _check.text("query", query, empty=True)
    limit, offset = op.limit, op.offset
    if type(limit) is not int or not 0 <= limit <= _check.INT64_MAX:
        _check.integer("limit", limit, minimum=0)
    if type(offset) is not int or not 0 <= offset <= _check.INT64_MAX:
        _check.integer("offset", offset, minimum=0)
    return flt


def _check_put(
    op: PutOp, known: dict[tuple[str, ...], str] | None, *, strict: bool = False
) -> None:
    """Refuse a malformed put (a delete: ``value`` None) in one pass. ``known``: the
    namespaces a put may write to that were checked before (a tuple of valid labels, not
    empty, not under ``langgraph``), each with its labels joined by ``.`` (the item
    tables' text of it), which a namespace checked here joins (at most
    :data:`KNOWN_NAMESPACES`); a put into one of them skips the namespace's checks (a
    store's puts go to a few namespaces: checking each label of each put's was two fifths
    of checking a put). ``strict``: refuse an empty or ``langgraph`` namespace for a delete
    too (as ``BaseStore.put`` does).

    Raises:
        InvalidNamespaceError: a namespace label that is empty, not a string or holds ``.``;
            a put to the empty namespace or under ``langgraph``.
        InvalidTypeError / ConfigError: another malformed field.

    """
    namespace = op.namespace
    try:
        seen = known is not None and type(namespace) is tuple and namespace in known
    except TypeError:  # an unhashable label: checked (and refused) as it is
        seen = False
    if not seen:
        _check_namespace(op, namespace)
        if not namespace:
            if strict or op.value is not None:
                raise InvalidNamespaceError("Namespace cannot be empty.")
        elif namespace[0] == "langgraph":
            if strict or op.value is not None:
                raise InvalidNamespaceError(
                    f'Root label for namespace cannot be "langgraph". Got: {namespace}'
                )
        elif known is not None and all(type(label) is str for label in namespace):
            if len(known) >= KNOWN_NAMESPACES:
                known.clear()
            known[namespace] = ".".join(namespace)
    key = op.key
    if type(key) is not str or not key.isascii():
        _check.text("key", key, empty=True)
    if op.value is None:
        return
    index = op.index
    if (
        index is not None
        and index is not False
        and (not isinstance(index, list) or not all(isinstance(p, str) for p in index))
    ):
        raise InvalidTypeError(f"index must be False, None or a list of paths: {index!r}")
    if op.ttl is not None:
        _check.number("ttl", op.ttl, positive=True)


def _check_namespace(op: Any, namespace: Any) -> None:
    """Refuse a namespace (or prefix) that is not a tuple of valid labels."""
    if not isinstance(namespace, tuple):
        raise InvalidNamespaceError(f"a namespace must be a tuple of strings, got {op!r:.80}")
    validate_op_namespace(op)


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

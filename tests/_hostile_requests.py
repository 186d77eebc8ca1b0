"""What the hostile-input suite (``test_hostile_routes.py``) sends: hostile values as JSON
text, the service's routes read from its OpenAPI document, and every variant of a route's
valid request (not collected: no ``test_`` prefix).
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ctxkeep.server import create_app

MAX_BODY = 4 * 1024 * 1024
"""The service's body limit in the suite (the default)."""

# -- hostile values, as JSON text ----------------------------------------------------------------

SURROGATE = '"\\ud800"'
NUL = '"a\\u0000b"'
BIG_INTS = {
    "2**63": str(2**63),
    "-(2**63)-1": str(-(2**63) - 1),
    "10**20": str(10**20),
    "10**5000": "1" + "0" * 5000,
}
"""Integers beyond 64 bits; 10**5000 is also beyond Python's default int parsing (4,300
digits)."""


def deep_object(depth: int) -> str:
    """``{"a": {"a": ... {}}}``, ``depth`` levels deep, as JSON text."""
    return '{"a":' * depth + "{}" + "}" * depth


def deep_array(depth: int) -> str:
    """``[[...[]]]``, ``depth`` levels deep, as JSON text."""
    return "[" * depth + "]" * depth


LONG_TEXT = '"' + "".join(random.Random(25).choices(string.ascii_letters, k=20_000)) + '"'
"""20,000 letters that do not compress: beyond what a PostgreSQL index entry holds (2,704
bytes) once stored, in an id that has an index."""
STRING_KINDS = {
    "surrogate": SURROGATE,
    "nul": NUL,
    "long": LONG_TEXT,
    "empty": '""',
    "control": '"a\\u0001\\u001fb\\r\\n"',
    "int-2**63": BIG_INTS["2**63"],
    "deep-1000": deep_object(1000),
}
NUMBER_KINDS = {
    **{f"int-{name}": text for name, text in BIG_INTS.items()},
    "1e400": "1e400",
    "surrogate": SURROGATE,
}
JSON_KINDS = {
    "deep-10": deep_object(10),
    "deep-1000": deep_object(1000),
    "deep-100000": deep_object(100_000),
    "nul": '{"a\\u0000b": "c\\u0000d"}',
    "surrogate": '{"\\ud800": ["\\udfff"]}',
    "int-2**63": '{"k": ' + BIG_INTS["2**63"] + "}",
    "int-10**5000": '{"k": ' + BIG_INTS["10**5000"] + "}",
}
"""Values of a JSON member (NUL and lone surrogates in a key and a value at once); a member
that holds a list (content parts, tool calls) gets each in a list."""
URL_TEXT_KINDS = {
    "surrogate": "%ED%A0%80",
    "bad-utf8": "%FF%FE",
    "nul": "a%00b",
    "slash": "a%2Fb",
    "long": LONG_TEXT.strip('"'),
    "int-2**63": BIG_INTS["2**63"],
}
URL_NUMBER_KINDS = {
    **{f"int-{name}": text for name, text in BIG_INTS.items()},
    "surrogate": "%ED%A0%80",
}
"""Values of a path or query parameter (text, or an integer), as they appear in the URL."""


SCHEMA_EXAMPLES: dict[str, Any] = {
    "ToolCallIn": {"id": "call-x", "name": "lookup", "arguments": "{}"},
    "FunctionIn": {"name": "lookup", "arguments": "{}"},
}
"""A valid value of a component the baselines leave out, to attack its members too."""


# -- the routes and their variants, from the OpenAPI document ----------------------------------


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    operation: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return (self.method, self.path)

    @property
    def id(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Variant:
    """One request: the baseline with one thing changed."""

    what: str
    path: dict[str, str] | None = None
    query: list[tuple[str, str]] | None = None
    body: bytes | None = None
    headers: dict[str, str | bytes] | None = None


def _schema_doc() -> dict[str, Any]:
    app = create_app("memory://", embedder="hash")
    return app.openapi()


DOC = _schema_doc()
COMPONENTS: dict[str, Any] = DOC["components"]["schemas"]
ROUTES = [
    Route(method.upper(), path, op)
    for path, ops in DOC["paths"].items()
    for method, op in ops.items()
]


def _resolve(schema: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    ref = schema.get("$ref")
    if ref is None:
        return None, schema
    name = ref.rsplit("/", 1)[1]
    return name, COMPONENTS[name]


def _branches(schema: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """The alternatives of a schema (``anyOf``), references resolved, ``null`` left out."""
    name, schema = _resolve(schema)
    alts = schema.get("anyOf") or schema.get("oneOf")
    if not alts:
        return [(name, schema)]
    return [_resolve(a) for a in alts if a.get("type") != "null"]


def _kind(schema: dict[str, Any]) -> str:
    """``json`` (an object, a list or any value), ``number`` or ``string`` (also booleans
    and enums) for the hostile values a member gets.
    """
    types = {b.get("type") for _, b in _branches(schema)}
    if "object" in types or "array" in types or None in types:
        return "json"
    if types & {"integer", "number"}:
        return "number"
    return "string"


def _lists_only(schema: dict[str, Any]) -> bool:
    """A JSON member that takes lists but no objects (content parts, tool calls)."""
    types = {b.get("type") for _, b in _branches(schema)}
    return "array" in types and "object" not in types and None not in types


MARK = "__hostile_value__"


def _encode(body: Any, at: tuple[Any, ...], raw: str) -> bytes:
    """``body`` as JSON text with the member at ``at`` replaced by the JSON text ``raw``."""
    copy = json.loads(json.dumps(body))
    target = copy
    for step in at[:-1]:
        target = target[step]
    target[at[-1]] = MARK
    text = json.dumps(copy)
    assert text.count(f'"{MARK}"') == 1
    return text.replace(f'"{MARK}"', raw).encode()


def _members(
    schema: dict[str, Any], value: Any, at: tuple[Any, ...]
) -> Iterator[tuple[tuple[Any, ...], dict[str, Any], Any]]:
    """Every member of a body (nested ones too): its place, its schema and the object holding
    it in the baseline (members the baseline leaves out are given, from
    :data:`SCHEMA_EXAMPLES`, when they are objects).
    """
    for name, branch in _branches(schema):
        if branch.get("type") == "object" and "properties" in branch:
            if not isinstance(value, dict):
                continue
            for prop, sub in branch["properties"].items():
                yield (*at, prop), sub, value
                inner = value.get(prop)
                if inner is None:
                    inner = example(sub)
                    if inner is None:
                        continue
                    value = {**value, prop: inner}
                yield from _members(sub, inner, (*at, prop))
        elif branch.get("type") == "array" and "items" in branch:
            items = value if isinstance(value, list) and value else None
            if items is None:
                item = example(branch["items"])
                if item is None:
                    continue
                items = [item]
            yield from _members(branch["items"], items[0], (*at, 0))
        del name


def example(schema: dict[str, Any]) -> Any:
    """A copy of the valid value :data:`SCHEMA_EXAMPLES` has for ``schema`` (or None)."""
    for name, _ in _branches(schema):
        if name in SCHEMA_EXAMPLES:
            return json.loads(json.dumps(SCHEMA_EXAMPLES[name]))
    return None


def _with_member(body: Any, at: tuple[Any, ...], holder: Any) -> Any:
    """``body`` with the objects on the way to ``at`` present (as in the holder)."""
    out = json.loads(json.dumps(body))
    target = out
    for i, step in enumerate(at[:-1]):
        if isinstance(target, list):
            if not target:
                target.append({})
            target = target[step]
            continue
        if step not in target or target[step] is None:
            nxt = at[i + 1]
            target[step] = [] if isinstance(nxt, int) else {}
            if isinstance(nxt, int):
                target[step].append({})
        target = target[step]
    if isinstance(target, dict) and isinstance(holder, dict):
        for k, v in holder.items():
            target.setdefault(k, v)
    return out


def body_schema(route: Route) -> dict[str, Any] | None:
    content = route.operation.get("requestBody", {}).get("content", {})
    return content.get("application/json", {}).get("schema")


AUTH_KINDS: dict[str, str | bytes] = {
    "none": "",
    "basic": "Basic eHk6eHk=",
    "empty bearer": "Bearer ",
    "unknown key": "Bearer ck_000000000000_nope",
    "huge key": "Bearer " + "k" * 100_000,
    "latin-1 key": b"Bearer \xff\xfe",
    "nul key": "Bearer a\x00b",
}
"""Values of the ``Authorization`` header: each one 401, nothing stored."""


def variants(route: Route, make_body: Callable[[], Any] | None) -> Iterator[Variant]:
    """Every hostile variant of ``route``'s request. ``make_body`` gives its valid body (None:
    the route takes none), called again for each variant (a valid body can depend on the
    store: the newest message's id, the task's version).
    """
    params = route.operation.get("parameters", [])
    for p in params:
        place, name = p["in"], p["name"]
        kinds = URL_NUMBER_KINDS if _kind(p["schema"]) == "number" else URL_TEXT_KINDS
        for kind, text in kinds.items():
            if place == "path":
                yield Variant(f"path {name}={kind}", path={name: text})
            elif place == "query":
                yield Variant(f"query {name}={kind}", query=[(name, text)])
        if place == "query":
            yield Variant(f"query {name} twice", query=[(name, "1"), (name, BIG_INTS["2**63"])])
    yield Variant("unknown query parameter", query=[("bogus", URL_TEXT_KINDS["surrogate"])])
    yield Variant("bad percent escape", query=[("limit", "%"), ("x", "%zz")])
    for what, value in AUTH_KINDS.items():
        yield Variant(f"authorization {what}", headers={"authorization": value})
    schema = body_schema(route)
    if schema is not None and make_body is not None:
        for at, sub, holder in _members(schema, make_body(), ()):
            where = ".".join(str(s) for s in at)
            kinds = {"json": JSON_KINDS, "number": NUMBER_KINDS, "string": STRING_KINDS}[_kind(sub)]
            for kind, text in kinds.items():
                base = _with_member(make_body(), at, holder)
                raw = f"[{text}]" if _kind(sub) == "json" and _lists_only(sub) else text
                yield Variant(f"body {where}={kind}", body=_encode(base, at, raw))
        body = make_body()
        first = next(iter(body), None) if isinstance(body, dict) else None
        if first is not None:
            dup = f'{{"{first}": {SURROGATE}, ' + json.dumps(body)[1:]
            yield Variant("duplicate key", body=dup.encode())
        yield Variant(
            "text/plain",
            body=json.dumps(make_body()).encode(),
            headers={"content-type": "text/plain"},
        )
        yield Variant(
            "form",
            body=b"agent_id=a&messages=1",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        yield Variant(
            "multipart",
            body=b"--x\r\nContent-Disposition: form-data; name=a\r\n\r\n1\r\n--x--\r\n",
            headers={"content-type": "multipart/form-data; boundary=x"},
        )
        yield Variant(
            "utf-16",
            body=json.dumps(make_body()).encode("utf-16"),
            headers={"content-type": "application/json; charset=utf-16"},
        )
        yield Variant(
            "no content type", body=json.dumps(make_body()).encode(), headers={"content-type": ""}
        )
    yield Variant("empty body", body=b"")
    yield Variant("invalid json", body=b'{"a": ')
    yield Variant("not utf-8", body=b'{"a": "\xff\xfe"}')
    yield Variant("json null", body=b"null")
    yield Variant("json array", body=b"[]")
    yield Variant("json string", body=b'"\\ud800"')
    yield Variant("top-level deep-100000", body=deep_object(100_000).encode())
    yield Variant("top-level deep-array-100000", body=deep_array(100_000).encode())
    yield Variant("huge body", body=b'{"a": "' + b"x" * (MAX_BODY + 1) + b'"}')
    yield Variant("huge declared length", body=b"{}", headers={"content-length": str(2**63)})

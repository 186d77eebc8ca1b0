"""The ``read_artifact`` tool: lets an agent read a compressed tool output back.

:data:`READ_ARTIFACT_TOOL` is the tool definition to give the agent; :func:`read_artifact_tool`
answers its calls from an :class:`~ctxkeep.artifacts.ArtifactStore`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ctxkeep import _check
from ctxkeep.artifacts.base import ArtifactStore
from ctxkeep.errors import InvalidMessageError, describe

READ_ARTIFACT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_artifact",
        "description": (
            "Read back the full text of an earlier tool output that was compressed to save "
            "context. Pass the ref shown in the compressed output; use offset and limit (in "
            "characters) to page through a long one."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "the artifact ref, sha256:..."},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "default": 8000},
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}


def _position(args: dict[str, Any], name: str, default: int, minimum: int) -> int:
    """The integer argument ``name`` (``default`` if absent or null); the model wrote these
    arguments, so a bad one is an :class:`InvalidMessageError` it can be told about.
    """
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON has one number type: 4.0 is 4
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidMessageError(
            f"read_artifact {name} must be an integer >= {minimum}, got {describe(value)}"
        )
    return value


def read_artifact_tool(store: ArtifactStore, arguments: str | Mapping[str, Any]) -> str:
    """Answer a ``read_artifact`` tool call.

    Args:
        store: where the artifacts are.
        arguments: the call's arguments, as the JSON text the model wrote or a mapping.

    Returns:
        The requested slice of the artifact, with a note of what remains.

    Raises:
        InvalidMessageError: arguments that are not a JSON object, miss ``ref``, or have an
            ``offset`` or ``limit`` that is not an integer in range.
        InvalidTypeError: ``store`` is not an artifact store, or ``arguments`` neither a
            string nor a mapping with string keys (a ``TypeError``).
        ArtifactNotFoundError: an unknown ref.

    """
    _check.instance("store", store, ArtifactStore, "an ArtifactStore")
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            raise InvalidMessageError(f"read_artifact arguments are not JSON: {exc}") from exc
    else:
        args = _check.mapping("arguments", arguments)
    if not isinstance(args, dict) or "ref" not in args:
        raise InvalidMessageError("read_artifact needs a 'ref' argument")
    offset = _position(args, "offset", 0, 0)
    limit = _position(args, "limit", 8000, 1)
    text = store.get(args["ref"])
    chunk = text[offset : offset + limit]
    rest = len(text) - offset - len(chunk)
    if rest > 0:
        chunk += f"\n[{rest} more characters: call read_artifact with offset={offset + limit}]"
    return chunk

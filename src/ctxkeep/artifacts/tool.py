"""The ``read_artifact`` tool: lets an agent read a compressed tool output back.

:data:`READ_ARTIFACT_TOOL` is the tool definition to give the agent; :func:`read_artifact_tool`
answers its calls from an :class:`~ctxkeep.artifacts.ArtifactStore`.
"""

from __future__ import annotations

import json
from typing import Any

from ctxkeep.artifacts.base import ArtifactStore
from ctxkeep.errors import InvalidMessageError

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


def read_artifact_tool(store: ArtifactStore, arguments: str | dict[str, Any]) -> str:
    """Answer a ``read_artifact`` tool call.

    Returns:
        The requested slice of the artifact, with a note of what remains.

    Raises:
        InvalidMessageError: arguments that are not JSON or miss ``ref``.
        ArtifactNotFoundError: an unknown ref.

    """
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except ValueError as exc:
            raise InvalidMessageError(f"read_artifact arguments are not JSON: {exc}") from exc
    else:
        args = dict(arguments)
    if not isinstance(args, dict) or "ref" not in args:
        raise InvalidMessageError("read_artifact needs a 'ref' argument")
    offset = int(args.get("offset", 0) or 0)
    limit = int(args.get("limit", 8000) or 8000)
    if offset < 0 or limit < 1:
        raise InvalidMessageError("read_artifact offset must be >= 0 and limit >= 1")
    text = store.get(args["ref"])
    chunk = text[offset : offset + limit]
    rest = len(text) - offset - len(chunk)
    if rest > 0:
        chunk += f"\n[{rest} more characters: call read_artifact with offset={offset + limit}]"
    return chunk

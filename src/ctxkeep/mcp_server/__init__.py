"""``ctxkeep mcp``: ctxkeep's memory for MCP clients (Claude Desktop, Claude Code, Cursor...).

Two modules: :mod:`~ctxkeep.mcp_server.stores` (:class:`Stores`: the stores of ``--db`` /
``--tenant`` and what each tool does with them, free of MCP) and :mod:`~ctxkeep.mcp_server.app`
(the tools and resources on the official ``mcp`` SDK's ``MCPServer``, served over stdio or
streamable HTTP). Only the second imports the SDK (the extra ``ctxkeep[mcp]``); ``import
ctxkeep`` imports neither.

Tools: ``remember``, ``recall``, ``forget`` (episodes); ``create_session``, ``list_sessions``,
``read_session``, ``append_message`` (sessions); ``build_prompt`` (a session's prompt within a
token budget). Resources: ``ctxkeep://sessions/{session_id}`` (a session's history) and
``ctxkeep://artifacts/{ref}`` (the full text of a compressed tool output).
"""

from __future__ import annotations

from ctxkeep.mcp_server.stores import Stores

__all__ = ["Stores"]

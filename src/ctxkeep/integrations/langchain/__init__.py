"""ctxkeep under LangChain: a trimmer, a chat message history and an agent middleware.

Three parts, each over LangChain's own ``BaseMessage`` types (extra ``ctxkeep[langchain]``):

* :func:`prune_messages` is a drop-in for ``langchain_core.messages.trim_messages`` (the same
  keyword names where they mean the same thing, and a ``Runnable`` when called without
  messages) with ctxkeep's guarantees: an ``AIMessage``'s tool calls and their
  ``ToolMessage`` results are kept or dropped together, the budget is exact and hard, old tool
  outputs that do not fit are compressed (head, tail and a ref to the full text in an artifact
  store) before anything is dropped, and the input is never mutated: a message that comes
  back unchanged is the very object given.
* :class:`CtxkeepChatMessageHistory` is a ``BaseChatMessageHistory`` over any
  :func:`~ctxkeep.open_memory` URL, so ``RunnableWithMessageHistory`` gets TTL, LRU and
  ``max_history`` sessions on SQLite, Redis or PostgreSQL.
* :class:`ContextMiddleware` fits every model call of a LangChain v1 agent
  (``create_agent(model, tools, middleware=[ContextMiddleware(...)])``) into the model's window,
  system prompt and tool definitions counted, optionally recalls past runs into the system
  prompt (``### Prior Historical Context``) and saves each run as an episode when it ends.

Messages convert losslessly with :func:`to_ctxkeep_messages` / :func:`from_ctxkeep_messages`:
the ctxkeep :class:`~ctxkeep.Message` carries what ctxkeep counts and checks (role, content as
OpenAI parts, name, tool calls with JSON arguments, tool call id), and
``metadata["langchain"]`` keeps the rest (``message_to_dict``'s data: ids, ``additional_kwargs``,
``response_metadata``, usage, the original content blocks when ctxkeep's form differs), so a
message read back equals the one stored.
"""

from __future__ import annotations

from ctxkeep.integrations.langchain.convert import MessagesInput as MessagesInput
from ctxkeep.integrations.langchain.convert import from_ctxkeep_messages, to_ctxkeep_messages
from ctxkeep.integrations.langchain.history import CtxkeepChatMessageHistory
from ctxkeep.integrations.langchain.middleware import ContextMiddleware, ContextReport, tools_json
from ctxkeep.integrations.langchain.prune import MessageTypes as MessageTypes
from ctxkeep.integrations.langchain.prune import TokenCounterLike as TokenCounterLike
from ctxkeep.integrations.langchain.prune import prune_messages

__all__ = [
    "ContextMiddleware",
    "ContextReport",
    "CtxkeepChatMessageHistory",
    "from_ctxkeep_messages",
    "prune_messages",
    "to_ctxkeep_messages",
    "tools_json",
]

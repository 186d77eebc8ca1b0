"""Adapters that put ctxkeep under other agent frameworks.

Each module here imports its framework and is imported only on demand, so ``import ctxkeep``
never pulls one in:

* :mod:`ctxkeep.integrations.openai_agents` (extra ``ctxkeep[agents]``): a ``Session`` and a
  model-input filter for the OpenAI Agents SDK;
* :mod:`ctxkeep.integrations.langchain` (extra ``ctxkeep[langchain]``): ``prune_messages``
  (a ``trim_messages`` that keeps tool pairs), ``ContextMiddleware`` for v1 agents and a chat
  message history;
* :mod:`ctxkeep.integrations.langgraph` (extra ``ctxkeep[langgraph]``): a checkpointer and a
  store with hybrid recall;
* :mod:`ctxkeep.integrations.pydantic_ai` (extra ``ctxkeep[pydantic-ai]``): a history
  processor.
"""

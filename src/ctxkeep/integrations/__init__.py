"""Adapters that put ctxkeep under other agent frameworks.

Each module here imports its framework and is imported only on demand, so ``import ctxkeep``
never pulls one in: :mod:`ctxkeep.integrations.openai_agents` (extra ``ctxkeep[agents]``) is a
``Session`` for the OpenAI Agents SDK.
"""

"""Context isolation: task-shared state, agent-private scratchpads, and the message bus."""

from ctxkeep.fabric.bus import InProcessBus, IPCMessage, MessageBus
from ctxkeep.fabric.core import ContextFabric, ContextLayer, ContextView, freeze

__all__ = [
    "ContextFabric",
    "ContextLayer",
    "ContextView",
    "IPCMessage",
    "InProcessBus",
    "MessageBus",
    "freeze",
]

"""Context isolation: task-shared state, agent-private scratchpads, and the message bus."""

from ctxkeep.fabric.bus import DeadLetter, InProcessBus, IPCMessage, MessageBus
from ctxkeep.fabric.core import ContextFabric, ContextLayer, ContextView, freeze

__all__ = [
    "ContextFabric",
    "ContextLayer",
    "ContextView",
    "DeadLetter",
    "IPCMessage",
    "InProcessBus",
    "MessageBus",
    "freeze",
]

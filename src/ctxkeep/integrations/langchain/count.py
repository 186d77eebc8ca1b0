"""LangChain token counters as ctxkeep ones.

:func:`_list_counter` reads a ``token_counter`` argument as ``trim_messages`` does (a function
of a message list or of one message, a model's ``get_num_tokens_from_messages``,
``"approximate"``); :class:`_CallableCounter` makes such a function a ctxkeep
:class:`~ctxkeep.TokenCounter` the pruner can plan with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from ctxkeep.errors import InvalidTypeError, MissingDependencyError, describe
from ctxkeep.messages import Message
from ctxkeep.tokens import TokenCounter

try:
    from langchain_core.messages import BaseMessage, HumanMessage
    from langchain_core.messages.utils import count_tokens_approximately
except ImportError as exc:  # the extra is not installed
    raise MissingDependencyError("langchain", "langchain") from exc


class _CallableCounter:
    """A LangChain token counter (a function of a message list or of one message, or a model's
    ``get_num_tokens_from_messages``) as a ctxkeep :class:`~ctxkeep.TokenCounter`.

    A message costs what the function gives for it alone, less what it gives for no message
    (a per-prompt overhead, counted once as the reply priming). The pruner's total is then
    exact for an additive function; :class:`_Trimmer` checks the whole output with the function
    itself and prunes again, tighter, if it is not.
    """

    exact = False

    def __init__(self, fn: Callable[[list[BaseMessage]], int], to_lc: Callable[[Message], Any]):
        self.name = getattr(fn, "__name__", type(fn).__name__)
        self._key = object()  # this counter's entry in a message's count cache
        self._fn = fn
        self._to_lc = to_lc
        self._empty = self._call([])

    def _call(self, messages: list[BaseMessage]) -> int:
        n = self._fn(messages)
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidTypeError(f"token_counter must return an int, got {describe(n)}")
        return n

    def count_text(self, text: str) -> int:
        """Tokens the function gives a human message of ``text``, beyond an empty one."""
        return self._call([HumanMessage(text)]) - self._call([HumanMessage("")])

    def count_message(self, message: Any) -> int:
        """Tokens of one message (cached on the message)."""
        cache: dict[Any, int] = message.__dict__.setdefault("_tokens", {})
        n = cache.get(self._key)
        if n is None:
            n = cache[self._key] = self._call([self._to_lc(message)]) - self._empty
        return n

    def count_messages(self, messages: Iterable[Any]) -> int:
        """Tokens of a prompt: each message plus the function's per-prompt overhead."""
        return sum(self.count_message(m) for m in messages) + self._empty


def _list_counter(token_counter: Any) -> Callable[[list[BaseMessage]], int] | None:
    """A LangChain-style counter as a function of a message list, as trim_messages reads it;
    None for a ctxkeep counter or name.
    """
    if token_counter == "approximate":
        return count_tokens_approximately
    if isinstance(token_counter, str | TokenCounter) or token_counter is None:
        return None
    method = getattr(token_counter, "get_num_tokens_from_messages", None)
    if callable(method):
        return cast("Callable[[list[BaseMessage]], int]", method)
    if not callable(token_counter):
        raise InvalidTypeError(
            "token_counter must be a ctxkeep TokenCounter or encoding name, 'approximate', a "
            "function of messages or a model with get_num_tokens_from_messages(), got "
            f"{describe(token_counter)}"
        )
    import inspect

    try:
        params = list(inspect.signature(token_counter).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].annotation in (BaseMessage, "BaseMessage"):
        per_message = cast("Callable[[BaseMessage], int]", token_counter)
        return lambda ms: sum(per_message(m) for m in ms)
    return cast("Callable[[list[BaseMessage]], int]", token_counter)

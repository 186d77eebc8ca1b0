"""The gate: the last hard check before a prompt goes to the provider.

A prompt over ``max_prompt_length`` code points (default 8192; CJK text counts one per
character, not per byte) or over ``max_prompt_tokens`` exact tokens is refused with
:class:`PromptTooLongError`, which carries a breakdown by role so the caller can see what to cut.

When the counter only estimates (its ``exact`` is False: the chars/4 heuristic, a calibrated
count for a model with no local tokenizer), the gate keeps a margin of the token limit free
(:func:`~ctxkeep.tokens.estimate_margin`): a prompt estimated at the limit can be over it as
the provider counts, and a vLLM server refuses ``prompt + max_tokens > max_model_len``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, overload

from ctxkeep.config import setting_int
from ctxkeep.errors import PromptTooLongError
from ctxkeep.messages import Message, coerce_messages
from ctxkeep.tokens import TokenCounter, estimate_margin, get_counter

DEFAULT_MAX_PROMPT_LENGTH = 8192


def message_length(m: Message) -> int:
    """Code points a message puts in front of the model: its text, name and tool calls."""
    n = len(m.text)
    if m.name:
        n += len(m.name)
    for tc in m.tool_calls:
        n += len(tc.name) + len(tc.arguments)
    return n


class PromptGate:
    """Refuses prompts over a length (code points) or token limit.

    Args:
        max_prompt_length: code points allowed; ``0`` or ``None`` means
            ``CTXKEEP_MAX_PROMPT_LENGTH``, else the config file's ``max_prompt_length``,
            else 8192.
        max_prompt_tokens: exact tokens allowed (``None``/``0``: from
            ``CTXKEEP_MAX_PROMPT_TOKENS``, else the config file, else no token limit); with an
            estimating counter, less a margin (:attr:`margin`).
        counter: the token counter for ``max_prompt_tokens`` (default: :func:`get_counter`,
            which follows the ``encoding`` setting).

    Settings are read by :mod:`ctxkeep.config`; an unknown key in the config file (a typo
    such as ``max_prompt_lenght``) warns with a :class:`~ctxkeep.config.ConfigWarning` naming
    it and the known keys.

    Raises:
        ConfigError: a setting that is not a non-negative integer.

    """

    def __init__(
        self,
        max_prompt_length: int | None = None,
        max_prompt_tokens: int | None = None,
        *,
        counter: TokenCounter | None = None,
    ) -> None:
        length = setting_int("max_prompt_length", max_prompt_length, DEFAULT_MAX_PROMPT_LENGTH)
        assert length is not None
        self.max_prompt_length: int = length
        self.max_prompt_tokens = setting_int("max_prompt_tokens", max_prompt_tokens, None)
        self._counter = counter

    @property
    def counter(self) -> TokenCounter:
        """The counter used for the token limit."""
        if self._counter is None:
            self._counter = get_counter()
        return self._counter

    @property
    def margin(self) -> int:
        """Tokens of ``max_prompt_tokens`` kept free because the counter estimates
        (:func:`~ctxkeep.tokens.estimate_margin`, read now: it follows the calibration); 0
        with an exact counter or no token limit.
        """
        if not self.max_prompt_tokens:
            return 0
        return estimate_margin(self.counter, self.max_prompt_tokens)

    def check_tokens(self, breakdown: Mapping[str, int], *, reserved: int = 0) -> None:
        """Refuse a prompt whose tokens, by section, are over the token limit less the margin.

        Args:
            breakdown: the prompt's tokens by role or section.
            reserved: tokens of ``breakdown`` set aside before a prompt budget, as the output
                reserve is (a chat client's tool definitions): the margin is kept on the limit
                less them, as :func:`~ctxkeep.builder.compose.prompt_budget` keeps it, so a
                prompt the builder made within its budget passes.

        Raises:
            PromptTooLongError: over it; with an estimating counter the margin is a section of
                the breakdown (``estimate_margin``) and counts in ``actual``, so ``excess``
                stays what must be cut.

        """
        if not self.max_prompt_tokens:
            return
        margin = estimate_margin(self.counter, self.max_prompt_tokens - reserved)
        if margin:
            breakdown = {**breakdown, "estimate_margin": margin}
        actual = sum(breakdown.values())
        if actual > self.max_prompt_tokens:
            raise PromptTooLongError(
                limit=self.max_prompt_tokens, actual=actual, unit="tokens", breakdown=breakdown
            )

    @overload
    def check(self, prompt: str) -> str: ...
    @overload
    def check(self, prompt: Iterable[Any]) -> list[Message]: ...

    def check(self, prompt: str | Iterable[Any]) -> str | list[Message]:
        """Pass ``prompt`` through if it is within limits.

        Args:
            prompt: a string, or messages (``Message`` objects or OpenAI dicts).

        Returns:
            The string unchanged, or the messages as ``Message`` objects.

        Raises:
            PromptTooLongError: over a limit; ``breakdown`` gives the size per role (and the
                ``estimate_margin`` kept when the counter estimates, see :attr:`margin`).
            InvalidMessageError: a malformed message.

        """
        if isinstance(prompt, str):
            self._check_text(prompt)
            return prompt
        msgs = coerce_messages(prompt)
        by_role: dict[str, int] = {}
        for m in msgs:
            by_role[m.role] = by_role.get(m.role, 0) + message_length(m)
        total = sum(by_role.values())
        if total > self.max_prompt_length:
            raise PromptTooLongError(
                limit=self.max_prompt_length, actual=total, unit="characters", breakdown=by_role
            )
        if self.max_prompt_tokens:
            counter = self.counter
            tokens: dict[str, int] = {}
            for m in msgs:
                tokens[m.role] = tokens.get(m.role, 0) + counter.count_message(m)
            tokens["reply_priming"] = counter.count_messages([])
            self.check_tokens(tokens)
        return msgs

    def _check_text(self, text: str) -> None:
        n = len(text)
        if n > self.max_prompt_length:
            raise PromptTooLongError(
                limit=self.max_prompt_length, actual=n, unit="characters", breakdown={"text": n}
            )
        if self.max_prompt_tokens:
            self.check_tokens({"text": self.counter.count_text(text)})

    def __repr__(self) -> str:
        return (
            f"PromptGate(max_prompt_length={self.max_prompt_length}, "
            f"max_prompt_tokens={self.max_prompt_tokens})"
        )

"""The context builder: one agent's prompt for this turn, from every layer, within the window.

:meth:`ContextBuilder.build` reads one session and composes, in this order::

    system prompt                    the caller's ``system`` (and any stored system messages)
    history before the newest user message      (pruned)
    ### Agent Context                the agent's fabric view: task-shared state + its own
                                     private layer (never another agent's), as fenced JSON
    ### Prior Historical Context     episodes recalled from episodic memory, fenced, labelled
    newest user message              (pinned by the pruner)
    history after it                 (pruned; a tool loop's calls and results)

and leaves ``reserve_output_tokens`` of the model's window (``max_prompt_tokens``) free for the
reply. Why this layout:

* **A stable prefix.** Providers discount a prompt prefix they have seen (Anthropic cache
  reads cost 0.1x, OpenAI cached input 0.5x). The system prompt and the old history come
  first and do not change between turns; the two sections that do (recall follows the newest
  user message, the fabric changes as agents write) sit right before the newest user message,
  so within a tool loop (same user message) the whole prompt up to the newest tool result
  repeats, and on a new user turn everything before the previous one does.
  :attr:`BuiltPrompt.context_at` says where the per-turn sections start (for a provider cache
  breakpoint).
* **Data, not instructions.** Both sections are ``user`` messages, never ``system``: recalled
  text and agent notes get no system authority, and Anthropic's top-level ``system`` (which
  :func:`~ctxkeep.to_anthropic` builds from every system message) stays the same every turn.
  Each starts with a header and a sentence saying it is reference data; its text is fenced
  with every line quoted (``| ``), so nothing inside can close the fence or forge a header
  (:func:`~ctxkeep.format_prior_context`). Each carries ``event_kind="context"`` and
  ``metadata["ctxkeep_section"]`` so a runtime can tell it apart and never stores it.
* **Valid sequences.** The sections go in front of a user message, which never sits inside a
  tool unit, so the output stays a valid provider sequence (the pruner keeps tool units whole).

The package: :mod:`~ctxkeep.builder.report` (:class:`BuiltPrompt`, :class:`BuildReport` and
the episode decisions), :mod:`~ctxkeep.builder.sections` (the fabric view and prior-context
sections, rendered within their budgets) and :mod:`~ctxkeep.builder.core`
(:class:`ContextBuilder`: the budgets, recall and the build steps).
"""

from ctxkeep.builder.config import DEFAULT_MAX_FABRIC_TOKENS as DEFAULT_MAX_FABRIC_TOKENS
from ctxkeep.builder.config import DEFAULT_MAX_PRIOR_TOKENS as DEFAULT_MAX_PRIOR_TOKENS
from ctxkeep.builder.config import DEFAULT_MAX_PROMPT_TOKENS as DEFAULT_MAX_PROMPT_TOKENS
from ctxkeep.builder.config import DEFAULT_RESERVE_OUTPUT_TOKENS as DEFAULT_RESERVE_OUTPUT_TOKENS
from ctxkeep.builder.config import SECTION_SHARE as SECTION_SHARE
from ctxkeep.builder.config import BuilderConfig
from ctxkeep.builder.config import RecallScope as RecallScope
from ctxkeep.builder.core import ContextBuilder
from ctxkeep.builder.report import SECTIONS, BuildReport, BuiltPrompt, EpisodeDecision
from ctxkeep.builder.report import EpisodeAction as EpisodeAction
from ctxkeep.builder.sections import FABRIC_HEADER as FABRIC_HEADER
from ctxkeep.builder.sections import FABRIC_PREAMBLE as FABRIC_PREAMBLE

__all__ = [
    "SECTIONS",
    "BuildReport",
    "BuilderConfig",
    "BuiltPrompt",
    "ContextBuilder",
    "EpisodeDecision",
]

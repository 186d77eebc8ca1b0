"""Evaluation of ctxkeep's parts on data: episodic recall on LoCoMo-format conversations.

:mod:`~ctxkeep.evaluation.locomo` reads LoCoMo-format files into episodes and questions;
:mod:`~ctxkeep.evaluation.recall` runs the questions through a real store and computes
recall@k (in-sample and cross-validated); :mod:`~ctxkeep.evaluation.vectors` caches an
embedder's vectors on disk between runs. ``ctxkeep eval recall FILE.json`` is the command.
"""

from __future__ import annotations

from ctxkeep.evaluation.locomo import CATEGORIES, Conversation, Question, load_locomo, parse_locomo
from ctxkeep.evaluation.recall import (
    KS,
    CrossValidated,
    QuestionResult,
    RecallTable,
    Run,
    cross_validate,
    evaluate,
    recall_at,
)

__all__ = [
    "CATEGORIES",
    "KS",
    "Conversation",
    "CrossValidated",
    "Question",
    "QuestionResult",
    "RecallTable",
    "Run",
    "cross_validate",
    "evaluate",
    "load_locomo",
    "parse_locomo",
    "recall_at",
]

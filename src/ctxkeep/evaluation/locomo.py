"""LoCoMo-format conversations as episodes and questions.

A LoCoMo-format file is a JSON list of records, each with a ``conversation`` (``speaker_a``,
``speaker_b``, ``session_N``: lists of turns ``{speaker, dia_id, text, blip_caption?}``,
``session_N_date_time``) and ``qa`` (``question``, ``evidence``: the ``dia_id`` of each turn
that answers it, ``category``). LoCoMo's categories are 1 multi-hop, 2 temporal, 3 open-domain,
4 single-hop, 5 adversarial; other numbers are kept as they are.

Every dialog turn becomes one episode, laid out as ``bench/locomo_recall.py`` always laid
them out (so figures stay comparable): session ``conv{i}:session_{n}``, task ``conv{i}``,
no goal, the summary ``"{speaker} ({session date}): {text}"`` (plus ``[shares an image of
{caption}]``), ``metadata={"dia_id": ...}``. Each episode's ``created_at`` is its session's
date where the date parses (LoCoMo writes ``"1:56 pm on 8 May, 2023"``), which is what lets
time expressions be resolved against it; the text is the same either way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ctxkeep.errors import ConfigError

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
"""LoCoMo's question categories."""


@dataclass(frozen=True, kw_only=True)
class Question:
    """One question of a conversation and the turns that answer it."""

    conversation: str
    """The id of its conversation (the ``task_id`` of the conversation's episodes)."""
    text: str
    """The question."""
    evidence: tuple[str, ...]
    """The ``dia_id`` of each turn that holds part of the answer (empty: none needed)."""
    category: int
    """Its category (LoCoMo: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,
    5 adversarial)."""


@dataclass(frozen=True, kw_only=True)
class Conversation:
    """One conversation: its turns as episodes, and its questions."""

    id: str
    """``conv{i}``, ``i`` its position in the file."""
    episodes: tuple[dict[str, Any], ...]
    """Items for :meth:`~ctxkeep.episodic.EpisodicMemoryStore.save_episodes`, sessions in
    order."""
    questions: tuple[Question, ...]
    """Its questions, in the file's order."""


_MONTHS = {
    m: i + 1
    for i, m in enumerate(
        [
            "january",
            "february",
            "march",
            "april",
            "may",
            "june",
            "july",
            "august",
            "september",
            "october",
            "november",
            "december",
        ]
    )
}
_LOCOMO_DATE = re.compile(
    r"(?:(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+)?(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.I
)


def parse_session_date(text: str) -> datetime | None:
    """The time a session date string names (UTC), or None if it does not parse.

    Takes LoCoMo's ``"1:56 pm on 8 May, 2023"`` (and ``"8 May 2023"``) and ISO 8601.
    """
    text = text.strip()
    m = _LOCOMO_DATE.search(text)
    if m:
        hour, minute, ampm, day, month, year = m.groups()
        mon = _MONTHS.get(month.lower()) or next(
            (v for k, v in _MONTHS.items() if len(month) >= 3 and k.startswith(month.lower())),
            None,
        )
        if mon is None:
            return None
        h = int(hour or 0) % 12 + (12 if (ampm or "").lower() == "pm" else 0)
        try:
            return datetime(int(year), mon, int(day), h, int(minute or 0), tzinfo=UTC)
        except ValueError:
            return None
    try:
        out = datetime.fromisoformat(text)
    except ValueError:
        return None
    return out if out.tzinfo else out.replace(tzinfo=UTC)


def turn_text(speaker: str, date: str, turn: dict[str, Any]) -> str:
    """A turn's episode text: ``"{speaker} ({date}): {text}"`` and its image caption."""
    text = f"{speaker} ({date}): {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares an image of {turn['blip_caption']}]"
    return text


def evidence_ids(qa: dict[str, Any]) -> list[str]:
    """A question's evidence ``dia_id`` values (some LoCoMo entries hold two: ``"D8:6; D9:17"``)."""
    out = []
    for ev in qa.get("evidence") or []:
        for part in str(ev).replace(",", ";").split(";"):
            if part.strip():
                out.append(part.strip())
    return out


def conversation_episodes(ci: int, conv: dict[str, Any]) -> list[dict[str, Any]]:
    """Every dialog turn of conversation ``ci`` as an episode, sessions in order.

    Raises:
        ConfigError: a turn without ``speaker``, ``dia_id`` or ``text``.

    """
    c = conv["conversation"]
    out = []
    n = 1
    while f"session_{n}" in c:
        date = str(c.get(f"session_{n}_date_time") or "")
        when = parse_session_date(date)
        turns = c[f"session_{n}"]
        if not isinstance(turns, list):
            raise ConfigError(f"conversation {ci}: session_{n} is not a list of turns")
        for j, turn in enumerate(turns):
            if not isinstance(turn, dict) or not {"speaker", "dia_id", "text"} <= turn.keys():
                raise ConfigError(
                    f"conversation {ci}, session_{n}, turn {j}: a turn needs speaker, dia_id "
                    "and text"
                )
            item: dict[str, Any] = {
                "session_id": f"conv{ci}:session_{n}",
                "task_id": f"conv{ci}",
                "task_goal": "",
                "summary": turn_text(str(turn["speaker"]), date, turn),
                "metadata": {"dia_id": str(turn["dia_id"])},
            }
            if when is not None:
                item["created_at"] = when
            out.append(item)
        n += 1
    return out


def parse_locomo(data: Any, name: str = "<data>") -> list[Conversation]:
    """The conversations of a parsed LoCoMo-format document.

    Raises:
        ConfigError: ``data`` is not a list of records with ``conversation`` and ``qa``, or a
            record is malformed (the message names which and what).

    """
    if isinstance(data, dict) and "conversation" in data:
        data = [data]
    if not isinstance(data, list) or not data:
        raise ConfigError(
            f"{name}: expected a JSON list of LoCoMo records (each with 'conversation' and 'qa')"
        )
    out = []
    for ci, rec in enumerate(data):
        if not isinstance(rec, dict) or not isinstance(rec.get("conversation"), dict):
            raise ConfigError(f"{name}: record {ci} has no 'conversation' object")
        qa = rec.get("qa") or []
        if not isinstance(qa, list):
            raise ConfigError(f"{name}: record {ci}: 'qa' must be a list")
        episodes = conversation_episodes(ci, rec)
        questions = []
        for qi, q in enumerate(qa):
            if not isinstance(q, dict) or not isinstance(q.get("question"), str):
                raise ConfigError(f"{name}: record {ci}, question {qi} has no 'question' text")
            try:
                category = int(q.get("category", 0))
            except (TypeError, ValueError):
                raise ConfigError(
                    f"{name}: record {ci}, question {qi}: category must be a number"
                ) from None
            questions.append(
                Question(
                    conversation=f"conv{ci}",
                    text=q["question"],
                    evidence=tuple(evidence_ids(q)),
                    category=category,
                )
            )
        out.append(
            Conversation(id=f"conv{ci}", episodes=tuple(episodes), questions=tuple(questions))
        )
    return out


def load_locomo(path: str | Path) -> list[Conversation]:
    """The conversations of a LoCoMo-format JSON file.

    Raises:
        ConfigError: the file is missing, not JSON, or not in LoCoMo's format.

    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such file: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p} is not JSON: {exc}") from exc
    return parse_locomo(data, p.name)

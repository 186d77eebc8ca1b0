"""Recall of an episodic store on LoCoMo-format conversations, in-sample and cross-validated.

The metric is LoCoMo's (its paper, Table 3): every dialog turn is an episode; each question
searches its own conversation's turns (a ``task_id`` filter) and takes the top k; recall@k is
the fraction of the question's evidence turns among them (a question without evidence counts
1.0), averaged over the questions, overall and per category.

:func:`evaluate` runs every question through a real store (``memory://`` or a fresh SQLite
file) once per retrieval configuration; configurations that differ only in search-time knobs
share one store, the others (:data:`~ctxkeep.episodic.base.INGEST_KNOBS`) get their own.

A figure measured on the data its knobs were chosen on flatters them. :func:`cross_validate`
says what the choice is worth on data it was not made on: it splits the questions into folds
(by conversation: leave one conversation out; or by category: leave one category out), picks
on the other folds the configuration with the best mean recall@10, and scores that
configuration on the held-out fold. The held-out scores of all folds, pooled, are the
cross-validated table.
"""

from __future__ import annotations

import dataclasses
import time
import typing
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ctxkeep.episodic import EpisodicMemoryStore, RetrievalConfig, open_episodic
from ctxkeep.episodic.base import INGEST_KNOBS
from ctxkeep.episodic.embedders import CachedEmbedder, Embedder, get_embedder
from ctxkeep.errors import ConfigError
from ctxkeep.evaluation.locomo import Conversation, Question

KS = (5, 10, 25, 50)
"""The cut-offs LoCoMo reports."""

Progress = Callable[[str, int, int], None]
"""Called as ``(phase, done, total)`` while a run goes: ``"ingest"`` counts episodes saved,
``"search"`` questions asked."""


@dataclass(frozen=True, kw_only=True)
class QuestionResult:
    """What the search found for one question."""

    question: Question
    """The question."""
    retrieved: tuple[str, ...]
    """The ``dia_id`` of each hit, best first (as many as the largest k)."""
    recall: tuple[float, ...]
    """Recall at each k of the run (0..1)."""


@dataclass(frozen=True, kw_only=True)
class RecallTable:
    """Mean recall in percent, overall and per category."""

    ks: tuple[int, ...]
    """The cut-offs."""
    overall: tuple[float, ...]
    """Recall@k over every question, per k."""
    per_category: dict[int, tuple[float, ...]]
    """Recall@k over each category's questions, per k."""
    counts: dict[int, int]
    """How many questions each category has."""

    @property
    def questions(self) -> int:
        """How many questions the table averages."""
        return sum(self.counts.values())

    def at(self, k: int, category: int | None = None) -> float:
        """Recall@``k`` overall, or of one category."""
        row = self.overall if category is None else self.per_category[category]
        return row[self.ks.index(k)]

    @classmethod
    def of(cls, results: Iterable[QuestionResult], ks: Sequence[int]) -> RecallTable:
        """The table of some question results (each with a recall per k of ``ks``)."""
        ks = tuple(ks)
        rows: dict[int, list[tuple[float, ...]]] = defaultdict(list)
        every: list[tuple[float, ...]] = []
        for r in results:
            rows[r.question.category].append(r.recall)
            every.append(r.recall)
        return cls(
            ks=ks,
            overall=_mean(every, len(ks)),
            per_category={c: _mean(v, len(ks)) for c, v in sorted(rows.items())},
            counts={c: len(v) for c, v in sorted(rows.items())},
        )


def _mean(rows: Sequence[tuple[float, ...]], n: int) -> tuple[float, ...]:
    if not rows:
        return (0.0,) * n
    return tuple(100.0 * sum(r[i] for r in rows) / len(rows) for i in range(n))


@dataclass(frozen=True, kw_only=True)
class Run:
    """One configuration's results on every question."""

    config: RetrievalConfig
    """The retrieval configuration searched with."""
    results: tuple[QuestionResult, ...]
    """Per question, in the conversations' order."""
    table: RecallTable
    """Their recall."""
    search_ms: float
    """Mean milliseconds per search."""
    ingest_s: float
    """Seconds to save every episode into the store this run searched (embedding included
    unless the vectors were cached)."""


def recall_at(
    retrieved: Sequence[str], evidence: Sequence[str], ks: Sequence[int]
) -> tuple[float, ...]:
    """The fraction of ``evidence`` among the first k of ``retrieved``, for each k (1.0 for
    every k when there is no evidence).
    """
    if not evidence:
        return (1.0,) * len(ks)
    out = []
    for k in ks:
        top = set(retrieved[:k])
        out.append(sum(1 for e in evidence if e in top) / len(evidence))
    return tuple(out)


def check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """``ks`` sorted and distinct.

    Raises:
        ConfigError: no k, or a k below 1.

    """
    out = tuple(sorted(set(ks)))
    if not out or out[0] < 1:
        raise ConfigError(f"recall cut-offs must be integers >= 1, got {list(ks)}")
    return out


def ingest_key(config: RetrievalConfig) -> tuple[Any, ...]:
    """What of ``config`` is baked into a store's indexes when episodes are saved."""
    return tuple(getattr(config, k) for k in INGEST_KNOBS)


def _open_store(
    url: str, group: int, embedder: Embedder, config: RetrievalConfig
) -> EpisodicMemoryStore:
    if url == "memory://":
        return open_episodic(url, embedder, config=config)
    if not url.startswith("sqlite:///"):
        raise ConfigError(f"evaluation stores are memory:// or sqlite:///path, got {url!r}")
    path = Path(url[len("sqlite:///") :])
    if group:
        path = path.with_name(f"{path.stem}.{group + 1}{path.suffix}")
    if path.exists():
        raise ConfigError(
            f"{path} exists; an evaluation fills a new store: remove it or name another file"
        )
    return open_episodic(f"sqlite:///{path}", embedder, config=config)


def evaluate(
    conversations: Sequence[Conversation],
    *,
    embedder: str | Embedder = "local",
    configs: Sequence[RetrievalConfig] | None = None,
    url: str = "memory://",
    ks: Sequence[int] = KS,
    on_progress: Progress | None = None,
) -> list[Run]:
    """Every question of ``conversations`` searched with each configuration of ``configs``.

    Args:
        conversations: from :func:`~ctxkeep.evaluation.locomo.load_locomo`.
        embedder: a name or an :class:`~ctxkeep.episodic.Embedder` (wrapped in an in-process
            cache, so the configurations embed each text once).
        configs: retrieval configurations (default: the library's default only).
        url: ``memory://`` or ``sqlite:///path`` (a new file; a second store, for a second
            set of ingest knobs, goes beside it as ``path.2.db`` and so on).
        ks: recall cut-offs.
        on_progress: told how far ingestion and searching have got.

    Returns:
        One :class:`Run` per configuration, in order.

    Raises:
        ConfigError: a bad URL or k, or a store file that already exists.

    """
    ks = check_ks(ks)
    configs = list(configs) if configs is not None else [RetrievalConfig()]
    emb = get_embedder(embedder)
    if not isinstance(emb, CachedEmbedder):
        emb = CachedEmbedder(emb, max_entries=1_000_000)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, cfg in enumerate(configs):
        groups.setdefault(ingest_key(cfg), []).append(i)
    n_eps = sum(len(c.episodes) for c in conversations)
    n_q = sum(len(c.questions) for c in conversations)
    runs: dict[int, Run] = {}
    searched = 0
    for g, members in enumerate(groups.values()):
        store = _open_store(url, g, emb, configs[members[0]])
        try:
            t0 = time.perf_counter()
            done = 0
            for conv in conversations:
                store.save_episodes(conv.episodes)
                done += len(conv.episodes)
                if on_progress:
                    on_progress("ingest", done + g * n_eps, n_eps * len(groups))
            ingest_s = time.perf_counter() - t0
            for i in members:
                store.config = configs[i]
                results, ms = _ask(
                    store, conversations, ks, on_progress, searched, n_q * len(configs)
                )
                searched += n_q
                runs[i] = Run(
                    config=configs[i],
                    results=tuple(results),
                    table=RecallTable.of(results, ks),
                    search_ms=ms,
                    ingest_s=ingest_s,
                )
        finally:
            store.close()
    return [runs[i] for i in range(len(configs))]


def _ask(
    store: EpisodicMemoryStore,
    conversations: Sequence[Conversation],
    ks: tuple[int, ...],
    on_progress: Progress | None,
    before: int,
    total: int,
) -> tuple[list[QuestionResult], float]:
    """Every question searched in ``store``; the results and the mean ms per search."""
    out = []
    spent = 0.0
    n = 0
    for conv in conversations:
        for q in conv.questions:
            t = time.perf_counter()
            hits = store.search(q.text, max(ks), filters={"task_id": q.conversation})
            spent += time.perf_counter() - t
            got = tuple(str(h.episode.metadata.get("dia_id", "")) for h in hits)
            out.append(
                QuestionResult(question=q, retrieved=got, recall=recall_at(got, q.evidence, ks))
            )
            n += 1
            if on_progress and (n % 25 == 0 or n == total - before):
                on_progress("search", before + n, total)
    if on_progress:
        on_progress("search", before + n, total)
    return out, 1000 * spent / max(n, 1)


# -- cross-validation -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CrossValidated:
    """Held-out recall of a choice among configurations."""

    by: Literal["conversation", "category"]
    """What the folds are."""
    table: RecallTable
    """Recall of each fold's questions under the configuration chosen without them."""
    chosen: dict[str, int]
    """Per fold, the index of the configuration chosen on the other folds."""
    select_k: int
    """The recall@k the choice maximised."""


def cross_validate(
    runs: Sequence[Run],
    *,
    by: Literal["conversation", "category"] = "conversation",
    select_k: int = 10,
) -> CrossValidated:
    """Leave-one-fold-out cross-validation of choosing among ``runs``.

    For each fold (a conversation, or a category), the configuration with the best mean
    recall@``select_k`` over the questions of the other folds (ties: the earliest) scores the
    fold's own questions.

    Raises:
        ConfigError: no runs, runs of different questions, or ``select_k`` not among their ks.

    """
    if not runs:
        raise ConfigError("cross-validation needs at least one run")
    ks = runs[0].table.ks
    if select_k not in ks:
        raise ConfigError(f"select_k {select_k} is not among the run's ks {list(ks)}")
    n = len(runs[0].results)
    if any(len(r.results) != n or r.table.ks != ks for r in runs):
        raise ConfigError("cross-validation needs runs over the same questions and ks")
    j = ks.index(select_k)
    first = runs[0].results

    def fold_of(r: QuestionResult) -> str:
        return r.question.conversation if by == "conversation" else str(r.question.category)

    folds = sorted({fold_of(r) for r in first}, key=_natural)
    idx: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(first):
        idx[fold_of(r)].append(i)
    totals = [[0.0] * len(folds) for _ in runs]  # per run, per fold: sum of recall@select_k
    for ri, run in enumerate(runs):
        for fi, f in enumerate(folds):
            totals[ri][fi] = sum(run.results[i].recall[j] for i in idx[f])
    held: list[QuestionResult] = []
    chosen: dict[str, int] = {}
    n_train = {f: n - len(idx[f]) for f in folds}
    for fi, f in enumerate(folds):
        means = [(sum(t) - t[fi]) / max(n_train[f], 1) for t in totals]
        best = max(range(len(runs)), key=lambda ri: (means[ri], -ri))
        chosen[f] = best
        held.extend(runs[best].results[i] for i in idx[f])
    return CrossValidated(by=by, table=RecallTable.of(held, ks), chosen=chosen, select_k=select_k)


def _natural(s: str) -> tuple[Any, ...]:
    """Sort key putting ``conv2`` before ``conv10``."""
    digits = "".join(ch for ch in s if ch.isdigit())
    return (s.rstrip("0123456789"), int(digits) if digits else -1, s)


# -- configurations from the command line -----------------------------------------------------


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(RetrievalConfig)


def parse_value(knob: str, text: str) -> Any:
    """The value of ``knob`` (a :class:`~ctxkeep.episodic.RetrievalConfig` field) that
    ``text`` writes: a number, ``true``/``false``, ``none``, or numbers joined by commas for a
    tuple.

    Raises:
        ConfigError: an unknown knob or a value of the wrong kind.

    """
    types = _field_types()
    if knob not in types:
        raise ConfigError(f"unknown retrieval knob {knob!r}; knobs: {', '.join(sorted(types))}")
    t = types[knob]
    args = typing.get_args(t)
    raw = text.strip()
    try:
        if type(None) in args and raw.lower() in ("none", "null", ""):
            return None
        base = next((a for a in args if a is not type(None)), t) if args and t is not tuple else t
        origin = typing.get_origin(t) or typing.get_origin(base)
        if origin is tuple:
            parts = [p for p in raw.split(",") if p.strip()]
            want = [a for a in typing.get_args(base if typing.get_origin(base) is tuple else t)]
            if len(want) != len(parts):
                raise ValueError(f"{len(want)} comma-separated numbers")
            return tuple(w(p) for w, p in zip(want, parts, strict=True))
        if base is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError("true or false")
        if base is int:
            return int(raw)
        if base is float:
            return float(raw)
        if base is str:
            return raw
    except ValueError as exc:
        raise ConfigError(f"bad value {text!r} for {knob}: {exc}") from None
    raise ConfigError(f"{knob} cannot be set from the command line")  # pragma: no cover


def _split(item: str) -> tuple[str, str]:
    knob, eq, value = item.partition("=")
    if not eq or not knob.strip():
        raise ConfigError(f"expected knob=value, got {item!r}")
    return knob.strip(), value


def config_with(base: RetrievalConfig, items: Sequence[str]) -> RetrievalConfig:
    """``base`` with each ``knob=value`` of ``items`` set.

    Raises:
        ConfigError: a malformed item, unknown knob or bad value (or a config the store
            refuses).

    """
    changes = {}
    for item in items:
        knob, value = _split(item)
        changes[knob] = parse_value(knob, value)
    return dataclasses.replace(base, **changes)


def config_grid(base: RetrievalConfig, items: Sequence[str]) -> list[RetrievalConfig]:
    """Every combination of the values ``items`` give (``knob=v1/v2/v3`` each), the other
    knobs as in ``base``; ``base`` itself first.

    Raises:
        ConfigError: a malformed item, unknown knob or bad value.

    """
    axes: dict[str, list[Any]] = {}
    for item in items:
        knob, values = _split(item)
        axes[knob] = [parse_value(knob, v) for v in values.split("/")]
    out = [base]
    for combo in _product(axes):
        cfg = dataclasses.replace(base, **combo)
        if cfg not in out:
            out.append(cfg)
    return out


def _product(axes: Mapping[str, list[Any]]) -> Iterable[dict[str, Any]]:
    combos: list[dict[str, Any]] = [{}]
    for knob, values in axes.items():
        combos = [{**c, knob: v} for c in combos for v in values]
    return combos

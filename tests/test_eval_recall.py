"""``ctxkeep eval recall`` and :mod:`ctxkeep.evaluation`: LoCoMo-format recall, hand-checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from _cli import assert_one_line_error, run_script
from ctxkeep.cli import main
from ctxkeep.episodic import RetrievalConfig
from ctxkeep.errors import ConfigError
from ctxkeep.evaluation import (
    Question,
    QuestionResult,
    RecallTable,
    cross_validate,
    evaluate,
    load_locomo,
    parse_locomo,
    recall_at,
)
from ctxkeep.evaluation.recall import Run, config_grid, config_with
from ctxkeep.evaluation.vectors import DiskCachedEmbedder

# Two conversations whose turns share no words across topics, so each question's words point
# at its turns only. With window=0 and no smoothing, a turn scores only on its own words.
DATA: list[dict[str, Any]] = [
    {
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a puppy named Biscuit"},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "My sister plays the violin"},
                {"speaker": "Ann", "dia_id": "D1:3", "text": "We went kayaking on the lake"},
            ],
            "session_2_date_time": "10:04 am on 19 June, 2023",
            "session_2": [
                {"speaker": "Bo", "dia_id": "D2:1", "text": "Gardening tomatoes keeps me calm"},
                {"speaker": "Ann", "dia_id": "D2:2", "text": "That violin recital was lovely"},
            ],
        },
        "qa": [
            # the puppy: D1:1 first -> 1 at k=1
            {"question": "What is the puppy called?", "evidence": ["D1:1"], "category": 4},
            # two evidence turns, both about the violin: half at k=1, all at k=2
            {
                "question": "Which violin recital?",
                "evidence": ["D1:2; D2:2"],
                "category": 1,
            },
            # no evidence: counts 1
            {"question": "Anything else?", "evidence": [], "category": 5},
            # evidence that is no turn: counts 0
            {"question": "Kayaking where?", "evidence": ["D9:9"], "category": 3},
        ],
    },
    {
        "conversation": {
            "speaker_a": "Cy",
            "speaker_b": "Di",
            "session_1_date_time": "2023-07-01T09:00:00",
            "session_1": [
                {"speaker": "Cy", "dia_id": "D1:1", "text": "Our puppy Biscuit loves snow"},
                {"speaker": "Di", "dia_id": "D1:2", "text": "Chess club meets Tuesdays"},
            ],
        },
        # both conversations have a D1:1 about a puppy; the task filter keeps them apart
        "qa": [{"question": "When does the chess club meet?", "evidence": ["D1:2"], "category": 4}],
    },
]

EXACT = RetrievalConfig(window=0, smooth=(0.0, 0.0))
# R@1 per question: 1, 0.5, 1, 0, 1 -> overall 3.5 / 5 = 70.0; R@2: 1, 1, 1, 0, 1 -> 80.0
R1, R2 = 70.0, 80.0


@pytest.fixture
def locomo_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(DATA))
    return path


def test_recall_at_is_the_share_of_evidence_in_the_top_k() -> None:
    assert recall_at(["a", "b", "c"], ["c", "a"], [1, 2, 3]) == (0.5, 0.5, 1.0)
    assert recall_at(["a"], [], [1, 5]) == (1.0, 1.0)
    assert recall_at([], ["x"], [10]) == (0.0,)


def test_load_lays_out_turns_as_the_bench_does(locomo_file: Path) -> None:
    convs = load_locomo(locomo_file)
    assert [c.id for c in convs] == ["conv0", "conv1"]
    first = convs[0].episodes[0]
    assert first["summary"] == "Ann (1:56 pm on 8 May, 2023): I adopted a puppy named Biscuit"
    assert first["session_id"] == "conv0:session_1"
    assert first["task_id"] == "conv0"
    assert first["metadata"] == {"dia_id": "D1:1"}
    assert first["created_at"].isoformat() == "2023-05-08T13:56:00+00:00"
    assert convs[0].episodes[3]["created_at"].isoformat() == "2023-06-19T10:04:00+00:00"
    assert convs[0].questions[1].evidence == ("D1:2", "D2:2")  # "a; b" split
    assert convs[1].episodes[0]["created_at"].isoformat() == "2023-07-01T09:00:00+00:00"


def test_evaluate_matches_the_hand_computed_recall(locomo_file: Path) -> None:
    (run,) = evaluate(load_locomo(locomo_file), embedder="hash", configs=[EXACT], ks=[1, 2])
    assert [r.recall for r in run.results] == [
        (1.0, 1.0),
        (0.5, 1.0),
        (1.0, 1.0),
        (0.0, 0.0),
        (1.0, 1.0),
    ]
    assert run.table.overall == pytest.approx((R1, R2))
    assert run.table.per_category[1] == pytest.approx((50.0, 100.0))
    assert run.table.per_category[4] == pytest.approx((100.0, 100.0))
    assert run.table.counts == {1: 1, 3: 1, 4: 2, 5: 1}
    assert run.results[0].retrieved[0] == "D1:1"


def test_a_sqlite_store_gives_the_same_recall(locomo_file: Path, tmp_path: Path) -> None:
    convs = load_locomo(locomo_file)
    (mem,) = evaluate(convs, embedder="hash", configs=[EXACT], ks=[1, 2])
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    (sql,) = evaluate(convs, embedder="hash", configs=[EXACT], ks=[1, 2], url=url)
    assert [r.retrieved for r in sql.results] == [r.retrieved for r in mem.results]
    with pytest.raises(ConfigError, match="exists"):
        evaluate(convs, embedder="hash", configs=[EXACT], ks=[1, 2], url=url)


def test_configs_sharing_ingest_knobs_share_a_store_and_others_get_their_own(
    locomo_file: Path,
) -> None:
    convs = load_locomo(locomo_file)
    configs = config_grid(EXACT, ["dense_weight=0/1", "window=0/1"])
    assert len(configs) == 4
    seen: list[tuple[str, int, int]] = []
    runs = evaluate(
        convs,
        embedder="hash",
        configs=configs,
        ks=[1, 2],
        on_progress=lambda phase, done, total: seen.append((phase, done, total)),
    )
    assert [r.config for r in runs] == configs
    ingest = [s for s in seen if s[0] == "ingest"]
    assert ingest[-1] == ("ingest", 14, 14)  # 7 turns, two stores (window 0 and 1)
    assert seen[-1] == ("search", 20, 20)  # 5 questions, four configurations


def _result(conv: str, cat: int, r: float) -> QuestionResult:
    q = Question(conversation=conv, text="q", evidence=("x",), category=cat)
    return QuestionResult(question=q, retrieved=(), recall=(r,))


def _run(recalls: list[tuple[str, int, float]]) -> Run:
    results = tuple(_result(*x) for x in recalls)
    return Run(
        config=RetrievalConfig(),
        results=results,
        table=RecallTable.of(results, [10]),
        search_ms=0.0,
        ingest_s=0.0,
    )


def test_cross_validation_scores_each_fold_with_the_choice_made_without_it() -> None:
    # run A is best on conv0 and conv1, run B on conv2, by a wide margin
    a = _run([("conv0", 1, 1.0), ("conv1", 1, 1.0), ("conv2", 2, 0.0)])
    b = _run([("conv0", 1, 0.0), ("conv1", 1, 0.4), ("conv2", 2, 1.0)])
    cv = cross_validate([a, b], by="conversation")
    # leaving out conv0: A 0.5 vs B 0.7 on the rest -> B; conv1: A 0.5 vs B 0.5 -> A (first);
    # conv2: A 1.0 vs B 0.2 -> A. Held out: B on conv0 (0), A on conv1 (1), A on conv2 (0).
    assert cv.chosen == {"conv0": 1, "conv1": 0, "conv2": 0}
    assert cv.table.overall == pytest.approx((100 / 3,))
    by_cat = cross_validate([a, b], by="category")
    # leaving out category 1: B wins on category 2 -> B scores 0.0 and 0.4; category 2: A
    assert by_cat.chosen == {"1": 1, "2": 0}
    assert by_cat.table.overall == pytest.approx((100 * 0.4 / 3,))


def test_knobs_parse_from_text() -> None:
    cfg = config_with(RetrievalConfig(), ["window=1", "smooth=0.2,0.1", "recency_half_life=none"])
    assert (cfg.window, cfg.smooth, cfg.recency_half_life) == (1, (0.2, 0.1), None)
    for bad, match in [
        ("nope=1", "unknown retrieval knob"),
        ("window=x", "bad value"),
        ("smooth=1", "2 comma-separated"),
        ("window", "knob=value"),
    ]:
        with pytest.raises(ConfigError, match=match):
            config_with(RetrievalConfig(), [bad])


def test_bad_files_are_refused_with_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_locomo(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not JSON"):
        load_locomo(tmp_path / "x.json")
    with pytest.raises(ConfigError, match="list of LoCoMo records"):
        parse_locomo({"qa": []})
    bad_turn = {"conversation": {"session_1": [{"speaker": "A", "text": "hi"}]}, "qa": []}
    with pytest.raises(ConfigError, match="needs speaker, dia_id and text"):
        parse_locomo([bad_turn])


def test_the_disk_cache_embeds_each_text_once(tmp_path: Path) -> None:
    from ctxkeep.episodic import HashEmbedder

    path = tmp_path / "v.npz"
    cache = DiskCachedEmbedder(HashEmbedder(), path)
    first = cache.embed_documents(["a b", "c d"])
    cache.embed_query("a")
    assert cache.computed == 3
    cache.save()
    again = DiskCachedEmbedder(HashEmbedder(), path)
    assert (again.embed_documents(["a b", "c d"]) == first).all()
    again.embed_query("a")
    assert again.computed == 0


def test_cli_prints_the_table_and_writes_json(
    locomo_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    args = ["eval", "recall", str(locomo_file), "--embedder", "hash", "--k", "1,2"]
    args += ["--config", "window=0", "--config", "smooth=0,0", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "R@1" in printed and "multi-hop R@1" in printed
    assert f"{R1:.1f}" in printed and f"{R2:.1f}" in printed
    data = json.loads(out.read_text())
    assert data["runs"][0]["table"]["overall"] == pytest.approx({"R@1": R1, "R@2": R2})
    assert data["runs"][0]["config"]["window"] == 0


def test_cli_cross_validates_a_grid(
    locomo_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cv.json"
    args = ["eval", "recall", str(locomo_file), "--embedder", "hash", "--k", "1,10"]
    args += ["--cv", "--grid", "dense_weight=0/1", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "cross-validated by conversation" in printed
    assert "cross-validated by category" in printed
    data = json.loads(out.read_text())
    assert len(data["runs"]) == 2  # the default, then dense_weight=0
    assert {cv["by"] for cv in data["cross_validated"]} == {"conversation", "category"}


def test_cli_errors_are_one_line(locomo_file: Path, tmp_path: Path) -> None:
    res = run_script("eval", "recall", str(locomo_file), "--embedder", "hash", "--config", "x=1")
    assert res.returncode == 2
    assert_one_line_error(res.stderr, "unknown retrieval knob 'x'")
    res = run_script("eval", "recall", str(tmp_path / "none.json"), "--embedder", "hash")
    assert res.returncode == 2
    assert_one_line_error(res.stderr, "no such file")

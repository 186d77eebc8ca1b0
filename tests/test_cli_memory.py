"""``ctxkeep memory``: adding refuses bad input, search shows only relevant hits, forget by prefix.

Every test runs the real CLI against a SQLite file with the hashing embedder (instant,
offline); the store itself is tested in test_episodic*.py.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from _cli import assert_one_line_error, run_script
from ctxkeep.cli import main
from ctxkeep.episodic import open_episodic

EPISODES = {
    "ci": "The flaky CI test was a timezone bug in the date parser.",
    "deploy": "The deploy failed because the timezone of the server was UTC+2.",
    "lunch": "Lunch was pasta with tomato sauce.",
    "music": "We listened to jazz records all evening.",
    "garden": "The roses in the garden need water every morning.",
}


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'memory.db'}"


@pytest.fixture
def stored(db: str) -> dict[str, str]:
    """EPISODES saved in ``db``, each in its own session; name -> episode id."""
    with open_episodic(db, embedder="hash") as store:
        return {name: store.save_episode(name, "", text) for name, text in EPISODES.items()}


def count(db: str) -> int:
    with open_episodic(db, embedder="hash") as store:
        return store.count()


def memory(db: str, action: str, *args: str) -> int:
    return main(["memory", action, "--db", db, "--embedder", "hash", *args])


def search_json(db: str, capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert memory(db, "search", *args, "--json") == 0
    hits: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return hits


# -- add ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   ", "\n\t \n"])
def test_add_refuses_an_empty_or_blank_episode(
    text: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "add", "--session", "s1", text) == 2
    assert_one_line_error(capsys.readouterr().err, "nothing to remember")
    assert count(db) == 0


def test_add_refuses_a_blank_standard_input(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(" \n"))
    assert memory(db, "add", "--session", "s1", "-") == 2
    assert_one_line_error(capsys.readouterr().err, "standard input is empty")
    assert count(db) == 0


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ("[1]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ("null", "must be a JSON object"),
        ("{not json", "not JSON"),
        ('{"x": NaN}', "not JSON"),
    ],
)
def test_add_refuses_metadata_that_is_not_a_json_object(
    meta: str, says: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "add", "--session", "s1", "--meta", meta, "some text") == 2
    assert_one_line_error(capsys.readouterr().err, "--meta", says)
    assert count(db) == 0


def test_add_with_list_metadata_exits_2_with_one_line_and_no_traceback(db: str) -> None:
    result = run_script("memory", "add", "--db", db, "--embedder", "hash", "--session", "s1",
                        "--meta", "[1]", "hello")  # fmt: skip
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "--meta must be a JSON object")


def test_add_stores_a_json_object_as_metadata(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert memory(db, "add", "--session", "s1", "--meta", '{"lang": "en"}', "hello", "--json") == 0
    eid = json.loads(capsys.readouterr().out)["episode_id"]
    with open_episodic(db, embedder="hash") as store:
        assert store.get(eid).metadata == {"lang": "en"}


# -- search -------------------------------------------------------------------------------------


def test_search_for_something_no_episode_mentions_finds_nothing(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert search_json(db, capsys, "quantum chromodynamics") == []


def test_search_puts_nothing_in_the_prompt_when_nothing_is_relevant(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "search", "quantum chromodynamics", "--format", "prompt") == 0
    assert capsys.readouterr().out == ""


def test_search_shows_only_episodes_that_share_a_word_with_the_query(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    hits = search_json(db, capsys, "timezone", "--top-k", "5")
    assert {h["episode_id"] for h in hits} == {stored["ci"], stored["deploy"]}


def test_search_never_shows_a_hit_below_the_average_score_by_default(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    ranked = search_json(db, capsys, "timezone bug", "--all")
    assert any(h["score"] < 0 for h in ranked)
    shown = search_json(db, capsys, "timezone bug")
    assert shown and all(h["score"] >= 0 for h in shown)


def test_search_min_score_sets_the_cut_off(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = search_json(db, capsys, "timezone bug")[:2]
    between = (first["score"] + second["score"]) / 2
    hits = search_json(db, capsys, "timezone bug", "--min-score", f"{between}")
    assert [h["episode_id"] for h in hits] == [first["episode_id"]]


def test_search_prompt_holds_only_the_relevant_hits(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "search", "timezone", "--format", "prompt") == 0
    prompt = capsys.readouterr().out
    assert prompt.startswith("### Prior Historical Context")
    assert prompt.count("<recalled-memory ") == 2
    assert "pasta" not in prompt and "roses" not in prompt


def test_search_all_shows_the_top_k_as_ranked(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    hits = search_json(db, capsys, "quantum chromodynamics", "--all", "--top-k", "3")
    assert len(hits) == 3


def test_search_all_does_not_title_unrelated_hits_relevant(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "search", "timezone", "--all", "--top-k", "5") == 0
    out = capsys.readouterr().out
    assert "relevant episode(s)" not in out
    assert "top 5 episode(s) for 'timezone', 2 of them relevant" in out
    rows = {line.split("│")[5].strip(): line.split("│")[2].strip() for line in out.splitlines()
            if line.startswith("│")}  # fmt: skip
    assert rows[EPISODES["ci"]] == "yes" and rows[EPISODES["lunch"]] == "no"
    hits = search_json(db, capsys, "timezone", "--all", "--top-k", "5")
    assert sorted(h["relevant"] for h in hits) == [False, False, False, True, True]


def test_search_cuts_long_text_at_a_word_boundary(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    words = "the flaky timezone test " + " ".join(f"word{i:03d}" for i in range(60))
    with open_episodic(db, embedder="hash") as store:
        store.save_episode("s1", "", words)
    assert memory(db, "search", "timezone") == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│")]
    shown = row.split("│")[4].strip()
    assert shown.endswith("…") and len(shown) <= 100
    assert shown[:-1].split()[-1] in words.split()  # whole words only


def test_preview_keeps_short_text_and_cuts_long_words() -> None:
    from ctxkeep.cli.memory import preview

    assert preview("short\ntext") == "short text"
    assert preview("x" * 150, 20) == "x" * 19 + "…"
    assert preview("alpha beta gamma delta", 15) == "alpha beta…"


def test_search_table_says_how_many_hits_it_hid(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "search", "timezone") == 0
    out, err = capsys.readouterr()
    assert "2 relevant episode(s)" in out and "pasta" not in out
    assert "3 less relevant hit(s) not shown" in err


def test_search_help_documents_the_relevance_cut_off(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["memory", "search", "--help"])
    out = capsys.readouterr().out
    assert "--min-score" in out and "--all" in out and "ctxkeep memory search" in out


# -- forget -------------------------------------------------------------------------------------


def test_forget_accepts_the_12_character_prefix_search_shows(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "forget", "--id", stored["lunch"][:12]) == 0
    assert capsys.readouterr().out.strip() == "forgot 1 episode(s)"
    with open_episodic(db, embedder="hash") as store:
        assert store.count() == len(EPISODES) - 1
        assert store.count({"episode_id": stored["lunch"]}) == 0


def test_forget_accepts_a_full_id(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "forget", "--id", stored["music"], "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"forgotten": 1}


def test_forget_with_an_unknown_id_exits_2_and_forgets_nothing(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    unknown = next(
        p for p in ("0000", "ffff", "1234") if not any(i.startswith(p) for i in stored.values())
    )
    assert memory(db, "forget", "--id", unknown) == 2
    assert_one_line_error(capsys.readouterr().err, f"no episode id starts with {unknown!r}")
    assert count(db) == len(EPISODES)


def test_forget_with_an_ambiguous_prefix_exits_2_and_forgets_nothing(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 2,000 random ids share a 4-character prefix somewhere (chance they do not: e**-30).
    with open_episodic(db, embedder="hash") as store:
        ids = store.save_episodes(
            {"session_id": "s", "task_goal": "", "summary": f"note {i}"} for i in range(2000)
        )
    by_prefix: defaultdict[str, list[str]] = defaultdict(list)
    for i in ids:
        by_prefix[i[:4]].append(i)
    prefix = next(p for p, same in by_prefix.items() if len(same) > 1)
    assert memory(db, "forget", "--id", prefix) == 2
    assert_one_line_error(
        capsys.readouterr().err, f"--id {prefix!r} is ambiguous", "more characters"
    )
    assert count(db) == 2000


def test_forget_refuses_a_prefix_shorter_than_4_characters(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "forget", "--id", stored["ci"][:3]) == 2
    assert_one_line_error(capsys.readouterr().err, "too short")
    assert count(db) == len(EPISODES)


def test_forget_by_prefix_looks_only_in_the_session_given(
    db: str, stored: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert memory(db, "forget", "--id", stored["ci"][:12], "--session", "deploy") == 2
    assert_one_line_error(capsys.readouterr().err, "in session 'deploy'")
    assert count(db) == len(EPISODES)


def test_forget_unknown_prefix_exits_nonzero_through_the_console_script(
    db: str, stored: dict[str, str]
) -> None:
    unknown = next(
        p for p in ("0000", "ffff", "1234") if not any(i.startswith(p) for i in stored.values())
    )
    result = run_script("memory", "forget", "--db", db, "--embedder", "hash", "--id", unknown)
    assert result.returncode == 2
    assert_one_line_error(result.stderr, "no episode id starts with")

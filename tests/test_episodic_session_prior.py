"""The session prior: a turn in the session holding the query's best match outranks an equal
match in an unrelated session (``RetrievalConfig.session_weight``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ctxkeep.episodic import RetrievalConfig, open_episodic
from ctxkeep.episodic.base import session_labels, session_prior

# lexical only, own words only: every score is hand-predictable
LEXICAL = RetrievalConfig(window=0, dense_weight=0.0, smooth=(0.0, 0.0))


def test_session_labels_follow_previous_neighbour_links() -> None:
    # two sessions: positions 0-2 (0 <- 1 <- 2) and 3-4 (3 <- 4); 5 stands alone
    prev = np.array([0, 0, 1, 3, 3, 5])
    assert session_labels(prev).tolist() == [0, 0, 0, 3, 3, 5]


def test_session_prior_is_the_z_score_of_each_session_best() -> None:
    total = np.array([1.0, 5.0, 0.0, 2.0, 2.0, 0.5])
    labels = np.array([0, 0, 0, 3, 3, 5])
    best = np.array([5.0, 2.0, 0.5])  # per session
    z = (best - best.mean()) / best.std()
    assert session_prior(total, labels) == pytest.approx(z[[0, 0, 0, 1, 1, 2]])


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_an_equal_match_ranks_higher_in_the_session_of_the_best_match(
    url: str, tmp_path: Path
) -> None:
    store_url = url if url == "memory://" else f"sqlite:///{tmp_path}/prior.db"
    store = open_episodic(store_url, "hash", config=LEXICAL)
    # saved first, so it wins ties: "the lake was cold" scores exactly as "we talked about
    # the lake" (one query word in two), but only the second shares its session with the
    # kayak turn, the query's best match
    store.save_episodes(
        [
            {"session_id": "b", "task_goal": "", "summary": s}
            for s in ("the lake was cold", "filler words here", "more filler words")
        ]
    )
    store.save_episodes(
        [
            {"session_id": "a", "task_goal": "", "summary": s}
            for s in ("we talked about the lake", "kayak rental prices", "other filler words")
        ]
    )
    store.config = replace(LEXICAL, session_weight=0.0)
    order = [h.episode.summary for h in store.search("lake kayak", 3)]
    assert order[0] == "kayak rental prices"
    assert order[1:] == ["the lake was cold", "we talked about the lake"]  # a tie: row order
    store.config = replace(LEXICAL, session_weight=0.75)
    order = [h.episode.summary for h in store.search("lake kayak", 3)]
    assert order == ["kayak rental prices", "we talked about the lake", "the lake was cold"]
    store.close()


def test_the_default_uses_the_session_prior() -> None:
    assert RetrievalConfig().session_weight == 0.75

"""The episodic conformance suite: :class:`EpisodicContract`."""

from __future__ import annotations

from typing import Any

import pytest

from ctxkeep.episodic import (
    RetrievalConfig,
    format_prior_context,
    open_episodic,
    parse_prior_context,
)
from ctxkeep.errors import (
    ConfigError,
    InvalidMessageError,
)

EPISODE_FACTS = [
    "Caroline went to an LGBTQ support group on 7 May 2023",
    "Melanie painted a sunrise over the lake last year",
    "Caroline is researching adoption agencies",
    "Melanie ran a charity race for mental health",
    "The team fixed the invoice rounding bug by rounding once per invoice",
]


class EpisodicContract:
    """Behaviours every :class:`~ctxkeep.episodic.EpisodicMemoryStore` must show.

    Provide a ``store`` fixture yielding a fresh, empty store with the ``hash`` embedder.
    """

    @pytest.fixture
    def store(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @staticmethod
    def _fill(store: Any) -> list[str]:
        return [
            store.save_episode(
                f"s{i % 2}", "", text, agent_id=f"agent{i % 2}", task_id="t", metadata={"i": i}
            )
            for i, text in enumerate(EPISODE_FACTS)
        ]

    def test_search_finds_by_words(self, store: Any) -> None:
        self._fill(store)
        hits = store.search("what did Melanie paint?", top_k=2)
        assert "painted a sunrise" in hits[0].episode.summary
        assert hits[0].score >= hits[1].score

    def test_exact_duplicates_are_stored_once(self, store: Any) -> None:
        a = store.save_episode("s", "goal", "same text")
        b = store.save_episode("s", "goal", "same text")
        ids = store.save_episodes(
            [{"session_id": "s", "task_goal": "goal", "summary": "same text"}] * 3
        )
        assert a == b == ids[0] == ids[2]
        assert store.count() == 1

    def test_filters_by_agent_session_task_time_and_metadata(self, store: Any) -> None:
        self._fill(store)
        assert store.count({"agent_id": "agent1"}) == 2
        assert store.count({"session_id": "s0"}) == 3
        assert store.count({"task_id": "t"}) == 5
        assert store.count({"metadata": {"i": 4}}) == 1
        assert store.count({"since": 0, "until": 1}) == 0
        hits = store.search("Caroline", top_k=5, filters={"agent_id": "agent1"})
        assert all(h.episode.agent_id == "agent1" for h in hits)

    def test_forget_removes_from_every_index(self, store: Any) -> None:
        ids = self._fill(store)
        assert store.forget(episode_id=ids[1]) == 1
        assert all(h.episode.episode_id != ids[1] for h in store.search("painted sunrise lake", 5))
        assert store.forget(session_id="s0") == 3
        assert store.count() == 1
        assert store.forget(agent_id="agent1") == 1
        assert store.count() == 0 and store.search("anything", 3) == []
        with pytest.raises(ConfigError):
            store.forget()

    def test_returned_episodes_are_copies(self, store: Any) -> None:
        eid = store.save_episode("s", "g", "text", metadata={"k": [1]})
        store.get(eid).metadata["k"].append(2)
        assert store.get(eid).metadata == {"k": [1]}

    def test_bad_episodes_are_refused_and_nothing_is_stored(self, store: Any) -> None:
        with pytest.raises(InvalidMessageError):
            store.save_episodes([{"session_id": "s", "task_goal": "g", "summary": "ok"}, {"x": 1}])
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", "t", metadata={"bad": object()})
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", 42)
        assert store.count() == 0

    def test_neighbour_window_lets_a_turn_be_found_by_its_context(self, store: Any) -> None:
        # the answer turn shares no word with the question; its neighbour does
        s = store
        s.save_episode("chat", "", "Where did you travel for the kayak trip?")
        s.save_episode("chat", "", "To Norway, in the fjords!")
        s.save_episode("other", "", "Unrelated turn about cooking pasta")
        hits = s.search("kayak trip", top_k=3)
        assert {h.episode.summary for h in hits[:2]} >= {"To Norway, in the fjords!"}
        narrow = open_episodic("memory://", embedder="hash", config=RetrievalConfig(window=0))
        narrow.save_episode("chat", "", "Where did you travel for the kayak trip?")
        narrow.save_episode("chat", "", "To Norway, in the fjords!")
        lexical = narrow.search("kayak trip", top_k=2)
        assert lexical[0].episode.summary.startswith("Where")

    def test_search_relevant_context_returns_texts(self, store: Any) -> None:
        self._fill(store)
        texts = store.search_relevant_context("adoption", top_k=1)
        assert texts == ["Caroline is researching adoption agencies"]

    def test_search_hits_format_with_provenance(self, store: Any) -> None:
        self._fill(store)
        block = format_prior_context(store.search("Caroline adoption", top_k=2))
        _, items = parse_prior_context(block)
        assert items[0].session in ("s0", "s1") and items[0].score
        assert "UTC" in items[0].date

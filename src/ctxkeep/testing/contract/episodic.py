"""The episodic conformance suite: :class:`EpisodicContract`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from ctxkeep.episodic import (
    EpisodeFilter,
    RetrievalConfig,
    content_key,
    format_prior_context,
    open_episodic,
    parse_prior_context,
)
from ctxkeep.errors import (
    ConfigError,
    EpisodeNotFoundError,
    InvalidFilterError,
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

    def test_find_stored_names_stored_episodes_by_content_key(self, store: Any) -> None:
        a = store.save_episode("s", "goal", "stored text")
        stored, missing = content_key("s", "goal", "stored text"), content_key("s", "", "new")
        assert store.find_stored([stored, missing]) == {stored: a}
        assert store.find_stored([]) == {}
        store.forget(episode_id=a)
        assert store.find_stored([stored]) == {}

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
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", "t", metadata=[("k", 1)])
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", "t", created_at=float("nan"))
        with pytest.raises(InvalidMessageError):
            store.save_episode("s", "g", "lone \ud800 surrogate")
        assert store.count() == 0

    def test_an_unknown_episode_id_raises_episode_not_found(self, store: Any) -> None:
        store.save_episode("s", "g", "text")
        with pytest.raises(EpisodeNotFoundError):
            store.get("no-such-id")

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

    # -- filters: one semantics on every backend (ctxkeep.episodic.filters) -----------------

    @staticmethod
    def _with_metadata(store: Any, values: dict[str, Any]) -> None:
        """One episode per item: summary ``name``, metadata ``{"k": value}`` (or none for
        ``None`` values of the mapping's ``"missing"``).
        """
        for name, value in values.items():
            meta = {} if name == "missing" else {"k": value}
            store.save_episode("s", "", f"episode {name}", metadata=meta)

    @staticmethod
    def _summaries(store: Any, metadata: dict[str, Any]) -> set[str]:
        hits = store.search("episode", top_k=50, filters={"metadata": metadata})
        assert store.count({"metadata": metadata}) == len(hits)
        return {h.episode.summary.removeprefix("episode ") for h in hits}

    def test_a_metadata_list_matches_only_the_same_list(self, store: Any) -> None:
        self._with_metadata(
            store, {"one": [1], "one-two": [1, 2], "two-one": [2, 1], "scalar": 1, "nested": [[1]]}
        )
        assert self._summaries(store, {"k": [1]}) == {"one"}
        assert self._summaries(store, {"k": [1, 2]}) == {"one-two"}
        assert self._summaries(store, {"k": [[1]]}) == {"nested"}
        assert self._summaries(store, {"k": []}) == set()

    def test_a_metadata_object_matches_only_an_equal_object(self, store: Any) -> None:
        self._with_metadata(
            store,
            {
                "same": {"a": 1, "b": [2, {"c": None}]},
                "reordered": {"b": [2, {"c": None}], "a": 1},
                "fewer-keys": {"a": 1},
                "more-keys": {"a": 1, "b": [2, {"c": None}], "d": 0},
                "other-inner": {"a": 1, "b": [2, {"c": False}]},
            },
        )
        want = {"a": 1, "b": [2, {"c": None}]}
        assert self._summaries(store, {"k": want}) == {"same", "reordered"}
        assert self._summaries(store, {"k": {"a": 1}}) == {"fewer-keys"}

    def test_metadata_true_is_not_one_and_numbers_match_by_value(self, store: Any) -> None:
        self._with_metadata(
            store,
            {
                "true": True,
                "false": False,
                "int": 1,
                "float": 1.0,
                "zero": 0,
                "text": "1",
                "null": None,
                "missing": None,
            },
        )
        assert self._summaries(store, {"k": True}) == {"true"}
        assert self._summaries(store, {"k": False}) == {"false"}
        assert self._summaries(store, {"k": 1}) == {"int", "float"}
        assert self._summaries(store, {"k": 1.0}) == {"int", "float"}
        assert self._summaries(store, {"k": 0}) == {"zero"}
        assert self._summaries(store, {"k": "1"}) == {"text"}

    def test_a_null_metadata_value_matches_null_not_a_missing_key(self, store: Any) -> None:
        self._with_metadata(store, {"null": None, "missing": None})
        assert self._summaries(store, {"k": None}) == {"null"}

    def test_every_metadata_key_must_match(self, store: Any) -> None:
        store.save_episode("s", "", "episode both", metadata={"a": 1, "b": "x"})
        store.save_episode("s", "", "episode only-a", metadata={"a": 1, "b": "y"})
        assert self._summaries(store, {"a": 1, "b": "x"}) == {"both"}
        assert self._summaries(store, {"a": 1}) == {"both", "only-a"}
        assert self._summaries(store, {"a": 1, "c": None}) == set()

    def test_metadata_keys_are_matched_literally(self, store: Any) -> None:
        odd = {'a.b"c': 1, "$[0]": "x", "": 2, "ключ": [3]}
        store.save_episode("s", "", "episode odd", metadata=odd)
        store.save_episode("s", "", "episode nested", metadata={"a": {'b"c': 1}})
        for k, v in odd.items():
            assert self._summaries(store, {k: v}) == {"odd"}
        assert self._summaries(store, {"a.b": 1}) == set()

    def test_id_filters_take_a_value_or_a_list(self, store: Any) -> None:
        self._fill(store)
        assert store.count({"agent_id": ["agent0", "agent1"]}) == 5
        assert store.count({"session_id": ("s1",)}) == 2
        assert store.count({"session_id": ["s1", "s1"]}) == 2
        assert store.count({"agent_id": []}) == 0
        assert store.count({"task_id": "t", "agent_id": "agent0", "session_id": "s1"}) == 0

    def test_time_filters_are_inclusive_and_take_datetimes(self, store: Any) -> None:
        for t in (100.0, 200.0, 300.0):
            store.save_episode("s", "", f"at {t}", created_at=t)
        assert store.count({"since": 200, "until": 300}) == 2
        assert store.count({"until": 200.0}) == 2
        since = datetime.fromtimestamp(250, UTC)
        assert store.count({"since": since}) == 1

    def test_an_episode_filter_is_accepted_as_filters(self, store: Any) -> None:
        self._fill(store)
        f = EpisodeFilter.parse({"agent_id": "agent1", "metadata": {"i": 3}})
        hits = store.search("Melanie", top_k=5, filters=f)
        assert [h.episode.metadata for h in hits] == [{"i": 3}]
        assert store.count(f) == 1

    def test_an_unknown_filter_key_is_refused_naming_it_and_the_allowed_keys(
        self, store: Any
    ) -> None:
        self._fill(store)
        typo = {"agent": "agent1"}
        calls: list[Callable[[], object]] = [
            lambda: store.search("Caroline", top_k=3, filters=typo),
            lambda: store.search_relevant_context("Caroline", top_k=3, filters=typo),
            lambda: store.count(typo),
        ]
        for call in calls:
            with pytest.raises(InvalidFilterError) as caught:
                call()
            assert "'agent'" in str(caught.value) and "agent_id" in str(caught.value)

    @pytest.mark.parametrize(
        "bad",
        [
            {"agent_id": 5},
            {"agent_id": None},
            {"session_id": ["s0", 1]},
            {"metadata": [("i", 1)]},
            {"metadata": {"i": object()}},
            {"metadata": {"i": float("nan")}},
            {"metadata": {1: "x"}},
            {"since": "yesterday"},
            {"until": True},
            {"since": float("inf")},
        ],
    )
    def test_a_filter_value_of_the_wrong_kind_is_refused(
        self, store: Any, bad: dict[str, Any]
    ) -> None:
        self._fill(store)
        with pytest.raises(InvalidFilterError):
            store.search("Caroline", top_k=3, filters=bad)
        with pytest.raises(InvalidFilterError):
            store.count(bad)

    def test_forget_refuses_a_value_of_the_wrong_kind_and_keeps_everything(
        self, store: Any
    ) -> None:
        self._fill(store)
        with pytest.raises(InvalidFilterError):
            store.forget(agent_id=5)
        assert store.count() == len(EPISODE_FACTS)

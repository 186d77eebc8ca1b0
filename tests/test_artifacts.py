"""Artifact stores give back exactly what was stored, under content-addressed refs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ctxkeep import (
    READ_ARTIFACT_TOOL,
    ArtifactStore,
    DirectoryArtifactStore,
    MemoryArtifactStore,
    SQLiteArtifactStore,
    open_artifacts,
    read_artifact_tool,
)
from ctxkeep.errors import ArtifactNotFoundError, ConfigError, InvalidMessageError

TEXTS = ["", "hello", "日本語 🎉 \u200b\r\n<|endoftext|>", "x" * 1_000_000]


@pytest.fixture(params=["memory", "sqlite", "directory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "memory":
        return MemoryArtifactStore()
    if request.param == "sqlite":
        return SQLiteArtifactStore(tmp_path / "artifacts.db")
    return DirectoryArtifactStore(tmp_path / "artifacts")


@pytest.mark.parametrize("text", TEXTS, ids=["empty", "ascii", "unicode", "1MB"])
def test_get_returns_exactly_what_was_put(store: ArtifactStore, text: str) -> None:
    ref = store.put(text)
    assert store.get(ref) == text
    assert ref in store


def test_put_is_idempotent_and_content_addressed(store: ArtifactStore) -> None:
    assert store.put("same") == store.put("same")
    assert store.put("a") != store.put("b")


def test_unknown_ref_is_a_lookup_error(store: ArtifactStore) -> None:
    with pytest.raises(ArtifactNotFoundError):
        store.get("sha256:" + "0" * 64)
    with pytest.raises(LookupError):
        store.get("../../etc/passwd")


def test_sqlite_and_directory_stores_persist(tmp_path: Path) -> None:
    ref = SQLiteArtifactStore(tmp_path / "a.db").put("kept")
    assert SQLiteArtifactStore(tmp_path / "a.db").get(ref) == "kept"
    ref = DirectoryArtifactStore(tmp_path / "d").put("kept")
    assert DirectoryArtifactStore(tmp_path / "d").get(ref) == "kept"


def test_open_artifacts_picks_the_backend(tmp_path: Path) -> None:
    assert isinstance(open_artifacts("memory://"), MemoryArtifactStore)
    assert isinstance(open_artifacts(f"sqlite:///{tmp_path}/a.db"), SQLiteArtifactStore)
    assert isinstance(open_artifacts(f"file://{tmp_path}/d"), DirectoryArtifactStore)
    with pytest.raises(ConfigError):
        open_artifacts("s3://bucket")


def test_read_artifact_tool_pages_through_a_long_output() -> None:
    store = MemoryArtifactStore()
    ref = store.put("abcdefghij")
    first = read_artifact_tool(store, json.dumps({"ref": ref, "limit": 4}))
    assert first.startswith("abcd") and "offset=4" in first
    assert read_artifact_tool(store, {"ref": ref, "offset": 4}) == "efghij"
    assert READ_ARTIFACT_TOOL["function"]["name"] == "read_artifact"


def test_read_artifact_tool_rejects_bad_arguments() -> None:
    store = MemoryArtifactStore()
    with pytest.raises(InvalidMessageError):
        read_artifact_tool(store, "{not json")
    with pytest.raises(InvalidMessageError):
        read_artifact_tool(store, {"offset": 1})

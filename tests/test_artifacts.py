"""Artifact stores outside the contract: picking a backend from a URL, files written by earlier
versions, and the ``read_artifact`` tool. (What every store does is in
``tests/contract/test_artifacts_contract.py``.)
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from ctxkeep import (
    READ_ARTIFACT_TOOL,
    DirectoryArtifactStore,
    MemoryArtifactStore,
    SQLiteArtifactStore,
    open_artifacts,
    read_artifact_tool,
)
from ctxkeep._sqlite import SQLiteClient
from ctxkeep.artifacts import artifact_ref
from ctxkeep.artifacts.directory import VERSION_FILE
from ctxkeep.errors import (
    ArtifactNotFoundError,
    ConfigError,
    InvalidMessageError,
    InvalidTypeError,
    MissingDependencyError,
    SchemaVersionError,
)


def write_legacy_sqlite_file(path: Path, texts: list[str]) -> None:
    """A file as SQLiteArtifactStore wrote it before ``ctxkeep_meta``: its table, no version."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS ctxkeep_artifacts ("
            "ref TEXT PRIMARY KEY, text TEXT NOT NULL, schema_version INTEGER NOT NULL, "
            "created_at REAL NOT NULL)"
        )
        for text in texts:
            conn.execute(
                "INSERT INTO ctxkeep_artifacts (ref, text, schema_version, created_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (ref) DO NOTHING",
                (artifact_ref(text), text, 1, time.time()),
            )


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("memory://", MemoryArtifactStore),
        ("sqlite:///{tmp}/a.db", SQLiteArtifactStore),
        ("file://{tmp}/d", DirectoryArtifactStore),
    ],
    ids=["memory", "sqlite", "directory"],
)
def test_open_artifacts_picks_the_backend(tmp_path: Path, url: str, kind: type) -> None:
    with open_artifacts(url.format(tmp=tmp_path)) as store:
        assert isinstance(store, kind)


@pytest.mark.parametrize("url", ["s3://bucket", "sqlite://relative.db", "nonsense"])
def test_open_artifacts_refuses_an_unsupported_url(url: str) -> None:
    with pytest.raises(ConfigError, match="unsupported artifact store URL"):
        open_artifacts(url)


@pytest.mark.parametrize(
    ("url", "blocked", "modules", "extra"),
    [
        (
            "redis://127.0.0.1:6379/0",
            "redis",
            ["ctxkeep._redis", "ctxkeep.artifacts.redis"],
            "redis",
        ),
        (
            "postgresql://localhost/db",
            "psycopg",
            ["ctxkeep._pg", "ctxkeep.artifacts.postgres"],
            "postgres",
        ),
    ],
    ids=["redis", "postgres"],
)
def test_open_artifacts_without_the_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, url: str, blocked: str, modules: list[str], extra: str
) -> None:
    monkeypatch.setitem(sys.modules, blocked, None)  # import <blocked> -> ImportError
    for name in modules:
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(MissingDependencyError, match=rf"ctxkeep\[{extra}\]"):
        open_artifacts(url)


def test_a_sqlite_file_written_before_ctxkeep_meta_keeps_its_artifacts(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    texts = ["old output", "日本語\x00\r\n"]
    write_legacy_sqlite_file(path, texts)
    with SQLiteArtifactStore(path) as store:
        assert [store.get(artifact_ref(t)) for t in texts] == texts
        assert store.get(store.put("new output")) == "new output"


def test_a_sqlite_file_written_before_ctxkeep_meta_is_adopted_as_version_1(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    write_legacy_sqlite_file(path, ["old output"])
    SQLiteArtifactStore(path).close()
    db = SQLiteClient(path, meta_key="test", migrations=[])
    try:
        assert db.meta("artifacts") == "1"
    finally:
        db.close()


def test_artifacts_and_checkpoints_share_one_sqlite_file(tmp_path: Path) -> None:
    from ctxkeep import CognitiveState, open_checkpoints

    url = f"sqlite:///{tmp_path}/shared.db"
    with open_artifacts(url) as store, open_checkpoints(url) as checkpoints:
        ref = store.put("artifact")
        cid = checkpoints.save("agent", CognitiveState(decision="d"))
    with open_artifacts(url) as store, open_checkpoints(url) as checkpoints:
        assert store.get(ref) == "artifact"
        assert checkpoints.load(cid).state.decision == "d"


def test_a_directory_written_before_the_version_file_keeps_its_artifacts(
    tmp_path: Path,
) -> None:
    ref = artifact_ref("old output")
    digest = ref.removeprefix("sha256:")
    (tmp_path / digest[:2]).mkdir()
    (tmp_path / digest[:2] / f"{digest}.txt").write_bytes(b"old output")
    with DirectoryArtifactStore(tmp_path) as store:
        assert store.get(ref) == "old output"
    assert (tmp_path / VERSION_FILE).read_text(encoding="utf-8").strip() == "1"


def test_a_directory_with_a_garbled_version_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / VERSION_FILE).write_text("one\n", encoding="utf-8")
    with pytest.raises(SchemaVersionError, match="invalid schema version"):
        DirectoryArtifactStore(tmp_path)


def test_a_not_found_error_names_the_store(tmp_path: Path) -> None:
    with (
        SQLiteArtifactStore(tmp_path / "a.db") as store,
        pytest.raises(ArtifactNotFoundError, match=str(tmp_path)),
    ):
        store.get("sha256:" + "0" * 64)


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


@pytest.mark.parametrize("offset", ["4", 1.5, float("nan"), -1, True, [4]])
def test_read_artifact_tool_refuses_an_offset_that_is_not_an_integer(offset: object) -> None:
    store = MemoryArtifactStore()
    ref = store.put("abcdefghij")
    with pytest.raises(InvalidMessageError, match="offset"):
        read_artifact_tool(store, {"ref": ref, "offset": offset})


def test_read_artifact_tool_takes_an_integral_float_as_json_writes_it() -> None:
    store = MemoryArtifactStore()
    ref = store.put("abcdefghij")
    assert read_artifact_tool(store, json.dumps({"ref": ref, "offset": 4.0})) == "efghij"


def test_read_artifact_tool_refuses_json_nested_too_deep() -> None:
    with pytest.raises(InvalidMessageError):
        read_artifact_tool(MemoryArtifactStore(), "[" * 100_000)


def test_read_artifact_tool_needs_an_artifact_store() -> None:
    with pytest.raises(InvalidTypeError):
        read_artifact_tool({"get": 1}, {"ref": "sha256:" + "0" * 64})  # type: ignore[arg-type]


def test_a_str_subclass_is_stored_as_its_plain_text() -> None:
    class Loud(str):
        def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
            raise AssertionError("the store must not call a subclass's encode()")

    store = MemoryArtifactStore()
    ref = store.put(Loud("quiet"))
    assert ref == artifact_ref("quiet") and type(store.get(ref)) is str


@pytest.mark.parametrize("url", ["sqlite:///a\x00b.db", "file:///tmp/a\nb"])
def test_open_artifacts_refuses_a_url_with_a_control_character(url: str) -> None:
    with pytest.raises(ConfigError, match="control character"):
        open_artifacts(url)

"""The episodic SQLite file: versions in ctxkeep_meta, files of earlier releases, caching."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ctxkeep.episodic import Episode, HashEmbedder, MemoryEpisodicStore, open_episodic
from ctxkeep.episodic.base import content_key, episode_record
from ctxkeep.episodic.text import tokenize
from ctxkeep.errors import ConfigError, SchemaVersionError

# The schema as the releases before ctxkeep_meta wrote it, statement by statement: version 1,
# then 2 (window document lengths), then 3 (next_row, the vocabulary, the scan index).
RELEASE_SCHEMA = {
    1: [
        """CREATE TABLE IF NOT EXISTS ctxkeep_episodes (
            row INTEGER PRIMARY KEY,
            episode_id TEXT NOT NULL UNIQUE,
            content_key TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL,
            task_id TEXT,
            agent_id TEXT,
            created_at REAL NOT NULL,
            pos INTEGER NOT NULL,
            record TEXT NOT NULL,
            tokens TEXT NOT NULL,
            vector BLOB NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_session ON ctxkeep_episodes (session_id, pos)",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_task ON ctxkeep_episodes (task_id)",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_agent ON ctxkeep_episodes (agent_id)",
        "CREATE VIRTUAL TABLE IF NOT EXISTS ctxkeep_episode_fts USING fts5(body, "
        "tokenize='unicode61 remove_diacritics 0')",
    ],
    2: [
        "ALTER TABLE ctxkeep_episodes ADD COLUMN doclen INTEGER NOT NULL DEFAULT 0",
        "UPDATE ctxkeep_episodes SET doclen = (SELECT length(body) - length(replace(body, ' ', ''))"
        " + (body != '') FROM ctxkeep_episode_fts WHERE rowid = ctxkeep_episodes.row)",
    ],
    3: [
        "INSERT OR IGNORE INTO ctxkeep_episodic_meta VALUES ('next_row', "
        "(SELECT coalesce(max(row), 0) + 1 FROM ctxkeep_episodes))",
        "CREATE VIRTUAL TABLE IF NOT EXISTS ctxkeep_episode_vocab "
        "USING fts5vocab(ctxkeep_episode_fts, 'row')",
        "CREATE INDEX IF NOT EXISTS ctxkeep_episodes_scan "
        "ON ctxkeep_episodes (row, session_id, pos, created_at, doclen)",
    ],
}

SESSION = [
    "Where did you travel for the kayak trip?",
    "To Norway, in the fjords!",
    "The deploy needs the VPN",
]


def write_release_file(
    path: Path, version: int, *, embedder: str | None = None, next_row: int = 7
) -> list[str]:
    """A file as the release of schema ``version`` wrote it (its schema version, embedder and
    next row in ``ctxkeep_episodic_meta``), holding :data:`SESSION` as session ``s`` at rows
    1-3 (rows 4-6 forgotten before, where the release numbered rows); returns the ids.
    """
    emb = HashEmbedder()
    embedder = embedder or emb.name
    windows = MemoryEpisodicStore(emb)  # the window documents have not changed
    tokens = [tokenize(t) for t in SESSION]
    ids = []
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE ctxkeep_episodic_meta (key TEXT PRIMARY KEY, value TEXT)")
        for v in range(1, version + 1):
            for stmt in RELEASE_SCHEMA[v]:
                conn.execute(stmt)
        conn.execute("INSERT INTO ctxkeep_episodic_meta VALUES ('schema_version', ?)", (version,))
        conn.execute("INSERT INTO ctxkeep_episodic_meta VALUES ('embedder', ?)", (embedder,))
        if version >= 3:
            conn.execute(
                "UPDATE ctxkeep_episodic_meta SET value = ? WHERE key = 'next_row'", (next_row,)
            )
        for pos, (text, vec) in enumerate(zip(SESSION, emb.embed_documents(SESSION), strict=True)):
            e = Episode(episode_id=f"e{pos}", session_id="s", task_goal="", summary=text)
            conn.execute(
                "INSERT INTO ctxkeep_episodes (row, episode_id, content_key, session_id, task_id, "
                "agent_id, created_at, pos, record, tokens, vector) "
                "VALUES (?, ?, ?, ?, NULL, NULL, ?, ?, ?, ?, ?)",
                (
                    pos + 1,
                    e.episode_id,
                    content_key("s", "", text),
                    "s",
                    1000.0 + pos,
                    pos,
                    episode_record(e),
                    " ".join(tokens[pos]),
                    vec.tobytes(),
                ),
            )
            body = windows.window_doc(tokens, pos)
            conn.execute(
                "INSERT INTO ctxkeep_episode_fts (rowid, body) VALUES (?, ?)", (pos + 1, body)
            )
            if version >= 2:
                conn.execute(
                    "UPDATE ctxkeep_episodes SET doclen = ? WHERE row = ?",
                    (len(body.split()), pos + 1),
                )
            ids.append(e.episode_id)
    conn.close()
    return ids


def read(path: Path, sql: str) -> list[Any]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(sql).fetchall()
    conn.close()
    return rows


def url(path: Path) -> str:
    return f"sqlite:///{path}"


def test_a_file_of_the_release_before_ctxkeep_meta_keeps_its_episodes(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    ids = write_release_file(path, 3)
    with open_episodic(url(path), embedder="hash") as s:
        assert s.count() == 3
        assert s.get(ids[1]).summary == SESSION[1]
        hits = s.search("kayak trip", top_k=2)
        assert {h.episode.summary for h in hits} == set(SESSION[:2])


def test_a_file_of_the_release_before_keeps_numbering_rows_after_its_last(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_release_file(path, 3, next_row=7)
    with open_episodic(url(path), embedder="hash") as s:
        s.save_episode("s", "", "a new turn")
    assert read(path, "SELECT max(row) FROM ctxkeep_episodes") == [(7,)]


def test_the_embedder_and_next_row_move_to_ctxkeep_meta(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_release_file(path, 3, next_row=7)
    open_episodic(url(path), embedder="hash").close()
    meta = dict(read(path, "SELECT key, value FROM ctxkeep_meta WHERE key LIKE 'episodic%'"))
    assert meta == {
        "episodic": "4",
        "episodic.embedder": HashEmbedder().name,
        "episodic.next_row": "7",
    }


def test_a_migrated_file_is_refused_by_the_releases_before(tmp_path: Path) -> None:
    # those releases read ctxkeep_episodic_meta and refuse a schema_version above 3
    path = tmp_path / "old.db"
    write_release_file(path, 3)
    open_episodic(url(path), embedder="hash").close()
    assert read(path, "SELECT key, value FROM ctxkeep_episodic_meta") == [("schema_version", "4")]
    new = tmp_path / "new.db"
    open_episodic(url(new), embedder="hash").close()
    assert read(new, "SELECT key, value FROM ctxkeep_episodic_meta") == [("schema_version", "4")]


def test_a_file_of_the_release_before_with_another_embedder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    write_release_file(path, 3, embedder="some-other-model")
    with pytest.raises(ConfigError, match="some-other-model"):
        open_episodic(url(path), embedder="hash")


@pytest.mark.parametrize("version", [1, 2])
def test_a_file_of_an_earlier_schema_is_migrated(tmp_path: Path, version: int) -> None:
    path = tmp_path / "old.db"
    write_release_file(path, version)
    with open_episodic(url(path), embedder="hash") as s:
        s.save_episode("s2", "", "the backup runs at night")
        assert s.search("backup night", 1)[0].episode.summary == "the backup runs at night"
        assert s.search("kayak", 1)[0].episode.summary == SESSION[0]
    # no next_row before schema 3: rows go on after the largest
    assert read(path, "SELECT max(row) FROM ctxkeep_episodes") == [(4,)]
    assert read(path, "SELECT value FROM ctxkeep_meta WHERE key = 'episodic'") == [("4",)]


def test_a_file_of_a_newer_ctxkeep_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ep.db"
    open_episodic(url(path), embedder="hash").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE ctxkeep_meta SET value = '9' WHERE key = 'episodic'")
    conn.close()
    with pytest.raises(SchemaVersionError):
        open_episodic(url(path), embedder="hash")


def test_opening_a_current_file_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ep.db"
    with open_episodic(url(path), embedder="hash") as s:
        s.save_episode("s", "", "kept")
    watcher = sqlite3.connect(path)
    before = watcher.execute("PRAGMA data_version").fetchone()[0]
    with open_episodic(url(path), embedder="hash") as s:
        assert s.count() == 1
    # data_version moves when another connection commits
    assert watcher.execute("PRAGMA data_version").fetchone()[0] == before
    watcher.close()


def test_a_store_used_after_close_sees_what_another_wrote_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "ep.db"
    reader = open_episodic(url(path), embedder="hash")
    reader.save_episode("s", "", "first")
    assert reader.count() == 1
    reader.close()  # its connections go; the next call opens new ones
    with open_episodic(url(path), embedder="hash") as writer:
        writer.save_episode("s", "", "second")
    assert reader.count() == 2
    assert reader.search("second", 1)[0].episode.summary == "second"
    reader.close()

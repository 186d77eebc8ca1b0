"""``ctxkeep_meta``, the versions table of every SQLite file: kept in its primary key's b-tree
(``WITHOUT ROWID``, one page) in a new file; the rowid table of a file written before is read
and written alike.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from ctxkeep._sqlite import SQLiteClient

OLD_META = "CREATE TABLE ctxkeep_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
"""The versions table as ctxkeep wrote it before (a rowid table and its key's index)."""


def _schema(path: Path) -> dict[str, str]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT name, sql FROM sqlite_schema").fetchall()
    return {str(name): str(sql or "") for name, sql in rows}


def test_a_new_file_keeps_its_versions_in_one_btree(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteClient(path, meta_key="a", migrations=["CREATE TABLE a (x)"]).close()
    schema = _schema(path)
    assert schema["ctxkeep_meta"].endswith("WITHOUT ROWID")
    assert "sqlite_autoindex_ctxkeep_meta_1" not in schema  # no second b-tree of its keys
    db = SQLiteClient(path, meta_key="b", migrations=["CREATE TABLE b (x)", "ALTER TABLE b ADD y"])
    try:
        assert (db.meta("a"), db.meta("b")) == ("1", "2")
    finally:
        db.close()


def test_a_file_with_the_earlier_rowid_table_is_read_and_upgraded_alike(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(OLD_META)
        conn.execute("CREATE TABLE a (x)")
        conn.execute("INSERT INTO ctxkeep_meta VALUES ('a', '1')")
        conn.commit()
    db = SQLiteClient(path, meta_key="a", migrations=["CREATE TABLE a (x)", "ALTER TABLE a ADD y"])
    try:
        assert db.meta("a") == "2"  # the second migration ran, the first did not run again
        db.conn().execute("INSERT INTO a (x, y) VALUES (1, 2)")
    finally:
        db.close()
    SQLiteClient(path, meta_key="b", migrations=["CREATE TABLE b (x)"]).close()
    schema = _schema(path)
    assert schema["ctxkeep_meta"] == OLD_META and "sqlite_autoindex_ctxkeep_meta_1" in schema
    db = SQLiteClient(path, meta_key="a", migrations=["CREATE TABLE a (x)", "ALTER TABLE a ADD y"])
    try:
        assert (db.meta("a"), db.meta("b")) == ("2", "1")
    finally:
        db.close()

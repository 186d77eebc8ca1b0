"""bench/peers.py: a tiny run on SQLite measures every operation of every adapter beside its
peer with both sides reading back equal, and its equality check catches a difference.
Timings are never asserted.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from _bench import BENCH, need, run

# Looked up, not imported: langchain-community warns on import (filterwarnings = error).
PEER_MODULES = {
    "langgraph.checkpoint.sqlite": "langgraph-checkpoint-sqlite",
    "langgraph.store.sqlite": "langgraph-checkpoint-sqlite",
    "langchain_community": "langchain-community",
    "sqlalchemy": "sqlalchemy[asyncio]",
    "aiosqlite": "aiosqlite",
    "agents": "openai-agents (ctxkeep[agents])",
    "langgraph": "langgraph (ctxkeep[langgraph])",
    "langchain_core": "langchain-core (ctxkeep[langchain])",
}


pytestmark = need(PEER_MODULES)

SQLITE_CELLS = {
    ("agents", "SQLiteSession"): [
        "pop_item",
        "get_items()",
        "get_items(limit=20)",
        "add_items, one at a time",
    ],
    ("agents", "SQLAlchemySession"): [
        "pop_item",
        "get_items()",
        "get_items(limit=20)",
        "add_items, one at a time",
    ],
    ("store", "SqliteStore"): [
        "search with a query, p50",
        "search, filter only, p50",
        "put one, p50",
        "batch put of all items",
        "bytes on disk",
    ],
    ("history", "SQLChatMessageHistory"): [
        "read all",
        "new object + read all",
        "add_message, one at a time",
    ],
    ("saver", "SqliteSaver"): [
        "step (put + put_writes + get_tuple), p50",
        "list() of the thread",
        "bytes on disk",
    ],
}


@pytest.mark.slow
def test_a_tiny_sqlite_run_measures_every_operation_with_equal_data(tmp_path: Path) -> None:
    doc, _ = run(
        "peers.py",
        *("--sizes", "30", "--rounds", "1", "--adds", "5", "--engines", "sqlite"),
        *("--embedder", "hash"),
        out=tmp_path / "peers.json",
    )
    assert doc["failures"] == []
    cells: dict[tuple[str, str], list[str]] = {}
    for r in doc["results"]:
        assert r["engine"] == "sqlite"
        assert r["size"] == 30
        assert r["ratio_median"] > 0
        cells.setdefault((r["adapter"], r["peer"]), []).append(r["operation"])
    assert cells == SQLITE_CELLS
    # like for like: both sides of every pair ran the same synchronous setting
    for r in doc["results"]:
        assert r["sync"]["ctxkeep"].split()[0] == r["sync"]["peer"].split()[0]
    assert set(doc["versions"]) >= {"ctxkeep", "openai-agents", "langgraph-checkpoint-sqlite"}


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import peers

    return peers


def test_the_equality_check_names_where_the_sides_differ(bench: ModuleType) -> None:
    ck = bench.Side("ck", read_back=lambda: {"values": [1, 2, 3]})
    peer = bench.Side("peer", read_back=lambda: {"values": [1, 5, 3]})
    with pytest.raises(bench.Mismatch, match=r"\['values'\]: \[1\]: ctxkeep 2 != peer 5"):
        bench.Pair("store", "sqlite", ck, peer).check("after the load")

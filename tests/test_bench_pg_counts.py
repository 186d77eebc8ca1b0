"""bench/pg_counts.py: a tiny run on the tests' PostgreSQL counts every operation of every pair
on both sides, with their data read back equal. Counts are checked for being counted (a put
writes WAL, every call costs the server and the client CPU), never for their size.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _bench import need, run
from conftest_services import postgres_url

__all__ = ["postgres_url"]

PEER_MODULES = {
    "langgraph.store.postgres": "langgraph-checkpoint-postgres",
    "langchain_postgres": "langchain-postgres",
    "sqlalchemy": "sqlalchemy[asyncio]",
    "agents": "openai-agents (ctxkeep[agents])",
}


pytestmark = [pytest.mark.postgres, need(PEER_MODULES)]


def test_a_tiny_run_counts_every_operation_on_both_sides(tmp_path: Path, postgres_url: str) -> None:
    doc, printed = run(
        "pg_counts.py",
        *("--pg-url", postgres_url, "--n", "3", "--rounds", "2", "--size", "20"),
        *("--embedder", "hash"),
        out=tmp_path / "counts.json",
        timeout=600,
    )
    sides = {(r["op"], r["side"]): r["figures"] for r in doc["results"]}
    assert set(sides) == {
        ("store put", "CtxkeepStore"),
        ("store put", "PostgresStore+index"),
        ("store search", "CtxkeepStore"),
        ("store search", "PostgresStore+index"),
        ("store put", "CtxkeepStore(index=False)"),
        ("store put", "PostgresStore"),
        ("store search", "CtxkeepStore(index=False)"),
        ("store search", "PostgresStore"),
        ("history add_message", "CtxkeepChatMessageHistory"),
        ("history add_message", "PostgresChatMessageHistory"),
        ("agents add_items", "CtxkeepSession"),
        ("agents add_items", "SQLAlchemySession"),
    }
    for (op, _), figures in sides.items():
        assert len(figures["server CPU us"]) == 2  # a figure a round
        assert min(figures["server CPU us"]) > 0  # the side's own backends were found
        assert min(figures["client CPU us"]) > 0
        if op != "store search":
            assert min(figures["WAL bytes"]) > 0
    assert "store put: CtxkeepStore | PostgresStore+index" in printed

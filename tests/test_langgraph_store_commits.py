"""CtxkeepStore on PostgreSQL: a put (its episodes, its rows, the forgetting of the episodes
it replaced) is one transaction, so one commit, and all or nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from langgraph.store.base import PutOp

from conftest_services import postgres_schema_factory, postgres_url
from ctxkeep.integrations.langgraph import CtxkeepStore

__all__ = ["postgres_schema_factory", "postgres_url"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(postgres_schema_factory: Callable[[], str]) -> Iterator[CtxkeepStore]:
    s = CtxkeepStore(postgres_schema_factory(), embedder="hash", index={"fields": ["text"]})
    yield s
    s.close()


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the transactions psycopg opens (one element each), as they begin: entered
    through ``Connection.transaction()`` or as a ``Transaction`` of their own.
    """
    opened: list[int] = []
    real = psycopg.Transaction.__enter__

    def counting(self: Any) -> Any:
        opened.append(1)
        return real(self)

    monkeypatch.setattr(psycopg.Transaction, "__enter__", counting)
    return opened


def test_a_put_of_a_new_item_is_one_transaction(
    store: CtxkeepStore, transactions: list[int]
) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    assert len(transactions) == 1


def test_a_put_over_an_item_is_one_transaction_and_forgets_its_old_episode(
    store: CtxkeepStore, transactions: list[int]
) -> None:
    store.put(("notes",), "n1", {"text": "the launch code is aardvark"})
    transactions.clear()
    store.put(("notes",), "n1", {"text": "the launch code is zebra"})
    assert len(transactions) == 1
    assert store.episodic.count() == 1
    assert store.search(("notes",), query="zebra")[0].value == {"text": "the launch code is zebra"}


def test_a_batch_of_puts_is_one_transaction(store: CtxkeepStore, transactions: list[int]) -> None:
    store.put(("notes",), "n0", {"text": "first"})
    transactions.clear()
    store.batch(
        [
            *(PutOp(("notes",), f"n{i}", {"text": f"note number {i}"}) for i in range(20)),
            PutOp(("notes",), "gone", None),
        ]
    )
    assert len(transactions) == 1
    assert store.episodic.count() == 20
    assert len(store.search(("notes",), limit=100)) == 20


def test_a_put_whose_rows_fail_to_write_leaves_no_episode(
    store: CtxkeepStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put(("notes",), "n1", {"text": "kept as it was"})

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("the row write failed")

    # the statement that writes the rows (and forgets the replaced rows' episodes)
    monkeypatch.setattr(store._items, "_pg_put", failing)
    with pytest.raises(Exception, match="the row write failed"):
        store.put(("notes",), "n1", {"text": "never stored"})
    monkeypatch.undo()
    assert store.episodic.count() == 1
    got = store.get(("notes",), "n1")
    assert got is not None and got.value == {"text": "kept as it was"}
    assert store.search(("notes",), query="kept")[0].key == "n1"

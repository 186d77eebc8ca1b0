"""The checkpoint conformance suite against every backend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ctxkeep.checkpoints import open_checkpoints
from ctxkeep.testing.contract import CheckpointContract


class TestMemoryCheckpoints(CheckpointContract):
    @pytest.fixture
    def checkpoints(self) -> Iterator[Any]:
        store = open_checkpoints("memory://")
        yield store
        store.close()


class TestSQLiteCheckpoints(CheckpointContract):
    @pytest.fixture
    def checkpoints(self, tmp_path: Path) -> Iterator[Any]:
        store = open_checkpoints(f"sqlite:///{tmp_path}/cp.db")
        yield store
        store.close()

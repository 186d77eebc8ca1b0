"""The LangChain agent example runs offline and stays inside its window."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("langchain")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "langchain_agent.py"


def test_langchain_agent_example() -> None:
    spec = importlib.util.spec_from_file_location("langchain_agent", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["langchain_agent"] = module
    spec.loader.exec_module(module)
    out = module.run(steps=20, window=5000)
    assert out["model_calls"] == 21 and out["tool_outputs"] == 20
    assert out["largest_prompt_tokens"] <= 5000
    assert out["history_chars"] > 100_000  # far more than the window: pruning did the work
    assert out["compressed"] > 0 and out["recalled"] == 1
    assert out["valid"] and out["episodes"] == 2
    assert out["answer"].startswith("Found it")

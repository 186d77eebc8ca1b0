"""The examples run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_two_agents_example() -> None:
    from ctxkeep import ContextFabric

    result = _load("two_agents").run(ContextFabric())
    assert result["coder_got"] == [{"please": "start with step 1"}]
    assert result["planner_got"] == [{"done": "reproduced the bug"}]
    assert result["resume_from"] == {"next": "round once per invoice"}


def test_agent_loop_example(tmp_path: Path) -> None:
    sizes = _load("agent_loop").run(f"sqlite:///{tmp_path}/agent.db", steps=15)
    assert len(sizes) == 15 and max(sizes) <= 4000

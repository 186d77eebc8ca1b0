"""The README's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from _llm_servers import openai_default, running

    with running(openai_default) as server:  # the OpenAI-compatible server the SDK finds
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        _run_blocks()
        assert server.requests, "the README's agent block never called the model"


def _run_blocks() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md block {i}", "exec"), {"__name__": "readme"})


def test_readme_has_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "pip install . && ctxkeep demo" in text
    assert "pip install -e '.[test]' && python -m pytest" in text

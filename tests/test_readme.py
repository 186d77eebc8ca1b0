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
        if "RemoteMemory(" in code:
            _run_against_a_live_service(code, f"README.md block {i}")
            continue
        exec(compile(code, f"README.md block {i}", "exec"), {"__name__": "readme"})


def _run_against_a_live_service(code: str, name: str) -> None:
    """The service block, against ``ctxkeep serve``'s app on a free port, with a real key."""
    from _server import ThreadedServer
    from ctxkeep.server import create_app

    app = create_app("memory://", embedder="hash")
    server = ThreadedServer(app).start()
    try:
        _, api_key = app.state.ctxkeep.keys.create("readme")
        code = code.replace("http://127.0.0.1:8765", server.url)
        scope = {"__name__": "readme", "api_key": api_key}
        exec(compile(code, name, "exec"), scope)
        assert [m.content for m in scope["mem"].get_messages(scope["sid"])] == ["hello"]
        scope["mem"].close()
    finally:
        server.stop()


def test_readme_has_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "pip install . && ctxkeep demo" in text
    assert "pip install -e '.[test]' && python -m pytest" in text

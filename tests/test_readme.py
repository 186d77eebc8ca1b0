"""The README's example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert blocks
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md block {i}", "exec"), {"__name__": "readme"})


def test_readme_has_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "pip install . && ctxkeep demo" in text
    assert "pip install -e '.[test]' && python -m pytest" in text

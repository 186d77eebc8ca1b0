"""Helpers for the CLI tests: run the real console script (not collected: no ``test_`` prefix)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def ctxkeep_script() -> str:
    """The installed ``ctxkeep`` console script (skips the test when it is not installed)."""
    script = Path(sys.executable).with_name("ctxkeep")
    found = str(script) if script.exists() else shutil.which("ctxkeep")
    if found is None:
        pytest.skip("the ctxkeep console script is not installed (pip install -e .)")
    return found


def run_script(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``ctxkeep ARGS`` in a subprocess (the test's environment) and capture its output."""
    return subprocess.run(
        [ctxkeep_script(), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def assert_one_line_error(stderr: str, *fragments: str) -> None:
    """``stderr`` is one ``ctxkeep: error: ...`` line holding every fragment, no traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("ctxkeep: error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], stderr

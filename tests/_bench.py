"""What the tests of ``bench/`` scripts share: the peers' packages they need, and a run of a
script (not collected: no ``test_`` prefix).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
"""The folder of the bench scripts."""


def missing(modules: dict[str, str]) -> list[str]:
    """The packages (values) of the ``modules`` (keys) this interpreter cannot import; looked
    up, not imported (langchain-community warns on import: filterwarnings = error).
    """
    out = []
    for module, package in modules.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            out.append(package)
    return out


def need(modules: dict[str, str]) -> pytest.MarkDecorator:
    """A mark that skips a test where a package of ``modules`` is missing, saying how to
    install the peers' packages.
    """
    gone = missing(modules)
    return pytest.mark.skipif(
        bool(gone),
        reason=f"the peers' packages are not installed ({', '.join(gone)}): "
        "python bench/peers.py --install",
    )


def run(script: str, *args: str, out: Path, timeout: float = 300) -> tuple[Any, str]:
    """``bench/<script> ARGS --json OUT`` in a subprocess of this interpreter, which must exit
    0: the JSON it wrote, and what it printed.
    """
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout

"""What the wheel carries: the licence file, and extras that bring what their parts need
(issue 27, items 2 and 15).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from ctxkeep.episodic import embedders, get_embedder
from ctxkeep.errors import MissingDependencyError, _extra_requirements

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(out), "--no-deps", "-q"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if done.returncode and "hatchling" in done.stderr and "No matching distribution" in done.stderr:
        pytest.skip(f"pip cannot fetch the build backend here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    (found,) = out.glob("ctxkeep-*.whl")
    return found


def _metadata(wheel: Path) -> tuple[list[str], dict[str, list[str]]]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(z.read(meta).decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return names, fields


def test_the_repository_has_the_mit_licence() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License")
    assert "Permission is hereby granted, free of charge" in text


def test_the_wheel_carries_the_licence_file(wheel: Path) -> None:
    names, fields = _metadata(wheel)
    (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as z:
        assert z.read(licence).decode() == (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert fields["License-Expression"] == ["MIT"]
    assert fields["License-File"] == ["LICENSE"]


def test_the_wheel_carries_the_inspector(wheel: Path) -> None:
    names, _ = _metadata(wheel)
    for asset in ("index.html", "inspector.js", "inspector.css"):
        assert f"ctxkeep/server/static/{asset}" in names


def test_the_server_extra_brings_the_default_embedder(
    wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The episodic routes embed with ``local``: what it needs comes with ``[server]`` alone."""
    _, fields = _metadata(wheel)
    server = _extra_requirements(fields["Requires-Dist"], "server")
    real_find_spec = importlib.util.find_spec

    def without(name: str, *args: object) -> object:
        return None if name == "wordllama" else real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(embedders.importlib.util, "find_spec", without)
    with pytest.raises(MissingDependencyError) as info:
        get_embedder("local")
    needed = _extra_requirements(fields["Requires-Dist"], info.value.extra)
    assert needed  # the extra the default embedder names exists
    assert set(needed) <= set(server)

"""A missing extra's hint is a pip command that works where ctxkeep was installed from (issue 27,
item 1): a clone, an editable clone, a wheel file, a VCS URL or a package index.
"""

from __future__ import annotations

import json
import shlex
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from ctxkeep.errors import MissingDependencyError, install_command

REQUIRES = [
    "numpy>=1.26",
    'fastapi>=0.115; extra == "server"',
    'ctxkeep[static]; extra == "server"',
    'wordllama<0.5,>=0.4; extra == "static"',
    'matplotlib>=3.8; extra == "plot"',
]


class FakeDistribution:
    def __init__(self, direct_url: dict[str, Any] | None) -> None:
        self.direct_url = direct_url
        self.requires = REQUIRES

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


def installed_from(monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, Any] | None) -> None:
    monkeypatch.setattr(metadata, "distribution", lambda name: FakeDistribution(direct_url))


def test_an_index_install_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    installed_from(monkeypatch, None)
    assert install_command("server") == "pip install 'ctxkeep[server]'"


def test_an_editable_clone_in_the_current_directory_is_dot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installed_from(monkeypatch, {"url": tmp_path.as_uri(), "dir_info": {"editable": True}})
    monkeypatch.chdir(tmp_path)
    assert install_command("server") == "pip install -e '.[server]'"


def test_a_clone_seen_from_elsewhere_is_named_by_its_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clone = tmp_path / "my clone"
    clone.mkdir()
    installed_from(monkeypatch, {"url": clone.as_uri(), "dir_info": {}})
    monkeypatch.chdir(tmp_path)
    assert install_command("plot") == f"pip install {shlex.quote(f'{clone}[plot]')}"
    assert shlex.split(install_command("plot")) == ["pip", "install", f"{clone}[plot]"]


def test_a_wheel_file_is_named_with_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wheel = tmp_path / "ctxkeep-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    installed_from(monkeypatch, {"url": wheel.as_uri(), "archive_info": {}})
    assert install_command("server") == f"pip install 'ctxkeep[server] @ {wheel.as_uri()}'"


def test_a_deleted_wheel_gives_the_extras_own_requirements(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wheel = tmp_path / "gone" / "ctxkeep-0.1.0-py3-none-any.whl"
    installed_from(monkeypatch, {"url": wheel.as_uri(), "archive_info": {}})
    assert install_command("server") == "pip install 'fastapi>=0.115' 'wordllama<0.5,>=0.4'"


def test_a_vcs_install_names_its_url_and_revision(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "https://github.com/example/ctxkeep"
    installed_from(
        monkeypatch,
        {"url": url, "vcs_info": {"vcs": "git", "commit_id": "abc123", "requested_revision": "v1"}},
    )
    assert install_command("redis") == f"pip install 'ctxkeep[redis] @ git+{url}@v1'"


def test_the_error_names_the_extra_and_the_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    installed_from(monkeypatch, {"url": tmp_path.as_uri(), "dir_info": {"editable": True}})
    monkeypatch.chdir(tmp_path)
    error = MissingDependencyError("matplotlib", "plot")
    assert str(error) == (
        "matplotlib is not installed; it comes with the extra ctxkeep[plot]: "
        "pip install -e '.[plot]'"
    )


def test_this_checkout_gives_a_command_pip_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real metadata: the tests run from an editable install of this clone."""
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(root)
    words = shlex.split(install_command("server"))
    assert words[:2] == ["pip", "install"]
    target = words[-1]
    assert target.endswith("[server]")
    if not target.startswith("ctxkeep"):  # installed from this clone
        assert Path(target.removesuffix("[server]")).resolve() == root

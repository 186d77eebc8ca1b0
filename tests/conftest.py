"""Shared fixtures: an isolated environment, the shared data, tiktoken's own encodings.

* Every test runs with no ctxkeep settings from the developer's machine: ``CTXKEEP_CONFIG``
  points at a file that does not exist, the ``CTXKEEP_*`` limits are unset, and ``HOME`` and the
  XDG directories are temporary.
* ``../shared/data`` (or ``$CTXKEEP_SHARED_DATA``) holds real agent trajectories. A test that
  takes a ``trajectory`` argument runs once per trajectory file, marked ``shared_data``, and is
  skipped with a reason when the data is absent (a fresh clone has no ``../shared``).
* ``tiktoken_encodings`` builds tiktoken's *own* ``Encoding`` objects (its constructor, its
  ``pat_str``, its special tokens, its SHA-256 check) without the network: the ``.tiktoken``
  files shipped by bpe-openai are placed in a private ``TIKTOKEN_CACHE_DIR`` under the names
  tiktoken would have cached its downloads under.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

SHARED_DATA_ENV = "CTXKEEP_SHARED_DATA"
NO_SHARED_DATA = (
    "../shared/data/trajectories not found: set CTXKEEP_SHARED_DATA to the shared data folder "
    "to run the tests on real trajectories"
)

ENCODING_URLS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}
ENCODING_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

_ISOLATED_UNSET = (
    "CTXKEEP_MAX_PROMPT_LENGTH",
    "CTXKEEP_MAX_PROMPT_TOKENS",
    "CTXKEEP_ENCODING",
    "CTXKEEP_DB",
    "CTXKEEP_PG_POOL_MAX",
)


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No config file, no CTXKEEP_* settings, and a temporary HOME / XDG tree."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("CTXKEEP_CONFIG", str(tmp_path / "no-such-config.toml"))
    for name in _ISOLATED_UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    for var, sub in (
        ("XDG_CONFIG_HOME", ".config"),
        ("XDG_DATA_HOME", ".local/share"),
        ("XDG_CACHE_HOME", ".cache"),
        ("XDG_STATE_HOME", ".local/state"),
    ):
        monkeypatch.setenv(var, str(home / sub))
    return home


# -- the shared data --------------------------------------------------------------------------


def shared_data_dir() -> Path | None:
    """The shared data folder ($CTXKEEP_SHARED_DATA, else ../shared/data), or None."""
    candidates = []
    if os.environ.get(SHARED_DATA_ENV):
        candidates.append(Path(os.environ[SHARED_DATA_ENV]))
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for path in candidates:
        if (path / "trajectories").is_dir():
            return path
    return None


def trajectory_files() -> list[Path]:
    """Every trajectory file in the shared data (empty if there is none)."""
    data = shared_data_dir()
    if data is None:
        return []
    return sorted((data / "trajectories").glob("*.json"))


@pytest.fixture
def shared_data() -> Path:
    """The shared data folder; skips the test when it is absent."""
    data = shared_data_dir()
    if data is None:
        pytest.skip(NO_SHARED_DATA)
    return data


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first: the two workers take tests in this order, and a test of
    minutes started near the end keeps one worker busy while the other has nothing left."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run a test that takes ``trajectory`` once per trajectory file (or skip it)."""
    if "trajectory" not in metafunc.fixturenames:
        return
    files = trajectory_files()
    if files:
        params = [pytest.param(p, id=p.stem, marks=pytest.mark.shared_data) for p in files]
    else:
        params = [
            pytest.param(
                None,
                id="no-shared-data",
                marks=[pytest.mark.shared_data, pytest.mark.skip(reason=NO_SHARED_DATA)],
            )
        ]
    metafunc.parametrize("trajectory", params)


@pytest.fixture
def trajectory_messages(trajectory: Path) -> list[dict[str, Any]]:
    """The OpenAI chat messages of one trajectory file, as stored."""
    messages: list[dict[str, Any]] = json.loads(trajectory.read_text(encoding="utf-8"))["messages"]
    return messages


# -- tiktoken's own encodings, offline ----------------------------------------------------------


def _refuse_network(*args: object, **kwargs: object) -> None:
    raise OSError("the test suite does not use the network")


@pytest.fixture(scope="session")
def tiktoken_encodings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tiktoken's own ``Encoding`` for o200k_base and cl100k_base, built without the network."""
    import tiktoken

    spec = importlib.util.find_spec("bpe_openai")
    assert spec is not None and spec.submodule_search_locations, "bpe-openai is not installed"
    data_dir = Path(next(iter(spec.submodule_search_locations))) / "data"
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    for name, url in ENCODING_URLS.items():
        raw = gzip.decompress((data_dir / f"{name}.tiktoken.gz").read_bytes())
        assert hashlib.sha256(raw).hexdigest() == ENCODING_SHA256[name]
        (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(raw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
        # Fail fast instead of downloading if tiktoken ever misses the cache.
        mp.setattr(socket.socket, "connect", _refuse_network)
        mp.setattr(socket, "create_connection", _refuse_network)
        encodings = {name: tiktoken.get_encoding(name) for name in ENCODING_URLS}
    return encodings

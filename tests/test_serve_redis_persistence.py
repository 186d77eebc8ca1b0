"""``ctxkeep serve`` on Redis refuses a server that would lose the API keys on a restart.

Each test starts a Redis of its own (``redis-server`` on a free port, its files in a temporary
directory) with the persistence settings under test, so none depends on how the shared Redis
on 6379 is configured.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from _cli import assert_one_line_error, run_script
from _server import free_port, start_serve
from conftest_services import service_unavailable
from ctxkeep.errors import ConfigError
from ctxkeep.server import create_app

redis = pytest.importorskip(
    "redis", reason="redis-py is not installed: pip install 'ctxkeep[redis]'"
)

pytestmark = pytest.mark.redis

VOLATILE = ("--save", "", "--appendonly", "no")
NO_CONFIG = ("--rename-command", "CONFIG", "")  # as managed services do
LOSES = "would lose every API key"


@pytest.fixture
def redis_with(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start ``redis-server SETTINGS`` on a free port (files under ``tmp_path``): its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        service_unavailable("redis-server is not installed")
    started: list[subprocess.Popen[bytes]] = []

    def start(*settings: str) -> str:
        port = free_port()
        folder = tmp_path / f"redis-{port}"
        folder.mkdir()
        command = [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]
        proc = subprocess.Popen([*command, *settings], stdout=subprocess.DEVNULL)
        started.append(proc)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {settings}") from None
                time.sleep(0.02)
            finally:
                client.close()
        return url

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize(
    "settings",
    [
        ("--appendonly", "yes", "--save", ""),
        ("--appendonly", "no", "--save", "3600 1"),
        ("--appendonly", "yes", "--save", "", *NO_CONFIG),  # AOF is seen in INFO
        ("--save", "60 1", "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"),
    ],
    ids=["aof", "rdb", "aof-without-config", "volatile-lru"],
)
def test_a_redis_that_keeps_the_keys_is_served(
    redis_with: Callable[..., str], settings: tuple[str, ...]
) -> None:
    app = create_app(redis_with(*settings), require_persistent_keys=True)
    app.state.ctxkeep.close()


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        (VOLATILE, 'has neither AOF (appendonly no) nor RDB snapshots (save "")'),
        ((*VOLATILE, *NO_CONFIG), "could not be checked: CONFIG GET was refused"),
        (
            ("--appendonly", "yes", "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"),
            "evicts any key when memory runs short (maxmemory-policy allkeys-lru)",
        ),
    ],
    ids=["volatile", "unreadable", "allkeys-eviction"],
)
def test_a_redis_that_could_lose_the_keys_is_refused(
    redis_with: Callable[..., str], settings: tuple[str, ...], why: str
) -> None:
    url = redis_with(*settings)
    with pytest.raises(ConfigError) as info:
        create_app(f"{url}?prefix=p:", require_persistent_keys=True)
    message = str(info.value)
    assert (
        f"the Redis at {url[len('redis://') :]}, which holds the API keys (p:server:keys)"
        in message
    )
    assert why in message and LOSES in message and "--allow-volatile-redis" in message
    create_app(url).state.ctxkeep.close()  # the library's own default does not check


def test_serve_refuses_a_volatile_redis_unless_allowed(redis_with: Callable[..., str]) -> None:
    url = redis_with(*VOLATILE)
    refused = run_script("serve", "--db", url, "--port", str(free_port()))
    assert refused.returncode == 2
    assert_one_line_error(refused.stderr, "refusing to serve", "has neither AOF", LOSES)
    proc, base = start_serve(
        "--db", url, "--allow-volatile-redis", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        assert httpx.get(f"{base}/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_starts_on_a_persistent_redis(redis_with: Callable[..., str]) -> None:
    url = redis_with("--appendonly", "yes")
    proc, base = start_serve("--db", url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert httpx.get(f"{base}/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)

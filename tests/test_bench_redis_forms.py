"""bench/redis_forms.py: a tiny run sends every form of an add and a pop (ctxkeep's own
scripts on a session ctxkeep made, with the arguments the backend sends), reads the session
back through ctxkeep as it was, and leaves no key behind. Figures, never timings.
"""

from __future__ import annotations

from pathlib import Path

import redis

from _bench import run
from conftest_services import redis_url

__all__ = ["redis_url"]


def test_a_tiny_run_measures_every_form_and_leaves_no_key(redis_url: str, tmp_path: Path) -> None:
    client = redis.Redis.from_url(redis_url)
    before = {k for k in client.scan_iter(match="ctxkeep-forms:*")}
    figures, printed = run(
        "redis_forms.py", "--url", redis_url, "--ops", "4", "--rounds", "2", out=tmp_path / "f.json"
    )
    forms = {(f["op"], f["form"]) for f in figures}
    assert forms == {
        (op, form) for op in ("add", "pop") for form in ("script", "watch", "watch-min", "peer")
    }
    for f in figures:
        assert len(f["wall_us"]) == 2 and all(t > 0 for t in f["wall_us"])
        assert all(s >= 0 for s in f["server_us"])
    assert "ratio" in printed
    assert {k for k in client.scan_iter(match="ctxkeep-forms:*")} == before

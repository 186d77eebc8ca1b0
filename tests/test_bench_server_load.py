"""bench/server_load.py: a tiny load run end to end against a real ``ctxkeep serve`` (and the
in-process anchor) reports no errors and nothing lost, and its integrity check catches each
kind of loss it exists to catch. Timings are never asserted.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

import pytest

from _bench import BENCH, run
from conftest_services import postgres_url  # noqa: F401

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")


def test_a_tiny_load_run_has_no_errors_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    data, _ = run(
        "server_load.py",
        *("--clients", "3", "--requests", "10", "--backends", "sqlite", "--targets", "server"),
        out=out,
        timeout=120,
    )
    r = data["results"]["sqlite"]["server"]
    assert r["errors"] == 0, r["error_samples"]
    assert r["integrity"] == dict.fromkeys(r["integrity"], 0)
    assert r["requests"] == 30
    # every kind ran: own appends, shared appends (a note and a tool unit), prompt builds
    assert {k: v["count"] for k, v in r["kinds"].items()} == {
        "append": 18,
        "append shared": 6,
        "prompt": 6,
    }
    assert r["server_log_problems"] == []


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import server_load

    return server_load


def test_the_in_process_anchor_runs_the_same_scripts_and_loses_nothing(
    bench: ModuleType, tmp_path: Path
) -> None:
    plan = bench.Plan(
        [bench.client_script(c, 10, prompt_every=5, shared_every=4, shared=True) for c in (0, 1)],
        group=2,
    )
    r = bench.run_in_process(f"sqlite:///{tmp_path / 'anchor.db'}", plan)
    assert r["errors"] == 0, r["error_samples"]
    assert r["integrity"] == dict.fromkeys(r["integrity"], 0)
    assert {k: v["count"] for k, v in r["kinds"].items()} == {
        "append": 12,
        "append shared": 4,
        "prompt": 4,
    }


@pytest.mark.slow
def test_a_run_for_a_duration_cuts_the_scripts_and_checks_what_was_sent(
    bench: ModuleType, tmp_path: Path
) -> None:
    # scripts of 5,000 requests each, cut at a fifth of a second: no client sends them all
    plan = bench.Plan(
        [
            bench.client_script(c, 5_000, prompt_every=5, shared_every=4, shared=True)
            for c in (0, 1)
        ],
        group=2,
        duration=0.2,
    )
    r = bench.run_in_process(f"sqlite:///{tmp_path / 'anchor.db'}", plan)
    assert r["errors"] == 0, r["error_samples"]
    assert r["integrity"] == dict.fromkeys(r["integrity"], 0)
    assert 0 < r["requests"] < 10_000
    assert r["messages_per_s"] > 0


def _msg(tag: str, mid: str, **kw: Any) -> dict[str, Any]:
    return {"id": mid, "metadata": {"bench": tag}, "tool_calls": [], **kw}


def test_the_integrity_check_counts_each_kind_of_failure(bench: ModuleType) -> None:
    acked = {
        "0:0": ("s", "a"),
        "0:1": ("s", "b"),
        "0:2": ("s", "c"),  # never stored: lost
        "1:0": ("s", "d"),
        "1:1": ("s", "e"),
        "2:0": ("s", "f"),
    }
    sent = {tag: "s" for tag in [*acked, "2:1"]}
    stored = {
        "s": [
            _msg("0:1", "b"),
            _msg("0:0", "a"),  # after 0:1: out of order
            _msg("1:0", "d", tool_calls=[{"id": "t1"}]),
            _msg("1:1", "x", tool_call_id="t9"),  # answers another call; id not the acked one
            _msg("1:1", "x"),  # twice
            _msg("2:1", "g"),  # no 2xx for it
        ]
    }
    counts = bench.check_integrity(acked, sent, stored, {"2:0"})
    assert counts == {
        "lost": 1,
        "duplicated": 1,
        "out_of_order": 2,  # 0:0 after 0:1, and 1:1 after 1:1
        "unacknowledged": 1,
        "id_changed": 2,
        "wrong_session": 0,
        "broken_units": 1,
        "evicted": 1,
    }


def test_a_clients_script_mixes_every_kind_and_tags_each_message_once(bench: ModuleType) -> None:
    script = bench.client_script(7, 40, prompt_every=5, shared_every=4, shared=True)
    kinds = [op.kind for op in script]
    assert kinds.count("prompt") == 8
    assert kinds.count("append shared") == 8
    tags = [m.metadata["bench"] for op in script for m in op.messages]
    assert tags == [f"7:{n}" for n in range(len(tags))]
    units = [op.messages for op in script if op.shared and len(op.messages) > 1]
    assert units, "no tool call with its result among the shared appends"
    for unit in units:
        assert {tc.id for tc in unit[0].tool_calls} == {m.tool_call_id for m in unit[1:]}


def test_the_worker_spread_counts_each_pids_posts_and_the_tail_after_the_first_ran_out(
    bench: ModuleType,
) -> None:
    def line(pid: int, method: str = "POST") -> str:
        return json.dumps({"event": "request", "method": method, "pid": pid})

    lines = [line(1), line(2), line(1), "INFO: not a request", line(2), line(2, "GET")]
    lines += [line(1), line(1), line(1)]
    # pid 2 answered its last POST 4th of 7: the 3 after it pid 1 answered alone
    assert bench.worker_spread(lines) == {"requests": [5, 2], "tail": 3 / 7}
    assert bench.worker_spread(lines, method="GET") == {"requests": [1], "tail": 0.0}
    assert bench.worker_spread([]) == {}


def test_the_machine_ceiling_runs_each_round_alone_then_n_at_once(bench: ModuleType) -> None:
    got = bench.machine_ceiling(2, 2, loops=20_000)
    assert got["processes"] == 2 and got["rounds"] == 2
    assert len(got["shares"]) == 2 and all(s > 0 for s in got["shares"])
    assert got["min"] <= got["median"] <= got["max"]


def test_the_database_cpu_is_the_named_databases_backends_alone(
    bench: ModuleType,
    postgres_url: str,  # noqa: F811
) -> None:
    """The ``db`` CPU column (issue 28): the backends of the bench's database, read by their
    process titles; another database's work is not in it.
    """
    psycopg = pytest.importorskip("psycopg")
    pytest.importorskip("psutil")
    if bench._local_database(postgres_url) is None:
        pytest.skip("the test PostgreSQL is not on this machine: its processes cannot be read")
    names = [f"ctxkeep_cpu_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f"CREATE DATABASE {name}")
    try:
        mine, other = (urlparse(postgres_url)._replace(path=f"/{n}").geturl() for n in names)
        assert bench._local_database(mine) == names[0]
        with psycopg.connect(mine) as busy, psycopg.connect(other) as idle:
            idle.execute("SELECT 1")
            before = bench._cpu(os.getpid(), names[0])
            busy.execute("SELECT count(*) FROM generate_series(1, 3000000)")
            after = bench._cpu(os.getpid(), names[0])
            quiet = bench._cpu(os.getpid(), names[1])
            idle.execute("SELECT 1")
            assert bench._cpu(os.getpid(), names[1])["database"] - quiet["database"] < 0.05
        assert after["database"] - before["database"] > 0.1
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_only_a_local_postgresql_url_names_a_database(bench: ModuleType) -> None:
    assert bench._local_database("postgresql://postgres@127.0.0.1:5432/bench_x") == "bench_x"
    assert bench._local_database("postgresql://u@localhost/d?sslmode=disable") == "d"
    assert bench._local_database("postgresql://u@db.example.com/d") is None
    assert bench._local_database("sqlite:///tmp/x.db") is None

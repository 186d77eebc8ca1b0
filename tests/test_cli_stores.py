"""Which store a CLI command works on (issue 27, items 3, 5 and 6).

* ``--tenant NAME`` reads and writes the store a served tenant uses: the demo's session shows
  in the API, the API's sessions show in ``ctxkeep sessions list``, episodes alike.
* Commands that only read never create a store: a mistyped ``--db`` is an error, not an empty
  listing from a file just made.
* The demo's next-step hint keeps ``--db`` and ``--tenant``, and with ``memory://`` does not
  point at a session that is gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from _cli import assert_one_line_error
from ctxkeep.cli import main
from ctxkeep.episodic import open_episodic
from ctxkeep.sessions import open_memory


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def srv(tmp_path: Path) -> Path:
    """An empty folder for a server's files (tmp_path also holds the isolated HOME)."""
    folder = tmp_path / "srv"
    folder.mkdir()
    return folder


# -- read-only commands never create a store ----------------------------------------------------

READERS = [
    ["sessions", "list"],
    ["sessions", "show", "3f2a9c01"],
    ["sessions", "delete", "3f2a9c01"],
    ["memory", "search", "timezone", "--embedder", "hash"],
    ["memory", "forget", "--session", "s1", "--embedder", "hash"],
    ["keys", "list"],
    ["keys", "revoke", "3f2a9c01b7de"],
]


@pytest.mark.parametrize("argv", READERS, ids=lambda a: " ".join(a[:2]))
def test_a_reader_on_a_missing_store_says_so_and_creates_nothing(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    assert main([*argv, "--db", "sqlite:///nonexistent-dir/x.db"]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        "the store sqlite:///nonexistent-dir/x.db does not exist",
        "check --db",
        "created nothing",
    )
    assert tree(tmp_path) == before


def test_the_reported_command_exits_nonzero_through_the_console_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _cli import run_script

    monkeypatch.chdir(tmp_path)
    done = run_script("sessions", "list", "--db", "sqlite:///nonexistent-dir/x.db")
    assert done.returncode != 0
    assert "does not exist" in done.stderr and done.stdout == ""
    assert not (tmp_path / "nonexistent-dir").exists()


def test_a_reader_on_the_missing_default_store_names_it_and_creates_nothing(
    isolated_environment: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree(isolated_environment)
    assert main(["sessions", "list"]) == 2
    assert_one_line_error(capsys.readouterr().err, "there is no store yet at", "ctxkeep demo")
    assert tree(isolated_environment) == before


def test_a_reader_on_an_existing_store_lists_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'x.db'}"
    with open_memory(db) as mem:
        mem.create_session("a1")
    assert [s["agent_id"] for s in run_json(capsys, "sessions", "list", "--db", db, "--json")] == [
        "a1"
    ]


def test_writers_still_create_their_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'new' / 'x.db'}"
    assert main(["memory", "add", "a timezone bug", "--session", "s1", "--db", db,
                 "--embedder", "hash"]) == 0  # fmt: skip
    assert (tmp_path / "new" / "x.db").is_file()


# -- --tenant: the CLI and the service share one store per tenant -------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A server on a SQLite file: its --db URL, its base URL, and a key of tenant acme."""
    from _server import ThreadedServer
    from ctxkeep.server import create_app

    db = f"sqlite:///{tmp_path / 'srv' / 'ctxkeep.db'}"
    app = create_app(db, embedder="hash")
    server = ThreadedServer(app).start()
    try:
        _, key = app.state.ctxkeep.keys.create("acme")
        yield db, server.url, key
    finally:
        server.stop()


def test_the_demo_stores_into_a_tenant_that_the_api_shows(
    served: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxkeep.client import RemoteMemory

    db, url, key = served
    assert main(["demo", "--steps", "5", "--json", "--db", db, "--tenant", "acme"]) == 0
    capsys.readouterr()
    with RemoteMemory(url, key) as remote:
        (info,) = remote.list_sessions()
        assert info.agent_id == "demo-agent"
        assert remote.get_messages(info.session_id)


def test_sessions_list_with_a_tenant_shows_the_api_sessions(
    served: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxkeep.client import RemoteMemory

    db, url, key = served
    with RemoteMemory(url, key) as remote:
        sid = remote.create_session("api-agent")
        remote.add_message(sid, "user", "hello from the API")
    listed = run_json(capsys, "sessions", "list", "--db", db, "--tenant", "acme", "--json")
    assert [(s["session_id"], s["agent_id"]) for s in listed] == [(sid, "api-agent")]
    shown = run_json(capsys, "sessions", "show", sid, "--db", db, "--tenant", "acme", "--json")
    assert [m["content"] for m in shown["messages"]] == ["hello from the API"]
    # the server's own sessions (no tenant) are another store
    assert main(["sessions", "list", "--db", db, "--json"]) in (0, 2)
    out = capsys.readouterr().out
    assert sid not in out


def test_an_episode_added_for_a_tenant_is_found_by_the_api(
    served: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    db, url, key = served
    argv = ["--db", db, "--tenant", "acme", "--embedder", "hash"]
    assert (
        main(["memory", "add", "The flaky test was a timezone bug.", "--session", "s1", *argv]) == 0
    )
    capsys.readouterr()
    answer = httpx.post(
        f"{url}/v1/episodes/search",
        json={"query": "timezone bug", "top_k": 3},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert [h["episode"]["session_id"] for h in answer.json()["hits"]] == ["s1"]
    hits = run_json(capsys, "memory", "search", "timezone", *argv, "--json")
    assert [h["session_id"] for h in hits] == ["s1"]


def test_a_tenant_with_no_store_yet_is_an_error_that_creates_nothing(
    srv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{srv / 'ctxkeep.db'}"
    assert main(["sessions", "list", "--db", db, "--tenant", "acme"]) == 2
    assert_one_line_error(capsys.readouterr().err, "tenant 'acme' has no store at")
    assert tree(srv) == []


def test_the_tenant_store_is_where_the_server_keeps_it(srv: Path) -> None:
    db = f"sqlite:///{srv / 'ctxkeep.db'}"
    assert main(["demo", "--steps", "3", "--json", "--db", db, "--tenant", "acme"]) == 0
    assert tree(srv) == ["ctxkeep.tenants", "ctxkeep.tenants/acme.db"]
    with open_memory(f"sqlite:///{srv / 'ctxkeep.tenants' / 'acme.db'}") as mem:
        assert [s.agent_id for s in mem.list_sessions()] == ["demo-agent"]


def test_a_tenant_on_memory_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "3", "--db", "memory://", "--tenant", "acme"]) == 2
    assert_one_line_error(capsys.readouterr().err, "memory:// server keeps its tenants")


def test_a_bad_tenant_name_is_refused(srv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{srv / 'ctxkeep.db'}"
    assert main(["demo", "--steps", "3", "--db", db, "--tenant", "ACME"]) == 2
    assert_one_line_error(capsys.readouterr().err, "invalid tenant name 'ACME'")
    assert tree(srv) == []


def test_episodes_of_a_tenant_on_redis_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["memory", "add", "x", "--session", "s1", "--embedder", "hash"]
    assert main([*argv, "--db", "redis://127.0.0.1:6379/0", "--tenant", "acme"]) == 2
    assert_one_line_error(capsys.readouterr().err, "redis:// server keeps no episodes")


def test_memory_import_from_a_tenant_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'ctxkeep.db'}"
    tenant_db = f"sqlite:///{tmp_path / 'ctxkeep.tenants' / 'acme.db'}"
    with open_memory(tenant_db) as mem:
        sid = mem.create_session("a1")
        mem.add_message(sid, "user", "Why did CI fail?")
        mem.add_message(sid, "assistant", "A timezone bug in the date parser.")
    argv = ["memory", "import", "--from-session", sid, "--db", db, "--tenant", "acme"]
    assert main([*argv, "--embedder", "hash"]) == 0
    assert "imported 1 new episode(s)" in capsys.readouterr().out
    with open_episodic(tenant_db, embedder="hash") as store:
        assert store.count() == 1


# -- the demo's next step ------------------------------------------------------------------------


def test_the_demo_hint_keeps_db_and_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'my dir' / 'ctxkeep.db'}"
    assert main(["demo", "--steps", "3", "--db", db, "--tenant", "acme"]) == 0
    err = capsys.readouterr().err
    with open_memory(f"sqlite:///{tmp_path / 'my dir' / 'ctxkeep.tenants' / 'acme.db'}") as mem:
        (info,) = mem.list_sessions()
    expected = f"  ctxkeep sessions show {info.session_id} --db '{db}' --tenant acme"
    assert expected in err.splitlines()
    # and the hinted command works as printed
    assert main(["sessions", "show", info.session_id, "--db", db, "--tenant", "acme"]) == 0


def test_the_demo_hint_without_db_names_no_db(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "3"]) == 0
    hint = capsys.readouterr().err.splitlines()[-1]
    sid = hint.split()[-1]
    assert hint == f"  ctxkeep sessions show {sid}"
    assert main(["sessions", "show", sid]) == 0


def test_the_demo_on_memory_says_the_session_is_gone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "3", "--db", "memory://"]) == 0
    err = capsys.readouterr().err
    assert "sessions show" not in err
    assert "is gone with this process" in err
    assert "ctxkeep demo --db sqlite:///demo.db" in err

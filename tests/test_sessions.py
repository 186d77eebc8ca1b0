"""Session memory beyond the conformance suite: the in-process store's own sweeper and LRU,
record versions, the SQLite schema guard, configuration, the CLI."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxkeep import MemoryConfig, Message, SessionMemory, default_memory_config, open_memory
from ctxkeep.cli import main
from ctxkeep.errors import ConfigError, CorruptRecordError, InvalidMessageError, SchemaVersionError
from ctxkeep.sessions.records import (
    RECORD_VERSION,
    full_record,
    message_to_record,
    record_to_message,
    trim_point,
)
from ctxkeep.sessions.sqlite import SQLiteBackend


def test_session_memory_sweeper_reclaims_idle_sessions() -> None:
    evicted = []
    store = SessionMemory(max_size=None, ttl=0.2, on_evict=evicted.append)
    try:
        sid = store.create_session("a")
        store.add_message(sid, "user", "soon gone")
        deadline = time.time() + 5
        while store.count() and time.time() < deadline:
            time.sleep(0.05)
        assert store.count() == 0
        assert evicted and evicted[0].reason == "ttl"
        assert evicted[0].messages[0].content == "soon gone"
        assert [m.content for m in store.archived_messages(sid)] == ["soon gone"]
    finally:
        store.close()
    assert not store.sweeper_running


def test_session_memory_evicts_least_recently_accessed_beyond_max_size() -> None:
    store = SessionMemory(max_size=2)
    a = store.create_session("a")
    time.sleep(0.01)
    b = store.create_session("b")
    time.sleep(0.01)
    store.get_messages(a)
    time.sleep(0.01)
    store.create_session("c")
    assert store.has_session(a) and not store.has_session(b)
    assert len(store) == 2


def test_session_memory_get_returns_copies() -> None:
    store = SessionMemory()
    sid = store.create_session("a")
    store.add_message(sid, "user", "x", metadata={"k": [1]})
    got = store.get_messages(sid)
    got[0].metadata["k"].append(2)  # type: ignore[attr-defined]
    assert store.get_messages(sid)[0].metadata == {"k": [1]}
    assert store.get(sid).message_count == 1


def test_open_memory_memory_url_is_a_session_memory_with_the_config_bounds() -> None:
    config = MemoryConfig(max_history=5, session_ttl=30, max_sessions=7)
    with open_memory("memory://", config) as mem:
        assert isinstance(mem, SessionMemory)
        assert mem.config == config and mem.sweeper_running
    assert not mem.sweeper_running


def test_session_memory_takes_config_or_bounds_not_both() -> None:
    with pytest.raises(ConfigError):
        SessionMemory(max_size=3, config=MemoryConfig())


def test_unreferenced_session_memory_is_collected_and_its_sweeper_stops() -> None:
    import gc
    import weakref

    store = SessionMemory(ttl=0.05)
    ref = weakref.ref(store)
    thread = store._sweeper
    del store
    gc.collect()
    assert ref() is None
    assert thread is not None
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_session_memory_sweeper_stops_at_interpreter_exit() -> None:
    code = (
        "from ctxkeep import SessionMemory\n"
        "s = SessionMemory(ttl=3600)\n"
        "assert s.sweeper_running\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok"


def test_newer_record_version_is_refused() -> None:
    record = message_to_record(Message("user", "hi"))
    record["v"] = RECORD_VERSION + 1
    with pytest.raises(SchemaVersionError):
        record_to_message(record)


def test_version_0_record_is_upgraded() -> None:
    legacy = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    m = record_to_message(legacy)
    assert m.tool_calls[0].name == "f" and m.tool_calls[0].arguments == "{}"


@pytest.mark.parametrize(
    "corrupt", ['{"role": "user"', '{"v": 1}', '{"v": 1, "role": "x"}', "[1, 2]"]
)
def test_corrupt_record_is_a_typed_error(corrupt: str) -> None:
    with pytest.raises(CorruptRecordError):
        record_to_message(corrupt)


def test_non_json_metadata_is_refused_not_stringified() -> None:
    with pytest.raises(InvalidMessageError):
        message_to_record(Message("user", "x", metadata={"t": (1, 2)}))
    with pytest.raises(InvalidMessageError):
        message_to_record(Message("user", "x", metadata={"s": {1, 2}}))


@pytest.mark.parametrize(
    "fields",
    [
        {"metadata": {"ok": [1]}, "extra": {"t": (1, 2)}},  # the field after a sound one
        {"metadata": {"n": {1: "int key"}}},
        {"content": [{"type": "text", "text": "x", "pair": (1, 2)}]},  # content parts
        {"content": [{"type": "text", "text": "x"}], "extra": {"t": (1, 2)}},
    ],
)
def test_every_field_that_json_would_change_is_refused(fields: dict[str, object]) -> None:
    # Each field that holds something but a string is read back by itself (the content too,
    # where it is parts: then the whole record): any one that comes back changed refuses.
    with pytest.raises(InvalidMessageError, match="cannot be stored"):
        message_to_record(Message("user", **{"content": "text", **fields}))


def test_fields_json_keeps_as_they_are_are_stored() -> None:
    m = Message(
        "user",
        [{"type": "text", "text": "x"}],
        metadata={"a": [1, {"b": None}], "c": 1.5},
        extra={"d": "e"},
    )
    record = message_to_record(m)
    assert json.loads(json.dumps(record)) == record
    assert record_to_message(json.dumps(record)) == m


def test_sqlite_written_by_a_newer_ctxkeep_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    SQLiteBackend(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE ctxkeep_meta SET value = '99' WHERE key = 'sessions'")
    with pytest.raises(SchemaVersionError, match="newer ctxkeep"):
        SQLiteBackend(path)


def test_sqlite_file_of_the_first_release_is_upgraded_with_its_sessions(tmp_path: Path) -> None:
    from ctxkeep.sessions.sqlite import MIGRATIONS

    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as conn:  # the first release's layout, as it wrote it
        conn.executescript(MIGRATIONS[0])
        conn.execute(  # seqs 1 and 2 were trimmed: seq 3 is the oldest held
            "INSERT INTO ctxkeep_sessions VALUES ('s1', 'a', NULL, '{}', 1.0, 2.0, 1, 4, '[]')"
        )
        record = json.dumps(full_record(message_to_record(Message("user", "kept"))))
        conn.execute("INSERT INTO ctxkeep_messages VALUES ('s1', 3, ?)", (record,))
        conn.execute("PRAGMA user_version=1")
    with open_memory(f"sqlite:///{path}", MemoryConfig(session_ttl=None)) as mem:
        info = mem.get_session("s1")
        assert info.first_seq == 3 and len(info.generation) == 32
        assert [m.content for m in mem.get_messages("s1")] == ["kept"]
        mem.add_message("s1", "user", "new")
        assert [m.content for m in mem.build_prompt_messages("s1")] == ["kept", "new"]


def test_sqlite_schema_setup_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with open_memory(f"sqlite:///{path}") as mem:
        sid = mem.create_session("a")
        mem.add_message(sid, "user", "kept")
    for _ in range(3):
        with open_memory(f"sqlite:///{path}") as mem:
            assert [m.content for m in mem.get_messages(sid)] == ["kept"]


def test_trim_point_never_starts_on_a_tool_result() -> None:
    roles = ["user", "assistant", "tool", "tool", "assistant", "tool", "user"]
    for keep in range(1, 8):
        cut = trim_point(roles, keep)
        assert cut == len(roles) or roles[cut] != "tool"
        assert len(roles) - cut <= keep


@pytest.mark.parametrize(
    "kwargs",
    [{"max_history": 0}, {"max_sessions": -1}, {"session_ttl": 0}, {"max_history": 1.5}],
)
def test_bad_config_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        MemoryConfig(**kwargs)  # type: ignore[arg-type]


def test_default_config_is_bounded() -> None:
    c = default_memory_config()
    assert c.max_history and c.session_ttl and c.max_sessions


def test_unsupported_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        open_memory("mongodb://x")


def test_default_url_is_the_embedded_sqlite_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_DB", str(tmp_path / "default.db"))
    with open_memory() as mem:
        mem.create_session("a")
    assert (tmp_path / "default.db").exists()


def test_cli_demo_stores_session_and_sessions_show_displays_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXKEEP_DB", str(tmp_path / "cli.db"))
    assert main(["demo", "--steps", "10", "--json"]) == 0
    capsys.readouterr()
    assert main(["sessions", "--json", "list"]) == 0
    sessions = json.loads(capsys.readouterr().out)
    assert len(sessions) == 1 and sessions[0]["agent_id"] == "demo-agent"
    sid = sessions[0]["session_id"]
    assert main(["sessions", "--json", "show", sid]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["messages"]) == sessions[0]["message_count"]
    assert main(["sessions", "show", sid, "--last", "3"]) == 0
    assert "demo-agent" in capsys.readouterr().out
    assert main(["sessions", "list"]) == 0
    assert sid in capsys.readouterr().out
    assert main(["sessions", "delete", sid]) == 0
    assert main(["sessions", "delete", sid]) == 1
    assert main(["sessions", "show", sid]) == 2


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_session_at_max_history_is_trimmed_from_its_head_without_reading_it_all(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An agent run of 300 messages (tool units of 1-3 parallel calls) kept to 40: after each
    # append the session holds what trim_point leaves of everything appended (the whole
    # units), and no append reads the whole session back.
    from ctxkeep import ToolCall
    from ctxkeep.sessions.records import trim_point

    url = "memory://" if store == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    limit = 40
    with open_memory(url, MemoryConfig(max_history=limit, max_sessions=None)) as mem:
        sid = mem.create_session("a")
        reads: list[object] = []  # whole-session reads made by appends
        whole, add = mem.backend.read, mem.add_message
        appending = [False]

        def read(*a: object, **k: object) -> object:
            if appending[0]:
                reads.append(a)
            return whole(*a, **k)  # type: ignore[arg-type]

        def add_message(*a: object, **k: object) -> object:
            appending[0] = True
            try:
                return add(*a, **k)  # type: ignore[arg-type]
            finally:
                appending[0] = False

        monkeypatch.setattr(mem.backend, "read", read)
        monkeypatch.setattr(mem, "add_message", add_message)
        kept: list[str] = []
        step = 0
        while step < 100:
            step += 1
            mem.add_message(sid, "user", f"go {step}")
            kept.append(f"go {step}")
            calls = [ToolCall(f"c{step}_{k}", "run", "{}") for k in range(1 + step % 3)]
            mem.add_message(sid, "assistant", f"calling {step}", tool_calls=calls)
            kept.append(f"calling {step}")
            for c in calls:
                mem.add_message(sid, "tool", f"out {c.id}", tool_call_id=c.id)
                kept.append(f"out {c.id}")
                roles = ["tool" if k.startswith("out") else "x" for k in kept]
                kept = kept[trim_point(roles, limit) :]
                assert [m.text for m in mem.get_messages(sid)] == kept
            roles = ["tool" if k.startswith("out") else "x" for k in kept]
            kept = kept[trim_point(roles, limit) :]
        assert [m.text for m in mem.get_messages(sid)] == kept
        assert len(kept) <= limit
        assert len(mem.archived_messages(sid)) + len(kept) == 2 * 100 + sum(
            1 + s % 3 for s in range(1, 101)
        )
    assert reads == []


def test_minted_message_ids_are_random_version_4_uuids() -> None:
    """The ids an append gives messages that have none stay what ``uuid4().hex`` gave (made
    now without the UUID object): 32 hex digits of a version-4, RFC 4122 UUID, all distinct.
    """
    import uuid

    memory = open_memory("memory://")
    try:
        sid = memory.create_session("a")
        stored = memory.add_messages(sid, [Message("user", str(i)) for i in range(200)])
        ids = [m.id for m in stored]
        assert len(set(ids)) == len(ids)
        for message_id in ids:
            assert message_id is not None
            parsed = uuid.UUID(hex=message_id)
            assert parsed.hex == message_id
            assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
    finally:
        memory.close()

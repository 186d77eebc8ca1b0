"""The agent loop: run_agent against a local OpenAI-compatible server, through the gate and the
builder, with large tool outputs; and a run killed with SIGKILL that resumes without repeating
a finished tool call."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from _agent_script import make_read_chunk, scripted_model
from _llm_servers import Reply, ScriptedServer, openai_completion, running
from ctxkeep import from_openai, get_counter, open_checkpoints, open_memory, validate_sequence
from ctxkeep.agent import run_agent, tool_spec
from ctxkeep.errors import ConfigError, InvalidTypeError
from ctxkeep.llm import ChatClient
from test_llm_openai import assert_valid_request

WINDOW = 16_000
RESERVE = 1_000


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with running(scripted_model(50)) as s:
        yield s


def _client(server: ScriptedServer, memory: object) -> ChatClient:
    return ChatClient(
        "gpt-4o",
        api_key="test",
        base_url=server.url + "/v1",
        memory=memory,
        context_window=WINDOW,
        max_output_tokens=RESERVE,
    )


def test_a_50_step_run_stays_inside_the_window_with_valid_sequences(
    server: ScriptedServer, tmp_path: Path
) -> None:
    memory = open_memory(f"sqlite:///{tmp_path}/a.db")
    client = _client(server, memory)
    run = run_agent(
        None, "read every chunk", [make_read_chunk()], client=client, max_steps=60,
        agent_id="reader",
    )  # fmt: skip
    assert run.status == "done" and run.steps == 51 and run.tool_calls == 50
    assert run.answer is not None and run.answer.content == "read 50 chunks"
    counter = get_counter("gpt-4o")
    bodies = server.bodies()
    assert len(bodies) == 51
    for body in bodies:
        assert_valid_request(body)  # the SDK's own request type, no unknown key
        msgs = from_openai(body["messages"])
        validate_sequence(msgs)
        tools_text = json.dumps(body.get("tools", []))
        assert counter.count_messages(msgs) + counter.count_text(tools_text) <= WINDOW - RESERVE
    stored = memory.get_messages(run.session_id)
    validate_sequence(stored)
    calls = [m for m in stored if m.role == "tool"]
    assert len(calls) == 50 and all(m.parent_id and m.turn_id for m in calls)


def test_each_step_saves_a_checkpoint_of_the_agent(server: ScriptedServer) -> None:
    memory = open_memory("memory://")
    store = open_checkpoints("memory://")
    run = run_agent(
        None, "read", [make_read_chunk()], client=_client(server, memory), max_steps=5,
        agent_id="reader", checkpoints=store,
    )  # fmt: skip
    assert run.status == "max_steps" and run.steps == 5
    latest = store.latest("reader")
    assert latest is not None and latest.session_id == run.session_id
    assert latest.state.checkpoint == {"status": "running", "step": 5, "session_id": run.session_id}
    assert latest.state.context == {"task": "read"}
    assert len(store.history("reader", limit=100)) >= 5


def test_a_stopped_run_continues_in_its_session_when_started_again(
    server: ScriptedServer,
) -> None:
    memory = open_memory("memory://")
    store = open_checkpoints("memory://")
    kwargs = {"client": _client(server, memory), "agent_id": "reader", "checkpoints": store}
    first = run_agent(None, "read", [make_read_chunk()], max_steps=10, **kwargs)  # type: ignore[arg-type]
    second = run_agent(None, "read", [make_read_chunk()], max_steps=60, **kwargs)  # type: ignore[arg-type]
    assert first.status == "max_steps" and second.status == "done"
    assert second.resumed and second.session_id == first.session_id
    assert second.tool_calls == 40 and second.steps == 51
    third = run_agent(None, "read", [make_read_chunk()], max_steps=3, **kwargs)  # type: ignore[arg-type]
    assert not third.resumed and third.session_id != first.session_id  # a finished run


def test_a_tool_that_raises_answers_the_model_with_its_error(server: ScriptedServer) -> None:
    def read_chunk(n: int) -> str:
        """Fails."""
        raise OSError("disk on fire")

    memory = open_memory("memory://")
    run = run_agent(
        None, "read", [read_chunk], client=_client(server, memory), max_steps=2, agent_id="x"
    )
    results = [m for m in memory.get_messages(run.session_id) if m.role == "tool"]
    assert results and results[0].content == "error: OSError: disk on fire"


def test_tool_spec_derives_the_function_definition_from_the_signature() -> None:
    def search(query: str, limit: int = 5, exact: bool = False) -> str:
        """Search the notes.

        Longer text is not part of the description.
        """
        return query

    spec = tool_spec(search)
    assert spec["function"]["name"] == "search"
    assert spec["function"]["description"] == "Search the notes."
    assert spec["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer"},
            "exact": {"type": "boolean"},
        },
        "required": ["query"],
    }


def test_bad_arguments_are_typed_errors(server: ScriptedServer) -> None:
    client = _client(server, open_memory("memory://"))
    with pytest.raises(InvalidTypeError):
        run_agent(None, "t", [42], client=client)  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        run_agent(None, "", [], client=client)
    with pytest.raises(ConfigError):
        run_agent(None, "t", [], client=client, max_steps=0)
    with pytest.raises(ConfigError):
        run_agent(None, "t", [], client=ChatClient("gpt-4o", api_key="k", base_url=server.url))


def _committed_results(db: Path) -> set[str]:
    with open_memory(f"sqlite:///{db}") as memory:
        sid = memory.get_latest_session_for_agent("reader")
        if sid is None:
            return set()
        return {m.tool_call_id for m in memory.get_messages(sid) if m.role == "tool"}  # type: ignore[misc]


def _start(script: Path, url: str, db: Path, log: Path, steps: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(script.parent)}
    return subprocess.Popen(
        [sys.executable, str(script), url, str(db), str(log), str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)  # reaps it and closes its pipes


def _log(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _wait_for_calls(proc: subprocess.Popen[bytes], log: Path, n: int) -> None:
    """Until the log has ``n`` lines (the run is mid-way) or the process ended."""
    deadline = time.monotonic() + 60
    while len(_log(log)) < n and proc.poll() is None:
        assert time.monotonic() < deadline, "the agent made no progress"
        time.sleep(0.005)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_without_repeating_a_finished_call(
    tmp_path: Path,
) -> None:
    steps = 30
    db, log = tmp_path / "agent.db", tmp_path / "calls.log"
    script = Path(__file__).with_name("_agent_script.py")
    rng = random.Random(7)
    kills = 0
    with running(scripted_model(steps)) as server:
        # Kill the run mid-way, several times; after each restart no call whose result was
        # stored before the kill runs again.
        while True:
            finished = _committed_results(db)
            mark = len(_log(log))
            proc = _start(script, server.url, db, log, steps)
            _wait_for_calls(proc, log, mark + rng.randint(1, 5))
            time.sleep(rng.uniform(0, 0.02))  # anywhere in the next call
            if proc.poll() is not None or kills == 5:
                out, err = proc.communicate(timeout=180)
                assert proc.returncode == 0, err.decode()
                break
            _kill(proc)
            kills += 1
            rerun = set(_log(log)[mark:])
            assert not finished & rerun, f"finished calls ran again: {finished & rerun}"
        rerun = set(_log(log)[mark:])
        assert not finished & rerun, f"finished calls ran again: {finished & rerun}"
        run = json.loads(out.decode().strip().splitlines()[-1])
        assert run["status"] == "done" and run["resumed"] is True
    assert kills == 5
    with open_memory(f"sqlite:///{db}") as memory:
        sid = memory.get_latest_session_for_agent("reader")
        assert sid is not None
        stored = memory.get_messages(sid)
        validate_sequence(stored)
        ids = [m.tool_call_id for m in stored if m.role == "tool"]
        assert ids == [f"call_{n}" for n in range(1, steps + 1)]


def test_the_investigate_dir_example_answers_from_the_files(tmp_path: Path) -> None:
    import importlib.util

    example = Path(__file__).resolve().parents[1] / "examples" / "investigate_dir.py"
    spec = importlib.util.spec_from_file_location("investigate_dir", example)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "README").write_text("This project brews coffee.\n")

    def model(body: dict[str, object]) -> Reply:
        seen = [m for m in body["messages"] if m["role"] == "tool"]  # type: ignore[index,union-attr]
        if not seen:
            call = ("c1", "list_files", "{}")
        elif len(seen) == 1:
            call = ("c2", "read_file", json.dumps({"path": seen[0]["content"].split()[0]}))
        else:
            return Reply(body=openai_completion(f"It says: {seen[1]['content'].strip()}"))
        return Reply(body=openai_completion(None, tool_calls=[call]))

    with running(model) as server:
        client = _client(server, open_memory(f"sqlite:///{tmp_path}/i.db"))
        run = module.run(tmp_path / "proj", "What is it?", client)
    assert run.status == "done"
    assert run.answer.content == "It says: This project brews coffee."

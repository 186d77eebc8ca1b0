"""``ctxkeep mcp``, driven by the official MCP SDK's own client over stdio and streamable HTTP.

Every server here is the real console script in a subprocess (``ctxkeep mcp ...``) on a real
store: a SQLite file, and in one test Redis. The episodic store uses the hash embedder (tests
only: it knows no meaning) to keep the runtime down; relevance needs lexical evidence anyway.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult

from _cli import assert_one_line_error, ctxkeep_script, run_script
from conftest_services import redis_prefix_factory, redis_url  # noqa: F401 - fixtures
from ctxkeep.artifacts import artifact_ref
from ctxkeep.cli import main

BIG_OUTPUT = "\n".join(
    f"row {i}: status=ok latency={i * 7 % 113}ms region=eu-{i % 5}" for i in range(400)
)


def server_args(db: str, *extra: str) -> list[str]:
    """The arguments of ``ctxkeep mcp`` over ``db`` (the hash embedder: fast, tests only)."""
    return ["mcp", "--db", db, "--embedder", "hash", *extra]


def stdio_server(db: str, *extra: str) -> StdioServerParameters:
    """``ctxkeep mcp --db DB`` spawned by the client, with this test's environment."""
    return StdioServerParameters(
        command=ctxkeep_script(), args=server_args(db, *extra), env=dict(os.environ)
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ctxkeep.db'}"


@pytest.fixture
def http_server(db: str, tmp_path: Path) -> Iterator[str]:
    """``ctxkeep mcp --transport http`` on a free port over ``db``; yields its URL."""
    port = free_port()
    log = (tmp_path / "mcp-http.log").open("w")
    proc = subprocess.Popen(
        [ctxkeep_script(), *server_args(db, "--transport", "http", "--port", str(port))],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "mcp-http.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not listen within 60 s"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
        log.close()
    assert code == 0, (tmp_path / "mcp-http.log").read_text()  # a clean stop on SIGTERM


def run(body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool call that must succeed; its structured content."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """A tool call that must be an error result; its text."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert result.is_error, result
    return " ".join(getattr(c, "text", "") for c in result.content)


async def tool_session(client: Client) -> str:
    """A session with a user question, a tool call, its big result and an answer."""
    sid = (await call(client, "create_session", agent_id="agent-1", task_id="t1"))["session_id"]
    await call(client, "append_message", session_id=sid, role="user", content="How is the fleet?")
    await call(
        client,
        "append_message",
        session_id=sid,
        role="assistant",
        tool_calls=[  # OpenAI's form; stored in ctxkeep's
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "status", "arguments": '{"all": true}'},
            }
        ],
    )
    await call(
        client, "append_message", session_id=sid, role="tool", content=BIG_OUTPUT, tool_call_id="c1"
    )
    await call(client, "append_message", session_id=sid, role="assistant", content="All ok.")
    await call(client, "append_message", session_id=sid, role="user", content="And latency?")
    return str(sid)


def test_the_session_tools_round_trip_over_stdio(db: str) -> None:
    async def body() -> None:
        async with Client(stdio_server(db)) as client:
            sid = await tool_session(client)
            page = await call(client, "read_session", session_id=sid, offset=1, limit=2)
            assert page["total"] == 5
            assert [m["role"] for m in page["messages"]] == ["assistant", "tool"]
            assert page["messages"][0]["tool_calls"] == [
                {"id": "c1", "name": "status", "arguments": '{"all": true}'}
            ]
            assert page["messages"][1]["content"] == BIG_OUTPUT
            assert page["next_offset"] == 3
            last = await call(client, "read_session", session_id=sid, offset=3)
            assert [m["content"] for m in last["messages"]] == ["All ok.", "And latency?"]
            assert last["next_offset"] is None
            listed = await call(client, "list_sessions", agent_id="agent-1")
            assert [s["session_id"] for s in listed["sessions"]] == [sid]
            assert listed["sessions"][0]["message_count"] == 5
            assert (await call(client, "list_sessions", agent_id="nobody"))["sessions"] == []
            other = (await call(client, "create_session", agent_id="agent-2"))["session_id"]
            first = await call(client, "list_sessions", limit=1)
            assert [s["session_id"] for s in first["sessions"]] == [other]  # newest first
            second = await call(client, "list_sessions", limit=1, offset=first["next_offset"])
            assert [s["session_id"] for s in second["sessions"]] == [sid]
            assert second["next_offset"] is None

    run(body)
    # The CLI reads what the MCP server stored: the same store.
    with_cli = subprocess.run(
        [ctxkeep_script(), "sessions", "list", "--db", db, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert [s["agent_id"] for s in json.loads(with_cli.stdout)] == ["agent-2", "agent-1"]


def test_build_prompt_holds_the_budget_and_the_compressed_output_reads_back(db: str) -> None:
    async def body() -> None:
        async with Client(stdio_server(db)) as client:
            sid = await tool_session(client)
            whole = await call(client, "build_prompt", session_id=sid, max_prompt_tokens=100_000)
            roles = [m["role"] for m in whole["messages"]]
            assert roles == ["user", "assistant", "tool", "assistant", "user"]
            assert whole["dropped"] == [] and whole["compressed"] == []

            built = await call(
                client,
                "build_prompt",
                session_id=sid,
                max_prompt_tokens=900,
                reserve_output_tokens=200,
                system="You watch a fleet.",
            )
            assert built["prompt_tokens"] <= 700 == built["prompt_budget"]
            assert built["messages"][0] == {"role": "system", "content": "You watch a fleet."}
            assert built["messages"][-1]["content"] == "And latency?"
            (compressed,) = built["compressed"]
            assert compressed["role"] == "tool"
            assert compressed["tokens_after"] < compressed["tokens_before"]
            ref = compressed["artifact_ref"]
            assert ref.startswith("sha256:")

            full = await client.read_resource(f"ctxkeep://artifacts/{ref}")
            assert full.contents[0].text == BIG_OUTPUT  # type: ignore[union-attr]

    run(body)


def test_a_refused_build_stores_no_artifact(db: str) -> None:
    async def body() -> None:
        async with Client(stdio_server(db)) as client:
            sid = (await call(client, "create_session", agent_id="a"))["session_id"]
            await call(client, "append_message", session_id=sid, role="user", content="Status?")
            await call(
                client,
                "append_message",
                session_id=sid,
                role="assistant",
                content=None,
                tool_calls=[{"id": "c1", "name": "status", "arguments": "{}"}],
            )
            await call(
                client,
                "append_message",
                session_id=sid,
                role="tool",
                content=BIG_OUTPUT,
                tool_call_id="c1",
            )
            uri = f"ctxkeep://artifacts/{artifact_ref(BIG_OUTPUT)}"
            refusal = await refused(
                client,
                "build_prompt",
                session_id=sid,
                max_prompt_tokens=60,
                reserve_output_tokens=0,
                system="Watch every ship. " * 20,
            )
            assert "BudgetExceededError" in refusal and "60 tokens" in refusal
            with pytest.raises(MCPError, match="ArtifactNotFoundError"):
                await client.read_resource(uri)

            built = await call(
                client,
                "build_prompt",
                session_id=sid,
                max_prompt_tokens=900,
                reserve_output_tokens=0,
            )
            assert [c["artifact_ref"] for c in built["compressed"]] == [artifact_ref(BIG_OUTPUT)]
            full = await client.read_resource(uri)
            assert full.contents[0].text == BIG_OUTPUT  # type: ignore[union-attr]

    run(body)


def test_the_session_resource_reads_the_current_history(db: str) -> None:
    async def body() -> None:
        async with Client(stdio_server(db)) as client:
            templates = await client.list_resource_templates()
            assert {t.uri_template for t in templates.resource_templates} == {
                "ctxkeep://sessions/{session_id}",
                "ctxkeep://artifacts/{ref}",
            }
            sid = (await call(client, "create_session", agent_id="a"))["session_id"]
            await call(client, "append_message", session_id=sid, role="user", content="one")
            first = await client.read_resource(f"ctxkeep://sessions/{sid}")
            assert first.contents[0].mime_type == "application/json"
            doc = json.loads(first.contents[0].text)  # type: ignore[union-attr]
            assert doc["session"]["session_id"] == sid
            assert [m["content"] for m in doc["messages"]] == ["one"]

            parts = [{"type": "text", "text": "two"}]
            await call(client, "append_message", session_id=sid, role="assistant", content=parts)
            again = json.loads(
                (await client.read_resource(f"ctxkeep://sessions/{sid}")).contents[0].text  # type: ignore[union-attr]
            )
            assert [m["content"] for m in again["messages"]] == ["one", parts]

            with pytest.raises(MCPError, match="SessionNotFoundError"):
                await client.read_resource("ctxkeep://sessions/no-such-session")
            with pytest.raises(MCPError, match="ArtifactNotFoundError"):
                await client.read_resource("ctxkeep://artifacts/sha256:" + "0" * 64)
            with pytest.raises(MCPError, match="not an artifact ref"):
                await client.read_resource("ctxkeep://artifacts/etc-passwd")
            assert (await call(client, "list_sessions"))["sessions"][0]["session_id"] == sid

    run(body)


def test_remember_recall_and_forget_over_http(http_server: str) -> None:
    async def body() -> None:
        async with Client(http_server) as client:
            tz = await call(
                client,
                "remember",
                session_id="s1",
                task_goal="fix CI",
                summary="The flaky test was a timezone bug in the date parser.",
                agent_id="ci-bot",
                metadata={"repo": "api"},
            )
            await call(
                client, "remember", session_id="s2", summary="Deploys go out on Tuesdays only."
            )
            await call(
                client, "remember", session_id="s3", summary="The cache keys include the locale."
            )
            again = await call(
                client,
                "remember",
                session_id="s1",
                task_goal="fix CI",
                summary="The flaky test was a timezone bug in the date parser.",
            )
            assert again["episode_id"] == tz["episode_id"]  # stored once

            result = await client.call_tool("recall", {"query": "why was the test flaky?"})
            assert isinstance(result, CallToolResult) and not result.is_error
            text = result.content[0].text  # type: ignore[union-attr]
            assert text.startswith("### Prior Historical Context")
            assert "timezone bug" in text and "Tuesdays" not in text
            hits = result.structured_content["hits"]  # type: ignore[index]
            assert [h["episode_id"] for h in hits] == [tz["episode_id"]]
            assert hits[0]["metadata"] == {"repo": "api"} and hits[0]["agent_id"] == "ci-bot"

            nothing = await client.call_tool("recall", {"query": "banana smoothie recipe"})
            assert nothing.content[0].text == "No relevant episode."  # type: ignore[union-attr]
            assert nothing.structured_content == {"context": "", "hits": []}  # type: ignore[union-attr]

            assert await call(client, "forget", episode_id=tz["episode_id"][:8]) == {"forgotten": 1}
            left = await call(client, "recall", query="why was the test flaky?")
            assert left["hits"] == []
            assert "EpisodeNotFoundError" in await refused(
                client, "forget", episode_id=tz["episode_id"]
            )
            assert await call(client, "forget", session_id="s2") == {"forgotten": 1}

    run(body)


def test_bad_arguments_are_error_results_and_the_server_keeps_answering(db: str) -> None:
    async def body() -> None:
        async with Client(stdio_server(db)) as client:
            sid = (await call(client, "create_session", agent_id="a"))["session_id"]
            cases = [
                ("read_session", {"session_id": "nope"}, "SessionNotFoundError"),
                (
                    "append_message",
                    {"session_id": "nope", "role": "user", "content": "x"},
                    "SessionNotFoundError",
                ),
                (
                    "append_message",
                    {"session_id": sid, "role": "wizard", "content": "x"},
                    "UnknownRoleError",
                ),
                (
                    "append_message",
                    {"session_id": sid, "role": "tool", "content": "42", "tool_call_id": "c9"},
                    "OrphanToolResultError",
                ),
                (
                    "append_message",
                    {
                        "session_id": sid,
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c1"}],
                    },
                    "InvalidMessageError",
                ),
                ("read_session", {"session_id": sid, "limit": 0}, "ConfigError"),
                ("read_session", {"session_id": sid, "offset": -1}, "ConfigError"),
                ("read_session", {"session_id": sid, "limit": "many"}, "limit"),
                ("read_session", {}, "session_id"),
                ("list_sessions", {"limit": 0}, "ConfigError"),
                ("create_session", {"agent_id": ""}, "InvalidMessageError"),
                ("create_session", {"agent_id": "a", "session_id": sid}, "SessionExistsError"),
                ("build_prompt", {"session_id": sid, "max_prompt_tokens": 1}, "ConfigError"),
                (
                    "build_prompt",
                    {"session_id": sid, "encoding": "klingon"},
                    "UnknownEncodingError",
                ),
                ("remember", {"session_id": "s", "summary": "  "}, "InvalidMessageError"),
                ("recall", {"query": "x", "top_k": 0}, "ConfigError"),
                ("recall", {"query": "x", "min_score": "nan"}, "min_score"),
                ("forget", {}, "ConfigError"),
                ("no_such_tool", {}, "Unknown tool"),
            ]
            for tool, arguments, named in cases:
                text = await refused(client, tool, **arguments)
                assert named in text, (tool, arguments, text)
            # Nothing was stored by the refused calls, and the server still answers.
            assert (await call(client, "read_session", session_id=sid))["total"] == 0
            stored = await call(client, "append_message", session_id=sid, role="user", content="hi")
            assert stored["message"]["content"] == "hi"

    run(body)


def test_two_clients_see_the_same_store(db: str, http_server: str) -> None:
    async def body() -> None:
        async with Client(http_server) as one, Client(http_server) as two:
            sid = (await call(one, "create_session", agent_id="shared"))["session_id"]
            await call(two, "append_message", session_id=sid, role="user", content="from two")
            await call(one, "append_message", session_id=sid, role="assistant", content="one")
            await call(two, "remember", session_id=sid, summary="The shared store works.")
            async with Client(stdio_server(db)) as three:  # another process, same file
                page = await call(three, "read_session", session_id=sid)
                assert [m["content"] for m in page["messages"]] == ["from two", "one"]
                found = await call(three, "recall", query="does the shared store work?")
                assert [h["session_id"] for h in found["hits"]] == [sid]
                await call(three, "append_message", session_id=sid, role="user", content="three")
            assert (await call(one, "read_session", session_id=sid))["total"] == 3

    run(body)


def test_a_tenant_store_is_the_one_the_cli_reads(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def body() -> None:
        async with Client(stdio_server(db, "--tenant", "acme")) as client:
            sid = (await call(client, "create_session", agent_id="tenant-agent"))["session_id"]
            await call(client, "append_message", session_id=sid, role="user", content="hello")

    run(body)
    assert main(["sessions", "list", "--db", db, "--tenant", "acme", "--json"]) == 0
    assert [s["agent_id"] for s in json.loads(capsys.readouterr().out)] == ["tenant-agent"]
    assert not Path(db.removeprefix("sqlite:///")).exists()  # not in --db's own store


@pytest.mark.redis
def test_sessions_on_redis(redis_prefix_factory: Callable[[], str], redis_url: str) -> None:  # noqa: F811
    url = f"{redis_url}?prefix={redis_prefix_factory()}"

    async def body() -> None:
        async with Client(stdio_server(url)) as client:
            sid = await tool_session(client)
            assert (await call(client, "read_session", session_id=sid))["total"] == 5
            built = await call(
                client,
                "build_prompt",
                session_id=sid,
                max_prompt_tokens=900,
                reserve_output_tokens=200,
            )
            ref = built["compressed"][0]["artifact_ref"]
            full = await client.read_resource(f"ctxkeep://artifacts/{ref}")
            assert full.contents[0].text == BIG_OUTPUT  # type: ignore[union-attr]
            assert "redis:// store keeps no episodes" in await refused(
                client, "remember", session_id=sid, summary="x"
            )
            assert (await call(client, "list_sessions"))["sessions"][0]["session_id"] == sid

    run(body)


def test_importing_ctxkeep_does_not_import_mcp() -> None:
    code = "import sys, ctxkeep, ctxkeep.cli; assert 'mcp' not in sys.modules, 'mcp imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_the_sdk_the_command_names_the_extra() -> None:
    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "from ctxkeep.cli import main\n"
        "sys.exit(main(['mcp', '--db', 'memory://']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctxkeep: error: mcp is not installed")
    assert "ctxkeep[mcp]" in lines[0]


def test_a_store_it_cannot_open_is_one_line_and_exit_2() -> None:
    done = run_script("mcp", "--db", "ftp://example.org/x")
    assert done.returncode == 2
    assert_one_line_error(done.stderr, "unsupported memory URL")


def test_a_busy_port_is_one_line_naming_the_option(db: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_script(*server_args(db, "--transport", "http", "--port", str(port)))
    assert done.returncode == 2
    assert_one_line_error(done.stderr, f"port {port}", "--port")

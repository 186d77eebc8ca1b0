"""The documentation site (``docs/``, ``mkdocs.yml``) builds, covers the public API, and its
code blocks run as pasted (issue 29).

Code blocks. Every fenced block of every page under ``docs/`` is one of:

* ``python``: run, in order with the page's bash blocks, as its own ``python -`` process;
* ``bash``: run in the page's one bash session (``set -euo pipefail``), in a fresh directory
  with the test's isolated HOME, the venv's ``bin`` first on PATH, ``OPENAI_BASE_URL`` pointing
  at a local OpenAI-compatible server (``_llm_servers``) and ``OPENAI_API_KEY=test``;
* ``json``, ``toml``, ``yaml``: parsed (configuration shown, not run);
* ``text``: output or a layout, not run.

What the test changes in the pasted text, all in :func:`adapted`: the ports the docs give the
service (8765) and the MCP server over HTTP (8766) are the test's own free ports, a
``ctxkeep serve ... &`` line gets ``--port`` and a wait for ``/healthz`` after it, a
``ctxkeep mcp ... &`` line a wait for its port, and ``pip install`` lines are not run (the
venv is the test's; each names the clone, ``.`` or ``'.[extra]'``, and
:func:`test_every_pip_command_names_real_extras` checks the extras exist). A block that cannot
run offline (it needs a real provider's key, or a program that is not ctxkeep's) is marked on
the line before its fence with ``<!-- docs: not run (the reason) -->``; such blocks are still
compiled (python) and there may be at most :data:`MAX_NOT_RUN` of them.

The reference. Every name in ``ctxkeep.__all__`` and in the ``__all__`` of the public
subpackages (:data:`PUBLIC_MODULES`) has an entry: a ``::: path`` directive of mkdocstrings in
``docs/reference/`` for that path or, for an object several modules export (anything but a
string, number or tuple), for the same object under another path. ``mkdocs build --strict``
then renders every directive (an entry it cannot resolve fails the build) with no broken link
or reference.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MAX_NOT_RUN = 4

PUBLIC_MODULES = [
    "ctxkeep",
    "ctxkeep.artifacts",
    "ctxkeep.builder",
    "ctxkeep.checkpoints",
    "ctxkeep.client",
    "ctxkeep.episodic",
    "ctxkeep.episodic.index",
    "ctxkeep.evaluation",
    "ctxkeep.fabric",
    "ctxkeep.integrations.langchain",
    "ctxkeep.integrations.langgraph",
    "ctxkeep.integrations.openai_agents",
    "ctxkeep.integrations.pydantic_ai",
    "ctxkeep.llm",
    "ctxkeep.mcp_server",
    "ctxkeep.messages",
    "ctxkeep.prune",
    "ctxkeep.responses",
    "ctxkeep.server",
    "ctxkeep.sessions",
    "ctxkeep.testing.contract",
    "ctxkeep.tokens",
]
"""The modules whose ``__all__`` the reference covers: the package, its public subpackages and
the public modules users import from (internal modules, ``_``-prefixed or not re-exported for
users, such as ``ctxkeep.cache`` and ``ctxkeep.foldstate``, are not listed)."""

FENCE = re.compile(
    r"^(?:<!-- docs: not run \((?P<reason>[^)]+)\) -->\n)?"
    r"```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```",
    re.M | re.S,
)
DIRECTIVE = re.compile(r"^::: ([\w.]+)\s*$", re.M)
PIP = re.compile(r"^\s*pip install (.+)$", re.M)


def pages() -> list[Path]:
    found = sorted(DOCS.rglob("*.md"))
    assert found
    return found


def blocks(page: Path) -> list[tuple[str, str, str | None]]:
    """``(language, code, reason not run or None)`` of every fenced block of a page, in order."""
    text = page.read_text(encoding="utf-8")
    out = [(m["lang"], m["code"], m["reason"]) for m in FENCE.finditer(text)]
    assert text.count("```") == 2 * len(out), f"{page}: a fence the test does not parse"
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVICE_PORT = "8765"
MCP_PORT = "8766"
"""The ports the docs give ``ctxkeep serve`` and ``ctxkeep mcp --transport http``."""


def adapted(code: str, ports: dict[str, int], *, bash: bool) -> str:
    """A block's text as the test runs it (see the module docstring): the docs' ports are the
    test's free ones; in bash, ``pip install`` is not run and a server started in the
    background (``... &``) is waited for.
    """
    for doc_port, port in ports.items():
        code = code.replace(f"127.0.0.1:{doc_port}", f"127.0.0.1:{port}")
        code = code.replace(f"--port {doc_port}", f"--port {port}")
    if not bash:
        return code
    code = PIP.sub(r"true  # not run here: pip install \1", code)
    service, mcp = ports[SERVICE_PORT], ports[MCP_PORT]
    code = re.sub(
        r"^ctxkeep serve(.*?) &(.*)$",
        rf"ctxkeep serve\1 --port {service} &\2\nwait_for http://127.0.0.1:{service}/healthz",
        code,
        flags=re.M,
    )
    return re.sub(r"^(ctxkeep mcp .*&.*)$", rf"\1\nwait_for_port {mcp}", code, flags=re.M)


WAIT_FOR = """wait_for() {
  python - "$1" <<'PYEOF'
import sys, time, httpx
for _ in range(600):
    try:
        if httpx.get(sys.argv[1]).status_code == 200:
            break
    except httpx.HTTPError:
        pass
    time.sleep(0.1)
else:
    raise SystemExit(f'{sys.argv[1]} did not answer')
PYEOF
}
wait_for_port() {
  python - "$1" <<'PYEOF'
import socket, sys, time
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
else:
    raise SystemExit(f'nothing listens on port {sys.argv[1]}')
PYEOF
}"""


def session_script(page: Path, ports: dict[str, int]) -> str:
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT", WAIT_FOR]
    for n, (language, code, reason) in enumerate(blocks(page)):
        if reason is not None or language not in ("python", "bash"):
            continue
        lines.append(f"echo '== {page.name} block {n} ({language})'")
        if language == "bash":
            lines.append(adapted(code, ports, bash=True))
        else:
            lines += ["python - <<'PYEOF'", adapted(code, ports, bash=False), "PYEOF"]
    return "\n".join(lines) + "\n"


def runnable_pages() -> list[Path]:
    return [p for p in pages() if any(lang in ("python", "bash") for lang, _, _ in blocks(p))]


@pytest.mark.parametrize("page", runnable_pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_every_code_block_of_the_page_runs_as_pasted(
    page: Path, isolated_environment: Path, tmp_path: Path
) -> None:
    from _llm_servers import openai_default, running

    work = tmp_path / "work"
    work.mkdir()
    ports = {SERVICE_PORT: free_port(), MCP_PORT: free_port()}
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OPENAI_API_KEY": "test",
        "PYTHONUNBUFFERED": "1",
    }
    with running(openai_default) as model:
        env["OPENAI_BASE_URL"] = model.url + "/v1"
        done = subprocess.run(
            ["bash", "-c", session_script(page, ports)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_configuration_blocks_parse() -> None:
    parsers: dict[str, Any] = {"json": json.loads, "toml": tomllib.loads, "yaml": yaml.safe_load}
    seen = 0
    for page in pages():
        for language, code, _ in blocks(page):
            if language in parsers:
                parsers[language](code)
                seen += 1
    assert seen


def test_every_block_has_a_known_language_and_few_are_not_run() -> None:
    not_run = []
    for page in pages():
        for language, code, reason in blocks(page):
            assert language in ("python", "bash", "json", "toml", "yaml", "text"), (page, language)
            if reason is not None:
                assert reason.strip(), page
                if language == "python":
                    compile(code, str(page), "exec")
                not_run.append((page.name, reason))
    assert len(not_run) <= MAX_NOT_RUN, not_run


def test_every_pip_command_names_real_extras() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    commands = [
        m
        for page in pages()
        for lang, code, _ in blocks(page)
        if lang == "bash"
        for m in PIP.findall(code)
    ]
    assert commands
    for command in commands:
        targets = [t.strip("'\"") for t in command.split("&&")[0].split() if not t.startswith("-")]
        assert targets, command
        for target in targets:
            match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
            assert match, f"install from the clone ('.' or '.[extra]'): {command}"
            for extra in (match[1] or "").split(","):
                assert not extra or extra in extras, f"no extra {extra!r}: {command}"


def directives() -> list[str]:
    found = [
        d
        for page in sorted((DOCS / "reference").glob("*.md"))
        for d in DIRECTIVE.findall(page.read_text(encoding="utf-8"))
    ]
    assert found
    return found


def resolve(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"{path} names nothing")


def test_every_public_name_has_a_reference_entry() -> None:
    paths = set(directives())
    objects = {id(resolve(p)) for p in paths}
    missing = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            path = f"{module_name}.{name}"
            obj = getattr(module, name)
            shared = not isinstance(obj, str | bytes | int | float | tuple | frozenset)
            if path not in paths and not (shared and id(obj) in objects):
                missing.append(path)
    assert not missing, f"no ::: entry in docs/reference/ for {missing}"


def test_every_reference_entry_is_listed_once() -> None:
    found = directives()
    assert len(found) == len(set(found)), sorted({d for d in found if found.count(d) > 1})


@pytest.mark.slow
def test_the_site_builds_strict_with_every_entry_rendered(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    html = "".join(p.read_text(encoding="utf-8") for p in (site / "reference").rglob("*.html"))
    unrendered = [d for d in directives() if f'id="{d}"' not in html]
    assert not unrendered, unrendered
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "Current figures" in benchmarks and "--8&lt;--" not in benchmarks


def mcp_configurations() -> list[dict[str, Any]]:
    """Every ``mcpServers`` entry of the docs' JSON blocks."""
    found = [
        server
        for page in pages()
        for language, code, _ in blocks(page)
        if language == "json" and "mcpServers" in code
        for server in json.loads(code)["mcpServers"].values()
    ]
    assert found
    return found


def test_the_mcp_client_configurations_start_the_server(
    isolated_environment: Path, tmp_path: Path
) -> None:
    """Each configuration the MCP page gives a client (Claude Desktop, Claude Code, Cursor)
    starts ``ctxkeep mcp`` over stdio as that client would, and the server lists its tools; a
    URL configuration names the endpoint ``ctxkeep mcp --transport http`` serves by default.
    """
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from ctxkeep.cli.mcp import DEFAULT_PORT

    async def tools(command: str, args: list[str]) -> set[str]:
        server = StdioServerParameters(
            command=command, args=args, env=dict(os.environ), cwd=tmp_path
        )
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return {tool.name for tool in (await session.list_tools()).tools}

    venv_bin = Path(sys.executable).parent
    for server in mcp_configurations():
        if "url" in server:
            assert server["url"] == f"http://127.0.0.1:{DEFAULT_PORT}/mcp"
            continue
        command = server["command"].replace("/path/to/venv/bin/", f"{venv_bin}/")
        if "/" not in command:
            command = str(venv_bin / command)
        assert {"remember", "recall", "build_prompt"} <= anyio.run(tools, command, server["args"])

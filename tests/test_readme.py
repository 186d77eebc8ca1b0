"""The README runs as pasted: every code block, in order, in one bash session at the clone's
root, as a new user would paste them into one terminal (issue 27, "Done when").

The session runs with the test's isolated HOME (so the embedded SQLite file, the keys and the
examples' files are the test's own) and the venv's ``bin`` first on PATH. What the test changes
in the pasted text, and why, is all in :func:`adapted`:

* ``pip install X`` runs as ``pip install --dry-run --no-deps X``: pip resolves the command
  from the clone and builds its metadata (an unknown extra or a form that only works once
  published fails here), but the test's venv is not changed;
* ``python -m pytest`` collects one module instead of running the suite inside one of its
  tests (CI runs this very command as its test step);
* the servers the README names by port (the service's 8765, a model server's 8000) are the
  test's own on free ports: the service is the real ``ctxkeep serve``, the model server an
  OpenAI-compatible one (``_llm_servers``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)
INLINE_PIP = re.compile(r"`(pip install [^`]+)`")


def blocks() -> list[tuple[str, str]]:
    """``(language, code)`` of every bash and python block, in order."""
    found = BLOCK.findall(README.read_text(encoding="utf-8"))
    assert found
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def adapted(code: str, *, service_port: int, model_url: str) -> str:
    """A block's text with the test's servers and the substitutions of the module docstring."""
    code = code.replace("127.0.0.1:8765", f"127.0.0.1:{service_port}")
    code = code.replace("http://127.0.0.1:8000/v1", model_url)
    code = re.sub(r"\bpip install ", "pip install --dry-run --no-deps ", code)
    collect = "--collect-only -q -n 0 -p no:cacheprovider tests/test_exported_members.py"
    code = code.replace("python -m pytest", f"python -m pytest {collect}")
    return re.sub(
        r"^ctxkeep serve(.*?) &(.*)$",
        rf"ctxkeep serve\1 --port {service_port} &\2\nwait_for_service",
        code,
        flags=re.M,
    )


def session_script(service_port: int, model_url: str) -> str:
    """The bash session: every block in order, then the README's inline pip commands."""
    lines = [
        "set -euo pipefail",
        "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
        "wait_for_service() {",
        "  python - <<'PYEOF'",
        "import time, httpx",
        "for _ in range(600):",
        "    try:",
        f"        if httpx.get('http://127.0.0.1:{service_port}/healthz').status_code == 200:",
        "            break",
        "    except httpx.HTTPError:",
        "        time.sleep(0.1)",
        "else:",
        "    raise SystemExit('ctxkeep serve did not start')",
        "PYEOF",
        "}",
    ]
    for n, (language, code) in enumerate(blocks()):
        code = adapted(code, service_port=service_port, model_url=model_url)
        lines.append(f"echo '== README block {n} ({language})'")
        if language == "bash":
            lines.append(code)
        else:
            lines += ["python - <<'PYEOF'", code, "PYEOF"]
    for command in INLINE_PIP.findall(README.read_text(encoding="utf-8")):
        lines.append(adapted(command, service_port=service_port, model_url=model_url))
    return "\n".join(lines) + "\n"


@pytest.mark.slow
def test_every_readme_block_runs_as_pasted_in_one_session(isolated_environment: Path) -> None:
    from _llm_servers import openai_default, running

    service_port = free_port()
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OPENAI_API_KEY": "test",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OPENAI_BASE_URL", None)
    with running(openai_default) as model:
        env["OPENAI_BASE_URL"] = model.url + "/v1"  # the README's ChatClient block finds it
        done = subprocess.run(
            ["bash", "-c", session_script(service_port, model.url + "/v1")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        asked = len(model.requests)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "does not provide the extra" not in output  # every extra named exists
    assert asked >= 2, "the README's agent blocks never called the model"
    # the block that lists the tenant's sessions shows the CLI's demo and the API's agent-1
    n = next(i for i, (_, code) in enumerate(blocks()) if "sessions list --tenant" in code)
    listing = done.stdout.split(f"== README block {n} (", 1)[1].split("== README block", 1)[0]
    assert "demo-agent" in listing and "agent-1" in listing


def test_the_readme_installs_from_the_clone() -> None:
    """Every pip command names the clone (``.``): ``ctxkeep[x]`` works only once published."""
    text = README.read_text(encoding="utf-8")
    commands = INLINE_PIP.findall(text) + [
        line for _, code in blocks() for line in code.splitlines() if "pip install" in line
    ]
    assert commands
    for command in commands:
        targets = command.split("pip install", 1)[1].split("&&")[0].split()
        targets = [t.strip("'\"") for t in targets if not t.startswith("-")]
        assert targets and all(t == "." or t.startswith(".[") for t in targets), command


def test_readme_has_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "pip install . && ctxkeep demo" in text
    assert "pip install -e '.[test]' && python -m pytest" in text


@pytest.mark.parametrize("extra", ["server", "plot", "static"])
def test_the_extras_the_readme_names_exist(extra: str) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(rf"^{extra} = \[", pyproject, re.M)
    assert f"[{extra}]" in README.read_text(encoding="utf-8")

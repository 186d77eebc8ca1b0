"""``--tenant`` on a PostgreSQL server (issue 27, item 3): the CLI reaches the tenant's schema,
and its episodes through the schema that holds pgvector, as the server does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from conftest_services import postgres_schema_factory, postgres_url  # noqa: F401
from ctxkeep.cli import main

pytestmark = pytest.mark.postgres
TENANT = "acme"


@pytest.fixture
def served(postgres_schema_factory: Callable[[], str]) -> Iterator[tuple[str, str, str]]:  # noqa: F811
    """A server on a fresh schema: its --db URL, its base URL, and a key of tenant acme."""
    import psycopg

    from _server import ThreadedServer
    from ctxkeep.server import create_app

    db = postgres_schema_factory()
    find = "SELECT 1 FROM pg_namespace WHERE nspname = 'ctxkeep_extensions'"
    with psycopg.connect(db, autocommit=True) as conn:
        had_extensions = conn.execute(find).fetchone() is not None
    app = create_app(db, embedder="hash")
    server = ThreadedServer(app).start()
    try:
        _, key = app.state.ctxkeep.keys.create(TENANT)
        yield db, server.url, key
    finally:
        server.stop()
        base = db.rsplit("search_path%3D", 1)[1]
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{base}_tenant_{TENANT}" CASCADE')
            if not had_extensions:  # left there, later stores elsewhere miss the vector type
                conn.execute("DROP SCHEMA IF EXISTS ctxkeep_extensions CASCADE")


def test_the_cli_and_the_api_share_a_postgres_tenant(
    served: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from ctxkeep.client import RemoteMemory

    db, url, key = served
    where = ["--db", db, "--tenant", TENANT]
    assert main(["demo", "--steps", "3", "--json", *where]) == 0
    capsys.readouterr()
    with RemoteMemory(url, key) as remote:
        assert [s.agent_id for s in remote.list_sessions()] == ["demo-agent"]
        sid = remote.create_session("api-agent")
    assert main(["sessions", "list", "--json", *where]) == 0
    listed = {s["session_id"]: s["agent_id"] for s in json.loads(capsys.readouterr().out)}
    assert listed[sid] == "api-agent" and sorted(listed.values()) == ["api-agent", "demo-agent"]

    text = "The flaky test was a timezone bug."
    assert main(["memory", "add", text, "--session", "s1", "--embedder", "hash", *where]) == 0
    capsys.readouterr()
    answer = httpx.post(
        f"{url}/v1/episodes/search",
        json={"query": "timezone bug", "top_k": 3},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert [h["episode"]["session_id"] for h in answer.json()["hits"]] == ["s1"]

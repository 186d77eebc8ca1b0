"""Read-only commands never create a store on Redis or PostgreSQL either (issue 27, item 5).

Opening a store sets it up: on PostgreSQL ``ctxkeep_meta`` and the store's tables in the URL's
schema, on Redis the schema versions under the key prefix. So a command that only reads
(``sessions list/show/delete``, ``memory search/forget``, ``memory import --from-session``,
``keys list/revoke``) looks first, without writing, and on an empty prefix, schema or database
stops with one line saying the store does not exist; afterwards nothing is there. On a store
that exists the commands work as before, and the commands that write still create.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse, urlunparse

import pytest

from _cli import assert_one_line_error
from conftest_services import (  # noqa: F401
    postgres_url,
    redis_prefix_factory,
    redis_url,
    with_schema,
)
from ctxkeep.cli import main
from ctxkeep.sessions import open_memory

HASH = ("--embedder", "hash")
READERS = [
    ["sessions", "list"],
    ["sessions", "show", "3f2a9c01"],
    ["sessions", "delete", "3f2a9c01"],
    ["memory", "search", "timezone", *HASH],
    ["memory", "forget", "--session", "s1", *HASH],
    ["keys", "list"],
    ["keys", "revoke", "3f2a9c01b7de"],
]
TENANT_READERS = READERS[:5]
"""The readers that take ``--tenant`` (keys belong to the server, not to a tenant)."""
SESSION_READERS = READERS[:3]
"""The readers of sessions (a Redis server keeps no episodes, for any tenant)."""


def ids(argv: list[str]) -> str:
    return " ".join(argv[:2])


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# -- Redis ----------------------------------------------------------------------------------------


def redis_keys(url: str, prefix: str) -> list[str]:
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return sorted(client.scan_iter(match=f"{prefix}*", count=500))
    finally:
        client.close()


@pytest.fixture
def prefix(redis_prefix_factory: Callable[[], str]) -> str:  # noqa: F811
    """A fresh key prefix, holding nothing."""
    return redis_prefix_factory()


@pytest.mark.redis
@pytest.mark.parametrize("argv", READERS, ids=ids)
def test_a_reader_on_an_empty_redis_prefix_says_so_and_writes_nothing(
    argv: list[str],
    redis_url: str,  # noqa: F811
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"{redis_url}?prefix={prefix}"
    assert main([*argv, "--db", db]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        f"the store {db} does not exist",
        f"no ctxkeep keys under the key prefix '{prefix}' of the Redis at 127.0.0.1:6379/0",
        "check --db",
        "created nothing",
    )
    assert redis_keys(redis_url, prefix) == []


@pytest.mark.redis
@pytest.mark.parametrize("argv", SESSION_READERS, ids=ids)
def test_a_reader_on_a_redis_tenant_with_no_store_writes_nothing(
    argv: list[str],
    redis_url: str,  # noqa: F811
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"{redis_url}?prefix={prefix}"
    assert main(["keys", "create", "--tenant", "acme", "--db", db, "--quiet"]) == 0
    capsys.readouterr()
    before = redis_keys(redis_url, prefix)
    assert main([*argv, "--db", db, "--tenant", "acme"]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        f"tenant 'acme' has no store at key prefix '{prefix}tenant:acme:' of the Redis at",
        "nothing was created",
    )
    assert redis_keys(redis_url, prefix) == before
    assert not redis_keys(redis_url, f"{prefix}tenant:")


@pytest.mark.redis
def test_memory_import_from_a_session_in_an_empty_redis_prefix_writes_nothing(
    redis_url: str,  # noqa: F811
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"{redis_url}?prefix={prefix}"
    argv = ["memory", "import", "--from-session", "3f2a9c01", "--sessions-db", db, *HASH]
    assert main(argv) == 2
    assert_one_line_error(capsys.readouterr().err, f"the store {db} does not exist")
    assert redis_keys(redis_url, prefix) == []


@pytest.mark.redis
def test_readers_on_an_existing_redis_store_work(
    redis_url: str,  # noqa: F811
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"{redis_url}?prefix={prefix}&ttl_grace=0"  # the session store's own parameter too
    with open_memory(db) as mem:
        sid = mem.create_session("a1")
        mem.add_message(sid, "user", "hello")
    listed = run_json(capsys, "sessions", "list", "--db", db, "--json")
    assert [s["session_id"] for s in listed] == [sid]
    shown = run_json(capsys, "sessions", "show", sid, "--db", db, "--json")
    assert [m["content"] for m in shown["messages"]] == ["hello"]
    assert main(["sessions", "delete", sid, "--db", db]) == 0
    assert capsys.readouterr().out == "deleted\n"


@pytest.mark.redis
def test_keys_and_a_tenant_on_an_existing_redis_store_work(
    redis_url: str,  # noqa: F811
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = f"{redis_url}?prefix={prefix}"
    made = run_json(capsys, "keys", "create", "--tenant", "acme", "--db", db, "--json")
    listed = run_json(capsys, "keys", "list", "--db", db, "--json")
    assert [k["key_id"] for k in listed] == [made["key_id"]]
    assert main(["demo", "--steps", "3", "--json", "--db", db, "--tenant", "acme"]) == 0
    capsys.readouterr()
    listed = run_json(capsys, "sessions", "list", "--db", db, "--tenant", "acme", "--json")
    assert [s["agent_id"] for s in listed] == ["demo-agent"]


@pytest.mark.redis
def test_a_prefix_that_an_older_ctxkeep_versioned_counts_as_a_store(
    redis_url: str,  # noqa: F811
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        client.set(f"{prefix}schema:sessions", "1")  # before the meta hash
    finally:
        client.close()
    assert (
        run_json(capsys, "sessions", "list", "--db", f"{redis_url}?prefix={prefix}", "--json") == []
    )


# -- PostgreSQL -----------------------------------------------------------------------------------


def _database_url(url: str, name: str) -> str:
    return urlunparse(urlparse(url)._replace(path=f"/{name}"))


@pytest.fixture
def database(postgres_url: str) -> Iterator[str]:  # noqa: F811
    """The URL of a new, empty database (no pgvector either), dropped after the test."""
    import psycopg

    name = f"ctxkeep_ro_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield _database_url(postgres_url, name)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pg_tables(url: str) -> list[tuple[str, str]]:
    """Every table and schema of the database that is not PostgreSQL's own."""
    import psycopg

    system = "('pg_catalog', 'information_schema', 'pg_toast')"
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            f"SELECT table_schema, table_name FROM information_schema.tables "
            f"WHERE table_schema NOT IN {system}"
        ).fetchall()
        schemas = conn.execute(
            f"SELECT schema_name, '' FROM information_schema.schemata "
            f"WHERE schema_name NOT IN {system} AND schema_name NOT LIKE 'pg_%'"
        ).fetchall()
        extensions = conn.execute(
            "SELECT 'extension', extname FROM pg_extension WHERE extname <> 'plpgsql'"
        ).fetchall()
    return sorted([*tables, *schemas, *extensions])


@pytest.mark.postgres
@pytest.mark.parametrize("argv", READERS, ids=ids)
def test_a_reader_on_an_empty_postgres_database_says_so_and_creates_nothing(
    argv: list[str], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = pg_tables(database)
    assert before == [("public", "")]
    assert main([*argv, "--db", database]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        f"the store {database} does not exist",
        'no table ctxkeep_meta in the search_path ("$user", public)',
        "check --db",
        "created nothing",
    )
    assert pg_tables(database) == before


@pytest.mark.postgres
@pytest.mark.parametrize("argv", READERS, ids=ids)
def test_a_reader_on_a_missing_postgres_schema_creates_nothing(
    argv: list[str], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = with_schema(database, "mistyped")
    assert main([*argv, "--db", db]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        "does not exist (no table ctxkeep_meta in the search_path (mistyped)",
        "created nothing",
    )
    assert pg_tables(database) == [("public", "")]


@pytest.mark.postgres
def test_memory_import_from_a_session_in_an_empty_postgres_database_creates_nothing(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["memory", "import", "--from-session", "3f2a9c01", "--sessions-db", database, *HASH]
    assert main(argv) == 2
    assert_one_line_error(capsys.readouterr().err, f"the store {database} does not exist")
    assert pg_tables(database) == [("public", "")]


@pytest.mark.postgres
def test_a_reader_on_a_missing_postgres_database_says_so(
    postgres_url: str,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    import psycopg

    name = f"ctxkeep_nosuch_{uuid.uuid4().hex[:12]}"
    parsed = urlparse(_database_url(postgres_url, name))
    host = parsed.netloc.rsplit("@", 1)[-1]
    db = urlunparse(parsed._replace(netloc=f"postgres:s3cret@{host}"))  # the server trusts
    assert main(["sessions", "list", "--db", db]) == 2
    err = capsys.readouterr().err
    shown = urlunparse(parsed._replace(netloc=f"postgres:***@{host}"))
    assert_one_line_error(err, f"the store {shown} does not exist", f"/{name} does not exist")
    assert "s3cret" not in err
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert found is None


@pytest.mark.postgres
@pytest.mark.parametrize("argv", TENANT_READERS, ids=ids)
def test_a_reader_on_a_postgres_tenant_with_no_schema_creates_nothing(
    argv: list[str], database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = with_schema(database, "srv")
    with _connect(database) as conn:
        conn.execute("CREATE SCHEMA srv")
    assert main(["keys", "create", "--tenant", "acme", "--db", db, "--quiet"]) == 0
    capsys.readouterr()
    before = pg_tables(database)
    assert main([*argv, "--db", db, "--tenant", "acme"]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        "tenant 'acme' has no store at schema srv_tenant_acme of the PostgreSQL at",
        "nothing was created",
    )
    assert pg_tables(database) == before


@pytest.mark.postgres
def test_readers_on_an_existing_postgres_store_work(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_memory(database) as mem:
        sid = mem.create_session("a1")
        mem.add_message(sid, "user", "hello")
    listed = run_json(capsys, "sessions", "list", "--db", database, "--json")
    assert [s["session_id"] for s in listed] == [sid]
    shown = run_json(capsys, "sessions", "show", sid, "--db", database, "--json")
    assert [m["content"] for m in shown["messages"]] == ["hello"]
    text = "The flaky test was a timezone bug."
    assert main(["memory", "add", text, "--session", "s1", "--db", database, *HASH]) == 0
    capsys.readouterr()
    hits = run_json(capsys, "memory", "search", "timezone", "--db", database, *HASH, "--json")
    assert [h["session_id"] for h in hits] == ["s1"]
    assert run_json(
        capsys, "memory", "forget", "--session", "s1", "--db", database, *HASH, "--json"
    ) == {"forgotten": 1}


@pytest.mark.postgres
def test_a_postgres_tenant_made_by_writers_is_read_by_readers(
    database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--db", with_schema(database, "srv"), "--tenant", "acme"]
    with _connect(database) as conn:
        conn.execute("CREATE SCHEMA srv")
    assert main(["demo", "--steps", "3", "--json", *where]) == 0
    capsys.readouterr()
    listed = run_json(capsys, "sessions", "list", *where, "--json")
    assert [s["agent_id"] for s in listed] == ["demo-agent"]
    # the tenant's schema exists, but the database has no pgvector yet: no episodes to read
    assert main(["memory", "search", "timezone", *where, *HASH]) == 2
    assert_one_line_error(
        capsys.readouterr().err,
        "tenant 'acme' has no episodes in schema srv_tenant_acme",
        "no pgvector extension yet",
        "nothing was created",
    )
    assert ("extension", "vector") not in pg_tables(database)
    text = "The flaky test was a timezone bug."
    assert main(["memory", "add", text, "--session", "s1", *where, *HASH]) == 0
    capsys.readouterr()
    hits = run_json(capsys, "memory", "search", "timezone", *where, *HASH, "--json")
    assert [h["session_id"] for h in hits] == ["s1"]


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)

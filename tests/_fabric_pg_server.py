"""A fixture for tests of the service on PostgreSQL (imported by the test modules that use it).

``postgres_server_url``: a service storage URL on a fresh base schema of the test session's
PostgreSQL (``conftest_services.postgres_url``); the base schema and its tenants' are dropped
after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from conftest_services import with_schema


@pytest.fixture
def postgres_server_url(postgres_url: str) -> Iterator[str]:
    """A service URL on a fresh base schema, dropped after the test with its tenants'."""
    import psycopg

    schema = f"ctxkeep_srv_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield with_schema(postgres_url, schema)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            tenants = conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)",
                (f"{schema}_tenant_",),
            ).fetchall()
            for (s,) in [*tenants, (schema,)]:
                conn.execute(f'DROP SCHEMA IF EXISTS "{s}" CASCADE')

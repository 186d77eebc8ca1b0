"""``/metrics`` shows each tenant's bus (issue 28): messages not yet delivered, received and
not acked, and dead letters, read from the store at the scrape, on every store the service
runs on (in process for ``memory://`` and SQLite, Redis Streams, PostgreSQL tables).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _fabric_pg_server import postgres_server_url
from conftest_services import postgres_url, redis_prefix_factory, redis_url
from ctxkeep.server import create_app
from ctxkeep.sessions.base import MemoryConfig

__all__ = ["postgres_server_url", "postgres_url", "redis_prefix_factory", "redis_url"]

pytest.importorskip(
    "prometheus_client", reason="prometheus-client is not installed: pip install 'ctxkeep[metrics]'"
)
from prometheus_client.parser import text_string_to_metric_families

CONFIG = MemoryConfig(max_history=500, session_ttl=None, max_sessions=None)
GAUGES = ("ctxkeep_bus_depth", "ctxkeep_bus_pending", "ctxkeep_bus_dead_letters")


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ]
)
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'srv.db'}"
    elif request.param == "redis":
        prefix = request.getfixturevalue("redis_prefix_factory")()
        url = f"{request.getfixturevalue('redis_url')}?prefix={prefix}"
    else:
        url = request.getfixturevalue("postgres_server_url")
    app = create_app(url, config=CONFIG, embedder="hash")
    with TestClient(app) as served:
        yield served


def auth(client: TestClient, tenant: str) -> dict[str, str]:
    _, token = client.app.state.ctxkeep.keys.create(tenant)  # type: ignore[attr-defined]
    return {"Authorization": f"Bearer {token}"}


def bus_gauges(client: TestClient) -> dict[tuple[str, str], float]:
    """(gauge, tenant) -> value, for the bus gauges ``/metrics`` shows."""
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {
        (s.name, s.labels["tenant"]): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
        if s.name in GAUGES
    }


def of(found: dict[tuple[str, str], float], tenant: str) -> tuple[float, ...]:
    return tuple(found[(name, tenant)] for name in GAUGES)


def call(client: TestClient, method: str, path: str, key: dict[str, str], **body: Any) -> Any:
    answer = client.request(method, path, json=body, headers=key)
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def test_bus_depth_and_pending_per_tenant_are_what_was_sent_received_and_acked(
    client: TestClient,
) -> None:
    acme, other = auth(client, "acme"), auth(client, "other")
    assert bus_gauges(client) == {}  # no tenant has used its fabric yet
    for key in (acme, other):
        for agent in ("planner", "worker", "critic"):
            call(client, "PUT", f"/v1/fabric/agents/{agent}/task", key, task_id="t")
    for agent in ("worker", "critic"):
        call(client, "POST", f"/v1/fabric/agents/{agent}/subscriptions", acme, topic="news")

    for n in range(5):
        call(client, "POST", "/v1/fabric/messages", acme,
             sender="planner", recipient="worker", payload={"n": n})  # fmt: skip
    call(client, "POST", "/v1/fabric/messages", acme, sender="planner", topic="news", payload=1)
    call(client, "POST", "/v1/fabric/messages", other,
         sender="worker", recipient="planner", payload="hi")  # fmt: skip
    found = bus_gauges(client)
    assert of(found, "acme") == (7, 0, 0)  # the topic message is one per subscriber
    assert of(found, "other") == (1, 0, 0)

    got = call(client, "POST", "/v1/fabric/agents/worker/messages/receive", acme, max_messages=4)
    ids = [m["id"] for m in got["messages"]]
    assert len(ids) == 4
    assert of(bus_gauges(client), "acme") == (3, 4, 0)
    call(client, "POST", "/v1/fabric/agents/worker/messages/ack", acme, ids=ids[:3])
    found = bus_gauges(client)
    assert of(found, "acme") == (3, 1, 0)
    assert of(found, "other") == (1, 0, 0)  # another tenant's bus is its own

    call(client, "POST", "/v1/fabric/agents/worker/messages/recover", acme)
    got = call(client, "POST", "/v1/fabric/agents/worker/messages/receive", acme, max_messages=100)
    call(client, "POST", "/v1/fabric/agents/worker/messages/ack", acme,
         ids=[m["id"] for m in got["messages"]])  # fmt: skip
    assert of(bus_gauges(client), "acme") == (1, 0, 0)  # the critic's copy waits
    got = call(client, "POST", "/v1/fabric/agents/critic/messages/receive", acme, max_messages=1)
    assert of(bus_gauges(client), "acme") == (0, 1, 0)

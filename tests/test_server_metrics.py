"""What the service shows of itself (issue 28): ``/metrics`` counts what was sent, ``/readyz``
follows the store while ``/healthz`` follows the process, and ``--otel``'s traces hold a span
per request with the store's spans under it (the SDK's in-memory exporter, a real one).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from _server import free_port
from conftest_services import service_unavailable
from ctxkeep.errors import ConfigError
from ctxkeep.server import create_app
from ctxkeep.sessions.base import MemoryConfig

prometheus = pytest.importorskip(
    "prometheus_client", reason="prometheus-client is not installed: pip install 'ctxkeep[metrics]'"
)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

CONFIG = MemoryConfig(max_history=500, session_ttl=None, max_sessions=None)
PROBLEM = "application/problem+json"


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample ``/metrics`` shows: (name, sorted labels) -> value."""
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def requests_of(found: dict[Any, float], method: str, route: str, status: int) -> float:
    labels = (("method", method), ("route", route), ("status", str(status)))
    return found.get(("ctxkeep_http_requests_total", labels), 0.0)


def new_session(client: TestClient, auth: dict[str, str]) -> str:
    """A new session's id."""
    made = client.post("/v1/sessions", json={"agent_id": "a"}, headers=auth)
    assert made.status_code == 201, made.text
    return str(made.json()["session"]["session_id"])


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    app = create_app(f"sqlite:///{tmp_path / 'srv.db'}", config=CONFIG, embedder="hash")
    _, token = app.state.ctxkeep.keys.create("acme")
    with TestClient(app) as client:
        yield client, {"Authorization": f"Bearer {token}"}


# -- /metrics ------------------------------------------------------------------------------------


def test_requests_are_counted_by_route_template_and_status(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, auth = served
    sids = [client.post("/v1/sessions", json={"agent_id": "a"}, headers=auth) for _ in range(3)]
    assert all(r.status_code == 201 for r in sids)
    for r in sids[:2]:
        sid = r.json()["session"]["session_id"]
        assert client.get(f"/v1/sessions/{sid}", headers=auth).status_code == 200
    assert client.get("/v1/sessions/nope", headers=auth).status_code == 404
    assert client.get("/v1/stats").status_code == 401
    assert client.get("/no/such/route").status_code == 404
    found = samples(client)
    assert requests_of(found, "POST", "/v1/sessions", 201) == 3
    assert requests_of(found, "GET", "/v1/sessions/{session_id}", 200) == 2
    assert requests_of(found, "GET", "/v1/sessions/{session_id}", 404) == 1
    assert requests_of(found, "GET", "/v1/stats", 401) == 1
    assert requests_of(found, "GET", "unmatched", 404) == 1
    # no id reaches a label
    assert not any(sid.json()["session"]["session_id"] in str(key) for sid in sids for key in found)


def test_latency_is_a_histogram_per_route_counting_each_request(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, auth = served
    for _ in range(4):
        assert client.get("/v1/stats", headers=auth).status_code == 200
    found = samples(client)
    labels = (("method", "GET"), ("route", "/v1/stats"))
    assert found[("ctxkeep_http_request_duration_seconds_count", labels)] == 4
    assert found[("ctxkeep_http_request_duration_seconds_bucket", (("le", "+Inf"), *labels))] == 4
    assert found[("ctxkeep_http_request_duration_seconds_sum", labels)] > 0


def test_appends_prompt_tokens_and_pruning_decisions_are_counted(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, auth = served
    sid = new_session(client, auth)
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    history = [
        {"role": "user", "content": 'read the log, "report": {"prune": {"tokens_before": 1}}'},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "line of the log\n" * 800},
        {"role": "assistant", "content": "done"},
    ]
    assert client.post(
        f"/v1/sessions/{sid}/messages", json={"messages": history}, headers=auth
    ).is_success
    newest = client.get(f"/v1/sessions/{sid}/messages", headers=auth).json()["messages"][-1]
    replaced = client.put(
        f"/v1/sessions/{sid}/messages/newest",
        json={"newest_id": newest["id"], "messages": [{"role": "assistant", "content": "ok"}]},
        headers=auth,
    )
    assert replaced.status_code == 200, replaced.text
    refused = {"messages": [{"role": "nobody"}]}
    path = f"/v1/sessions/{sid}/messages"
    assert client.post(path, json=refused, headers=auth).status_code == 422
    asked = {"role": "user", "content": "and now?"}
    assert client.post(
        f"/v1/sessions/{sid}/messages", json={"messages": [asked]}, headers=auth
    ).is_success
    reports = []
    for budget in (600, 100_000):
        built = client.post(
            f"/v1/sessions/{sid}/prompt",
            json={"max_prompt_tokens": budget, "reserve_output_tokens": 50, "preserve_last_n": 1},
            headers=auth,
        )
        assert built.status_code == 200, built.text
        reports.append(built.json()["report"])
    assert reports[0]["prune"]["compressed"] >= 1  # the first build pruned, the second did not
    found = samples(client)
    # 4 appended, 1 replacing the newest, 1 refused (an unknown role), 1
    assert found[("ctxkeep_session_messages_appended_total", ())] == 6
    before = sum(r["prune"]["tokens_before"] for r in reports)
    after = sum(r["prune"]["tokens_after"] for r in reports)
    assert found[("ctxkeep_prompt_tokens_before_pruning_count", ())] == 2
    assert found[("ctxkeep_prompt_tokens_before_pruning_sum", ())] == before
    assert found[("ctxkeep_prompt_tokens_after_pruning_sum", ())] == after
    assert after < before
    assert found[("ctxkeep_prompt_tokens_sum", ())] == sum(r["prompt_tokens"] for r in reports)
    compressed = sum(r["prune"]["compressed"] for r in reports)
    assert found[("ctxkeep_prune_messages_total", (("action", "compressed"),))] == compressed


def test_metrics_and_readyz_need_no_key_and_only_readyz_is_in_the_schema(
    served: tuple[TestClient, dict[str, str]],
) -> None:
    client, _ = served
    assert client.get("/metrics").status_code == 200
    assert client.get("/readyz").json() == {"status": "ok"}
    paths = client.get("/openapi.json").json()["paths"]
    assert "/readyz" in paths and "/metrics" not in paths


def test_without_prometheus_client_metrics_is_a_501_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import now fails
    app = create_app(f"sqlite:///{tmp_path / 'srv.db'}", config=CONFIG, embedder="hash")
    with TestClient(app) as client:
        answer = client.get("/metrics")
        assert answer.status_code == 501
        assert answer.headers["content-type"] == PROBLEM
        problem = answer.json()
        assert problem["type"].endswith(":missing-dependency")
        assert "prometheus-client" in problem["detail"] and "ctxkeep[metrics]" in problem["detail"]
        # the rest of the service works
        assert client.get("/readyz").status_code == 200


def test_metrics_off_is_the_same_501(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'srv.db'}", embedder="hash", metrics=False)
    with TestClient(app) as client:
        assert client.get("/metrics").json()["type"].endswith(":missing-dependency")


# -- /readyz against a store that goes away ------------------------------------------------------


class OwnRedis:
    """A ``redis-server`` of the test's own on a fixed port, to stop and start again (its
    data, the API keys among it, kept across restarts in an append-only file)."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            service_unavailable("redis-server is not installed")
        pytest.importorskip("redis", reason="redis-py is not installed")
        self.binary = str(binary)
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "always"]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.redis
def test_readyz_is_503_while_the_store_is_down_and_200_when_it_is_back(
    own_redis: OwnRedis,
) -> None:
    app = create_app(own_redis.url, config=CONFIG, embedder="hash")
    _, token = app.state.ctxkeep.keys.create("acme")
    auth = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        own_redis.stop()
        down = client.get("/readyz")
        assert down.status_code == 503
        assert down.headers["content-type"] == PROBLEM
        assert down.json()["type"].endswith(":storage-unavailable")
        assert client.get("/healthz").status_code == 200  # the process still lives
        assert client.get("/v1/stats", headers=auth).status_code == 503
        found = samples(client)
        errors = found[("ctxkeep_store_errors_total", (("kind", "storage-unavailable"),))]
        assert errors == 2  # /readyz and /v1/stats
        own_redis.start()
        assert client.get("/readyz").status_code == 200
        assert client.get("/v1/stats", headers=auth).status_code == 200


# -- traces --------------------------------------------------------------------------------------


@pytest.fixture
def traced(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], Any]]:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry is not installed")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app(
        f"sqlite:///{tmp_path / 'srv.db'}", config=CONFIG, embedder="hash", tracer_provider=provider
    )
    _, token = app.state.ctxkeep.keys.create("acme")
    with TestClient(app) as client:
        yield client, {"Authorization": f"Bearer {token}"}, exporter
    provider.shutdown()


def test_a_request_is_a_server_span_named_by_its_route_with_its_status(
    traced: tuple[TestClient, dict[str, str], Any],
) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    client, auth, exporter = traced
    sid = new_session(client, auth)
    exporter.clear()
    assert client.get(f"/v1/sessions/{sid}", headers=auth).status_code == 200
    [request] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert request.name == "GET /v1/sessions/{session_id}"
    assert request.attributes["http.route"] == "/v1/sessions/{session_id}"
    assert request.attributes["http.request.method"] == "GET"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["ctxkeep.tenant"] == "acme"
    assert request.status.status_code is not StatusCode.ERROR
    assert all(sid not in str(value) for value in request.attributes.values())


def test_store_calls_are_spans_under_their_request(
    traced: tuple[TestClient, dict[str, str], Any],
) -> None:
    from opentelemetry.trace import SpanKind, StatusCode

    client, auth, exporter = traced
    sid = new_session(client, auth)
    exporter.clear()
    appended = client.post(
        f"/v1/sessions/{sid}/messages",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers=auth,
    )
    assert appended.status_code == 201
    assert client.get("/v1/sessions/nope", headers=auth).status_code == 404
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.kind is SpanKind.SERVER]
    stores = [s for s in spans if s.name == "ctxkeep.store"]
    assert [r.name for r in requests] == [
        "POST /v1/sessions/{session_id}/messages",
        "GET /v1/sessions/{session_id}",
    ]
    assert len(stores) == 2
    for request, store in zip(requests, stores, strict=True):
        assert store.parent is not None
        assert store.parent.span_id == request.context.span_id
        assert store.context.trace_id == request.context.trace_id
        assert store.attributes["ctxkeep.tenant"] == "acme"
    # the store raised SessionNotFoundError in the second: recorded on its span
    assert stores[1].status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in stores[1].events)
    assert requests[1].attributes["http.response.status_code"] == 404


def test_a_refusal_before_routing_is_traced_too(
    traced: tuple[TestClient, dict[str, str], Any],
) -> None:
    from opentelemetry.trace import SpanKind

    client, auth, exporter = traced
    exporter.clear()
    big = {"agent_id": "a" * (5 * 1024 * 1024)}
    assert client.post("/v1/sessions", json=big, headers=auth).status_code == 413
    [request] = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert request.name == "POST /v1/sessions"
    assert request.attributes["http.response.status_code"] == 413


def test_an_unknown_exporter_for_otel_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry is not installed")
    from ctxkeep.server.tracing import provider_from_env

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "carrier-pigeon")
    with pytest.raises(ConfigError, match="OTEL_TRACES_EXPORTER='carrier-pigeon'"):
        provider_from_env()


def test_otel_names_the_service_ctxkeep_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry is not installed")
    from ctxkeep.server.tracing import provider_from_env

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    provider: Any = provider_from_env()
    assert provider.resource.attributes["service.name"] == "ctxkeep"
    provider.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "memory-api")
    provider = provider_from_env()
    assert provider.resource.attributes["service.name"] == "memory-api"
    provider.shutdown()


def test_the_app_imports_prometheus_client_only_when_it_counts() -> None:
    code = (
        "import sys\n"
        "from ctxkeep.server import create_app\n"
        "create_app('memory://', embedder='hash', metrics=False)\n"
        "assert 'prometheus_client' not in sys.modules\n"
        "create_app('memory://', embedder='hash')\n"
        "assert 'prometheus_client' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

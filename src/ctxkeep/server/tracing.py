"""Optional OpenTelemetry traces of the service: a span per request, and under it a span for
each lease of the tenant's stores.

* **The request** (:class:`~ctxkeep.server.app.AccessLog` opens it, outermost, so refusals
  by the body limits are traced too): a ``SERVER`` span named ``METHOD /route/{template}``
  with ``http.request.method``, ``http.route``, ``http.response.status_code`` and
  ``ctxkeep.tenant``; its status is an error from 500 on. The path itself is not recorded:
  it carries session ids, which the access log keeps out as well.
* **The store calls** (:class:`TracedTenantStores`): every route reaches its tenant's stores
  (sessions, artifacts, episodes, checkpoints, the fabric) through one lease,
  :meth:`~ctxkeep.server.tenants.TenantStores.lease_stores`; a ``ctxkeep.store`` span
  covers it, the store calls of the route inside, and records the error a store raised. The
  route runs in a worker thread, which inherits the request's context, so the span is the
  request span's child.

Traces are off unless :func:`~ctxkeep.server.app.create_app` is given a tracer provider
(``ctxkeep serve --otel`` makes one with :func:`provider_from_env`). opentelemetry comes with
the ``otel`` extra and is imported only then.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ctxkeep._version import __version__
from ctxkeep.errors import ConfigError, MissingDependencyError
from ctxkeep.server.tenants import TenantResources, TenantStores

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

TRACER_NAME = "ctxkeep.server"
"""The instrumentation scope of the service's spans."""

STORE_SPAN = "ctxkeep.store"
"""The name of the span around a lease of a tenant's stores."""

DEFAULT_SERVICE_NAME = "ctxkeep"
"""``service.name`` of the spans ``serve --otel`` exports, unless ``OTEL_SERVICE_NAME`` or
``OTEL_RESOURCE_ATTRIBUTES`` name one."""


def tracer_of(provider: TracerProvider) -> Tracer:
    """The service's tracer from ``provider``."""
    return provider.get_tracer(TRACER_NAME, __version__)


class TracedTenantStores(TenantStores):
    """:class:`~ctxkeep.server.tenants.TenantStores` whose every lease is a span."""

    def __init__(self, *args: Any, tracer: Tracer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tracer = tracer
        """Where the spans go."""

    @contextmanager
    def lease_stores(self, tenant: str) -> Iterator[TenantResources]:
        """The tenant's stores, held open for the block, in a ``ctxkeep.store`` span."""
        with (
            self.tracer.start_as_current_span(STORE_SPAN, attributes={"ctxkeep.tenant": tenant}),
            super().lease_stores(tenant) as resources,
        ):
            yield resources


def request_span(tracer: Tracer, method: str) -> Any:
    """The context manager of a request's span (named and finished by :func:`finish`)."""
    from opentelemetry.trace import SpanKind

    return tracer.start_as_current_span(
        f"{method}",
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method},
    )


def finish(span: Span, method: str, route: str | None, status: int, tenant: str | None) -> None:
    """Name a request's span by its route and record how it ended."""
    from opentelemetry.trace import Status, StatusCode

    if route is not None:
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if tenant is not None:
        span.set_attribute("ctxkeep.tenant", tenant)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def provider_from_env() -> TracerProvider:
    """The tracer provider of ``ctxkeep serve --otel``.

    One set up already (``opentelemetry-instrument ctxkeep serve ...``) is used as it is.
    Otherwise the SDK's, configured by the standard variables: ``OTEL_TRACES_EXPORTER``
    (``otlp``, the default, needs ``opentelemetry-exporter-otlp``; ``console`` prints spans to
    stdout; ``none`` exports nothing), ``OTEL_EXPORTER_OTLP_*``, ``OTEL_SERVICE_NAME`` (default
    ``ctxkeep``), ``OTEL_TRACES_SAMPLER``...

    Raises:
        MissingDependencyError: opentelemetry's SDK is not installed (the ``otel`` extra).
        ConfigError: an unknown exporter, or the OTLP exporter is not installed.

    """
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise MissingDependencyError("opentelemetry-sdk", "otel") from exc
    current = trace.get_tracer_provider()
    if isinstance(current, SdkTracerProvider):
        return current
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {"service.name": DEFAULT_SERVICE_NAME})
    provider = SdkTracerProvider(resource=resource)
    choice = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if choice == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif choice == "otlp":
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter()))
    elif choice != "none":
        raise ConfigError(
            f"OTEL_TRACES_EXPORTER={choice!r} is not one ctxkeep serve --otel knows; use otlp "
            "(the default), console or none"
        )
    return provider


def _otlp_exporter() -> Any:
    """The OTLP span exporter (over HTTP, else gRPC), configured by ``OTEL_EXPORTER_OTLP_*``."""
    for transport in ("http", "grpc"):
        try:
            module = importlib.import_module(
                f"opentelemetry.exporter.otlp.proto.{transport}.trace_exporter"
            )
        except ImportError:
            continue
        return module.OTLPSpanExporter()
    raise ConfigError(
        "--otel exports spans over OTLP by default, and no OTLP exporter is installed: pip "
        "install opentelemetry-exporter-otlp, or set OTEL_TRACES_EXPORTER=console (spans on "
        "stdout)"
    )

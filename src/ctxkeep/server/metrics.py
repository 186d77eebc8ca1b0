"""``GET /metrics``: the service's counters and histograms in Prometheus' text format.

:class:`Metrics` holds the instruments of one application in a registry of its own (never
prometheus-client's global one: two apps in one process, as in the tests, count apart).
:class:`~ctxkeep.server.app.AccessLog` feeds it once per request (route template, status,
seconds), the app's error handler counts store errors, and the bodies of the three routes
that write or build (appends, the newest message replaced, prompt builds) are read for what
they did: messages stored, tokens before and after pruning, messages compressed, dropped or
summarised. Routes are labelled by template (``/v1/sessions/{session_id}``), never by path,
so no id reaches a label and the series stay few; a path no route matches is ``unmatched``.

Several worker processes (``ctxkeep serve --workers N``) count in prometheus-client's
multiprocess mode: with ``PROMETHEUS_MULTIPROC_DIR`` set before prometheus-client is
imported, every process writes its values to files there and whichever worker answers
``/metrics`` adds up every process's (``serve`` sets the variable to a fresh directory).

The bus's messages per tenant are not counted as requests go: they are read from the store
when ``/metrics`` is scraped (:class:`BusCollector`, through each bus's
:meth:`~ctxkeep.fabric.MessageBus.stats`, one read per tenant), for every tenant whose fabric
this process has open (the tenants whose agents used the fabric routes since it started). On
Redis and PostgreSQL the counts are the shared store's, so every worker that has a tenant's
fabric open shows the same values for it; in multiprocess mode they are added to the files'
values at the scrape, never written to files (a gauge per process would be summed over the
workers). A tenant whose store does not answer is left out of that scrape, with a warning.

prometheus-client comes with the ``metrics`` extra and is imported only by
:func:`open_metrics`; without it ``/metrics`` answers 501 ``missing-dependency`` naming the
extra.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ctxkeep.errors import CtxkeepError, MissingDependencyError

if TYPE_CHECKING:
    from ctxkeep.server.fabric import TenantFabric

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""The directory prometheus-client's multiprocess mode keeps every process's values in."""

UNMATCHED = "unmatched"
"""The route label of a request no route matches (a 404)."""

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: a read from memory takes ~1 ms, a prompt over 10,000 messages ~30 ms, a slow
store seconds."""

TOKEN_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576)
"""Tokens of a prompt, by powers of four from a short chat to a million-token history."""

PRUNE_ACTIONS = ("compressed", "dropped", "summarised")
"""The report's counts of messages the pruner did not keep as they were."""

BUS_GAUGES = (
    ("ctxkeep_bus_depth", "depth", "Messages in a tenant's bus not yet delivered to a receiver."),
    ("ctxkeep_bus_pending", "pending", "Messages of a tenant's bus received and not acked."),
    (
        "ctxkeep_bus_dead_letters",
        "dead_letters",
        "Messages of a tenant's bus that could not be delivered, moved aside.",
    ),
)
"""The bus's gauges: name, the :class:`~ctxkeep.fabric.BusStats` field, help."""


def open_metrics() -> Metrics:
    """The instruments of a new application.

    Raises:
        MissingDependencyError: prometheus-client is not installed (the ``metrics`` extra).

    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingDependencyError("prometheus-client", "metrics") from exc
    return Metrics(prometheus_client)


class Metrics:
    """One application's instruments, in a registry of its own."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.multiprocess = bool(os.environ.get(MULTIPROC_ENV))
        """Whether every process's values are added up (multiprocess mode, decided when
        prometheus-client was first imported: its values live in files then)."""
        self.registry = client.CollectorRegistry(auto_describe=True)
        """Where the instruments are registered (what ``/metrics`` shows in one process)."""
        reg = self.registry
        self.requests = client.Counter(
            "ctxkeep_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ("method", "route", "status"),
            registry=reg,
        )
        self.latency = client.Histogram(
            "ctxkeep_http_request_duration_seconds",
            "Seconds from a request's arrival to the end of its answer, by route template.",
            ("method", "route"),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.appended = client.Counter(
            "ctxkeep_session_messages_appended",
            "Messages stored by appends and by replacements of the newest message.",
            registry=reg,
        )
        self.tokens_before = client.Histogram(
            "ctxkeep_prompt_tokens_before_pruning",
            "Tokens of the history a prompt build read, before pruning (its count: the builds).",
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.tokens_after = client.Histogram(
            "ctxkeep_prompt_tokens_after_pruning",
            "Tokens of the history a prompt build kept, after pruning.",
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.prompt_tokens = client.Histogram(
            "ctxkeep_prompt_tokens",
            "Tokens of the whole prompt built (system, history and the rest).",
            buckets=TOKEN_BUCKETS,
            registry=reg,
        )
        self.pruned = client.Counter(
            "ctxkeep_prune_messages",
            "Messages a prompt build did not keep as they were, by action.",
            ("action",),
            registry=reg,
        )
        self.buses: BusCollector | None = None
        """The bus gauges, once :meth:`watch_buses` was called."""
        self.store_errors = client.Counter(
            "ctxkeep_store_errors",
            "Requests failed by the store, by problem type (storage-unavailable, "
            "corrupt-record, schema-version).",
            ("kind",),
            registry=reg,
        )

    def observe_request(self, method: str, route: str | None, status: int, seconds: float) -> None:
        """Count one answered request and its latency."""
        label = route if route is not None else UNMATCHED
        self.requests.labels(method, label, str(status)).inc()
        self.latency.labels(method, label).observe(seconds)

    def observe_work(self, appended: int, report: Any) -> None:
        """Count what a successful request did: ``appended`` messages stored, and a
        prompt's build ``report`` (a :class:`~ctxkeep.builder.BuildReport`, or None).
        """
        if appended:
            self.appended.inc(appended)
        if report is None:
            return
        prune = report.prune
        self.tokens_before.observe(prune.tokens_before)
        self.tokens_after.observe(prune.tokens_after)
        self.prompt_tokens.observe(report.prompt_tokens)
        for action in PRUNE_ACTIONS:
            count = prune.count(action)
            if count > 0:
                self.pruned.labels(action).inc(count)

    def watch_buses(self, fabrics: Callable[[], Mapping[str, TenantFabric]]) -> None:
        """Show the bus gauges of the tenants ``fabrics()`` returns (tenant -> its open
        fabric), read at each scrape (:class:`BusCollector`).
        """
        self.buses = BusCollector(fabrics)
        self.registry.register(self.buses)

    def store_error(self, kind: str) -> None:
        """Count a request the store failed (``kind``: the problem's slug)."""
        self.store_errors.labels(kind).inc()

    def exposition(self) -> tuple[bytes, str]:
        """The text ``/metrics`` answers and its content type: this process's values, or
        every process's in multiprocess mode.
        """
        client = self._client
        registry = self.registry
        if self.multiprocess:
            from prometheus_client import multiprocess

            registry = client.CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            if self.buses is not None:
                registry.register(self.buses)
        return client.generate_latest(registry), client.CONTENT_TYPE_LATEST


class BusCollector:
    """The bus gauges (:data:`BUS_GAUGES`), labelled by tenant, read from each open tenant's
    bus when collected (a prometheus-client custom collector).

    Args:
        fabrics: tenant -> its open :class:`~ctxkeep.server.fabric.TenantFabric`, called at
            each collection.

    """

    def __init__(self, fabrics: Callable[[], Mapping[str, TenantFabric]]) -> None:
        from prometheus_client.metrics_core import GaugeMetricFamily

        self._gauge = GaugeMetricFamily
        self._fabrics = fabrics

    def describe(self) -> list[Any]:
        """Nothing to read at registration (the registry would otherwise collect once)."""
        return []

    def collect(self) -> Iterator[Any]:
        """One gauge family per count, a sample per tenant whose bus answered."""
        families = [
            (self._gauge(name, text, labels=["tenant"]), field) for name, field, text in BUS_GAUGES
        ]
        for tenant, fabric in sorted(self._fabrics().items()):
            try:
                stats = fabric.bus.stats()
            except CtxkeepError as exc:
                log.warning("bus of tenant %r not counted: %s", tenant, exc)
                continue
            for family, field in families:
                family.add_metric([tenant], getattr(stats, field))
        for family, _ in families:
            yield family

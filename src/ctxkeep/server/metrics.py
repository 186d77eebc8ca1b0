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

Not here: the bus's depth and pending messages per tenant. The fabric offers no count of
either (:class:`~ctxkeep.server.fabric.TenantFabric` has send, receive, ack, recover and the
dead letters only), and counting them through it would read every queue on each scrape.

prometheus-client comes with the ``metrics`` extra and is imported only by
:func:`open_metrics`; without it ``/metrics`` answers 501 ``missing-dependency`` naming the
extra.
"""

from __future__ import annotations

import os
from typing import Any

from ctxkeep.errors import MissingDependencyError

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
        return client.generate_latest(registry), client.CONTENT_TYPE_LATEST

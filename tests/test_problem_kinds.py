"""Every kind of problem the service answers is in :mod:`ctxkeep.server.problems`' tables,
where the server reads it forwards and the client backwards (issue 25: the 408 of a slow
request lived in ``app.py``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import ctxkeep.server
from ctxkeep.server import problems

SERVER_MODULES = sorted(
    m.name for m in pkgutil.iter_modules(ctxkeep.server.__path__) if m.name != "problems"
)
"""Every module of the service but the problems' own (a module added later is checked too)."""


@pytest.mark.parametrize("name", SERVER_MODULES)
def test_no_server_module_makes_a_problem_kind_of_its_own(name: str) -> None:
    module = importlib.import_module(f"ctxkeep.server.{name}")
    assert "ProblemKind(" not in inspect.getsource(module)


def test_the_request_timeout_is_a_problem_of_the_http_layer_in_the_table() -> None:
    kind = problems.REQUEST_TIMEOUT
    assert kind in problems.HTTP_PROBLEMS
    assert (kind.status, kind.slug) == (408, "request-timeout")
    assert problems.kind_for_type(kind.type) is kind
    assert problems.kind_for_status(408) is kind


FRAMEWORK_PROBLEMS = [k for k in problems.HTTP_PROBLEMS if k is not problems.MALFORMED_REQUEST]
"""The HTTP problems answered for a framework's HTTP error (a malformed request is the HTTP
protocol's, before any framework: ``app.HeaderTimeout``)."""


@pytest.mark.parametrize("kind", FRAMEWORK_PROBLEMS, ids=lambda k: k.slug)
def test_every_http_problem_is_found_by_its_status_and_its_type(
    kind: problems.ProblemKind,
) -> None:
    assert problems.kind_for_status(kind.status) is kind
    found = problems.kind_for_type(kind.type)
    assert found is not None and found.slug == kind.slug


def test_a_status_of_no_kind_of_its_own_is_an_http_error_of_that_status() -> None:
    kind = problems.kind_for_status(418)
    assert (kind.status, kind.slug) == (418, "http-error")
    assert problems.kind_for_status(400) is problems.INVALID_REQUEST

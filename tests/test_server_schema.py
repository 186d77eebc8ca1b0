"""schemathesis against the service's own OpenAPI document: every operation, called with
generated requests (valid and invalid) by an authenticated tenant, answers without a server
error, with a declared status and content type, and with a body that matches its declared
schema. The run is derandomized and bounded, so it is reproducible and quick.

Generated ids name nothing, so a second run calls the operations that take ids (all but the
deletes) with the ids of records stored beforehand: their successful answers are checked too.
(schemathesis ends the application's lifespan after each operation's test, which empties a
``memory://`` server: the records are stored again whenever they are gone.)
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from ctxkeep.server import create_app
from ctxkeep.sessions.base import MemoryConfig

MAX_EXAMPLES = 5
"""Generated requests per operation and phase (the run stays within a few seconds per route)."""

APP = create_app(
    "memory://",
    config=MemoryConfig(max_history=20, session_ttl=600, max_sessions=50),
    embedder="hash",
    max_body_bytes=64 * 1024,
)
TENANT = "schemathesis"
KEY = APP.state.ctxkeep.keys.create(TENANT)[1]


def _load(max_examples: int, *, phases: tuple[str, ...]) -> Any:
    loaded = schemathesis.openapi.from_asgi("/openapi.json", APP)
    loaded.config.generation.update(max_examples=max_examples, deterministic=True, database="none")
    loaded.config.phases.update(phases=list(phases))
    loaded.config.update(headers={"Authorization": f"Bearer {KEY}"})
    return loaded


def _seed() -> dict[str, str]:
    """One record of each kind in the tenant's stores: the value of each path parameter."""
    with APP.state.ctxkeep.stores.lease_stores(TENANT) as stores:
        sid = stores.memory.create_session("agent", task_id="task")
        stores.memory.add_messages(
            sid,
            [
                {"role": "user", "content": "look it up"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "output line\n" * 300},
                {"role": "user", "content": "and now?"},
            ],
        )
        ref = stores.artifacts().put("a full tool output")
        eid = stores.episodic().save_episode(sid, "look it up", "found it", agent_id="agent")
        cid = stores.checkpoints().save("agent", {"decision": "go"}, session_id=sid)
        stores.fabric().join("agent", "task", {"goal": "g"})
    return {
        "session_id": sid,
        "agent_id": "agent",
        "ref": ref,
        "episode_id": eid,
        "checkpoint_id": cid,
    }


_SEEDED: dict[str, str] = {}


def stored_records() -> dict[str, str]:
    """The ids of the stored records, stored anew if the server lost them."""
    with APP.state.ctxkeep.stores.lease(TENANT) as memory:
        alive = bool(_SEEDED) and memory.has_session(_SEEDED["session_id"])
    if not alive:
        _SEEDED.clear()
        _SEEDED.update(_seed())
    return _SEEDED


# Every operation: schema examples, the coverage phase's boundary and negative cases, then
# generated requests. With stored ids: generated requests (the boundaries are the same).
schema = _load(MAX_EXAMPLES, phases=("examples", "coverage", "fuzzing"))
stored = _load(3, phases=("examples", "fuzzing")).include(path_regex=r"\{").exclude(method="DELETE")

CHECKS = [
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    content_type_conformance,
]


@schema.parametrize()
def test_every_operation_conforms_to_the_openapi_document(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)


@stored.parametrize()
def test_operations_on_stored_records_conform_to_the_openapi_document(case: Any) -> None:
    ids = stored_records()
    case.path_parameters = {name: ids[name] for name in case.path_parameters}
    case.call_and_validate(checks=CHECKS)

"""Three ``ctxkeep serve`` processes over one store answer as one service (issue 28).

Three console-script servers run on free ports over one PostgreSQL schema, then over one Redis
key prefix; every request goes to a server picked at random (as a load balancer would), and
every answer is checked against what one process gives: a model of the expected state
(sessions, checkpoints, task versions, each agent's inbox) and the same read asked of all
three. What would differ in a process of its own is aimed at on purpose: a prompt cache warmed
in every process before another one changes the session (to the same message count), a
compare-and-set raced through two servers, a message received through one server and acked or
recovered through another.

One test per store starts the servers (in parallel: each takes seconds to import and start)
and runs every check of :data:`CHECKS` on them, each under agents and sessions of its own.
``RedisStreamBus`` processes that share a consumer name (as the servers do) are checked
without the service at the end.
"""

from __future__ import annotations

import concurrent.futures
import random
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from _server import start_serve
from conftest_services import delete_prefix, postgres_url, redis_url, with_schema
from ctxkeep import IPCMessage
from ctxkeep.server.keys import open_key_registry

__all__ = ["postgres_url", "redis_url"]

SERVERS = 3


class Cluster:
    """Three servers over one store, and a client for each; :meth:`any` picks one at random."""

    def __init__(self, kind: str, clients: list[httpx.Client], seed: int) -> None:
        self.kind = kind
        self.clients = clients
        self.rng = random.Random(seed)

    def any(self) -> httpx.Client:
        return self.rng.choice(self.clients)

    def two(self) -> tuple[httpx.Client, httpx.Client]:
        first, second = self.rng.sample(self.clients, 2)
        return first, second

    def ok(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        """``method path`` on a random server, which must answer ``status``; the JSON."""
        answer = self.any().request(method, path, **kwargs)
        assert answer.status_code == status, (answer.status_code, answer.text)
        return answer.json()

    def everywhere(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        """``method path`` on every server: each must answer ``status`` and the same JSON,
        bar the per-request ``evicted`` list; that JSON.
        """
        bodies = []
        for client in self.clients:
            answer = client.request(method, path, **kwargs)
            assert answer.status_code == status, (client.base_url, answer.text)
            body = answer.json()
            if isinstance(body, dict):
                body.pop("evicted", None)
            bodies.append(body)
        assert all(b == bodies[0] for b in bodies[1:]), bodies
        return bodies[0]


def _start_three(url: str, log_dir: Path) -> list[tuple[subprocess.Popen[Any], str]]:
    def one(n: int) -> tuple[subprocess.Popen[Any], str]:
        with (log_dir / f"serve-{n}.log").open("w") as err:
            return start_serve(
                "--db", url, "--embedder", "hash", "--allow-volatile-redis", stderr=err
            )

    with concurrent.futures.ThreadPoolExecutor(SERVERS) as pool:
        futures = [pool.submit(one, n) for n in range(SERVERS)]
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:  # stop the ones that did start
        for future in futures:
            if future.exception() is None:
                future.result()[0].kill()
        raise RuntimeError(f"ctxkeep serve did not start: {failed}")
    return [f.result() for f in futures]


@contextmanager
def three_servers(kind: str, request: pytest.FixtureRequest, log_dir: Path) -> Iterator[Cluster]:
    """Three servers over one fresh PostgreSQL schema or one fresh Redis key prefix."""
    cleanup: Callable[[], None]
    if kind == "postgres":
        import psycopg

        base = request.getfixturevalue("postgres_url")
        schema = f"ctxkeep_scale_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        url = with_schema(base, schema)

        def cleanup() -> None:
            with psycopg.connect(base, autocommit=True) as conn:
                for tenant_schema in (schema, f"{schema}_tenant_acme"):
                    conn.execute(f"DROP SCHEMA IF EXISTS {tenant_schema} CASCADE")
    else:
        base = request.getfixturevalue("redis_url")
        prefix = f"ctxkeep-test:{uuid.uuid4().hex}:"
        url = f"{base}?prefix={prefix}"

        def cleanup() -> None:
            delete_prefix(base, prefix)

    started: list[tuple[subprocess.Popen[Any], str]] = []
    clients: list[httpx.Client] = []
    try:
        registry = open_key_registry(url)
        try:
            _, token = registry.create("acme")
        finally:
            registry.close()
        started = _start_three(url, log_dir)
        headers = {"Authorization": f"Bearer {token}"}
        clients = [httpx.Client(base_url=b, headers=headers, timeout=30) for _, b in started]
        yield Cluster(kind, clients, seed=28)
    finally:
        for client in clients:
            client.close()
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            proc.wait(timeout=60)
        cleanup()
    for n in range(SERVERS):
        text = (log_dir / f"serve-{n}.log").read_text()
        assert "Traceback" not in text, text


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}"


# -- sessions and prompts ---------------------------------------------------------------------


def _contents(messages: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m["content"]) for m in messages]


def sessions_and_their_messages_agree_whichever_server_answers(cluster: Cluster) -> None:
    agent = _name("agent")
    model: dict[str, list[tuple[str, Any]]] = {}
    for n in range(4):
        body = cluster.ok("POST", "/v1/sessions", 201, json={"agent_id": agent, "task_id": "t"})
        model[body["session"]["session_id"]] = []
        for turn in range(3):
            role = "user" if turn % 2 == 0 else "assistant"
            content = f"session {n} turn {turn}"
            cluster.ok(
                "POST",
                f"/v1/sessions/{body['session']['session_id']}/messages",
                201,
                json={"messages": [{"role": role, "content": content}]},
            )
            model[body["session"]["session_id"]].append((role, content))
    sid = next(iter(model))
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    cluster.ok(
        "POST",
        f"/v1/sessions/{sid}/messages",
        201,
        json={"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]},
    )
    cluster.ok(
        "POST",
        f"/v1/sessions/{sid}/messages",
        201,
        json={"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "result"}]},
    )
    model[sid] += [("assistant", None), ("tool", "result")]

    for session_id, expected in model.items():
        page = cluster.everywhere("GET", f"/v1/sessions/{session_id}/messages")
        assert _contents(page["messages"]) == expected and page["total"] == len(expected)
    listed = cluster.everywhere("GET", f"/v1/sessions?agent_id={agent}&limit=100")
    assert {s["session_id"] for s in listed["sessions"]} == set(model)
    newest = listed["sessions"][0]["session_id"]
    latest = cluster.everywhere("GET", f"/v1/agents/{agent}/latest")
    assert latest["session_id"] == newest
    before = cluster.everywhere("GET", "/v1/stats")["sessions"]

    gone = list(model)[-1]
    cluster.ok("DELETE", f"/v1/sessions/{gone}")
    cluster.everywhere("GET", f"/v1/sessions/{gone}/messages", 404)
    assert cluster.everywhere("GET", f"/v1/sessions/{gone}/exists")["exists"] is False
    assert cluster.everywhere("GET", f"/v1/agents/{agent}/latest")["session_id"] != gone
    assert cluster.everywhere("GET", "/v1/stats")["sessions"] == before - 1


def artifacts_agree_whichever_server_stored_them(cluster: Cluster) -> None:
    text = f"a long tool output {uuid.uuid4().hex} " * 50
    ref = cluster.ok("POST", "/v1/artifacts", 201, json={"text": text})["ref"]
    assert cluster.everywhere("GET", f"/v1/artifacts/{ref}") == {"ref": ref, "text": text}


def a_prompt_cached_in_every_process_shows_a_change_made_through_another(
    cluster: Cluster,
) -> None:
    """Each process caches a session's prompt; a pop then an append through other servers
    leaves as many messages as before, and every process must still build from the new ones.
    """
    sid = cluster.ok("POST", "/v1/sessions", 201, json={"agent_id": _name("agent")})["session"][
        "session_id"
    ]
    for turn in range(8):
        role = "user" if turn % 2 == 0 else "assistant"
        cluster.ok(
            "POST",
            f"/v1/sessions/{sid}/messages",
            201,
            json={"messages": [{"role": role, "content": f"turn {turn} " + "words " * 30}]},
        )
    request = {"max_prompt_tokens": 400, "reserve_output_tokens": 50, "system": "be brief"}
    for _ in range(2):  # every process builds, then builds again from its cache
        first = cluster.everywhere("POST", f"/v1/sessions/{sid}/prompt", json=request)
        cluster.everywhere("GET", f"/v1/sessions/{sid}/prompt")
    assert first["messages"][-1]["content"].startswith("turn 7 ")

    popped = cluster.ok("POST", f"/v1/sessions/{sid}/messages/pop")
    assert popped["message"]["content"].startswith("turn 7 ")
    cluster.ok(
        "POST",
        f"/v1/sessions/{sid}/messages",
        201,
        json={"messages": [{"role": "assistant", "content": "a different turn 7"}]},
    )
    built = cluster.everywhere("POST", f"/v1/sessions/{sid}/prompt", json=request)
    assert built["messages"][-1]["content"] == "a different turn 7"
    assert built["messages"][0] == {"role": "system", "content": "be brief"}
    unpruned = cluster.everywhere("GET", f"/v1/sessions/{sid}/prompt")
    assert len(unpruned["messages"]) == 8
    assert unpruned["messages"][-1]["content"] == "a different turn 7"

    newest = cluster.ok("GET", f"/v1/sessions/{sid}/messages?last=1")["messages"][0]
    cluster.ok(
        "PUT",
        f"/v1/sessions/{sid}/messages/newest",
        json={"newest_id": newest["id"], "messages": [{"role": "assistant", "content": "v3"}]},
    )
    built = cluster.everywhere("POST", f"/v1/sessions/{sid}/prompt", json=request)
    assert built["messages"][-1]["content"] == "v3"


def trimming_to_max_history_agrees_whichever_servers_appended(cluster: Cluster) -> None:
    """Past ``max_history`` (1,000) the oldest messages are archived, each exactly once, and
    every process reads the same window, whichever processes appended before.
    """
    sid = cluster.ok("POST", "/v1/sessions", 201, json={"agent_id": _name("agent")})["session"][
        "session_id"
    ]

    def turns(start: int, count: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"m{n}"} for n in range(start, start + count)]

    sent = 0
    for count in (600, 395):
        cluster.ok(
            "POST", f"/v1/sessions/{sid}/messages", 201, json={"messages": turns(sent, count)}
        )
        sent += count
    cluster.everywhere("GET", f"/v1/sessions/{sid}/prompt")  # every process reads (and caches)
    for count in (3, 4, 5, 6, 7):  # each append through another server trims some more
        cluster.ok(
            "POST", f"/v1/sessions/{sid}/messages", 201, json={"messages": turns(sent, count)}
        )
        sent += count
        window = [f"m{n}" for n in range(max(0, sent - 1000), sent)]
        page = cluster.everywhere("GET", f"/v1/sessions/{sid}/messages")
        assert [m["content"] for m in page["messages"]] == window
        prompt = cluster.everywhere("GET", f"/v1/sessions/{sid}/prompt")
        assert [m["content"] for m in prompt["messages"]] == window
        archived = cluster.everywhere("GET", f"/v1/sessions/{sid}/archived")
        assert [m["content"] for m in archived["messages"]] == [f"m{n}" for n in range(sent - 1000)]


# -- checkpoints and episodes -----------------------------------------------------------------


def checkpoints_agree_whichever_server_saved_them(cluster: Cluster) -> None:
    agent = _name("agent")
    saved = []
    for n in range(6):
        body = cluster.ok(
            "POST",
            f"/v1/agents/{agent}/checkpoints",
            201,
            json={"state": {"schema_version": 1, "decision": f"step {n}"}, "task_id": "t"},
        )
        saved.append(body["checkpoint"])
        latest = cluster.everywhere("GET", f"/v1/agents/{agent}/checkpoints/latest")
        assert latest["checkpoint"] == body["checkpoint"]
    assert [c["seq"] for c in saved] == list(range(1, 7))
    history = cluster.everywhere("GET", f"/v1/agents/{agent}/checkpoints?limit=100")
    assert history["checkpoints"] == saved[::-1]
    for checkpoint in saved:
        one = cluster.everywhere("GET", f"/v1/checkpoints/{checkpoint['checkpoint_id']}")
        assert one["checkpoint"] == checkpoint


def episodes_agree_whichever_server_saved_them(cluster: Cluster) -> None:
    agent = _name("agent")
    episode = {"session_id": "s", "task_goal": "g", "summary": "s", "agent_id": agent}
    if cluster.kind == "redis":  # no episodic store on Redis: every server says so alike
        cluster.everywhere("POST", "/v1/episodes", 501, json=episode)
        return
    topics = ["deploy the billing service", "rotate the database keys", "fix the flaky login"]
    search = {"query": "database keys", "top_k": 4, "filters": {"agent_id": agent}}
    ids = {}
    for n, topic in enumerate(topics * 2):
        body = cluster.ok(
            "POST",
            "/v1/episodes",
            201,
            json={**episode, "session_id": f"s{n}", "task_goal": topic, "summary": f"{topic} #{n}"},
        )
        ids[body["episode"]["id"]] = body["episode"]
        # every process searches after each save made through any of them
        hits = cluster.everywhere("POST", "/v1/episodes/search", json=search)["hits"]
        found = {h["episode"]["id"] for h in hits}
        assert found <= set(ids)
        if topic == "rotate the database keys":
            assert body["episode"]["id"] in found
    for episode_id, stored in ids.items():
        assert cluster.everywhere("GET", f"/v1/episodes/{episode_id}")["episode"] == stored
    hits = cluster.everywhere("POST", "/v1/episodes/search", json=search)["hits"]
    assert [h["episode"]["task_goal"] for h in hits[:2]] == ["rotate the database keys"] * 2

    forgotten = hits[0]["episode"]["id"]
    cluster.ok("DELETE", f"/v1/episodes/{forgotten}")
    cluster.everywhere("GET", f"/v1/episodes/{forgotten}", 404)
    after = cluster.everywhere("POST", "/v1/episodes/search", json=search)["hits"]
    assert forgotten not in {h["episode"]["id"] for h in after}
    assert hits[1]["episode"]["id"] in {h["episode"]["id"] for h in after}


# -- task state -------------------------------------------------------------------------------


def a_stale_compare_and_set_is_refused_whichever_server_took_the_first(
    cluster: Cluster,
) -> None:
    task, agents = _name("task"), [_name("a"), _name("b")]
    for agent in agents:
        joined = cluster.ok("PUT", f"/v1/fabric/agents/{agent}/task", json={"task_id": task})
        assert joined["version"] == 0
    expected: dict[str, Any] = {}
    for version in range(8):  # each round writes once: the version it reads is the round's
        first, second = cluster.two()
        agent_1, agent_2 = cluster.rng.sample(agents, 2)
        won = first.patch(
            f"/v1/fabric/agents/{agent_1}/task",
            json={"changes": {"n": version, "by": agent_1}, "expected_version": version},
        )
        assert won.status_code == 200, won.text
        lost = second.patch(
            f"/v1/fabric/agents/{agent_2}/task",
            json={"changes": {"n": -1, "lost": True}, "expected_version": version},
        )
        assert lost.status_code == 409, lost.text
        assert lost.json()["type"].endswith("stale-task-state")
        expected.update({"n": version, "by": agent_1})
        for agent in agents:
            read = cluster.everywhere("GET", f"/v1/fabric/agents/{agent}/task")
            assert (read["version"], read["state"]) == (version + 1, expected)


def racing_compare_and_sets_through_three_servers_let_exactly_one_win(cluster: Cluster) -> None:
    task, agent = _name("task"), _name("a")
    cluster.ok("PUT", f"/v1/fabric/agents/{agent}/task", json={"task_id": task})
    for version in range(5):

        def attempt(n: int, v: int = version) -> int:
            answer = cluster.clients[n % SERVERS].patch(
                f"/v1/fabric/agents/{agent}/task",
                json={"changes": {"winner": n}, "expected_version": v},
            )
            return answer.status_code

        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            codes = sorted(pool.map(attempt, range(6)))
        assert codes == [200] + [409] * 5, codes
        read = cluster.everywhere("GET", f"/v1/fabric/agents/{agent}/task")
        assert read["version"] == version + 1


# -- the bus ----------------------------------------------------------------------------------


class Inboxes:
    """What one process would deliver: per recipient, never-delivered ids in send order,
    delivered and unacked ones, and the ones a recover put back first.
    """

    def __init__(self, agents: list[str]) -> None:
        self.queue: dict[str, list[str]] = {a: [] for a in agents}
        self.pending: dict[str, list[str]] = {a: [] for a in agents}
        self.replay: dict[str, list[str]] = {a: [] for a in agents}
        self.acked: dict[str, list[str]] = {a: [] for a in agents}
        self.first: dict[str, list[str]] = {a: [] for a in agents}  # first deliveries

    def sent(self, recipient: str, message_id: str) -> None:
        self.queue[recipient].append(message_id)

    def take(self, agent: str, n: int) -> list[str]:
        replay, queue = self.replay[agent], self.queue[agent]
        taken = (replay + queue)[:n]
        from_queue = taken[len(replay[:n]) :]
        del replay[: len(taken) - len(from_queue)]
        del queue[: len(from_queue)]
        self.pending[agent].extend(from_queue)
        self.first[agent].extend(from_queue)
        return taken

    def ack(self, agent: str, ids: list[str]) -> None:
        self.pending[agent] = [i for i in self.pending[agent] if i not in ids]
        self.replay[agent] = [i for i in self.replay[agent] if i not in ids]
        self.acked[agent].extend(ids)

    def recover(self, agent: str) -> int:
        self.replay[agent] = list(self.pending[agent])
        return len(self.pending[agent])


def bus_messages_are_delivered_once_per_ack_in_order_whichever_server_answers(
    cluster: Cluster,
) -> None:
    task = _name("task")
    senders, recipients = [_name("s1"), _name("s2")], [_name("r1"), _name("r2"), _name("r3")]
    for agent in senders + recipients:
        cluster.ok("PUT", f"/v1/fabric/agents/{agent}/task", json={"task_id": task})
    subscribed = recipients[:2]
    for agent in subscribed:
        cluster.ok("POST", f"/v1/fabric/agents/{agent}/subscriptions", 201, json={"topic": "news"})
    model = Inboxes(recipients)
    order: dict[str, list[str]] = {}  # recipient -> ids in send order
    rng = cluster.rng
    for step in range(160):
        op = rng.choices(["direct", "topic", "receive", "recover"], weights=[4, 2, 4, 1])[0]
        if op == "direct":
            sender, recipient = rng.choice(senders), rng.choice(recipients)
            sent = cluster.ok(
                "POST",
                "/v1/fabric/messages",
                201,
                json={"sender": sender, "recipient": recipient, "payload": {"step": step}},
            )["message"]
            model.sent(recipient, sent["id"])
            order.setdefault(recipient, []).append(sent["id"])
        elif op == "topic":
            sender = rng.choice(senders)
            sent = cluster.ok(
                "POST",
                "/v1/fabric/messages",
                201,
                json={"sender": sender, "topic": "news", "payload": {"step": step}},
            )["message"]
            for recipient in subscribed:
                model.sent(recipient, sent["id"])
                order.setdefault(recipient, []).append(sent["id"])
        elif op == "receive":
            agent, n = rng.choice(recipients), rng.randint(1, 4)
            got = cluster.ok(
                "POST", f"/v1/fabric/agents/{agent}/messages/receive", json={"max_messages": n}
            )["messages"]
            assert [m["id"] for m in got] == model.take(agent, n), step
            if got and rng.random() < 0.7:  # acked through whichever server the balancer picks
                ids = [m["id"] for m in got]
                cluster.ok("POST", f"/v1/fabric/agents/{agent}/messages/ack", json={"ids": ids})
                model.ack(agent, ids)
        else:
            agent = rng.choice(recipients)
            recovered = cluster.ok("POST", f"/v1/fabric/agents/{agent}/messages/recover")
            assert recovered["pending"] == model.recover(agent), step

    for agent in recipients:  # drain: recover, then receive and ack until nothing is left
        assert cluster.ok("POST", f"/v1/fabric/agents/{agent}/messages/recover")[
            "pending"
        ] == model.recover(agent)
        while True:
            got = cluster.ok(
                "POST", f"/v1/fabric/agents/{agent}/messages/receive", json={"max_messages": 5}
            )["messages"]
            assert [m["id"] for m in got] == model.take(agent, 5)
            if not got:
                break
            ids = [m["id"] for m in got]
            cluster.ok("POST", f"/v1/fabric/agents/{agent}/messages/ack", json={"ids": ids})
            model.ack(agent, ids)
        assert cluster.ok("POST", f"/v1/fabric/agents/{agent}/messages/recover")["pending"] == 0
        # first delivered in the order sent, and every message acked exactly once
        sent = order.get(agent, [])
        assert model.first[agent] == sent, agent
        assert sorted(model.acked[agent]) == sorted(sent), agent


def receivers_racing_through_three_servers_share_an_inbox_without_duplicates(
    cluster: Cluster,
) -> None:
    task, sender, agent = _name("task"), _name("s"), _name("r")
    for who in (sender, agent):
        cluster.ok("PUT", f"/v1/fabric/agents/{who}/task", json={"task_id": task})
    sent = [
        cluster.ok(
            "POST",
            "/v1/fabric/messages",
            201,
            json={"sender": sender, "recipient": agent, "payload": n},
        )["message"]["id"]
        for n in range(30)
    ]

    def drain(n: int) -> list[str]:
        client, got = cluster.clients[n % SERVERS], []
        while True:
            answer = client.post(
                f"/v1/fabric/agents/{agent}/messages/receive", json={"max_messages": 2}
            )
            assert answer.status_code == 200, answer.text
            ids = [m["id"] for m in answer.json()["messages"]]
            if not ids:
                return got
            got += ids
            other = cluster.clients[(n + 1) % SERVERS]  # acked through another server
            acked = other.post(f"/v1/fabric/agents/{agent}/messages/ack", json={"ids": ids})
            assert acked.status_code == 200, acked.text

    with concurrent.futures.ThreadPoolExecutor(SERVERS) as pool:
        runs = list(pool.map(drain, range(SERVERS)))
    assert sorted(i for run in runs for i in run) == sorted(sent)
    for run in runs:  # each receiver's share comes in the order sent
        assert run == [i for i in sent if i in set(run)]
    assert cluster.ok("POST", f"/v1/fabric/agents/{agent}/messages/recover")["pending"] == 0


# -- all of it, on each store ------------------------------------------------------------------

CHECKS: list[Callable[[Cluster], None]] = [
    sessions_and_their_messages_agree_whichever_server_answers,
    artifacts_agree_whichever_server_stored_them,
    a_prompt_cached_in_every_process_shows_a_change_made_through_another,
    trimming_to_max_history_agrees_whichever_servers_appended,
    checkpoints_agree_whichever_server_saved_them,
    episodes_agree_whichever_server_saved_them,
    a_stale_compare_and_set_is_refused_whichever_server_took_the_first,
    racing_compare_and_sets_through_three_servers_let_exactly_one_win,
    bus_messages_are_delivered_once_per_ack_in_order_whichever_server_answers,
    receivers_racing_through_three_servers_share_an_inbox_without_duplicates,
]
"""What one process would answer, each checked on three (each works under ids of its own)."""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", pytest.param("redis", marks=pytest.mark.redis)])
def test_three_servers_over_one_store_answer_as_one(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    with three_servers(kind, request, tmp_path) as cluster:
        for check in CHECKS:
            check(cluster)


# -- the Redis bus under one consumer name, without the service -------------------------------


@pytest.mark.redis
def test_redis_processes_sharing_a_consumer_name_ack_and_recover_each_others_messages(
    redis_url: str,
) -> None:
    from ctxkeep.fabric.redis_bus import RedisStreamBus

    prefix = f"ctxkeep-test:{uuid.uuid4().hex}:"
    here = RedisStreamBus(redis_url, consumer="service", prefix=prefix)
    there = RedisStreamBus(redis_url, consumer="service", prefix=prefix)
    try:
        here.register("b", "t")
        for n in range(3):
            here.send(IPCMessage(sender="a", recipient="b", payload=n))
        first = here.receive("b", max_messages=2)
        assert [m.payload for m in first] == [0, 1]
        there.ack("b", [first[0].id])  # acked through the other process
        assert there.recover("b") == 1
        replayed = there.receive("b")
        assert [m.payload for m in replayed] == [1, 2]
        here.ack("b", [m.id for m in replayed])
        assert here.recover("b") == 0 and there.recover("b") == 0
        assert here.receive("b") == [] and there.receive("b") == []
    finally:
        here.close()
        there.close()
        delete_prefix(redis_url, prefix)


@pytest.mark.redis
def test_redis_processes_sharing_a_consumer_name_replay_each_entry_once(redis_url: str) -> None:
    """After a recover, receives through two processes at once share the replay out: no
    message is handed out twice.
    """
    from ctxkeep.fabric.redis_bus import RedisStreamBus

    prefix = f"ctxkeep-test:{uuid.uuid4().hex}:"
    buses = [RedisStreamBus(redis_url, consumer="service", prefix=prefix) for _ in range(2)]
    try:
        sent = [IPCMessage(sender="a", recipient="b", payload=n) for n in range(40)]
        for message in sent:
            buses[0].send(message)
        assert len(buses[0].receive("b", max_messages=40)) == 40
        assert buses[1].recover("b") == 40

        def drain(bus: RedisStreamBus) -> list[str]:
            got: list[str] = []
            while taken := bus.receive("b", max_messages=1):
                got += [m.id for m in taken]
            return got

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(drain, buses * 2))
        replayed = [i for run in runs for i in run]
        assert sorted(replayed) == sorted(m.id for m in sent)
        for run in runs:  # each receiver sees its share in the order sent
            assert run == [m.id for m in sent if m.id in set(run)]
    finally:
        for bus in buses:
            bus.close()
        delete_prefix(redis_url, prefix)

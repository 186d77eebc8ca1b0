"""A real ``ctxkeep serve``: the application on 127.0.0.1, run by uvicorn in a background
thread, or the console script in a subprocess (not collected: no ``test_`` prefix).
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from typing import Any

import httpx
import uvicorn

from _cli import ctxkeep_script


def free_port() -> int:
    """A port of 127.0.0.1 free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serve(*args: str, **popen: Any) -> tuple[subprocess.Popen[Any], str]:
    """``ctxkeep serve ARGS --port P`` in a subprocess (``popen``: its stdout, stderr...),
    returned with its base URL once ``/healthz`` answers; the caller stops it.
    """
    port = free_port()
    command = [ctxkeep_script(), "serve", *args, "--port", str(port)]
    proc = subprocess.Popen(command, env=os.environ.copy(), **popen)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.communicate(timeout=30)
            raise RuntimeError(f"ctxkeep serve did not start: {command}")
        time.sleep(0.1)


class ThreadedServer:
    """uvicorn serving ``app`` on a free port of 127.0.0.1 until :meth:`stop`."""

    def __init__(self, app: Any) -> None:
        # uvicorn binds port 0 itself (a socket handed to it in this process answered ~10x
        # slower); the port is read back once it listens.
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            access_log=False,
            ws="none",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def start(self) -> ThreadedServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.005)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self, *, wait: bool = True) -> None:
        """Ask the server to stop (uvicorn needs ~0.2 s); ``wait``: until it has."""
        self.server.should_exit = True
        if wait:
            self.thread.join(10)

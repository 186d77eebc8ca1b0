"""A sweeping process for the eviction kill test (``tests/test_sessions_trim_race.py``).

``python _sweeper.py URL NAME SESSIONS`` makes ``SESSIONS`` sessions of four messages each
(``session_ttl`` 60 s, ``archive_evicted`` on) and prints ``{session id} {message id}`` for each
message stored, then moves its clock past the TTL, prints ``sweeping`` and reclaims them all
with :meth:`~ctxkeep.MemoryManager.sweep` (each archived and deleted).
"""

from __future__ import annotations

import sys
import time

from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig


def main() -> None:
    url, name, sessions = sys.argv[1], sys.argv[2], int(sys.argv[3])
    now = [time.time()]
    config = MemoryConfig(session_ttl=60, max_sessions=None)
    with open_memory(url, config, clock=lambda: now[0]) as mem:
        for s in range(sessions):
            sid = mem.create_session("agent-swept", session_id=f"{name}-s{s}")
            for i in range(4):
                mem.add_message(sid, "user", "x", id=f"{sid}-m{i}")
                print(sid, f"{sid}-m{i}", flush=True)
        now[0] += 61
        print("sweeping", flush=True)
        mem.sweep()


if __name__ == "__main__":
    main()

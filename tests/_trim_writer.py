"""A writer process for the trim tests (``tests/test_sessions_trim_race.py``).

``python _trim_writer.py URL SESSION NAME COUNT THREADS MAX_HISTORY`` appends messages with ids
``{NAME}-t{thread}-{i}`` (``COUNT`` per thread; 0: until killed) to one session through its own
:class:`~ctxkeep.MemoryManager` (``archive_evicted`` on), and prints ``{id} {seq}`` for each
message once its append has returned: the printed ones are acknowledged, with the seq the store
gave them (the session order the archive must keep).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig


def main() -> None:
    url, sid, name, count, threads, limit = sys.argv[1:7]
    config = MemoryConfig(max_history=int(limit), session_ttl=None, max_sessions=None)
    mem = open_memory(url, config)
    backend, append = mem.backend, mem.backend.append
    seq_of: dict[str, int] = {}
    out = threading.Lock()

    def recording_append(session_id: str, batch: Any) -> list[int]:
        seqs: list[int] = append(session_id, batch)
        seq_of.update({r["id"]: s for s, r in zip(seqs, batch.records, strict=True)})
        return seqs

    backend.append = recording_append  # type: ignore[method-assign]

    def write(t: int) -> None:
        i = 0
        while int(count) == 0 or i < int(count):
            message_id = f"{name}-t{t}-{i}"
            mem.add_message(sid, "user", message_id, id=message_id)
            with out:
                sys.stdout.write(f"{message_id} {seq_of[message_id]}\n")
                sys.stdout.flush()
            i += 1

    workers = [threading.Thread(target=write, args=(t,)) for t in range(int(threads))]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    mem.close()


if __name__ == "__main__":
    main()

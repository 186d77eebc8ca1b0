"""The ids the manager gives messages: random version-4 UUIDs (hex), unique across threads and
across a fork's parent and child (ids are made in batches; a child hands out none of its
parent's).
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from ctxkeep.sessions import base


def test_ids_are_unique_version_4_uuids_across_threads() -> None:
    made: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(base._new_id() for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(out,)) for out in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [i for out in made for i in out]
    assert len(set(ids)) == len(ids) == 20_000
    for i in ids[::97]:
        u = uuid.UUID(hex=i)
        assert (u.hex, u.version, u.variant) == (i, 4, uuid.RFC_4122)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_a_forked_child_hands_out_none_of_its_parents_ids() -> None:
    base._new_id()  # a batch made: the rest wait in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the ids it makes, to the parent
        os.close(r)
        os.write(w, "".join(base._new_id() for _ in range(8)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        text = f.read().decode()
    os.waitpid(pid, 0)
    child = {text[i : i + 32] for i in range(0, len(text), 32)}
    parent = {base._new_id() for _ in range(8)}
    assert len(child) == 8 and not child & parent

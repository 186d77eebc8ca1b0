"""The first cache-stable prompt of a process, from a fold snapshot, is the whole replay's.

A process that builds prompts stores the fold of its last cut with the session
(:mod:`ctxkeep.prune.snapshots`); a new process reads only what that snapshot names and folds
forward. On random sessions (system messages anywhere, parallel tool calls, long outputs that
get compressed, calls still waiting, trims by ``max_history``, messages taken back, sessions
created again under the same id), the prompt and the fold's state of a cold manager are those
of a replay of the whole history by a fresh pruner.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ctxkeep.errors import CtxkeepError, StorageError
from ctxkeep.foldstate import FoldMismatch, FoldState, Unread, UnreadMessageTouched
from ctxkeep.messages import Message, ToolCall
from ctxkeep.prune import TokenPruner
from ctxkeep.prune.modes import CacheStableMode
from ctxkeep.prune.snapshots import FoldSnapshot, snapshot_key
from ctxkeep.sessions import open_memory
from ctxkeep.sessions.base import MemoryConfig, MemoryManager
from ctxkeep.sessions.memory import MemoryBackend
from test_sessions_tail import WholePruner, steps

ODD = [
    Message("assistant", None),  # no content, no calls: dropped (a repair the snapshot holds)
    Message("user", []),  # no parts: dropped; the user message before it is the newest
    Message("system", []),  # a system message with nothing in it: dropped
    Message("user", ""),  # empty text: kept
    Message("assistant", [{"type": "text", "text": "parts"}]),
]


@st.composite
def odd_steps(draw: Any) -> list[list[Message]]:
    """:func:`steps` with messages a pruner drops or keeps oddly, anywhere."""
    out: list[list[Message]] = draw(steps())
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, max(len(out) - 1, 0)))  # never after a trailing pending call
        out.insert(at, [draw(st.sampled_from(ODD))])
    return out


OPS = ["turn"] * 8 + ["quiet", "pop", "replace", "recreate", "cold", "cold"]


def _prompt(mem: MemoryManager, sid: str, pruner: Any, system: str | None) -> Any:
    """The prompt, or the error's type and text."""
    try:
        return mem.build_prompt_messages(sid, system=system, pruner=pruner)
    except CtxkeepError as exc:
        return (type(exc), str(exc))


def _check_cold(mem: MemoryManager, sid: str, args: dict[str, Any], system: str | None) -> bool:
    """A new manager (a new process) on the same store against a whole replay; True if the
    cold prompt came from a snapshot.
    """
    cold = MemoryManager(mem.backend, mem.config)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unread message touched warns: fail on it
        got = _prompt(cold, sid, TokenPruner(**args), system)
    ref_pruner = WholePruner(**args)
    want = _prompt(MemoryManager(mem.backend, mem.config), sid, ref_pruner, system)
    assert got == want
    cached = cold._prompt_cache.get(sid)
    if cached is None or cached.fold is None:
        return False
    assert isinstance(ref_pruner.mode, CacheStableMode)
    folds = ref_pruner.mode.folds._folds
    if folds and cached.fold.seed is not None:
        # The fold's whole state (cut, window, compressed, totals, notes): the stable prefix.
        assert cached.fold.seed == FoldState.of(folds[-1])
    return cached.fold.base > 0


@pytest.mark.slow
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    batches=odd_steps(),
    ops=st.lists(st.sampled_from(OPS), min_size=60, max_size=60),
    budget=st.sampled_from([200, 300, 400, 900]),
    preserve=st.integers(0, 8),
    low_water=st.sampled_from([0.5, 0.7, 1.0]),
    system=st.sampled_from([None, "Be brief."]),
    max_history=st.sampled_from([None, None, None, 30]),
    same_pruner=st.booleans(),
    backend=st.sampled_from(["memory", "sqlite"]),
)
def test_a_cold_prompt_from_a_snapshot_is_the_whole_replay(
    batches: list[list[Message]],
    ops: list[str],
    budget: int,
    preserve: int,
    low_water: float,
    system: str | None,
    max_history: int | None,
    same_pruner: bool,
    backend: str,
) -> None:
    args: dict[str, Any] = {
        "max_token_budget": budget,
        "preserve_last_n": preserve,
        "low_water": low_water,
    }
    config = MemoryConfig(max_history=max_history, session_ttl=None, max_sessions=None)
    writer_pruner = TokenPruner(**args)
    with tempfile.TemporaryDirectory() as tmp:
        url = "memory://" if backend == "memory" else f"sqlite:///{Path(tmp) / 's.db'}"
        with open_memory(url, config) as mem:
            sid = mem.create_session("agent", session_id="s")
            for batch, op in zip(batches, ops, strict=False):
                try:
                    mem.add_messages(sid, batch)
                except CtxkeepError:
                    continue  # a batch a taken-back message left invalid
                if op == "pop":
                    mem.pop_message(sid)
                elif op == "replace":
                    newest = mem.get_messages(sid, limit=1)
                    if newest and newest[0].id and not newest[0].tool_calls:
                        mem.replace_newest(
                            sid,
                            [newest[0].replace(id=None, content="again")],
                            newest_id=newest[0].id,
                        )
                elif op == "recreate":
                    mem.delete_session(sid)
                    mem.create_session("agent", session_id=sid)
                elif op == "cold":
                    event("from a snapshot" if _check_cold(mem, sid, args, system) else "replay")
                if op != "quiet":  # a turn of the writing process stores the fold at each cut
                    pruner = writer_pruner if same_pruner else TokenPruner(**args)
                    _prompt(mem, sid, pruner, system)
            event("from a snapshot" if _check_cold(mem, sid, args, system) else "replay")
            if backend == "sqlite":  # another process on the file, cold
                with open_memory(url, config) as other:
                    _check_cold(other, sid, args, system)


def _long_session(mem: MemoryManager, sid: str, turns: int) -> None:
    mem.add_message(sid, "system", "You are an agent.")
    for i in range(turns):
        mem.add_message(sid, "user", f"task {i}: " + "fix the parser " * (i % 4 + 1))
        tc = ToolCall(f"call_{i}", "bash", '{"command": "ls"}')
        mem.add_messages(
            sid,
            [
                Message("assistant", None, tool_calls=[tc]),
                Message("tool", f"line {i} of output\n" * (40 + i % 50), tool_call_id=tc.id),
            ],
        )
        mem.add_message(sid, "assistant", f"done {i}")


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_a_new_process_reads_only_what_the_snapshot_names(tmp_path: Path, backend: str) -> None:
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory(url, config) as mem:
        sid = mem.create_session("agent")
        _long_session(mem, sid, 60)
        mem.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))  # stores a snapshot
        _long_session(mem, sid, 2)
        cold = MemoryManager(mem.backend, config)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = cold.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))
        cached = cold._prompt_cache[sid]
        assert cached.fold is not None and cached.fold.base > 200  # most of it never read
        unread = [m for m in cached.messages if type(m) is not Message]
        assert len(unread) >= cached.fold.base - len(cached.fold.known)
        whole = MemoryManager(mem.backend, config)
        assert got == whole.build_prompt_messages(sid, pruner=WholePruner(1500, 4))
        _long_session(mem, sid, 3)  # turns on the cold manager, each pruner new
        for _ in range(2):
            want = whole.build_prompt_messages(sid, pruner=WholePruner(1500, 4))
            assert cold.build_prompt_messages(sid, pruner=TokenPruner(1500, 4)) == want


def test_a_snapshot_that_does_not_check_out_is_replaced_by_the_whole_replay() -> None:
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory("memory://", config) as mem:
        sid = mem.create_session("agent")
        _long_session(mem, sid, 30)
        mem.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))
        key = snapshot_key(TokenPruner(1500, 4), [])
        assert key is not None
        text = mem.backend.get_fold(sid, key)
        assert text is not None
        snap = FoldSnapshot.from_text(text)
        want = MemoryManager(mem.backend, config).build_prompt_messages(
            sid, pruner=WholePruner(1500, 4)
        )
        tampered = [
            snap.to_text().replace(
                f'"total":{snap.state.total}', f'"total":{snap.state.total + 1}'
            ),
            snap.to_text().replace('"v":1', '"v":99'),
            "not json",
        ]
        for body in tampered:
            mem.backend.put_fold(sid, snap.generation, key, body)
            cold = MemoryManager(mem.backend, config)
            assert cold.build_prompt_messages(sid, pruner=TokenPruner(1500, 4)) == want
            assert cold._prompt_cache[sid].fold.base == 0  # type: ignore[union-attr]
        # The replay stored a good snapshot again.
        assert FoldSnapshot.from_text(mem.backend.get_fold(sid, key) or "") == snap


def test_a_seed_that_names_an_unread_message_is_refused() -> None:
    pruner = TokenPruner(300, 2)
    msgs = [Message("system", "rules")] + [
        Message("user" if i % 2 == 0 else "assistant", "word " * 30) for i in range(40)
    ]
    state = pruner._prune_folded(msgs, None)[2]
    assert state is not None
    sparse: list[Any] = list(msgs)
    sparse[0] = Unread("in a test")  # the system message the seed needs
    with pytest.raises(FoldMismatch):
        TokenPruner(300, 2)._prune_folded(sparse, state)
    with pytest.raises(UnreadMessageTouched):
        _ = Unread("in a test").role


def test_a_pruner_a_snapshot_cannot_stand_for_gets_no_key() -> None:
    from ctxkeep.tokens import CalibratedCounter

    assert snapshot_key(TokenPruner(), []) is not None
    assert snapshot_key(TokenPruner(cache_stable=False), []) is None
    assert snapshot_key(WholePruner(), []) is None
    assert snapshot_key(TokenPruner(counter=CalibratedCounter()), []) is None
    a, b = TokenPruner(1000), TokenPruner(1000, low_water=0.5)
    assert snapshot_key(a, []) != snapshot_key(b, [])
    assert snapshot_key(a, []) != snapshot_key(a, [Message("system", "Be brief.")])


class _CountingBackend(MemoryBackend):
    """The memory backend, counting (or failing) its snapshot writes."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.writes: list[str] = []

    def put_fold(self, session_id: str, generation: str, key: str, body: str) -> None:
        self.writes.append(body)
        if self.fail:
            raise StorageError("the store is read-only")
        super().put_fold(session_id, generation, key, body)


def test_a_snapshot_is_written_once_per_cut_not_per_turn() -> None:
    backend = _CountingBackend()
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    mem = MemoryManager(backend, config)
    sid = mem.create_session("agent")
    cuts = set()
    for turn in range(40):
        if turn % 2 == 0:
            _long_session(mem, sid, 1)
        else:
            mem.add_message(sid, "user", "ok")
        mem.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))  # a new pruner per turn
        seed = mem._prompt_cache[sid].fold.seed  # type: ignore[union-attr]
        if seed is not None:
            cuts.add(seed.cut_end)
    assert 3 <= len(backend.writes) == len(cuts) < 40
    assert [FoldSnapshot.from_text(b).state.cut_end for b in backend.writes] == sorted(cuts)


def test_a_failed_snapshot_write_is_logged_and_the_prompt_built(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _CountingBackend(fail=True)
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    mem = MemoryManager(backend, config)
    sid = mem.create_session("agent")
    _long_session(mem, sid, 20)
    with caplog.at_level(logging.WARNING, logger="ctxkeep.prune.snapshots"):
        got = mem.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))
    assert backend.writes and "not stored" in caplog.text and "read-only" in caplog.text
    want = MemoryManager(backend, config).build_prompt_messages(sid, pruner=WholePruner(1500, 4))
    assert got == want


def test_a_new_process_does_not_count_again_what_the_snapshot_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ctxkeep.tokens import TiktokenCounter

    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory("memory://", config) as mem:
        sid = mem.create_session("agent")
        _long_session(mem, sid, 40)
        mem.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))  # stores a snapshot
        key = snapshot_key(TokenPruner(1500, 4), [])
        assert key is not None
        snap = FoldSnapshot.from_text(mem.backend.get_fold(sid, key) or "")
        assert len(snap.counts) >= 4  # the window's messages, as the pruner counted them
        before = {m.id for m in mem.get_messages(sid)}
        _long_session(mem, sid, 1)
        counted: list[Message] = []
        uncached = TiktokenCounter._uncached_message

        def recording(self: TiktokenCounter, m: Message) -> int:
            counted.append(m)
            return uncached(self, m)

        monkeypatch.setattr(TiktokenCounter, "_uncached_message", recording)
        got = MemoryManager(mem.backend, config).build_prompt_messages(
            sid, pruner=TokenPruner(1500, 4)
        )
        # Counted anew: the messages appended since, and compressed forms (made in this
        # process); never a message the snapshot holds a count of.
        again = [m for m in counted if m.id in before and "ctxkeep_compressed" not in m.metadata]
        assert again == []
        assert any(m.id not in before for m in counted)
        monkeypatch.setattr(TiktokenCounter, "_uncached_message", uncached)
        whole = MemoryManager(mem.backend, config)
        assert got == whole.build_prompt_messages(sid, pruner=WholePruner(1500, 4))


def test_a_snapshot_with_counts_that_do_not_check_out_is_replayed() -> None:
    config = MemoryConfig(max_history=None, session_ttl=None, max_sessions=None)
    with open_memory("memory://", config) as mem:
        sid = mem.create_session("agent")
        _long_session(mem, sid, 30)
        mem.build_prompt_messages(sid, pruner=TokenPruner(1500, 4))
        key = snapshot_key(TokenPruner(1500, 4), [])
        assert key is not None
        snap = FoldSnapshot.from_text(mem.backend.get_fold(sid, key) or "")
        window = [(i, n) for i, n in snap.counts if i >= snap.read_from]
        assert window
        want = MemoryManager(mem.backend, config).build_prompt_messages(
            sid, pruner=WholePruner(1500, 4)
        )
        i, n = window[-1]
        for wrong in (n + 5, max(n - 5, 0), -1):
            counts = tuple((j, wrong if j == i else c) for j, c in snap.counts)
            body = FoldSnapshot(**{**snap.__dict__, "counts": counts}).to_text()
            mem.backend.put_fold(sid, snap.generation, key, body)
            cold = MemoryManager(mem.backend, config)
            assert cold.build_prompt_messages(sid, pruner=TokenPruner(1500, 4)) == want
            assert cold._prompt_cache[sid].fold.base == 0  # type: ignore[union-attr]

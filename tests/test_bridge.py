"""``ctxkeep._bridge``: sync code run in the event loop's thread, its waits awaited there; the
caller sees the code's result or exception, the code sees the caller's context vars and
the awaited steps' errors, and an idle greenlet keeps nothing of the call it ran.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from typing import Any

import pytest

pytest.importorskip("greenlet")

from ctxkeep import _bridge

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


async def _answer(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


async def _fail() -> None:
    await asyncio.sleep(0)
    raise LookupError("awaited step failed")


def test_sync_code_gets_each_awaited_result_where_it_waits() -> None:
    def work(n: int) -> list[Any]:
        assert _bridge.bridged()
        return [_bridge.wait(_answer(i)) for i in range(n)]

    assert asyncio.run(_bridge.run(work, 3)) == [0, 1, 2]
    assert not _bridge.bridged()


def test_an_awaited_error_is_raised_at_the_wait_and_the_code_may_catch_it() -> None:
    def work() -> str:
        try:
            _bridge.wait(_fail())
        except LookupError as exc:
            return f"caught: {exc}"
        return "not raised"

    assert asyncio.run(_bridge.run(work)) == "caught: awaited step failed"


def test_an_error_of_the_code_reaches_the_caller_and_the_next_call_runs() -> None:
    def broken() -> None:
        _bridge.wait(_answer(1))
        raise KeyError("boom")

    async def main() -> Any:
        with pytest.raises(KeyError, match="boom"):
            await _bridge.run(broken)
        return await _bridge.run(lambda: _bridge.wait(_answer("next")))

    assert asyncio.run(main()) == "next"


def test_calls_at_once_in_one_loop_each_get_their_own_answers() -> None:
    def work(name: str) -> list[str]:
        return [_bridge.wait(_answer(f"{name}-{i}")) for i in range(20)]

    async def main() -> list[list[str]]:
        return await asyncio.gather(*(_bridge.run(work, f"c{n}") for n in range(12)))

    assert asyncio.run(main()) == [[f"c{n}-{i}" for i in range(20)] for n in range(12)]


def test_the_code_runs_in_a_copy_of_the_callers_context() -> None:
    def work() -> str:
        seen = VAR.get()
        VAR.set("set inside")
        _bridge.wait(_answer(None))
        return seen + " / " + VAR.get()

    async def main() -> tuple[str, str, str]:
        VAR.set("caller's")
        first = await _bridge.run(work)
        VAR.set("caller's again")
        second = await _bridge.run(work)  # a greenlet used before: the caller's context again
        return first, second, VAR.get()

    assert asyncio.run(main()) == (
        "caller's / set inside",
        "caller's again / set inside",
        "caller's again",
    )


def test_an_idle_greenlet_keeps_nothing_of_its_last_call() -> None:
    class Big:
        pass

    made: list[weakref.ref[Big]] = []

    def work() -> Big:
        big = Big()
        made.append(weakref.ref(big))
        _bridge.wait(_answer(None))
        return big

    def failing() -> None:
        big = Big()
        made.append(weakref.ref(big))
        raise ValueError(big)

    async def main() -> None:
        await _bridge.run(work)  # the result dropped at once
        with pytest.raises(ValueError):
            await _bridge.run(failing)

    asyncio.run(main())
    gc.collect()
    assert [ref() for ref in made] == [None, None]


def test_wait_outside_run_is_refused() -> None:
    awaitable = _answer(1)
    with pytest.raises(RuntimeError, match="outside"):
        _bridge.wait(awaitable)
    awaitable.close()

"""The Python functions a call runs, counted by the tests that bound a path's work in frames
rather than time (not collected)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection
from types import CodeType
from typing import Any


def frames(call: Callable[[], Any], only: Collection[CodeType] | None = None) -> list[str]:
    """The names of the Python functions ``call()`` runs, in order (only those whose code is
    in ``only``, if given)."""
    names: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and (only is None or frame.f_code in only):
            names.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return names

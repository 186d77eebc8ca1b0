"""The public API is exactly ``ctxkeep.__all__`` (as httpx's tests/test_exported_members.py)."""

from __future__ import annotations

import inspect

import ctxkeep


def test_every_name_in_all_exists() -> None:
    missing = [name for name in ctxkeep.__all__ if not hasattr(ctxkeep, name)]
    assert missing == []


def test_every_public_attribute_is_in_all() -> None:
    public = {
        name
        for name, value in vars(ctxkeep).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public - set(ctxkeep.__all__) == set()


def test_all_has_no_duplicates() -> None:
    assert len(ctxkeep.__all__) == len(set(ctxkeep.__all__))


def test_every_exported_error_derives_from_ctxkeep_error() -> None:
    errors = [
        value
        for name in ctxkeep.__all__
        if isinstance(value := getattr(ctxkeep, name), type) and issubclass(value, Exception)
    ]
    assert errors
    assert all(issubclass(e, ctxkeep.CtxkeepError) for e in errors)


def test_the_version_is_a_string() -> None:
    assert isinstance(ctxkeep.__version__, str)
    assert ctxkeep.__version__

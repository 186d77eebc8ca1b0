"""The real services the contract runs against (see ``tests/conftest_services.py``)."""

from __future__ import annotations

from conftest_services import (
    postgres_schema_factory,
    postgres_url,
    redis_prefix_factory,
    redis_url,
)

__all__ = ["postgres_schema_factory", "postgres_url", "redis_prefix_factory", "redis_url"]

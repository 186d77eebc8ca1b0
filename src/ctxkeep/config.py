"""Settings from a config file and the environment, in one place.

Precedence, highest first: an explicit argument, the environment (``CTXKEEP_*``), the config
file, the default. The config file is TOML: ``$CTXKEEP_CONFIG`` if set, else
``config.toml`` in the user's config directory (``platformdirs.user_config_dir("ctxkeep")``).

.. code-block:: toml

    max_prompt_length = 8192      # code points the gate allows
    max_prompt_tokens = 120000    # optional exact-token gate
    encoding = "o200k_base"
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from ctxkeep.errors import ConfigError


def config_path() -> Path:
    """Where the config file is read from (it need not exist)."""
    explicit = os.environ.get("CTXKEEP_CONFIG")
    if explicit:
        return Path(explicit)
    import platformdirs

    return Path(platformdirs.user_config_dir("ctxkeep")) / "config.toml"


def load_config_file(path: Path | None = None) -> dict[str, Any]:
    """The config file's settings, or ``{}`` if there is none.

    Raises:
        ConfigError: the file exists but is not valid TOML.

    """
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def setting_int(name: str, explicit: int | None, default: int | None) -> int | None:
    """An integer setting: explicit, else ``CTXKEEP_<NAME>``, else the file, else default.

    ``0`` (or an empty value) anywhere means "use the next source".

    Raises:
        ConfigError: a value that is not a non-negative integer.

    """
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int) or explicit < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {explicit!r}")
        if explicit:
            return explicit
    env = os.environ.get(f"CTXKEEP_{name.upper()}", "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ConfigError(
                f"CTXKEEP_{name.upper()} must be a non-negative integer, got {env!r}"
            ) from None
        if value < 0:
            raise ConfigError(f"CTXKEEP_{name.upper()} must be non-negative, got {value}")
        if value:
            return value
    raw = load_config_file().get(name)
    if raw is not None:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ConfigError(
                f"{name} in {config_path()} must be a non-negative integer, got {raw!r}"
            )
        if raw:
            return raw
    return default

"""Settings from a config file and the environment, in one place.

Precedence, highest first: an explicit argument, the environment (``CTXKEEP_<NAME>``), the
config file, the default. The config file is TOML: ``$CTXKEEP_CONFIG`` if set, else
``config.toml`` in the user's config directory (``platformdirs.user_config_dir("ctxkeep")``).
Its keys are the names of :data:`SETTINGS`:

.. code-block:: toml

    max_prompt_length = 8192      # code points the gate allows (CTXKEEP_MAX_PROMPT_LENGTH)
    max_prompt_tokens = 120000    # optional exact-token gate (CTXKEEP_MAX_PROMPT_TOKENS)
    encoding = "o200k_base"       # get_counter()'s default (CTXKEEP_ENCODING)

A key the file should not have (a typo such as ``max_prompt_lenght``, or a setting of a newer
ctxkeep) is not ignored silently: reading the file warns with a :class:`ConfigWarning` that
names the key, the closest known key and every known key. It is a warning, not an error, so
that a config file shared with a newer ctxkeep still works; turn it into an error with
``warnings.simplefilter("error", ConfigWarning)``. A known key with a value of the wrong kind
is a :class:`~ctxkeep.errors.ConfigError`.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import warnings
from pathlib import Path
from typing import Any

from ctxkeep.errors import ConfigError

SETTINGS: dict[str, str] = {
    "max_prompt_length": "code points PromptGate allows (an integer; default 8192)",
    "max_prompt_tokens": "exact tokens PromptGate allows (an integer; default: no limit)",
    "encoding": "the encoding or model name get_counter() uses (default o200k_base)",
    "pg_pool_max": "most connections a process opens to one PostgreSQL server (an integer; "
    "default: what its stores ask for, 8)",
}
"""Every key the config file may hold, with what it sets."""


class ConfigWarning(UserWarning):
    """The config file holds a key ctxkeep does not know (it is ignored)."""


def config_path() -> Path:
    """Where the config file is read from (it need not exist)."""
    explicit = os.environ.get("CTXKEEP_CONFIG")
    if explicit:
        return Path(explicit)
    import platformdirs

    return Path(platformdirs.user_config_dir("ctxkeep")) / "config.toml"


def load_config_file(path: Path | None = None) -> dict[str, Any]:
    """The config file's settings, or ``{}`` if there is none.

    Warns:
        ConfigWarning: for each key that is not one of :data:`SETTINGS` (it is ignored).

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
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for key in data:
        if key not in SETTINGS:
            # Attributed to this line, so Python's default filter shows each once per process
            # however many settings are read.
            warnings.warn(_unknown_key(key, path), ConfigWarning, stacklevel=1)
    return {k: v for k, v in data.items() if k in SETTINGS}


def _unknown_key(key: str, path: Path) -> str:
    close = difflib.get_close_matches(key, SETTINGS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"unknown key {key!r} in config file {path}{hint}; it is ignored. "
        f"Known keys: {', '.join(sorted(SETTINGS))}"
    )


def _env_name(name: str) -> str:
    return f"CTXKEEP_{name.upper()}"


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
    env_name = _env_name(name)
    env = os.environ.get(env_name, "").strip()
    if env:
        try:
            value = int(env)
        except ValueError:
            raise ConfigError(f"{env_name} must be a non-negative integer, got {env!r}") from None
        if value < 0:
            raise ConfigError(f"{env_name} must be non-negative, got {value}")
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


def setting_str(name: str, explicit: str | None, default: str) -> str:
    """A text setting: explicit, else ``CTXKEEP_<NAME>``, else the file, else default.

    An empty (or all-blank) value anywhere means "use the next source"; values are stripped.

    Raises:
        ConfigError: a config-file value that is not a string (an explicit value that is not
            one is the caller's to refuse, with the error its parameter calls for).

    """
    if explicit is not None and explicit.strip():
        return explicit.strip()
    env = os.environ.get(_env_name(name), "").strip()
    if env:
        return env
    raw = load_config_file().get(name)
    if raw is not None:
        if not isinstance(raw, str):
            raise ConfigError(f"{name} in {config_path()} must be a string, got {raw!r}")
        if raw.strip():
            return raw.strip()
    return default

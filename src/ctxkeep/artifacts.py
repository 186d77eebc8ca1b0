"""Artifact stores: where the full text of a compressed tool output lives.

Refs are content addressed (``sha256:<hex>`` of the UTF-8 text), so storing the same output
twice stores it once and a ref always names exactly one text. Three stores:

* :class:`MemoryArtifactStore`: a dict, for one process.
* :class:`SQLiteArtifactStore`: one table in a SQLite file (WAL), shared by processes.
* :class:`DirectoryArtifactStore`: one file per artifact, written atomically.

:func:`open_artifacts` picks one from a URL. :data:`READ_ARTIFACT_TOOL` is a tool definition an
agent can be given so it can read a compressed output back; :func:`read_artifact_tool` answers
its calls.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ctxkeep.errors import ArtifactNotFoundError, ConfigError, InvalidMessageError, StorageError

REF_PREFIX = "sha256:"


def artifact_ref(text: str) -> str:
    """The content-addressed ref of ``text``."""
    return REF_PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _check_ref(ref: Any) -> str:
    if (
        not isinstance(ref, str)
        or not ref.startswith(REF_PREFIX)
        or len(ref) != len(REF_PREFIX) + 64
        or any(c not in "0123456789abcdef" for c in ref[len(REF_PREFIX) :])
    ):
        raise ArtifactNotFoundError(f"not an artifact ref: {ref!r} (expected sha256:<64 hex>)")
    return ref


@runtime_checkable
class ArtifactStore(Protocol):
    """Stores texts under content-addressed refs."""

    def put(self, text: str) -> str:
        """Store ``text`` (idempotent) and return its ref."""
        ...

    def get(self, ref: str) -> str:
        """The exact text stored under ``ref``.

        Raises:
            ArtifactNotFoundError: nothing is stored under ``ref``.

        """
        ...

    def __contains__(self, ref: object) -> bool:
        """True if ``ref`` is stored."""
        ...


class MemoryArtifactStore:
    """Artifacts in a dict, for one process."""

    def __init__(self) -> None:
        self._data: dict[str, str] = {}
        self._lock = threading.Lock()

    def put(self, text: str) -> str:
        """Store ``text`` and return its ref."""
        if not isinstance(text, str):
            raise TypeError(f"artifacts are text, got {type(text).__name__}")
        ref = artifact_ref(text)
        with self._lock:
            self._data.setdefault(ref, text)
        return ref

    def get(self, ref: str) -> str:
        """The text stored under ``ref``."""
        try:
            return self._data[_check_ref(ref)]
        except KeyError:
            raise ArtifactNotFoundError(f"no artifact {ref}") from None

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, str) and ref in self._data

    def __len__(self) -> int:
        return len(self._data)


class SQLiteArtifactStore:
    """Artifacts in a SQLite file (WAL mode; safe across processes on one machine)."""

    SCHEMA_VERSION = 1

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        with self._conn() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS ctxkeep_artifacts ("
                "ref TEXT PRIMARY KEY, text TEXT NOT NULL, schema_version INTEGER NOT NULL, "
                "created_at REAL NOT NULL)"
            )

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA busy_timeout=30000")
            except sqlite3.Error as exc:
                raise StorageError(f"cannot open artifact store {self.path}: {exc}") from exc
            self._local.conn = conn
        return conn

    def put(self, text: str) -> str:
        """Store ``text`` and return its ref."""
        if not isinstance(text, str):
            raise TypeError(f"artifacts are text, got {type(text).__name__}")
        ref = artifact_ref(text)
        try:
            self._conn().execute(
                "INSERT INTO ctxkeep_artifacts (ref, text, schema_version, created_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (ref) DO NOTHING",
                (ref, text, self.SCHEMA_VERSION, time.time()),
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot store artifact in {self.path}: {exc}") from exc
        return ref

    def get(self, ref: str) -> str:
        """The text stored under ``ref``."""
        try:
            row = (
                self._conn()
                .execute("SELECT text FROM ctxkeep_artifacts WHERE ref = ?", (_check_ref(ref),))
                .fetchone()
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot read artifact store {self.path}: {exc}") from exc
        if row is None:
            raise ArtifactNotFoundError(f"no artifact {ref} in {self.path}")
        return str(row[0])

    def __contains__(self, ref: object) -> bool:
        if not isinstance(ref, str):
            return False
        row = self._conn().execute("SELECT 1 FROM ctxkeep_artifacts WHERE ref = ?", (ref,))
        return row.fetchone() is not None

    def close(self) -> None:
        """Close this thread's connection."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


class DirectoryArtifactStore:
    """One file per artifact under a directory (``<dir>/<hex[:2]>/<hex>.txt``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, ref: str) -> Path:
        digest = _check_ref(ref)[len(REF_PREFIX) :]
        return self.path / digest[:2] / f"{digest}.txt"

    def put(self, text: str) -> str:
        """Store ``text`` (atomically: a temp file renamed into place) and return its ref."""
        if not isinstance(text, str):
            raise TypeError(f"artifacts are text, got {type(text).__name__}")
        ref = artifact_ref(text)
        target = self._file(ref)
        if target.exists():
            return ref
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise StorageError(f"cannot store artifact in {self.path}: {exc}") from exc
        return ref

    def get(self, ref: str) -> str:
        """The text stored under ``ref``."""
        try:
            return self._file(ref).read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise ArtifactNotFoundError(f"no artifact {ref} in {self.path}") from None

    def __contains__(self, ref: object) -> bool:
        try:
            return isinstance(ref, str) and self._file(ref).exists()
        except ArtifactNotFoundError:
            return False


def open_artifacts(url: str = "memory://") -> ArtifactStore:
    """An artifact store from a URL: ``memory://``, ``sqlite:///path.db`` or ``file:///dir``.

    Raises:
        ConfigError: an unsupported URL.

    """
    if url == "memory://":
        return MemoryArtifactStore()
    if url.startswith("sqlite:///"):
        return SQLiteArtifactStore(url[len("sqlite:///") :] or "ctxkeep.db")
    if url.startswith("file://"):
        return DirectoryArtifactStore(url[len("file://") :])
    raise ConfigError(
        f"unsupported artifact store URL {url!r}; use memory://, sqlite:///path or file:///dir"
    )


READ_ARTIFACT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_artifact",
        "description": (
            "Read back the full text of an earlier tool output that was compressed to save "
            "context. Pass the ref shown in the compressed output; use offset and limit (in "
            "characters) to page through a long one."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "the artifact ref, sha256:..."},
                "offset": {"type": "integer", "minimum": 0, "default": 0},
                "limit": {"type": "integer", "minimum": 1, "default": 8000},
            },
            "required": ["ref"],
            "additionalProperties": False,
        },
    },
}


def read_artifact_tool(store: ArtifactStore, arguments: str | dict[str, Any]) -> str:
    """Answer a ``read_artifact`` tool call.

    Returns:
        The requested slice of the artifact, with a note of what remains.

    Raises:
        InvalidMessageError: arguments that are not JSON or miss ``ref``.
        ArtifactNotFoundError: an unknown ref.

    """
    if isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except ValueError as exc:
            raise InvalidMessageError(f"read_artifact arguments are not JSON: {exc}") from exc
    else:
        args = dict(arguments)
    if not isinstance(args, dict) or "ref" not in args:
        raise InvalidMessageError("read_artifact needs a 'ref' argument")
    offset = int(args.get("offset", 0) or 0)
    limit = int(args.get("limit", 8000) or 8000)
    if offset < 0 or limit < 1:
        raise InvalidMessageError("read_artifact offset must be >= 0 and limit >= 1")
    text = store.get(args["ref"])
    chunk = text[offset : offset + limit]
    rest = len(text) - offset - len(chunk)
    if rest > 0:
        chunk += f"\n[{rest} more characters: call read_artifact with offset={offset + limit}]"
    return chunk

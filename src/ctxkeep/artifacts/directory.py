"""Artifacts as files under a directory (``file:///dir``): ``<dir>/<hex[:2]>/<hex>.txt``.

Each file holds the UTF-8 text and nothing else, written atomically (a temp file in the same
folder, fsync-ed, renamed into place), so a reader sees a whole artifact or none and several
processes may write into one directory. The layout's version is the file
``ctxkeep-artifacts.version``; a directory written before it existed has the version 1 layout
and is adopted as such.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ctxkeep.artifacts.base import REF_PREFIX, ArtifactStore
from ctxkeep.errors import SchemaVersionError, StorageError

SCHEMA_VERSION = 1
VERSION_FILE = "ctxkeep-artifacts.version"


def write_atomically(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a renamed temp file.

    Raises:
        OSError: the folder is not writable or the disk is full (the temp file is removed).

    """
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DirectoryArtifactStore(ArtifactStore):
    """One file per artifact under a directory.

    Raises:
        StorageError: the directory cannot be created or written.
        SchemaVersionError: the directory was written by a newer ctxkeep.

    """

    name = "directory"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._check_version()
        except OSError as exc:
            raise StorageError(f"cannot open artifact directory {self.path}: {exc}") from exc

    @property
    def where(self) -> str:
        """The directory."""
        return str(self.path)

    def _check_version(self) -> None:
        marker = self.path / VERSION_FILE
        try:
            raw = marker.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            write_atomically(marker, f"{SCHEMA_VERSION}\n")
            return
        if not raw.isdigit():
            raise SchemaVersionError(f"{marker} holds an invalid schema version {raw!r}")
        if int(raw) > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path} holds artifacts of a newer ctxkeep (schema {raw}; this one reads "
                f"up to {SCHEMA_VERSION}); upgrade ctxkeep"
            )

    def _file(self, ref: str) -> Path:
        digest = ref[len(REF_PREFIX) :]
        return self.path / digest[:2] / f"{digest}.txt"

    def _put(self, ref: str, text: str) -> None:
        target = self._file(ref)
        if target.exists():
            return
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(target, text)
        except OSError as exc:
            raise StorageError(f"cannot store artifact in {self.path}: {exc}") from exc

    def _get(self, ref: str) -> str | None:
        try:
            return self._file(ref).read_bytes().decode("utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read artifact {ref} in {self.path}: {exc}") from exc

    def _has(self, ref: str) -> bool:
        return self._file(ref).is_file()

"""Artifact refs and the :class:`ArtifactStore` interface.

Refs are content addressed (``sha256:<hex>`` of the UTF-8 text), so storing the same output
twice stores it once and a ref always names exactly one text. :class:`ArtifactStore` does what
every backend shares: it checks the text (a ``str`` that UTF-8 can encode) and the ref (the
``sha256:<64 lowercase hex>`` form, so a path such as ``../../etc/passwd`` never reaches a
backend), computes the ref and raises the typed errors. A backend supplies three primitives over
already checked values: ``_put`` (idempotent: keep what is there), ``_get`` and ``_has``.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from ctxkeep.errors import ArtifactNotFoundError, InvalidMessageError, InvalidTypeError, describe

REF_PREFIX = "sha256:"
RECORD_VERSION = 1
"""The version of a stored artifact row, for the stores that keep one per row (SQL tables)."""
_HEX = frozenset("0123456789abcdef")


def _utf8(text: Any) -> bytes:
    if not isinstance(text, str):
        raise InvalidTypeError(f"artifacts are text (str), got {type(text).__name__}")
    try:
        return str.encode(text, "utf-8")  # not a subclass's own encode()
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(
            f"an artifact must be valid Unicode; this text has {exc.reason} at position "
            f"{exc.start} ({describe(text[exc.start : exc.end])}): decode the tool output with "
            "errors='replace' first"
        ) from None


def artifact_ref(text: str) -> str:
    """The content-addressed ref of ``text``.

    Raises:
        InvalidTypeError: ``text`` is not a ``str`` (a ``TypeError``).
        InvalidMessageError: ``text`` is not valid Unicode (a lone surrogate; a ``ValueError``).

    """
    return REF_PREFIX + hashlib.sha256(_utf8(text)).hexdigest()


def is_ref(ref: object) -> bool:
    """Whether ``ref`` has the form of an artifact ref (``sha256:`` and 64 lowercase hex)."""
    return (
        isinstance(ref, str)
        and len(ref) == len(REF_PREFIX) + 64
        and ref.startswith(REF_PREFIX)
        and _HEX.issuperset(ref[len(REF_PREFIX) :])
    )


def check_ref(ref: object) -> str:
    """``ref`` itself if it has the form of an artifact ref.

    Raises:
        ArtifactNotFoundError: it has not (no artifact can be stored under it).

    """
    if not is_ref(ref):
        raise ArtifactNotFoundError(
            f"not an artifact ref: {describe(ref)} (expected sha256:<64 hex>)"
        )
    return str(ref)


class ArtifactStore(ABC):
    """Stores texts under content-addressed refs; reads give back exactly the stored text.

    Stores are safe to share between threads; persistent ones between processes too.
    """

    name = "artifacts"

    def put(self, text: str) -> str:
        """Store ``text`` (idempotent: the same text is stored once) and return its ref.

        Raises:
            InvalidTypeError: ``text`` is not a ``str`` (a ``TypeError``).
            InvalidMessageError: ``text`` is not valid Unicode (a ``ValueError``).
            StorageError: the backend failed.

        """
        ref = artifact_ref(text)
        # A str subclass may carry state or override methods; store the plain text.
        self._put(ref, str.__str__(text))
        return ref

    def put_many(self, texts: Iterable[str]) -> list[str]:
        """Store each of ``texts`` (idempotent, as :meth:`put`) and return their refs in
        order, in one transaction or round trip where the backend can (a prompt build stores
        the full text of every output it compresses; most are stored already).

        Raises:
            InvalidTypeError: a text is not a ``str`` (a ``TypeError``).
            InvalidMessageError: a text is not valid Unicode (a ``ValueError``).
            StorageError: the backend failed.

        """
        items: dict[str, str] = {}
        refs = []
        for text in texts:
            ref = artifact_ref(text)
            refs.append(ref)
            items.setdefault(ref, str.__str__(text))
        if items:
            self._put_many(items)
        return refs

    def get(self, ref: str) -> str:
        """The exact text stored under ``ref``.

        Raises:
            ArtifactNotFoundError: nothing is stored under ``ref``, or it is not a ref
                (a ``LookupError``).
            StorageError: the backend failed.

        """
        text = self._get(check_ref(ref))
        if text is None:
            raise ArtifactNotFoundError(f"no artifact {ref} in {self.where}")
        return text

    def __contains__(self, ref: object) -> bool:
        """True if ``ref`` is stored (False for anything that is not a ref)."""
        return is_ref(ref) and self._has(str(ref))

    @property
    def where(self) -> str:
        """Where the store keeps its artifacts, for messages."""
        return self.name

    def close(self) -> None:  # noqa: B027 - optional
        """Release resources (idempotent)."""

    def __enter__(self) -> ArtifactStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- primitives ------------------------------------------------------------------------

    @abstractmethod
    def _put(self, ref: str, text: str) -> None:
        """Store ``text`` under ``ref`` unless something is stored there already."""

    def _put_many(self, items: dict[str, str]) -> None:
        """Store each text under its ref unless something is stored there already (backends
        with batches override it).
        """
        for ref, text in items.items():
            self._put(ref, text)

    @abstractmethod
    def _get(self, ref: str) -> str | None:
        """The text stored under ``ref``, or None."""

    def _has(self, ref: str) -> bool:
        """Whether something is stored under ``ref`` (backends may answer without reading it)."""
        return self._get(ref) is not None

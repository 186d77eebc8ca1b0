"""An artifact store that holds what a prompt build writes until the build succeeds."""

from __future__ import annotations

from ctxkeep.artifacts.base import ArtifactStore


class StagedArtifacts(ArtifactStore):
    """The artifacts a prompt build writes (the full text of each output it compresses), held
    until the build succeeds and then written to ``target`` with :meth:`commit`: a build
    refused on the way (a system prompt over the budget) stores nothing, as every refused
    request (issue 25: a 422 had left three artifacts behind).
    """

    name = "staged"

    def __init__(self, target: ArtifactStore) -> None:
        self.target = target
        self._pending: dict[str, str] = {}

    def _put(self, ref: str, text: str) -> None:
        self._pending.setdefault(ref, text)

    def _get(self, ref: str) -> str | None:
        found = self._pending.get(ref)
        if found is None and ref in self.target:
            found = self.target.get(ref)
        return found

    def _has(self, ref: str) -> bool:
        return ref in self._pending or ref in self.target

    def commit(self) -> None:
        """Write what the build staged to the target store, in one batch
        (:meth:`~ctxkeep.artifacts.base.ArtifactStore.put_many`).
        """
        self.target.put_many(self._pending.values())
        self._pending.clear()


__all__ = ["StagedArtifacts"]

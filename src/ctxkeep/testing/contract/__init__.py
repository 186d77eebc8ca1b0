"""The conformance suites every backend must pass, importable by third parties.

Subclass :class:`SessionContract` in a test module and provide a ``make_memory`` fixture: a
callable taking a :class:`~ctxkeep.MemoryConfig` (and an optional ``clock``) and returning a
fresh, empty :class:`~ctxkeep.MemoryManager` on your backend::

    import pytest
    from ctxkeep.testing.contract import SessionContract

    class TestMyBackend(SessionContract):
        @pytest.fixture
        def make_memory(self, tmp_path):
            def make(config, clock=None):
                return MemoryManager(MyBackend(...), config, **({"clock": clock} if clock else {}))
            return make

Every test uses its own sessions and cleans up through the manager.

One module per interface: :mod:`.sessions`, :mod:`.checkpoints`, :mod:`.episodic`,
:mod:`.artifacts`, :mod:`.bus`; the names below are importable from here.
"""

from ctxkeep.testing.contract._common import Clock, MakeMemory, full_message, tool_unit
from ctxkeep.testing.contract.artifacts import ArtifactContract, PersistentArtifactContract
from ctxkeep.testing.contract.bus import BusContract, MakeBus
from ctxkeep.testing.contract.checkpoints import CheckpointContract
from ctxkeep.testing.contract.episodic import EPISODE_FACTS, EpisodicContract
from ctxkeep.testing.contract.sessions import SessionContract

__all__ = [
    "EPISODE_FACTS",
    "ArtifactContract",
    "BusContract",
    "CheckpointContract",
    "Clock",
    "EpisodicContract",
    "MakeBus",
    "MakeMemory",
    "PersistentArtifactContract",
    "SessionContract",
    "full_message",
    "tool_unit",
]

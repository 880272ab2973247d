"""GPU tests: they run on a machine with an NVIDIA GPU (``make test-gpu``) and are skipped, saying why,
where there is none. The real-CRIU fixtures are the integration tests' own."""

from __future__ import annotations

import pytest

from tests.integration.conftest import _subreaper, cluster, criu  # noqa: F401  (fixtures)
from tests.integration.mechanisms.interpose.test_interpose import rendezvous, torchrun  # noqa: F401  (fixtures)
from tidal.errors import MechanismError
from tidal.mechanisms.gpu.driver import CudaDriver


@pytest.fixture(scope="session")
def gpus() -> list[str]:
    """The UUIDs of this machine's GPUs, by index."""
    try:
        found = CudaDriver.load().uuids()
    except MechanismError as exc:
        pytest.skip(f"no usable NVIDIA GPU here ({exc.message}): GPU tests need one")
    if not found:
        pytest.skip("the NVIDIA driver sees no GPU here: GPU tests need one")
    return found

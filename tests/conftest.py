"""Shared pytest setup for the CPU suite (tests/gpu has GPU-only tests that skip themselves)."""

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
# Helpers next to the tests (tide_ref.py) import as plain modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skips itself without one")
    config.addinivalue_line("markers", "multigpu: needs >= 2 CUDA GPUs; skips itself without them")
    config.addinivalue_line("markers", "slow: builds wheels or venvs (still part of the CPU suite)")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def native():
    """nccl_tide._native with the library loaded; fails (never skips) if it cannot load."""
    from nccl_tide import _native

    _native.lib()
    return _native


@pytest.fixture
def rng(request) -> np.random.Generator:
    # Deterministic per test (reproducible failures), different across tests.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))

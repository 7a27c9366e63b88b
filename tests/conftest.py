"""Shared pytest setup for every test folder: markers, fixtures, and the GPU skip.

tests/unit (CPU), tests/native (C/C++ sources the unit tests build and run), tests/gpu (one card), tests/multirank
(several processes; multirank/harness.py starts them), tests/fuzz. Tests that need a GPU (everything in tests/gpu,
and any test marked gpu elsewhere) skip themselves where torch has no CUDA device.
"""

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# Modules shared across folders (tide_ref, fsdp_llama, multirank.harness) import from tests/.
sys.path.insert(0, str(TESTS))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skips itself without one")
    config.addinivalue_line("markers", "multigpu: needs >= 2 CUDA GPUs; skips itself without them")
    config.addinivalue_line("markers", "slow: builds wheels or venvs (still part of the CPU suite)")


def _cuda_ok() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    gpu_dir = str(TESTS / "gpu")
    needs_gpu = [it for it in items if str(it.fspath).startswith(gpu_dir) or it.get_closest_marker("gpu")]
    if not needs_gpu or _cuda_ok():
        return
    skip = pytest.mark.skip(reason="needs torch with a CUDA device")
    for item in needs_gpu:
        item.add_marker(skip)


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


@pytest.fixture(scope="session")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.fixture(scope="session")
def cuda_lib(torch_cuda):
    """The library must be a CUDA build: a stub build here is a failure, not a skip."""
    import ctypes

    from nccl_tide import _native

    lib = _native.lib()
    comms = (ctypes.c_void_p * 2)()
    res = lib.tideLoopbackCreate(2, 0, comms)
    assert res == 0, f"tideLoopbackCreate failed ({res}): {_native.last_error()} (is {_native.library_path()} a CUDA build?)"
    for c in comms:
        lib.tideCommDestroy(c)
    return lib

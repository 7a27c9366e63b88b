"""pytest setup for the benchmarks' own tests: benchmarks/ on sys.path (the benchmark modules import as plain
modules, as `python benchmarks/x.py` runs them), the suite's markers, and the fixtures these tests share.

Tests marked gpu skip themselves without torch and a CUDA device; the rest run on the CPU.
"""

import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # loopback worlds, before CUDA initializes

import numpy as np  # noqa: E402
import pytest  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent
sys.path.insert(0, str(BENCHMARKS))


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
    here = str(Path(__file__).resolve().parent)
    gpu_items = [i for i in items if str(i.fspath).startswith(here) and i.get_closest_marker("gpu")]
    if gpu_items and not _cuda_ok():
        skip = pytest.mark.skip(reason="needs torch with a CUDA device")
        for item in gpu_items:
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

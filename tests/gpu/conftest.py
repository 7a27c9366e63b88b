"""GPU tests of the CUDA data path (marker gpu). They skip themselves without torch or a CUDA device.

CUDA_DEVICE_MAX_CONNECTIONS must be set before CUDA initializes: loopback worlds of up to 8 virtual ranks keep up
to 16 streams busy with cross-stream flag waits (see nccl_tide/cuda.py).
"""

import os

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import pytest  # noqa: E402


def _cuda_ok() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="needs torch with a CUDA device")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


@pytest.fixture(scope="session")
def cuda_lib(torch_cuda):
    """The library must be a CUDA build: a stub build here is a failure, not a skip."""
    from nccl_tide import _native

    lib = _native.lib()
    import ctypes

    comms = (ctypes.c_void_p * 2)()
    res = lib.tideLoopbackCreate(2, 0, comms)
    assert res == 0, f"tideLoopbackCreate failed ({res}): {_native.last_error()} (is {_native.library_path()} a CUDA build?)"
    for c in comms:
        lib.tideCommDestroy(c)
    return lib

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""GPU tests of the CUDA data path (marker gpu; tests/conftest.py skips them without torch or a CUDA device), and
the loopback worlds they share (`worlds`).

CUDA_DEVICE_MAX_CONNECTIONS must be set before CUDA initializes: loopback worlds of up to 8 virtual ranks keep up
to 16 streams busy with cross-stream flag waits (see nccl_tide/cuda.py).
"""

import os

import pytest

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


@pytest.fixture(scope="module")
def worlds(torch_cuda, cuda_lib):
    """worlds(n): the test module's loopback world of n virtual ranks, made on first use, closed after the module."""
    from nccl_tide.cuda import LoopbackWorld

    made = {}

    def get(n):
        if n not in made:
            made[n] = LoopbackWorld(n)
        return made[n]

    yield get
    for w in made.values():
        w.close()

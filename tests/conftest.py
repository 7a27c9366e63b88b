# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup for every test folder: markers, fixtures (tests/fixtures.py), and the GPU skip.

tests/unit (CPU), tests/native (C/C++ sources the unit tests build and run), tests/gpu (one card), tests/multirank
(several processes; multirank/harness.py starts them), tests/fuzz. Tests that need a GPU (everything in tests/gpu,
and any test marked gpu elsewhere) skip themselves where torch has no CUDA device.
"""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Modules shared across folders (tide_ref, fsdp_llama, multirank.harness, fixtures) import from tests/.
sys.path.insert(0, str(TESTS))
from fixtures import _cuda_ok, cuda_lib, native, register_markers, repo, rng, torch_cuda  # noqa: E402, F401


def pytest_configure(config):
    register_markers(config)


def pytest_collection_modifyitems(config, items):
    gpu_dir = str(TESTS / "gpu")
    needs_gpu = [it for it in items if str(it.fspath).startswith(gpu_dir) or it.get_closest_marker("gpu")]
    if not needs_gpu or _cuda_ok():
        return
    skip = pytest.mark.skip(reason="needs torch with a CUDA device")
    for item in needs_gpu:
        item.add_marker(skip)

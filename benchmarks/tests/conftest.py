# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""pytest setup for the benchmarks' own tests: benchmarks/ on sys.path (the benchmark modules import as plain
modules, as `python benchmarks/<script>.py` runs them), the suite's markers, and the fixtures these tests share.

Tests marked gpu skip themselves without torch and a CUDA device; the rest run on the CPU.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # loopback worlds, before CUDA initializes

import pytest  # noqa: E402

BENCHMARKS = Path(__file__).resolve().parents[1]
REPO = BENCHMARKS.parent
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(REPO / "tests"))  # the suite's shared fixtures
from fixtures import _cuda_ok, cuda_lib, native, register_markers, repo, rng, torch_cuda  # noqa: E402, F401


def pytest_configure(config):
    register_markers(config)


def pytest_collection_modifyitems(config, items):
    here = str(Path(__file__).resolve().parent)
    gpu_items = [i for i in items if str(i.fspath).startswith(here) and i.get_closest_marker("gpu")]
    if gpu_items and not _cuda_ok():
        skip = pytest.mark.skip(reason="needs torch with a CUDA device")
        for item in gpu_items:
            item.add_marker(skip)

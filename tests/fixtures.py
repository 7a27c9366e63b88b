# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Fixtures and checks shared by the conftests of tests/ and benchmarks/tests (both import from here)."""

import os
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
MARKERS = (
    "gpu: needs a CUDA GPU; skips itself without one",
    "multigpu: needs >= 2 CUDA GPUs; skips itself without them",
    "slow: builds wheels, venvs or extensions, or trains a framework example (still part of the CPU suite)",
)


def repo_files(repo=REPO) -> list:
    """The checkout's files, relative to it: git's tracked and not-ignored ones; in a source package without .git,
    every file below the root but build outputs."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            capture_output=True, text=True)
    names = listed.stdout.split() if listed.returncode == 0 else []
    if not names:
        for top, dirs, files in os.walk(repo):
            dirs[:] = [d for d in dirs if not d.startswith((".git", ".venv", "build", "_build", "dist", "__pycache__"))
                       and not d.endswith(".egg-info")]
            names += [os.path.relpath(os.path.join(top, f), repo) for f in files]
    return sorted(n for n in names if (repo / n).is_file())


def build_native_test(out: Path, sources, repo: Path = REPO) -> Path:
    """Compiles a host-only test program of tests/native with the library's sources into `out` (C++17, -Wall -Werror,
    the library's include paths); the calling test fails with the compiler's output when it does not build."""
    includes = [repo / "include", repo / "plugin" / "core", repo / "plugin" / "api", repo / "plugin",
                repo / "tests" / "native"]
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Werror", *(f"-I{d}" for d in includes), *map(str, sources), "-o",
           str(out), "-pthread"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def register_markers(config) -> None:
    for m in MARKERS:
        config.addinivalue_line("markers", m)


def _cuda_ok() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


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
    assert res == 0, (f"tideLoopbackCreate failed ({res}): {_native.last_error()} "
                      f"(is {_native.library_path()} a CUDA build?)")
    for c in comms:
        lib.tideCommDestroy(c)
    return lib


NO_TEST_SWITCHES = ("the library is no test build (-DTIDE_TEST_SWITCHES=ON): it has no test-only switches "
                    "(docs/env.md, Test builds)")


def has_test_switches() -> bool:
    """Whether the loaded library is a test build (-DTIDE_TEST_SWITCHES=ON): its registry has the test-only switches."""
    from nccl_tide import _native

    try:
        _native.param_value("NCCL_TIDE_TEST_SWITCHES")
    except KeyError:
        return False
    return True

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The interposer's record of the buffers an application registered with NCCL (plugin/api/interposer_windows.h)
and the comm's peer regions (plugin/cuda/peer_regions.h), through tests/native/interposer_windows_test.cc: window
kinds and bounds, registrations inside groups (filled at the group's end, dropped when it fails), deregistration,
random ranges against random windows, and peer addresses at the same offset."""

import random
import subprocess

import pytest
from fixtures import build_native_test


@pytest.fixture(scope="module")
def windows_exe(repo, tmp_path_factory):
    return build_native_test(tmp_path_factory.mktemp("interposer_windows") / "interposer_windows_test",
                             [repo / "tests" / "native" / "interposer_windows_test.cc",
                              repo / "plugin" / "api" / "interposer_windows.cc",
                              repo / "plugin" / "core" / "fork_guard.cc"])


def test_registered_buffers_and_peer_regions(windows_exe):
    seed = random.randrange(1 << 30)
    r = subprocess.run([str(windows_exe), str(seed)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"seed {seed}: " + r.stderr[-3000:]
    assert "all checks passed" in r.stdout

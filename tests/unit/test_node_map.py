# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""TIDE's nodes = NCCL's hosts (plugin/core/node_map), through tests/native/node_map_test.cc: NCCL_HOSTID is the
host identity exactly when set, random worlds split as a direct model says, and NCCL_TIDE_RANKS_PER_NODE groups
ranks of one machine across NCCL hosts but never across machines."""

import subprocess

import pytest
from fixtures import build_native_test


@pytest.fixture(scope="module")
def node_map_exe(repo, tmp_path_factory):
    core = repo / "plugin" / "core"
    return build_native_test(tmp_path_factory.mktemp("node_map") / "node_map_test",
                             [repo / "tests" / "native" / "node_map_test.cc", core / "node_map.cc",
                              core / "errors.cc", core / "log.cc", core / "params.cc", core / "fork_guard.cc"])


def test_nodes_follow_nccl_hosts_unless_declared(node_map_exe):
    r = subprocess.run([str(node_map_exe), "3000"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all checks passed (3000 worlds)" in r.stdout

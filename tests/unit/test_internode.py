# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The choice of a comm's inter-node transport (plugin/core/internode) through tests/native/internode_test.cc: every
combination of NCCL_TIDE_INTERNODE, peer mapping and NCCL communicator (forced rma refused as not built, sendrecv
needing an NCCL communicator, the INFO line naming the transport and why), and the parameter as the environment sets
it."""

import os
import subprocess

import pytest
from fixtures import build_native_test


@pytest.fixture(scope="module")
def internode_exe(repo, tmp_path_factory):
    core = repo / "plugin" / "core"
    return build_native_test(tmp_path_factory.mktemp("internode") / "internode_test",
                             [repo / "tests" / "native" / "internode_test.cc", core / "internode.cc",
                              core / "errors.cc", core / "log.cc", core / "params.cc", core / "fork_guard.cc"])


@pytest.mark.parametrize("value,expected", [(None, "0"), ("auto", "0"), ("SendRecv", "1"), ("sendrecv", "1"),
                                            ("RMA", "2"), ("put", "invalid"), ("", "invalid")])
def test_transport_choice(internode_exe, value, expected):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_TIDE_")}
    if value is not None:
        env["NCCL_TIDE_INTERNODE"] = value
    r = subprocess.run([str(internode_exe), expected], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all checks passed" in r.stdout

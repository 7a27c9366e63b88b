# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The interposer's group recorder (plugin/api/interposer_group.h) through tests/native/interposer_group_test.cc:
the frameworks' grouped call sequences (Megatron's buckets, nested groups, two communicators, a capturing stream,
a PREMUL_SUM op destroyed before the group ends, TIDE turning off mid-group, a nonblocking communicator, a failed
group end) against fake NCCL and TIDE hooks, then random sequences checked against the rules a group must keep."""

import subprocess

import pytest
from fixtures import build_native_test


@pytest.fixture(scope="module")
def group_exe(repo, tmp_path_factory):
    api, core = repo / "plugin" / "api", repo / "plugin" / "core"
    return build_native_test(tmp_path_factory.mktemp("interposer_group") / "interposer_group_test",
                             [repo / "tests" / "native" / "interposer_group_test.cc", api / "interposer_group.cc",
                              api / "interposer_ops.cc", api / "interposer_counters.cc", core / "dtype.cc",
                              core / "fork_guard.cc"])


def test_groups_run_after_the_real_end_in_call_order(group_exe):
    r = subprocess.run([str(group_exe), "4000"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "all checks passed (4000 random sequences)" in r.stdout

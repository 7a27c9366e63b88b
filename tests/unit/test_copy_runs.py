# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Strided runs of a copy list (plugin/core/copy_runs.h; docs/architecture.md "Strided copies"): the planner that
turns a captured program's copies into 2D copies, through tests/native/copy_runs_test.cc. Random copy lists (groups,
widths, strides, overlapping and repeated sources) and the all-gather's own pattern: the runs write exactly the
bytes the copies write, respect the pitch limits, and P parameters of one size pushed to W ranks become W runs."""

import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def runs_exe(repo, tmp_path_factory):
    out = tmp_path_factory.mktemp("copy_runs") / "copy_runs_test"
    core = repo / "plugin" / "core"
    cmd = ["g++", "-std=c++17", "-O1", "-Wall", "-Werror", f"-I{repo / 'include'}", f"-I{core}",
           str(repo / "tests" / "native" / "copy_runs_test.cc"), str(core / "copy_runs.cc"), "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return Path(out)


def test_runs_write_exactly_the_copies_and_collapse_the_ag_pattern(runs_exe):
    r = subprocess.run([str(runs_exe), "400"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "all checks passed" in r.stdout

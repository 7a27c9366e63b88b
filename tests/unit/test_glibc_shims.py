# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""plugin/compat/glibc_shims.cc (the definitions the manylinux_2_28 link supplies for glibc > 2.28 symbols) behaves:
timed condition-variable waits time out and wake on notify, arc4random is random. The CUDA paths that wait on
condition variables (IPC exchange, abort) run on a GPU only, so the shim is checked here on its own."""

import shutil
import subprocess
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_shims(repo, tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path / "shims"
    src = [repo / "tests" / "native" / "glibc_shims_test.cc", repo / "plugin" / "compat" / "glibc_shims.cc"]
    subprocess.run([cxx, "-O1", "-std=c++17", "-pthread", *map(str, src), "-o", str(exe)], check=True, timeout=300)
    # The program's own definitions are the ones used (no glibc version of them was bound):
    nm = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    for sym in ("pthread_cond_clockwait", "arc4random"):
        assert any(line.split()[-1] == sym and line.split()[-2] in ("T", "t") for line in nm.splitlines()
                   if line.strip() and len(line.split()) == 3), sym
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr

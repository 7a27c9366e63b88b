# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The parent NCCL communicator's health ("parent NCCL communicator aborted"), against stub libnccl builds
(tests/native/stub_nccl with -DSTUB_ASYNC_ERROR=N, no GPU).

tideCommCreate, and every exchange of an NCCL-bootstrapped TIDE comm (slot alloc/free, own-staging growth, a new
layout, destroy), first asks ncclCommGetAsyncError; a communicator in error (a failed peer, an abort in progress) gets
a typed NcclError that says what to do, and TIDE makes no other NCCL call on it: the stub aborts the process on any
call except ncclCommGetAsyncError / ncclGetErrorString, so a clean exit proves it. A healthy communicator
(async error ncclSuccess, or ncclInProgress for a non-blocking one) passes the check and fails later, here, only
because this machine has no GPU.
"""

import os
import shutil
import subprocess
import sys

import pytest

STUB_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "native", "stub_nccl", "stub_nccl.c")

PROBE = r"""
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
from nccl_tide import _native as N, errors
from nccl_tide.comm import Comm
try:
    Comm.from_nccl(0x1000, device=0)
    print("RESULT created")
except errors.TideError as e:
    print("ERROR " + type(e).__name__ + " " + str(e).replace("\n", " "))
out = N.tideComm_t()
rc = N.lib().tideCommCreate(0x1000, None, ctypes.byref(out))
print("RC %d %s" % (rc, "null" if not out.value else "set"))
"""


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the stub libnccl")
    root = tmp_path_factory.mktemp("stub_nccl_health")

    def build(async_error):
        d = root / f"async{async_error}"
        d.mkdir(exist_ok=True)
        out = d / "libnccl.so.2"
        subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-Wl,-soname,libnccl.so.2",
                "-DSTUB_VERSION=22809",
                f"-DSTUB_ASYNC_ERROR={async_error}",
                STUB_SRC,
                "-o",
                str(out),
            ],
            check=True,
        )
        return str(out)

    return build


def probe(native, stub_path):
    env = dict(os.environ, NCCL_TIDE_LIBRARY_PATH=native.library_path(), NCCL_TIDE_DEBUG="WARN")
    p = subprocess.run([sys.executable, "-c", PROBE, stub_path], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, (
        f"probe died (an NCCL call other than the health check?): rc {p.returncode}\n{p.stdout}\n{p.stderr}"
    )
    err = [x for x in p.stdout.splitlines() if x.startswith(("RESULT ", "ERROR "))]
    rc = [x for x in p.stdout.splitlines() if x.startswith("RC ")]
    assert len(err) == 1 and len(rc) == 1, p.stdout + p.stderr
    return err[0], rc[0], p.stderr


def _host_only(line):
    return "UnsupportedError" in line and "built without CUDA" in line


def test_parent_in_error_fails_cleanly(native, stub):
    # ncclRemoteError = 6: a peer process died; NCCL reports it through ncclCommGetAsyncError.
    line, rc, err = probe(native, stub(6))
    if _host_only(line):
        pytest.skip("host-only libnccl-tide.so: tideCommCreate is tideUnsupported before any NCCL call")
    assert line.startswith("ERROR NcclError "), line
    assert "parent NCCL communicator reports an asynchronous error" in line
    assert "remote process exited" in line and "NCCL error 6" in line
    assert "Destroy the TIDE comm" in line
    assert rc == "RC 6 null"  # tideNcclError, *comm stays NULL
    assert "NCCL TIDE WARN Nccl:" in err  # one WARN line from the root cause


@pytest.mark.parametrize("healthy", [0, 7])  # ncclSuccess, ncclInProgress (non-blocking communicator)
def test_healthy_parent_passes_the_check(native, stub, healthy):
    line, rc, _ = probe(native, stub(healthy))
    if _host_only(line):
        pytest.skip("host-only libnccl-tide.so")
    # Past the health check and the rank/count/device queries; stops at the device check (no GPU here).
    assert line.startswith("ERROR UnsupportedError "), line
    assert "no CUDA device" in line
    assert "asynchronous error" not in line
    assert rc == "RC 3 null"

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tideCommAbort without a GPU ("parent NCCL communicator aborted while TIDE work is queued"):
the entry point exists in every build, NULL is a no-op (as tideCommDestroy), a host-only build answers tideUnsupported
for a non-NULL handle without touching it, and the Python wrappers are idempotent. tests/gpu/test_abort.py covers
the real teardown (an IPC rank aborted while its AG waits for a peer that never calls; a loopback world after use)."""

import os
import re

import pytest
from nccl_tide import _native as N
from nccl_tide.comm import Comm
from nccl_tide.errors import first_pending_wait

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "include", "tide.h")


def _host_only(lib) -> bool:
    comms = (N.tideComm_t * 2)()
    rc = lib.tideLoopbackCreate(2, 0, comms)
    return rc == N.tideUnsupported and "built without CUDA" in (N.last_error() or "")


def test_abort_declared_and_documented():
    text = open(HEADER).read()
    m = re.search(r"/\*((?:(?!\*/).)*)\*/\s*tideResult_t tideCommAbort\(tideComm_t comm\);", text, re.S)
    assert m, "tideCommAbort is not declared with a comment in include/tide.h"
    doc = m.group(1)
    for word in ("NCCL_TIDE_TIMEOUT_MS", "tideCommDestroy", "NULL", "tideTimeout", "since 0.1", "process exit"):
        assert word in doc, word
    assert "tideCommAbort" in N.SIGNATURES


def test_abort_null_is_a_noop(native):
    lib = N.lib()
    assert lib.tideCommAbort(None) == N.tideSuccess
    assert lib.tideCommAbort(N.tideComm_t()) == N.tideSuccess


def test_abort_host_only_build(native):
    lib = N.lib()
    if not _host_only(lib):
        pytest.skip("CUDA build: a non-NULL comm needs a GPU (tests/gpu/test_abort.py)")
    # No comm can exist without CUDA; the stub answers without dereferencing the handle.
    rc = lib.tideCommAbort(N.tideComm_t(0x1000))
    assert rc == N.tideUnsupported
    assert "built without CUDA" in N.last_error()


def test_python_abort_is_idempotent_on_a_closed_comm(native):
    c = Comm.__new__(Comm)
    c._handle = None
    c._slots = []
    c.abort()  # nothing to do, no library call
    c.abort()
    c.close()


def test_multinode_pending_line_names_the_writer():
    dump = (
        "  PENDING AG (internal stream, rail round k: the put of round k from node n + 2^k): agRail[1] of rank 2 "
        ">= 3 (is 2) from rank 6\n"
    )
    p = first_pending_wait(dump)
    assert p["step"] == "agRail[1]" and p["owner"] == 2 and p["peer"] == 6 and p["want"] == 3 and p["have"] == 2
    single = "  PENDING AG (caller stream, end): agDone[1] of rank 0 >= 4 (is 3)\n"
    p = first_pending_wait(single)
    assert p["peer"] == 1 and p["owner"] == 0

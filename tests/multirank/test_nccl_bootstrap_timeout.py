# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""NCCL_TIDE_TIMEOUT_MS on the gloo bootstrap exchange (CPU, two processes): nccl_tide.comm.make_gloo_allgather waits
at most the bound for a peer that never joins and returns tideTimeout (9), which tideCommCreateWithBootstrap reports
as tideTimeout; with both ranks present it exchanges normally under the same bound."""

import os
import sys
import textwrap
import time

import pytest
from multirank.harness import free_port, run_processes

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

WORKER = textwrap.dedent(
    r"""
    import ctypes, datetime, sys, time
    import torch.distributed as dist
    from nccl_tide.comm import make_gloo_allgather
    rank, port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    cb = make_gloo_allgather(None, 2)  # bound from NCCL_TIDE_TIMEOUT_MS
    mine = (ctypes.c_uint8 * 8)(*[rank * 10 + k for k in range(8)])
    out = (ctypes.c_uint8 * 16)()
    if mode == "absent" and rank == 1:
        time.sleep(6)  # never joins the exchange in time
        print("RC absent", flush=True)
    else:
        t0 = time.monotonic()
        rc = cb(ctypes.addressof(mine), ctypes.addressof(out), 8, None)
        print(f"RC {rc} {time.monotonic() - t0:.2f} {list(out)}", flush=True)
    sys.stdout.flush()
    import os
    os._exit(0)
    """
)


def _run(native, mode, timeout_ms):
    env = {"NCCL_TIDE_LIBRARY_PATH": native.library_path(), "NCCL_TIDE_TIMEOUT_MS": str(timeout_ms)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), *sys.path] if p)
    port = free_port()
    outs = run_processes(lambda r: [sys.executable, "-c", WORKER, r, port, mode], 2, 90, env=env, merge_stderr=False)
    return [(o.returncode, o.stdout, o.stderr) for o in outs]


def test_absent_peer_times_out_within_the_bound(native):
    t0 = time.monotonic()
    (rc0, out0, err0), (rc1, out1, _) = _run(native, "absent", 1500)
    assert rc0 == 0 and rc1 == 0, err0
    line = [x for x in out0.splitlines() if x.startswith("RC ")]
    assert line, out0 + err0
    parts = line[0].split()
    assert parts[1] == "9", line[0]  # tideTimeout
    assert 1.0 <= float(parts[2]) < 5.0, line[0]  # bounded by NCCL_TIDE_TIMEOUT_MS=1500, not the 60 s group timeout
    assert "NCCL_TIDE_TIMEOUT_MS" in err0
    assert time.monotonic() - t0 < 60


def test_present_peers_exchange_under_the_bound(native):
    outs = _run(native, "present", 20000)
    expected = [r * 10 + k for r in range(2) for k in range(8)]
    for rc, out, err in outs:
        assert rc == 0, err
        line = [x for x in out.splitlines() if x.startswith("RC ")][0]
        assert line.split()[1] == "0", line
        assert line.endswith(str(expected)), line

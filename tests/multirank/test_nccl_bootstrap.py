# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""CPU rehearsal of tests/multirank/test_multiprocess.py: the same process spawning, gloo bootstrap, the ctypes bootstrap
all-gather callback (nccl_tide.comm.make_gloo_allgather) and the rank-0 gather-and-compare plumbing, with the device
results replaced by the host executor's. Also the Python-side argument checks of nccl_tide.comm that need no GPU."""

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import test_multiprocess as mpt  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("world,rpns", [(2, (None, 1)), (3, (None,))])
def test_spawn_gloo_bootstrap_and_oracle_plumbing(native, tmp_path, world, rpns, monkeypatch):
    monkeypatch.setenv("NCCL_TIDE_LIBRARY_PATH", native.library_path())
    reports = mpt.run_world(world, tmp_path, mode="cpu", rpns=rpns)
    # rank 0 checked every rank of every case on every node split, plus its callback check
    assert reports[0]["checked"] == 1 + len(mpt._cases(world)) * world * len(rpns)
    assert all(r["checked"] >= 1 for r in reports)


def test_comm_create_without_cuda_or_nccl_fails_cleanly(native):
    """tideCommCreateWithBootstrap / tideCommCreate on this machine: a typed error, never a crash or a hang
    (host-only build: unsupported; CUDA build without a device: unsupported; bad arguments first)."""
    import ctypes

    from nccl_tide import _native as N
    from nccl_tide import errors
    from nccl_tide.comm import Comm

    calls = []

    def never(mine, all_, n, user):
        calls.append(n)
        return 1

    cb = N.tideAllGatherFn_t(never)
    with pytest.raises(errors.TideError):
        Comm.from_bootstrap(0, 2, 0, allgather=cb)
    out = N.tideComm_t()
    lib = native.lib()
    assert lib.tideCommCreate(None, None, ctypes.byref(out)) != 0
    assert out.value is None
    boot = N.tideBootstrap_t(ctypes.sizeof(N.tideBootstrap_t), N.TIDE_BOOTSTRAP_VERSION, cb, None)
    assert lib.tideCommCreateWithBootstrap(0, 2, 0, ctypes.byref(boot), None, None) != 0
    assert calls == []  # nothing was exchanged: the errors came before any collective step

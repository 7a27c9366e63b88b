# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Fault handling on one GPU, loopback worlds (docs/reliability.md, "Faults"): a peer that never signals (a bounded wait that
names the peer and the step, then recovers), NCCL_TIDE_TIMEOUT_MS as the default bound, and out-of-memory on slot
allocation and own RS staging growth (typed error, nothing leaked, nothing half-written, the world keeps working).

Every wait here is bounded (synchronize timeouts of at most 30 s, a subprocess timeout); marker gpu.
"""

import os
import subprocess
import sys
import textwrap
import time

import nccl_tide
import numpy as np
import pytest
from gpu_util import seeded
from nccl_tide.errors import TideOutOfMemoryError, TideTimeoutError

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(180)]

POISON = 0xFF
MIB = 1 << 20
LEAK_TOLERANCE = 16 * MIB  # device-wide free memory before vs after a failed allocation


@pytest.fixture
def world(torch_cuda, cuda_lib):
    from nccl_tide.cuda import LoopbackWorld

    w = LoopbackWorld(2)
    yield w
    w.close()


def _layouts(numels, dts, W, **kw):
    return [nccl_tide.Layout(numels, dts, W, ranks_per_node=W, rank=r, **kw) for r in range(W)]


def _send_data(torch, rng, L, W):
    send_cpu = [torch.from_numpy(rng.integers(0, 256, size=L.send_bytes, dtype=np.uint8)) for _ in range(W)]
    shards = [
        [
            send_cpu[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size]
            .numpy()
            .view({1: np.uint8, 2: np.uint16, 4: np.uint32}[p.elem_size])
            for p in L.params
        ]
        for r in range(W)
    ]
    return send_cpu, shards


def _check_ag(slots, L, expected, W, what):
    for r in range(W):
        got = slots[r].cpu().numpy()
        for i, p in enumerate(L.params):
            exp = np.ascontiguousarray(expected[r][i]).view(np.uint8)
            region = got[p.slot_offset : p.slot_offset + exp.size]
            assert np.array_equal(region, exp), (
                f"{what}: rank {r} param {i}: {np.count_nonzero(region != exp)} bytes differ"
            )


def normal_all_gather(torch, world, seed):
    """A small AG on every rank, checked byte for byte against the host executor."""
    W = world.n_ranks
    layouts = _layouts([1000, 77, 4096], ["bf16", "fp32", "bf16"], W)
    L = layouts[0]
    rng = seeded("faults-ag", seed)
    send_cpu, shards = _send_data(torch, rng, L, W)
    expected = nccl_tide.host_all_gather(L, shards)
    slots = world.alloc_slot(L.slot_bytes)
    try:
        for s in slots:
            s.fill_(POISON)
        sends = [t.cuda() for t in send_cpu]
        torch.cuda.synchronize()
        world.all_gather(layouts, slots, sendbufs=sends)
        world.synchronize(timeout=30)
        _check_ag(slots, L, expected, W, f"AG after fault ({seed})")
    finally:
        world.synchronize(timeout=30)
        world.free_slot(slots)


def normal_reduce_scatter(torch, world, seed):
    """A small RS (own staging) on every rank, bit-exact against the host executor."""
    W = world.n_ranks
    layouts = _layouts([5000, 333], ["bf16", "bf16"], W, rs_chunk_bytes=4096)
    L = layouts[0]
    rng = seeded("faults-rs", seed)
    grads = []
    for _ in range(W):
        g = []
        for p in L.params:
            x = rng.standard_normal(p.numel).astype(np.float32)
            x[x == 0] = 1.0
            g.append(torch.from_numpy(x).to(torch.bfloat16))
        grads.append(g)
    expected = nccl_tide.host_reduce_scatter(L, grads, out_dtype="fp32", op="sum")
    outs = [torch.full((L.rs_out_numel,), float("nan"), device="cuda") for _ in range(W)]
    dgrads = [[t.cuda() for t in g] for g in grads]
    torch.cuda.synchronize()
    world.reduce_scatter(layouts, dgrads, outs, op="sum")
    world.synchronize(timeout=30)
    for r in range(W):
        got = outs[r].cpu().numpy().view(np.uint32)
        exp = np.ascontiguousarray(expected[r]).astype(np.float32).view(np.uint32)
        assert np.array_equal(got, exp), f"RS after fault: rank {r}: {np.count_nonzero(got != exp)} elements differ"


# ----------------------------------------------------------------------------------------------------------------
# A peer that never signals
# ----------------------------------------------------------------------------------------------------------------


def test_missing_peer_times_out_naming_peer_and_step_then_recovers(torch_cuda, world):
    torch = torch_cuda
    W = world.n_ranks
    layouts = _layouts([3000, 5, 64 * 9], ["bf16", "fp32", "bf16"], W)
    L = layouts[0]
    send_cpu, shards = _send_data(torch, seeded("faults-timeout"), L, W)
    expected = nccl_tide.host_all_gather(L, shards)
    slots = world.alloc_slot(L.slot_bytes)
    for s in slots:
        s.fill_(POISON)
    sends = [t.cuda() for t in send_cpu]
    torch.cuda.synchronize()
    world.rank_all_gather(0, layouts[0], slots[0], sendbuf=sends[0])  # rank 1 does not call (yet)
    t0 = time.monotonic()
    with pytest.raises(TideTimeoutError) as info:
        world.synchronize(timeout=0.5)
    took = time.monotonic() - t0
    assert took < 10, f"the bounded wait took {took:.1f} s"
    msg = str(info.value)
    assert "peer rank 1" in msg and "agReady" in msg, msg
    assert "rank 0 waits" in msg, msg
    pending = info.value.pending
    assert pending is not None and pending["rank"] == 0 and pending["peer"] == 1, pending
    # Epoch protocol: rank 1's agReady; token protocol (the eager graph route, NCCL_TIDE_EAGER_GRAPHS=1): the ready
    # token from rank 1 in rank 0's own array.
    assert pending["step"] in ("agReady", "agReadyTok[1]") and pending["have"] < pending["want"], pending
    # Rank 1 arrives: everything completes, results exact, the stuck stream is drained.
    world.rank_all_gather(1, layouts[1], slots[1], sendbuf=sends[1])
    world.synchronize(timeout=30)
    _check_ag(slots, L, expected, W, "AG completed after the timeout")
    world.free_slot(slots)
    normal_all_gather(torch, world, "after-timeout")
    normal_reduce_scatter(torch, world, "after-timeout")


ENV_SCRIPT = textwrap.dedent(
    r"""
    import os, sys, time
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    import torch, nccl_tide
    from nccl_tide.cuda import LoopbackWorld
    from nccl_tide.errors import TideTimeoutError
    w = LoopbackWorld(2)
    Ls = [nccl_tide.Layout([4096], "bf16", 2, rank=r) for r in range(2)]
    slots = w.alloc_slot(Ls[0].slot_bytes)
    sends = [torch.ones(Ls[0].send_bytes, dtype=torch.uint8, device="cuda") for _ in range(2)]
    torch.cuda.synchronize()
    w.rank_all_gather(0, Ls[0], slots[0], sendbuf=sends[0])
    t0 = time.monotonic()
    try:
        w.synchronize()  # no timeout argument: NCCL_TIDE_TIMEOUT_MS
        print("NO TIMEOUT", flush=True)
    except TideTimeoutError as e:
        print("TIMEOUT %.3f %s" % (time.monotonic() - t0, str(e).splitlines()[0]), flush=True)
    w.rank_all_gather(1, Ls[1], slots[1], sendbuf=sends[1])
    w.synchronize(timeout=30)
    w.close()
    print("CLOSED", flush=True)
    """
)


def test_timeout_defaults_to_nccl_tide_timeout_ms(torch_cuda, cuda_lib):
    env = dict(
        os.environ,
        NCCL_TIDE_TIMEOUT_MS="700",
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        CUDA_DEVICE_MAX_CONNECTIONS="32",
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), *sys.path] if p)
    p = subprocess.run([sys.executable, "-c", ENV_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    line = [x for x in p.stdout.splitlines() if x.startswith(("TIMEOUT", "NO TIMEOUT"))]
    assert line and line[0].startswith("TIMEOUT "), p.stdout + p.stderr
    took = float(line[0].split()[1])
    assert 0.6 <= took < 10, line[0]  # 0.7 s from the environment, not the built-in 120 s
    assert "peer rank 1" in line[0] and "agReady" in line[0], line[0]
    assert "CLOSED" in p.stdout


# ----------------------------------------------------------------------------------------------------------------
# Out of memory
# ----------------------------------------------------------------------------------------------------------------


def _free(torch):
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


@pytest.mark.parametrize("nbytes", [2**50, 2**63])
def test_slot_alloc_out_of_memory_is_clean(torch_cuda, world, nbytes):
    torch = torch_cuda
    normal_all_gather(torch, world, "warm")  # lazy allocations of the first collectives happen before "before"
    before = _free(torch)
    with pytest.raises(TideOutOfMemoryError) as info:
        world.alloc_slot(nbytes)
    assert "tideSlotAlloc" in str(info.value) or "cudaMalloc" in str(info.value), str(info.value)
    after = _free(torch)
    assert abs(before - after) <= LEAK_TOLERANCE, f"free memory {before} before, {after} after the failed alloc"
    normal_all_gather(torch, world, f"after-oom-{nbytes}")


def test_own_staging_out_of_memory_is_clean(torch_cuda, world):
    """Own RS staging growth that cannot be met: 1 GiB per rank (2 GiB for the world) with ~1.5 GiB free, so the
    first rank's buffer is allocated and the second fails: the first must be freed again, no output written."""
    torch = torch_cuda
    W = world.n_ranks
    normal_reduce_scatter(torch, world, "warm")
    N = 1 << 29  # bf16 elements per rank's gradient: 1 GiB; fp32 output 1 GiB per rank; one chunk of 1 GiB staging
    layouts = _layouts([N], ["bf16"], W, rs_chunk_bytes=1 << 40)
    L = layouts[0]
    stag = L.rs_staging_bytes
    assert stag >= 1 << 30, stag
    grads = [[torch.ones(N, dtype=torch.bfloat16, device="cuda")] for _ in range(W)]
    outs = [torch.full((L.rs_out_numel,), float("nan"), device="cuda") for _ in range(W)]
    free = _free(torch)
    hog = torch.empty(max(free - stag - stag // 2, 0), dtype=torch.uint8, device="cuda")
    try:
        before = _free(torch)
        assert before < W * stag, f"could not make room too small ({before} bytes free)"
        for r in range(W):
            with pytest.raises(TideOutOfMemoryError):
                world.rank_reduce_scatter(r, layouts[r], grads[r], outs[r], op="sum")
        after = _free(torch)
        assert abs(before - after) <= LEAK_TOLERANCE, f"free memory {before} before, {after} after the failed growth"
        for r in range(W):
            assert torch.isnan(outs[r]).all().item(), f"rank {r}: output written by a failed reduce-scatter"
    finally:
        del hog
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    del grads, outs
    torch.cuda.empty_cache()
    normal_reduce_scatter(torch, world, "after-staging-oom")
    normal_all_gather(torch, world, "after-staging-oom")

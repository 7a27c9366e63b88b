# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Faults across processes: 2 processes, each one TIDE rank on cuda:0, CUDA IPC peer memory, gloo
bootstrap (as test_multiprocess.py), started by multirank.harness.

* Layout mismatch: rank 1 builds its layout with one parameter one element larger; the first all-gather with it
  raises MismatchError on EVERY rank within a bounded time, naming rank 0's and rank 1's layout hashes. The comm keeps
  working afterwards (a matching layout's AG is byte-exact against the host executor).
* Out of memory in the IPC provider: a 2**50-byte and a 2**64-1-byte slot, a slot that only one of the two
  processes can get (0.7 x the free memory each, on one shared GPU), and an own RS staging growth (1 GiB per rank
  with ~1.5 GiB free): TideOutOfMemoryError on every rank, device free memory unchanged, no output written, and a
  normal AG and RS still exact.
NCCL_TIDE_TIMEOUT_MS=20000 bounds every exchange (gloo) and synchronize of the workers.
"""

import os
import time

import numpy as np
import pytest
from multirank.harness import init_gloo, run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

MIB = 1 << 20
LEAK_TOLERANCE = 16 * MIB
WORLD = 2


def _gpu_processes():
    """{pid: bytes of device memory} from NVML (diagnostics only; {} where NVML or its process list is unavailable)."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return {}
        dev = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) != 0:
            return {}

        class Info(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]

        n = ctypes.c_uint(64)
        infos = (Info * 64)()
        if nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, ctypes.byref(n), infos) != 0:
            return {}
        return {int(infos[i].pid): int(infos[i].used) for i in range(n.value)}
    except Exception:  # noqa: BLE001 (diagnostics must never fail the test by themselves)
        return {}


def _free_after(torch, before, report, label):
    """Device free memory after a failed allocation, compared with `before`. A difference beyond LEAK_TOLERANCE is
    polled for up to 5 s (the driver and the other process release memory asynchronously): memory that comes back is
    not leaked, and how long it took is recorded; memory that stays away is reported with NVML's per-process use."""
    deadline = time.monotonic() + 5.0
    t0 = time.monotonic()
    while True:
        torch.cuda.synchronize()
        after = torch.cuda.mem_get_info()[0]
        if abs(before - after) <= LEAK_TOLERANCE:
            if time.monotonic() > t0 + 0.01:
                report["steps"][f"settled_{label}_s"] = round(time.monotonic() - t0, 3)
            return None
        if time.monotonic() > deadline:
            return (
                f"{label}: free memory {before} before, {after} after (5 s later); own process "
                f"{os.getpid()}, torch reserved {torch.cuda.memory_reserved()}, NVML per process {_gpu_processes()}"
            )
        time.sleep(0.1)


def _ag_exact(torch, dist, comm, nccl_tide, rank, world, seed):
    """A matching AG over the comm, checked on every rank against the host executor (inputs gathered over gloo)."""
    L = nccl_tide.Layout([1000, 64 * 7, 33], ["bf16", "bf16", "fp32"], world, rank=rank, row_numels=[1, 64, 1])
    rng = np.random.default_rng(1000 * seed + rank)
    send = torch.from_numpy(rng.integers(0, 256, size=L.send_bytes, dtype=np.uint8))
    slot = comm.alloc_slot(L.slot_bytes)
    slot.fill_(0xFF)
    torch.cuda.synchronize()
    comm.all_gather(L, slot, sendbuf=send.cuda())
    comm.synchronize(timeout=30)
    got = slot.cpu().numpy()
    comm.free_slot(slot)
    sends = [torch.empty_like(send) for _ in range(world)]
    dist.all_gather(sends, send)
    views = {1: np.uint8, 2: np.uint16, 4: np.uint32}
    shards = [
        [
            sends[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].numpy().view(views[p.elem_size])
            for p in L.params
        ]
        for r in range(world)
    ]
    expected = nccl_tide.host_all_gather(L, shards)[rank]
    for i, p in enumerate(L.params):
        exp = np.ascontiguousarray(expected[i]).view(np.uint8)
        if not np.array_equal(got[p.slot_offset : p.slot_offset + exp.size], exp):
            return f"AG ({seed}): param {i} differs from the host executor"
    return None


def _rs_exact(torch, dist, comm, nccl_tide, rank, world):
    """A small RS (own staging: grows it) checked bit for bit against the host executor (grads gathered over gloo)."""
    L = nccl_tide.Layout([5000, 77], "bf16", world, rank=rank, rs_chunk_bytes=4096)
    rng = np.random.default_rng(4242 + rank)
    grads = []
    for p in L.params:
        x = rng.standard_normal(p.numel).astype(np.float32)
        x[x == 0] = 1.0
        grads.append(torch.from_numpy(x).to(torch.bfloat16))
    out = torch.full((L.rs_out_numel,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    comm.reduce_scatter(L, [g.cuda() for g in grads], out, op="sum")
    comm.synchronize(timeout=30)
    got = out.cpu().numpy().view(np.uint32)
    flat = torch.cat([g.view(torch.uint8) for g in grads])  # gloo gathers bytes
    flats = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(flats, flat)
    all_grads = []
    for r in range(world):
        vals, off, mine = flats[r].view(torch.bfloat16), 0, []
        for p in L.params:
            mine.append(vals[off : off + p.numel])
            off += p.numel
        all_grads.append(mine)
    exp = np.ascontiguousarray(nccl_tide.host_reduce_scatter(L, all_grads, out_dtype="fp32", op="sum")[rank])
    if not np.array_equal(got, exp.astype(np.float32).view(np.uint32)):
        return f"RS: {np.count_nonzero(got != exp.astype(np.float32).view(np.uint32))} elements differ"
    return None


def _worker(rank, world, port, report):
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    report["steps"] = {}
    import nccl_tide
    import torch
    from nccl_tide.comm import Comm
    from nccl_tide.errors import MismatchError, TideOutOfMemoryError

    dist = init_gloo(rank, world, port)
    torch.cuda.set_device(0)
    comm = Comm.from_bootstrap(rank, world, device=0)
    err = _ag_exact(torch, dist, comm, nccl_tide, rank, world, 1)
    if err:
        report["errors"].append(err)

    # -- layout mismatch -----------------------------------------------------------------------------------
    numels = [3000, 128]
    if rank == 1:
        numels = [3001, 128]
    L = nccl_tide.Layout(numels, "bf16", world, rank=rank)
    hashes = [torch.tensor([L.hash & 0xFFFFFFFF, L.hash >> 32], dtype=torch.int64) for _ in range(world)]
    dist.all_gather(hashes, torch.tensor([L.hash & 0xFFFFFFFF, L.hash >> 32], dtype=torch.int64))
    all_hashes = [int(h[0]) | (int(h[1]) << 32) for h in hashes]
    slot = comm.alloc_slot(4 * MIB)  # same size on every rank (the sizes are not what is tested)
    send = torch.zeros(L.send_bytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.monotonic()
    try:
        comm.all_gather(L, slot, sendbuf=send)
        comm.synchronize(timeout=20)
        report["errors"].append("mismatch: all_gather with a mismatched layout did not raise")
    except MismatchError as e:
        msg = str(e)
        report["steps"]["mismatch_s"] = time.monotonic() - t0
        report["steps"]["mismatch_msg"] = msg
        for h in all_hashes:
            if f"{h:016x}" not in msg:
                report["errors"].append(f"mismatch: message lacks hash {h:016x}: {msg}")
        if "rank 1 has" not in msg or "rank 0 has layout hash" not in msg:
            report["errors"].append(f"mismatch: message does not name the ranks: {msg}")
    comm.free_slot(slot)
    err = _ag_exact(torch, dist, comm, nccl_tide, rank, world, 2)  # the comm still works
    if err:
        report["errors"].append("after mismatch: " + err)

    # -- out of memory -------------------------------------------------------------------------------------
    def oom_case(nbytes, label):
        dist.barrier()
        torch.cuda.synchronize()
        before = torch.cuda.mem_get_info()[0]
        dist.barrier()
        try:
            s = comm.alloc_slot(nbytes)
            report["errors"].append(f"OOM {label}: alloc_slot({nbytes}) succeeded")
            comm.free_slot(s)
        except TideOutOfMemoryError as e:
            report["steps"][f"oom_{label}"] = str(e).splitlines()[0][:300]
        dist.barrier()
        err = _free_after(torch, before, report, f"OOM {label}")
        if err:
            report["errors"].append(err)
        dist.barrier()

    oom_case(2**50, "2^50")
    oom_case(2**64 - 1, "2^64-1")
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    half = torch.tensor([free], dtype=torch.int64)
    dist.all_reduce(half, op=dist.ReduceOp.MIN)  # same size on both ranks
    oom_case(int(half.item() * 0.7) // (2 * MIB) * (2 * MIB), "one-rank")
    err = _ag_exact(torch, dist, comm, nccl_tide, rank, world, 3)
    if err:
        report["errors"].append("after OOM: " + err)

    # -- own RS staging growth that cannot be met ------------------------------------------------------------
    # 1 GiB of staging per rank (one 1 GiB chunk); rank 0 leaves ~1.5 GiB free on the shared GPU, so one
    # process gets its staging and the other does not: both must fail with TideOutOfMemoryError, the one that
    # allocated must free it again, and nothing is written.
    big = nccl_tide.Layout([1 << 29], "bf16", world, rank=rank, rs_chunk_bytes=1 << 40)
    grads = [torch.ones(1 << 29, dtype=torch.bfloat16, device="cuda")]
    out = torch.full((big.rs_out_numel,), float("nan"), device="cuda")
    torch.cuda.synchronize()
    dist.barrier()
    hog = None
    if rank == 0:
        free = torch.cuda.mem_get_info()[0]
        hog = torch.empty(max(free - big.rs_staging_bytes * 3 // 2, 0), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    dist.barrier()
    before = torch.cuda.mem_get_info()[0]
    # Diagnostics: free device memory at each point of this case, per rank, with NVML's per-process
    # use, so that a failed leak check says which process holds what.
    trace = report["steps"]["staging_trace"] = [["before", 0.0, before, _gpu_processes()]]
    t_case = time.monotonic()
    dist.barrier()
    try:
        comm.reduce_scatter(big, grads, out, op="sum")
        comm.synchronize(timeout=30)
        report["errors"].append(f"staging OOM: reduce_scatter succeeded with {before} bytes free")
    except TideOutOfMemoryError as e:
        report["steps"]["oom_staging"] = str(e).splitlines()[0][:300]
    trace.append(["raised", round(time.monotonic() - t_case, 3), torch.cuda.mem_get_info()[0], _gpu_processes()])
    dist.barrier()
    trace.append(["barrier", round(time.monotonic() - t_case, 3), torch.cuda.mem_get_info()[0], _gpu_processes()])
    err = _free_after(torch, before, report, "staging OOM")
    trace.append(["checked", round(time.monotonic() - t_case, 3), torch.cuda.mem_get_info()[0], _gpu_processes()])
    if err:
        report["errors"].append(f"{err}; trace (label, s, free, NVML per process): {trace}")
    if not bool(torch.isnan(out).all()):
        report["errors"].append("staging OOM: the failed reduce-scatter wrote its output")
    dist.barrier()
    del hog, grads, out
    torch.cuda.empty_cache()
    err = _rs_exact(torch, dist, comm, nccl_tide, rank, world)
    if err:
        report["errors"].append("after staging OOM: " + err)

    comm.close()
    dist.barrier()
    dist.destroy_process_group()


def test_mismatch_and_oom_across_processes(torch_cuda, cuda_lib, tmp_path):
    env = {
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
        "NCCL_TIDE_TIMEOUT_MS": "20000",
    }
    reports = run_ranks(_worker, WORLD, (), tmp_path, 150, env=env)
    for rep in reports:
        print(f"rank {rep['rank']}: staging OOM trace (label, s, free bytes, NVML per process): "
              f"{rep['steps'].get('staging_trace')}; settled after {rep['steps'].get('settled_staging OOM_s', 0)} s")
    for rep in reports:
        print(f"rank {rep['rank']}: mismatch after {rep['steps']['mismatch_s']:.3f} s: {rep['steps']['mismatch_msg']}")
        assert rep["steps"]["mismatch_s"] < 20
        for label in ("2^50", "2^64-1", "one-rank", "staging"):
            assert f"oom_{label}" in rep["steps"], (rep["rank"], label)

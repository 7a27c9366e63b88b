# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Several processes, each one TIDE rank on cuda:0, peer memory through CUDA IPC, bootstrapped by torch.distributed
(gloo): NCCL refuses several ranks on one GPU, so the exchange step is a gloo all-gather (tideCommCreateWithBootstrap).
AG and RS cross process boundaries with stream-memop flags; rank 0 gathers every rank's inputs and results over gloo
and checks them bit for bit against the host executor. Plus a real NCCL communicator of size 1 through torch's
ProcessGroupNCCL (tideCommCreate on its ncclComm_t).

run_world(..., mode="cpu") runs the same spawning, gloo bootstrap and gather/check plumbing without CUDA (the
"device" results come from the host executor, and the bootstrap callback is exercised directly): the CPU suite uses
it (tests/multirank/test_nccl_bootstrap.py) so this file's logic is rehearsed where no GPU exists.
"""

import itertools
import os
import sys
import time
import zlib

import numpy as np
import pytest
from multirank.harness import init_gloo, run_ranks

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

POISON = 0xFF
SPAWN_TIMEOUT = float(os.environ.get("TIDE_MP_TIMEOUT", "90"))
# A worker still running after this many seconds prints every Python thread's stack and its comm's debug dump (flag
# words, pending waits, where the host thread is) to stderr, so that a later outer kill cannot lose the evidence.
WATCHDOG = float(os.environ.get("TIDE_MP_WATCHDOG", "45"))


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _cases(world):
    """(kind, numels, rows, dtypes, extra) for one world; the same on every rank (seeded by the world only)."""
    rng = _rng("mp-layouts", world)
    cases = []
    for kind, dts in [("ag", ["bf16"]), ("ag", ["fp32"]), ("ag", ["bf16", "fp32"])]:
        n = int(rng.integers(1, 5))
        rows = [int(rng.choice([1, 1, 3, 64])) for _ in range(n)]
        numels = [int(rng.integers(1, 3000)) * r for r in rows]
        cases.append((kind, numels, rows, [dts[int(rng.integers(0, len(dts)))] for _ in range(n)], {}))
    # RS: (grad dtype, op, chunk bytes, Slot-Reuse staging); fp32 output.
    for gdt, op, chunk, slot_staging in [
        ("bf16", "sum", 4096, False),
        ("fp32", "avg", None, False),
        ("bf16", "avg", 4096, True),
        ("fp32", "sum", 32, True),
    ]:
        n = int(rng.integers(1, 5))
        rows = [int(rng.choice([1, 1, 8])) for _ in range(n)]
        numels = [int(rng.integers(1, 1500 if chunk == 32 else 6000)) * r for r in rows]
        cases.append(("rs", numels, rows, [gdt] * n, {"op": op, "chunk": chunk, "slot": slot_staging}))
    return cases


def _float_data(torch, rng, numel, name):
    x = rng.standard_normal(numel).astype(np.float32) * np.float32(2.0) ** rng.integers(-4, 5, size=numel).astype(
        np.float32
    )
    x[x == 0] = 1.0
    t = torch.from_numpy(x)
    return t.to(torch.bfloat16) if name == "bf16" else t


def _gather_bytes(torch, dist, t):
    """all_gather over gloo of one uint8 CPU tensor of equal size on every rank."""
    t = t.contiguous().view(torch.uint8).reshape(-1)
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return parts


def _say(rank, msg):
    print(f"[mp rank {rank} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _start_watchdog(rank, state):
    """Daemon timer: after WATCHDOG seconds, dump all Python stacks and the comm's state to stderr (once)."""
    import faulthandler
    import threading

    def fire():
        _say(rank, f"WATCHDOG: still running after {WATCHDOG:.0f} s, at: {state.get('step')}")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        comm = state.get("comm")
        if comm is not None:
            try:
                _say(rank, "comm debug dump:\n" + comm.debug_dump())
            except Exception as e:  # best effort
                _say(rank, f"comm debug dump failed: {e!r}")
        sys.stderr.flush()

    t = threading.Timer(WATCHDOG, fire)
    t.daemon = True
    t.start()
    return t


def _worker(rank, world, port, report, mode, rpns=(None,)):
    """One rank: every case on layouts of each ranks-per-node in rpns, in turn, on one comm (None = one node, fewer =
    virtual nodes across processes). Adds "checked" (comparisons made) to its report."""
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    report["checked"] = 0
    state = {"step": "start", "comm": None}
    watchdog = _start_watchdog(rank, state)
    try:
        import nccl_tide
        import torch
        from nccl_tide.comm import Comm, make_gloo_allgather

        dist = init_gloo(rank, world, port)
        gpu = mode == "gpu"
        # The bootstrap callback itself, directly: rank r contributes bytes r*7 .. r*7+12.
        import ctypes

        cb = make_gloo_allgather(None, world)
        mine = (ctypes.c_uint8 * 13)(*[(rank * 7 + k) % 256 for k in range(13)])
        allb = (ctypes.c_uint8 * (13 * world))()
        assert cb(ctypes.addressof(mine), ctypes.addressof(allb), 13, None) == 0
        assert list(allb) == [(r * 7 + k) % 256 for r in range(world) for k in range(13)]
        report["checked"] += 1

        comm = None
        if gpu:
            torch.cuda.set_device(0)
            comm = Comm.from_bootstrap(rank, world, device=0)
            state["comm"] = comm
            report["provider"] = comm.provider
            assert comm.provider == "ipc", comm.provider
            assert (comm.rank, comm.world_size) == (rank, world)
        for rpn, (ci, (kind, numels, rows, dts, extra)) in itertools.product(rpns, enumerate(_cases(world))):
            L = nccl_tide.Layout(
                numels,
                dts,
                world,
                ranks_per_node=rpn or world,
                rank=rank,
                row_numels=rows,
                rs_chunk_bytes=extra.get("chunk"),
                pace_bytes=1024 if rpn else None,  # virtual nodes: several paced steps per block
            )
            data_rng = _rng("mp-data", world, ci, rank)
            for err in report["errors"][state.get("shown", 0) :]:
                _say(rank, f"ERROR {err}")
            state["shown"] = len(report["errors"])
            state["step"] = f"rpn {rpn} case {ci} ({kind}, {dts[0]}, {extra})"
            _say(rank, f"{state['step']}: start")
            if kind == "ag":
                send = torch.from_numpy(data_rng.integers(0, 256, size=L.send_bytes, dtype=np.uint8))
                if gpu:
                    slot = comm.alloc_slot(L.slot_bytes)
                    slot.fill_(POISON)
                    torch.cuda.synchronize()
                    comm.all_gather(L, slot, sendbuf=send.cuda())
                    comm.synchronize(timeout=30)
                    got = slot.cpu()
                    comm.free_slot(slot)
                else:
                    got = None
                sends = _gather_bytes(torch, dist, send)
                shards = [
                    [sends[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].numpy() for p in L.params]
                    for r in range(world)
                ]
                shards = [
                    [s.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[p.elem_size]) for s, p in zip(sr, L.params)]
                    for sr in shards
                ]
                if not gpu:  # rehearsal: this rank's "device" result is the oracle's
                    got = torch.full((L.slot_bytes,), POISON, dtype=torch.uint8)
                    exp0 = nccl_tide.host_all_gather(L, shards)[rank]
                    for p, e in zip(L.params, exp0):
                        b = np.ascontiguousarray(e).view(np.uint8)
                        got[p.slot_offset : p.slot_offset + b.size] = torch.from_numpy(b.copy())
                gots = _gather_bytes(torch, dist, got)
                if rank == 0:
                    expected = nccl_tide.host_all_gather(L, shards)
                    for r in range(world):
                        g = gots[r].numpy()
                        touched = np.zeros(g.size, dtype=bool)
                        for i, p in enumerate(L.params):
                            exp = np.ascontiguousarray(expected[r][i]).view(np.uint8)
                            region = g[p.slot_offset : p.slot_offset + exp.size]
                            if not np.array_equal(region, exp):
                                bad = np.flatnonzero(region != exp)
                                report["errors"].append(
                                    f"AG W={world} rpn {rpn} case {ci}: rank {r} param {i} ({p.dtype}): "
                                    f"{bad.size} bytes differ"
                                )
                            touched[p.slot_offset : p.slot_offset + exp.size] = True
                        if not np.all(g[~touched] == POISON):
                            report["errors"].append(f"AG W={world} rpn {rpn} case {ci}: rank {r} wrote outside the "
                                                    "params")
                        report["checked"] += 1
            else:
                grads = [_float_data(torch, data_rng, p.numel, p.dtype) for p in L.params]
                op = extra["op"]
                if gpu:
                    out = torch.full((L.rs_out_numel,), float("nan"), dtype=torch.float32, device="cuda")
                    staging = comm.alloc_slot(L.rs_staging_bytes) if extra["slot"] else None
                    torch.cuda.synchronize()
                    comm.reduce_scatter(L, [g.cuda() for g in grads], out, op=op, staging=staging)
                    comm.synchronize(timeout=30)
                    got = out.cpu()
                    if staging is not None:
                        comm.free_slot(staging)
                else:
                    got = None
                flat = torch.cat([g.reshape(-1).view(torch.uint8) for g in grads])
                flats = _gather_bytes(torch, dist, flat)
                tdt = torch.bfloat16 if dts[0] == "bf16" else torch.float32
                all_grads = []
                for r in range(world):
                    vals = flats[r].view(tdt)
                    off, mine_g = 0, []
                    for p in L.params:
                        mine_g.append(vals[off : off + p.numel])
                        off += p.numel
                    all_grads.append(mine_g)
                if not gpu:
                    got = torch.from_numpy(
                        np.ascontiguousarray(nccl_tide.host_reduce_scatter(L, all_grads, out_dtype="fp32", op=op)[rank])
                    )
                gots = _gather_bytes(torch, dist, got)
                if rank == 0:
                    expected = nccl_tide.host_reduce_scatter(L, all_grads, out_dtype="fp32", op=op)
                    for r in range(world):
                        g = gots[r].numpy()
                        exp = np.ascontiguousarray(expected[r]).view(np.uint8)
                        if not np.array_equal(g, exp):
                            bad = np.flatnonzero(g != exp)
                            report["errors"].append(
                                f"RS W={world} rpn {rpn} case {ci} ({dts[0]}->fp32 {op}, chunk {extra['chunk']}, "
                                f"{'slot' if extra['slot'] else 'own'} staging): rank {r}: {bad.size} bytes differ"
                            )
                        report["checked"] += 1
        state["step"] = "close"
        if comm is not None:
            state["comm"] = None
            comm.close()
        dist.barrier()
        dist.destroy_process_group()
    finally:
        watchdog.cancel()
        _say(rank, f"stopped at step {state['step']}")


def run_world(world, tmp_path, mode="gpu", rpns=(None,)):
    reports = run_ranks(_worker, world, (mode, rpns), tmp_path, SPAWN_TIMEOUT)
    assert reports[0]["checked"] >= 1 + (len(_cases(world)) * world * len(rpns) if mode == "gpu" else 0)
    return reports


def test_two_processes_share_one_gpu(torch_cuda, cuda_lib, tmp_path):
    reports = run_world(2, tmp_path, mode="gpu")
    assert all(rep.get("provider") == "ipc" for rep in reports)


def test_four_processes_as_one_node_then_virtual_nodes_2x2(torch_cuda, cuda_lib, tmp_path):
    """4 processes on one comm: layouts of one node, then of 2 virtual nodes of 2 ranks (ranks_per_node=2), where the
    AG rail schedule and the RS running sum across nodes cross process boundaries over CUDA IPC; every case bit-exact
    against the host executor."""
    reports = run_world(4, tmp_path, mode="gpu", rpns=(None, 2))
    assert all(rep.get("provider") == "ipc" for rep in reports)


# ----------------------------------------------------------------------------------------------------------------
# A real NCCL communicator of size 1 (torch's ProcessGroupNCCL)
# ----------------------------------------------------------------------------------------------------------------


def _nccl1_worker(rank, world, port, report):
    import datetime

    import nccl_tide
    import torch
    import torch.distributed as dist
    from nccl_tide.comm import Comm, nccl_info

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
        device_id=torch.device("cuda", 0),
    )
    info = nccl_info()
    report["info"] = info
    comm = Comm.from_process_group()
    report["provider"] = comm.provider
    assert (comm.rank, comm.world_size) == (0, 1)
    rng = _rng("nccl1")
    # AG, W=1: the slot is the shard (bf16 and fp32 params).
    L = nccl_tide.Layout([1000, 3, 64 * 5], ["bf16", "fp32", "bf16"], 1, rank=0, row_numels=[1, 1, 64])
    send = torch.from_numpy(rng.integers(0, 256, size=L.send_bytes, dtype=np.uint8))
    slot = comm.alloc_slot(L.slot_bytes)
    slot.fill_(POISON)
    torch.cuda.synchronize()
    comm.all_gather(L, slot, sendbuf=send.cuda())
    comm.synchronize(timeout=30)
    got = slot.cpu().numpy()
    for p in L.params:
        n = p.shard_numel * p.elem_size
        if not np.array_equal(
            got[p.slot_offset : p.slot_offset + n], send[p.send_offset : p.send_offset + n].numpy()
        ):
            report["errors"].append(f"AG W=1 param of {p.dtype}: slot != shard")
    # RS, W=1: sum and avg into fp32, own and Slot-Reuse staging.
    for op, use_slot in [("sum", False), ("avg", True)]:
        RL = nccl_tide.Layout([5000, 17], ["bf16", "bf16"], 1, rank=0, rs_chunk_bytes=4096)
        grads = [_float_data(torch, rng, p.numel, "bf16") for p in RL.params]
        exp = np.ascontiguousarray(nccl_tide.host_reduce_scatter(RL, [grads], out_dtype="fp32", op=op)[0])
        out = torch.full((RL.rs_out_numel,), float("nan"), device="cuda")
        staging = comm.alloc_slot(RL.rs_staging_bytes) if use_slot else None
        torch.cuda.synchronize()
        comm.reduce_scatter(RL, [g.cuda() for g in grads], out, op=op, staging=staging)
        comm.synchronize(timeout=30)
        if not np.array_equal(out.cpu().numpy().view(np.uint8), exp.view(np.uint8)):
            report["errors"].append(f"RS W=1 {op}: differs from the host executor")
    comm.close()
    dist.destroy_process_group()


def test_nccl_communicator_of_size_one(torch_cuda, cuda_lib, tmp_path):
    (rep,) = run_ranks(_nccl1_worker, 1, (), tmp_path, SPAWN_TIMEOUT)
    print("NCCL info:", rep.get("info"), "provider:", rep.get("provider"))
    info = rep["info"]
    assert 22800 <= info["runtime_version"] < 23300
    # 2.28.x: no host-side window pointers -> the IPC provider; from 2.29.2 the window provider (one rank: NCCL has
    # symmetric memory for it, so no fallback).
    assert info["provider"] == ("window" if info["runtime_version"] >= 22902 else "ipc")
    assert rep["provider"] == info["provider"]

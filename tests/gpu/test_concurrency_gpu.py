# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Concurrency on one GPU: independent loopback worlds (an AG world and an RS world, as FSDP's AG and RS
groups) driven from several Python threads at once, each on its own streams, while another thread creates and
destroys layouts; every result bit-exact against the host executor. The rules tested are docs/reliability.md's
"Thread safety": different comms may be used from different threads concurrently; one comm's calls are serialized
by the library (comm mutex), but the ranks of one world must still be called in a consistent order, so each world
here is driven by exactly one thread, which enqueues all of its ranks without waiting on the GPU in between (a
host wait between two ranks' calls of one world would wait for work that needs the rank not yet called)."""

import threading
import traceback
import zlib

import nccl_tide
import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

ITERS = 12


def seeded(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _layouts(numels, dts, W, **kw):
    return [nccl_tide.Layout(numels, dts, W, ranks_per_node=W, rank=r, **kw) for r in range(W)]


MAX_SLOT = 1 << 20  # one slot per AG world, allocated before the threads start and reused (no cudaMalloc/cudaFree,
# which may synchronize the device, while the other thread is between two ranks' calls of its world)


def ag_loop(torch, world, tid, failures, slots):
    W = world.n_ranks
    rng = seeded("conc-ag", tid)
    views = {1: np.uint8, 2: np.uint16, 4: np.uint32}  # the bit types TIDE accepts for floats
    signed = {"int8": np.int8, "int32": np.int32}  # integer shards keep their own type
    for it in range(ITERS):
        n = int(rng.integers(1, 5))
        numels = [int(rng.integers(1, 20000)) for _ in range(n)]
        dts = [str(rng.choice(["bf16", "fp32", "int8"])) for _ in range(n)]
        layouts = _layouts(numels, dts, W)  # created (and destroyed below) while the other world runs
        L = layouts[0]
        send_cpu = [torch.from_numpy(rng.integers(0, 256, size=L.send_bytes, dtype=np.uint8)) for _ in range(W)]
        shards = [
            [
                send_cpu[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size]
                .numpy()
                .view(signed.get(p.dtype, views[p.elem_size]))
                for p in L.params
            ]
            for r in range(W)
        ]
        expected = nccl_tide.host_all_gather(L, shards)
        assert L.slot_bytes <= MAX_SLOT
        for s in slots:
            s.fill_(0xFF)
        sends = [t.cuda() for t in send_cpu]
        torch.cuda.synchronize()  # inputs ready; the other world's enqueued work always completes (see module doc)
        world.all_gather(layouts, slots, sendbufs=sends, streams=world.streams)
        world.synchronize(timeout=60)
        for r in range(W):
            got = slots[r].cpu().numpy()
            for i, p in enumerate(L.params):
                exp = np.ascontiguousarray(expected[r][i]).view(np.uint8)
                if not np.array_equal(got[p.slot_offset : p.slot_offset + exp.size], exp):
                    failures.append(f"AG thread {tid} iter {it}: rank {r} param {i} differs")
        for lay in layouts:
            lay.close()


def rs_warm(torch, world):
    """One RS with the largest staging any rs_loop layout needs (fp32, 3 x 30000, 64 KiB chunks), before the threads
    start: the own staging never grows (no cudaMalloc) while the threads run."""
    W = world.n_ranks
    layouts = _layouts([30000] * 3, ["fp32"] * 3, W, rs_chunk_bytes=1 << 16)
    grads = [[torch.ones(p.numel, device="cuda") for p in layouts[0].params] for _ in range(W)]
    outs = [torch.empty(layouts[0].rs_out_numel, device="cuda") for _ in range(W)]
    torch.cuda.synchronize()
    world.reduce_scatter(layouts, grads, outs, op="sum", streams=world.streams)
    world.synchronize(timeout=60)
    assert all(bool((o == W).all()) for o in outs)


def rs_loop(torch, world, tid, failures, _unused=None):
    W = world.n_ranks
    rng = seeded("conc-rs", tid)
    for it in range(ITERS):
        n = int(rng.integers(1, 4))
        numels = [int(rng.integers(1, 30000)) for _ in range(n)]  # staging <= rs_warm's
        gdt = str(rng.choice(["bf16", "fp32"]))
        op = str(rng.choice(["sum", "avg"]))
        layouts = _layouts(numels, [gdt] * n, W, rs_chunk_bytes=int(rng.choice([4096, 1 << 16])))
        L = layouts[0]
        tdt = torch.bfloat16 if gdt == "bf16" else torch.float32
        grads = []
        for _ in range(W):
            g = []
            for p in L.params:
                x = rng.standard_normal(p.numel).astype(np.float32)
                x[x == 0] = 1.0
                g.append(torch.from_numpy(x).to(tdt))
            grads.append(g)
        expected = nccl_tide.host_reduce_scatter(L, grads, out_dtype="fp32", op=op)
        outs = [torch.full((L.rs_out_numel,), float("nan"), device="cuda") for _ in range(W)]
        dgrads = [[t.cuda() for t in g] for g in grads]
        torch.cuda.synchronize()
        world.reduce_scatter(layouts, dgrads, outs, op=op, streams=world.streams)
        world.synchronize(timeout=60)
        for r in range(W):
            got = outs[r].cpu().numpy().view(np.uint32)
            exp = np.ascontiguousarray(expected[r]).astype(np.float32).view(np.uint32)
            if not np.array_equal(got, exp):
                failures.append(
                    f"RS thread {tid} iter {it} ({gdt} {op}): rank {r}: {np.count_nonzero(got != exp)} differ"
                )
        for lay in layouts:
            lay.close()


def test_independent_worlds_from_threads(torch_cuda, cuda_lib):
    torch = torch_cuda
    from nccl_tide.cuda import LoopbackWorld

    # Created back to back: their 10 rank and internal streams are consecutive stream creations, so with
    # CUDA_DEVICE_MAX_CONNECTIONS=32 (tests/gpu/conftest.py) no two of them share a hardware queue (a shared queue
    # could put one world's flag wait in front of the other world's work).
    worlds = [LoopbackWorld(2), LoopbackWorld(3)]
    loops = [ag_loop, rs_loop]
    failures = []
    stop = threading.Event()

    def churn():
        rng = seeded("churn")
        try:
            while not stop.is_set():
                lay = nccl_tide.Layout([int(rng.integers(1, 10**6))] * 4, "bf16", 4, rank=1)
                assert lay.slot_bytes > 0
                lay.close()
        except BaseException:
            failures.append("churn: " + traceback.format_exc())

    ag_slots = worlds[0].alloc_slot(MAX_SLOT)
    rs_warm(torch, worlds[1])
    args = [ag_slots, None]

    def drive(i):
        try:
            loops[i](torch, worlds[i], i, failures, args[i])
        except BaseException:
            failures.append(f"world {i}: " + traceback.format_exc())

    threads = [threading.Thread(target=drive, args=(i,)) for i in range(len(worlds))]
    churner = threading.Thread(target=churn)
    try:
        churner.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=200)
        assert not any(t.is_alive() for t in threads), "a world's thread is stuck"
    finally:
        stop.set()
        churner.join(timeout=30)
        for w in worlds:
            w.close()
    assert not failures, "\n".join(failures[:5])

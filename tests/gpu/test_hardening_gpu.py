# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The bad-input probe on the GPU: canonical NaN bits from the CUDA reduce kernel, checked comm handles, and comms / worlds /
layouts closed while another thread uses them (loopback worlds on one device).

Runs in `bash ci/gpu.sh tests` (or alone: TIDE_GPU_TESTS=tests/gpu/test_hardening_gpu.py bash ci/gpu.sh build tests).
"""

import ctypes
import threading
import time

import numpy as np
import pytest

import nccl_tide
from nccl_tide import _native as N
from gpu_util import as_bits, make_layouts

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

CANON = {"fp32": 0x7FC00000, "bf16": 0x7FC0, "fp16": 0x7E00}
NAN_POOL = {"fp32": [0x7FC00000, 0xFFC00000, 0x7FA00001, 0xFFE12345, 0x7F800001],
            "bf16": [0x7FC0, 0xFFC0, 0x7FA1, 0xFF81],
            "fp16": [0x7E00, 0xFE00, 0x7D01, 0xFC01]}  # fmt: skip


def nan_grads(torch, rng, numel, dt, W):
    """Per rank: random values with NaNs of both signs and with payloads in about half the elements."""
    out = []
    for _ in range(W):
        x = rng.standard_normal(numel).astype(np.float32)
        t = torch.from_numpy(x).to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dt])
        bits = t.view(torch.int32 if dt == "fp32" else torch.int16).numpy()
        k = rng.permutation(numel)[: numel // 2 + 1]
        pool = np.array(NAN_POOL[dt], np.uint32 if dt == "fp32" else np.uint16)
        bits[k] = rng.choice(pool, k.size).view(bits.dtype)
        out.append(t)
    return out


@pytest.mark.parametrize("W,rpn", [(2, 2), (4, 4), (4, 2), (8, 4)])
@pytest.mark.parametrize("gdt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("odt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_kernel_writes_the_canonical_nan(torch_cuda, worlds, W, rpn, gdt, odt, op):
    torch = torch_cuda

    rng = np.random.default_rng(W * 100 + rpn * 10 + len(gdt + odt + op))
    numels = [4099, 77]  # vector bodies and scalar tails
    layouts = make_layouts(numels, [1, 1], [gdt, gdt], W, rpn=rpn, rs_chunk_bytes=4096)
    L = layouts[0]
    grads_cpu = [list(t) for t in zip(*[nan_grads(torch, rng, n, gdt, W) for n in numels])]
    expected = nccl_tide.host_reduce_scatter(L, grads_cpu, out_dtype=odt, op=op)
    out_t = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[odt]
    world = worlds(W)
    grads = [[g.cuda() for g in row] for row in grads_cpu]
    outs = [torch.full((L.rs_out_numel,), 3.0, dtype=out_t, device="cuda") for _ in range(W)]
    torch.cuda.synchronize()
    world.reduce_scatter(layouts, grads, outs, op=op)
    world.synchronize()
    for r in range(W):
        got = as_bits(torch, outs[r])
        nan = np.isnan(outs[r].float().cpu().numpy())
        assert nan.sum() > 10
        assert set((got[nan].astype(np.int64) & (0xFFFFFFFF if odt == "fp32" else 0xFFFF)).tolist()) == {CANON[odt]}
        assert got.tobytes() == np.ascontiguousarray(expected[r]).tobytes(), f"rank {r}: GPU and host differ"
    for lay in layouts:
        lay.close()


def test_comm_handles_destroyed_and_wrong_type(torch_cuda, cuda_lib):
    from nccl_tide.cuda import LoopbackWorld

    lib = N.lib()
    world = LoopbackWorld(2)
    c0 = world.comms[0]
    r, w = ctypes.c_int(), ctypes.c_int()
    assert lib.tideCommGetRank(c0, ctypes.byref(r), ctypes.byref(w)) == 0 and (r.value, w.value) == (0, 2)
    world.close()
    for call in (lambda: lib.tideCommGetRank(c0, ctypes.byref(r), ctypes.byref(w)), lambda: lib.tideCommDestroy(c0),
                 lambda: lib.tideCommAbort(c0), lambda: lib.tideSlotAlloc(c0, 4096, ctypes.byref(ctypes.c_void_p()))):
        assert call() == N.tideInvalidArgument and "destroyed" in N.last_error(), N.last_error()
    with nccl_tide.Layout([64], "fp32", 2) as l:
        assert lib.tideCommGetRank(l.handle.value, ctypes.byref(r), ctypes.byref(w)) == N.tideInvalidArgument
        assert "tideLayout_t" in N.last_error()
    with LoopbackWorld(2) as w2:  # a new world never gets the destroyed values back
        assert c0 not in w2.comms
        slot = w2.alloc_slot(1 << 16)
        torch_cuda.cuda.synchronize()
        w2.free_slot(slot)
        assert lib.tideSlotFree(w2.comms[0], slot[0].data_ptr()) == N.tideInvalidArgument  # a second free


def test_world_closed_while_another_thread_runs_collectives(torch_cuda, cuda_lib):
    """LoopbackWorld.close() on the main thread while a worker loops all-gathers + synchronize: close waits for the
    collective in flight (all ranks of it: it is never split), later calls raise "LoopbackWorld is closed". (A
    layout closed between the ranks' calls would leave a partial collective: a program error, as with NCCL; the CPU
    tests cover layouts closed under a call.)"""
    torch = torch_cuda
    from nccl_tide.cuda import LoopbackWorld
    from nccl_tide.errors import InvalidArgumentError

    W = 4
    for rnd in range(12):
        world = LoopbackWorld(W)
        layouts = make_layouts([1 << 16, 999], [1, 1], ["bf16", "bf16"], W)
        L = layouts[0]
        slots = world.alloc_slot(L.slot_bytes)
        sends = [torch.randint(0, 255, (L.send_bytes,), dtype=torch.uint8, device="cuda") for _ in range(W)]
        torch.cuda.synchronize()
        errors, done = [], [0, 0]

        def worker():
            for _ in range(20):
                try:
                    world.all_gather(layouts, slots, sendbufs=sends)
                    world.synchronize()
                    done[0] += 1
                except InvalidArgumentError as e:
                    if "is closed" not in str(e):
                        errors.append(repr(e))
                    done[1] += 1
                except BaseException as e:  # noqa: BLE001
                    errors.append(repr(e))

        t = threading.Thread(target=worker)
        t.start()
        time.sleep(0.001 * (rnd % 6))
        world.close()
        t.join(timeout=120)
        assert not t.is_alive()
        assert not errors, errors
        assert sum(done) >= 1
        world.close()
        for lay in layouts:
            lay.close()


@pytest.mark.parametrize("form", ["world", "rank"])
def test_close_waits_for_the_work_on_caller_streams(torch_cuda, cuda_lib, monkeypatch, form):
    """Collectives on caller streams (streams= / stream=, from new_streams) queued behind a ~0.25 s kernel, close() at
    once: at close()'s first tideSlotFree / tideCommDestroy every caller stream must be idle (close() waits for the
    events the calls recorded there; before, it synchronized only the world's own, idle, streams)."""
    torch = torch_cuda
    from nccl_tide.cuda import LoopbackWorld, new_streams

    W = 4
    world = LoopbackWorld(W)
    streams, release = new_streams(W)
    layouts = make_layouts([1 << 20, 999], [1, 1], ["bf16", "bf16"], W)
    L = layouts[0]
    slots = world.alloc_slot(L.slot_bytes)
    sends = [torch.randint(0, 255, (L.send_bytes,), dtype=torch.uint8, device="cuda") for _ in range(W)]
    torch.cuda.synchronize()
    for s in streams:
        with torch.cuda.stream(s):
            torch.cuda._sleep(500_000_000)  # about 0.25 s at H200 clocks
    if form == "world":
        world.all_gather(layouts, slots, sendbufs=sends, streams=streams)
    else:
        for r in range(W):
            world.rank_all_gather(r, layouts[r], slots[r], sendbuf=sends[r], stream=streams[r])
    real = N.lib()
    busy = []  # per teardown call: which caller streams still had work

    class Watch:
        def __getattr__(self, name):
            return getattr(real, name)

        def tideSlotFree(self, c, p):
            busy.append([not s.query() for s in streams])
            return real.tideSlotFree(c, p)

        def tideCommDestroy(self, c):
            busy.append([not s.query() for s in streams])
            return real.tideCommDestroy(c)

    assert not all(s.query() for s in streams), "the caller streams were idle before close(): the case shows nothing"
    monkeypatch.setattr(N, "lib", lambda: Watch())
    world.close()
    monkeypatch.undo()
    torch.cuda.synchronize()
    release()
    assert len(busy) == 2 * W, busy  # one slot freed and one comm destroyed per rank
    assert not any(any(b) for b in busy), f"close() freed / destroyed while caller streams had work: {busy}"
    for lay in layouts:
        lay.close()


def test_abort_and_close_racing_on_two_threads(torch_cuda, cuda_lib):
    """close() and abort() started together (a barrier) on two threads: neither raises, the world ends released
    (each comm destroyed or aborted once, the world's streams destroyed once: a second cuStreamDestroy of a freed
    stream is undefined), and the device still works."""
    torch = torch_cuda
    from nccl_tide.cuda import LoopbackWorld

    for rnd in range(8):
        world = LoopbackWorld(2)
        world.alloc_slot(1 << 16)
        torch.cuda.synchronize()
        barrier, errors = threading.Barrier(2), []

        def run(op, barrier=barrier, errors=errors):
            barrier.wait()
            try:
                op()
            except BaseException as e:  # noqa: BLE001
                errors.append(repr(e))

        ops = [world.close, world.abort] if rnd % 2 else [world.abort, world.close]
        threads = [threading.Thread(target=run, args=(op,)) for op in ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads) and not errors, errors
        assert world._comms == [] and world._raw_streams == []
    x = torch.arange(1024, device="cuda", dtype=torch.float32)
    assert float(x.sum()) == 1023 * 1024 / 2


def test_c_comm_destroy_while_another_thread_calls(torch_cuda, cuda_lib):
    """Straight at the C API: tideCommDestroy of a loopback comm while another thread loops tideCommGetRank /
    tideSlotAlloc on it: each call succeeds or fails with tideInvalidArgument; nothing crashes."""
    lib = N.lib()
    for _ in range(10):
        arr = (N.tideComm_t * 2)()
        assert lib.tideLoopbackCreate(2, 0, arr) == 0
        c0, c1 = arr[0], arr[1]
        results = []

        def worker():
            for _ in range(200):
                r, w = ctypes.c_int(), ctypes.c_int()
                rc = lib.tideCommGetRank(c0, ctypes.byref(r), ctypes.byref(w))
                results.append((rc, N.last_error() if rc else ""))

        t = threading.Thread(target=worker)
        t.start()
        assert lib.tideCommDestroy(c0) == 0
        t.join()
        assert lib.tideCommDestroy(c1) == 0
        for rc, msg in results:
            assert rc == 0 or (rc == N.tideInvalidArgument and "comm" in msg), (rc, msg)

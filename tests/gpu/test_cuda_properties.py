# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Properties of the CUDA path other than values: no kernel on the AG path, errors before any copy, the multicast
gate."""

import ctypes
import json
import os

import numpy as np
import pytest

import nccl_tide
from gpu_util import POISON, as_bits, make_layouts, random_bytes, random_float

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def world4(torch_cuda, cuda_lib):
    from nccl_tide.cuda import LoopbackWorld

    w = LoopbackWorld(4)
    yield w
    w.close()


def _trace_events(prof, tmp_path):
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        data = json.load(f)
    return data.get("traceEvents", data if isinstance(data, list) else [])


def test_all_gather_launches_no_kernel(torch_cuda, world4, tmp_path):
    torch = torch_cuda
    from torch.profiler import ProfilerActivity, profile

    W = 4
    layouts = make_layouts([1 << 20, 4096, 3 * 1000], [1, 1, 1000], ["bf16", "fp32", "bf16"], W)
    L = layouts[0]
    slots = world4.alloc_slot(L.slot_bytes)
    rng = np.random.default_rng(7)
    send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(W)]
    # RS control layout: one gradient dtype (the CUDA RS needs that; the AG layout above mixes bf16 and fp32).
    rs_layouts = make_layouts([1 << 16, 4096], [1, 1], ["bf16", "bf16"], W)
    grads = [[random_float(torch, rng, p.numel, "bf16").cuda() for p in rs_layouts[0].params] for _ in range(W)]
    world4.all_gather(layouts, slots, sendbufs=send)  # warm-up (driver entry points, batch API)
    world4.synchronize()
    torch.cuda.synchronize()

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            world4.all_gather(layouts, slots, sendbufs=send)
        world4.synchronize()
        torch.cuda.synchronize()
    ag_events = _trace_events(prof, tmp_path)
    ag_kernels = [e for e in ag_events if e.get("cat") == "kernel"]
    ag_copies = [e for e in ag_events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]

    # Positive control: the profiler does see kernels (the RS reduce kernel) in this process.
    outs = [torch.empty(rs_layouts[0].rs_out_numel, dtype=torch.float32, device="cuda") for _ in range(W)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof2:
        world4.reduce_scatter(rs_layouts, grads, outs)
        world4.synchronize()
        torch.cuda.synchronize()
    rs_kernels = [e for e in _trace_events(prof2, tmp_path) if e.get("cat") == "kernel"]
    print(f"AG: {len(ag_kernels)} kernels, {len(ag_copies)} copies; RS control: {len(rs_kernels)} kernels")
    assert rs_kernels, "profiler saw no kernel even for the RS: the zero-kernel check would prove nothing"
    assert not ag_kernels, f"the all-gather launched kernels: {sorted({e.get('name') for e in ag_kernels})}"
    world4.synchronize()
    world4.free_slot(slots)


def _err(fn, exc_type, match):
    with pytest.raises(exc_type, match=match):
        fn()


def test_bad_input_errors_before_any_copy(torch_cuda, world4):
    torch = torch_cuda
    from nccl_tide import _native as N

    lib = N.lib()
    W = 4
    layouts = make_layouts([1000, 64 * 3], [1, 64], ["bf16", "bf16"], W, rs_chunk_bytes=256)
    L = layouts[0]
    slots = world4.alloc_slot(L.slot_bytes)
    for s in slots:
        s.fill_(POISON)
    rng = np.random.default_rng(3)
    send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(W)]
    comm0 = world4.comms[0]
    stream0 = world4.streams[0].cuda_stream

    def ag(comm, layout, sendbuf, slot, stream):
        return lib.tideAllGather(comm, layout.handle, sendbuf, None, slot, stream)

    cases = {
        "NULL slot": ag(comm0, L, send[0].data_ptr(), None, stream0),
        "misaligned slot": ag(comm0, L, send[0].data_ptr(), slots[0].data_ptr() + 16, stream0),
        "slot not a slot": ag(comm0, L, send[0].data_ptr(), send[1].data_ptr(), stream0),
        "slot too small": ag(comm0, L, send[0].data_ptr(), slots[0].data_ptr() + 256 * ((L.slot_bytes // 256)), stream0),
        "layout of another rank": ag(comm0, layouts[1], send[0].data_ptr(), slots[0].data_ptr(), stream0),
        "host sendbuf": ag(comm0, L, ctypes.addressof(ctypes.create_string_buffer(L.send_bytes + 64)) // 64 * 64 + 64,
                           slots[0].data_ptr(), stream0),
        "both NULL": ag(comm0, L, None, slots[0].data_ptr(), stream0),
        "legacy default stream": ag(comm0, L, send[0].data_ptr(), slots[0].data_ptr(), None),
    }
    other_world = make_layouts([1000, 64 * 3], [1, 64], ["bf16", "bf16"], 2)
    cases["layout of another world size"] = ag(comm0, other_world[0], send[0].data_ptr(), slots[0].data_ptr(), stream0)
    for name, res in cases.items():
        assert res != 0, f"{name}: accepted"
        msg = N.last_error()
        print(f"{name}: {res} {msg}")
        assert msg, f"{name}: no message"
    torch.cuda.synchronize()
    for s in slots:
        assert bool((s == POISON).all()), "a failed all-gather wrote into a slot"

    # Reduce-scatter: mixed gradient dtypes are unsupported, other bad input is rejected; out stays untouched.
    mixed = make_layouts([1000, 640], [1, 1], ["bf16", "fp32"], W)
    out = torch.full((mixed[0].rs_out_numel,), 7.0, device="cuda")
    g = [torch.zeros(1000, dtype=torch.bfloat16, device="cuda"), torch.zeros(640, dtype=torch.float32, device="cuda")]
    with pytest.raises(nccl_tide.UnsupportedError, match="one gradient dtype"):
        world4.rank_reduce_scatter(0, mixed[0], g, out)
    grads = [torch.ones(p.numel, dtype=torch.bfloat16, device="cuda") for p in L.params]
    out = torch.full((L.rs_out_numel,), 7.0, device="cuda")
    tab = N.pointer_table([t.data_ptr() for t in grads])
    rs_cases = {
        "NULL out": lib.tideReduceScatter(comm0, L.handle, tab, None, N.tideFloat32, N.tideSum, 1.0, None, stream0),
        "bad op": lib.tideReduceScatter(comm0, L.handle, tab, out.data_ptr(), N.tideFloat32, 7, 1.0, None, stream0),
        "bad outType": lib.tideReduceScatter(comm0, L.handle, tab, out.data_ptr(), N.tideInt8, N.tideSum, 1.0, None,
                                             stream0),
        "nan scale": lib.tideReduceScatter(comm0, L.handle, tab, out.data_ptr(), N.tideFloat32, N.tidePremulSum,
                                           float("nan"), None, stream0),
        "misaligned out": lib.tideReduceScatter(comm0, L.handle, tab, out.data_ptr() + 2, N.tideFloat32, N.tideSum,
                                                1.0, None, stream0),
        "staging not a slot": lib.tideReduceScatter(comm0, L.handle, tab, out.data_ptr(), N.tideFloat32, N.tideSum,
                                                    1.0, send[0].data_ptr(), stream0),
        "NULL grad": lib.tideReduceScatter(comm0, L.handle, N.pointer_table([grads[0].data_ptr(), None]),
                                           out.data_ptr(), N.tideFloat32, N.tideSum, 1.0, None, stream0),
        "out overlaps grads": lib.tideReduceScatter(comm0, L.handle, tab, grads[0].data_ptr(), N.tideBfloat16,
                                                    N.tideSum, 1.0, None, stream0),
    }
    for name, res in rs_cases.items():
        assert res != 0, f"RS {name}: accepted"
        print(f"RS {name}: {res} {N.last_error()}")
    torch.cuda.synchronize()
    assert bool((out == 7.0).all()), "a failed reduce-scatter wrote its output"

    # The world is still usable after all those errors.
    world4.all_gather(layouts, slots, sendbufs=send)
    world4.synchronize()
    world4.free_slot(slots)


def test_shared_stream_is_rejected_and_world_recovers(torch_cuda, world4):
    torch = torch_cuda
    W = 4
    layouts = make_layouts([4096], [1], ["fp32"], W)
    L = layouts[0]
    slots = world4.alloc_slot(L.slot_bytes)
    rng = np.random.default_rng(11)
    send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(W)]
    s0 = world4.streams[0]
    world4.rank_all_gather(0, L, slots[0], sendbuf=send[0], stream=s0)
    with pytest.raises(nccl_tide.InvalidUsageError, match="same stream"):
        world4.rank_all_gather(1, layouts[1], slots[1], sendbuf=send[1], stream=s0)
    # Rank 1 was refused before it enqueued anything: it may still join the epoch on its own stream.
    for r in range(1, W):
        world4.rank_all_gather(r, layouts[r], slots[r], sendbuf=send[r], stream=world4.streams[r])
    world4.synchronize()
    for r in range(W):
        got = slots[r].cpu().numpy()
        for s in range(W):
            assert np.array_equal(got[s * L.send_bytes : (s + 1) * L.send_bytes], send[s].cpu().numpy())
    world4.free_slot(slots)


GATE_VARS = ["NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "NCCL_TIDE_NVLS"]


@pytest.mark.parametrize(
    "env,allowed",
    [
        ({}, False),
        ({"NCCL_TIDE_NVLS": "1"}, True),
        ({"NCCL_TIDE_NVLS": "0"}, False),
        ({"NCCL_TIDE_NVLS": "1", "NCCL_NVLS_ENABLE": "0"}, False),
        ({"NCCL_TIDE_NVLS": "1", "NCCL_NVLS_ENABLE": "1"}, True),
        ({"NCCL_TIDE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}, False),
        ({"NCCL_TIDE_NVLS": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0"}, False),
        ({"NCCL_TIDE_NVLS": "1", "NVSHMEM_DISABLE_NVLS": "1"}, False),
    ],
)
def test_multicast_gate(torch_cuda, world4, monkeypatch, env, allowed):
    """The gate only. With it open, loopback has no multicast address: the AG reports multicast
    unsupported (INFO) and still gathers correctly with unicast copies. Nothing here creates a multicast object."""
    torch = torch_cuda
    from nccl_tide.cuda import multicast_allowed

    for v in GATE_VARS:
        monkeypatch.delenv(v, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert multicast_allowed() is allowed
    W = 4
    layouts = make_layouts([3000], [1], ["bf16"], W)
    L = layouts[0]
    slots = world4.alloc_slot(L.slot_bytes)
    rng = np.random.default_rng(5)
    send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(W)]
    world4.all_gather(layouts, slots, sendbufs=send)
    world4.synchronize()
    want = torch.cat(send).cpu().numpy()
    for r in range(W):
        assert np.array_equal(slots[r].cpu().numpy()[: want.size], want)
    world4.free_slot(slots)

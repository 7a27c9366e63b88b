# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""CUDA data path in loopback worlds, bit-exact against the host executor (the oracle).

Every output is poisoned (0xFF bytes) before each run, so an element the GPU did not write shows; the AG also checks
that no byte of the slot outside the parameters' regions changed.
"""

import numpy as np
import pytest

import nccl_tide
from gpu_util import ALL_DTYPES, POISON, RS_DTYPES, as_bits, bits_dtype, make_layouts, random_bytes, random_float
from gpu_util import random_layout_spec, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

WORLDS = list(range(2, 9))


# ----------------------------------------------------------------------------------------------------------------
# All-gather
# ----------------------------------------------------------------------------------------------------------------


def run_ag(torch, world, rng, numels, rows, dts, form, streams=None, layouts=None):
    W = world.n_ranks
    if layouts is None:
        layouts = make_layouts(numels, rows, dts, W)
    L = layouts[0]
    extra = 512  # bytes past slot_bytes that must stay poisoned
    slots = world.alloc_slot(L.slot_bytes + extra)
    try:
        for s in slots:
            s.fill_(POISON)
        infos = L.params
        send_cpu = [random_bytes(torch, rng, L.send_bytes) for _ in range(W)]
        host_shards = [
            [
                send_cpu[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].view(
                    bits_dtype(torch, p.dtype))
                for p in infos
            ]
            for r in range(W)
        ]
        expected = nccl_tide.host_all_gather(L, host_shards)
        torch.cuda.synchronize()  # poison and inputs are written on the current stream; caller streams don't wait
        if form == "sendbuf":
            sendbufs = [t.cuda() for t in send_cpu]
            world.all_gather(layouts, slots, sendbufs=sendbufs, streams=streams)
        else:
            shards = [[t.clone().cuda() for t in host_shards[r]] for r in range(W)]
            world.all_gather(layouts, slots, shards=shards, streams=streams)
        world.synchronize()
        if streams is not None:
            world.synchronize(streams=streams)
        for r in range(W):
            got = slots[r].cpu().numpy()
            touched = np.zeros(got.size, dtype=bool)
            for i, p in enumerate(infos):
                n = p.shard_numel * W * p.elem_size
                region = got[p.slot_offset : p.slot_offset + n]
                exp = np.ascontiguousarray(expected[r][i]).view(np.uint8)
                if not np.array_equal(region, exp):
                    bad = np.flatnonzero(region != exp)
                    pytest.fail(
                        f"AG W={W} {form}: rank {r} param {i} ({p.dtype}, numel {p.numel}, shard {p.shard_numel}): "
                        f"{bad.size} bytes differ, first at byte {bad[0]} (got {region[bad[0]]}, want {exp[bad[0]]})"
                    )
                touched[p.slot_offset : p.slot_offset + n] = True
            assert np.all(got[~touched] == POISON), f"AG W={W}: rank {r} wrote outside the parameters' regions"
    finally:
        world.synchronize()
        world.free_slot(slots)
    return layouts


@pytest.mark.parametrize("form", ["sendbuf", "shards"])
@pytest.mark.parametrize("W", WORLDS)
def test_all_gather_bit_exact(torch_cuda, worlds, W, form):
    world = worlds(W)
    rng = seeded("ag", W, form)
    for dt in ALL_DTYPES:
        numels, rows, dts = random_layout_spec(rng, W, [dt])
        run_ag(torch_cuda, world, rng, numels, rows, dts, form)
    # Mixed dtypes in one group, and a group of one tiny parameter (numel < W: most ranks' shards are all padding).
    numels, rows, dts = random_layout_spec(rng, W, ALL_DTYPES)
    run_ag(torch_cuda, world, rng, numels, rows, dts, form)
    run_ag(torch_cuda, world, rng, [1], [1], ["bf16"], form)


def test_caller_streams(torch_cuda, cuda_lib):
    """Caller-provided streams (one per rank) instead of the world's own, for AG and RS."""
    from nccl_tide.cuda import LoopbackWorld, new_streams

    world = LoopbackWorld(3)
    streams, release = new_streams(3)
    try:
        rng = seeded("caller-streams")
        numels, rows, dts = random_layout_spec(rng, 3, ["bf16", "fp32"])
        torch_cuda.cuda.synchronize()
        run_ag(torch_cuda, world, rng, numels, rows, dts, "sendbuf", streams=streams)
        run_rs(torch_cuda, world, rng, "bf16", "fp32", "avg", 4096, True, streams=streams)
    finally:
        world.synchronize(streams=streams)
        world.close()
        release()


# ----------------------------------------------------------------------------------------------------------------
# Reduce-scatter
# ----------------------------------------------------------------------------------------------------------------

SCALES = [0.3125, -1.75, 3.0e-3, 1.0]


def run_rs(torch, world, rng, gdt, odt, op, chunk_bytes, slot_staging, max_numel=20000, streams=None, layouts=None):
    W = world.n_ranks
    if layouts is None:
        numels, rows, _ = random_layout_spec(rng, W, [gdt], max_rows=max(2, max_numel // 64))
        numels = [min(n, max_numel) - (min(n, max_numel) % r) or r for n, r in zip(numels, rows)]
        layouts = make_layouts(numels, rows, [gdt] * len(numels), W, rs_chunk_bytes=chunk_bytes)
    L = layouts[0]
    infos = L.params
    scale = float(SCALES[int(rng.integers(0, len(SCALES)))])
    grads_cpu = [[random_float(torch, rng, p.numel, gdt) for p in infos] for _ in range(W)]
    expected = nccl_tide.host_reduce_scatter(L, grads_cpu, out_dtype=odt, op=op, scale=scale)
    grads = [[g.cuda() for g in gr] for gr in grads_cpu]
    out_t = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[odt]
    outs = []
    for _ in range(W):
        raw = torch.full((L.rs_out_numel * np.dtype(np.float32 if odt == "fp32" else np.float16).itemsize,), POISON,
                         dtype=torch.uint8, device="cuda")
        outs.append(raw.view(out_t))
    staging = world.alloc_slot(L.rs_staging_bytes) if slot_staging else None
    torch.cuda.synchronize()
    try:
        world.reduce_scatter(layouts, grads, outs, op=op, scale=scale, staging=staging, streams=streams)
        world.synchronize()
        if streams is not None:
            world.synchronize(streams=streams)
        for r in range(W):
            got = as_bits(torch, outs[r]).view(np.uint8)
            exp = np.ascontiguousarray(expected[r]).view(np.uint8)
            if not np.array_equal(got, exp):
                bad = np.flatnonzero(got != exp)
                pytest.fail(
                    f"RS W={W} {gdt}->{odt} {op} scale={scale} chunk={L.rs_chunk_numel}x{L.rs_num_chunks} "
                    f"staging={'slot' if slot_staging else 'own'}: rank {r}: {bad.size} bytes differ, first at byte "
                    f"{bad[0]} of {got.size}"
                )
    finally:
        if staging is not None:
            world.synchronize()
            world.free_slot(staging)
    return layouts


# chunk bytes of fp32 output: 32 B (8 elements: very many chunks), 4 KiB (some), 1 MiB (one or few), layout default
CHUNKS = [32, 4096, 1 << 20, None]


@pytest.mark.parametrize("gdt", RS_DTYPES)
@pytest.mark.parametrize("W", WORLDS)
def test_reduce_scatter_bit_exact(torch_cuda, worlds, W, gdt):
    world = worlds(W)
    rng = seeded("rs", W, gdt)
    k = 0
    for odt in RS_DTYPES:
        for op in ["sum", "avg", "premul"]:
            chunk = CHUNKS[k % len(CHUNKS)]
            slot_staging = (k // 2) % 2 == 0
            max_numel = 1500 if chunk == 32 else 20000
            run_rs(torch_cuda, world, rng, gdt, odt, op, chunk, slot_staging, max_numel=max_numel)
            k += 1


def test_reduce_scatter_chunk_counts(torch_cuda, worlds):
    """One layout, every chunk size from one chunk to thousands, both staging kinds."""
    world = worlds(4)
    rng = seeded("rs-chunks")
    numels, rows = [1000, 37, 4096, 3], [1, 1, 64, 1]
    for chunk in [32, 64, 96, 1024, 4000, 16384, 1 << 22]:
        for slot_staging in (False, True):
            layouts = make_layouts(numels, rows, ["bf16"] * 4, 4, rs_chunk_bytes=chunk)
            run_rs(torch_cuda, world, rng, "bf16", "fp32", "sum", chunk, slot_staging, layouts=layouts)


def test_sequence_slot_reuse(torch_cuda, worlds):
    """AG, then RS staged in the vacated AG slot (Slot-Reuse), then AG again, RS with own staging growing: the flag
    epochs and chunk counters must carry across calls of different shapes."""
    torch = torch_cuda
    world = worlds(4)
    rng = seeded("sequence")
    for it in range(3):
        numels, rows, dts = random_layout_spec(rng, 4, ["bf16"])
        run_ag(torch, world, rng, numels, rows, dts, "sendbuf")
        layouts = make_layouts(numels, rows, dts, 4, rs_chunk_bytes=[64, 8192, 1 << 21][it])
        L = layouts[0]
        slots = world.alloc_slot(max(L.slot_bytes, L.rs_staging_bytes))
        try:
            # AG into the slot, check, then reuse the same slot as RS staging.
            send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(4)]
            world.all_gather(layouts, slots, sendbufs=send)
            world.synchronize()
            grads_cpu = [[random_float(torch, rng, p.numel, "bf16") for p in L.params] for _ in range(4)]
            expected = nccl_tide.host_reduce_scatter(L, grads_cpu, out_dtype="bf16", op="avg")
            grads = [[g.cuda() for g in gr] for gr in grads_cpu]
            outs = [torch.full((L.rs_out_numel,), float("nan"), dtype=torch.bfloat16, device="cuda") for _ in range(4)]
            world.reduce_scatter(layouts, grads, outs, op="avg", staging=slots)
            world.synchronize()
            for r in range(4):
                assert np.array_equal(as_bits(torch, outs[r]).view(np.uint16), np.asarray(expected[r]).view(np.uint16))
        finally:
            world.synchronize()
            world.free_slot(slots)
        run_rs(torch, world, rng, "bf16", "fp32", "sum", [1 << 16, 1 << 18, 1 << 20][it], False)


def test_repeated_calls_without_host_sync(torch_cuda, worlds):
    """Many collectives back to back, synchronizing only at the end (flag epochs run ahead of the host)."""
    torch = torch_cuda
    world = worlds(8)
    rng = seeded("repeat")
    numels, rows = [5000, 123, 7 * 64], [1, 1, 64]
    layouts = make_layouts(numels, rows, ["bf16"] * 3, 8, rs_chunk_bytes=2048)
    L = layouts[0]
    slots = world.alloc_slot(L.slot_bytes)
    grads_cpu = [[random_float(torch, rng, p.numel, "bf16") for p in L.params] for _ in range(8)]
    expected = nccl_tide.host_reduce_scatter(L, grads_cpu, out_dtype="fp32", op="sum")
    grads = [[g.cuda() for g in gr] for gr in grads_cpu]
    outs = [torch.empty(L.rs_out_numel, dtype=torch.float32, device="cuda") for _ in range(8)]
    send = [random_bytes(torch, rng, L.send_bytes, "cuda") for _ in range(8)]
    try:
        for _ in range(20):
            world.all_gather(layouts, slots, sendbufs=send)
            world.reduce_scatter(layouts, grads, outs, op="sum", staging=slots if L.slot_reuse_fits else None)
        world.synchronize()
        for r in range(8):
            assert np.array_equal(as_bits(torch, outs[r]).view(np.uint8), np.asarray(expected[r]).view(np.uint8))
    finally:
        world.synchronize()
        world.free_slot(slots)


def test_graph_capture_is_refused(torch_cuda, cuda_lib):
    """What a CUDA graph cannot capture fails at capture time with tideUnsupported, before anything is enqueued or
    any counter moves (tests/gpu/test_graph_capture.py runs what can be captured): RS with the world's own staging
    (its growth allocates and is collective), RS with more than 2 pipeline chunks, AG of a layout of several
    (virtual) nodes. The capture stays valid and can be ended and replayed, and the comm's epochs are unchanged (the
    world still runs AG and RS bit-exactly afterwards)."""
    from nccl_tide.cuda import LoopbackWorld
    from nccl_tide.errors import UnsupportedError

    torch = torch_cuda
    world = LoopbackWorld(2)
    try:
        rng = seeded("capture")
        layouts = make_layouts([1000, 37, 5 * 64], [1, 1, 64], ["bf16"] * 3, 2, rs_chunk_bytes=1024)
        L = layouts[0]
        assert L.rs_num_chunks > 2
        slots = world.alloc_slot(max(L.slot_bytes, L.rs_staging_bytes))
        vn = make_layouts([999, 5], [1, 1], ["fp32", "bf16"], 2, rpn=1, pace_bytes=512)  # 2 virtual nodes
        vn_slots = world.alloc_slot(vn[0].slot_bytes)
        vn_send = [random_bytes(torch, rng, vn[0].send_bytes, "cuda") for _ in range(2)]
        grads = [[random_float(torch, rng, p.numel, "bf16").cuda() for p in L.params] for _ in range(2)]
        out = torch.empty(L.rs_out_numel, dtype=torch.float32, device="cuda")
        x = torch.zeros(256, device="cuda")
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.graph(g, stream=s):
            x.add_(1.0)
            with pytest.raises(UnsupportedError, match="several nodes"):
                world.rank_all_gather(0, vn[0], vn_slots[0], sendbuf=vn_send[0], stream=s)
            with pytest.raises(UnsupportedError, match="Slot-Reuse"):
                world.rank_reduce_scatter(0, L, grads[0], out, op="sum", stream=s)
            with pytest.raises(UnsupportedError, match="at most 2"):
                world.rank_reduce_scatter(0, L, grads[0], out, op="sum", staging=slots[0], stream=s)
            x.add_(1.0)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        assert torch.all(x == 6.0).item()
        world.synchronize()
        world.free_slot(slots)
        world.free_slot(vn_slots)
        # Nothing was taken: the next collectives pair up across ranks as before.
        run_ag(torch, world, rng, [1000, 37, 5 * 64], [1, 1, 64], ["bf16"] * 3, "sendbuf")
        run_rs(torch, world, rng, "bf16", "fp32", "avg", 1024, True)
        vn = make_layouts([999, 5], [1, 1], ["fp32", "bf16"], 2, rpn=1, pace_bytes=512)  # 2 virtual nodes
        run_ag(torch, world, rng, [999, 5], [1, 1], ["fp32", "bf16"], "shards", layouts=vn)
    finally:
        world.synchronize()
        world.close()

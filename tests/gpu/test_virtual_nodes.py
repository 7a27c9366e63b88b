# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Multi-node layouts on one GPU ("virtual nodes"): a loopback world of W virtual ranks split into N nodes of
R ranks (layout ranks_per_node R < W), so the CUDA executors run the inter-node algorithm (AG: paced Bruck-style
rail schedule then node-local fan-out; RS: node-local reduction then the fp32 running sum along each rail in node
order), bit-exact against the host executor.

Every output is poisoned first; small pacing caps cut each block into many steps, small RS chunks make many
pipeline steps; both Slot-Reuse and own staging; epochs and chunk counters carry across single-node and multi-node
calls on the same world.
"""

import numpy as np
import pytest

import nccl_tide
from gpu_util import ALL_DTYPES, RS_DTYPES, make_layouts, random_layout_spec, seeded
from test_cuda_collectives import run_ag, run_rs

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

# (W, R): nodes of R ranks. 2x4, 4x2, 3x2, 2x3, 4x1, 8x1, 5x1 (non-power-of-two node counts: 3, 5), 3x1.
SPLITS = [(8, 4), (8, 2), (6, 2), (6, 3), (4, 1), (8, 1), (5, 1), (3, 1), (4, 2)]
PACES = [256, 4096, 1 << 16, None]  # bytes per schedule step (None: the layout default, 8 MiB: one step per block)


def split_id(split):
    W, R = split
    return f"W{W}_{W // R}x{R}"


def test_layout_geometry():
    """The layouts these tests use really are multi-node, with a schedule of several steps per block."""
    numels, rows = [5000, 37, 64 * 9], [1, 1, 64]
    L = nccl_tide.Layout(numels, "bf16", 8, ranks_per_node=2, rank=3, row_numels=rows, pace_bytes=256)
    assert (L.world_size, L.ranks_per_node, L.n_nodes) == (8, 2, 4)
    steps = L.schedule(1)
    pieces = -(-L.send_bytes // 256)
    assert pieces > 3 and len(steps) == 3 * pieces  # N - 1 blocks received per node, each in `pieces` steps
    assert (
        L.rs_staging_bytes < nccl_tide.Layout(numels, "bf16", 8, ranks_per_node=2, rank=3, row_numels=rows).slot_bytes
    )


@pytest.mark.parametrize("form", ["sendbuf", "shards"])
@pytest.mark.parametrize("split", SPLITS, ids=split_id)
def test_all_gather_virtual_nodes(torch_cuda, worlds, split, form):
    W, R = split
    world = worlds(W)
    rng = seeded("vn-ag", W, R, form)
    for k, dt in enumerate(ALL_DTYPES):
        pace = PACES[k % len(PACES)]
        numels, rows, dts = random_layout_spec(rng, W, [dt], max_rows=120 if pace == 256 else 300)
        layouts = make_layouts(numels, rows, dts, W, rpn=R, pace_bytes=pace)
        run_ag(torch_cuda, world, rng, numels, rows, dts, form, layouts=layouts)
    # Mixed dtypes (alignment gaps inside the packed send buffer, which the schedule's byte ranges cross), a pace cap
    # that is not a multiple of any element size, and one tiny parameter (numel < W).
    numels, rows, dts = random_layout_spec(rng, W, ALL_DTYPES)
    run_ag(
        torch_cuda,
        world,
        rng,
        numels,
        rows,
        dts,
        form,
        layouts=make_layouts(numels, rows, dts, W, rpn=R, pace_bytes=1000),
    )
    run_ag(
        torch_cuda,
        world,
        rng,
        [1],
        [1],
        ["bf16"],
        form,
        layouts=make_layouts([1], [1], ["bf16"], W, rpn=R, pace_bytes=1),
    )


@pytest.mark.parametrize("gdt", RS_DTYPES)
@pytest.mark.parametrize("split", SPLITS, ids=split_id)
def test_reduce_scatter_virtual_nodes(torch_cuda, worlds, split, gdt):
    W, R = split
    world = worlds(W)
    rng = seeded("vn-rs", W, R, gdt)
    chunks = [32, 4096, 1 << 20, None]  # fp32 output bytes per chunk: 8 elements (many chunks) .. one chunk
    k = 0
    for odt in ["fp32", "bf16", "fp16"]:
        for op in ["sum", "avg", "premul"]:
            chunk = chunks[k % len(chunks)]
            slot_staging = (k // 2) % 2 == 0
            max_numel = 1200 if chunk == 32 else 20000
            numels, rows, _ = random_layout_spec(rng, W, [gdt], max_rows=max(2, max_numel // 64))
            numels = [min(n, max_numel) - (min(n, max_numel) % r) or r for n, r in zip(numels, rows)]
            layouts = make_layouts(numels, rows, [gdt] * len(numels), W, rpn=R, rs_chunk_bytes=chunk)
            run_rs(torch_cuda, world, rng, gdt, odt, op, chunk, slot_staging, layouts=layouts)
            k += 1


@pytest.mark.parametrize("split", [(8, 2), (6, 3), (4, 1)], ids=split_id)
def test_reduce_scatter_odd_single_chunk(torch_cuda, worlds, split):
    """One chunk whose element count is not a multiple of 8 (so R * chunk * 2 bytes of bf16 inputs need not be
    4-byte aligned): the fp32 partial slot must still be aligned. Both staging kinds."""
    W, R = split
    world = worlds(W)
    rng = seeded("vn-odd", W, R)
    for numels in ([13 * W - 3], [W + 1, 2 * W + 1], [1, 3]):
        rows = [1] * len(numels)
        for slot_staging in (False, True):
            layouts = make_layouts(numels, rows, ["bf16"] * len(numels), W, rpn=R, rs_chunk_bytes=1 << 20)
            assert layouts[0].rs_num_chunks == 1
            run_rs(torch_cuda, world, rng, "bf16", "bf16", "avg", 1 << 20, slot_staging, layouts=layouts)


def test_mixed_single_and_multi_node_sequence(torch_cuda, worlds):
    """Single-node and multi-node layouts alternate on one world without a host sync in between the collectives of a
    round: AG epochs and RS task numbers (numChunks per single-node call, numChunks * N per multi-node call) must stay
    equal on every rank."""
    torch = torch_cuda
    W = 8
    world = worlds(W)
    rng = seeded("vn-mixed")
    for it, R in enumerate([8, 2, 4, 1, 8, 2]):
        numels, rows, dts = random_layout_spec(rng, W, ["bf16", "fp32"])
        layouts = make_layouts(numels, rows, dts, W, rpn=R, pace_bytes=[512, 4096][it % 2])
        run_ag(torch, world, rng, numels, rows, dts, "sendbuf", layouts=layouts)
        numels, rows, _ = random_layout_spec(rng, W, ["bf16"], max_rows=100)
        numels = [min(n, 4000) - (min(n, 4000) % r) or r for n, r in zip(numels, rows)]
        layouts = make_layouts(numels, rows, ["bf16"] * len(numels), W, rpn=R, rs_chunk_bytes=[256, 4096][it % 2])
        run_rs(torch, world, rng, "bf16", "fp32", ["sum", "avg"][it % 2], None, it % 2 == 0, layouts=layouts)


def test_repeated_multi_node_without_host_sync(torch_cuda, worlds):
    """AG and RS (2x4 virtual nodes) back to back 10 times, Slot-Reuse staging in the AG slot, one sync at the end."""
    from gpu_util import as_bits, bits_dtype, random_bytes, random_float

    torch = torch_cuda
    W, R = 8, 4
    world = worlds(W)
    rng = seeded("vn-repeat")
    numels, rows = [5000, 123, 7 * 64], [1, 1, 64]
    layouts = make_layouts(numels, rows, ["bf16"] * 3, W, rpn=R, rs_chunk_bytes=1024, pace_bytes=2048)
    L = layouts[0]
    slots = world.alloc_slot(max(L.slot_bytes, L.rs_staging_bytes))
    grads_cpu = [[random_float(torch, rng, p.numel, "bf16") for p in L.params] for _ in range(W)]
    expected = nccl_tide.host_reduce_scatter(L, grads_cpu, out_dtype="fp32", op="avg")
    send_cpu = [random_bytes(torch, rng, L.send_bytes) for _ in range(W)]
    infos = L.params
    shards = [
        [send_cpu[r][p.send_offset : p.send_offset + p.shard_numel * p.elem_size].view(bits_dtype(torch, p.dtype))
         for p in infos]
        for r in range(W)
    ]
    expected_ag = nccl_tide.host_all_gather(L, shards)
    grads = [[g.cuda() for g in gr] for gr in grads_cpu]
    outs = [torch.empty(L.rs_out_numel, dtype=torch.float32, device="cuda") for _ in range(W)]
    send = [t.cuda() for t in send_cpu]
    torch.cuda.synchronize()
    try:
        for _ in range(10):
            world.all_gather(layouts, slots, sendbufs=send)
            world.reduce_scatter(layouts, grads, outs, op="avg", staging=slots)
        world.all_gather(layouts, slots, sendbufs=send)
        world.synchronize()
        for r in range(W):
            assert np.array_equal(as_bits(torch, outs[r]).view(np.uint8), np.asarray(expected[r]).view(np.uint8))
            got = slots[r].cpu().numpy()
            for i, p in enumerate(infos):
                exp = np.ascontiguousarray(expected_ag[r][i]).view(np.uint8)
                assert np.array_equal(got[p.slot_offset : p.slot_offset + exp.size], exp), (r, i)
    finally:
        world.synchronize()
        world.free_slot(slots)

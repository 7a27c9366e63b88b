# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""tideReduceScatter in NCCL's in-place form on loopback worlds (include/tide.h): one parameter of W * shardNumel
elements, each rank's output its own block of its own gradient, output type = gradient type. The result must equal the
host executor's out-of-place result (computed from copies of the inputs before the call) bit for bit on every rank,
and every other block of every gradient must be left as it was. A near miss of the form is refused before anything is
enqueued."""

import numpy as np
import pytest

import nccl_tide
from gpu_util import RS_DTYPES, as_bits, make_layouts, random_float, seeded

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

# (W, ranks per node): one node and virtual nodes (the multi-node pipeline, its final sums and narrowing included)
SPLITS = [(2, 2), (2, 1), (3, 3), (3, 1), (4, 4), (4, 2), (8, 8), (8, 4), (8, 2)]
# chunk bytes of fp32 output: 32 (8 elements, dozens of chunks), 512 (a few), None (the layout default: one)
CHUNKS = [32, 512, None]
OPS = ["sum", "avg", "premul"]


@pytest.mark.parametrize("dt", RS_DTYPES)
@pytest.mark.parametrize("W,rpn", SPLITS)
def test_in_place_reduce_scatter_equals_host_out_of_place(torch_cuda, worlds, W, rpn, dt):
    torch = torch_cuda
    world = worlds(W)
    rng = seeded("rs-in-place", W, rpn, dt)
    for k in range(6):
        chunk, op, slot_staging = CHUNKS[k % 3], OPS[k % 3], k >= 3
        scale = float(rng.uniform(-2.0, 2.0))
        shard = int(rng.integers(1, 500)) | (k % 2)  # odd sizes on odd k
        kw = {} if chunk is None else {"rs_chunk_bytes": chunk}
        layouts = make_layouts([W * shard], [1], [dt], W, rpn, **kw)
        L = layouts[0]
        assert L.rs_out_numel == shard
        grads_cpu = [[random_float(torch, rng, W * shard, dt)] for _ in range(W)]
        before = [[g[0].clone()] for g in grads_cpu]
        expected = nccl_tide.host_reduce_scatter(L, before, out_dtype=dt, op=op, scale=scale)
        grads = [[g[0].cuda()] for g in grads_cpu]
        outs = [grads[r][0][r * shard : (r + 1) * shard] for r in range(W)]
        staging = world.alloc_slot(L.rs_staging_bytes) if slot_staging else None
        torch.cuda.synchronize()
        try:
            world.reduce_scatter(layouts, grads, outs, op=op, scale=scale, staging=staging)
            world.synchronize()
            for r in range(W):
                got = as_bits(torch, outs[r]).view(np.uint8)
                exp = np.ascontiguousarray(expected[r]).view(np.uint8)
                if not np.array_equal(got, exp):
                    bad = np.flatnonzero(got != exp)
                    pytest.fail(
                        f"in-place RS W={W} R={rpn} {dt} {op} scale={scale} chunks={L.rs_num_chunks} "
                        f"staging={'slot' if slot_staging else 'own'}: rank {r}: {bad.size} bytes differ, first at "
                        f"byte {bad[0]} of {got.size}"
                    )
                rest = np.ones(W * shard, bool)
                rest[r * shard : (r + 1) * shard] = False
                now = as_bits(torch, grads[r][0])[rest]
                assert np.array_equal(now, as_bits(torch, before[r][0])[rest]), f"rank {r}: another block changed"
        finally:
            if staging is not None:
                world.synchronize()
                world.free_slot(staging)


@pytest.mark.parametrize("miss", ["one element after", "another block", "another output type"])
def test_in_place_near_miss_is_refused(torch_cuda, worlds, miss):
    torch = torch_cuda
    W, shard, r = 4, 37, 1
    world = worlds(W)
    L = make_layouts([W * shard], [1], ["bf16"], W)[r]
    g = torch.zeros(W * shard, dtype=torch.bfloat16, device="cuda")
    out_dtype = None
    if miss == "one element after":
        out = g[r * shard + 1 : (r + 1) * shard + 1]
    elif miss == "another block":
        out = g[2 * shard : 3 * shard]
    else:
        out = g.view(torch.float16)[r * shard : (r + 1) * shard]
    staging = world.alloc_slot(L.rs_staging_bytes)
    try:
        with pytest.raises(nccl_tide.InvalidArgumentError, match="out overlaps grads"):
            world.rank_reduce_scatter(r, L, [g], out, op="sum", staging=staging[r], out_dtype=out_dtype)
        torch.cuda.synchronize()
        assert not bool(g.view(torch.int16).any()), "a refused call wrote"
    finally:
        world.synchronize()
        world.free_slot(staging)

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host reduce-scatter in NCCL's in-place form (include/tide.h, tideHostReduceScatter): one parameter with rowNumel 1
and numel = W * shardNumel, the output of the gradient's type, rank r's output exactly block r of its own gradient.

The oracle is computed before the call from copies of the inputs: the host executor out of place and the documented
accumulation order in numpy (nccl_tide.reference). The in-place call must equal both bit for bit on every rank, leave
every other block of every gradient as it was, and every near miss of the form must be refused before anything is
written (the overlap message of every other overlap).
"""

import numpy as np
import pytest
from nccl_tide import InvalidArgumentError, Layout, host_reduce_scatter
from nccl_tide import reference as ref
from nccl_tide.data import random_values
from nccl_tide.dtypes import dtype as to_dtype

# (W, ranks per node): every node split of W = 2, 3, 4, 8 and a 6-rank world of 3 nodes
SPLITS = [(2, 2), (2, 1), (3, 3), (3, 1), (4, 4), (4, 2), (4, 1), (6, 2), (8, 8), (8, 4), (8, 2), (8, 1)]
OPS = ["sum", "avg", "premul"]


def bits(a):
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.itemsize])


def random_grads(rng, world, dt, numel):
    return [[random_values(rng, dt, numel)] for _ in range(world)]


@pytest.mark.parametrize("world,rpn", SPLITS)
@pytest.mark.parametrize("dt", ["bf16", "fp16", "fp32"])
def test_in_place_equals_out_of_place_bit_for_bit(world, rpn, dt, rng):
    for trial in range(4):
        op = OPS[trial % 3]
        scale = float(rng.uniform(-2.0, 2.0))
        shard = int(rng.integers(1, 400)) | (trial % 2)  # odd sizes on odd trials
        numel = world * shard
        with Layout([numel], dt, world, rpn) as lay:
            assert lay.params[0].shard_numel == shard and lay.rs_out_numel == shard
            grads = random_grads(rng, world, dt, numel)
            before = [g[0].copy() for g in grads]
            want = host_reduce_scatter(lay, [[b] for b in before], dt, op, scale)
            doc = ref.rs_reference([[b] for b in before], [numel], [1], [dt], rpn, dt, op, scale)
            # Every rank in place, and a mix (odd ranks out of place) on odd trials.
            outs = [
                grads[r][0][r * shard : (r + 1) * shard]
                if trial % 2 == 0 or r % 2 == 0
                else np.zeros(shard, to_dtype(dt).storage)
                for r in range(world)
            ]
            got = host_reduce_scatter(lay, grads, dt, op, scale, outs=outs)
            for r in range(world):
                np.testing.assert_array_equal(bits(got[r]), bits(want[r]), err_msg=f"rank {r} {op} trial {trial}")
                np.testing.assert_array_equal(bits(got[r]), bits(doc[r]), err_msg=f"rank {r} {op} (reference)")
                rest = np.ones(numel, bool)
                if trial % 2 == 0 or r % 2 == 0:
                    rest[r * shard : (r + 1) * shard] = False
                    # the output is the gradient's block itself, not a copy
                    np.testing.assert_array_equal(bits(grads[r][0][r * shard : (r + 1) * shard]), bits(want[r]))
                np.testing.assert_array_equal(bits(grads[r][0][rest]), bits(before[r][rest]), err_msg=f"rank {r}")


def test_in_place_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    world, shard = 4, 77
    with Layout([world * shard], "bf16", world, 2) as lay:
        grads = random_grads(rng, world, "bf16", world * shard)
        want = host_reduce_scatter(lay, [[g[0].copy()] for g in grads], "bf16", "avg")
        tg = [torch.from_numpy(g[0].copy()).view(torch.bfloat16) for g in grads]
        host_reduce_scatter(lay, [[t] for t in tg], "bf16", "avg", outs=[tg[r][r * shard : (r + 1) * shard]
                                                                         for r in range(world)])
        for r in range(world):
            got = tg[r][r * shard : (r + 1) * shard].view(torch.int16).numpy().view(np.uint16)
            np.testing.assert_array_equal(got, bits(want[r]), err_msg=f"rank {r}")


def _refused(lay, grads, outs, out_dtype):
    """The call must fail with the overlap message and write nothing (gradients and outputs as they were)."""
    gb = [[bits(x).copy() for x in row] for row in grads]
    ob = [bits(o).copy() for o in outs]
    with pytest.raises(InvalidArgumentError, match="overlapping buffers"):
        host_reduce_scatter(lay, grads, out_dtype, "sum", outs=outs)
    for row, want in zip(grads, gb):
        for x, w in zip(row, want):
            np.testing.assert_array_equal(bits(x), w)
    for o, w in zip(outs, ob):
        np.testing.assert_array_equal(bits(o), w)


NEAR_MISSES = ["one element after", "one element before", "another block", "another rank's gradient",
               "aliased gradients", "padded", "rows of 2", "two parameters", "another output type"]


@pytest.mark.parametrize("miss", NEAR_MISSES)
def test_in_place_near_misses_are_refused(miss, rng):
    world, shard, dt = 4, 37, "bf16"
    numel, rows, numels = world * shard, [1], None
    if miss == "padded":
        numel -= 1  # shard stays 37, the last block is padded: not W * shardNumel
    numels = [numel]
    if miss == "rows of 2":
        numels, rows = [2 * numel], [2]  # numel = W * shardNumel still, but in rows
    if miss == "two parameters":
        numels, rows = [numel, 8], [1, 1]
    with Layout(numels, dt, world, 2, row_numels=rows) as lay:
        n0, s0, out_numel = lay.params[0].numel, lay.params[0].shard_numel, lay.rs_out_numel
        grads = [[random_values(rng, dt, p.numel) for p in lay.params] for _ in range(world)]
        outs = [np.zeros(out_numel, np.uint16) for _ in range(world)]
        r, g = 1, grads[1][0]
        out_dt = dt
        if miss == "one element after":
            outs[r] = g[r * s0 + 1 : r * s0 + 1 + out_numel]
        elif miss == "one element before":
            outs[r] = g[r * s0 - 1 : r * s0 - 1 + out_numel]
        elif miss == "another block":
            outs[r] = g[2 * s0 : 3 * s0]
        elif miss == "another rank's gradient":
            outs[r] = grads[2][0][r * s0 : (r + 1) * s0]  # block 1, but of rank 2's gradient
        elif miss == "aliased gradients":
            grads[2][0] = g  # rank 2 reads the gradient whose block 1 is rank 1's output
            outs[r] = g[r * s0 : (r + 1) * s0]
        elif miss == "another output type":
            out_dt = "fp16"
            outs = [np.zeros(out_numel, np.float16) for _ in range(world)]
            outs[r] = g.view(np.float16)[r * s0 : (r + 1) * s0]
        else:  # padded, rows of 2, two parameters: the own block at its place, but not the in-place layout
            assert out_numel <= n0 - r * s0
            outs[r] = g[r * s0 : r * s0 + out_numel]
        assert outs[r].size == out_numel
        _refused(lay, grads, outs, out_dt)


def test_exact_form_accepted_where_each_near_miss_is_refused(rng):
    """The control of the near misses: the same layout, rank and buffers with the output exactly at block 1."""
    world, shard = 4, 37
    with Layout([world * shard], "bf16", world, 2) as lay:
        grads = random_grads(rng, world, "bf16", world * shard)
        want = host_reduce_scatter(lay, [[g[0].copy()] for g in grads], "bf16", "sum")
        outs = [np.zeros(shard, np.uint16) for _ in range(world)]
        outs[1] = grads[1][0][shard : 2 * shard]
        host_reduce_scatter(lay, grads, "bf16", "sum", outs=outs)
        for r in range(world):
            np.testing.assert_array_equal(bits(outs[r]), bits(want[r]))

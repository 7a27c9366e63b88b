# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host executor: AG byte-exact, RS bit-exact to the documented order and close to fp64."""

import numpy as np
import pytest
from nccl_tide import Layout, host_all_gather, host_reduce_scatter
from nccl_tide import reference as ref
from nccl_tide.data import random_values
from nccl_tide.dtypes import dtype as to_dtype
from tide_ref import ALL_DTYPES

RS_IN = ["bf16", "fp16", "fp32"]
CASES = [(1, 1), (2, 2), (3, 1), (4, 2), (6, 3), (8, 8), (8, 2), (12, 4), (16, 8), (24, 8)]


def small_group(rng, world, dtypes_pool, n_max=6):
    n = int(rng.integers(1, n_max + 1))
    numels, rows = [], []
    for _ in range(n):
        kind = rng.integers(0, 4)
        if kind == 0:
            numels.append(1), rows.append(1)
        elif kind == 1:
            numels.append(int(rng.integers(1, world + 1))), rows.append(1)
        elif kind == 2:
            r = int(rng.integers(1, 50))
            numels.append(r * int(rng.integers(1, 3 * world + 2))), rows.append(r)
        else:
            numels.append(int(rng.integers(world, 2000))), rows.append(1)
    dtypes = [str(rng.choice(dtypes_pool)) for _ in range(n)]
    return numels, rows, dtypes


def bits(a):
    return np.asarray(a).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[np.asarray(a).itemsize])


@pytest.mark.parametrize("world,rpn", CASES)
def test_all_gather_byte_exact(world, rpn, rng):
    for _trial in range(3):
        numels, rows, dtypes = small_group(rng, world, ALL_DTYPES)
        with Layout(numels, dtypes, world, rpn, row_numels=rows) as lay:
            shards = [[random_values(rng, p.dtype, p.shard_numel) for p in lay.params] for _ in range(world)]
            params = host_all_gather(lay, shards)
            for i, p in enumerate(lay.params):
                # Placement by slicing, independent of the executor: rank s's shard at s * shard.
                want = np.empty(p.shard_numel * world, dtype=to_dtype(p.dtype).storage)
                for s in range(world):
                    want[s * p.shard_numel : (s + 1) * p.shard_numel] = shards[s][i]
                for r in range(world):
                    np.testing.assert_array_equal(bits(params[r][i]), bits(want), err_msg=f"rank {r} param {i}")


def test_all_gather_every_dtype_and_torch_inputs(rng):
    torch = pytest.importorskip("torch")
    world = 4
    for dt in ALL_DTYPES:
        with Layout([37, 128 * 3, 5], dt, world, 2, row_numels=[1, 3, 1]) as lay:
            shards = [[random_values(rng, dt, p.shard_numel) for p in lay.params] for _ in range(world)]
            tshards = [[torch.from_numpy(np.ascontiguousarray(x)) for x in rank] for rank in shards]
            out_np = host_all_gather(lay, shards)
            out_t = host_all_gather(lay, tshards)
            for r in range(world):
                for i in range(3):
                    np.testing.assert_array_equal(bits(out_np[r][i]), bits(out_t[r][i]))
                    np.testing.assert_array_equal(
                        bits(out_np[r][i]), bits(ref.all_gather_param([s[i] for s in shards]))
                    )


def test_all_gather_into_torch_bf16_outputs(rng):
    torch = pytest.importorskip("torch")
    world = 3
    with Layout([10, 7], "bf16", world) as lay:
        shards = [[torch.randn(p.shard_numel).bfloat16() + 3 for p in lay.params] for _ in range(world)]
        outs = [
            [torch.full((p.shard_numel * world,), float("nan"), dtype=torch.bfloat16) for p in lay.params]
            for _ in range(world)
        ]
        host_all_gather(lay, shards, outs)
        for r in range(world):
            for i in range(2):
                assert torch.equal(outs[r][i], torch.cat([shards[s][i] for s in range(world)]))


def run_rs(rng, world, rpn, gdtypes, out_dtype, op, scale):
    numels, rows, _ = small_group(rng, world, RS_IN)
    dtypes = [gdtypes[i % len(gdtypes)] for i in range(len(numels))]
    with Layout(numels, dtypes, world, rpn, row_numels=rows) as lay:
        grads = [[random_values(rng, d, n) for d, n in zip(dtypes, numels)] for _ in range(world)]
        outs = host_reduce_scatter(lay, grads, out_dtype, op, scale)
        want = ref.rs_reference(grads, numels, rows, dtypes, rpn, out_dtype, op, scale)
        return lay, grads, numels, rows, dtypes, outs, want


@pytest.mark.parametrize("world,rpn", CASES)
@pytest.mark.parametrize("op", ["sum", "avg", "premul"])
@pytest.mark.parametrize("out_dtype", ["fp32", "bf16", "fp16"])
def test_reduce_scatter_bit_exact(world, rpn, op, out_dtype, rng):
    for gdtypes in (["bf16"], ["fp16"], ["fp32"], ["bf16", "fp32", "fp16"]):
        scale = float(rng.choice([0.3, -1.7, 1 / 3]))
        *_, outs, want = run_rs(rng, world, rpn, gdtypes, out_dtype, op, scale)
        for r in range(world):
            np.testing.assert_array_equal(bits(outs[r]), bits(want[r]), err_msg=f"rank {r} {gdtypes} {op} {scale}")


@pytest.mark.parametrize("world,rpn", [(2, 1), (8, 4), (24, 8), (48, 6), (64, 8)])
@pytest.mark.parametrize("op", ["sum", "avg", "premul"])
def test_reduce_scatter_close_to_fp64(world, rpn, op, rng):
    scale = 0.3
    lay, grads, numels, rows, dtypes, outs, _ = run_rs(rng, world, rpn, ["bf16", "fp32"], "fp32", op, scale)
    exact = ref.rs_reference_f64(grads, numels, rows, dtypes, op, scale)
    # |x| < 2^5 for the generated inputs; an fp32 fold of W terms errs by < W * 2^-24 * sum|x|.
    bound = (world + 2) * 2.0**-24 * world * 32 * (abs(scale) if op == "premul" else 1) / (world if op == "avg" else 1)
    for r in range(world):
        np.testing.assert_allclose(outs[r].astype(np.float64), exact[r], rtol=0, atol=bound)


def test_reduce_scatter_order_matters_and_is_the_documented_one():
    """Values chosen so that a different fold order gives a different fp32 result."""
    world, rpn = 4, 2
    big, tiny = np.float32(2.0**24), np.float32(1.0)
    # node 0: big + 1 -> 2^24 (1 lost); node 1: 1 + (-big) -> -2^24 + 1; total -> 0.0 + ... documented: 1.0
    vals = [big, tiny, tiny, -big]
    with Layout([world], "fp32", world, rpn) as lay:
        grads = [[np.full(world, v, dtype=np.float32)] for v in vals]
        outs = host_reduce_scatter(lay, grads, "fp32", "sum")
        want = ref.rs_reference(grads, [world], [1], ["fp32"], rpn)
        for r in range(world):
            np.testing.assert_array_equal(outs[r], want[r])
        # (2^24 + 1) rounds to 2^24; (1 + -2^24) = -16777215 exactly; their sum is 1.0.
        assert outs[0][0] == np.float32(1.0)


def test_reduce_scatter_torch_inputs_and_outputs(rng):
    torch = pytest.importorskip("torch")
    world = 4
    numels = [300, 17]
    with Layout(numels, ["bf16", "fp32"], world, 2) as lay:
        gt = [[torch.randn(300).bfloat16(), torch.randn(17)] for _ in range(world)]
        outs = [torch.full((lay.rs_out_numel,), float("nan")) for _ in range(world)]
        host_reduce_scatter(lay, gt, "fp32", "avg", outs=outs)
        gn = [[g[0].view(torch.int16).numpy().view(np.uint16), g[1].numpy()] for g in gt]
        want = ref.rs_reference(gn, numels, [1, 1], ["bf16", "fp32"], 2, "fp32", "avg")
        for r in range(world):
            np.testing.assert_array_equal(outs[r].numpy().view(np.uint32), want[r].view(np.uint32))


def test_padding_of_premul_with_negative_scale(rng):
    """Padding elements are 0.0f * scale: -0.0 for a negative scale (bit-exact contract)."""
    world = 4
    with Layout([5], "fp32", world, 4) as lay:  # shard 2: rank 2 holds element 4 and one pad
        grads = [[random_values(rng, "fp32", 5)] for _ in range(world)]
        outs = host_reduce_scatter(lay, grads, "fp32", "premul", -2.0)
        want = ref.rs_reference(grads, [5], [1], ["fp32"], 4, "fp32", "premul", -2.0)
        for r in range(world):
            np.testing.assert_array_equal(outs[r].view(np.uint32), want[r].view(np.uint32))
        assert want[3].view(np.uint32)[0] == 0x80000000

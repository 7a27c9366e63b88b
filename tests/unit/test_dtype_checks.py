# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Buffers whose element type is not the layout's (or out_dtype's) are refused, not reinterpreted.

Checking only the element size would read a same-size type of another kind as the layout's type and give silently
wrong results (float16 gradients summed as bf16 give 0.015625 instead of 2.0).
"""

import numpy as np
import pytest
import torch

from nccl_tide import InvalidArgumentError, Layout, host_all_gather, host_reduce_scatter
from nccl_tide._tensor_args import check as _ptr

W = 2


@pytest.fixture
def bf16():
    with Layout([8], "bf16", W) as layout:
        yield layout


@pytest.fixture
def fp32():
    with Layout([8], "fp32", W) as layout:
        yield layout


def test_float16_grads_for_a_bf16_layout_are_refused(bf16):
    with pytest.raises(InvalidArgumentError, match=r"grads\[0\]\[0\]: float16 elements.*bf16"):
        host_reduce_scatter(bf16, [[torch.ones(8, dtype=torch.float16)]] * W)


def test_int32_grads_for_an_fp32_layout_are_refused(fp32):
    with pytest.raises(InvalidArgumentError, match="int32 elements"):
        host_reduce_scatter(fp32, [[np.ones(8, np.int32)]] * W)
    with pytest.raises(InvalidArgumentError, match="int32 elements"):
        host_reduce_scatter(fp32, [[torch.ones(8, dtype=torch.int32)]] * W)


def test_big_endian_arrays_are_refused(fp32, rng):
    grads = [[rng.standard_normal(8).astype(">f4")] for _ in range(W)]
    with pytest.raises(InvalidArgumentError, match="byte order"):
        host_reduce_scatter(fp32, grads)
    shards = [[rng.standard_normal(4).astype(">f4")] for _ in range(W)]
    with pytest.raises(InvalidArgumentError, match="byte order"):
        host_all_gather(fp32, shards)


@pytest.mark.parametrize(
    "out_dtype, make",
    [("fp32", lambda: np.zeros(4, np.int32)), ("fp32", lambda: torch.zeros(4, dtype=torch.int32)),
     ("fp16", lambda: torch.zeros(4, dtype=torch.bfloat16)), ("fp16", lambda: np.zeros(4, np.int16)),
     ("bf16", lambda: torch.zeros(4, dtype=torch.float16))],
)
def test_outputs_of_another_type_than_out_dtype_are_refused(fp32, rng, out_dtype, make):
    grads = [[rng.standard_normal(8).astype(np.float32)] for _ in range(W)]
    outs = [make() for _ in range(W)]
    with pytest.raises(InvalidArgumentError, match=r"outs\[0\]: \w+ elements"):
        host_reduce_scatter(fp32, grads, out_dtype=out_dtype, outs=outs)
    assert not any(torch.as_tensor(o).any() for o in outs)  # nothing written


def test_float16_shards_are_not_gathered_into_bf16_params(bf16):
    shards = [[torch.ones(4, dtype=torch.float16)] for _ in range(W)]
    with pytest.raises(InvalidArgumentError, match=r"shards\[0\]\[0\]: float16"):
        host_all_gather(bf16, shards)
    good = [[torch.ones(4, dtype=torch.bfloat16)] for _ in range(W)]
    params = [[torch.zeros(8, dtype=torch.float16)] for _ in range(W)]
    with pytest.raises(InvalidArgumentError, match=r"params\[0\]\[0\]: float16"):
        host_all_gather(bf16, good, params)


def test_matching_types_and_bit_storage_are_accepted(bf16, rng):
    # bf16 as torch.bfloat16 or as its uint16 bits (numpy has no bf16); results equal either way.
    vals = torch.from_numpy(rng.standard_normal(8).astype(np.float32)).to(torch.bfloat16)
    as_torch = host_reduce_scatter(bf16, [[vals]] * W)
    as_bits = host_reduce_scatter(bf16, [[vals.view(torch.int16).numpy().view(np.uint16)]] * W)
    for a, b in zip(as_torch, as_bits):
        assert np.array_equal(a, b)
    expect = (vals.float() * W).numpy()
    got = np.concatenate([o for o in as_torch])
    assert np.array_equal(got, expect)


def test_cuda_path_checks_the_element_type_before_the_device():
    # The CUDA wrappers' tensor check: the type is refused whatever the device (no GPU needed to see it).
    with pytest.raises(InvalidArgumentError, match=r"grads\[0\]: float16 elements.*bf16"):
        _ptr(torch.ones(8, dtype=torch.float16), "grads[0]", 16, dtype="bf16")
    with pytest.raises(InvalidArgumentError, match=r"out: int32 elements.*fp32"):
        _ptr(torch.ones(8, dtype=torch.int32), "out", 32, dtype="fp32")


def test_float_types_as_unsigned_bits_are_accepted(fp32, rng):
    grads = [[rng.standard_normal(8).astype(np.float32)] for _ in range(W)]
    as_bits = [[g[0].view(np.uint32)] for g in grads]
    for a, b in zip(host_reduce_scatter(fp32, grads), host_reduce_scatter(fp32, as_bits)):
        assert np.array_equal(a, b)

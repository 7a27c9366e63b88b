# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The host reduce-scatter computes in IEEE fp32 with subnormals and round-to-nearest whatever floating-point mode
the calling thread has set (torch.set_flush_denormal(True) sets flush-to-zero and denormals-are-zero on x86).

The oracle uses no floating-point arithmetic at all: inputs are k * 2^-149 (the fp32 subnormal with integer bits k),
so the exact sum of a column is (sum of k) * 2^-149, whose fp32 bits are that integer (and the sign bit).
"""

import platform

import numpy as np
import pytest
import torch

from nccl_tide import Layout, host_reduce_scatter

W, NUMEL = 4, 64


def subnormals(ks: np.ndarray) -> np.ndarray:
    """fp32 values k * 2^-149 built from their bits (sign-magnitude), no arithmetic."""
    bits = np.abs(ks).astype(np.uint32) | np.where(ks < 0, np.uint32(1 << 31), np.uint32(0))
    return bits.view(np.float32)


@pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"), reason="flush-to-zero is set on x86 and arm64"
)
def test_subnormal_sums_are_exact_under_the_callers_flush_to_zero(rng):
    ks = rng.integers(-(1 << 18), 1 << 18, size=(W, NUMEL))
    ks[:, 0] = 1  # a column whose every input and whose sum are subnormal and positive
    grads = [[subnormals(ks[r])] for r in range(W)]
    expected_bits = subnormals(ks.sum(axis=0)).view(np.uint32)  # |sum| < 2^20: still subnormal, exact
    tiny = np.array([2.0**-149], np.float32)
    with Layout([NUMEL], "fp32", W, ranks_per_node=2) as layout:
        assert torch.set_flush_denormal(True)
        try:
            assert (tiny * np.float32(1.0))[0] == 0  # the mode is on in this thread: numpy itself flushes
            outs = host_reduce_scatter(layout, grads)
            still_on = (tiny * np.float32(1.0))[0] == 0
        finally:
            torch.set_flush_denormal(False)
    got = np.concatenate([o.view(np.uint32) for o in outs])
    assert np.array_equal(got, expected_bits), np.flatnonzero(got != expected_bits)[:8]
    assert still_on, "the call did not restore the caller's floating-point mode"


# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Flat all-gather and reduce-scatter through torch.distributed, in the spelling the running torch prefers.

torch 2.13 renamed `all_gather_into_tensor` / `reduce_scatter_tensor` to `all_gather_single` /
`reduce_scatter_single` and warns (FutureWarning) on every call of the old names; older releases have only the old
names. Callers use these two functions and never see the warning, on any supported torch.
"""

import torch.distributed as dist

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_gather_flat(output, input, group=None, async_op=False):
    """output = every rank's `input`, rank-major (output.numel() == world * input.numel())."""
    return _all_gather(output, input, group=group, async_op=async_op)


def reduce_scatter_flat(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """output = this rank's block of the reduction of every rank's `input` (input.numel() == world * output.numel())."""
    return _reduce_scatter(output, input, op=op, group=group, async_op=async_op)

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Independent numpy reference of the results defined at the top of include/tide.h.

Nothing here calls the C library: it is the oracle tide-perf -c and the tests check
the executors against. All fp32 arithmetic is numpy float32 (IEEE, individually
rounded, no FMA), folded in exactly the documented order.
"""

from collections.abc import Sequence
from typing import List

import numpy as np

from .dtypes import DType
from .dtypes import dtype as to_dtype


def shard_numel(numel: int, row_numel: int, world: int) -> int:
    rows = numel // row_numel
    return -(-rows // world) * row_numel


# -- conversions ---------------------------------------------------------------------------


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


# The NaN every executor writes for a NaN result (include/tide.h "NaN results": TIDE_CANONICAL_NAN_*).
CANONICAL_NAN_F32 = 0x7FC00000
CANONICAL_NAN_BF16 = 0x7FC0
CANONICAL_NAN_FP16 = 0x7E00


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round to nearest even; every NaN becomes the canonical NaN 0x7fc0."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    if nan.any():
        rounded[nan] = np.uint16(CANONICAL_NAN_BF16)
    return rounded


def to_f32(x: np.ndarray, dt) -> np.ndarray:
    """Exact conversion of bf16 (uint16 bits), fp16 or fp32 storage to fp32."""
    dt = to_dtype(dt)
    if dt.name == "bf16":
        return bf16_bits_to_f32(np.asarray(x).view(np.uint16))
    if dt.name == "fp16":
        return np.asarray(x).view(np.float16).astype(np.float32)
    if dt.name == "fp32":
        return np.asarray(x).view(np.float32).astype(np.float32, copy=True)
    raise ValueError(f"reduce-scatter reference: {dt.name} is not bf16/fp16/fp32")


def from_f32(x: np.ndarray, dt) -> np.ndarray:
    """fp32 -> storage of dt, rounding to nearest even; NaN becomes the type's canonical NaN."""
    dt = to_dtype(dt)
    if dt.name == "bf16":
        return f32_to_bf16_bits(x)
    nan = np.isnan(x)
    if dt.name == "fp16":
        out = x.astype(np.float16)
        if nan.any():
            out.view(np.uint16)[nan] = np.uint16(CANONICAL_NAN_FP16)
        return out
    if dt.name == "fp32":
        out = x.astype(np.float32, copy=nan.any())
        if nan.any():
            out.view(np.uint32)[nan] = np.uint32(CANONICAL_NAN_F32)
        return out
    raise ValueError(f"reduce-scatter output {dt.name} is not bf16/fp16/fp32")


# -- all-gather ----------------------------------------------------------------------------


def all_gather_param(shards_of_param: Sequence[np.ndarray]) -> np.ndarray:
    """Unsharded storage of one parameter: rank s's shard at [s * shard, (s + 1) * shard)."""
    return np.concatenate([np.asarray(s).reshape(-1) for s in shards_of_param])


# -- reduce-scatter ------------------------------------------------------------------------


def rs_param_shard_f32(
    grads_of_param: Sequence[np.ndarray],
    numel: int,
    row_numel: int,
    grad_dtype,
    rank: int,
    ranks_per_node: int,
    op: str = "sum",
    scale: float = 1.0,
) -> np.ndarray:
    """fp32 `total` of tide.h for output rank `rank` and one parameter.

    grads_of_param[s] is source rank s's full gradient (numel elements).
    """
    world = len(grads_of_param)
    shard = shard_numel(numel, row_numel, world)
    lo = rank * shard
    valid = max(0, min(numel - lo, shard))
    f_scale = np.float32(scale)

    def x(s: int) -> np.ndarray:
        v = np.zeros(shard, dtype=np.float32)  # padding elements are 0.0f before scaling
        if valid:
            v[:valid] = to_f32(np.asarray(grads_of_param[s]).reshape(-1)[lo : lo + valid], grad_dtype)
        if op == "premul":
            v = v * f_scale  # fp32 * fp32 -> fp32, one rounding
        return v

    n_nodes = world // ranks_per_node
    total = None
    for m in range(n_nodes):
        partial = x(m * ranks_per_node)
        for s in range(m * ranks_per_node + 1, (m + 1) * ranks_per_node):
            partial = partial + x(s)
        total = partial if total is None else total + partial
    if op == "avg":
        total = total / np.float32(world)
    return total


def rs_reference(
    grads: Sequence[Sequence[np.ndarray]],
    numels: Sequence[int],
    row_numels: Sequence[int],
    dtypes: Sequence,
    ranks_per_node: int,
    out_dtype="fp32",
    op: str = "sum",
    scale: float = 1.0,
) -> List[np.ndarray]:
    """Packed RS output of every rank (param-major, no gaps), in out_dtype storage."""
    world = len(grads)
    odt: DType = to_dtype(out_dtype)
    outs = []
    for r in range(world):
        pieces = []
        for i, n in enumerate(numels):
            total = rs_param_shard_f32(
                [grads[s][i] for s in range(world)], n, row_numels[i], dtypes[i], r, ranks_per_node, op, scale
            )
            pieces.append(from_f32(total, odt))
        outs.append(np.concatenate(pieces) if pieces else np.empty(0, odt.storage))
    return outs


def rs_reference_f64(grads, numels, row_numels, dtypes, op="sum", scale=1.0) -> List[np.ndarray]:
    """Same result computed in fp64 (order-free), for tolerance checks."""
    world = len(grads)
    outs = []
    for r in range(world):
        pieces = []
        for i, n in enumerate(numels):
            shard = shard_numel(n, row_numels[i], world)
            lo, valid = r * shard, max(0, min(n - r * shard, shard))
            acc = np.zeros(shard, dtype=np.float64)
            for s in range(world):
                v = np.zeros(shard, dtype=np.float64)
                v[:valid] = to_f32(np.asarray(grads[s][i]).reshape(-1)[lo : lo + valid], dtypes[i])
                acc += v * (float(np.float32(scale)) if op == "premul" else 1.0)
            pieces.append(acc / world if op == "avg" else acc)
        outs.append(np.concatenate(pieces))
    return outs

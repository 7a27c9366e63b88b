# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Helpers for the GPU tests: seeded generators, random layouts and data, poisoned outputs, host-executor oracles."""

import zlib

import numpy as np

import nccl_tide

ALL_DTYPES = ["bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "int8", "int32"]
RS_DTYPES = ["bf16", "fp16", "fp32"]
POISON = 0xFF


def seeded(*key):
    """A generator drawn from `key` (a test's name and parameters): the same draws on every run, others for another
    key."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def int_dtype(torch, size):
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]


def bits_dtype(torch, name):
    """The integer type that holds the bits of TIDE dtype `name` and that TIDE accepts for it (tide.h: a float's
    unsigned integers of its size; signed ones are refused, int32 being a TIDE type of its own)."""
    return {"bf16": torch.uint16, "fp16": torch.uint16, "fp32": torch.uint32, "fp8_e4m3": torch.uint8,
            "fp8_e5m2": torch.uint8, "int8": torch.int8, "int32": torch.int32}[name]


def torch_float(torch, name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def random_layout_spec(rng, world, dtypes, max_params=6, max_rows=300, allow_rows=True):
    """numels, row_numels, dtypes (one per param): odd sizes, some smaller than the world (heavy padding)."""
    n = int(rng.integers(1, max_params + 1))
    numels, rows_n, dts = [], [], []
    for _ in range(n):
        if allow_rows and rng.random() < 0.5:
            row = int(rng.choice([1, 3, 8, 17, 64]))
            rows = int(rng.integers(1, max_rows))
        else:
            row = 1
            rows = int(rng.choice([1, 2, world - 1 or 1, int(rng.integers(1, 20000))]))
        numels.append(rows * row)
        rows_n.append(row)
        dts.append(dtypes[int(rng.integers(0, len(dtypes)))])
    return numels, rows_n, dts


def make_layouts(numels, rows, dts, world, rpn=None, **kw):
    """One layout per rank; rpn = ranks per node (default: the whole world is one node; rpn < world: virtual nodes)."""
    rpn = world if rpn is None else rpn
    return [
        nccl_tide.Layout(numels, dts, world, ranks_per_node=rpn, rank=r, row_numels=rows, **kw) for r in range(world)
    ]


def random_bytes(torch, rng, nbytes, device="cpu"):
    data = rng.integers(0, 256, size=max(nbytes, 1), dtype=np.uint8)[:nbytes]
    return torch.from_numpy(data.copy()).to(device)


def random_float(torch, rng, numel, name):
    """Random non-zero values in dtype `name` (CPU tensor), spanning a few binades, both signs."""
    x = rng.standard_normal(numel).astype(np.float32) * np.float32(2.0) ** rng.integers(-4, 5, size=numel).astype(np.float32)
    x[x == 0] = 1.0
    return torch.from_numpy(x).to(torch_float(torch, name))


def as_bits(torch, t):
    """Bit pattern of a tensor as a numpy integer array (exact comparison, NaN-safe)."""
    t = t.detach().cpu().contiguous()
    return t.view(int_dtype(torch, t.element_size())).numpy()

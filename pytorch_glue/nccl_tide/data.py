# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Deterministic random inputs that are never zero and never equal the 0xFF poison.

Floats get a narrow exponent range so sums stay finite and exercise rounding; bf16
and fp8 are produced directly as bit patterns (fast, and numpy has no such dtypes).
"""

import numpy as np

from .dtypes import dtype as to_dtype


def random_values(rng: np.random.Generator, dt, n: int) -> np.ndarray:
    dt = to_dtype(dt)
    if dt.name == "bf16":  # sign | exponent 124..131 | 7-bit mantissa
        r = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        return (r & np.uint16(0x807F)) | ((np.uint16(124) + ((r >> np.uint16(7)) & np.uint16(7))) << np.uint16(7))
    if dt.name == "fp16":  # sign | exponent 12..19 | 10-bit mantissa
        r = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
        bits = (r & np.uint16(0x83FF)) | ((np.uint16(12) + ((r >> np.uint16(10)) & np.uint16(7))) << np.uint16(10))
        return bits.view(np.float16)
    if dt.name == "fp32":  # exponent 123..130, full mantissa
        r = rng.integers(0, 1 << 32, size=n, dtype=np.uint32)
        exp = np.uint32(123) + ((r >> np.uint32(23)) & np.uint32(7))
        return ((r & np.uint32(0x807FFFFF)) | (exp << np.uint32(23))).view(np.float32)
    if dt.name == "fp8_e4m3":  # sign | exponent 3..10 | 3-bit mantissa (never the 0x7F/0xFF NaN)
        r = rng.integers(0, 256, size=n, dtype=np.uint8)
        return (r & np.uint8(0x87)) | ((np.uint8(3) + ((r >> np.uint8(3)) & np.uint8(7))) << np.uint8(3))
    if dt.name == "fp8_e5m2":  # sign | exponent 12..19 | 2-bit mantissa
        r = rng.integers(0, 256, size=n, dtype=np.uint8)
        return (r & np.uint8(0x83)) | ((np.uint8(12) + ((r >> np.uint8(2)) & np.uint8(7))) << np.uint8(2))
    if dt.name == "int8":
        return rng.integers(1, 127, size=n, dtype=np.int8)
    if dt.name == "int32":
        return rng.integers(1, 1 << 30, size=n, dtype=np.int32)
    raise ValueError(dt.name)


def rank_rng(seed: int, rank: int) -> np.random.Generator:
    return np.random.default_rng([seed, rank])

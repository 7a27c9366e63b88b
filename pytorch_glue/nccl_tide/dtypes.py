# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Data type and reduction-op names <-> tide.h enums, and their numpy storage types.

numpy has no bf16 or fp8, so those travel as bit patterns: bf16 as uint16, fp8 as uint8.
"""

import ctypes
import math
from typing import NamedTuple

import numpy as np

from . import _native as N
from .errors import InvalidArgumentError


class DType(NamedTuple):
    name: str  # canonical short name
    code: int  # tideDataType_t
    size: int  # bytes per element
    storage: type  # numpy dtype holding the bits
    nccl_tests_name: str  # name nccl-tests prints in its table


DTYPES = {
    "bf16": DType("bf16", N.tideBfloat16, 2, np.uint16, "bfloat16"),
    "fp16": DType("fp16", N.tideFloat16, 2, np.float16, "half"),
    "fp32": DType("fp32", N.tideFloat32, 4, np.float32, "float"),
    "fp8_e4m3": DType("fp8_e4m3", N.tideFloat8e4m3, 1, np.uint8, "f8e4m3"),
    "fp8_e5m2": DType("fp8_e5m2", N.tideFloat8e5m2, 1, np.uint8, "f8e5m2"),
    "int8": DType("int8", N.tideInt8, 1, np.int8, "int8"),
    "int32": DType("int32", N.tideInt32, 4, np.int32, "int32"),
}
BY_CODE = {d.code: d for d in DTYPES.values()}

# Aliases accepted on input (nccl-tests and torch spellings).
ALIASES = {
    "bfloat16": "bf16",
    "half": "fp16",
    "float16": "fp16",
    "float": "fp32",
    "float32": "fp32",
    "f8e4m3": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "f8e5m2": "fp8_e5m2",
    "float8_e5m2": "fp8_e5m2",
    "e5m2": "fp8_e5m2",
}

# Reduce-scatter accepts these gradient and output types (tide.h).
RS_TYPES = ("bf16", "fp16", "fp32")

# Element types (numpy dtype or torch dtype names) a buffer of each type may have: the type itself, or for a
# floating-point type the unsigned integers of its size, which hold its bits (numpy has no bf16 or fp8, and bit-exact
# code handles the others as bits too). The element size alone is not enough: float16 read as bf16, or int32 as
# fp32, is a silently wrong result.
ELEMENT_TYPES = {
    "bf16": ("bfloat16", "uint16"),
    "fp16": ("float16", "uint16"),
    "fp32": ("float32", "uint32"),
    "fp8_e4m3": ("float8_e4m3fn", "uint8"),
    "fp8_e5m2": ("float8_e5m2", "uint8"),
    "int8": ("int8",),
    "int32": ("int32",),
}


def check_element_type(x, dt: DType, what: str) -> None:
    """Raises InvalidArgumentError unless numpy array or torch tensor x holds elements of type dt, in this machine's
    byte order."""
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:
            raise InvalidArgumentError(
                f"{what}: byte order of {x.dtype.str} is not this machine's; convert it first "
                "(x.astype(x.dtype.newbyteorder('=')))"
            )
        name = x.dtype.name
    else:
        name = str(x.dtype).replace("torch.", "")
    if name not in ELEMENT_TYPES[dt.name]:
        raise InvalidArgumentError(
            f"{what}: {name} elements, but {dt.name} needs {' or '.join(ELEMENT_TYPES[dt.name])} (not reinterpreted)"
        )


def dtype(x) -> DType:
    """Accepts a name ('bf16', 'bfloat16', ...), a tideDataType_t code, a DType or a torch.dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        if int(x) in BY_CODE:
            return BY_CODE[int(x)]
        raise InvalidArgumentError(f"unknown tideDataType_t {int(x)}; valid: 0..{N.tideNumDataTypes - 1}")
    name = str(x)
    if name.startswith("torch."):  # torch.bfloat16 and friends, without importing torch
        name = name[len("torch.") :]
    name = name.lower()
    name = ALIASES.get(name, name)
    if name not in DTYPES:
        raise InvalidArgumentError(f"unknown dtype {x!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


OPS = {"sum": N.tideSum, "avg": N.tideAvg, "premul": N.tidePremulSum}
OP_ALIASES = {"premul_sum": "premul", "premulsum": "premul", "mulsum": "premul", "mean": "avg"}


def op_code(op) -> int:
    if type(op) is str and op in OPS:  # the canonical names, as the wrappers pass them: one lookup
        return OPS[op]
    if isinstance(op, (int, np.integer)) and not isinstance(op, bool):
        if 0 <= int(op) < N.tideNumRedOps:
            return int(op)
        raise InvalidArgumentError(f"unknown tideRedOp_t {int(op)}")
    name = str(op).lower()
    name = OP_ALIASES.get(name, name)
    if name not in OPS:
        raise InvalidArgumentError(f"unknown reduction op {op!r}; use one of {', '.join(OPS)}")
    return OPS[name]


def scale_arg(scale, op: int) -> float:
    """The scale passed to the library for op (a tideRedOp_t): a real number (not a str or a bool); PREMUL_SUM
    multiplies by it in fp32, so there it must be finite in fp32; the other ops ignore it (1.0 is passed)."""
    if isinstance(scale, (str, bytes, bool)):
        raise InvalidArgumentError(f"scale is {scale!r}; expected a real number")
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"scale is {scale!r}; expected a real number") from None
    if op != N.tidePremulSum:
        return 1.0
    if not math.isfinite(ctypes.c_float(value).value):
        raise InvalidArgumentError(f"scale={scale!r} is not a finite fp32 value (op premul multiplies by it in fp32)")
    return value

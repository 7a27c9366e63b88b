# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host executor wrappers: all ranks of a layout simulated in this process.

Inputs may be numpy arrays or CPU torch tensors (torch is never imported here).
Outputs are numpy arrays of the dtype's storage type (bf16 as uint16 bits, fp8 as
uint8 bits), filled with 0xFF bytes before the call so an unwritten element shows;
or pass your own outputs (numpy or CPU torch), which are written in place.
"""

from collections.abc import Sequence
from typing import Any, List, Optional, Union

import numpy as np

from . import _native as N
from ._tensor_args import memory_fault
from .dtypes import RS_TYPES, DType, check_element_type, op_code, scale_arg
from .dtypes import dtype as to_dtype
from .errors import InvalidArgumentError
from .layout import Layout, sequence_arg

POISON_BYTE = 0xFF


def _pointer(x: Any, numel: int, dt: DType, what: str, writable: bool) -> int:
    """Address of a contiguous CPU buffer of exactly numel elements of type dt."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise InvalidArgumentError(f"{what}: numpy array must be C-contiguous")
        if writable and not x.flags.writeable:
            raise InvalidArgumentError(f"{what}: numpy array is read-only")
        size, ptr = x.size, x.ctypes.data
    elif hasattr(x, "data_ptr") and hasattr(x, "element_size"):  # a torch.Tensor
        if x.device.type != "cpu":
            raise InvalidArgumentError(f"{what}: tensor is on {x.device}; the host executor needs CPU tensors")
        if not x.is_contiguous():
            raise InvalidArgumentError(f"{what}: tensor must be contiguous")
        memory_fault(x, what)
        size, ptr = x.numel(), x.data_ptr()
    else:
        raise InvalidArgumentError(f"{what}: expected a numpy array or a CPU torch tensor, got {type(x).__name__}")
    check_element_type(x, dt, what)
    elem_size = dt.size
    if size != numel:
        raise InvalidArgumentError(f"{what}: {size} elements, layout needs {numel}")
    if numel and not ptr:
        raise InvalidArgumentError(f"{what}: NULL data pointer")
    if ptr % elem_size:
        # include/tide.h "Buffer alignment": refused here and in the library alike.
        raise InvalidArgumentError(
            f"{what}: address 0x{ptr:x} is not aligned to its element size ({elem_size} bytes); use an aligned buffer"
        )
    return ptr


def _check_table(table: Sequence, world: int, what: str, per_rank: Optional[int] = None) -> None:
    """table: one entry per rank; with per_rank, each entry a sequence of that many buffers."""
    sequence_arg(table, what, "per-rank entries")
    if len(table) != world:
        raise InvalidArgumentError(f"{what}: {len(table)} ranks given, layout has world_size {world}")
    if per_rank is not None:
        for r, row in enumerate(table):
            if len(sequence_arg(row, f"{what}[{r}]", "buffers, one per parameter")) != per_rank:
                raise InvalidArgumentError(f"{what}[{r}]: {len(row)} buffers given, layout has {per_rank} parameters")


def poisoned(numel: int, dt: DType) -> np.ndarray:
    out = np.empty(numel, dtype=dt.storage)
    out.view(np.uint8)[...] = POISON_BYTE
    return out


def host_all_gather(
    layout: Layout, shards: Sequence[Sequence[Any]], params: Optional[List[List[Any]]] = None
) -> List[List[Any]]:
    """TIDE-AG over every rank: shards[r][i] (shard_numel_i elements) -> params[r][i] (shard_numel_i * W).

    Returns params. Raises InvalidArgumentError before anything is written on bad input.
    """
    W, infos, dts = layout.world_size, layout.params, layout.dtypes
    _check_table(shards, W, "shards", len(infos))
    if params is None:
        params = [[poisoned(p.shard_numel * W, dt) for p, dt in zip(infos, dts)] for _ in range(W)]
    _check_table(params, W, "params", len(infos))
    src, dst = [], []
    for r in range(W):
        for i, (p, dt) in enumerate(zip(infos, dts)):
            src.append(_pointer(shards[r][i], p.shard_numel, dt, f"shards[{r}][{i}]", False))
            dst.append(_pointer(params[r][i], p.shard_numel * W, dt, f"params[{r}][{i}]", True))
    with layout._use() as h:  # a close() on another thread waits for this call (or this call fails cleanly)
        N.check(N.lib().tideHostAllGather(h, N.pointer_table(src), N.pointer_table(dst)), "host_all_gather")
    return params


def host_reduce_scatter(
    layout: Layout,
    grads: Sequence[Sequence[Any]],
    out_dtype: Union[str, DType] = "fp32",
    op: str = "sum",
    scale: float = 1.0,
    outs: Optional[List[Any]] = None,
) -> List[Any]:
    """TIDE-RS over every rank: grads[r][i] (numel_i elements, bf16/fp16/fp32) -> outs[r].

    outs[r] is rank r's packed output: rs_out_numel elements of out_dtype, parameter i at
    params[i].rs_out_offset. op: 'sum', 'avg' or 'premul' (multiply by `scale` first).
    """
    W, infos, dts = layout.world_size, layout.params, layout.dtypes
    odt = to_dtype(out_dtype)
    if odt.name not in RS_TYPES:
        raise InvalidArgumentError(f"out_dtype {odt.name}: reduce-scatter writes one of {', '.join(RS_TYPES)}")
    code = op_code(op)
    scale_f = scale_arg(scale, code)
    _check_table(grads, W, "grads", len(infos))
    if outs is None:
        outs = [poisoned(layout.rs_out_numel, odt) for _ in range(W)]
    _check_table(outs, W, "outs")
    src, dst = [], []
    for r in range(W):
        for i, (p, dt) in enumerate(zip(infos, dts)):
            src.append(_pointer(grads[r][i], p.numel, dt, f"grads[{r}][{i}]", False))
        dst.append(_pointer(outs[r], layout.rs_out_numel, odt, f"outs[{r}]", True))
    with layout._use() as h:
        N.check(
            N.lib().tideHostReduceScatter(h, N.pointer_table(src), N.pointer_table(dst), odt.code, code, scale_f),
            "host_reduce_scatter",
        )
    return outs


def unpack_rs_output(layout: Layout, out: np.ndarray) -> List[np.ndarray]:
    """Views of one rank's packed RS output, one per parameter (shard_numel_i elements)."""
    return [out[p.rs_out_offset : p.rs_out_offset + p.shard_numel] for p in layout.params]

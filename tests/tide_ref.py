# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Independent numpy/python model of the layout math at the top of include/tide.h.

Written from the header's text only, never from the C++ sources, so the tests compare two
implementations rather than one with itself.
"""

from collections.abc import Sequence
from typing import List, NamedTuple

SLOT_ALIGN = 256
ELEM_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1, "int32": 4}
ALL_DTYPES = list(ELEM_SIZE)


def align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class RefParam(NamedTuple):
    numel: int
    row_numel: int
    shard_numel: int
    elem_size: int
    send_offset: int
    slot_offset: int
    rs_out_offset: int


class RefLayout(NamedTuple):
    params: List[RefParam]
    send_end: int  # end of the last shard in the packed send buffer
    slot_end: int  # end of the last parameter in the slot
    rs_out_numel: int
    n_nodes: int


def ref_layout(numels: Sequence[int], rows: Sequence[int], dtypes: Sequence[str], world: int, rpn: int) -> RefLayout:
    params, send, slot, rs = [], 0, 0, 0
    for n, c, d in zip(numels, rows, dtypes):
        es = ELEM_SIZE[d]
        shard = -(-(n // c) // world) * c
        send = align_up(send, es)
        slot = align_up(slot, SLOT_ALIGN)
        params.append(RefParam(n, c, shard, es, send, slot, rs))
        send += shard * es
        slot += shard * world * es
        rs += shard
    return RefLayout(params, send, slot, rs, world // rpn)


def divisors_upto(n: int, cap: int) -> List[int]:
    return [d for d in range(1, min(n, cap) + 1) if n % d == 0]

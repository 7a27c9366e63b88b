# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host backend of tide-perf: every rank simulated in this process by the C host executor.

Timings are wall time of one host-executor call (all ranks), so bandwidths measure the
simulation, not a network. Inputs are generated once per size; the numpy reference
(nccl_tide.reference, independent of the C library) is computed once per size.

The backend runs whichever collective it is given: the descriptor's host_variants (perf/collective.py) make the
buffers, the calls and the checks; here is what every collective shares: the memory check, the checked first call,
the timed loop.
"""

import os
import time
from typing import Callable, List, NamedTuple, Optional, Tuple

import numpy as np

from .._memory import check_host_memory, host_collective_bytes
from ..dtypes import DType
from ..errors import InvalidArgumentError
from ..layout import Layout
from .collective import Collective, HostVariant
from .report import NA, Variant

RANDOM_TEMPORARIES = 3  # data.random_values holds its result and up to 3 more arrays of its size while it builds it

# Test-only hook: when set, one byte of the checked result is flipped before comparison,
# so tests can prove that a wrong result is counted and fails the run. Never set it otherwise.
CORRUPT_ENV = "TIDE_PERF_TEST_CORRUPT"


class Case(NamedTuple):
    numels: List[int]
    row_numels: List[int]
    world: int
    ranks_per_node: Optional[int]
    pace_bytes: Optional[int] = None  # inter-node pacing cap of the layout (None: NCCL_TIDE_PACE_BYTES or default)


class Opts(NamedTuple):
    dtype: DType
    out_dtype: DType
    op: str
    scale: float
    iters: int
    warmup: int
    check: int
    seed: int
    agg: int = 1  # calls per timed iteration (-m)
    per_iter: bool = False  # -I 1: keep each iteration's time


def _timed(fn: Callable[[], None], o: Opts, total_bytes: int, W: int, coll, wrong: Optional[int]) -> Variant:
    """The Variant of `fn`: the mean time per call of o.iters iterations of o.agg calls each, after o.warmup calls;
    with o.per_iter each iteration's time per call as well."""
    for _ in range(o.warmup):
        fn()
    laps = []
    t0 = time.perf_counter()
    for _ in range(o.iters):
        t = time.perf_counter()
        for _ in range(o.agg):
            fn()
        laps.append((time.perf_counter() - t) / o.agg * 1e6)
    mean = (time.perf_counter() - t0) / (o.iters * o.agg) * 1e6
    algbw, busbw = coll.bandwidth(total_bytes, W, mean)
    return Variant(mean, algbw, busbw, wrong, iter_us=laps if o.per_iter else None)


def corrupt(arr: np.ndarray) -> None:
    if os.environ.get(CORRUPT_ENV):
        arr.view(np.uint8)[arr.nbytes // 2] ^= 0x01


def count_wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bits differ (bit-exact; NaN poison counts as wrong)."""
    isz = got.itemsize
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[isz]
    return int(np.count_nonzero(got.view(bits) != want.view(bits)))


def fill(dst: np.ndarray, byte: int = 0xFF) -> None:
    dst.view(np.uint8)[...] = byte


def measure(coll: Collective, case: Case, o: Opts) -> Tuple[Variant, Variant, Optional[str]]:
    """One size of `coll` on every simulated rank: (out-of-place Variant, in-place Variant, note or None)."""
    W = case.world
    with Layout(
        case.numels, o.dtype.name, W, case.ranks_per_node, row_numels=case.row_numels, pace_bytes=case.pace_bytes
    ) as lay:
        need = host_collective_bytes(lay, coll.name, o.out_dtype.size, results_copy=bool(o.check))
        check_host_memory(need, f"tide-perf {coll.name} --backend host")
        out_of_place, in_place = coll.host_variants(lay, o)
        total_bytes = sum(p.shard_numel for p in lay.params) * W * o.dtype.size
        oop = _measure(out_of_place, o, total_bytes, W, coll, first_call=bool(o.check))
        if isinstance(in_place, str):
            return oop, NA, in_place
        try:
            # In place, the first call is made with -c 0 too: a form the host executor refuses ends the variant
            # there, before anything is timed.
            ip = _measure(in_place, o, total_bytes, W, coll, first_call=True)
        except InvalidArgumentError as e:
            what = coll.name.replace("_", "-")
            return oop, NA, f"in-place {what} not accepted by the host executor: {e.detail}"
        return oop, ip, None


def _measure(v: HostVariant, o: Opts, total_bytes: int, W: int, coll: Collective, first_call: bool) -> Variant:
    """The Variant of `v`: an untimed first call (checked with -c 1) when asked for, then the timed calls, from the
    inputs as they were made (reset before each of the two)."""
    wrong = None
    v.reset()
    if first_call:
        v.run()
        if o.check:
            wrong = v.check()
        v.reset()
    return _timed(v.run, o, total_bytes, W, coll, wrong)

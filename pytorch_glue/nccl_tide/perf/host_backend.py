# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host backend of tide-perf: every rank simulated in this process by the C host executor.

Timings are wall time of one host-executor call (all ranks), so bandwidths measure the
simulation, not a network. Inputs are generated once per size; the numpy reference
(nccl_tide.reference, independent of the C library) is computed once per size.
"""

import os
import time
from collections.abc import Sequence
from typing import Callable, List, NamedTuple, Optional

import numpy as np

from .. import reference as ref
from .._memory import check_host_memory, host_collective_bytes
from ..data import random_values, rank_rng
from ..dtypes import DType
from ..errors import InvalidArgumentError
from ..host import host_all_gather, host_reduce_scatter, poisoned
from ..layout import Layout
from .collectives import ALL_GATHER, REDUCE_SCATTER
from .report import NA, Variant

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
    return Variant(mean, *coll.bandwidth(total_bytes, W, mean), wrong, iter_us=laps if o.per_iter else None)


def _corrupt(arr: np.ndarray) -> None:
    if os.environ.get(CORRUPT_ENV):
        arr.view(np.uint8)[arr.nbytes // 2] ^= 0x01


def _count_wrong(got: np.ndarray, want: np.ndarray) -> int:
    """Elements whose bits differ (bit-exact; NaN poison counts as wrong)."""
    isz = got.itemsize
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32}[isz]
    return int(np.count_nonzero(got.view(bits) != want.view(bits)))


def _fill(dst: np.ndarray, byte: int = 0xFF) -> None:
    dst.view(np.uint8)[...] = byte


def all_gather(case: Case, o: Opts):
    """Returns (out-of-place Variant, in-place Variant, note or None)."""
    W = case.world
    with Layout(
        case.numels, o.dtype.name, W, case.ranks_per_node, row_numels=case.row_numels, pace_bytes=case.pace_bytes
    ) as lay:
        infos = lay.params
        need = host_collective_bytes(lay, "all_gather", results_copy=bool(o.check))
        check_host_memory(need, "tide-perf all_gather --backend host")
        shards = [[random_values(rank_rng(o.seed, r), o.dtype, p.shard_numel) for p in infos] for r in range(W)]
        params = [[poisoned(p.shard_numel * W, o.dtype) for p in infos] for _ in range(W)]
        total_bytes = sum(p.shard_numel for p in infos) * W * o.dtype.size
        # The reference is one more unsharded copy of the layer: made only when a check reads it (-c 0: none).
        expected = [ref.all_gather_param([shards[s][i] for s in range(W)]) for i in range(len(infos) if o.check else 0)]

        def check() -> int:
            _corrupt(params[-1][-1])
            return sum(_count_wrong(params[r][i], expected[i]) for r in range(W) for i in range(len(infos)))

        # out-of-place
        wrong = None
        if o.check:
            host_all_gather(lay, shards, params)
            wrong = check()
        oop = _timed(lambda: host_all_gather(lay, shards, params), o, total_bytes, W, ALL_GATHER, wrong)

        # in-place: each rank's shard is read from its own position in its unsharded storage
        ip_shards = [
            [params[r][i][r * p.shard_numel : (r + 1) * p.shard_numel] for i, p in enumerate(infos)] for r in range(W)
        ]

        def reset() -> None:
            for r in range(W):
                for i in range(len(infos)):
                    _fill(params[r][i])
                    ip_shards[r][i][...] = shards[r][i]

        try:
            wrong = None
            reset()
            host_all_gather(lay, ip_shards, params)
            if o.check:
                wrong = check()
            ip = _timed(lambda: host_all_gather(lay, ip_shards, params), o, total_bytes, W, ALL_GATHER, wrong)
            return oop, ip, None
        except InvalidArgumentError as e:
            return oop, NA, f"in-place all-gather not accepted by the host executor: {e.detail}"


def reduce_scatter(case: Case, o: Opts):
    W = case.world
    with Layout(
        case.numels, o.dtype.name, W, case.ranks_per_node, row_numels=case.row_numels, pace_bytes=case.pace_bytes
    ) as lay:
        infos = lay.params
        R = lay.ranks_per_node
        need = host_collective_bytes(lay, "reduce_scatter", o.out_dtype.size, results_copy=bool(o.check))
        check_host_memory(need, "tide-perf reduce_scatter --backend host")
        grads = [[random_values(rank_rng(o.seed, r), o.dtype, p.numel) for p in infos] for r in range(W)]
        outs = [poisoned(lay.rs_out_numel, o.out_dtype) for _ in range(W)]
        total_bytes = lay.rs_out_numel * W * o.dtype.size
        expected = None
        if o.check:
            expected = ref.rs_reference(
                grads, case.numels, case.row_numels, [o.dtype] * len(infos), R, o.out_dtype, o.op, o.scale
            )

        def run(g: Sequence, out: List[np.ndarray]) -> None:
            host_reduce_scatter(lay, g, o.out_dtype, o.op, o.scale, outs=out)

        def check(out: List[np.ndarray]) -> int:
            _corrupt(out[-1])
            return sum(_count_wrong(out[r], expected[r]) for r in range(W))

        wrong = None
        if o.check:
            run(grads, outs)
            wrong = check(outs)
        oop = _timed(lambda: run(grads, outs), o, total_bytes, W, REDUCE_SCATTER, wrong)

        # in-place (nccl-tests: recvbuff = sendbuff + rank * recvcount) only means something
        # for one flat tensor whose output type equals its input type.
        if len(infos) != 1 or o.out_dtype.name != o.dtype.name:
            return oop, NA, "in-place reduce-scatter needs --layout flat and an output type equal to -d: N/A"
        # TIDE takes that form only without padding (include/tide.h, tideHostReduceScatter): say so without calling
        # the library, whose refusal would log a WARN line under NCCL_DEBUG=WARN for a probe of tide-perf's own making.
        p = infos[0]
        if p.row_numel != 1 or p.numel != W * p.shard_numel:
            return oop, NA, "in-place reduce-scatter: TIDE's in-place form needs a count divisible by the ranks: N/A"
        ip_outs = [grads[r][0][r * p.shard_numel : (r + 1) * p.shard_numel] for r in range(W)]

        def reset() -> None:  # the in-place call overwrites each rank's own block: the same inputs again
            for r in range(W):
                grads[r][0][...] = random_values(rank_rng(o.seed, r), o.dtype, p.numel)

        wrong = None
        reset()
        run(grads, ip_outs)
        if o.check:
            wrong = check(ip_outs)
        reset()
        ip = _timed(lambda: run(grads, ip_outs), o, total_bytes, W, REDUCE_SCATTER, wrong)
        return oop, ip, None

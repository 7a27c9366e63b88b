# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""reduce_scatter as tide-perf measures it (nccl-tests' reduce_scatter.cu): every rank's gradient of every parameter
is reduced (sum, avg or premul) into each rank's dim-0 shard of it, packed into one output of --out-type. The host
backend checks bit-exact against the numpy reference of the same order of operations."""

from typing import List

from .. import reference as ref
from ..data import random_values, rank_rng
from ..host import host_reduce_scatter, poisoned
from .collective import Collective, HostVariant, shard_numels
from .host_backend import RANDOM_TEMPORARIES, REDUCE_SCRATCH, corrupt, count_wrong


class ReduceScatter(Collective):
    name = "reduce_scatter"
    perf_name = "reduce_scatter_perf"
    reduces = True
    fsdp2_copy_op = "chunk_cat"

    def host_peak_bytes(self, numels: List[int], rows: List[int], world: int, elem: int, out_elem: int,
                        check: bool) -> int:
        """While the gradients are made, the gradients so far (W x one rank's gradient bytes, G) and the temporaries
        of one gradient; then G, every rank's packed output (O) and with -c the reference (O again), and on top of
        these the largest of: the C reduction's fp32 scratch, the reference's work on one rank (its output in pieces
        before they are joined, fp32 vectors of a shard), and in place one gradient made again with its temporaries
        (the call overwrites each rank's own block)."""
        shards = shard_numels(numels, rows, world)
        G = world * sum(numels) * elem
        out = world * sum(shards) * out_elem
        making = G + RANDOM_TEMPORARIES * max(numels) * elem
        in_place = len(numels) == 1 and rows[0] == 1 and out_elem == elem and numels[0] == world * shards[0]
        extra = max(
            REDUCE_SCRATCH * max(shards) * 4,
            (out // world + 3 * max(shards) * 4) if check else 0,
            (1 + RANDOM_TEMPORARIES) * numels[0] * elem if in_place else 0,  # the new gradient is a temporary too
        )
        return max(making, G + out + (out if check else 0) + extra)

    def host_variants(self, layout, o):
        W, infos = layout.world_size, layout.params
        grads = [[random_values(rank_rng(o.seed, r), o.dtype, p.numel) for p in infos] for r in range(W)]
        outs = [poisoned(layout.rs_out_numel, o.out_dtype) for _ in range(W)]
        expected = None
        if o.check:
            expected = ref.rs_reference(
                grads, [p.numel for p in infos], [p.row_numel for p in infos], [o.dtype] * len(infos),
                layout.ranks_per_node, o.out_dtype, o.op, o.scale,
            )

        def run(out: list) -> None:
            host_reduce_scatter(layout, grads, o.out_dtype, o.op, o.scale, outs=out)

        def check(out: list) -> int:
            corrupt(out[-1])
            return sum(count_wrong(out[r], expected[r]) for r in range(W))

        out_of_place = HostVariant(lambda: run(outs), lambda: check(outs))
        # in place (nccl-tests: recvbuff = sendbuff + rank * recvcount) only means something for one flat tensor
        # whose output type equals its input type.
        if len(infos) != 1 or o.out_dtype.name != o.dtype.name:
            return out_of_place, "in-place reduce-scatter needs --layout flat and an output type equal to -d: N/A"
        # TIDE takes that form only without padding (include/tide.h, tideHostReduceScatter): say so without calling
        # the library, whose refusal would log a WARN line under NCCL_DEBUG=WARN for a probe of tide-perf's own making.
        p = infos[0]
        if p.row_numel != 1 or p.numel != W * p.shard_numel:
            why = "in-place reduce-scatter: TIDE's in-place form needs a count divisible by the ranks: N/A"
            return out_of_place, why
        ip_outs = [grads[r][0][r * p.shard_numel : (r + 1) * p.shard_numel] for r in range(W)]

        def reset() -> None:  # the in-place call overwrites each rank's own block: the same inputs again
            for r in range(W):
                grads[r][0][...] = random_values(rank_rng(o.seed, r), o.dtype, p.numel)

        return out_of_place, HostVariant(lambda: run(ip_outs), lambda: check(ip_outs), reset)


REDUCE_SCATTER = ReduceScatter()

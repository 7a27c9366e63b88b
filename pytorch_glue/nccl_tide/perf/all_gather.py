# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""all_gather as tide-perf measures it (nccl-tests' all_gather.cu): every rank's shard of every parameter lands in
every rank's unsharded storage of that parameter. No reduction: results are checked bit-exact."""

from typing import List

from .. import reference as ref
from ..data import random_values, rank_rng
from ..host import host_all_gather, poisoned
from .collective import Collective, HostVariant, shard_numels
from .host_backend import RANDOM_TEMPORARIES, corrupt, count_wrong, fill


class AllGather(Collective):
    name = "all_gather"
    perf_name = "all_gather_perf"
    reduces = False
    fsdp2_copy_op = "split_with_sizes_copy"

    def host_peak_bytes(self, numels: List[int], rows: List[int], world: int, elem: int, out_elem: int,
                        check: bool) -> int:
        """While the shards are made, the shards so far and random_values' temporaries of one shard; then every
        rank's shards (S = W x one rank's shard bytes), every rank's gathered parameters (W x S), and with -c the
        reference (S) with the comparison's one byte per element of a gathered parameter."""
        shards = shard_numels(numels, rows, world)
        S = sum(shards) * elem * world
        making = S + RANDOM_TEMPORARIES * max(shards) * elem
        compare = world * max(shards) if check else 0  # count_wrong's one byte per element of a gathered parameter
        return max(making, S + world * S + (S + compare if check else 0))

    def host_variants(self, layout, o):
        W, infos = layout.world_size, layout.params
        shards = [[random_values(rank_rng(o.seed, r), o.dtype, p.shard_numel) for p in infos] for r in range(W)]
        params = [[poisoned(p.shard_numel * W, o.dtype) for p in infos] for _ in range(W)]
        # The reference is one more unsharded copy of the layer: made only when a check reads it (-c 0: none).
        expected = [ref.all_gather_param([shards[s][i] for s in range(W)]) for i in range(len(infos) if o.check else 0)]

        def check() -> int:
            corrupt(params[-1][-1])
            return sum(count_wrong(params[r][i], expected[i]) for r in range(W) for i in range(len(infos)))

        # in place: each rank's shard is read from its own position in its unsharded storage
        ip_shards = [
            [params[r][i][r * p.shard_numel : (r + 1) * p.shard_numel] for i, p in enumerate(infos)] for r in range(W)
        ]

        def reset() -> None:
            for r in range(W):
                for i in range(len(infos)):
                    fill(params[r][i])
                    ip_shards[r][i][...] = shards[r][i]

        return (
            HostVariant(lambda: host_all_gather(layout, shards, params), check),
            HostVariant(lambda: host_all_gather(layout, ip_shards, params), check, reset),
        )


ALL_GATHER = AllGather()

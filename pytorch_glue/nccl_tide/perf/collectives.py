# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One descriptor per collective, as nccl-tests' `struct testColl` (all_gather.cu, reduce_scatter.cu): its name, how
a size becomes a per-rank count, its reduction, its bandwidth factor and how the host backend runs it. The harness
(perf/harness.py) is the same for every collective and reads everything collective-specific from here."""

from dataclasses import dataclass
from typing import List, Tuple

from ..models import model_params, numels_and_rows

BUSBW_FORMULA = (
    "busbw = algbw * (W-1)/W (nccl-tests' all_gather/reduce_scatter factor, W = world size); kept for every "
    "--ranks-per-node: it does not depend on the node topology, as in nccl-tests on several nodes"
)


@dataclass(frozen=True)
class Collective:
    name: str  # all_gather | reduce_scatter
    perf_name: str  # nccl-tests' program name: the "Collective test" lines and the JSON's experiment name
    reduces: bool  # takes a reduction op, an output type and a premul scale
    fsdp2_copy_op: str  # the FSDP2 layout conversion its fsdp2 row adds per rank

    def bus_factor(self, world: int) -> float:
        """nccl-tests' AllGatherGetBw / ReduceScatterGetBw: (W-1)/W, whatever the node topology."""
        return (world - 1) / world if world > 1 else 0.0

    def bandwidth(self, nbytes_total: int, world: int, time_us: float) -> Tuple[float, float]:
        """(algbw, busbw) in GB/s of `nbytes_total` bytes (the whole gathered / reduced size) in `time_us`."""
        algbw = nbytes_total / 1e3 / time_us if time_us > 0 else 0.0  # bytes/us/1e3 = GB/s
        return algbw, algbw * self.bus_factor(world)

    def redop(self, op: str) -> str:
        """The table's redop column: the op of a reduction, "none" otherwise (nccl-tests' all_gather)."""
        return op if self.reduces else "none"

    def run_host(self, case, opts):
        """The host backend's run of one size: (out-of-place Variant, in-place Variant, note or None)."""
        from . import host_backend

        return (host_backend.reduce_scatter if self.reduces else host_backend.all_gather)(case, opts)


ALL_GATHER = Collective("all_gather", "all_gather_perf", reduces=False, fsdp2_copy_op="split_with_sizes_copy")
REDUCE_SCATTER = Collective("reduce_scatter", "reduce_scatter_perf", reduces=True, fsdp2_copy_op="chunk_cat")
COLLECTIVES = {c.name: c for c in (ALL_GATHER, REDUCE_SCATTER)}


def by_name(text: str) -> Collective:
    """all_gather or all_gather_perf (nccl-tests' binary name) -> its descriptor."""
    return COLLECTIVES[text.replace("_perf", "")]


# -- sizes: nccl-tests' size loop and per-rank count ----------------------------------------------------------------


def sizes(minbytes: int, maxbytes: int, factor: int, step: int) -> List[int]:
    """nccl-tests' size loop: from minbytes, times factor (> 1) or plus step, up to maxbytes. The flag rules
    (perf/options.py) have ruled out the loops that would never grow."""
    out, s = [], minbytes
    while s <= maxbytes:
        out.append(s)
        if factor > 1:
            s *= factor
        elif step > 0:
            s += step
        else:
            break
    return out


def per_rank_count(size: int, elem_size: int, world: int) -> int:
    """nccl-tests' per-rank count of a size: whole 16-byte multiples (0: a row of size 0, as nccl-tests prints it)."""
    return ((size // elem_size) // world) & ~(16 // elem_size - 1)


def rank_count(numels: List[int], rows: List[int], world: int) -> int:
    """A table row's count column: the elements of one rank's share, every parameter padded to whole rows."""
    return sum(-(-n // r // world) * r for n, r in zip(numels, rows))


def model_bytes(layout: str, world: int, dt) -> int:
    """Bytes of a model layout's one row (what its table row shows as size)."""
    numels, prow = numels_and_rows(model_params(layout))
    return rank_count(numels, prow, world) * world * dt.size

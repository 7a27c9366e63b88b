# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The collectives tide-perf measures, one descriptor each (perf/collective.py, as nccl-tests' `struct testColl`),
and what every collective shares: nccl-tests' size loop and per-rank count."""

from typing import List

from ..models import model_params, numels_and_rows
from .all_gather import ALL_GATHER
from .collective import Collective, shard_numels
from .reduce_scatter import REDUCE_SCATTER

BUSBW_FORMULA = (
    "busbw = algbw * (W-1)/W (nccl-tests' all_gather/reduce_scatter factor, W = world size); kept for every "
    "--ranks-per-node: it does not depend on the node topology, as in nccl-tests on several nodes"
)

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
    return sum(shard_numels(numels, rows, world))


def model_bytes(layout: str, world: int, dt) -> int:
    """Bytes of a model layout's one row (what its table row shows as size)."""
    numels, prow = numels_and_rows(model_params(layout))
    return rank_count(numels, prow, world) * world * dt.size

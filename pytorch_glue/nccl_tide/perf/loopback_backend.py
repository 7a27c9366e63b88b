# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Loopback backend of tide-perf: N virtual ranks on one GPU (nccl_tide.cuda.LoopbackWorld).

One call = the collective of every virtual rank (all ranks' work on one device), so time, algbw and busbw are those
of the whole world on one GPU. One process holds no NCCL communicator between its virtual ranks: the `nccl` and
`fsdp2` rows measure the closest same-device stand-ins (benchmarks/ag_placement.py and rs.py) and say so in their
note; `nccl-ce` cannot run (real NCCL rows: the torchrun backend, whose ranks may share a GPU).

Virtual nodes (--ranks-per-node R < --ranks W): every TIDE layout is built with ranks_per_node=R (and the pacing cap
--pace-bytes), so the CUDA executors run the inter-node algorithm over W/R nodes of R ranks on the one GPU (docs/
architecture.md, "CUDA executors on several (virtual) nodes"; tests/gpu/test_virtual_nodes.py). The TIDE RS uses the
world's own staging, which the library sizes for the layout's plan (with several nodes: R node-local inputs plus one
fp32 partial chunk per pipeline buffer), so no slot region has to be sized here. The AG stand-ins run over the same
virtual nodes; the RS stand-ins have no node structure and are not run (impls.MULTI_NODE_RS_REASON).

The backend runs whichever collective it is given: the descriptor (perf/collective.py) makes every rank's buffers,
calls TIDE through WorldCalls or runs its stand-in, and checks the result (-c 1: before timing, outputs poisoned
first) against every rank's inputs.
"""

from typing import Optional, Sequence

from . import gpu
from .runner import Bench, CaseSpec


def _torch():
    import torch

    return torch


class WorldCalls:
    """TIDE's calls for every virtual rank of the world (lists indexed by rank). A call ends with the world's join:
    the caller's stream waits for every rank's stream, so a timed call ends with the collective."""

    def __init__(self, world):
        self.world = world

    def alloc_slot(self, nbytes: int) -> list:
        return self.world.alloc_slot(nbytes)

    def free_slot(self, slots) -> None:
        self.world.free_slot(slots)

    def all_gather(self, layouts, slots, sendbufs) -> None:
        self.world.all_gather(layouts, slots, sendbufs=sendbufs)
        self.world.join()

    def reduce_scatter(self, layouts, grads, outs, op: str, scale: float) -> None:
        # staging=None: the world's own staging, sized by the library for this plan (one node: R inputs per pipeline
        # buffer; several: R inputs plus the fp32 inter-node partial).
        self.world.reduce_scatter(layouts, grads, outs, op=op, scale=scale)
        self.world.join()

    def synchronize(self, timeout: float) -> None:
        self.world.synchronize(timeout=timeout)

    def prepare_all_gather(self, layouts, slots, sendbufs):
        from . import issue_cost

        return issue_cost.prepare_all_gather(self.world, layouts, slots, sendbufs=sendbufs)

    def prepare_reduce_scatter(self, layouts, grads, outs, op_code: int, out_code: int, scale: float):
        from . import issue_cost

        return issue_cost.prepare_reduce_scatter(self.world, layouts, grads, outs, op_code, out_code, scale=scale)


class LoopbackBackend:
    name = "loopback"
    notes: Sequence[str] = ()  # caveats on its timings, printed as header lines and written to the JSON

    def __init__(
        self, world: int, device: int = 0, ranks_per_node: Optional[int] = None, pace_bytes: Optional[int] = None
    ):
        from ..cuda import LoopbackWorld

        torch = _torch()
        self._topology(world, ranks_per_node, pace_bytes)
        torch.cuda.set_device(device)
        self.device = torch.device("cuda", device)
        self.world = LoopbackWorld(world, device=device)

    def _topology(self, world: int, ranks_per_node: Optional[int], pace_bytes: Optional[int]) -> None:
        """W, R (ranks per node of every layout: W = one node) and the layouts' pacing cap (None: the default)."""
        R = world if ranks_per_node is None else int(ranks_per_node)
        if not 2 <= world <= 8:
            raise ValueError(f"--backend loopback runs 2..8 virtual ranks, not --ranks {world}")
        if R < 1 or world % R:
            raise ValueError(f"--ranks-per-node {R} must divide --ranks {world}")
        self.W, self.R, self.pace = world, R, pace_bytes

    @property
    def nodes(self) -> int:
        return self.W // getattr(self, "R", self.W)

    def describe(self) -> str:
        text = f"loopback: {self.W} virtual ranks on one GPU (nccl_tide.cuda.LoopbackWorld), one call = every rank"
        if self.nodes > 1:
            pace = "layout default" if self.pace is None else f"{self.pace} B"
            text += (
                f"; {self.nodes} virtual nodes of {self.R} ranks (layouts with ranks_per_node={self.R}: TIDE runs "
                f"its inter-node algorithm on one GPU; pacing cap {pace}; RS on the world's own staging)"
            )
        return text

    def devices(self) -> list:
        import os
        import socket

        torch = _torch()
        name = torch.cuda.get_device_name(self.device)
        R = getattr(self, "R", self.W)
        return [
            {
                "rank": r,
                "group": 0,
                "pid": os.getpid(),
                "hostname": socket.gethostname(),
                "device": self.device.index,
                "device_hex": gpu.pci_hex(self.device.index),
                "name": f"{name} (virtual rank {r}" + (f", virtual node {r // R})" if R < self.W else ")"),
            }
            for r in range(self.W)
        ]

    def close(self) -> None:
        self.world.close()

    # -- what a collective's descriptor runs on (perf/collective.py) -------------------------------------------------
    @property
    def mine(self) -> range:
        return range(self.W)

    def layouts(self, case: CaseSpec, numels, rows) -> list:
        """Every virtual rank's Layout: R ranks per node and the pacing cap of the run."""
        from ..layout import Layout

        R, pace = getattr(self, "R", self.W), getattr(self, "pace", None)
        return [
            Layout(numels, case.dtype.name, self.W, ranks_per_node=R, rank=r, row_numels=rows, pace_bytes=pace)
            for r in range(self.W)
        ]

    def rank_generators(self, seed: int) -> list:
        """One generator for every rank: the ranks' inputs are drawn from it in rank order."""
        return [_torch().Generator(device=self.device).manual_seed(seed)] * self.W

    def tide(self) -> WorldCalls:
        return WorldCalls(self.world)

    def bench(self, impl: str, case: CaseSpec) -> Bench:
        """TIDE's call of the case's collective, or its same-device stand-in for `impl`."""
        return case.collective.bench(impl, self, case, case.collective.stand_ins)


def make(
    world: int, device: Optional[int] = None, ranks_per_node: Optional[int] = None, pace_bytes: Optional[int] = None
) -> LoopbackBackend:
    """ranks_per_node: every layout's R (None or world: one node; R < world: world / R virtual nodes);
    pace_bytes: the layouts' inter-node pacing cap (None: NCCL_TIDE_PACE_BYTES or the library default)."""
    return LoopbackBackend(world, 0 if device is None else device, ranks_per_node, pace_bytes)

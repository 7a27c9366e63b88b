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

Checks (-c 1), before timing, outputs poisoned first: all-gather bit-exact against the send buffers (every rank's
slot, every parameter); reduce-scatter against an fp64 sum of the inputs within gpu.RS_TOL x sum|x_i|.
"""

from typing import Callable, List, Optional, Sequence

from . import fsdp2_ops, gpu
from .impls import MULTI_NODE_RS_REASON, loopback_stand_in
from .runner import Bench, CaseSpec, Unavailable

SYNC_TIMEOUT_S = 30.0  # a TIDE call not done by then is a cross-rank deadlock: the row fails instead of hanging


def _torch():
    import torch

    return torch


def rs_reference(grads, layout, rank: int, world: int, op: str, scale: float, out):
    """(ref64, abs_sum64) of rank `rank`'s packed reduce-scatter output: per parameter, the rank's dim-0 shard of the
    sum over ranks (avg: / world; premul: x scale), zero in the padding."""
    torch = _torch()
    M = layout.rs_out_numel
    ref = torch.zeros(M, dtype=torch.float64, device=out.device)
    mag = torch.zeros(M, dtype=torch.float64, device=out.device)
    for i, p in enumerate(layout.params):
        k = p.shard_numel
        lo, hi = rank * k, min((rank + 1) * k, p.numel)
        if hi <= lo:
            continue
        dst = slice(p.rs_out_offset, p.rs_out_offset + hi - lo)
        for s in range(world):
            x = grads[s][i].reshape(-1)[lo:hi].double()
            if op == "premul":
                x = x * scale
            ref[dst] += x
            mag[dst] += x.abs()
        if op == "avg":
            ref[dst] /= world
            mag[dst] /= world
    return ref, mag


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

    # -- benches ---------------------------------------------------------------------------
    def bench(self, impl: str, case: CaseSpec) -> Bench:
        if case.collective == "all_gather":
            return self._ag(impl, case)
        return self._rs(impl, case)

    def _layouts(self, case: CaseSpec, numels, rows):
        from ..layout import Layout

        R, pace = getattr(self, "R", self.W), getattr(self, "pace", None)
        return [
            Layout(numels, case.dtype.name, self.W, ranks_per_node=R, rank=r, row_numels=rows, pace_bytes=pace)
            for r in range(self.W)
        ]

    def _ag(self, impl: str, case: CaseSpec) -> Bench:
        torch = _torch()
        W, dev = self.W, self.device
        world = self.world
        bits = gpu.bits_dtype(case.dtype.size)
        lays = self._layouts(case, case.numels, case.rows)
        lay = lays[0]
        g = torch.Generator(device=dev).manual_seed(case.seed)
        send = [torch.randint(0, 256, (lay.send_bytes,), dtype=torch.uint8, device=dev, generator=g) for _ in range(W)]
        # Expected slot image (identical on every rank): rank s's shard of parameter p at slot_offset + s * nb.
        expect = torch.full((lay.slot_bytes,), 255, dtype=torch.uint8, device=dev)
        regions = []
        for p in lay.params:
            nb = p.shard_numel * p.elem_size
            for s in range(W):
                expect[p.slot_offset + s * nb : p.slot_offset + (s + 1) * nb] = send[s][
                    p.send_offset : p.send_offset + nb
                ]
            regions.append((p.slot_offset, p.slot_offset + W * nb))

        def wrong_in(bufs) -> int:
            n = 0
            for b in bufs:
                for lo, hi in regions:
                    n += gpu.count_wrong_bits(b[lo:hi].view(bits), expect[lo:hi].view(bits))
            return n

        if impl == "tide":
            slots = world.alloc_slot(lay.slot_bytes)

            def call():
                world.all_gather(lays, slots, sendbufs=send)
                world.join()

            def check():
                for s_ in slots:
                    s_.fill_(255)
                call()
                world.synchronize(timeout=SYNC_TIMEOUT_S)
                torch.cuda.synchronize()
                return wrong_in(slots)

            def prepare_issue():
                from . import issue_cost

                return issue_cost.prepare_all_gather(world, lays, slots, sendbufs=send)

            return Bench(call, check, note="", cleanup=lambda: world.free_slot(slots), prepare_issue=prepare_issue)

        if impl in ("nccl", "fsdp2"):
            S = lay.send_bytes // case.dtype.size
            flat_lays = self._layouts(case, [W * S], [1])
            flat = world.alloc_slot(flat_lays[0].slot_bytes)
            cdt = gpu.copy_dtype(case.dtype.name, case.dtype.size)
            flat_views = [f[: W * S * case.dtype.size].view(cdt).view(W, S) for f in flat]

            def flat_ag():
                world.all_gather(flat_lays, flat, sendbufs=send)
                world.join()

            if impl == "nccl":
                note = loopback_stand_in("nccl", "all_gather", self.nodes)
                if len(case.numels) == 1:
                    note += " (for a flat layout the same copies as the tide row)"
                want = torch.cat([s_.view(bits) for s_ in send])

                def check():
                    for f in flat:
                        f.fill_(255)
                    flat_ag()
                    torch.cuda.synchronize()
                    return sum(gpu.count_wrong_bits(v.reshape(-1).view(bits), want) for v in flat_views)

                return Bench(flat_ag, check, note=note, cleanup=lambda: world.free_slot(flat))

            op_name, copy_out = fsdp2_ops.copy_out_impl()
            sizes = [p.shard_numel for p in lay.params]
            outs = [torch.empty(lay.slot_bytes, dtype=torch.uint8, device=dev) for _ in range(W)]
            out_views = [fsdp2_ops.param_views(o, lay, W, cdt) for o in outs]

            def call():
                flat_ag()
                for r in range(W):
                    copy_out(flat_views[r], sizes, out_views[r])

            def check():
                for o in outs:
                    o.fill_(255)
                call()
                torch.cuda.synchronize()
                return wrong_in(outs)

            note = loopback_stand_in("fsdp2", "all_gather", self.nodes).format(copy_op=op_name)
            return Bench(call, check, note=note, cleanup=lambda: world.free_slot(flat))
        raise Unavailable(f"not run: no loopback implementation of {impl}")

    def _rs(self, impl: str, case: CaseSpec) -> Bench:
        torch = _torch()
        W, dev = self.W, self.device
        world = self.world
        lays = self._layouts(case, case.numels, case.rows)
        lay = lays[0]
        M = lay.rs_out_numel
        in_t, out_t = gpu.torch_dtype(case.dtype.name), gpu.torch_dtype(case.out_dtype.name)
        g = torch.Generator(device=dev).manual_seed(case.seed)
        grads = [
            [torch.randn(tuple(shape), dtype=torch.float32, device=dev, generator=g).to(in_t) for shape in case.shapes]
            for _ in range(W)
        ]
        tol = gpu.RS_TOL[case.out_dtype.name]
        refs: List = []

        def wrong_in(outs) -> int:
            if not refs:
                refs.extend(rs_reference(grads, lay, r, W, case.op, case.scale, outs[r]) for r in range(W))
            return sum(gpu.count_wrong_close(outs[r], *refs[r], tol) for r in range(W))

        if impl == "tide":
            outs = [torch.empty(M, dtype=out_t, device=dev) for _ in range(W)]

            def call():
                # staging=None: the world's own staging, sized by the library for this plan (one node: R inputs per
                # pipeline buffer; several: R inputs plus the fp32 inter-node partial).
                world.reduce_scatter(lays, grads, outs, op=case.op, scale=case.scale)
                world.join()

            def check():
                for o in outs:
                    o.fill_(float("nan"))
                call()
                world.synchronize(timeout=SYNC_TIMEOUT_S)
                torch.cuda.synchronize()
                return wrong_in(outs)

            def prepare_issue():
                from ..dtypes import dtype as to_dtype
                from ..dtypes import op_code
                from . import issue_cost

                return issue_cost.prepare_reduce_scatter(
                    world, lays, grads, outs, op_code(case.op), to_dtype(case.out_dtype.name).code, scale=case.scale
                )

            return Bench(call, check, note="", cleanup=lambda: refs.clear(), prepare_issue=prepare_issue)

        if impl in ("nccl", "fsdp2") and self.nodes > 1:
            raise Unavailable(MULTI_NODE_RS_REASON)
        if impl in ("nccl", "fsdp2"):
            # NCCL reduces in one type: FSDP2 copies the grads into the reduce type (--out-type) first.
            op_name, chunk_cat = fsdp2_ops.chunk_cat_impl()
            rsin = torch.empty(W, W * M, dtype=out_t, device=dev)
            base = torch.empty(W, M, dtype=out_t, device=dev)

            def copy_in():
                for r in range(W):
                    chunk_cat(grads[r], W, rsin[r].view(W, M))

            def reduce():
                torch.sum(rsin.view(W, W, M), dim=0, out=base)
                if case.op == "avg":
                    base.div_(W)
                elif case.op == "premul":
                    base.mul_(case.scale)

            copy_in()  # the nccl row starts from inputs already in the reduce type
            call: Callable[[], None] = reduce if impl == "nccl" else (lambda: (copy_in(), reduce()))

            def check():
                base.fill_(float("nan"))
                if impl == "fsdp2":
                    rsin.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                return wrong_in([base[r] for r in range(W)])

            note = loopback_stand_in(impl, "reduce_scatter").format(copy_op=op_name, out=case.out_dtype.name)
            return Bench(call, check, note=note, cleanup=lambda: refs.clear())
        raise Unavailable(f"not run: no loopback implementation of {impl}")


def make(
    world: int, device: Optional[int] = None, ranks_per_node: Optional[int] = None, pace_bytes: Optional[int] = None
) -> LoopbackBackend:
    """ranks_per_node: every layout's R (None or world: one node; R < world: world / R virtual nodes);
    pace_bytes: the layouts' inter-node pacing cap (None: NCCL_TIDE_PACE_BYTES or the library default)."""
    return LoopbackBackend(world, 0 if device is None else device, ranks_per_node, pace_bytes)

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""reduce_scatter as tide-perf measures it (nccl-tests' reduce_scatter.cu): every rank's gradient of every parameter
is reduced (sum, avg or premul) into each rank's dim-0 shard of it, packed into one output of --out-type. The host
backend checks bit-exact against the numpy reference of the same order of operations.

On the GPU backends the gradients are normal values of the parameters' shapes, and every output is checked within
gpu.RS_TOL (of the row's reduce type) x sum|x_i| of an fp64 sum. NCCL reduces in one type, which is why FSDP2 copies
bf16 gradients into fp32 first: the loopback stand-ins are an SM reduction of every rank's input in --out-type (after
FSDP2's copy-in for fsdp2); the torchrun rows NCCL's flat reduce-scatter in --out-type (nccl, fsdp2 with FSDP2's
copy-in) or in -d's type (nccl-dtype)."""

from typing import List

from .. import reference as ref
from ..data import random_values, rank_rng
from ..host import host_reduce_scatter, poisoned
from . import fsdp2_ops, gpu
from .collective import Collective, HostVariant, not_run, shard_numels
from .host_backend import RANDOM_TEMPORARIES, corrupt, count_wrong
from .impls import MULTI_NODE_RS_REASON, loopback_stand_in
from .runner import SYNC_TIMEOUT_S, Bench, Unavailable

REDUCE_SCRATCH = 3  # the C host reduce-scatter's fp32 vectors of the largest shard (host_reduce_scatter.cc)


def _torch():
    import torch

    return torch


def gradients(backend, case) -> list:
    """Every rank's gradients, one per parameter of its shape: normal values drawn in fp32 from the rank's generator,
    cast to -d."""
    torch = _torch()
    in_t = gpu.torch_dtype(case.dtype.name)
    return [
        [torch.randn(tuple(shape), dtype=torch.float32, device=backend.device, generator=g).to(in_t)
         for shape in case.shapes]
        for g in backend.rank_generators(case.seed)
    ]


def rs_reference(grads, layout, rank: int, world: int, op: str, scale: float, out):
    """(ref64, abs_sum64) of rank `rank`'s packed reduce-scatter output: per parameter, the rank's dim-0 shard of the
    sum over ranks (avg: / world; premul: x scale), zero in the padding."""
    torch = _torch()
    M = layout.rs_out_numel
    ref64 = torch.zeros(M, dtype=torch.float64, device=out.device)
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
            ref64[dst] += x
            mag[dst] += x.abs()
        if op == "avg":
            ref64[dst] /= world
            mag[dst] /= world
    return ref64, mag


class Reference:
    """The fp64 reference of the outputs of the ranks this process holds (backend.mine), made at the first check
    (the timed calls never wait for it); from then on only those ranks' gradients are kept."""

    def __init__(self, backend, layout, grads: list, case, tol: float):
        self.mine, self.W = list(backend.mine), backend.W
        self.layout, self.grads, self.case, self.tol = layout, grads, case, tol
        self.refs: list = []

    def wrong(self, outs) -> int:
        """Elements of `outs` (the outputs of backend.mine's ranks) not within tol x sum|x_i| of the reference."""
        c = self.case
        if not self.refs:
            self.refs = [rs_reference(self.grads, self.layout, r, self.W, c.op, c.scale, out)
                         for r, out in zip(self.mine, outs)]
            for s in range(self.W):  # every other rank's gradient was an input of the reference only
                if s not in self.mine:
                    self.grads[s] = None
        return sum(gpu.count_wrong_close(out, ref64, mag, self.tol) for out, (ref64, mag) in zip(outs, self.refs))

    def clear(self) -> None:
        self.refs = []


# -- loopback stand-ins ------------------------------------------------------------------------------------------------


def _sm_reduction(impl: str):
    """The stand-in of `impl`: FSDP2's copy-in of every rank's gradients into --out-type (nccl: once, untimed, as
    NCCL's input is already in the reduce type), then an SM sum of every rank's flat input (torch.sum over ranks)."""

    def build(backend, case) -> Bench:
        if backend.nodes > 1:
            raise Unavailable(MULTI_NODE_RS_REASON)
        torch = _torch()
        W, dev = backend.W, backend.device
        layout = backend.layouts(case, case.numels, case.rows)[0]
        M = layout.rs_out_numel
        out_t = gpu.torch_dtype(case.out_dtype.name)
        grads = gradients(backend, case)
        reference = Reference(backend, layout, grads, case, gpu.RS_TOL[case.out_dtype.name])
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

        def copy_in_and_reduce():
            copy_in()
            reduce()

        copy_in()  # the nccl row starts from inputs already in the reduce type
        call = copy_in_and_reduce if impl == "fsdp2" else reduce

        def check():
            base.fill_(float("nan"))
            if impl == "fsdp2":
                rsin.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            return reference.wrong([base[r] for r in range(W)])

        note = loopback_stand_in(impl, "reduce_scatter")
        assert note is not None  # impls.LOOPBACK_STAND_INS describes every stand-in
        return Bench(call, check, note=note.format(copy_op=op_name, out=case.out_dtype.name), cleanup=reference.clear)

    return build


# -- torchrun rows: NCCL on the process group --------------------------------------------------------------------------


def _flat_name(dist) -> str:
    """The torch.distributed function nccl_tide._dist calls for a flat reduce-scatter (row notes)."""
    return "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"


def _nccl(impl: str):
    """NCCL's flat reduce-scatter of this rank's gradients: nccl and fsdp2 in --out-type (fp32 by default, FSDP2's
    reduce_dtype), fsdp2 with FSDP2's copy-in (-d -> --out-type) timed before it; nccl-dtype in -d's type (bf16 grads
    reduced in bf16), the input never cast."""

    def build(backend, case) -> Bench:
        torch = _torch()
        from .. import _dist

        dist, W, dev = backend.dist, backend.W, backend.device
        red_name = case.dtype.name if impl == "nccl-dtype" else case.out_dtype.name
        if impl == "nccl-dtype" and red_name == case.out_dtype.name:
            raise Unavailable(f"not run: -d is --out-type ({red_name}): the nccl row already reduces in it")
        layout = backend.layouts(case, case.numels, case.rows)[0]
        M = layout.rs_out_numel
        grads = gradients(backend, case)
        reference = Reference(backend, layout, grads, case, gpu.RS_TOL[red_name])  # tol: of the row's reduce type
        own = grads[backend.rank]
        op_name, chunk_cat = fsdp2_ops.chunk_cat_impl()
        rsin = torch.empty(W * M, dtype=gpu.torch_dtype(red_name), device=dev)
        out = torch.empty(M, dtype=rsin.dtype, device=dev)
        if case.op == "premul":
            red = dist._make_nccl_premul_sum(case.scale)
        else:
            red = dist.ReduceOp.AVG if case.op == "avg" else dist.ReduceOp.SUM

        def copy_in():
            chunk_cat(own, W, rsin.view(W, M))

        def nccl():
            _dist.reduce_scatter_flat(out, rsin, op=red)

        def copy_in_and_nccl():
            copy_in()
            nccl()

        copy_in()  # nccl, nccl-dtype: the input already in the reduce type (its cast is not timed)
        call = copy_in_and_nccl if impl == "fsdp2" else nccl

        def check():
            out.fill_(float("nan"))
            if impl == "fsdp2":
                rsin.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            return reference.wrong([out])

        note = f"reduce type {red_name}; torch.distributed.{_flat_name(dist)}"
        if impl == "fsdp2":
            note += f"; copy-in: {op_name}"
        return Bench(call, check, note=note, cleanup=reference.clear)

    return build


# -- the descriptor ----------------------------------------------------------------------------------------------------


class ReduceScatter(Collective):
    name = "reduce_scatter"
    perf_name = "reduce_scatter_perf"
    reduces = True
    fsdp2_copy_op = "chunk_cat"

    def host_peak_bytes(self, numels: List[int], rows: List[int], world: int, elem: int, out_elem: int,
                        check: bool) -> int:
        """While the gradients are made, the gradients so far and the temporaries of one gradient; then every rank's
        gradients, every rank's packed output and with -c the reference (the outputs again), and on top of these the
        largest of: the C reduction's fp32 scratch, the reference's work on one rank (its output in pieces before they
        are joined, fp32 vectors of a shard), and in place one gradient made again with its temporaries (the call
        overwrites each rank's own block)."""
        shards = shard_numels(numels, rows, world)
        grad_bytes = world * sum(numels) * elem
        out_bytes = world * sum(shards) * out_elem
        making = grad_bytes + RANDOM_TEMPORARIES * max(numels) * elem
        in_place = len(numels) == 1 and rows[0] == 1 and out_elem == elem and numels[0] == world * shards[0]
        extra = max(
            REDUCE_SCRATCH * max(shards) * 4,
            (out_bytes // world + 3 * max(shards) * 4) if check else 0,
            (1 + RANDOM_TEMPORARIES) * numels[0] * elem if in_place else 0,  # the new gradient is a temporary too
        )
        return max(making, grad_bytes + out_bytes + (out_bytes if check else 0) + extra)

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

    def tide_bench(self, backend, case) -> Bench:
        torch = _torch()
        tide = backend.tide()
        layouts = backend.layouts(case, case.numels, case.rows)
        grads = gradients(backend, case)
        reference = Reference(backend, layouts[0], grads, case, gpu.RS_TOL[case.out_dtype.name])
        mine = [grads[r] for r in backend.mine]
        out_t = gpu.torch_dtype(case.out_dtype.name)
        outs = [torch.empty(layouts[0].rs_out_numel, dtype=out_t, device=backend.device) for _ in mine]

        def call():
            tide.reduce_scatter(layouts, mine, outs, case.op, case.scale)

        def check():
            for o in outs:
                o.fill_(float("nan"))
            call()
            tide.synchronize(SYNC_TIMEOUT_S)  # a hung peer raises instead of hanging
            torch.cuda.synchronize()
            return reference.wrong(outs)

        def prepare_issue():
            from ..dtypes import op_code

            return tide.prepare_reduce_scatter(layouts, mine, outs, op_code(case.op), case.out_dtype.code, case.scale)

        return Bench(call, check, cleanup=reference.clear, prepare_issue=prepare_issue)

    stand_ins = {"nccl": _sm_reduction("nccl"), "fsdp2": _sm_reduction("fsdp2")}
    nccl_rows = {
        "nccl": _nccl("nccl"),
        "nccl-dtype": _nccl("nccl-dtype"),
        "fsdp2": _nccl("fsdp2"),
        "nccl-ce": not_run("not run: NCCL's copy-engine collectives include no reduce-scatter"),
    }


REDUCE_SCATTER = ReduceScatter()

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""torchrun backend of tide-perf: one process per rank, real NCCL communicators (torch.distributed, backend nccl).

    torchrun --nproc_per_node 8 -m nccl_tide.perf all_gather --impl tide,nccl,fsdp2,nccl-ce -b 1M -e 1G -f 2

Rank 0 prints. Per row: time = mean per call on each rank, averaged over ranks (-a 1, nccl-tests' default) or rank
0's (-a 0); #wrong summed over ranks. Every rank regenerates every rank's inputs from the seed, so each checks its
own output locally (all-gather bit-exact; reduce-scatter within gpu.RS_TOL x sum|x_i| of an fp64 sum).

* tide: nccl_tide.comm.Comm.from_process_group (tideCommCreate on the process group's ncclComm_t);
* nccl: ncclAllGather / ncclReduceScatter on flat buffers (nccl_tide._dist: torch's all_gather_single /
  reduce_scatter_single, or the older *_tensor names); RS in --out-type of grads cast to it beforehand (fp32 by
  default: NCCL reduces in one type, which is why FSDP2 copies bf16 grads into fp32 first);
* nccl-dtype: reduce-scatter in -d's type (bf16 grads reduced in bf16, FSDP2 with reduce_dtype=bf16);
* fsdp2: the nccl call inside FSDP2's own copy ops (torch.ops.fsdp.*): all_gather_copy_in of each parameter's
  shard, the AG, split_with_sizes_copy copy-out; chunk_cat copy-in (-d -> --out-type) before the RS;
* nccl-ce: NCCL's AllGather on symmetric buffers (torch symmetric memory, NCCL backend); the row reports the
  kernels NCCL launched (0 SM time means the zero-CTA CE path ran).

Ranks may share GPUs when asked (--ranks-per-gpu / NCCL_TIDE_RANKS_PER_GPU; nccl_tide.devices): rank -> GPU
LOCAL_RANK % device count, and the header and the JSON carry devices.SHARED_GPU_CAVEAT.
"""

import os
import socket
from typing import List, Sequence

from .. import _dist
from ..devices import SHARED_GPU_CAVEAT
from . import fsdp2_ops, gpu
from .impls import NO_AG_DTYPE_ROW
from .loopback_backend import SYNC_TIMEOUT_S, rs_reference
from .runner import Bench, CaseSpec, Unavailable


def _torch():
    import torch

    return torch


def _flat_name(dist, collective: str) -> str:
    """The torch.distributed function nccl_tide._dist calls for a flat all_gather / reduce_scatter (row notes)."""
    new, old = {"all_gather": ("all_gather_single", "all_gather_into_tensor"),
                "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor")}[collective]
    return new if hasattr(dist, new) else old


def gpu_key(d: dict) -> tuple:
    """A devices() entry's GPU: host name and PCI bus id (the CUDA index where the bus id is unknown; an index alone
    would call GPUs of ranks with different CUDA_VISIBLE_DEVICES the same)."""
    hexid = d.get("device_hex")
    return d["hostname"], hexid if hexid not in (None, "unknown") else d["device"]


def shares_gpus(devices: list) -> bool:
    """True when two ranks of the world run on one GPU."""
    return len({gpu_key(d) for d in devices}) < len(devices)


class TorchrunBackend:
    name = "torchrun"
    notes: Sequence[str] = ()  # caveats on its timings, printed as header lines and written to the JSON

    def __init__(self, average: int = 1):
        from ..devices import init_nccl_process_group

        gpu.no_multicast_env()
        # the device: LOCAL_RANK's, or LOCAL_RANK % device count with NCCL_TIDE_RANKS_PER_GPU (--ranks-per-gpu)
        self.dist, self.device, _ = init_nccl_process_group()
        self.rank, self.W = self.dist.get_rank(), self.dist.get_world_size()
        self.average = average
        self._comm = None
        self._comm_error = None
        self._devices = self._gather_devices()
        self.notes = [SHARED_GPU_CAVEAT] if shares_gpus(self._devices) else []

    def describe(self) -> str:
        devs = self.devices()
        gpus = len({gpu_key(d) for d in devs})
        placed = f"{gpus} GPU(s) shared by {len(devs)} ranks" if gpus < len(devs) else "one GPU each"
        return f"torchrun: {self.W} processes, {placed}, NCCL process group (torch.distributed)"

    def _gather_devices(self) -> list:
        torch = _torch()
        mine = {
            "rank": self.rank,
            "group": 0,
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "device": self.device.index,
            "device_hex": gpu.pci_hex(self.device.index),
            "name": torch.cuda.get_device_name(self.device),
        }
        allv: List = [None] * self.W
        self.dist.all_gather_object(allv, mine)
        return allv

    def devices(self) -> list:
        return self._devices

    def barrier(self) -> None:
        self.dist.barrier(device_ids=[self.device.index])

    def reduce_time(self, t: float) -> float:
        torch = _torch()
        x = torch.tensor([t], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(x)
        return float(x.item()) / self.W if self.average else t

    def reduce_wrong(self, n: int) -> int:
        torch = _torch()
        x = torch.tensor([n], dtype=torch.int64, device=self.device)
        self.dist.all_reduce(x)
        return int(x.item())

    def close(self) -> None:
        if self._comm is not None:
            self._comm.close()
            self._comm = None
        if self.dist.is_initialized():
            self.dist.destroy_process_group()

    # -- helpers -----------------------------------------------------------------------------
    def comm(self):
        if self._comm is None and self._comm_error is None:
            try:
                from ..comm import Comm

                self._comm = Comm.from_process_group()
            except Exception as e:
                self._comm_error = f"not run: nccl_tide.comm.Comm.from_process_group failed: {type(e).__name__}: {e}"
        if self._comm is None:
            raise Unavailable(self._comm_error[:300])
        return self._comm

    def _layout(self, case: CaseSpec, numels, rows):
        from ..layout import Layout

        return Layout(numels, case.dtype.name, self.W, rank=self.rank, row_numels=rows)

    def _sends(self, case: CaseSpec, nbytes: int):
        torch = _torch()
        out = []
        for s in range(self.W):
            g = torch.Generator(device=self.device).manual_seed(case.seed * 1000 + s)
            out.append(torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=self.device, generator=g))
        return out

    def _grads(self, case: CaseSpec):
        torch = _torch()
        in_t = gpu.torch_dtype(case.dtype.name)
        out = []
        for s in range(self.W):
            g = torch.Generator(device=self.device).manual_seed(case.seed * 1000 + s)
            out.append(
                [
                    torch.randn(tuple(sh), dtype=torch.float32, device=self.device, generator=g).to(in_t)
                    for sh in case.shapes
                ]
            )
        return out

    def bench(self, impl: str, case: CaseSpec) -> Bench:
        return self._ag(impl, case) if case.collective == "all_gather" else self._rs(impl, case)

    # -- all-gather ----------------------------------------------------------------------------
    def _ag(self, impl: str, case: CaseSpec) -> Bench:
        torch = _torch()
        dist, W, dev, me = self.dist, self.W, self.device, self.rank
        bits = gpu.bits_dtype(case.dtype.size)
        lay = self._layout(case, case.numels, case.rows)
        sends = self._sends(case, lay.send_bytes)
        cdt = gpu.copy_dtype(case.dtype.name, case.dtype.size)
        if impl == "fsdp2":  # FSDP2's copy-in keeps values, not NaN payloads: its inputs hold no NaN
            for s_ in sends:
                gpu.zero_nans(s_, cdt)
        send = sends[me]
        S = lay.send_bytes // case.dtype.size
        expect = torch.full((lay.slot_bytes,), 255, dtype=torch.uint8, device=dev)
        regions = []
        for p in lay.params:
            nb = p.shard_numel * p.elem_size
            for s in range(W):
                expect[p.slot_offset + s * nb : p.slot_offset + (s + 1) * nb] = sends[s][
                    p.send_offset : p.send_offset + nb
                ]
            regions.append((p.slot_offset, p.slot_offset + W * nb))
        flat_want = torch.cat([x.view(bits) for x in sends])
        del sends

        def wrong_in(buf) -> int:
            return sum(gpu.count_wrong_bits(buf[lo:hi].view(bits), expect[lo:hi].view(bits)) for lo, hi in regions)

        if impl == "tide":
            comm = self.comm()
            slot = comm.alloc_slot(lay.slot_bytes)

            def call():
                comm.all_gather(lay, slot, sendbuf=send)

            def check():
                slot.fill_(255)
                call()
                comm.synchronize(timeout=SYNC_TIMEOUT_S)  # a hung peer raises instead of hanging
                torch.cuda.synchronize()
                return wrong_in(slot)

            def prepare_issue():
                from . import issue_cost

                return issue_cost.prepare_comm_all_gather(comm, lay, slot, send)

            return Bench(call, check, cleanup=lambda: comm.free_slot(slot), prepare_issue=prepare_issue)

        if impl == "nccl-ce":
            return self._nccl_ce(send, flat_want, bits)
        if impl == "nccl-dtype":
            raise Unavailable(NO_AG_DTYPE_ROW)

        # NCCL collectives move bytes here (uint8): NCCL has no 16-bit integer type, and the bytes are what counts.
        flat_out = torch.empty(W * lay.send_bytes, dtype=torch.uint8, device=dev)

        def nccl():
            _dist.all_gather_flat(flat_out, send)

        if impl == "nccl":

            def check():
                flat_out.fill_(255)
                nccl()
                torch.cuda.synchronize()
                return gpu.count_wrong_bits(flat_out.view(bits), flat_want)

            return Bench(nccl, check, note=f"torch.distributed.{_flat_name(self.dist, 'all_gather')}")

        # fsdp2: FSDP2's foreach_all_gather and foreach_all_gather_copy_out around the same NCCL call: every
        # parameter's shard (its own tensor, as FSDP2's sharded parameters are) copied into this rank's block of the
        # flat output, the all-gather in place from that block, the copy-out into each parameter's storage.
        sizes = [p.shard_numel for p in lay.params]
        shards = [send[p.send_offset : p.send_offset + n * case.dtype.size].view(cdt).clone()
                  for p, n in zip(lay.params, sizes)]
        flat_c = flat_out.view(cdt)
        copy_in = fsdp2_ops.all_gather_copy_in_impl()
        if copy_in is None:
            in_name = f"no torch.ops.fsdp.all_gather_copy_in in torch {torch.__version__}: input copied by one torch.cat"
            block = flat_c[me * S : (me + 1) * S]

            def gather_in():
                torch.cat(shards, out=block)
                return block

        else:
            in_name = copy_in[0]

            def gather_in():
                return copy_in[1](shards, flat_c, sizes, S, me)

        op_name, copy_out = fsdp2_ops.copy_out_impl()
        out = torch.empty(lay.slot_bytes, dtype=torch.uint8, device=dev)
        views = fsdp2_ops.param_views(out, lay, W, cdt)
        flat2d = flat_c.view(W, S)

        def fsdp2():
            _dist.all_gather_flat(flat_c, gather_in())
            copy_out(flat2d, sizes, views)

        def check():
            out.fill_(255)
            flat_out.fill_(255)
            fsdp2()
            torch.cuda.synchronize()
            return wrong_in(out)

        note = (f"copy-in: {in_name}; torch.distributed.{_flat_name(self.dist, 'all_gather')}; copy-out: {op_name}"
                + ("; inputs without NaNs (the CUDA copy-in canonicalises them)" if cdt.is_floating_point else ""))
        return Bench(fsdp2, check, note=note)

    def _nccl_ce(self, send_u8, flat_want, bits) -> Bench:
        """NCCL's CE AllGather: symmetric buffers registered as NCCL windows (torch symmetric memory, NCCL backend).
        Whether NCCL took the zero-CTA path shows in the SM column (0 us: no kernel)."""
        torch = _torch()
        if self.W < 2:
            raise Unavailable("not run: world size 1 (NCCL's CE AllGather copies between GPUs: run with >= 2 ranks)")
        v = torch.cuda.nccl.version()
        v = v if isinstance(v, tuple) else (v // 10000, (v % 10000) // 100, v % 100)
        if tuple(v[:2]) < (2, 28):
            raise Unavailable(f"not run: NCCL {'.'.join(map(str, v))} in torch; CE collectives need NCCL >= 2.28")
        try:
            import torch.distributed._symmetric_memory as symm
        except ImportError as e:
            raise Unavailable(f"not run: torch {torch.__version__} has no symmetric memory module ({e})") from None
        if not hasattr(symm, "set_backend"):
            raise Unavailable(f"not run: torch {torch.__version__} cannot put symmetric memory on NCCL windows")
        symm.set_backend("NCCL")
        group, policy = self._zero_cta_group()
        n = send_u8.numel()
        inp = symm.empty(n, dtype=torch.uint8, device=self.device)
        out = symm.empty(n * self.W, dtype=torch.uint8, device=self.device)
        symm.rendezvous(inp, group)
        symm.rendezvous(out, group)
        inp.copy_(send_u8)

        def call():
            _dist.all_gather_flat(out, inp, group=group)

        def check():
            out.fill_(255)
            call()
            torch.cuda.synchronize()
            return gpu.count_wrong_bits(out.view(bits), flat_want)

        note = f"symmetric windows (torch symm_mem, NCCL backend), {policy}; SM column 0 = no kernel (CE path)"
        return Bench(call, check, note=note)

    def _zero_cta_group(self):
        """A process group whose NCCL communicator has the zero-CTA policy (what torch documents for CE AllGather:
        ProcessGroupNCCL.Options().config.cta_policy = NCCL_CTA_POLICY_ZERO), created once; else the world group and
        whatever NCCL_CTA_POLICY the environment sets."""
        dist = self.dist
        if getattr(self, "_ce_group", None) is not None:
            return self._ce_group
        PG = getattr(dist, "ProcessGroupNCCL", None)
        zero = getattr(PG, "NCCL_CTA_POLICY_ZERO", None) if PG is not None else None
        if zero is not None:
            opts = PG.Options()
            opts.config.cta_policy = zero
            group = dist.new_group(backend="nccl", pg_options=opts)
            self._ce_group = (group, "dedicated group with cta_policy NCCL_CTA_POLICY_ZERO")
        else:
            pol = os.environ.get("NCCL_CTA_POLICY", "")
            self._ce_group = (dist.group.WORLD, f"NCCL_CTA_POLICY={pol or 'unset'} (torch has no cta_policy option)")
        return self._ce_group

    # -- reduce-scatter ----------------------------------------------------------------------
    def _rs(self, impl: str, case: CaseSpec) -> Bench:
        torch = _torch()
        dist, W, dev, me = self.dist, self.W, self.device, self.rank
        if impl == "nccl-ce":
            raise Unavailable("not run: NCCL's copy-engine collectives include no reduce-scatter")
        lay = self._layout(case, case.numels, case.rows)
        M = lay.rs_out_numel
        out_t = gpu.torch_dtype(case.out_dtype.name)
        all_grads = self._grads(case)
        tol = gpu.RS_TOL[case.out_dtype.name]
        grads = all_grads[me]
        cache = []

        def wrong_in(out) -> int:
            if not cache:
                cache.append(rs_reference(all_grads, lay, me, W, case.op, case.scale, out))
                all_grads[:] = [grads if s == me else None for s in range(W)]  # free the others
            return gpu.count_wrong_close(out, *cache[0], tol)  # tol: of the row's reduce type

        if impl == "tide":
            comm = self.comm()
            out = torch.empty(M, dtype=out_t, device=dev)

            def call():
                comm.reduce_scatter(lay, grads, out, op=case.op, scale=case.scale)

            def check():
                out.fill_(float("nan"))
                call()
                comm.synchronize(timeout=SYNC_TIMEOUT_S)
                torch.cuda.synchronize()
                return wrong_in(out)

            def prepare_issue():
                from ..dtypes import dtype as to_dtype
                from ..dtypes import op_code
                from . import issue_cost

                return issue_cost.prepare_comm_reduce_scatter(
                    comm, lay, grads, out, op_code(case.op), to_dtype(case.out_dtype.name).code, scale=case.scale
                )

            return Bench(call, check, prepare_issue=prepare_issue)

        # nccl, fsdp2: NCCL reduces in --out-type (fp32 by default, FSDP2's reduce_dtype); nccl-dtype: in -d's type
        # (bf16 grads reduced in bf16), the input never cast.
        red_name = case.dtype.name if impl == "nccl-dtype" else case.out_dtype.name
        if impl == "nccl-dtype" and red_name == case.out_dtype.name:
            raise Unavailable(f"not run: -d is --out-type ({red_name}): the nccl row already reduces in it")
        tol = gpu.RS_TOL[red_name]
        op_name, chunk_cat = fsdp2_ops.chunk_cat_impl()
        rsin = torch.empty(W * M, dtype=gpu.torch_dtype(red_name), device=dev)
        out = torch.empty(M, dtype=rsin.dtype, device=dev)
        if case.op == "premul":
            red = dist._make_nccl_premul_sum(case.scale)
        else:
            red = dist.ReduceOp.AVG if case.op == "avg" else dist.ReduceOp.SUM

        def copy_in():
            chunk_cat(grads, W, rsin.view(W, M))

        def nccl():
            _dist.reduce_scatter_flat(out, rsin, op=red)

        copy_in()  # nccl, nccl-dtype: the input already in the reduce type (its cast is not timed)
        call = (lambda: (copy_in(), nccl())) if impl == "fsdp2" else nccl

        def check():
            out.fill_(float("nan"))
            if impl == "fsdp2":
                rsin.fill_(float("nan"))
            call()
            torch.cuda.synchronize()
            return wrong_in(out)

        note = f"reduce type {red_name}; torch.distributed.{_flat_name(dist, 'reduce_scatter')}"
        if impl == "fsdp2":
            note += f"; copy-in: {op_name}"
        return Bench(call, check, note=note)


def make(average: int = 1) -> TorchrunBackend:
    """The backend, its process group up; a rank that cannot get its GPU or whose NCCL refuses ranks sharing a GPU
    ends the run with one line saying what to set (exit status 2)."""
    from ..errors import InvalidArgumentError, InvalidUsageError
    from .options import die

    try:
        return TorchrunBackend(average)
    except (InvalidArgumentError, InvalidUsageError) as e:
        die(e.detail)


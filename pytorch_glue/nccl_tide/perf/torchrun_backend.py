# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""torchrun backend of tide-perf: one process per rank, real NCCL communicators (torch.distributed, backend nccl).

    torchrun --nproc_per_node 8 -m nccl_tide.perf all_gather --impl tide,nccl,fsdp2,nccl-ce -b 1M -e 1G -f 2

Rank 0 prints. Per row: time = mean per call on each rank, averaged over ranks (-a 1, nccl-tests' default) or rank
0's (-a 0); #wrong summed over ranks. Every rank regenerates every rank's inputs from the seed, so each checks its
own output locally.

The backend runs whichever collective it is given; the collective's descriptor (perf/collective.py) makes the
buffers, checks the result and holds the calls:
* tide: nccl_tide.comm.Comm.from_process_group (tideCommCreate on the process group's ncclComm_t), through CommCalls;
* nccl: ncclAllGather / ncclReduceScatter on flat buffers (nccl_tide._dist: torch's all_gather_single /
  reduce_scatter_single, or the older *_tensor names); RS in --out-type of grads cast to it beforehand (fp32 by
  default: NCCL reduces in one type, which is why FSDP2 copies bf16 grads into fp32 first);
* nccl-dtype: reduce-scatter in -d's type (bf16 grads reduced in bf16, FSDP2 with reduce_dtype=bf16);
* fsdp2: the nccl call inside FSDP2's own copy ops (torch.ops.fsdp.*): all_gather_copy_in of each parameter's
  shard, the AG, split_with_sizes_copy copy-out; chunk_cat copy-in (-d -> --out-type) before the RS;
* nccl-ce: NCCL's AllGather on symmetric buffers (torch symmetric memory, NCCL backend, a zero-CTA group from
  zero_cta_group()); the row reports the kernels NCCL launched (0 SM time means the zero-CTA CE path ran).

Ranks may share GPUs when asked (--ranks-per-gpu / NCCL_TIDE_RANKS_PER_GPU; nccl_tide.devices): rank -> GPU
LOCAL_RANK % device count, and the header and the JSON carry devices.SHARED_GPU_CAVEAT.
"""

import os
import socket
from typing import List, Sequence

from ..devices import SHARED_GPU_CAVEAT
from . import gpu
from .runner import Bench, CaseSpec, Unavailable


def _torch():
    import torch

    return torch


class CommCalls:
    """TIDE's calls for this process's one rank, in loopback_backend.WorldCalls' shape: lists of one, this rank's."""

    def __init__(self, comm):
        self.comm = comm

    def alloc_slot(self, nbytes: int) -> list:
        return [self.comm.alloc_slot(nbytes)]

    def free_slot(self, slots) -> None:
        self.comm.free_slot(slots[0])

    def all_gather(self, layouts, slots, sendbufs) -> None:
        self.comm.all_gather(layouts[0], slots[0], sendbuf=sendbufs[0])

    def reduce_scatter(self, layouts, grads, outs, op: str, scale: float) -> None:
        self.comm.reduce_scatter(layouts[0], grads[0], outs[0], op=op, scale=scale)

    def synchronize(self, timeout: float) -> None:
        self.comm.synchronize(timeout=timeout)

    def prepare_all_gather(self, layouts, slots, sendbufs):
        from . import issue_cost

        return issue_cost.prepare_comm_all_gather(self.comm, layouts[0], slots[0], sendbufs[0])

    def prepare_reduce_scatter(self, layouts, grads, outs, op_code: int, out_code: int, scale: float):
        from . import issue_cost

        return issue_cost.prepare_comm_reduce_scatter(
            self.comm, layouts[0], grads[0], outs[0], op_code, out_code, scale=scale
        )


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

    # -- what a collective's descriptor runs on (perf/collective.py) -------------------------------------------------
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

    def tide(self) -> CommCalls:
        return CommCalls(self.comm())

    @property
    def mine(self) -> List[int]:
        return [self.rank]

    def layouts(self, case: CaseSpec, numels, rows) -> list:
        """This rank's Layout (ranks per node: NCCL_TIDE_RANKS_PER_NODE or the library's default)."""
        from ..layout import Layout

        return [Layout(numels, case.dtype.name, self.W, rank=self.rank, row_numels=rows)]

    def rank_generators(self, seed: int) -> list:
        """Rank s's generator, seeded from the seed and s: every process draws every rank's inputs alike."""
        torch = _torch()
        return [torch.Generator(device=self.device).manual_seed(seed * 1000 + s) for s in range(self.W)]

    def zero_cta_group(self):
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

    def bench(self, impl: str, case: CaseSpec) -> Bench:
        """TIDE's call of the case's collective, or its NCCL row for `impl`."""
        return case.collective.bench(impl, self, case, case.collective.nccl_rows)


def make(average: int = 1) -> TorchrunBackend:
    """The backend, its process group up; a rank that cannot get its GPU or whose NCCL refuses ranks sharing a GPU
    ends the run with one line saying what to set (exit status 2)."""
    from ..errors import InvalidArgumentError, InvalidUsageError
    from .options import die

    try:
        return TorchrunBackend(average)
    except (InvalidArgumentError, InvalidUsageError) as e:
        die(e.detail)


# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The native executor of nccl_tide.fsdp: TIDE-AG / TIDE-RS on CUDA through tideComm.

Same layout semantics as nccl_tide.reference_executor (same Layout objects, same packed send
buffer, same packed fp32 RS output, same ops 'sum' | 'avg' | 'premul'), but the data moves
through include/tide.h on the process group's own NCCL communicator
(Comm.from_process_group: tideCommCreate on ProcessGroupNCCL._comm_ptr()):

* all-gather: tideAllGather writes every rank's shards straight into the group's slot (a
  tideSlotAlloc region; each unsharded parameter is a view of it): no flat output buffer,
  no copy-out. The shards go in as a pointer table when they already have the parameter
  dtype; otherwise they are cast into one packed send buffer (FSDP2's copy #1, the cast).
* reduce-scatter: tideReduceScatter reads the per-parameter gradients in place and writes the
  fp32 packed output; staging is the group's vacated slot (Slot-Reuse) or the comm's own.

Every call is stream-ordered on the stream it is given (FSDP2's all-gather stream for AG,
its reduce-scatter stream for RS) and asynchronous; the caller records the events.

Slots are collective (every rank allocates in the same order): nccl_tide.fsdp allocates them
at enable(), between steps, never inside forward/backward. Importing this module imports
torch; creating an executor needs libnccl-tide.so built with CUDA and NCCL and a torch NCCL
process group on CUDA.
"""

import weakref
from collections.abc import Sequence
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .errors import InvalidArgumentError, UnsupportedError
from .layout import Layout

_comms: Dict[int, Tuple[weakref.ref, object]] = {}  # id(process group) -> (weakref or pg, Comm)


def backend_name(group: Optional[dist.ProcessGroup], device: torch.device) -> str:
    """The torch.distributed backend `group` uses for tensors on `device` ('nccl', 'gloo', ...)."""
    try:
        be = group._get_backend(device) if group is not None else None
        name = type(be).__name__.lower() if be is not None else ""
    except Exception:  # older torch or no backend for that device type
        name = ""
    for known in ("nccl", "gloo", "mpi", "ucc"):
        if known in name:
            return known
    b = str(dist.get_backend(group))
    for part in b.split(","):  # "cpu:gloo,cuda:nccl"
        if ":" in part:
            dev, be_name = part.split(":", 1)
            if dev == device.type:
                return be_name
    return b


def _comm_for(group: dist.ProcessGroup):
    """One tideComm per torch process group (tideCommCreate is collective: every rank of the
    group calls it, in the same order; nccl_tide.fsdp does it at enable())."""
    from .comm import Comm

    key = id(group)
    hit = _comms.get(key)
    if hit is not None:
        ref, comm = hit
        if ref() is group and comm._handle:
            return comm
    comm = Comm.from_process_group(group)
    try:
        ref = weakref.ref(group)
    except TypeError:  # not weak-referenceable: keep the group alive with the comm
        ref = (lambda g: lambda: g)(group)
    _comms[key] = (ref, comm)
    return comm


class NativeExecutor:
    """TIDE-AG and TIDE-RS of one rank on CUDA, through the tideComm of a NCCL process group."""

    name = "native"
    fast_path = True

    def __init__(self, group: dist.ProcessGroup, device: torch.device):
        if device.type != "cuda":
            raise UnsupportedError(f"executor='native' needs CUDA parameters, the group's device is {device}")
        be = backend_name(group, device)
        if be != "nccl":
            raise UnsupportedError(
                f"executor='native' needs a NCCL process group on CUDA (this group's backend for {device.type} is "
                f"{be!r}); use executor='reference' for other backends"
            )
        self.group = group
        self.device = device
        with torch.cuda.device(device):
            self.comm = _comm_for(group)  # raises TideError (tideCommCreate failed) or ImportError
        self.provider = self.comm.provider
        self._slots: List[torch.Tensor] = []

    def _on_device(self):
        import contextlib

        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def _check(self, layout: Layout) -> None:
        if layout.world_size != self.comm.world_size or layout.rank != self.comm.rank:
            raise InvalidArgumentError(
                f"layout is for rank {layout.rank} of {layout.world_size}, the comm is rank "
                f"{self.comm.rank} of {self.comm.world_size}"
            )

    # -- slots ---------------------------------------------------------------------------------
    def alloc_slot(self, nbytes: int) -> torch.Tensor:
        """tideSlotAlloc (collective): a uint8 CUDA tensor over the slot (not resizable)."""
        with self._on_device():
            slot = self.comm.alloc_slot(int(nbytes))
        self._slots.append(slot)
        return slot

    def free_slot(self, slot: torch.Tensor) -> None:
        """tideSlotFree (collective; synchronizes the device first)."""
        with self._on_device():
            self.comm.free_slot(slot)
        self._slots = [s for s in self._slots if s is not slot]

    # -- all-gather ----------------------------------------------------------------------------
    def pack(self, layout: Layout, shards: Sequence[torch.Tensor], out: Optional[torch.Tensor] = None):
        """AG input: the shards themselves (a list) when every shard already has the layout's
        dtype and is contiguous (tideAllGather's pointer table: no send buffer at all), else the
        packed send buffer (tide.h: shard i at sendOffset_i), cast while copying."""
        from .reference_executor import ReferenceExecutor, _uniform_dtype

        dt = _uniform_dtype(layout)
        for s, p in zip(shards, layout.params):
            if s.numel() != p.shard_numel:
                raise InvalidArgumentError(f"shard has {s.numel()} elements, layout needs {p.shard_numel}")
        if out is None and all(s.dtype == dt and s.is_contiguous() for s in shards):
            return list(shards)
        return ReferenceExecutor.pack(self, layout, shards, out)  # one foreach copy, cast fused

    def all_gather(self, layout: Layout, send, slot: torch.Tensor, stream) -> int:
        """TIDE-AG on `stream` into `slot` (the uint8 slot region of this layout). `send` is
        what pack() returned. Returns the bytes of temporary buffers (0)."""
        self._check(layout)
        if isinstance(send, list):
            self.comm.all_gather(layout, slot, shards=send, stream=stream)
        else:
            self.comm.all_gather(layout, slot, sendbuf=send, stream=stream)
        return 0

    # -- reduce-scatter ------------------------------------------------------------------------
    @staticmethod
    def staging_bytes(layout: Layout) -> int:
        """Bytes of slot the RS plan needs as staging (tide.h rsStagingBytes: independent of world size)."""
        return layout.rs_staging_bytes

    def reduce_scatter(
        self,
        layout: Layout,
        grads: Sequence[torch.Tensor],
        out: torch.Tensor,
        op: str = "sum",
        scale: float = 1.0,
        staging: Optional[torch.Tensor] = None,
        stream=None,
    ) -> int:
        """TIDE-RS on `stream`: grads[i] (numel_i elements, contiguous, one dtype), out (rs_out_numel
        fp32/bf16/fp16), staging a slot region of >= rs_staging_bytes or None (the comm's own).
        Returns the bytes of temporary buffers (0)."""
        self._check(layout)
        if op not in ("sum", "avg", "premul"):
            raise InvalidArgumentError(f"op {op!r}: use 'sum', 'avg' or 'premul'")
        self.comm.reduce_scatter(layout, list(grads), out, op=op, scale=float(scale), staging=staging, stream=stream)
        return 0

    def close(self) -> None:
        """Frees this executor's slots (collective)."""
        for s in list(self._slots):
            self.free_slot(s)


__all__ = ["NativeExecutor", "backend_name"]

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""A simulated tideComm on CPU/gloo for the native executor's FSDP2 glue (tests and the
CPU pool check of fsdp_step.py): nccl_tide.fsdp.enable(executor="native")
runs its real slot, pool, event and Slot-Reuse code while data moves with the reference
executor (torch.distributed collectives). Not a fast path, not a CUDA path.
"""


class SimComm:
    """Stands in for nccl_tide.comm.Comm on CPU/gloo, so the native executor's FSDP2 glue (slot
    from tideSlotAlloc that torch cannot resize, release events, Slot-Reuse staging, world-1
    path, shard pointer table) runs in CI. Slots are torch.frombuffer memory: like a TIDE slot,
    its storage is not resizable, so an FSDP2 free_storage reaching it raises. Data moves with
    the reference executor, written through an alias with its own version counter (a real
    tideAllGather writes outside autograd). Staging handed to reduce_scatter is filled with
    NaN first: a parameter read from a slot that still holds staging would show in the loss;
    so is the whole slot region before an all-gather writes it (an element the AG does not
    write shows). Counts slot bytes (live, peak) and the slot addresses the AG wrote into."""

    def __init__(self, group):
        import torch.distributed as dist
        from nccl_tide.reference_executor import ReferenceExecutor

        self.ref = ReferenceExecutor(group)
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.provider = "sim"
        self._handle = 1
        self.live_slots = 0
        self.staging_used = 0
        self.live_bytes = self.peak_bytes = 0
        self.slots = {}  # data_ptr -> nbytes of every live slot
        self.ag_ptrs = set()  # slot addresses TIDE-AG wrote into
        self.ag_in_place = 0  # shards a TIDE-AG found in their own slot position (the cast in place)
        self.staging_ptrs = set()
        self.freed_empty = 0  # free_slot on a slot whose memory was not back in its tensor
        self.slot_allocs = self.slot_frees = 0  # tideSlotAlloc / tideSlotFree calls (each free: a device synchronize)
        self.foreign_ag = self.foreign_staging = 0  # world size 1: AGs into / RS staging in memory that is no slot

    @staticmethod
    def _alias(u8, dtype):
        import torch

        a = torch.empty(0, dtype=torch.uint8).set_(u8.untyped_storage(), 0, (u8.numel(),))
        return a.view(dtype)

    def alloc_slot(self, nbytes):
        import torch

        self.live_slots += 1
        self.slot_allocs += 1
        t = torch.frombuffer(bytearray(nbytes), dtype=torch.uint8)
        self.slots[t.data_ptr()] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return t

    def free_slot(self, slot):
        self.live_slots -= 1
        self.slot_frees += 1
        self.freed_empty += slot.untyped_storage().nbytes() != slot.numel()
        self.live_bytes -= self.slots.pop(slot.data_ptr(), 0)

    def all_gather(self, layout, slot, sendbuf=None, shards=None, stream=None):
        import torch
        from nccl_tide.reference_executor import _uniform_dtype

        dt = _uniform_dtype(layout)
        ptr = slot.data_ptr()
        if self.slots.get(ptr, 0) < layout.slot_bytes:
            # the library's rule (slotRegion): at world size 1 any device memory is a slot region, else a live slot
            assert self.world_size == 1, "TIDE-AG into memory that is not a live slot"
            assert slot.untyped_storage().nbytes() >= layout.slot_bytes, "TIDE-AG into memory smaller than the slot"
            self.foreign_ag += 1
        self.ag_ptrs.add(ptr)
        # The shards are read first: this rank's may lie in its own slot position (in place, as tide.h allows),
        # which the poison below would overwrite. Any other overlap with the slot is refused, as the library does.
        if shards is not None:
            r = self.rank
            for s_, p in zip(shards, layout.params):
                own = ptr + p.slot_offset + r * p.shard_numel * p.elem_size
                lo, hi = s_.data_ptr(), s_.data_ptr() + s_.numel() * s_.element_size()
                if lo == own and s_.element_size() == p.elem_size:
                    self.ag_in_place += 1
                else:
                    assert hi <= ptr or lo >= ptr + layout.slot_bytes, "TIDE-AG shard overlaps the slot"
        send = sendbuf if sendbuf is not None else self.ref.pack(layout, shards)
        self._alias(slot, torch.uint8).narrow(0, 0, layout.slot_bytes).fill_(0xFF)  # poison: bf16/fp32 NaN
        flat = self._alias(slot, dt)
        W = layout.world_size
        views = [flat.narrow(0, p.slot_offset // p.elem_size, p.shard_numel * W) for p in layout.params]
        self.ref.all_gather(layout, send, views)
        self.ag_shards = self.__dict__.get("ag_shards", 0) + (shards is not None)

    def reduce_scatter(self, layout, grads, out, op="sum", scale=1.0, staging=None, stream=None):
        import torch

        if staging is not None:
            assert staging.numel() >= layout.rs_staging_bytes
            if self.slots.get(staging.data_ptr(), 0) < layout.rs_staging_bytes:
                assert self.world_size == 1, "staging outside a live slot"
                assert staging.untyped_storage().nbytes() >= layout.rs_staging_bytes, "staging smaller than needed"
                self.foreign_staging += 1
            self.staging_ptrs.add(staging.data_ptr())
            self._alias(staging, torch.uint8).narrow(0, 0, layout.rs_staging_bytes).fill_(0xFF)  # bf16/fp32 NaN
            self.staging_used += 1
        self.ref.reduce_scatter(layout, grads, out, op=op, scale=scale)


def use_sim_native():
    """executor='native' builds a NativeExecutor over _SimComm (enable()'s own code otherwise)."""
    import nccl_tide.fsdp as tfsdp
    from nccl_tide.native_executor import NativeExecutor
    from nccl_tide.reference_executor import get_executor

    comms = {}

    def sim_get_executor(name, group=None, device=None):
        if name != "native":
            return get_executor(name, group, device)
        ex = NativeExecutor.__new__(NativeExecutor)
        ex.group, ex.device, ex._slots = group, device, []
        ex.comm = comms.setdefault(id(group), SimComm(group))
        ex.provider = ex.comm.provider
        return ex

    tfsdp.get_executor = sim_get_executor
    return comms

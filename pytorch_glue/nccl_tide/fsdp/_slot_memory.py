# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Slot memory accounting over the process's live pools: the slot bytes resident now (resident_bytes; the part TIDE
allocated: tide_resident_bytes), the part torch's counters miss now (outside_torch_bytes: the handle's
stats()["slot_pool"]["outside_torch_bytes"], docs/fsdp.md), hooks told of every slot allocation and free
(residency_hooks), and a peak meter of torch's allocations plus the slot bytes outside torch (MemoryMeter, read at
every bind and unbind)."""

import weakref
from typing import List, Optional

import torch

_live_pools: "weakref.WeakSet" = weakref.WeakSet()  # every SlotPool not yet freed


class MemoryMeter:
    """Peak device bytes = max over time of torch.cuda.memory_allocated() + slot bytes torch does
    not count at that moment (every slot for the swap binder and dedicated slots; unbound slots
    for the alloc binder). torch's peak counter is read and reset at every bind and unbind, so
    between two such events the slot bytes outside torch are constant and the sum is exact."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0
        self.events = 0
        torch.cuda.reset_peak_memory_stats(device)

    def event(self) -> None:
        self.events += 1
        self.peak = max(self.peak, torch.cuda.max_memory_allocated(self.device) + outside_torch_bytes())
        torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> int:
        return max(self.peak, torch.cuda.max_memory_allocated(self.device) + outside_torch_bytes())


_meter: Optional[MemoryMeter] = None


def start_meter(device) -> MemoryMeter:
    global _meter
    _meter = MemoryMeter(torch.device(device))
    return _meter


def stop_meter() -> Optional[MemoryMeter]:
    global _meter
    m, _meter = _meter, None
    return m


def outside_torch_bytes() -> int:
    """Slot bytes allocated by TIDE that torch.cuda.memory_allocated() does not include now."""
    total = 0
    for p in list(_live_pools):
        if p.binder is not None and p.binder.owns_memory:  # torch's own memory (_TorchBinder): in its counters
            continue
        for s in p.slots:
            if s.live and not (p.binder is not None and p.binder.counts_in_torch and s.owner is not None):
                total += s.capacity
    return total


def resident_bytes() -> int:
    """Slot bytes of every live pool of the process allocated now (bound or not; tideSlotAlloc'd or, _TorchBinder,
    torch's)."""
    return sum(p.resident_bytes() for p in list(_live_pools))


def tide_resident_bytes() -> int:
    """The part of resident_bytes() that TIDE allocated (tideSlotAlloc), outside torch's caching allocator."""
    return sum(p.resident_bytes() for p in list(_live_pools) if not (p.binder is not None and p.binder.owns_memory))


# Called as hook(tide_resident_bytes()) after every slot allocation and free of a pool (enable(), trims, regrows,
# disable()); benchmarks/fsdp_memory_probe.py puts a marker into torch's memory trace there. Slots of torch memory
# (_TorchBinder) are in the trace itself: the hook's bytes leave them out.
residency_hooks: List = []


def _resident_changed() -> None:
    if residency_hooks:
        now = tide_resident_bytes()
        for h in list(residency_hooks):
            h(now)


def _tick() -> None:
    if _meter is not None:
        _meter.event()

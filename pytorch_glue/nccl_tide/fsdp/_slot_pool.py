"""Slots of the native executor: a shared pool for groups that reshard, dedicated slots for the rest.

A slot is a tideSlotAlloc region (collective: every rank allocates and frees in the same order,
at enable() / disable(), never inside forward/backward). A group's unsharded parameters are views
of the group's own torch storage (GroupState.store, empty while the group is sharded); at each
TIDE all-gather the group *acquires* a slot and a binder puts the slot's memory under that
storage, in place (the same StorageImpl, so autograd's saved views of the parameters see it,
exactly as they see FSDP2's resize_ of its own storage); at reshard (FSDP2's free_storage,
patched) the binder takes it away again and the slot is free. Two binders, one pool:

* "alloc" (every torch with torch.cuda.MemPool, torch 2.11 included; the default on CUDA): each
  slot has its own torch.cuda.MemPool whose allocator is TIDE's slot allocator (_SlotAllocator:
  it hands torch the pointer of the slot being bound, nothing else). Binding is FSDP2's own
  alloc_storage move, store.resize_(n), inside torch.cuda.use_mem_pool(slot's pool); unbinding is
  FSDP2's free_storage move, store.resize_(0) (the block goes back to the slot's MemPool, whose one
  segment is the slot). torch counts a bound slot in memory_allocated(); the slot's memory is
  also reachable through Slot.base at all times (RS staging uses it while no group holds it).
  Slots are sized to the segment the caching allocator asks for (alloc_request()). On CPU (the
  simulated comm of the tests) the same allocator runs under an emulation of the MemPool move
  (_CpuAllocBinder: a second storage over the slot's memory swapped into the store).
* "swap" (torch >= 2.12: UntypedStorage._swap_data_ptr_): the slot's memory is swapped into the
  storage and back; torch never sees it; Slot.base is empty while the slot is owned.

Acquisition rule (SlotPool.acquire): the first free slot in index order starting at the pool's
cursor (round-robin), the cursor then moves past it. A slot is owned from the acquiring AG to the
owner's reshard. The rule reads only state that changes at AG and reshard calls, which FSDP2 runs
in the same program order on every rank, so every rank picks the same slot index, or finds none
free and falls back to stock FSDP2 for that all-gather (docs/fsdp.md, "Slot pool").

Trimming (SlotPool(trim=True); enable(slot_trim=...), default on where the shard world size is 1): resident
slots are given back between the phases of a step. FSDP2 holds no pooled group from the last reshard of forward to
the first all-gather of backward (the loss, the head and its backward run there: the usual peak of a step) and from
the last reshard of backward to the next forward (the optimizer step); a pool that keeps its K slots allocated in
the first gap costs K slots at that peak, which stock FSDP2 does not pay (issue 17). The pool learns these idle
points from the schedule itself: a release that leaves no slot held, followed by an acquire of the other phase
(forward vs backward, FSDP2's TrainingState of the groups), is a trim point; from then on, reaching it frees every
unbound slot (tideSlotFree, after the releasing group's RS at the end of backward, so Slot-Reuse keeps its staging
slot), and an acquire that finds no live free slot allocates one again (tideSlotAlloc) at its index.

Which idle points trim is SlotPool.trim_phases (by the phase of the release that opens the gap; one code path for
both settings). TRIM_DEFAULT (enable's slot_trim=True, and None where it resolves to on): the end of forward only,
where the peak lies. The end-of-backward gap holds only the optimizer step, below that peak in the usual
configuration, so trimming there lowers no peak and costs a device synchronize and a cudaFree per slot, and a
cudaMalloc per slot when the next forward regrows it, every step. TRIM_ALL (slot_trim="all", for runs whose peak
is the optimizer step): both points; the groups FSDP2 does not pool (e.g. the root) then also get a trimming pool
of one slot of their own (SlotPool.solo), whose only idle point is the end of backward.

At shard world size 1 a trimming pool's slots are torch memory (_TorchBinder, binder "torch"; the library takes any
device memory as a slot there): a trim drops the slot's block into torch's caching allocator on the home stream
(the one the step computes on), where the head, the loss and their backward reuse the bytes as stock FSDP2 reuses
its resharded parameters; a regrow allocates from that cache again. Stream-ordered both ways (the ordering argument
is _TorchBinder's docstring): no device synchronize, no tideSlotFree / tideSlotAlloc, no cudaFree / cudaMalloc in
the steady state, and torch counts each slot exactly once (outside_torch_bytes() leaves them out).

Slots are never freed while held, while torch still holds their segment (alloc binder: the slot's MemPool is
dropped and torch's cache emptied first), and tideSlotFree synchronizes the device first (no queued AG, RS or copy
still touches them); a torch-memory slot goes back to torch only after the home stream waited for its events. Both calls are collective: the decisions read only state that changes at AG, reshard and RS
calls, the same on every rank as the acquire rule (below), so every rank frees and allocates the same indices in
the same order. At world size 1 nothing else maps a slot; at world > 1 each trim and regrow is an IPC exchange
(handles opened and closed by every peer, barriers), correct under the same rank-consistency rule but milliseconds
per slot per step, and a rank-local allocation failure there breaks the collective: opt-in only (docs/fsdp.md,
"Trimming").

GPU ordering: each slot keeps the events its next writer must wait for (the last AG into it, the
release event recorded on the compute stream at reshard, the RS that used it as staging); a writer
makes its stream wait for them (never the host) and then leaves its own completion event.
"""

import ctypes
import itertools
import weakref
from typing import List, Optional

import torch

from ._warn import warn_once

SWAP_SUPPORTED = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
MEMPOOL_SUPPORTED = hasattr(torch.cuda, "MemPool") and hasattr(torch._C, "_cuda_customAllocator")
BINDERS = ("alloc", "swap", "torch")
_forced: Optional[str] = None  # tests: force a binder (force_binder)
# tests on tiny models: pool even where K slots of the allocator's segment size cost more than a
# dedicated slot per group (build_pools refuses that otherwise)
POOL_SMALL_GROUPS = False


def force_binder(name: Optional[str]) -> None:
    """Tests and benchmarks: use binder `name` ('alloc', 'swap' or 'torch') for pools built from now on;
    None: the default (torch for trimming pools at shard world size 1; else alloc where it works, else swap)."""
    global _forced
    if name is not None and name not in BINDERS:
        raise ValueError(f"binder {name!r}: use one of {BINDERS} or None")
    _forced = name


# -- the caching allocator's segment rule (c10 CUDACachingAllocator: round_size, get_allocation_size)
_MIN_BLOCK = 512
_SMALL_SIZE = 1 << 20
_SMALL_BUFFER = 2 << 20
_MIN_LARGE_ALLOC = 10 << 20
_LARGE_BUFFER = 20 << 20
_ROUND_LARGE = 2 << 20


def block_size(nbytes: int) -> int:
    """The caching allocator's block rounding (round_size, default settings)."""
    return max(_MIN_BLOCK, -(-int(nbytes) // _MIN_BLOCK) * _MIN_BLOCK)


def alloc_request(nbytes: int) -> int:
    """Bytes torch's caching allocator asks a pool's allocator for when a storage of `nbytes`
    is resized in an empty MemPool (default allocator settings; another rounding configured in
    PYTORCH_CUDA_ALLOC_CONF shows as a refused request and a warning: _SlotAllocator)."""
    r = block_size(nbytes)
    if r <= _SMALL_SIZE:
        return _SMALL_BUFFER
    if r < _MIN_LARGE_ALLOC:
        return _LARGE_BUFFER
    return -(-r // _ROUND_LARGE) * _ROUND_LARGE


class BindError(RuntimeError):
    """The binder could not put a slot's memory under a group's storage (stock AG for that call)."""


class _SlotAllocator:
    """The allocator of every slot's MemPool: it returns the slot being bound (armed) when torch
    asks for no more than the slot holds, else 0 (torch then raises its out-of-memory error,
    which bind() turns into BindError). free() returns nothing to anyone: the memory is the
    slot's until tideSlotFree."""

    def __init__(self):
        self.armed = None  # (ptr, capacity, slot) during a bind
        self.by_ptr = {}  # slot pointer -> the Slot it was last granted to
        self.refused = []  # (requested, capacity, why)
        self.calls = 0

    def alloc(self, size, device=0, stream=None):
        self.calls += 1
        if self.armed is None:
            self.refused.append((int(size), 0, "no slot armed"))
            return 0
        ptr, cap, slot = self.armed
        slot.segment_allocs += 1
        if size > cap:
            self.refused.append((int(size), cap, "larger than the slot"))
            return 0
        if slot.in_torch:  # torch still holds this slot's segment (e.g. a free deferred by record_stream)
            self.refused.append((int(size), cap, "segment still held"))
            return 0
        slot.in_torch = True
        self.by_ptr[ptr] = slot
        return ptr

    def free(self, ptr, size=0, device=0, stream=None):
        slot = self.by_ptr.pop(ptr, None)
        if slot is not None:
            slot.in_torch = False


class _Binder:
    name = ""
    counts_in_torch = False  # a bound slot shows in torch.cuda.memory_allocated()
    base_while_owned = False  # Slot.base still holds the memory while a group owns the slot
    owns_memory = False  # the binder allocates and frees the slots' memory itself (torch's), not tideSlotAlloc

    def capacity(self, nbytes: int) -> int:
        return int(nbytes)

    def prepare(self, slot) -> None:
        pass

    def bind(self, store: torch.UntypedStorage, slot) -> None:
        raise NotImplementedError

    def unbind(self, store: torch.UntypedStorage, slot) -> None:
        raise NotImplementedError

    def close(self, slot) -> None:
        pass

    def closed(self) -> None:
        pass

    def check(self, slot) -> None:
        """Bind and unbind a probe storage once (at enable(), between steps): the slot's memory
        must land under the storage, pointer for pointer."""
        probe = torch.empty(0, dtype=torch.uint8, device=slot.base.device).untyped_storage()
        self.bind(probe, slot)
        try:
            got = probe.data_ptr()
        finally:
            self.unbind(probe, slot)
        if got != slot.ptr:
            raise BindError(f"{self.name} binder put memory at {got:#x} under the storage, not the slot at {slot.ptr:#x}")


class _SwapBinder(_Binder):
    name = "swap"

    def bind(self, store, slot):
        store._swap_data_ptr_(slot.base.untyped_storage())

    def unbind(self, store, slot):
        store._swap_data_ptr_(slot.base.untyped_storage())


class _TorchBinder(_Binder):
    """Shard world size 1 with trimming (issue 17): the slots are torch caching-allocator memory on the pool's home
    stream (the current stream at enable(): the one FSDP2 computes on and allocates its unsharded parameters and the
    step's activations on), not tideSlotAlloc regions. Nothing maps a slot at world size 1, so TIDE takes any device
    memory as a slot there (include/tide.h; the library's slotRegion). A trim is then dropping the memory: the
    caching allocator hands the bytes to the next allocations on the home stream (the loss, the head and their
    backward: the step's peak), exactly as stock FSDP2's resharded parameters; a regrow is a torch allocation from
    the same cache. No device synchronize, no cudaFree/cudaMalloc in the steady state, nothing outside torch's
    counters (counts_in_torch: torch counts each slot once, bound or not; outside_torch_bytes() leaves them out).

    Memory. Every slot's block has exactly one torch owner at a time: Slot.base's storage (the slot's holder) while
    no group holds the slot (RS staging then uses it), the group's `store` while a group holds it. torch < 2.12 has
    no way to move a block between two storages, so a move is a free followed at once by an allocation of the same
    size on the same stream (`_torch_slot_memory`): the allocator's best fit returns the block just freed (the pool's
    sizes are the allocator's own segment sizes, so no split or merge changes it), and torch never counts it twice.

    Stream ordering (why no device synchronize is needed). The caching allocator reuses a block freed on stream H
    for later allocations on H without any wait: safe for H's own work (stream order), not for work other streams
    still have queued on it. A slot's block is used on three streams: FSDP2's all-gather stream (TIDE-AG writes it),
    H (the parameters are read there, up to the release event of the reshard) and the reduce-scatter stream (RS
    staging, Slot-Reuse). Slot.events holds what a writer must wait for: the last AG, the release event, the last RS
    that staged there. Hence:
      * moves: while the block comes back (same pointer) it never became visible to any other allocation (the free and
        the allocation follow each other on the thread that runs FSDP2's hooks), and the slot's events keep ordering
        its next writer exactly as for a tideSlotAlloc slot. When the allocator returns another block, H first waits
        for every event of the slot (`_moved`): whatever later allocation on H gets the old block is ordered after the
        AG, the reads and the RS that used it; the new block was last used by H work queued before the allocation, so
        the slot's events become one event recorded on H after that wait.
      * trim and free (release_memory): H waits for the slot's events (at the end of forward they are the AG, which H
        already waited for before reading, and the release event, recorded on H: nothing to wait for in practice; at
        the end of backward the last RS, which FSDP2's finalize waits for on H anyway), then the block is dropped.
      * regrow and creation (new_memory): the block may be bytes H's work used a moment ago (the activations of the
        head): the slot's events are one event recorded on H after the allocation, so the AG waits for that work on
        the GPU (the host never waits). This is the one cost of sharing the bytes: the first backward AG after a trim
        starts when the work queued on H before it has run.
    A block a move (or a trim) returns to torch is reused only by allocations made after these waits were enqueued
    on H; only another thread allocating on H in the instant between a free and the allocation that follows could
    take it earlier (FSDP2 issues unshard and reshard from the one thread that runs forward or backward).
    """

    name = "torch"
    counts_in_torch = True
    owns_memory = True

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.home = torch.cuda.current_stream(self.device) if self.cuda else None
        self.moves = 0  # blocks moved between a slot's holder and a group's storage
        self.moved = 0  # moves whose allocation returned another block than the one just freed (home waited)
        self.allocs = 0  # slots' blocks allocated (creation and regrows)
        self.frees = 0  # slots' blocks dropped (trims and free)

    def capacity(self, nbytes):
        return alloc_request(nbytes) if self.cuda else block_size(nbytes)

    def _stream(self):
        import contextlib

        return torch.cuda.stream(self.home) if self.cuda else contextlib.nullcontext()

    def _home_event(self):
        return self.home.record_event() if self.cuda else None

    def _home_waits(self, events) -> None:
        if self.cuda:
            for ev in events:
                if ev is not None:
                    self.home.wait_event(ev)

    def new_memory(self, capacity: int) -> torch.Tensor:
        """A new slot's holder (creation, regrow): `capacity` bytes from torch's cache on the home stream."""
        with self._stream():
            base = torch.empty(int(capacity), dtype=torch.uint8, device=self.device)
        self.allocs += 1
        return base

    def fresh_events(self) -> list:
        """What the first writer of a new_memory block waits for: the home stream's work queued so far."""
        ev = self._home_event()
        return [ev] if ev is not None else []

    def release_memory(self, slot) -> None:
        """Trim / free: the block goes back to torch's cache after the home stream waited for its users."""
        self._home_waits(slot.events)
        slot.base.untyped_storage().resize_(0)
        self.frees += 1

    def _torch_slot_memory(self, src: torch.UntypedStorage, dst: torch.UntypedStorage, slot) -> None:
        """Moves the slot's block from storage `src` to storage `dst` (free, then the same size again)."""
        old = src.data_ptr()
        with self._stream():
            src.resize_(0)
            dst.resize_(slot.capacity)
        self.moves += 1
        new = dst.data_ptr()
        if new != old:  # the old block is torch's now: order its next user after everything that used it
            self.moved += 1
            self._home_waits(slot.events)
            slot.events = self.fresh_events()
            slot.ptr = new

    def bind(self, store, slot):
        self._torch_slot_memory(slot.base.untyped_storage(), store, slot)

    def unbind(self, store, slot):
        self._torch_slot_memory(store, slot.base.untyped_storage(), slot)

    def check(self, slot) -> None:
        """A move keeps the slot's capacity wherever the allocator puts it: nothing to check by pointer."""
        probe = torch.empty(0, dtype=torch.uint8, device=self.device).untyped_storage()
        self.bind(probe, slot)
        self.unbind(probe, slot)
        if slot.base.untyped_storage().nbytes() != slot.capacity:
            raise BindError(f"torch binder: slot {slot.index} holds {slot.base.untyped_storage().nbytes()} B after a move")


_cuda_allocator = None  # (SlotAllocator, torch allocator, ctypes callbacks): one per process, never freed


def _cuda_slot_allocator():
    """The process's slot allocator as a torch CUDA allocator. Created once and kept for the life of
    the process: torch may call it whenever it releases a MemPool's segment, even after the pool that
    used it is gone (a freed ctypes callback would then crash)."""
    global _cuda_allocator
    if _cuda_allocator is None:
        alloc_fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        free_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
        sa = _SlotAllocator()
        # torch calls these from the allocating thread (ours, holding the GIL) only when a slot's
        # MemPool has no cached segment: at the first bind of each slot (enable(), check()) and
        # after torch released the segment (a freed pool, out of memory)
        c_alloc = alloc_fn(lambda size, dev, stream: sa.alloc(size, dev, stream))
        c_free = free_fn(lambda ptr, size, dev, stream: sa.free(ptr, size, dev, stream))
        ta = torch._C._cuda_customAllocator(
            ctypes.cast(c_alloc, ctypes.c_void_p).value, ctypes.cast(c_free, ctypes.c_void_p).value
        )
        _cuda_allocator = (sa, ta, c_alloc, c_free)
    return _cuda_allocator


class _CudaAllocBinder(_Binder):
    """torch.cuda.MemPool per slot, allocator = the process's _SlotAllocator (module docstring)."""

    name = "alloc"
    counts_in_torch = True
    base_while_owned = True

    def __init__(self):
        self.allocator, self._torch_allocator = _cuda_slot_allocator()[:2]
        self._streams = {}

    def capacity(self, nbytes):
        return alloc_request(nbytes)

    def prepare(self, slot):
        slot.mempool = torch.cuda.MemPool(self._torch_allocator, no_split=True)

    def _stream(self, device):
        # one allocation stream per device: the caching allocator reuses a freed block only for an
        # allocation on the stream it was allocated on; GPU ordering is the slot's events' job
        if device.index not in self._streams:
            self._streams[device.index] = torch.cuda.default_stream(device)
        return self._streams[device.index]

    def bind(self, store, slot):
        dev = slot.base.device
        self.allocator.armed = (slot.ptr, slot.capacity, slot)
        try:
            with torch.cuda.use_mem_pool(slot.mempool, device=dev), torch.cuda.stream(self._stream(dev)):
                store.resize_(slot.nbytes)
        except RuntimeError as e:  # torch.OutOfMemoryError: the allocator refused (see .refused)
            why = self.allocator.refused[-1] if self.allocator.refused else None
            raise BindError(f"torch.cuda.MemPool of slot {slot.index}: {why or e}") from e
        finally:
            self.allocator.armed = None
        if store.data_ptr() != slot.ptr:
            store.resize_(0)
            raise BindError(f"MemPool gave {store.data_ptr():#x}, not the slot at {slot.ptr:#x}")

    def unbind(self, store, slot):
        store.resize_(0)  # FSDP2's free_storage: the block returns to the slot's MemPool

    def close(self, slot):
        slot.mempool = None  # the MemPool goes; torch releases its segment (_SlotAllocator.free) when it frees the pool

    def closed(self) -> None:
        # every slot's MemPool is gone: ask torch to release cached segments now, before tideSlotFree
        # (disable(), between steps; tideSlotFree synchronizes the device anyway)
        torch.cuda.empty_cache()


class _CpuAllocBinder(_Binder):
    """CPU emulation of _CudaAllocBinder for the simulated comm of the tests (CPU torch has no
    MemPool): the same _SlotAllocator decides, and a second storage over the slot's memory takes
    the place of the caching allocator's block (swapped into the store: the store's own
    StorageImpl gets the slot's pointer, Slot.base keeps it too). Needs _swap_data_ptr_."""

    name = "alloc"
    base_while_owned = True

    def __init__(self):
        self.allocator = _SlotAllocator()

    def capacity(self, nbytes):
        return block_size(nbytes)  # CPU memory has no segments: the block rounding only

    def bind(self, store, slot):
        self.allocator.armed = (slot.ptr, slot.capacity, slot)
        try:
            ptr = self.allocator.alloc(block_size(slot.nbytes))
        finally:
            self.allocator.armed = None
        if ptr != slot.ptr:
            raise BindError(f"slot allocator refused: {self.allocator.refused[-1]}")
        alias = torch.from_dlpack(slot.base.detach()).untyped_storage()  # same memory, its own StorageImpl
        store._swap_data_ptr_(alias)

    def unbind(self, store, slot):
        empty = torch.empty(0, dtype=torch.uint8).untyped_storage()
        store._swap_data_ptr_(empty)  # `empty` now holds the alias; dropped with it
        self.allocator.free(slot.ptr)  # the emulated pool caches nothing: the segment goes back at once


def make_binder(device: torch.device, torch_memory: bool = False) -> tuple:
    """(binder, "") for pools on `device`, or (None, why none works on this torch). `torch_memory`: the pool trims at
    shard world size 1, where its slots are torch memory (_TorchBinder) unless another binder is forced."""
    want = _forced
    if want == "torch" or (want is None and torch_memory):
        return _TorchBinder(device), ""
    if device.type == "cuda":
        if want in (None, "alloc") and MEMPOOL_SUPPORTED:
            return _CudaAllocBinder(), ""
        if want in (None, "swap") and SWAP_SUPPORTED:
            return _SwapBinder(), ""
    elif SWAP_SUPPORTED:
        return (_SwapBinder() if want == "swap" else _CpuAllocBinder()), ""
    return None, (
        f"torch {torch.__version__} on {device.type} has neither torch.cuda.MemPool with a custom allocator nor "
        "UntypedStorage._swap_data_ptr_" + (f" (binder {want!r} forced)" if want else "")
    )


# -- memory accounting for benchmarks: peak of torch's allocations plus slot memory outside torch
_live_pools: "weakref.WeakSet[SlotPool]" = weakref.WeakSet()


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


# The idle points a trimming pool may free its slots at, named by the phase of the release that opens the idle gap
# (the acquire that closes it belongs to the other phase).
END_OF_FORWARD = "F"  # last forward reshard -> first backward AG: the head, the loss, their backward (the usual peak)
END_OF_BACKWARD = "B"  # last backward reshard (after its RS) -> the next forward AG: the optimizer step
TRIM_AT_NAMES = {END_OF_FORWARD: "end of forward", END_OF_BACKWARD: "end of backward"}
# slot_trim=True / None: the end of forward only. The end-of-backward gap spans only the optimizer step, below the
# backward-start peak in the usual configuration, so freeing the slots there lowers no peak and costs, per step, a
# device synchronize + cudaFree per slot and a cudaMalloc per slot when the next forward regrows them (H200, world
# size 1, 4 Llama layers, slot_pool=2, both points trimmed: 140.63 ms/step against stock's 129.42).
TRIM_DEFAULT = frozenset({END_OF_FORWARD})
# slot_trim="all": both points (runs whose peak is the optimizer step; the own one-slot pools of the root and the
# reshard_after_forward=False blocks have only the end-of-backward point).
TRIM_ALL = frozenset({END_OF_FORWARD, END_OF_BACKWARD})


def trim_at(phases) -> List[str]:
    """The idle points `phases` trims at, in schedule order, by name (stats()["trim_at"])."""
    return [TRIM_AT_NAMES[p] for p in (END_OF_FORWARD, END_OF_BACKWARD) if p in phases]


def _tick() -> None:
    if _meter is not None:
        _meter.event()


class Slot:
    """One tideSlotAlloc region of `capacity` bytes (>= nbytes: the binder's segment rule).
    `base` (a uint8 tensor over the region) holds the memory while the slot is free, and also
    while it is owned where binder.base_while_owned; the owner's storage holds it while owned."""

    def __init__(self, pool: "SlotPool", index: int, base: torch.Tensor, nbytes: int):
        self.pool = pool
        self.index = index
        self.base = base
        self.ptr = int(base.data_ptr())
        self.capacity = int(base.numel())
        self.nbytes = int(nbytes)  # bytes a group's storage gets (the pool's largest group)
        self.owner = None  # GroupState holding the memory, or None (free)
        self.events: List[object] = []  # what the next writer waits for
        self.mempool = None  # alloc binder on CUDA: the slot's torch.cuda.MemPool
        self.segment_allocs = 0  # alloc binder: times torch asked the slot allocator for this slot's segment
        self.in_torch = False  # alloc binder: torch holds a segment of this slot (granted, not freed yet)
        self.live = True  # False: trimmed (tideSlotFree'd); the index is vacant until a regrow puts a new Slot there

    def wait_on(self, stream) -> None:
        """`stream` waits for the slot's last readers and writers (GPU-side)."""
        for ev in self.events:
            stream.wait_event(ev)

    def written(self, event) -> None:
        """A writer that waited (wait_on) on its stream finished at `event`: it implies the rest."""
        self.events = [event]

    def __repr__(self):
        who = self.owner.label if self.owner is not None else "free"
        return f"Slot({self.pool.name}#{self.index}, {self.nbytes}/{self.capacity} B, {who})"


_serials = itertools.count()


class SlotPool:
    """`count` slots of `nbytes` each on one executor's tideComm, shared by `groups` (a
    dedicated slot is a pool of one slot with one group, never bound: the group's storage is
    the slot's own). With `trim`, slots are freed at the learned idle points of the schedule and
    allocated again on demand (module docstring, "Trimming"): `count` is then the most slots
    the pool may hold, and the slots live now are those with Slot.live. `trim_phases` (with `trim`): the idle
    points it trims at, by the phase of the release that opens them (TRIM_DEFAULT: end of forward only;
    TRIM_ALL: also end of backward)."""

    def __init__(
        self,
        executor,
        nbytes: int,
        count: int,
        name: str,
        shared: bool,
        binder: Optional[_Binder] = None,
        trim: bool = False,
        trim_phases=TRIM_DEFAULT,
    ):
        if shared and binder is None:
            raise ValueError("a shared pool needs a binder")
        self.executor = executor
        self.nbytes = int(nbytes)
        self.name = name
        self.shared = shared
        self.binder = binder if shared else None
        self.capacity = self.binder.capacity(self.nbytes) if self.binder else self.nbytes
        self.slots: List[Slot] = []
        self.cursor = 0
        self.hits = 0  # acquisitions that got a slot
        self.fallbacks = 0  # acquisitions that found none free (stock all-gather)
        self.bind_failures = 0  # acquisitions whose bind failed (stock all-gather)
        self.used = set()  # slot indices ever acquired or used as staging
        self.staging = 0
        self.held = 0  # slots owned now
        self.peak_held = 0  # most slots owned at once
        # trimming (shared pools only)
        self.trim = bool(trim) and shared
        # the phases whose last release (nothing held after it, the next acquire of the other phase) trims
        self.trim_phases = frozenset(trim_phases) if self.trim else frozenset()
        if not self.trim_phases <= TRIM_ALL:
            raise ValueError(f"trim_phases={sorted(trim_phases)}: use phases of {sorted(TRIM_ALL)}")
        self.trim_points = set()  # (id(group), phase) of such releases, phase in trim_phases: where this pool trims
        self._idle = None  # (id(group), phase) of the last release that left nothing held, until the next acquire
        self._trim_after_rs = None  # id(group): trim once this group's RS (same post_backward) has been issued
        self.trims = 0  # trim points reached that freed at least one slot
        self.trimmed = 0  # slots freed by trims
        self.regrows = 0  # slots allocated again after a trim
        self.trim_blocked = 0  # slots a trim left live because torch still held their segment
        self.peak_resident = 0  # most slots live at once
        self.solo = False  # a trimming one-slot pool of one group that FSDP2 does not pool (build_pools, trim)
        self.serial = next(_serials)  # creation order: the same on every rank (enable() builds pools in group order)
        # _TorchBinder: the slots are torch memory (shard world size 1), never tideSlotAlloc / tideSlotFree
        self.torch_memory = self.binder is not None and self.binder.owns_memory
        try:
            for i in range(count):  # collective, in this order on every rank
                self.slots.append(self._new_slot(i, self._alloc_memory()))
            for slot in self.slots:
                if self.binder is not None:
                    self.binder.prepare(slot)
                    self.binder.check(slot)  # deterministic: every rank passes or fails alike
        except Exception:
            self.free()
            raise
        self.peak_resident = len(self.slots)
        _live_pools.add(self)
        _resident_changed()

    def _alloc_memory(self) -> torch.Tensor:
        """A slot's memory: tideSlotAlloc (collective), or torch's cache for a _TorchBinder pool."""
        if self.torch_memory:
            return self.binder.new_memory(self.capacity)
        return self.executor.alloc_slot(self.capacity)

    def _new_slot(self, index: int, base: torch.Tensor) -> "Slot":
        """The Slot for memory from _alloc_memory. Torch memory may be bytes the home stream's work used a moment
        ago: its first writer waits for that work (_TorchBinder.fresh_events)."""
        slot = Slot(self, index, base, self.nbytes)
        if self.torch_memory:
            slot.events = self.binder.fresh_events()
        return slot

    def _free_memory(self, slot: "Slot") -> None:
        """tideSlotFree (collective; synchronizes the device), or for a _TorchBinder pool the block back to torch's
        cache, stream-ordered (_TorchBinder.release_memory)."""
        if self.torch_memory:
            self.binder.release_memory(slot)
        else:
            self.executor.free_slot(slot.base)

    def resident(self) -> int:
        """Slots allocated now (bound or not)."""
        return sum(1 for s in self.slots if s.live)

    def resident_bytes(self) -> int:
        return self.resident() * self.capacity

    # -- ownership -----------------------------------------------------------------------------
    def acquire(self, group, phase: Optional[str] = None) -> Optional[Slot]:
        """The first free live slot from the cursor on (round-robin); with trim, else a vacant
        index gets a new slot (tideSlotAlloc, collective); None if every slot is owned. A failed
        bind or regrow raises BindError (counted here, warned by the caller). A dedicated slot is
        the group's storage itself (nothing to bind) and always the group's. `phase`: 'F' or 'B'
        (forward / backward, the group's FSDP2 TrainingState), for the trim points."""
        if not self.shared:
            slot = self.slots[0]
            slot.owner = group
            self.hits += 1
            self.used.add(0)
            return slot
        self._learn(phase)
        n = len(self.slots)
        slot = None
        for k in range(n):
            s = self.slots[(self.cursor + k) % n]
            if s.live and s.owner is None:
                slot = s
                break
        if slot is None and self.trim:
            vacant = next((s.index for s in self.slots if not s.live), None)
            if vacant is not None:
                slot = self._regrow(vacant)
        if slot is None:
            self.fallbacks += 1
            return None
        self.cursor = (slot.index + 1) % n
        _tick()
        try:
            self.binder.bind(group.store, slot)  # the slot's memory goes under the group's storage
        except BindError:
            self.bind_failures += 1
            raise
        slot.owner = group
        self.hits += 1
        self.used.add(slot.index)
        self.held += 1
        self.peak_held = max(self.peak_held, self.held)
        return slot

    def release(self, slot: Slot, event, phase: Optional[str] = None) -> None:
        """The owner resharded: its parameters' last readers end at `event` (compute stream)."""
        owner = slot.owner
        if event is not None:  # before the unbind: a relocated torch-binder move waits for it (_torch_slot_memory)
            slot.events.append(event)
        if self.shared:
            _tick()
            self.binder.unbind(owner.store, slot)  # the group's storage is empty again
            self.held -= 1
        slot.owner = None
        # only releases of a phase this pool trims at open a candidate idle point (trim_phases: the default leaves
        # the end of backward alone, so the optimizer step runs with the slots the next forward will bind)
        if self.trim and self.held == 0 and phase in self.trim_phases and owner is not None:
            self._idle = (id(owner), phase)
            if self._idle in self.trim_points:
                if phase == "B":  # post_backward: the group's RS follows and may stage in the vacated slot
                    self._trim_after_rs = id(owner)
                else:
                    self.trim_idle()

    def after_reduce(self, group) -> None:
        """The group's post-backward RS was issued (TIDE's or stock's): a trim waiting for it runs now."""
        if self._trim_after_rs is not None and self._trim_after_rs == id(group):
            self._trim_after_rs = None
            if self.held == 0:
                self.trim_idle()

    def _learn(self, phase: Optional[str]) -> None:
        """At an acquire: the idle point left by the last release (if nothing was held since) is a trim point
        when this acquire belongs to the other phase, and stops being one when it does not (schedule changed)."""
        idle, self._idle = self._idle, None
        self._trim_after_rs = None  # the idle gap is over: nothing left to give back
        if idle is None or phase is None or self.held != 0:
            return
        if idle[1] != phase:
            self.trim_points.add(idle)
        else:
            self.trim_points.discard(idle)

    def trim_idle(self) -> int:
        """Frees every live slot no group holds (collective, index order); returns how many."""
        victims = [s for s in self.slots if s.live and s.owner is None]
        if not victims:
            return 0
        _tick()
        if not self.torch_memory:
            for s in victims:
                self.binder.close(s)
            self.binder.closed()  # alloc binder: torch releases the slots' segments (their MemPools are gone)
        freed = 0
        for s in victims:
            if s.in_torch:  # torch still holds the segment: freeing it would leave torch a dangling block
                self.trim_blocked += 1
                self.binder.prepare(s)
                continue
            self._free_memory(s)  # _TorchBinder: no synchronize, no cudaFree: the bytes go back to torch's cache
            s.live, s.base, s.events, s.mempool = False, None, [], None
            freed += 1
        if freed:
            self.trims += 1
            self.trimmed += freed
            _resident_changed()
        return freed

    def _regrow(self, index: int) -> Slot:
        """A new slot at a vacant index (tideSlotAlloc, collective; inside forward/backward: the
        decision is rank-consistent, see the module docstring). Raises BindError if refused."""
        _tick()
        try:
            base = self._alloc_memory()
        except Exception as first:
            dev = getattr(self.executor, "device", None)
            if dev is None or torch.device(dev).type != "cuda":
                self.bind_failures += 1
                raise BindError(f"tideSlotAlloc of {self.capacity} B refused: {first}") from first
            torch.cuda.empty_cache()  # torch's cache may hold the memory the trim gave back
            try:
                base = self._alloc_memory()
            except Exception as e:
                self.bind_failures += 1
                raise BindError(f"tideSlotAlloc of {self.capacity} B refused: {e}") from e
        slot = self._new_slot(index, base)
        self.binder.prepare(slot)
        self.slots[index] = slot
        self.regrows += 1
        self.peak_resident = max(self.peak_resident, self.resident())
        _resident_changed()
        return slot

    def staging_slot(self, group, need: int) -> Optional[Slot]:
        """A free slot of at least `need` bytes for RS staging: the group's last slot if free,
        else the first free one in index order; None if none (the comm's own staging)."""
        if need > self.capacity:
            return None
        last = group.last_slot
        if last is not None and last.pool is self and last.live and last.owner is None:
            return last
        return next((s for s in self.slots if s.live and s.owner is None), None)

    # -- life ----------------------------------------------------------------------------------
    def free(self) -> None:
        """tideSlotFree for every live slot (collective, in index order). Owners give their memory
        back first (disable() runs between steps, so normally every slot is free already)."""
        live = [s for s in self.slots if s.live]
        for slot in live:
            if slot.owner is not None:
                slot.owner.held = None
                self.release(slot, None)
            if self.binder is not None:
                self.binder.close(slot)
        if self.binder is not None and live and not self.torch_memory:
            self.binder.closed()
        for slot in live:
            self._free_memory(slot)
            slot.live = False
        self.slots = []
        _live_pools.discard(self)
        if live:
            _resident_changed()

    def stats(self) -> dict:
        return {
            "name": self.name,
            "shared": self.shared,
            "solo": self.solo,
            "binder": self.binder.name if self.binder else None,
            "slots": len(self.slots),
            "slot_bytes": self.nbytes,
            "slot_capacity": self.capacity,
            "hits": self.hits,
            "fallbacks": self.fallbacks,
            "bind_failures": self.bind_failures,
            "distinct_slots_used": len(self.used),
            "rs_staging": self.staging,
            "held": self.held,
            "peak_held": self.peak_held if self.shared else len(self.slots),
            "resident": self.resident(),
            "peak_resident": self.peak_resident,
            "trim": self.trim,
            "trim_at": trim_at(self.trim_phases),  # the idle points this pool trims at ([] without trim)
            "trim_points": len(self.trim_points),
            "trims": self.trims,
            "trimmed": self.trimmed,
            "regrows": self.regrows,
            "trim_blocked": self.trim_blocked,
            # alloc binder: segments torch asked the slot allocator for (one per slot at enable(): the
            # slot's MemPool keeps it cached; more means torch released and re-created a segment, or regrows)
            "segment_allocs": sum(s.segment_allocs for s in self.slots) if self.binder else None,
            # torch binder (shard world size 1): the slots are torch memory; moves between a slot's holder and a
            # group's storage, those that got another block (the home stream then waited), blocks allocated / freed
            "torch_memory": self.torch_memory,
            "moves": getattr(self.binder, "moves", 0),
            "moves_relocated": getattr(self.binder, "moved", 0),
            "refused": [r for r in getattr(getattr(self.binder, "allocator", None), "refused", [])][-4:],
        }


def pinned(pg) -> bool:
    """FSDP2 >= 2.15: set_keep_unsharded_storage(True) on any parameter of the group: FSDP2
    never frees its unsharded storage, so a pooled slot would never come back."""
    return any(getattr(fp, "keep_unsharded_storage", False) for fp in pg.fsdp_params)


def reshards_after_forward(pg, state, top_level: bool) -> bool:
    """Whether FSDP2 frees this group's parameters after forward (the groups a pool serves).

    A top-level FSDP state (no FSDP ancestor) created with the default reshard_after_forward
    becomes a root at FSDP2's lazy init, which then sets post_forward_mesh_info = None (the root
    stays unsharded from forward to the end of backward): such a group is not pooled even when
    enable() runs before the first forward.
    """
    if pg.post_forward_mesh_info is None:
        return False
    if top_level and state is not None and state._is_root is None and getattr(
        state, "_auto_reshard_after_forward", False
    ):
        return False
    return True


def _own_pool(g, binder) -> Optional["SlotPool"]:
    """A trimming one-slot pool of the group's own size (None: no binder works here, or it could not be built:
    the caller gives the group a dedicated slot). Such a group (the root, a reshard_after_forward=False block) is
    held from its forward AG to its backward reshard: its only idle point is the end of backward, so the pool
    trims there (TRIM_ALL; slot_trim="all" is the only way such pools are built)."""
    if binder is None or binder.owns_memory:  # _TorchBinder: one per pool (its moves / allocs are per-pool stats)
        binder, _why = make_binder(g.pg.device, torch_memory=g.world == 1)
        if binder is None:
            return None
    try:
        pool = SlotPool(
            g.executor, g.layout.slot_bytes, 1, f"own[{g.label}]", shared=True, binder=binder, trim=True,
            trim_phases=TRIM_ALL,
        )
    except Exception as e:
        warn_once(f"nccl_tide.fsdp: {g.label}: trimming slot not built ({type(e).__name__}: {e}): a dedicated slot")
        return None
    pool.solo = True
    return pool


def build_pools(
    groups, slot_pool: Optional[int], trim: bool = False, own: bool = False, trim_phases=TRIM_DEFAULT
) -> tuple:
    """Assigns every native GroupState a SlotPool (allocating, collectively, in this order: per
    tideComm in group order, first the shared pool's slots, then each dedicated slot in group
    order). Returns (pools, failures) where failures maps a group to why its slot was refused.

    Pooled: groups that reshard after forward and are not pinned by set_keep_unsharded_storage,
    when the pool is on (slot_pool > 0), a binder works on this torch (make_binder), and they
    outnumber the pool (else a dedicated slot each costs no more). Everything else gets a
    dedicated slot; a pool that cannot be built (binder check failed, slots refused) warns once
    and its groups get dedicated slots. With `trim` (SlotPool(trim=True)) the pool gives its slots
    back at the idle points of the schedule, so it is built even for K or fewer groups (K is then
    capped at their number) and whatever the segment rounding: a dedicated slot never goes back. With
    `own` (and `trim`), the other groups (not pinned) get a trimming one-slot pool each instead of a dedicated
    slot (SlotPool.solo): it goes back between backward and the next forward, but costs the binder's segment
    rounding while the group is held (docs/fsdp.md, "Trimming"). `trim_phases`: the idle points the shared
    pools trim at (TRIM_DEFAULT: end of forward; enable(slot_trim="all") passes TRIM_ALL with `own`).
    """
    pools: List[SlotPool] = []
    failures = {}
    by_comm = {}
    for g in groups:
        by_comm.setdefault(id(g.executor.comm), []).append(g)
    k = int(slot_pool or 0)
    for members in by_comm.values():
        pooled = []
        if k > 0:
            pins = [g for g in members if g.reshards_after_forward and pinned(g.pg)]
            if pins:
                names = ", ".join(g.label for g in pins[:4]) + (" and more" if len(pins) > 4 else "")
                warn_once(
                    f"nccl_tide.fsdp: slot pool: {names} keep their unsharded storage (set_keep_unsharded_storage): "
                    "a dedicated slot each, not pooled"
                )
            pooled = [g for g in members if g.reshards_after_forward and g not in pins]
            if len(pooled) <= k and not trim:
                pooled = []
        binder = None
        if pooled:
            # a trimming pool at shard world size 1 takes its slots from torch's cache (_TorchBinder): its trims and
            # regrows are then stream-ordered frees and allocations, no tideSlotFree (device synchronize) per step
            binder, why = make_binder(pooled[0].pg.device, torch_memory=trim and pooled[0].world == 1)
            if binder is None:
                warn_once(f"nccl_tide.fsdp: slot_pool={k}: {why}: one resident slot per group")
                pooled = []
        if pooled:
            nbytes = max(g.layout.slot_bytes for g in pooled)
            cap = binder.capacity(nbytes)
            if k * cap >= sum(g.layout.slot_bytes for g in pooled) and not POOL_SMALL_GROUPS and not trim:
                # small groups: the allocator's segment rounding makes K slots cost more than a slot each
                warn_once(
                    f"nccl_tide.fsdp: slot_pool={k}: {k} slots of {cap} B ({binder.name} binder: the allocator's "
                    f"segment size for {nbytes} B) are no smaller than one slot per group: one resident slot per group"
                )
                pooled = []
        if pooled:
            try:
                count = min(k, len(pooled)) if trim else k
                pool = SlotPool(
                    pooled[0].executor, nbytes, count, f"pool[{pooled[0].label}..]", shared=True, binder=binder,
                    trim=trim, trim_phases=trim_phases,
                )
            except Exception as e:
                warn_once(
                    f"nccl_tide.fsdp: slot pool of {k} x {nbytes} B ({binder.name} binder) not built "
                    f"({type(e).__name__}: {e}): one resident slot per group"
                )
                pooled = []
            else:
                pools.append(pool)
                for g in pooled:
                    g.pool = pool
        for g in members:
            if g in failures or g.pool is not None:
                continue
            if trim and own and not pinned(g.pg):
                # the groups FSDP2 keeps unsharded from forward to backward (the root, reshard_after_forward=False
                # blocks) are idle between backward and the next forward (the optimizer step), where stock FSDP2 has
                # resharded them: a trimming pool of their own (one slot of their size) gives the slot back there
                own_pool = _own_pool(g, binder)  # not `own`: that is the caller's choice, for every group
                if own_pool is not None:
                    binder = own_pool.binder
                    pools.append(own_pool)
                    g.pool = own_pool
                    continue
            try:
                pools.append(SlotPool(g.executor, g.layout.slot_bytes, 1, g.label, shared=False))
            except Exception as e:
                failures[g] = f"slot refused: {e}"
                continue
            g.pool = pools[-1]
            g.store = pools[-1].slots[0].base.untyped_storage()  # never bound: a resident slot
    return pools, failures

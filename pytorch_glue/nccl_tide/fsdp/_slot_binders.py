# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Binders: how a slot's memory gets under a group's torch storage and away again (see _slot_pool's docstring for
the pool they serve).

* _CudaAllocBinder ("alloc"): a torch.cuda.MemPool per slot whose allocator (_SlotAllocator) hands torch the slot
  being bound; binding and unbinding are FSDP2's own resize_ moves. _CpuAllocBinder emulates it on CPU.
* _SwapBinder ("swap"): UntypedStorage._swap_data_ptr_ swaps the slot's memory in and out.
* _TorchBinder ("torch"): the slots are torch memory (a trimming pool at shard world size 1).

make_binder picks one for a device; alloc_request is the caching allocator's segment rule the alloc binder sizes slots
to.
"""

import ctypes

import torch


SWAP_SUPPORTED = hasattr(torch.UntypedStorage, "_swap_data_ptr_")
MEMPOOL_SUPPORTED = hasattr(torch.cuda, "MemPool") and hasattr(torch._C, "_cuda_customAllocator")
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
    """Shard world size 1 with trimming: the slots are torch caching-allocator memory on the pool's home
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
    shard world size 1, where its slots are torch memory (_TorchBinder); else alloc where it works, else swap."""
    if torch_memory:
        return _TorchBinder(device), ""
    if device.type == "cuda":
        if MEMPOOL_SUPPORTED:
            return _CudaAllocBinder(), ""
        if SWAP_SUPPORTED:
            return _SwapBinder(), ""
    elif SWAP_SUPPORTED:
        return _CpuAllocBinder(), ""
    return None, (
        f"torch {torch.__version__} on {device.type} has neither torch.cuda.MemPool with a custom allocator nor "
        "UntypedStorage._swap_data_ptr_"
    )

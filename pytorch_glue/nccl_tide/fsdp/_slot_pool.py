# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
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
the first gap costs K slots at that peak, which stock FSDP2 does not pay. The pool learns these idle
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

import itertools
from typing import List, Optional

import torch

from ._slot_binders import _Binder, BindError
from ._slot_memory import _live_pools, _resident_changed, _tick
# The benchmarks (benchmarks/fsdp_step.py, the memory probe) and tools read the meter through this module.
from ._slot_memory import outside_torch_bytes, resident_bytes, start_meter, stop_meter, tide_resident_bytes  # noqa: F401

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

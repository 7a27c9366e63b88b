"""Slots of the native executor: a shared pool for groups that reshard, dedicated slots for the rest.

A slot is a tideSlotAlloc region (collective: every rank allocates and frees in the same order,
at enable() / disable(), never inside forward/backward). Torch cannot resize it. A group's
unsharded parameters are views of the group's own torch storage (GroupState.store, empty while
the group is sharded); at each TIDE all-gather the group *acquires* a slot and the slot's
memory is swapped into that storage (UntypedStorage._swap_data_ptr_: the same StorageImpl, so
autograd's saved views of the parameters see it, exactly as they see FSDP2's resize_ of its own
storage); at reshard (FSDP2's free_storage, patched) the memory is swapped back into the slot
and the slot is free again.

Acquisition rule (SlotPool.acquire): the first free slot in index order starting at the pool's
cursor (round-robin), the cursor then moves past it. A slot is owned from the acquiring AG to the
owner's reshard. The rule reads only state that changes at AG and reshard calls, which FSDP2 runs
in the same program order on every rank, so every rank picks the same slot index, or finds none
free and falls back to stock FSDP2 for that all-gather (docs/fsdp.md, "Slot pool").

GPU ordering: each slot keeps the events its next writer must wait for (the last AG into it, the
release event recorded on the compute stream at reshard, the RS that used it as staging); a writer
makes its stream wait for them (never the host) and then leaves its own completion event.
"""

from typing import List, Optional

import torch

SWAP_SUPPORTED = hasattr(torch.UntypedStorage, "_swap_data_ptr_")


class Slot:
    """One tideSlotAlloc region. While free, `base` (a uint8 tensor) holds the memory; while
    owned, the owner's storage does (base's storage is then empty)."""

    def __init__(self, pool: "SlotPool", index: int, base: torch.Tensor):
        self.pool = pool
        self.index = index
        self.base = base
        self.nbytes = int(base.numel())
        self.owner = None  # GroupState holding the memory, or None (free)
        self.events: List[object] = []  # what the next writer waits for

    def wait_on(self, stream) -> None:
        """`stream` waits for the slot's last readers and writers (GPU-side)."""
        for ev in self.events:
            stream.wait_event(ev)

    def written(self, event) -> None:
        """A writer that waited (wait_on) on its stream finished at `event`: it implies the rest."""
        self.events = [event]

    def __repr__(self):
        who = self.owner.label if self.owner is not None else "free"
        return f"Slot({self.pool.name}#{self.index}, {self.nbytes} B, {who})"


class SlotPool:
    """`count` slots of `nbytes` each on one executor's tideComm, shared by `groups` (a
    dedicated slot is a pool of one slot with one group)."""

    def __init__(self, executor, nbytes: int, count: int, name: str, shared: bool):
        self.executor = executor
        self.nbytes = int(nbytes)
        self.name = name
        self.shared = shared
        self.slots: List[Slot] = []
        self.cursor = 0
        self.hits = 0  # acquisitions that got a slot
        self.fallbacks = 0  # acquisitions that found none free (stock all-gather)
        self.used = set()  # slot indices ever acquired or used as staging
        self.staging = 0
        try:
            for i in range(count):  # collective, in this order on every rank
                self.slots.append(Slot(self, i, executor.alloc_slot(self.nbytes)))
        except Exception:
            self.free()
            raise

    # -- ownership -----------------------------------------------------------------------------
    def acquire(self, group) -> Optional[Slot]:
        """The first free slot from the cursor on (round-robin), or None (all owned). A dedicated
        slot is the group's storage itself (nothing to swap) and always the group's."""
        if not self.shared:
            slot = self.slots[0]
            slot.owner = group
            self.hits += 1
            self.used.add(0)
            return slot
        n = len(self.slots)
        for k in range(n):
            slot = self.slots[(self.cursor + k) % n]
            if slot.owner is None:
                self.cursor = (slot.index + 1) % n
                slot.owner = group
                _swap(group.store, slot.base)  # the slot's memory moves into the group's storage
                self.hits += 1
                self.used.add(slot.index)
                return slot
        self.fallbacks += 1
        return None

    def release(self, slot: Slot, event) -> None:
        """The owner resharded: its parameters' last readers end at `event` (compute stream)."""
        if self.shared:
            _swap(slot.owner.store, slot.base)  # the memory goes back to the slot; the group's storage is empty
        slot.owner = None
        if event is not None:
            slot.events.append(event)

    def staging_slot(self, group, need: int) -> Optional[Slot]:
        """A free slot of at least `need` bytes for RS staging: the group's last slot if free,
        else the first free one in index order; None if none (the comm's own staging)."""
        if need > self.nbytes:
            return None
        last = group.last_slot
        if last is not None and last.pool is self and last.owner is None:
            return last
        return next((s for s in self.slots if s.owner is None), None)

    # -- life ----------------------------------------------------------------------------------
    def free(self) -> None:
        """tideSlotFree for every slot (collective, in index order). Owners give their memory
        back first (disable() runs between steps, so normally every slot is free already)."""
        for slot in self.slots:
            if slot.owner is not None:
                slot.owner.held = None
                self.release(slot, None)
            self.executor.free_slot(slot.base)
        self.slots = []

    def stats(self) -> dict:
        return {
            "name": self.name,
            "shared": self.shared,
            "slots": len(self.slots),
            "slot_bytes": self.nbytes,
            "hits": self.hits,
            "fallbacks": self.fallbacks,
            "distinct_slots_used": len(self.used),
            "rs_staging": self.staging,
        }


def _swap(store: torch.UntypedStorage, base: torch.Tensor) -> None:
    store._swap_data_ptr_(base.untyped_storage())


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


def build_pools(groups, slot_pool: Optional[int]) -> tuple:
    """Assigns every native GroupState a SlotPool (allocating, collectively, in this order: per
    tideComm in group order, first the shared pool's slots, then each dedicated slot in group
    order). Returns (pools, failures) where failures maps a group to why its slot was refused.

    Pooled: groups that reshard after forward, when the pool is on (slot_pool > 0), the torch
    has UntypedStorage._swap_data_ptr_, and they outnumber the pool (else a dedicated slot each
    costs no more). Everything else gets a dedicated slot.
    """
    pools: List[SlotPool] = []
    failures = {}
    by_comm = {}
    for g in groups:
        by_comm.setdefault(id(g.executor.comm), []).append(g)
    k = int(slot_pool or 0)
    for members in by_comm.values():
        pooled = []
        if k > 0 and SWAP_SUPPORTED:
            pooled = [g for g in members if g.reshards_after_forward]
            if len(pooled) <= k:
                pooled = []
        if pooled:
            nbytes = max(g.layout.slot_bytes for g in pooled)
            try:
                pool = SlotPool(pooled[0].executor, nbytes, k, f"pool[{pooled[0].label}..]", shared=True)
            except Exception as e:
                for g in pooled:
                    failures[g] = f"slot pool of {k} x {nbytes} B refused: {e}"
                pooled = []
            else:
                pools.append(pool)
                for g in pooled:
                    g.pool = pool
        for g in members:
            if g in failures or g.pool is not None:
                continue
            try:
                pools.append(SlotPool(g.executor, g.layout.slot_bytes, 1, g.label, shared=False))
            except Exception as e:
                failures[g] = f"slot refused: {e}"
                continue
            g.pool = pools[-1]
            g.store = pools[-1].slots[0].base.untyped_storage()  # never swapped: today's resident slot
    return pools, failures

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Which groups share a SlotPool and which get dedicated slots (build_pools, collective at enable()), and the FSDP2
facts that decide it (pinned, reshards_after_forward)."""

from typing import List, Optional

from ._slot_binders import make_binder
from ._slot_pool import TRIM_ALL, TRIM_DEFAULT, SlotPool
from ._warn import warn_once

# tests on tiny models: pool even where K slots of the allocator's segment size cost more than a
# dedicated slot per group (build_pools refuses that otherwise)
POOL_SMALL_GROUPS = False


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

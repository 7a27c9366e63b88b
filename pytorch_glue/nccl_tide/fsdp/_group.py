# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One FSDP2 parameter group under TIDE: eligibility, layout, slot, AG and RS.

State lives in the group's comm objects (TideAllGather / TideReduceScatter, installed as
the group's private _all_gather_comm / _reduce_scatter_comm, one instance per group as
FSDP2's Comm contract asks), so the patched functions find it from their arguments.
"""

import os
import weakref
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.distributed.device_mesh import _get_device_handle
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as _coll
from torch.distributed.fsdp._fully_shard import _fsdp_common as _common
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, CPUOffloadPolicy, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState

from ..errors import InvalidArgumentError, InvalidUsageError
from ..layout import Layout, default_ranks_per_node
from ..reference_executor import tide_dtype_name
from ._pool_plan import pinned
from ._slot_binders import BindError
from ._warn import warn_once

_RS_GRAD_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# torch >= 2.15: FSDP2 sets the unsharded parameter's grad_dtype (init_unsharded_param)
_HAS_GRAD_DTYPE = hasattr(__import__("torch.distributed.fsdp._fully_shard._fsdp_param", fromlist=["x"]).FSDPParam,
                          "unsharded_grad_dtype")

# StorageImpl address (UntypedStorage._cdata) of every native group's storage -> its
# GroupState. FSDP2's free_storage (patched while enabled) must not resize such a storage (it
# holds a tideSlotAlloc slot, not torch's memory); it releases the slot instead
# (_patch._tide_free_storage -> GroupState.on_release). Weak values: the GroupState lives as long
# as its FSDPParamGroup (which holds it through its comms) and the handle; a model dropped without
# disable() must not stay here with its state, pool and slots (its handle's finalizer frees the
# slots: nccl_tide.fsdp._model_dropped). The entry goes with the state, and with it the storage
# whose address is the key (the state holds it), so a reused address never finds a stale entry.
NATIVE_SLOTS: "weakref.WeakValueDictionary[int, GroupState]" = weakref.WeakValueDictionary()


def cast_in_place_setting() -> bool:
    """NCCL_TIDE_FSDP_CAST_IN_PLACE (docs/env.md; read by enable()): 1 or unset, with mixed precision the native
    executor's cast writes this rank's shards into their own slot positions and the all-gather takes them in
    place; 0 casts into a packed send buffer (the library then copies the own shard into the slot)."""
    v = os.environ.get("NCCL_TIDE_FSDP_CAST_IN_PLACE", "1")
    if v not in ("0", "1"):
        raise InvalidArgumentError(f"NCCL_TIDE_FSDP_CAST_IN_PLACE={v!r}: use 0 or 1")
    return v == "1"


_TORCH = "torch"  # GroupState.held: the storage holds torch memory (a stock all-gather fell back)


_PHASES = {"FORWARD": "F", "PRE_BACKWARD": "B", "POST_BACKWARD": "B"}


def schedule_phase(pg) -> Optional[str]:
    """'F' (forward: pre_forward, forward prefetch, post_forward reshard), 'B' (backward: pre_backward,
    backward prefetch, post_backward reshard) or None (IDLE: an explicit unshard()/reshard()), from the
    group's FSDP2 TrainingState: the slot pool's trim points are the idle gaps between the two."""
    state = getattr(pg, "_training_state", None) if pg is not None else None
    return _PHASES.get(getattr(state, "name", None))


def param_mp_policy(fsdp_param, pg):
    """The MixedPrecisionPolicy of one parameter: torch >= 2.15 resolves it per parameter
    (FSDPParam.mp_policy; FSDPParamGroup.mp_policy is gone), older torch per group."""
    mp = getattr(fsdp_param, "mp_policy", None)
    return mp if mp is not None else pg.mp_policy


def effective_param_dtype(fsdp_param, mp_policy) -> torch.dtype:
    """The dtype FSDP2 all-gathers this parameter in (FSDPParam.init_dtype_attrs' rule)."""
    orig = fsdp_param.sharded_param.dtype
    pd = mp_policy.param_dtype
    if pd is None or pd == orig or not orig.is_floating_point:
        return orig
    return pd


def _compiled_autograd() -> bool:
    fn = getattr(_common, "compiled_autograd_enabled", None)  # torch <= 2.12 has compile branches
    return bool(fn()) if fn is not None else False


NOT_SHARDED = "group not sharded at enable() (call enable() between steps)"


def unsharded_advice(call: str, groups) -> str:
    """Why `call` (enable() / disable()) cannot take or give back the unsharded FSDP groups `groups` ((FSDPParamGroup,
    label) pairs) and what to do. Between a forward and its backward: call it after backward. Between steps (FSDP2
    keeps a group unsharded after backward under set_reshard_after_backward(False), or after a user's unshard()),
    "between steps" is where the caller already is: only reshard() helps, and FSDPModule.reshard() does not recurse,
    so every such module is named."""
    labels = [label for _, label in groups]
    shown = ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")
    if any(getattr(pg, "_post_forward_indices", None) for pg, _ in groups):
        return f"{shown} ran forward and its backward has not run yet: call {call} between steps, after backward"
    kept = any(getattr(pg, "reshard_after_backward", True) is False for pg, _ in groups)
    why = " (set_reshard_after_backward(False) keeps parameters unsharded after backward)" if kept else ""
    return (f"{shown} {'is' if len(labels) == 1 else 'are'} unsharded between steps{why}: call reshard() on "
            f"{'it' if len(labels) == 1 else 'each of them'} first (FSDPModule.reshard() does not recurse)")


def static_reason(pg, default_comms: Tuple[type, type]) -> Optional[str]:
    """Why TIDE cannot take this FSDPParamGroup (None: it can). Checked once, at enable()."""
    if not pg.fsdp_params:
        return "no parameters"
    if not isinstance(pg.mesh_info, _common.FSDPMeshInfo) or isinstance(pg.mesh_info, _common.HSDPMeshInfo):
        return "HSDP or replicate mesh (only 1-D FSDP sharding is supported)"
    if isinstance(pg.offload_policy, CPUOffloadPolicy):
        return "CPU offload"
    if pg.post_forward_mesh_info is not None and pg.post_forward_mesh_info != pg.mesh_info:
        return "reshard_after_forward to a smaller mesh (int)"
    if _compiled_autograd():
        return "compiled autograd is on (FSDP2 re-creates unsharded storage under compile)"
    ag, rs = default_comms
    if type(pg._all_gather_comm) is not ag or type(pg._reduce_scatter_comm) is not rs:
        return "a custom or symmetric-memory comm is already installed on the group"
    dtypes = set()
    for fp in pg.fsdp_params:
        if fp.fsdp_placement.dim != 0:
            return f"Shard({fp.fsdp_placement.dim}) placement (only dim-0 sharding)"
        if hasattr(fp._sharded_local_tensor, "fsdp_pre_all_gather"):
            return "custom fsdp_pre_all_gather extension"
        if getattr(fp, "is_spmd_types", False):
            return "spmd-types parameter (torch >= 2.14): FSDP2 keeps it a plain tensor with its own restore step"
        if fp.is_dtensor:
            return "DTensor parameter (TP/EP): unsharded DTensor spec"
        if fp._sharded_param_data.is_meta:
            return "parameters on the meta device"
        if fp.sharded_state != ShardedState.SHARDED:
            return NOT_SHARDED  # enable() says why and what to do (unsharded_advice)
        dtypes.add(effective_param_dtype(fp, param_mp_policy(fp, pg)))
    if len(dtypes) != 1:
        return f"mixed dtypes in one group ({', '.join(sorted(str(d) for d in dtypes))})"
    (dt,) = dtypes
    if dt not in _RS_GRAD_DTYPES:
        return f"parameter dtype {dt} (TIDE reduce-scatter takes bf16, fp16, fp32)"
    return None


class GroupStats:
    def __init__(self):
        self.ag_calls = 0
        self.rs_calls = 0
        self.ag_bytes = 0  # bytes written into the slot (every rank's shards)
        self.rs_bytes = 0  # bytes of gradients consumed
        self.fallbacks: Dict[str, int] = {}
        self.stock_bytes_avoided = 0  # FSDP2 buffers not allocated: flat AG output, RS input
        self.executor_temp_bytes = 0  # temporaries the executor allocated (reference: gather buffers)
        self.rs_staging_in_slot = 0
        self.ag_pool_fallbacks = 0  # native: all-gathers that found no free pool slot (stock FSDP2)
        self.cast_in_place = 0  # native: all-gathers whose cast wrote the shards into the slot (no own-shard copy)

    def fallback(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def as_dict(self) -> dict:
        return dict(self.__dict__, fallbacks=dict(self.fallbacks))


class GroupState:
    """TIDE state of one FSDPParamGroup.

    Holds its FSDPParamGroup weakly: the group holds its modules (FSDPParamGroup.modules), so a
    strong reference from here would let the handle registry (nccl_tide.fsdp._handles, a
    WeakKeyDictionary whose values are the handles) or NATIVE_SLOTS keep the whole model alive
    (its sharded parameters, gradients, everything) after the user dropped it, enabled or not
   . The group holds this state through its comms, so it lives as long as the model.
    """

    def __init__(self, pg, label: str, executor, slot_reuse: bool, ranks_per_node: Optional[int]):
        self.label = label
        self._pg = weakref.ref(pg)
        self.n_params = len(pg.fsdp_params)
        self.executor = executor
        self.slot_reuse = slot_reuse
        self.stats = GroupStats()
        self.stock_ag = pg._all_gather_comm
        self.stock_rs = pg._reduce_scatter_comm
        self.world = pg.mesh_info.shard_process_group.size()
        self.rank = pg.mesh_info.shard_process_group.rank()
        self.ranks_per_node = ranks_per_node or self._default_ranks_per_node(executor)
        comm_nodes = getattr(getattr(executor, "comm", None), "ranks_per_node", None)
        if ranks_per_node and comm_nodes and comm_nodes % ranks_per_node:
            raise InvalidArgumentError(
                f"ranks_per_node={ranks_per_node} does not divide the TIDE node size {comm_nodes} of {label}'s comm "
                "(ranks on different NCCL hosts are different nodes): pass a divisor of it, or None"
            )
        self.layout: Optional[Layout] = None
        self.dtype: Optional[torch.dtype] = None
        self.slot: Optional[torch.Tensor] = None  # owns the storage; FSDP's views come from it
        self.exec_slot: Optional[torch.Tensor] = None  # same storage, own version counter
        self.exec_views: List[torch.Tensor] = []
        self.views_installed = False
        self._rs_layouts: Dict[Tuple[int, ...], Layout] = {}
        # native executor (fsdp/_slot_pool.py): the unsharded parameters are views of `store`; a
        # slot of `pool` is held (its memory bound under `store` by the pool's binder) from each TIDE-AG to the reshard.
        self.native = getattr(executor, "name", "") == "native"
        self.reshards_after_forward = False  # set by enable(): pooled when True
        self.pool = None  # SlotPool (shared, or a dedicated one-slot pool)
        self.store: Optional[torch.UntypedStorage] = None
        self.held = None  # the Slot held now, _TORCH (stock AG fell back), or None (sharded)
        self.last_slot = None  # the slot of the last TIDE-AG (preferred RS staging)
        self.exec_u8: Optional[torch.Tensor] = None  # uint8 alias of `store` for the comm
        self.own_positions: Optional[List[torch.Tensor]] = None  # this rank's shard positions in exec_u8
        self.cast_shards_in_place = cast_in_place_setting()
        self.ag_comm = TideAllGather(self)
        self.rs_comm = TideReduceScatter(self)

    def _default_ranks_per_node(self, executor) -> int:
        """The layout's node size when enable() was given none: the default for the world, unless the executor's comm
        has smaller TIDE nodes (ranks on different NCCL hosts), whose node size a layout must divide: then the largest
        divisor of that size that is at most the default."""
        r = default_ranks_per_node(self.world)
        comm_nodes = getattr(getattr(executor, "comm", None), "ranks_per_node", None)
        if comm_nodes and comm_nodes % r:
            r = max(d for d in range(1, min(r, comm_nodes) + 1) if comm_nodes % d == 0)
        return r

    @property
    def pg(self):
        pg = self._pg()
        if pg is None:
            raise InvalidUsageError(f"{self.label}: its FSDP2 module was garbage-collected")
        return pg

    @property
    def _stock_output_fn(self):
        """torch >= 2.15: FSDP2's copy-out hook of the group while TIDE's is installed. Kept on the
        FSDPParamGroup itself (it may be a bound method of the group: held here, it would keep
        the group, and so the model, alive)."""
        pg = self._pg()
        return getattr(pg, "_tide_stock_output_fn", None) if pg is not None else None

    @_stock_output_fn.setter
    def _stock_output_fn(self, fn) -> None:
        pg = self._pg()
        if pg is not None:
            pg._tide_stock_output_fn = fn

    # -- install / uninstall -------------------------------------------------------------------
    def install(self) -> None:
        self.pg._all_gather_comm = self.ag_comm
        self.pg._reduce_scatter_comm = self.rs_comm
        if hasattr(self.pg, "_all_gather_output_fn"):  # torch >= 2.15: FSDP2's per-group copy-out hook
            self._stock_output_fn = self.pg._all_gather_output_fn
            self.pg._all_gather_output_fn = self.all_gather_output_fn

    def all_gather_output_fn(self, fsdp_params, all_gather_result, world_size) -> None:
        """FSDP2 >= 2.15 copy-out hook (FSDPParamGroup._all_gather_output_fn; foreach_all_gather_copy_out
        has already made the current stream wait for the AG): a TIDE result is in place already; after a
        pool fallback (stock AG) the split copy goes into the group's views; anything else is stock's."""
        if isinstance(all_gather_result, TidePoolFallbackResult):
            return self.fallback_copy_out(all_gather_result, fsdp_params)
        if isinstance(all_gather_result, TideAllGatherResult):
            return None
        return self._stock_output_fn(fsdp_params, all_gather_result, world_size)

    def uninstall(self) -> None:
        pg = self.pg
        if self.views_installed:
            if not pg.is_sharded:
                raise InvalidUsageError(f"disable(): {unsharded_advice('disable()', [(pg, self.label)])}")
            for fp in pg.fsdp_params:  # stock FSDP2 re-creates its own storage on the next unshard
                fp.all_gather_outputs = []
                if hasattr(fp, "_unsharded_param"):
                    del fp._unsharded_param
            self.views_installed = False
        pg._all_gather_comm = self.stock_ag
        pg._reduce_scatter_comm = self.stock_rs
        if getattr(self, "_stock_output_fn", None) is not None:
            pg._all_gather_output_fn, self._stock_output_fn = self._stock_output_fn, None
        if self.store is not None:  # the slots themselves: SlotPool.free (disable(), collective)
            if self.held is not None:
                self.on_release(record=False, learn=False)
            NATIVE_SLOTS.pop(self.store._cdata, None)
            self.store = self.exec_u8 = self.pool = self.last_slot = self.own_positions = None
        self.slot = self.exec_slot = None
        self.exec_views = []
        for lay in [self.layout, *self._rs_layouts.values()]:
            if lay is not None:
                lay.close()
        self.layout, self._rs_layouts = None, {}

    # -- layout and slot -----------------------------------------------------------------------
    def _build(self) -> None:
        pg = self.pg
        dt = effective_param_dtype(pg.fsdp_params[0], param_mp_policy(pg.fsdp_params[0], pg))
        numels, rows = [], []
        for fp in pg.fsdp_params:
            size = fp._orig_size
            n = size.numel()
            numels.append(n)
            rows.append(n // size[0] if len(size) >= 1 and size[0] else 1)
            # FSDP2's padded shard must be TIDE's shard (tide.h: ceil(rows / W) * rowNumel)
        layout = Layout(numels, tide_dtype_name(dt), self.world, self.ranks_per_node, self.rank, row_numels=rows)
        for fp, p in zip(pg.fsdp_params, layout.params):
            if fp._sharded_param_data.numel() != p.shard_numel:
                layout.close()
                raise InvalidUsageError(
                    f"{self.label}: FSDP2 padded shard of {fp._param_fqn} has {fp._sharded_param_data.numel()} "
                    f"elements, TIDE's layout {p.shard_numel}"
                )
        elem = layout.params[0].elem_size
        if self.native:  # slots: enable() assigns them (_pool_plan.build_pools, collective)
            self.layout, self.dtype = layout, dt
            return
        slot = torch.empty(layout.slot_bytes // elem, dtype=dt, device=pg.device)
        exec_slot = torch.empty(0, dtype=dt, device=pg.device).set_(slot.untyped_storage(), 0, (slot.numel(),))
        self.layout, self.dtype, self.slot, self.exec_slot = layout, dt, slot, exec_slot
        self.exec_views = [
            exec_slot.narrow(0, p.slot_offset // elem, p.shard_numel * self.world) for p in layout.params
        ]
        _free(slot)

    def attach(self, pool) -> None:
        """Native: the group draws from `pool` (build_pools set `store` for a dedicated slot)."""
        self.pool = pool
        if self.store is None:  # pooled: an empty storage of the group's own; the binder puts slots under it
            self.store = torch.empty(0, dtype=torch.uint8, device=self.pg.device).untyped_storage()
        NATIVE_SLOTS[self.store._cdata] = self

    def _install_views(self) -> None:
        """Each parameter's unsharded tensor becomes a view of the slot at its slot offset.

        FSDPParam.init_unsharded_param would build the parameter with as_strided(...,
        storage_offset=0), which is wrong for a view at a nonzero offset of a shared buffer;
        so the parameter is built here with the view's own offset, and init_unsharded_param
        then returns early (it only runs once per FSDPParam). Stock free_unsharded_param
        resizes the shared storage to 0; the slot is re-allocated before every AG.
        """
        elem = self.layout.params[0].elem_size
        if self.native:  # `store` holds at least slot_bytes now (a slot, or torch memory)
            n = self.layout.slot_bytes // elem
            self.slot = torch.empty(0, dtype=self.dtype, device=self.pg.device).set_(self.store, 0, (n,))
        for fp, p in zip(self.pg.fsdp_params, self.layout.params):
            view = self.slot.narrow(0, p.slot_offset // elem, p.shard_numel * self.world)
            fp.all_gather_outputs = [view]
            unsharded = torch.as_strided(
                view, fp._orig_size, fp._contiguous_orig_stride, storage_offset=view.storage_offset()
            )
            fp._unsharded_param = nn.Parameter(unsharded, requires_grad=fp.sharded_param.requires_grad)
            if _HAS_GRAD_DTYPE:  # torch >= 2.15: autograd accumulates in FSDP2's unsharded grad dtype
                fp._unsharded_param.grad_dtype = fp.unsharded_grad_dtype
        self.views_installed = True

    # -- all-gather ----------------------------------------------------------------------------
    def all_gather(self, fsdp_params, group, async_op, copy_in_stream, ag_stream, device, stock_fn):
        if self.layout is None:
            try:
                self._build()
            except Exception as e:  # layout the library refuses: stock FSDP2 for good
                reason = f"layout refused: {e}"
                warn_once(f"nccl_tide.fsdp: {self.label}: keeping stock FSDP2 all-gather and reduce-scatter ({reason})")
                self.stats.fallback(reason)
                self.pg._all_gather_comm, self.pg._reduce_scatter_comm = self.stock_ag, self.stock_rs
                if getattr(self, "_stock_output_fn", None) is not None:
                    self.pg._all_gather_output_fn, self._stock_output_fn = self._stock_output_fn, None
                return stock_fn(fsdp_params, group, async_op, copy_in_stream, ag_stream, device, self.stock_ag)
        if _compiled_autograd():
            raise InvalidUsageError(f"{self.label}: compiled autograd is not supported with nccl_tide.fsdp")
        if fsdp_params is not self.pg.fsdp_params or group.size() != self.world:
            raise InvalidUsageError(f"{self.label}: all-gather called with another parameter list or process group")
        if any(fp.sharded_state != ShardedState.SHARDED for fp in fsdp_params):
            raise InvalidUsageError(f"{self.label}: TIDE all-gather from a non-SHARDED state")
        handle = _get_device_handle(device.type)
        if self.native:
            if self.held is not None:  # FSDP2 calls the group sharded: nothing may still hold memory
                self.on_release(learn=False)
            if self.pool.shared and pinned(self.pg):
                warn_once(
                    f"nccl_tide.fsdp: {self.label}: set_keep_unsharded_storage after enable(): its pooled slot is "
                    "released at its next all-gather, not kept (disable() and enable() again for a dedicated slot)"
                )
            try:
                slot = self.pool.acquire(self, schedule_phase(self.pg))
            except BindError as e:  # the binder could not place the slot: stock FSDP2 this once
                return self._pool_fallback(
                    fsdp_params, group, async_op, copy_in_stream, ag_stream, device, stock_fn, f"slot bind failed: {e}"
                )
            if slot is None:  # every slot owned by a group not resharded yet: stock FSDP2 this once
                return self._pool_fallback(fsdp_params, group, async_op, copy_in_stream, ag_stream, device, stock_fn)
            return self._native_all_gather(slot, fsdp_params, copy_in_stream, ag_stream, handle)
        _alloc(self.slot, self.layout.slot_bytes)  # FSDP2 freed it (resize to 0) at the last reshard
        if not self.views_installed:
            self._install_views()
        with handle.stream(copy_in_stream):
            # Cast fused into the packing of the send buffer (FSDP2's copy #1; copy #2 is gone).
            send = self.executor.pack(self.layout, [fp._sharded_param_data for fp in fsdp_params])
        ag_stream.wait_stream(copy_in_stream)
        with handle.stream(ag_stream):
            temp = self.executor.all_gather(self.layout, send, self.exec_views)
            event = ag_stream.record_event()
        st = self.stats
        st.ag_calls += 1
        st.ag_bytes += self.layout.send_bytes * self.world
        st.stock_bytes_avoided += self.layout.send_bytes * self.world  # FSDP2's flat all-gather output
        st.executor_temp_bytes += temp
        fields = {f: [] for f in _coll.AllGatherResult._fields}
        fields.update(all_gather_output=send.new_empty(0), all_gather_event=event, all_gather_work=None)
        return TideAllGatherResult(**fields)

    def _native_all_gather(self, slot, fsdp_params, copy_in_stream, ag_stream, handle):
        """TIDE-AG through tideComm on FSDP2's all-gather stream, straight into `slot` (acquired:
        its memory is in `store` now, under the parameter views)."""
        self.held = self.last_slot = slot
        if not self.views_installed:
            self._install_views()
        if self.exec_u8 is None:  # TIDE writes through an alias with its own version counter
            self.exec_u8 = torch.empty(0, dtype=torch.uint8, device=self.pg.device).set_(
                self.store, 0, (self.layout.slot_bytes,)
            )
        shards = [fp._sharded_param_data for fp in fsdp_params]
        if self.cast_shards_in_place and any(s.dtype != self.dtype or not s.is_contiguous() for s in shards):
            # Mixed precision: FSDP2's cast (its copy #1) writes this rank's shards straight into their own
            # positions in the slot, and the AG takes those positions as its shards (in place: the library
            # skips the own-shard copy, a same-device copy that runs on SMs, 1/W of the AG's bytes; and no
            # packed send buffer). The slot is written here, on the copy-in stream: after its last users.
            slot.wait_on(copy_in_stream)
            with handle.stream(copy_in_stream), torch.no_grad():
                send = self._own_positions()
                torch._foreach_copy_(send, [x.reshape(-1) for x in shards])
            self.stats.cast_in_place += 1
        else:
            with handle.stream(copy_in_stream):
                # the shards themselves (same dtype: pointer table, no send buffer) or one packed send
                # buffer with the cast fused (FSDP2's copy #1; its copy #2 into a flat output is gone)
                send = self.executor.pack(self.layout, shards)
        ag_stream.wait_stream(copy_in_stream)
        slot.wait_on(ag_stream)  # the slot's last users: compute until a reshard, RS staging, an AG
        with handle.stream(ag_stream):
            temp = self.executor.all_gather(self.layout, send, self.exec_u8, ag_stream)
            event = ag_stream.record_event()
        slot.written(event)
        st = self.stats
        st.ag_calls += 1
        st.ag_bytes += self.layout.send_bytes * self.world
        st.stock_bytes_avoided += self.layout.send_bytes * self.world  # FSDP2's flat all-gather output
        st.executor_temp_bytes += temp + (0 if isinstance(send, list) else self.layout.send_bytes)
        fields = {f: [] for f in _coll.AllGatherResult._fields}
        # FSDP2 keeps all_gather_output alive until its copy-out event is waited on by the
        # all-gather streams: the packed send buffer (read on ag_stream) must live that long.
        keep = send if isinstance(send, torch.Tensor) else self.slot.new_empty(0)
        fields.update(all_gather_output=keep, all_gather_event=event, all_gather_work=None)
        return TideAllGatherResult(**fields)

    def _own_positions(self):
        """This rank's position of every parameter in the slot (layout dtype), through exec_u8 (the
        library's alias, with its own version counter: writing it does not bump the parameters')."""
        if self.own_positions is None:
            esz = self.layout.params[0].elem_size
            self.own_positions = [
                self.exec_u8.narrow(0, p.slot_offset + self.rank * p.shard_numel * esz, p.shard_numel * esz).view(
                    self.dtype)
                for p in self.layout.params
            ]
        return self.own_positions

    def _pool_fallback(self, fsdp_params, group, async_op, copy_in_stream, ag_stream, device, stock_fn, bind=None):
        """No free slot (or the binder failed): FSDP2's own all-gather (same collective on every
        rank: the pool's rule is rank-consistent, docs/fsdp.md; a bind failure is deterministic
        for a torch and allocator setting); fallback_copy_out lands it in torch memory in `store`."""
        if bind is None:
            reason = "all-gather: no free slot in the native slot pool (stock FSDP2 all-gather)"
            warn_once(
                f"nccl_tide.fsdp: {reason} for at least one call (slot_pool={len(self.pool.slots)} slots are all held "
                "by groups not resharded yet, e.g. by prefetching); counted in stats(); a larger slot_pool avoids it"
            )
        else:
            reason = "all-gather: the slot could not be bound (stock FSDP2 all-gather)"
            warn_once(f"nccl_tide.fsdp: {self.label}: {reason}: {bind}; counted in stats()")
        self.stats.fallback(reason)
        self.stats.ag_pool_fallbacks += 1
        res = stock_fn(fsdp_params, group, async_op, copy_in_stream, ag_stream, device, self.stock_ag)
        out = TidePoolFallbackResult(*res)
        out.state = self
        return out

    def fallback_copy_out(self, result, fsdp_params) -> None:
        """FSDP2's copy-out of a stock all-gather, into the group's views: `store` gets torch
        memory (on the current stream, where FSDP2 allocates its own all-gather outputs), freed
        again at the reshard."""
        handle = _get_device_handle(self.pg.device.type)
        if result.all_gather_event is not None:
            handle.current_stream().wait_event(result.all_gather_event)
        if isinstance(result.all_gather_work, torch.distributed.distributed_c10d.Work):
            result.all_gather_work.wait()
        if self.store.size() == 0:
            self.store.resize_(self.layout.slot_bytes)
        self.held = _TORCH
        if not self.views_installed:
            self._install_views()
        elem = self.layout.params[0].elem_size
        W = self.world
        # written through an alias with its own version counter (FSDP2 uses _unsafe_preserve_version_counter)
        alias = torch.empty(0, dtype=self.dtype, device=self.pg.device).set_(
            self.store, 0, (self.layout.slot_bytes // elem,)
        )
        out = [alias.narrow(0, p.slot_offset // elem, p.shard_numel * W).view(W, -1) for p in self.layout.params]
        flat = result.all_gather_output.view(W, -1)
        if flat.dtype == torch.uint8:
            out = [o.view(torch.uint8) for o in out]
        torch.ops.fsdp.split_with_sizes_copy(flat, result.all_gather_input_split_sizes, dim=1, out=out)

    def on_release(self, record: bool = True, learn: bool = True) -> None:
        """FSDP2 resharded the group (its free_storage on `store`, patched): the parameters' last
        readers are on the current stream; the slot goes back to the pool with that event (the
        next writer waits for it). After a stock fallback, the torch memory is freed as FSDP2
        would free its own."""
        held, self.held = self.held, None
        if held is None:
            return
        if held is _TORCH:
            self.store.resize_(0)
            return
        ev = _get_device_handle(self.pg.device.type).current_stream().record_event() if record else None
        self.pool.release(held, ev, schedule_phase(self._pg()) if learn else None)

    def vacated(self) -> bool:
        """The group's parameters were resharded: its slot may hold RS staging."""
        if self.native:
            return self.views_installed and self.held is None
        return _storage_bytes(self.slot) == 0

    # -- reduce-scatter ------------------------------------------------------------------------
    def rs_plan(self, fsdp_params, grads, rs_group, reduce_dtype, factor, ar_group, force_sum, device):
        """(layout, op, scale) for this call, or a fallback reason string."""
        if self.layout is None:
            return "reduce-scatter before the first TIDE all-gather"
        if ar_group is not None:
            return "all-reduce group (HSDP)"
        if rs_group is None or rs_group.size() != self.world:
            return "reduce-scatter group differs from the all-gather group"
        gdts = {g.dtype for g in grads}
        if len(gdts) != 1:
            return f"mixed gradient dtypes {sorted(str(d) for d in gdts)}"
        (gdt,) = gdts
        if gdt not in _RS_GRAD_DTYPES:
            return f"gradient dtype {gdt}"
        rdt = reduce_dtype or gdt
        if rdt != torch.float32:
            return f"reduce_dtype {rdt}: TIDE-RS reduces in fp32 (MixedPrecisionPolicy(reduce_dtype=torch.float32))"
        pre, _post, rs_op, _ar_op = _coll._get_gradient_divide_factors(
            rs_group, ar_group, rdt, device.type, factor, force_sum
        )
        if pre is not None:
            return "pre-division of the gradients"
        if self.world == 1:  # FSDP2's world-1 path copies the RS input and applies the factor itself
            op, scale = "sum", 1.0
        elif rs_op == torch.distributed.ReduceOp.SUM:
            op, scale = "sum", 1.0
        elif rs_op == torch.distributed.ReduceOp.AVG:
            op, scale = "avg", 1.0
        else:  # PREMUL_SUM(1 / factor): FSDP2 builds it from gradient_divide_factor
            op, scale = "premul", 1.0 / factor
        index = {id(fp): i for i, fp in enumerate(self.pg.fsdp_params)}
        try:
            key = tuple(index[id(fp)] for fp in fsdp_params)
        except KeyError:
            return "gradients of parameters outside the group"
        for fp, g in zip(fsdp_params, grads):
            if g.numel() != fp._orig_size.numel():
                return "gradient size differs from the parameter"
        return self._rs_layout(key, gdt), op, scale

    def _rs_layout(self, key: Tuple[int, ...], gdt: torch.dtype) -> Layout:
        full = tuple(range(len(self.pg.fsdp_params)))
        if key == full and gdt == self.dtype:
            return self.layout
        if (key, gdt) not in self._rs_layouts:  # only some parameters got gradients this step
            ps = [self.layout.params[i] for i in key]
            self._rs_layouts[(key, gdt)] = Layout(
                [p.numel for p in ps],
                tide_dtype_name(gdt),
                self.world,
                self.ranks_per_node,
                self.rank,
                row_numels=[p.row_numel for p in ps],
            )
        return self._rs_layouts[(key, gdt)]

    def reduce_scatter(self, layout: Layout, grads, out: torch.Tensor, op: str, scale: float) -> None:
        if self.native:
            return self._native_reduce_scatter(layout, grads, out, op, scale)
        st = self.stats
        staging = None
        vacated = self.vacated()
        gdt = grads[0].dtype
        need = self.executor.staging_numel(layout)
        if self.slot_reuse and vacated and gdt == self.dtype and need <= self.exec_slot.numel():
            _alloc(self.slot, self.layout.slot_bytes)  # Slot-Reuse: staging in the vacated AG slot
            staging = self.exec_slot
        try:
            temp = self.executor.reduce_scatter(layout, grads, out, op=op, scale=scale, staging=staging)
        finally:
            if staging is not None:
                _free(self.slot)
        st.rs_calls += 1
        st.rs_staging_in_slot += staging is not None
        st.rs_bytes += sum(g.numel() * g.element_size() for g in grads)
        st.stock_bytes_avoided += layout.rs_out_numel * self.world * 4  # FSDP2's fp32 chunk_cat input
        st.executor_temp_bytes += temp

    def _native_reduce_scatter(self, layout: Layout, grads, out: torch.Tensor, op: str, scale: float) -> None:
        """TIDE-RS through tideComm on the current stream (FSDP2's reduce-scatter stream: it
        waited for the compute stream, so the gradients and the group's backward are done)."""
        st = self.stats
        stream = _get_device_handle(out.device.type).current_stream()
        staging = None
        # Slot-Reuse: a free slot (the group's vacated one if no other group took it since, else
        # another free pool slot); none free or too small: the comm's own staging
        slot = self.pool.staging_slot(self, layout.rs_staging_bytes) if self.slot_reuse else None
        if slot is not None:
            slot.wait_on(stream)
            staging = slot.base
        temp = self.executor.reduce_scatter(layout, grads, out, op=op, scale=scale, staging=staging, stream=stream)
        if slot is not None:
            slot.written(stream.record_event())  # the next AG into the slot waits for this RS
            self.pool.staging += 1
            self.pool.used.add(slot.index)
        st.rs_calls += 1
        st.rs_staging_in_slot += staging is not None
        st.rs_bytes += sum(g.numel() * g.element_size() for g in grads)
        st.stock_bytes_avoided += layout.rs_out_numel * self.world * 4  # FSDP2's fp32 chunk_cat input
        st.executor_temp_bytes += temp


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().size()


def _alloc(t: torch.Tensor, nbytes: int) -> None:
    if (s := t.untyped_storage()).size() != nbytes:
        s.resize_(nbytes)


def _free(t: torch.Tensor) -> None:
    if (s := t.untyped_storage()).size() != 0:
        s.resize_(0)


class TideAllGatherResult(_coll.AllGatherResult):
    """An AllGatherResult whose parameters are already in place (no copy-out)."""

    __slots__ = ()


class TidePoolFallbackResult(TideAllGatherResult):
    """A stock all-gather of a native group that found no free pool slot; `state` does the
    copy-out into the group's views (GroupState.fallback_copy_out)."""


class TideAllGather(AllGather):
    """The group's all-gather comm while TIDE holds it; FSDP2 never calls it directly."""

    def __init__(self, state: GroupState):
        self.state = state

    def allocate(self, size, *, dtype, device):
        return self.state.stock_ag.allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        raise InvalidUsageError("TideAllGather is driven by the patched foreach_all_gather only")


class TideReduceScatter(ReduceScatter):
    """The group's reduce-scatter comm while TIDE holds it.

    Armed by the patched foreach_reduce with this call's gradients and plan: FSDP2 then asks
    for the RS input (TIDE returns an empty placeholder that keeps the gradients alive exactly
    as long as FSDP2 keeps its RS input), skips the copy-in (patched), asks for the fp32 output
    (a real buffer, FSDP2's sharded gradients become views of it) and calls the comm, which
    runs TIDE-RS from the per-parameter gradients.
    """

    def __init__(self, state: GroupState):
        self.state = state
        self.armed = None  # (layout, grads, op, scale)
        self._phase = 0
        self._w1_done = False
        self._w1_buffer = None

    def arm(self, layout, grads, op, scale):
        self.armed, self._phase, self._w1_done = (layout, grads, op, scale), 0, False

    def disarm(self):
        self.armed, self._phase, self._w1_done = None, 0, False

    def allocate(self, size, *, dtype, device):
        if self.armed is None:
            return self.state.stock_rs.allocate(size, dtype=dtype, device=device)
        layout, grads, op, scale = self.armed
        self._phase += 1
        w1 = self.state.world == 1
        if self._phase == 1:  # FSDP2's reduce_scatter_input
            if w1:
                # World 1: FSDP2 never calls the comm; it copies its RS input into its RS output
                # (applying gradient_divide_factor). TIDE's output buffer is both, so that copy
                # is a self-copy (a no-op) and TIDE-RS runs when FSDP2 asks for the output.
                ph = torch.empty(*size, dtype=dtype, device=device)
                if int(ph.numel()) != layout.rs_out_numel:
                    raise InvalidUsageError(
                        f"RS input of {tuple(size)} elements, TIDE layout has {layout.rs_out_numel}"
                    )
            else:
                ph = torch.empty(0, dtype=dtype, device=device)
            ph._tide_rs_placeholder = True
            ph._tide_grads = grads
            self._w1_buffer = ph if w1 else None
            return ph
        if int(torch.Size(size).numel()) != layout.rs_out_numel:
            raise InvalidUsageError(f"RS output of {tuple(size)} elements, TIDE layout has {layout.rs_out_numel}")
        if w1:  # inside FSDP2's reduce-scatter stream context, like the comm call at world > 1
            out, self._w1_buffer = self._w1_buffer, None
            self.state.reduce_scatter(layout, grads, out, op, scale)
            self._w1_done = True
            # `out` becomes the sharded gradients and lives on: it must not keep the unsharded
            # gradients alive. The RS stream still reads them: tell the caching allocator.
            if out.is_cuda:
                rs_stream = torch.cuda.current_stream(out.device)
                for g in grads:
                    g.record_stream(rs_stream)
            out._tide_grads = None
            return out
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if self.armed is None or not getattr(input_tensor, "_tide_rs_placeholder", False):
            raise InvalidUsageError("TideReduceScatter called outside the patched foreach_reduce")
        if self._w1_done:  # world 1, a torch that calls the comm anyway: already reduced
            return None
        layout, grads, tide_op, scale = self.armed
        self.state.reduce_scatter(layout, grads, output_tensor, tide_op, scale)
        return None

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The private FSDP2 names nccl_tide.fsdp replaces while at least one model is enabled.

* _fsdp_param_group.foreach_all_gather: TIDE groups run TIDE-AG into the slot;
* _fsdp_param_group.foreach_all_gather_copy_out (torch <= 2.14): a TIDE result needs no copy-out;
  torch 2.15 calls a per-group copy-out hook instead (FSDPParamGroup._all_gather_output_fn),
  which GroupState.install sets for TIDE groups, so this name is not patched there;
* _fsdp_param_group.foreach_reduce: arms a TIDE group's reduce-scatter comm (or hands the
  stock comm to a call TIDE cannot take), then runs FSDP2's own foreach_reduce, which keeps
  doing everything after the collective (post-divide, sharded-gradient views, accumulation,
  hooks) exactly as stock;
* _fsdp_collectives.foreach_reduce_scatter_copy_in: skipped for TIDE's placeholder input;
* _fsdp_param.free_storage: a native group's storage holds a tideSlotAlloc slot; FSDP2 "freeing"
  it releases the slot to its pool with a release event (the next writer of the slot waits for
  it) and the pool's binder takes the memory away (fsdp/_slot_pool.py);
* FSDPParamGroup.unshard / wait_for_unshard (class attributes): only for a TIDE group of
  shard world size 1, where FSDP2 skips foreach_all_gather and copies the shards locally:
  TIDE's wrappers run FSDP2's world > 1 sequence instead (TIDE-AG, no copy-out), so world
  size 1 (the single-GPU test) exercises the same TIDE path as every other world size.

Every wrapper passes anything that is not a TIDE group straight to the original, so other
FSDP2 models in the process keep stock behaviour. FSDPParamGroup imported the first three by
name, so the patch points are the names in its module namespace (as torch's own
common_fsdp.patch_foreach_all_gather does); foreach_reduce looks the copy-in up as a global
of _fsdp_collectives at call time.
"""

import inspect
from typing import Callable, Dict

from torch.distributed.device_mesh import _get_device_handle
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as _coll
from torch.distributed.fsdp._fully_shard import _fsdp_param as _fpm
from torch.distributed.fsdp._fully_shard import _fsdp_param_group as _pgm
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

from ._group import NATIVE_SLOTS, TideAllGather, TideAllGatherResult, TidePoolFallbackResult, TideReduceScatter
from ._warn import warn_once

_orig: Dict[str, Callable] = {}
_users = 0


def _sig(fn) -> inspect.Signature:
    return inspect.signature(inspect.unwrap(fn))


def _tide_foreach_all_gather(*args, **kwargs):
    ba = _SIGS["ag"].bind(*args, **kwargs)
    a = ba.arguments
    comm = a["all_gather_comm"]
    if not isinstance(comm, TideAllGather):
        return _orig["ag"](*args, **kwargs)
    return comm.state.all_gather(
        a["fsdp_params"],
        a["group"],
        a["async_op"],
        a["all_gather_copy_in_stream"],
        a["all_gather_stream"],
        a["device"],
        _orig["ag"],
    )


def _tide_foreach_all_gather_copy_out(*args, **kwargs):
    ba = _SIGS["copy_out"].bind(*args, **kwargs)
    result = ba.arguments["all_gather_result"]
    if not isinstance(result, TideAllGatherResult):
        return _orig["copy_out"](*args, **kwargs)
    if isinstance(result, TidePoolFallbackResult):  # stock all-gather (no free pool slot): copy into the views
        return result.state.fallback_copy_out(result, ba.arguments["fsdp_params"])
    # The parameters are already in place: only order the compute stream after the AG.
    if result.all_gather_event is not None:
        device = ba.arguments["fsdp_params"][0].device
        _get_device_handle(device.type).current_stream().wait_event(result.all_gather_event)
    if result.all_gather_work is not None:
        result.all_gather_work.wait()
    return None


def _tide_foreach_reduce(*args, **kwargs):
    ba = _SIGS["reduce"].bind(*args, **kwargs)
    ba.apply_defaults()
    a = ba.arguments
    comm = a["reduce_scatter_comm"]
    if not isinstance(comm, TideReduceScatter):
        return _orig["reduce"](*args, **kwargs)
    st = comm.state
    plan = st.rs_plan(
        a["fsdp_params"],
        a["unsharded_grads"],
        a["reduce_scatter_group"],
        a.get("reduce_dtype"),
        a.get("gradient_divide_factor"),
        a.get("all_reduce_group"),
        a.get("force_sum_reduction_for_comms", False),
        a["device"],
    )
    try:
        if isinstance(plan, str):
            st.stats.fallback(plan)
            warn_once(f"nccl_tide.fsdp: stock FSDP2 reduce-scatter for this call: {plan} (counted in stats())")
            a["reduce_scatter_comm"] = st.stock_rs
            return _orig["reduce"](*ba.args, **ba.kwargs)
        layout, op, scale = plan
        grads = list(a["unsharded_grads"])
        if st.native:  # tideReduceScatter reads raw pointers: contiguous gradients (copies kept alive with them)
            grads = [g if g.is_contiguous() else g.contiguous() for g in grads]
        comm.arm(layout, grads, op, scale)
        try:
            return _orig["reduce"](*ba.args, **ba.kwargs)
        finally:
            comm.disarm()
    finally:
        if st.native and st.pool is not None:  # a trim point at the end of backward waits for this RS
            st.pool.after_reduce(st)


def _tide_foreach_reduce_scatter_copy_in(unsharded_grads, reduce_scatter_input, world_size):
    if getattr(reduce_scatter_input, "_tide_rs_placeholder", False):
        return None  # TIDE-RS reads the per-parameter gradients directly
    return _orig["copy_in"](unsharded_grads, reduce_scatter_input, world_size)


def _tide_free_storage(tensor):
    st = NATIVE_SLOTS.get(tensor.untyped_storage()._cdata)
    if st is not None:
        st.on_release()
        return None
    return _orig["free"](tensor)


def _wait_ag_streams(pg, event) -> None:
    """The all-gather streams wait for `event` (FSDPCommContext's method on torch >= 2.15)."""
    ctx = pg.comm_ctx
    if hasattr(ctx, "wait_all_gather_streams_on_event"):
        ctx.wait_all_gather_streams_on_event(event)
    else:
        pg._wait_all_gather_streams_on_event(event)


def _w1_state(pg):
    comm = getattr(pg, "_all_gather_comm", None)
    if isinstance(comm, TideAllGather) and comm.state.world == 1:
        return comm.state
    return None


def _tide_unshard(self, async_op: bool = False):
    """FSDPParamGroup.unshard; for a TIDE group of world size 1, FSDP2's world > 1 sequence."""
    if _w1_state(self) is None:
        return _orig["unshard"](self, async_op)
    if self._all_gather_result is not None or self.is_unsharded:
        return None
    if not getattr(self, "unshard_in_backward", True) and self._training_state == TrainingState.PRE_BACKWARD:
        return None
    if getattr(self, "_reshard_after_forward_event", None) is not None:
        _wait_ag_streams(self, self._reshard_after_forward_event)
        self._reshard_after_forward_event = None
    self._all_gather_result = _pgm.foreach_all_gather(
        self.fsdp_params,
        self._all_gather_process_group,
        async_op,
        *self.comm_ctx.get_all_gather_streams(async_op, self._training_state),
        self.device,
        self._all_gather_comm,
    )
    return None


def _tide_wait_for_unshard(self):
    """FSDPParamGroup.wait_for_unshard; for a TIDE group of world size 1, FSDP2's world > 1
    sequence (TIDE's copy-out only orders the compute stream after the AG)."""
    if _w1_state(self) is None or not isinstance(self._all_gather_result, TideAllGatherResult):
        return _orig["wait"](self)
    if self._training_state == TrainingState.FORWARD:  # implicit prefetch
        if hasattr(self.comm_ctx, "release_all_gather_state_for_comm_reuse"):  # torch >= 2.15
            self.comm_ctx.release_all_gather_state_for_comm_reuse()
        elif prev := self.comm_ctx.all_gather_state:
            _wait_ag_streams(self, prev.event)
            self.comm_ctx.all_gather_state = None
    kw = {"all_gather_output_fn": self._all_gather_output_fn} if COPY_OUT_HOOK else {}
    _pgm.foreach_all_gather_copy_out(self._all_gather_result, self.fsdp_params, self._all_gather_process_group, **kw)
    for fsdp_param in self.fsdp_params:
        fsdp_param.init_unsharded_param()
    self._to_unsharded()
    event = _get_device_handle(self.device.type).Event()
    event.record()
    _wait_ag_streams(self, event)
    self._all_gather_result = None
    return None


# torch >= 2.15: FSDP2 calls a per-group copy-out hook (FSDPParamGroup._all_gather_output_fn), which
# GroupState.install sets for TIDE groups: foreach_all_gather_copy_out itself is not patched there.
COPY_OUT_HOOK = "all_gather_output_fn" in inspect.signature(inspect.unwrap(_coll.foreach_all_gather_copy_out)).parameters

_POINTS = {
    "ag": (_pgm, "foreach_all_gather", _tide_foreach_all_gather),
    **({} if COPY_OUT_HOOK else {"copy_out": (_pgm, "foreach_all_gather_copy_out", _tide_foreach_all_gather_copy_out)}),
    "reduce": (_pgm, "foreach_reduce", _tide_foreach_reduce),
    "copy_in": (_coll, "foreach_reduce_scatter_copy_in", _tide_foreach_reduce_scatter_copy_in),
    "free": (_fpm, "free_storage", _tide_free_storage),
    "unshard": (_pgm.FSDPParamGroup, "unshard", _tide_unshard),
    "wait": (_pgm.FSDPParamGroup, "wait_for_unshard", _tide_wait_for_unshard),
}
# Argument names from the definitions in _fsdp_collectives (not from whatever the patch
# points hold now: another wrapper may sit there).
_SIGS = {k: _sig(getattr(_coll, name)) for k, (_mod, name, _) in _POINTS.items() if k in ("ag", "copy_out", "reduce")}
_SIGS["copy_out"] = _sig(_coll.foreach_all_gather_copy_out)


def install() -> None:
    global _users
    if _users == 0:
        for key, (mod, name, fn) in _POINTS.items():
            _orig[key] = getattr(mod, name)
            setattr(mod, name, fn)
    _users += 1


def uninstall() -> None:
    global _users
    if _users == 0:
        return
    _users -= 1
    if _users == 0:
        for key, (mod, name, fn) in _POINTS.items():
            if getattr(mod, name) is fn:  # leave a later patch by someone else alone
                setattr(mod, name, _orig[key])
        _orig.clear()


def installed() -> bool:
    return _users > 0


def patched_names() -> Dict[str, str]:
    """'module.name' of every patch point -> whether TIDE's wrapper is in place now."""
    return {
        f"{getattr(mod, '__module__', '')}.{mod.__name__}.{name}".lstrip("."): getattr(mod, name) is fn
        for mod, name, fn in _POINTS.values()
    }

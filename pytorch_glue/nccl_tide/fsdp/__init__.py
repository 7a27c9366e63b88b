# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp: TIDE all-gather and reduce-scatter inside PyTorch FSDP2 (fully_shard).

    model = ...; fully_shard(block) for each block; fully_shard(model)
    handle = nccl_tide.fsdp.enable(model)         # after fully_shard, between steps
    ... train as usual ...
    handle.stats()                                # per group: TIDE AG/RS calls, fallbacks
    nccl_tide.fsdp.disable(model)                 # stock FSDP2 again

For every FSDP parameter group it can take, enable() builds one nccl_tide.Layout in FSDP2's
parameter order and padding, places the group's unsharded parameters in one slot (each
parameter a view at its slot offset) and routes the group's all-gather and reduce-scatter
through TIDE: no flat all-gather output and no copy-out, no chunk_cat copy-in of the
gradients, fp32 sharded gradients written where FSDP2 expects them. Anything it cannot take
keeps stock FSDP2 and warns once, saying why; modules a module_filter excludes keep stock FSDP2
too (an INFO line, not a warning: the caller asked for it). Details: docs/fsdp.md.
"""

import gc
import weakref
from typing import Any, Callable, Dict, List, Optional, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from .._log import get_logger
from .. import fsdp_switch
from ..errors import InvalidArgumentError, InvalidUsageError
from ..reference_executor import get_executor
from . import _adapter, _patch, _slot_memory, _slot_pool
from ._group import NOT_SHARDED, GroupState, TideAllGather, cast_in_place_setting, static_reason, unsharded_advice
from ._pool_plan import build_pools, reshards_after_forward
from ._warn import TideFSDPWarning, warn_once

__all__ = ["TideFSDPHandle", "TideFSDPWarning", "disable", "enable", "free_dropped", "handle_of", "stats"]

_handles: "weakref.WeakKeyDictionary[nn.Module, TideFSDPHandle]" = weakref.WeakKeyDictionary()
_log = get_logger("fsdp")


def _param_groups(state) -> list:
    groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.13: several per module
    if groups is None:
        g = getattr(state, "_fsdp_param_group", None)
        groups = [g] if g is not None else []
    return list(groups)


class TideFSDPHandle:
    """What enable() did to one model: which groups run TIDE, which kept stock, and counters."""

    def __init__(self, model: nn.Module, executor_name: str, slot_reuse: bool, adapter: Optional[str]):
        self._model = weakref.ref(model)
        self.executor = executor_name
        self.slot_reuse = slot_reuse
        self.adapter = adapter
        self.slot_pool = 0  # native: size of the shared slot pool asked for
        self.slot_trim = False  # native: the shared pools give their slots back at the schedule's idle points
        self.trim_at: List[str] = []  # which idle points trim ("end of forward", "end of backward"), [] when off
        self._finalizer = None  # weakref.finalize on the model: frees the slots of a model dropped while enabled
        self.pools = []  # native: SlotPool objects (shared pools first per comm, then dedicated slots)
        self.groups: List[GroupState] = []
        self.stock: List[dict] = []  # {"group": label, "reason": why}
        # groups that run TIDE through the handle of an earlier enable() on another module: {"group", "handle_of"}
        self.elsewhere: List[dict] = []
        self.enabled = True

    def stats(self) -> dict:
        """Per group counters. 'tide' groups: ag_calls/rs_calls (TIDE collectives run),
        cast_in_place (native: AGs whose cast wrote the shards into their own slot positions,
        NCCL_TIDE_FSDP_CAST_IN_PLACE),
        fallbacks (per-call stock reductions, by reason), ag_bytes/rs_bytes (bytes written into
        the slot / gradient bytes consumed), stock_bytes_avoided (FSDP2 buffers not allocated:
        flat AG output, fp32 RS input), executor_temp_bytes (what the executor allocated
        instead; the reference executor is not the fast path), rs_staging_in_slot.
        Native: slot_pools (one entry per SlotPool: shared pool or dedicated slot, with slots,
        slot_bytes, slot_capacity, binder, hits, fallbacks, bind_failures, distinct_slots_used,
        rs_staging, held, peak_held, segment_allocs, refused), slot_pool (the totals: size,
        slot_bytes and slot_capacity of the shared pool, binder, pooled/dedicated groups,
        resident_slot_bytes, hits, fallbacks, bind_failures, peak_held, outside_torch_bytes; trimming:
        trim, trim_at (the idle points it trims at), trims, regrows, own_slots),
        per group `pool` (shared pool name or 'dedicated'). docs/fsdp.md."""
        tide = []
        for g in self.groups:
            d = g.stats.as_dict()
            d.update(group=g.label, n_params=g.n_params, world_size=g.world)
            d.update(slot_bytes=g.layout.slot_bytes if g.layout is not None else None)
            d.update(slot_reuse_fits=g.layout.slot_reuse_fits if g.layout is not None else None)
            if g.pool is not None:
                d.update(pool="own" if g.pool.solo else (g.pool.name if g.pool.shared else "dedicated"))
            tide.append(d)
        shared = [p for p in self.pools if p.shared and not p.solo]
        own = [p for p in self.pools if p.solo]  # trim: a one-slot trimming pool per unpooled group
        dedicated = [p for p in self.pools if not p.shared]
        keys = ("ag_calls", "rs_calls", "ag_bytes", "rs_bytes", "stock_bytes_avoided", "executor_temp_bytes")
        return {
            "enabled": self.enabled,
            "executor": self.executor,
            "provider": next((getattr(g.executor, "provider", None) for g in self.groups), None),
            "adapter": self.adapter,
            "torch": torch.__version__,
            "slot_reuse": self.slot_reuse,
            "tide_groups": tide,
            "stock_groups": list(self.stock),
            "other_handle_groups": list(self.elsewhere),
            "slot_pools": [p.stats() for p in self.pools],
            "slot_pool": {
                "requested": self.slot_pool,
                "size": sum(len(p.slots) for p in shared),
                "slot_bytes": max((p.nbytes for p in shared), default=0),
                "pooled_groups": sum(1 for g in self.groups if g.pool is not None and g.pool in shared),
                "dedicated_slots": len(dedicated),
                "trim": self.slot_trim,
                # the idle points the pools free their unbound slots at: ["end of forward"] for slot_trim=True/None,
                # ["end of forward", "end of backward"] for "all" (docs/fsdp.md, "Trimming"), [] when off
                "trim_at": list(self.trim_at),
                # slot bytes allocated now (shared pools' live slots + dedicated slots); with trim this changes
                # during a step: max_resident_slot_bytes is the bound, peak_resident_slot_bytes what was reached
                "resident_slot_bytes": sum(p.resident_bytes() for p in self.pools),
                # the part of it TIDE allocated (tideSlotAlloc); the rest is torch memory (binder "torch": trimming at
                # shard world size 1), in torch's own counters
                "tide_resident_slot_bytes": sum(p.resident_bytes() for p in self.pools if not p.torch_memory),
                "peak_resident_slot_bytes": sum(p.capacity * p.peak_resident for p in self.pools),
                "max_resident_slot_bytes": sum(p.capacity * len(p.slots) for p in self.pools),
                "own_slots": len(own),
                "trims": sum(p.trims for p in shared + own),
                "regrows": sum(p.regrows for p in shared + own),
                "hits": sum(p.hits for p in shared),
                "fallbacks": sum(p.fallbacks for p in shared),
                "distinct_slots_used": sum(len(p.used) for p in shared),
                "binder": next((p.binder.name for p in shared), None),
                "slot_capacity": max((p.capacity for p in shared), default=0),
                "peak_held": sum(p.peak_held for p in shared),
                "bind_failures": sum(p.bind_failures for p in shared),
                "outside_torch_bytes": _slot_memory.outside_torch_bytes(),
            }
            if self.pools
            else None,
            "total": {k: sum(d[k] for d in tide) for k in keys}
            | {"fallbacks": sum(sum(d["fallbacks"].values()) for d in tide)},
        }

    def __repr__(self):
        return (
            f"TideFSDPHandle(executor={self.executor!r}, tide_groups={len(self.groups)}, "
            f"stock_groups={len(self.stock)}, enabled={self.enabled})"
        )


def _shard_group(pg):
    return pg.mesh_info.shard_process_group if hasattr(pg.mesh_info, "shard_process_group") else None


MAX_RANKS_PER_NODE = 64  # include/tide.h TIDE_MAX_RANKS_PER_NODE


def _check_ranks_per_node(ranks_per_node, model) -> None:
    """enable()'s ranks_per_node: None, or an integer from 1 to 64 that divides the shard world size of every FSDP
    group of `model` (a layout's node size). Refused here: a layout refused at a group's first all-gather would
    leave that group silently on stock FSDP2."""
    if ranks_per_node is None:
        return
    usage = f"use an integer from 1 to {MAX_RANKS_PER_NODE} dividing the shard world size, or None (the default)"
    if not isinstance(ranks_per_node, int) or isinstance(ranks_per_node, bool):
        raise InvalidArgumentError(f"ranks_per_node={ranks_per_node!r}: {usage}")
    if not 1 <= ranks_per_node <= MAX_RANKS_PER_NODE:
        raise InvalidArgumentError(f"ranks_per_node={ranks_per_node!r}: {usage}")
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            for pg in _param_groups(mod._get_fsdp_state()):
                group = _shard_group(pg)
                world = group.size() if group is not None else 1
                if world % ranks_per_node:
                    raise InvalidArgumentError(
                        f"ranks_per_node={ranks_per_node!r} does not divide the shard world size {world}; {usage}"
                    )


def _pick_executor(executor: str, candidates) -> tuple:
    """(executor name, reason) for the groups TIDE can take. 'auto': native when the groups'
    process group is NCCL on CUDA and tideCommCreate succeeds on it, else reference on gloo,
    else 'stock' with the reason (one warning, by enable())."""
    if executor not in ("auto", "reference", "native"):
        raise InvalidArgumentError(f"executor={executor!r}: use 'auto', 'reference' or 'native'")
    if executor == "reference" or not candidates:
        return ("reference" if executor != "native" else "native"), ""
    from ..native_executor import backend_name

    pg0 = candidates[0]
    group, device = _shard_group(pg0), pg0.device
    backend = backend_name(group, device) if group is not None else "none"
    if executor == "native":
        get_executor("native", group, device)  # raises UnsupportedError saying why
        return "native", ""
    if device.type == "cuda" and backend == "nccl":
        try:
            get_executor("native", group, device)
            return "native", ""
        except Exception as e:  # no CUDA/NCCL build of libnccl-tide, tideCommCreate refused, ...
            return "stock", f"executor='auto': the native executor is unavailable ({type(e).__name__}: {e})"
    if backend == "gloo":
        warn_once(
            f"nccl_tide.fsdp: executor='auto' uses the reference executor: the process group's backend for "
            f"{device.type} is gloo (the native executor needs NCCL on CUDA; the reference executor is "
            "torch.distributed collectives plus copies: correct, not the fast path)"
        )
        return "reference", ""
    return "stock", (
        f"executor='auto': process group backend {backend!r} on {device.type} (native needs NCCL on CUDA, "
        "reference runs on gloo)"
    )


def enable(
    model: nn.Module,
    *,
    slot_reuse: bool = True,
    executor: str = "auto",
    ranks_per_node: Optional[int] = None,
    slot_pool: Optional[int] = 3,
    module_filter: Optional[Callable[[str, nn.Module], bool]] = None,
    slot_trim: Union[bool, str, None] = None,
) -> TideFSDPHandle:
    """Route the FSDP2 collectives of `model` (after fully_shard) through TIDE.

    slot_reuse: RS staging lives in the group's vacated all-gather slot when the group was
      resharded after backward; otherwise in a buffer of the executor.
    executor: 'auto' (native when the process group is NCCL on CUDA and tideCommCreate
      succeeds, else reference on gloo, else stock FSDP2 with one warning saying why),
      'reference' (torch.distributed, any backend; gloo on CPU) or 'native' (CUDA + NCCL
      through tideComm; raises UnsupportedError saying why when it cannot be created).
    ranks_per_node: for the layout's RS accumulation order (default: the largest divisor of
      the shard world size that is <= 8, as nccl_tide.Layout); an integer from 1 to 64 dividing
      every group's shard world size, else InvalidArgumentError.
    slot_pool: native executor: the groups FSDP2 reshards after forward (and that
      set_keep_unsharded_storage does not pin) share this many slots (each of the largest such
      group's slot_bytes, rounded to the allocator's segment), acquired at each all-gather and released
      at reshard; an all-gather that finds every slot held falls back to stock FSDP2 for that
      call (warned once, counted). Other groups (e.g. the root) keep a dedicated slot. 0 or
      None: a dedicated slot per group (all unsharded parameters resident). Ignored by the
      reference executor (its slots are torch memory, freed at reshard). docs/fsdp.md.
    slot_trim: native executor with a slot pool: the pool frees its unbound slots at the end of
      forward (no pooled group unsharded from the last forward reshard to the first backward
      all-gather: the head, the loss and their backward, where a step usually peaks) and allocates
      them again at the next all-gather that needs one, so those slots are not resident at that
      peak (stock FSDP2 holds no block there either). Every reshard-after-forward group is then
      pooled. The end of backward (the optimizer step, normally below that peak) is not trimmed:
      there a trim would only cost a device synchronize, cudaFree and cudaMalloc per slot per step.
      "all": both points, and every other group (the root, blocks with reshard_after_forward=False)
      gets a trimming slot of its own, freed after backward (it then costs the allocator's segment
      rounding, up to 2 MiB per large group, while held): for runs whose peak is the optimizer
      step. stats()["slot_pool"]["trim_at"] names the points. None (default): on where every
      native group's shard world size is 1, off otherwise; there the pool's slots are torch memory (binder
      "torch": a trim is a stream-ordered free into torch's caching allocator, a regrow an allocation from it, no
      device synchronize, no driver call; docs/fsdp.md "Trimming"). False: the slots stay allocated.
      True at world size > 1 makes every trim and regrow a collective tideSlotFree / tideSlotAlloc (a device
      synchronize and an IPC exchange) inside the step.
    module_filter: None (every FSDP module), or a callable (qualified_name, module) -> bool called
      once for every FSDP module of `model` (those fully_shard was applied to, "" for `model`
      itself) before anything is changed: False keeps stock FSDP2 for all of that module's
      parameter groups (handle.stock, reason "module_filter excluded <name>", logged at INFO);
      the slot pool and executor choice count only the groups it keeps. It must decide alike on
      every rank. A filter that raises or returns a non-bool raises InvalidArgumentError naming
      the module, and the model is left as stock FSDP2.
    Call between steps (every group sharded: under set_reshard_after_backward(False) call reshard() on each FSDP
    module first, else those groups keep stock FSDP2, warned), on every rank, with the same arguments. Groups that
    run TIDE through the handle of an earlier enable() on another module stay with it (warned; stats()
    "other_handle_groups").
    Returns the handle (also nccl_tide.fsdp.handle_of(model)); enabling twice is an error.
    """
    _check_arguments(model, slot_pool, slot_trim, module_filter, ranks_per_node)
    free_dropped()  # slots of models dropped while enabled (collective: here, on every rank)
    killed = fsdp_switch.killed()  # NCCL_TIDE_FSDP=0: every group stock
    # Nothing is changed before this walk ends: a filter that raises leaves the model stock FSDP2.
    labels, where, excluded = _walk_fsdp_modules(model, module_filter, killed)
    _refuse_mid_step(model, labels)
    elsewhere = _other_handles(model, labels)  # TIDE's already, through an earlier enable() on another module
    labels = {k: v for k, v in labels.items() if k not in elsewhere}
    selection = _adapter.select()
    static = {}
    for pg, _label in labels.values():
        static[id(pg)] = excluded.get(id(pg)) or selection.reason or static_reason(
            pg, (DefaultAllGather, DefaultReduceScatter)
        )
    unsharded = [pg for pg, _ in labels.values() if static[id(pg)] == NOT_SHARDED]
    for pg in unsharded:  # between steps (enable() refuses mid-step above): only reshard() helps, say so
        static[id(pg)] = _unsharded_reason(unsharded)
    candidates = [pg for pg, _ in labels.values() if not static[id(pg)]]
    if selection.adapter is not None:
        executor_name, why_stock = _pick_executor(executor, candidates)
    else:
        executor_name, why_stock = executor, ""
    handle = TideFSDPHandle(model, executor_name, slot_reuse, selection.adapter.name if selection.adapter else None)
    handle.slot_pool = int(slot_pool or 0)
    _report_elsewhere(handle, list(elsewhere.values()))
    stock = _StockGroups(handle)
    for pg, label in labels.values():
        reason = static[id(pg)] or why_stock
        gs = None
        if not reason:
            gs, reason = _new_group(pg, label, executor_name, slot_reuse, ranks_per_node, where[id(pg)])
        if reason:
            stock.keep(label, reason, asked=id(pg) in excluded)
        else:
            handle.groups.append(gs)
    _assign_slots(handle, slot_trim, stock)
    stock.report(killed)
    if handle.groups:
        _install(handle, model)
    _handles[model] = handle
    return handle


def _check_arguments(model, slot_pool, slot_trim, module_filter, ranks_per_node) -> None:
    """enable()'s argument and state checks: every one before anything changes."""
    if not isinstance(model, nn.Module):
        raise InvalidArgumentError(f"enable() takes the root nn.Module, got {type(model).__name__}")
    if slot_pool is not None and (not isinstance(slot_pool, int) or isinstance(slot_pool, bool) or slot_pool < 0):
        raise InvalidArgumentError(f"slot_pool={slot_pool!r}: use a number of slots >= 0, or None (one slot per group)")
    if slot_trim is not None and not isinstance(slot_trim, bool) and slot_trim != "all":
        raise InvalidArgumentError(
            f"slot_trim={slot_trim!r}: use True, False, 'all' or None (the pool trims at shard world size 1)"
        )
    if module_filter is not None and not callable(module_filter):
        raise InvalidArgumentError(
            f"module_filter={module_filter!r}: use a callable (qualified_name, module) -> bool, or None"
        )
    cast_in_place_setting()  # NCCL_TIDE_FSDP_CAST_IN_PLACE: an invalid value fails here, before anything changes
    if model in _handles and _handles[model].enabled:
        raise InvalidUsageError("nccl_tide.fsdp.enable(): already enabled on this model (disable() first)")
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidUsageError(
            "nccl_tide.fsdp.enable(): call torch.distributed.init_process_group and fully_shard first"
        )
    _check_ranks_per_node(ranks_per_node, model)


def _refuse_mid_step(model, labels) -> None:
    """Refuses enable() after a forward whose backward has not run: autograd saved views of stock FSDP2's unsharded
    parameters, whose storage stock FSDP2 would re-allocate in backward; TIDE unshards into its own slots, so that
    backward would read freed storage. FSDP2 records a group's forwards until its backward (or reset_iter_state());
    a forward without grad is recorded alike, so it is refused too, with the way out."""
    pending = [label for pg, label in labels.values() if getattr(pg, "_post_forward_indices", None)]
    if not pending:
        return
    reset = (" (after a forward that has no backward, e.g. under torch.no_grad(), call model.reset_iter_state() "
             "first)") if hasattr(model, "reset_iter_state") else ""
    raise InvalidUsageError(
        f"nccl_tide.fsdp.enable(): {_shown(pending)} ran forward and its backward has not run yet; call enable() "
        f"between steps, after backward{reset}; nothing was changed"
    )


def _other_handles(model, labels) -> Dict[int, tuple]:
    """The groups of `model` that run TIDE through the handle of an earlier enable() on another module (e.g.
    enable(model.blocks[0]) before enable(model)): id(pg) -> (label, where that handle's enable() was called). That
    handle keeps them: they are neither this handle's TIDE groups nor stock."""
    names = {id(mod): name or "<root>" for name, mod in model.named_modules()}
    owners = {}
    for owner_model, h in list(_handles.items()):
        if h.enabled and owner_model is not model:
            for g in h.groups:
                owners[id(g)] = names.get(id(owner_model), f"an enclosing {type(owner_model).__name__} module")
    found = {}
    for key, (pg, label) in labels.items():
        comm = getattr(pg, "_all_gather_comm", None)
        if isinstance(comm, TideAllGather):
            found[key] = (label, owners.get(id(comm.state), "another module"))
    return found


def _report_elsewhere(handle: "TideFSDPHandle", groups: List[tuple]) -> None:
    """One warning per earlier handle whose groups this enable() leaves to it: they run TIDE, not stock FSDP2, and
    this handle's stats() and disable() do not cover them."""
    by_owner: Dict[str, List[str]] = {}
    for label, owner in groups:
        handle.elsewhere.append({"group": label, "handle_of": owner})
        by_owner.setdefault(owner, []).append(label)
    for owner, names in by_owner.items():
        warn_once(
            f"nccl_tide.fsdp: {_shown(names)} already run{'s' if len(names) == 1 else ''} TIDE through the handle of "
            f"an earlier enable() on {owner}; this enable() leaves {'it' if len(names) == 1 else 'them'} there: that "
            f"handle's stats() count {'it' if len(names) == 1 else 'them'} and its disable() gives "
            f"{'it' if len(names) == 1 else 'them'} back to stock FSDP2 (this handle's disable() does not)"
        )


def _unsharded_reason(pgs) -> str:
    """enable()'s reason for groups unsharded between steps, one text for all of them (one warning)."""
    kept = any(getattr(pg, "reshard_after_backward", True) is False for pg in pgs)
    why = " (set_reshard_after_backward(False) keeps parameters unsharded after backward)" if kept else ""
    return (f"unsharded between steps{why}; to have TIDE take them, call disable() on this model, reshard() on each "
            "of these modules (FSDPModule.reshard() does not recurse), then enable() again")


def _walk_fsdp_modules(model, module_filter, killed: bool) -> tuple:
    """Every FSDP parameter group of `model`, read only: labels (id(pg) -> (pg, module name)), where (id(pg) -> (its
    FSDPState, whether it has no FSDP ancestor)) and excluded (id(pg) -> why it stays stock: the switch or the
    module filter)."""
    labels, where, excluded = {}, {}, {}
    fsdp_names: List[str] = []
    for name, mod in model.named_modules():
        if isinstance(mod, FSDPModule):
            state = mod._get_fsdp_state()
            top = not any(name == p or name.startswith(p + ".") or p == "" for p in fsdp_names)
            fsdp_names.append(name)
            keep = not killed and _filter_keeps(module_filter, name, mod)
            for pg in _param_groups(state):
                labels.setdefault(id(pg), (pg, name or "<root>"))
                where.setdefault(id(pg), (state, top))
                if not keep:
                    excluded[id(pg)] = (f"{fsdp_switch.ENV}=0 (stock FSDP2 for every group)" if killed
                                        else f"module_filter excluded {name or '<root>'}")
    return labels, where, excluded


def _new_group(pg, label, executor_name, slot_reuse, ranks_per_node, where) -> tuple:
    """(GroupState, "") for a group TIDE takes, or (None, why the native executor refused its layout)."""
    ex = get_executor(executor_name, _shard_group(pg), pg.device)
    gs = GroupState(pg, label, ex, slot_reuse, ranks_per_node)
    if gs.native:
        gs.reshards_after_forward = reshards_after_forward(pg, *where)
        try:
            gs._build()  # the layout; slots in _assign_slots
        except Exception as e:
            return None, f"layout refused by the native executor: {e}"
    return gs, ""


class _StockGroups:
    """The groups enable() leaves to stock FSDP2: recorded in handle.stock, then reported once (a warning per
    reason; module_filter's choices at INFO)."""

    def __init__(self, handle: TideFSDPHandle):
        self.handle = handle
        self.reasons = {}  # reason -> labels
        self.filtered: List[str] = []

    def keep(self, label: str, reason: str, asked: bool = False) -> None:
        self.handle.stock.append({"group": label, "reason": reason})
        if asked:  # module_filter excluded it: INFO, not a warning
            if label not in self.filtered:
                self.filtered.append(label)
        else:
            self.reasons.setdefault(reason, []).append(label)

    def report(self, killed: bool) -> None:
        for reason, names in self.reasons.items():
            warn_once(f"nccl_tide.fsdp: keeping stock FSDP2 for {_shown(names)}: {reason}")
        if killed:
            _log.info("%s=0: keeping stock FSDP2 for every group (%d module(s))", fsdp_switch.ENV, len(self.filtered))
        elif self.filtered:
            _log.info(
                "module_filter: keeping stock FSDP2 for %s (%d module(s))", _shown(self.filtered), len(self.filtered)
            )


def _assign_slots(handle: TideFSDPHandle, slot_trim, stock: _StockGroups) -> None:
    """Slots for the native groups: tideSlotAlloc is collective, so every native slot is allocated now, between
    steps, in the same order on every rank (never inside forward/backward). A group whose slot is refused goes
    back to stock FSDP2."""
    native = [g for g in handle.groups if g.native]
    if not native:
        return
    trim = slot_trim if slot_trim is not None else all(g.world == 1 for g in native)
    handle.slot_trim = bool(trim) and handle.slot_pool > 0
    own = handle.slot_trim and slot_trim == "all"
    # True / None: the end of forward only (the peak lies there; a trim at the end of backward would free slots
    # for the optimizer step, below that peak, and cost a sync + cudaFree + cudaMalloc per slot per step);
    # "all": both idle points, plus the own slots of the unpooled groups (runs whose peak is the optimizer step)
    phases = _slot_pool.TRIM_ALL if own else _slot_pool.TRIM_DEFAULT
    handle.trim_at = _slot_pool.trim_at(phases) if handle.slot_trim else []
    handle.pools, failures = build_pools(native, handle.slot_pool, trim=handle.slot_trim, own=own, trim_phases=phases)
    for g in native:
        if g in failures:
            g.uninstall()
            handle.groups.remove(g)
            stock.keep(g.label, f"layout or slot refused by the native executor: {failures[g]}")
        else:
            g.attach(g.pool)


def _install(handle: TideFSDPHandle, model: nn.Module) -> None:
    """FSDP2's patches and every TIDE group's hooks; the finalizer queues the slots of a model dropped while
    enabled."""
    _patch.install()
    for g in handle.groups:
        g.install()
    handle._finalizer = weakref.finalize(model, _model_dropped, handle.pools, bool(handle.groups))
    handle._finalizer.atexit = False  # at exit the comms go with the process


# Models dropped while enabled: (their slot pools, whether they installed the patches), queued by the finalizer and
# freed at the next enable() / disable() / free_dropped() call. Never from the finalizer itself: garbage collection
# runs at arbitrary points (inside a user's CUDA graph capture, on another thread), where tideSlotFree's device
# synchronize and cudaFree must not run; and at world size > 1 the free is collective, so every rank must reach it
# at the same call.
_dropped: list = []


def _world(pool) -> int:
    comm = getattr(pool.executor, "comm", None)
    return int(getattr(comm, "world_size", 1) or 1)


def _model_dropped(pools: list, patched: bool) -> None:
    """weakref.finalize of an enabled model, run when it is garbage-collected without disable(): its
    tideSlotAlloc slots are still allocated in the comm. Only queued here (see _dropped); free_dropped()
    frees them once no live group uses them."""
    _dropped.append((list(pools), patched))
    pools.clear()


def free_dropped() -> int:
    """Frees the slots of TIDE-enabled models dropped without disable() (at shard world size > 1 collective:
    call it on every rank at the same point, between steps, as enable()/disable(), which call it themselves).
    Runs gc.collect() first. A dropped model whose groups are still alive (a submodule kept and used after
    the root was dropped) keeps its slots until they are gone too. Returns the number of slot pools freed."""
    if not _dropped and not any(_world(p) != 1 for h in list(_handles.values()) for p in h.pools):
        return 0
    gc.collect()
    # A pool is still in use while a live GroupState draws from it (NATIVE_SLOTS holds them weakly: only the
    # groups' own comms and FSDP2 param groups keep them alive).
    from ._group import NATIVE_SLOTS

    in_use = {id(g.pool) for g in list(NATIVE_SLOTS.values()) if getattr(g, "pool", None) is not None}
    ready, kept = [], []
    for pools, patched in _dropped:
        (kept if any(id(p) in in_use for p in pools) else ready).append((pools, patched))
    _dropped[:] = kept
    # tideSlotFree is collective per slot: every rank frees the same pools in the same order, creation order
    # (garbage collection may have run the finalizers in another order on another rank)
    ready.sort(key=lambda e: min((p.serial for p in e[0]), default=0))
    n = 0
    for pools, patched in ready:
        for p in sorted(pools, key=lambda p: p.serial):
            try:
                p.free()
                n += 1
            except Exception as e:  # the slots stay allocated until the comm is destroyed
                warn_once(f"nccl_tide.fsdp: freeing the slots of a dropped model failed: {type(e).__name__}: {e}")
        if patched:
            _patch.uninstall()
    return n


def _shown(names: List[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _filter_keeps(module_filter, name: str, module: nn.Module) -> bool:
    """module_filter's verdict on one FSDP module (True without a filter); its errors become
    InvalidArgumentError naming the module (enable() has changed nothing yet)."""
    if module_filter is None:
        return True
    label = name or "<root>"
    try:
        verdict = module_filter(name, module)
    except Exception as e:
        raise InvalidArgumentError(
            f"nccl_tide.fsdp.enable(): module_filter raised on FSDP module {label} ({type(module).__name__}): "
            f"{type(e).__name__}: {e}; nothing was changed (stock FSDP2)"
        ) from e
    if not isinstance(verdict, bool):
        raise InvalidArgumentError(
            f"nccl_tide.fsdp.enable(): module_filter returned {verdict!r} ({type(verdict).__name__}) for FSDP "
            f"module {label}: return True (TIDE may take it) or False (stock FSDP2); nothing was changed"
        )
    return verdict


def disable(model: nn.Module) -> None:
    """Give every group of `model` back to stock FSDP2 (between steps, every group sharded: under
    set_reshard_after_backward(False) call reshard() on each FSDP module first). No-op if not enabled."""
    handle = _handles.get(model)
    if handle is None or not handle.enabled:
        return
    unsharded = [(g.pg, g.label) for g in handle.groups if g.views_installed and not g.pg.is_sharded]
    if unsharded:  # checked for all first: nothing is half-undone
        raise InvalidUsageError(f"nccl_tide.fsdp.disable(): {unsharded_advice('disable()', unsharded)}; "
                                "nothing was changed")
    for g in handle.groups:
        g.uninstall()
    for pool in handle.pools:  # tideSlotFree (collective), in allocation order
        pool.free()
    handle.pools.clear()  # the same list the finalizer holds: nothing left for it
    if handle._finalizer is not None:
        handle._finalizer.detach()
        handle._finalizer = None
    if handle.groups:
        _patch.uninstall()
    handle.enabled = False
    free_dropped()


def handle_of(model: nn.Module) -> Optional[TideFSDPHandle]:
    return _handles.get(model)


def stats(model: nn.Module) -> Optional[Dict[str, Any]]:
    h = _handles.get(model)
    return h.stats() if h is not None else None

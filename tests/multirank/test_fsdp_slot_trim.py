# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Slot-pool trimming and the slots of dropped models (FSDP2 peak memory at or below stock).

The device peak of a step (H200, world size 1, 4 Llama layers, slot_pool=2) fell in backward before the
first block's all-gather: stock FSDP2 holds no block there, TIDE held its two pool slots, unbound. A
trimming pool (SlotPool(trim=True), enable(slot_trim=...)) frees its unbound slots at the idle points it
learns from FSDP2's schedule (the last reshard before a forward/backward switch) and allocates them again
at the next all-gather that needs one: by default (slot_trim=True / None, SlotPool.trim_phases =
TRIM_DEFAULT) only at the end of forward, where that peak lies; with slot_trim="all" (TRIM_ALL) also at the
end of backward (the optimizer step). Checked here on CPU/gloo through the simulated tideComm
(benchmarks/sim_comm.py: every slot poisoned with NaN before an AG writes it, RS staging poisoned):

* host-only: the pool's learning and accounting on a scripted schedule (no FSDP2, no processes), for the
  default and for "all";
* world sizes 1 and 2, 5 blocks that reshard after forward, K = 2, three native runs each: the default
  (slot_trim=None at world 1, True at world 2; the root, not resharded after forward, keeps its dedicated
  slot), slot_trim="all" (the root gets a trimming slot of its own) and slot_trim=False. At the end of every
  forward after the first (a forward hook on the final norm, where the loss/head/backward-start peak lies)
  the comm holds only the root's slot with either trimming setting. Before every optimizer step the default
  keeps the K slots its backward regrew (and the root's dedicated one: no end-of-backward trim), "all" holds
  no slot at all after the first step (stock FSDP2 has resharded the root there too); without trimming the K
  slots and the root's stay at both points. The pool never holds more slots than groups are held at once (its
  peak_held); default: exactly steps - 1 trims and K * (steps - 1) regrows (one trim point), "all": 2 * (steps
  - 1) trims and 3 * (steps - 1) - 1 regrows (two points; the root's own pool: steps - 1 and steps - 2);
  Slot-Reuse on every RS (the end-of-backward trim waits for the last RS); no slot freed while a
  group's storage holds it; losses, sharded gradients and parameters bit-identical to stock and to
  the same pool without trimming;
* a native-enabled model dropped without disable(): its slots are freed at the next
  free_dropped()/enable()/disable() (never inside garbage collection; collective at world 2), its GroupStates
  leave NATIVE_SLOTS, and the patches are removed.

Run by hand: python tests/multirank/test_fsdp_slot_trim.py worker <rank> <world> <port>
"""

import gc
import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # sim_comm.py: the simulated tideComm
from fsdp_llama import batch, build_model, init_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402
from test_fsdp_training import _bitexact, _compare  # noqa: E402

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve()
STEPS = 5
BLOCKS = 5
K = 2


# ------------------------------------------------------------------------------------------
# host-only: the pool on a scripted schedule
# ------------------------------------------------------------------------------------------
class _Exec:
    def __init__(self):
        import torch

        self.torch = torch
        self.live = {}
        self.log = []

    def alloc_slot(self, n):
        t = self.torch.randint(0, 255, (n,), dtype=self.torch.uint8)
        self.live[t.data_ptr()] = n
        self.log.append(("alloc", t.data_ptr()))
        return t

    def free_slot(self, t):
        assert self.live.pop(t.data_ptr(), None) is not None, "freed twice or never allocated"
        self.log.append(("free", t.data_ptr()))


class _Group:
    def __init__(self, name):
        self.label = name
        self.store = None


def _scripted(trim, steps, eval_steps=0):
    """Forward A, B (one held at a time), backward B + prefetch A (two held), RS after each release;
    then `eval_steps` forward-only steps. `trim`: False, True (the default points: end of forward) or "all"
    (end of forward and end of backward). Returns the pool and its residency after every event."""
    from nccl_tide.fsdp._slot_binders import _Binder
    from nccl_tide.fsdp._slot_pool import TRIM_ALL, TRIM_DEFAULT, SlotPool

    class _NoBind(_Binder):
        name = "test"

        def bind(self, store, slot):
            assert slot.live, "bound a trimmed slot"
            store["ptr"] = slot.ptr

        def unbind(self, store, slot):
            store["ptr"] = None

        def check(self, slot):
            pass

    ex = _Exec()
    phases = TRIM_ALL if trim == "all" else TRIM_DEFAULT
    pool = SlotPool(ex, 1000, 2, "t", shared=True, binder=_NoBind(), trim=bool(trim), trim_phases=phases)
    a, b = _Group("a"), _Group("b")
    a.store, b.store = {}, {}
    trace = []
    held = {}

    def acq(g, ph):
        held[g.label] = pool.acquire(g, ph)
        assert held[g.label] is not None
        trace.append((f"acq {g.label}{ph}", pool.resident(), pool.held))

    def rel(g, ph, rs=True):
        pool.release(held.pop(g.label), None, ph)
        if rs:
            pool.after_reduce(g)
        trace.append((f"rel {g.label}{ph}", pool.resident(), pool.held))

    for _ in range(steps):
        for g in (a, b):
            acq(g, "F")
            rel(g, "F", rs=False)
        acq(b, "B")
        acq(a, "B")
        rel(b, "B")
        rel(a, "B")
    for _ in range(eval_steps):
        for g in (a, b):
            acq(g, "F")
            rel(g, "F", rs=False)
    return pool, ex, trace, (a, b)


def test_trim_learning_scripted():
    """The default trims at the end of forward only: the end of backward keeps the slots for the next forward."""
    pool, ex, trace, (a, b) = _scripted(True, 4)
    assert pool.trim_points == {(id(b), "F")}, pool.trim_points  # the last forward release; no backward point
    st = pool.stats()
    assert st["trim_at"] == ["end of forward"], st
    assert st["trim_points"] == 1 and st["peak_held"] == 2 and st["peak_resident"] == 2, st
    # step 0 learns the point (F->B at its first backward acquire); from step 1 on the last forward release leaves
    # nothing resident, the backward regrows both slots (B and its prefetch A) and keeps them past its last release
    ends = [r for (ev, r, h) in trace if ev == "rel bF"]
    bends = [r for (ev, r, h) in trace if ev == "rel aB"]
    assert ends == [2, 0, 0, 0] and bends == [2, 2, 2, 2], (ends, bends)
    # per step after the first: one trim (2 slots), 2 regrows in backward, none in forward (both slots live)
    assert st["trims"] == 3 and st["trimmed"] == 2 * 3 and st["regrows"] == 2 * 3, st
    for ev, r, h in trace[8:]:
        assert r <= 2 and r >= h, (ev, r, h)
    assert len(ex.live) == 2  # no trim after the last backward: its slots are still allocated
    pool.free()
    assert not ex.live


def test_trim_all_scripted():
    """slot_trim="all": both idle points trim (the end of backward after its RS)."""
    pool, ex, trace, (a, b) = _scripted("all", 4)
    assert pool.trim_points == {(id(b), "F"), (id(a), "B")}, pool.trim_points  # the last release of each phase
    st = pool.stats()
    assert st["trim_at"] == ["end of forward", "end of backward"], st
    assert st["trim_points"] == 2 and st["peak_held"] == 2 and st["peak_resident"] == 2, st
    # step 0 learns (F->B at its first backward acquire, B->F at step 1's first forward acquire); from then on
    # the last forward release and the last backward release (after its RS) leave nothing resident
    ends = [r for (ev, r, h) in trace if ev == "rel bF"]
    bends = [r for (ev, r, h) in trace if ev == "rel aB"]
    assert ends == [2, 0, 0, 0] and bends == [2, 0, 0, 0], (ends, bends)
    # step 1: trims at both ends, regrows 2 in backward; steps 2, 3: also 1 regrow in forward (A; B reuses it)
    assert st["trims"] == 6 and st["regrows"] == 2 + 3 + 3, st
    # never more resident than held at once plus the free slot a forward keeps between its blocks
    for ev, r, h in trace[8:]:
        assert r <= 2 and r >= h, (ev, r, h)
    assert len(ex.live) == 0  # the last trim freed everything
    pool.free()
    assert not ex.live


def test_trim_phases_checked():
    from nccl_tide.fsdp._slot_binders import _Binder
    from nccl_tide.fsdp._slot_pool import SlotPool

    with pytest.raises(ValueError, match="trim_phases"):
        SlotPool(_Exec(), 1000, 1, "t", shared=True, binder=_Binder(), trim=True, trim_phases={"F", "X"})


@pytest.mark.parametrize("mode", [True, "all"])
def test_trim_unlearns_when_the_schedule_changes(mode):
    pool, ex, trace, (a, b) = _scripted(mode, 3, eval_steps=3)
    # forward-only steps after training: the end-of-forward point trims once more (the first eval forward),
    # then the next acquire is a forward again, so it is no trim point any more; the end of backward still is
    # one with "all" (the default never learns it)
    assert pool.trim_points == ({(id(a), "B")} if mode == "all" else set()), pool.trim_points
    evals = [r for (ev, r, h) in trace[len(trace) - 12:] if ev == "rel bF"]
    assert evals[-1] == 1, trace[-12:]  # no more trims once unlearned: the forward's slot stays
    pool.free()
    assert not ex.live


def test_slot_trim_argument():
    import torch.nn as nn

    import nccl_tide.fsdp as tfsdp
    from nccl_tide.errors import InvalidArgumentError

    for bad in ("yes", 1, "ALL"):
        with pytest.raises(InvalidArgumentError, match="slot_trim"):
            tfsdp.enable(nn.Linear(2, 2), slot_trim=bad)


def test_no_trim_keeps_slots():
    pool, ex, trace, _ = _scripted(False, 3)
    assert all(r == 2 for _, r, _h in trace), trace
    st = pool.stats()
    assert st["trims"] == 0 and st["regrows"] == 0 and st["trim_points"] == 0, st
    pool.free()
    assert not ex.live


# ------------------------------------------------------------------------------------------
# binder "torch" (shard world size 1): stream ordering of a move that the caching allocator relocates
# ------------------------------------------------------------------------------------------
class _FakeHeap:
    """A caching allocator of one stream in miniature: free blocks by address, best fit, lowest address first."""

    def __init__(self, free_blocks):
        self.free = dict(free_blocks)  # address -> size
        self.next = 1 << 30
        self.log = []  # ("alloc" | "free", address)

    def malloc(self, n):
        fits = sorted((size, addr) for addr, size in self.free.items() if size >= n)
        if fits:
            _size, addr = fits[0]
            del self.free[addr]
        else:
            addr, self.next = self.next, self.next + n
        self.log.append(("alloc", addr))
        return addr

    def release(self, addr, n):
        self.free[addr] = n
        self.log.append(("free", addr))


class _FakeStorage:
    def __init__(self, heap, n=0):
        self.heap, self.n = heap, 0
        self.ptr = 0
        self.resize_(n)

    def resize_(self, n):
        if self.n:
            self.heap.release(self.ptr, self.n)
            self.ptr, self.n = 0, 0
        if n:
            self.ptr, self.n = self.heap.malloc(n), n

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.n

    size = nbytes


class _FakeTensor:
    def __init__(self, storage):
        self.storage, self.cap = storage, storage.n

    def untyped_storage(self):
        return self.storage

    def data_ptr(self):
        return self.storage.ptr

    def numel(self):
        return self.cap


class _FakeStream:
    def __init__(self, name):
        self.name, self.count, self.log = name, 0, []

    def record_event(self):
        self.count += 1
        ev = f"{self.name}#{self.count}"
        self.log.append(("record", ev))
        return ev

    def wait_event(self, ev):
        self.log.append(("wait", ev))


def test_torch_binder_relocated_unbind_waits_for_the_release_event():
    """A reshard whose move the allocator relocates (the freed block merged with a neighbour, another block fits
    better) gives the parameters' block back to torch's cache at once: the home stream must wait for the release
    event (the parameters' last readers, recorded on the stream FSDP2 resharded on) before any later allocation
    can take that block, not only for the slot's earlier events."""
    import contextlib

    import torch

    from nccl_tide.fsdp._slot_binders import _TorchBinder
    from nccl_tide.fsdp._slot_pool import SlotPool

    heap = _FakeHeap({})
    cap = 4 << 20

    class Binder(_TorchBinder):
        def __init__(self):
            super().__init__(torch.device("cpu"))
            self.cuda, self.home = True, _FakeStream("home")

        def capacity(self, nbytes):
            return cap

        def _stream(self):
            return contextlib.nullcontext()

        def new_memory(self, capacity):
            self.allocs += 1
            return _FakeTensor(_FakeStorage(heap, capacity))

        def check(self, slot):
            pass

    binder = Binder()
    pool = SlotPool(None, cap, 1, "t", shared=True, binder=binder, trim=False)
    g = _Group("g")
    g.store = _FakeStorage(heap)
    slot = pool.acquire(g, "F")
    assert slot is not None and g.store.data_ptr() == slot.ptr
    params = g.store.data_ptr()
    slot.written("ag#1")  # the AG into it
    heap.free[1 << 20] = cap  # a free block of the same size at a lower address: the unbind relocates
    compute = _FakeStream("compute")  # FSDP2 resharded on this stream (the parameters' readers)
    release_ev = compute.record_event()
    pool.release(slot, release_ev, "F")
    assert binder.moved == 1 and slot.ptr == 1 << 20 and g.store.data_ptr() == 0, (binder.moved, slot.ptr)
    assert heap.free.get(params) == cap  # the parameters' block is torch's now
    waits = [ev for kind, ev in binder.home.log if kind == "wait"]
    assert release_ev in waits, (release_ev, binder.home.log)  # else the next allocation on home may overwrite it
    assert "ag#1" in waits, binder.home.log
    pool.free()


# ------------------------------------------------------------------------------------------
# FSDP2 worker
# ------------------------------------------------------------------------------------------
def _shard(model):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mp_policy=mp)
    return model


def _train(model, rank, steps, comm=None, probes=None):
    import torch
    import torch.nn.functional as F

    from fsdp_llama import VOCAB

    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.01)
    out = {"losses": [], "grads": []}
    hook = None
    if comm is not None:
        from nccl_tide.fsdp._slot_memory import resident_bytes

        def probe(where):  # every slot byte resident now (tideSlotAlloc'd or, binder "torch", torch's), and TIDE's
            probes[where].append(resident_bytes())
            probes[where + "_tide"].append(comm.live_bytes)

        hook = model.norm.register_forward_hook(lambda *_: probe("fwd_end"))
    for step in range(steps):
        x, y = batch(step, rank)
        loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        if comm is not None:
            probe("bwd_end")
        out["losses"].append(loss.item())
        out["grads"].append([p.grad.to_local().detach().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    if hook is not None:
        hook.remove()
    out["params"] = [p.to_local().detach().clone() for p in model.parameters()]
    return out


def _native(comms, rank, trim):
    import nccl_tide.fsdp as tfsdp
    from nccl_tide.fsdp import _slot_memory

    model = _shard(build_model(0, layers=BLOCKS))
    h = tfsdp.enable(model, executor="native", slot_pool=K, slot_trim=trim)
    (comm,) = comms.values()
    bad = []
    orig_free = comm.free_slot

    def checked_free(slot):  # never free a slot a group's storage still holds
        for g in h.groups:
            if g.store is not None and g.store.size() and g.store.data_ptr() == slot.data_ptr():
                bad.append(g.label)
        return orig_free(slot)

    comm.free_slot = checked_free
    torch_binders = {id(p.binder): p.binder for p in h.pools if p.torch_memory}
    for b in torch_binders.values():  # binder "torch": a block goes back to torch only from an unowned slot
        orig_release = b.release_memory

        def checked_release(slot, orig_release=orig_release):
            if slot.owner is not None or slot.base.untyped_storage().nbytes() != slot.capacity:
                bad.append(f"torch slot {slot.index}")
            for g in h.groups:
                if g.store is not None and g.store.size() and g.store.data_ptr() == slot.base.data_ptr():
                    bad.append(g.label)
            return orig_release(slot)

        b.release_memory = checked_release
    resident, resident_all = [], []

    def on_resident(nbytes):  # the hook's bytes are TIDE's (tideSlotAlloc); every slot byte alongside
        resident.append(nbytes)
        resident_all.append(_slot_memory.resident_bytes())

    _slot_memory.residency_hooks.append(on_resident)
    probes = {"fwd_end": [], "bwd_end": [], "fwd_end_tide": [], "bwd_end_tide": []}
    calls0 = (comm.slot_allocs, comm.slot_frees, comm.foreign_ag, comm.foreign_staging)
    try:
        out = _train(model, rank, STEPS, comm, probes)
    finally:
        _slot_memory.residency_hooks.remove(on_resident)
    calls = [now - was for now, was in zip((comm.slot_allocs, comm.slot_frees, comm.foreign_ag, comm.foreign_staging),
                                           calls0)]
    out["stats"] = h.stats()
    outside_after = _slot_memory.outside_torch_bytes()
    dedicated = sum(p.capacity for p in h.pools if p.solo or not p.shared)  # the root's slot, own or dedicated
    tfsdp.disable(model)
    comm.free_slot = orig_free
    out["sim"] = {
        "probes": probes,
        "dedicated_bytes": dedicated,
        "resident_timeline": resident_all,
        "tide_resident_timeline": resident,
        # tideSlotAlloc / tideSlotFree calls inside the steps (each free: a device synchronize on a GPU), AGs into and
        # RS staging in memory that is no TIDE slot (world size 1, binder "torch")
        "step_slot_allocs": calls[0],
        "step_slot_frees": calls[1],
        "foreign_ag": calls[2],
        "foreign_staging": calls[3],
        "outside_torch_after": outside_after,
        "freed_held": bad,
        "live_after_disable": comm.live_slots,
        "freed_empty": comm.freed_empty,
        "staging_used": comm.staging_used,
    }
    return out


def _dropped(comms, rank, world):
    """A native-enabled model trained 2 steps and dropped without disable()."""
    import weakref

    import nccl_tide.fsdp as tfsdp
    from nccl_tide.fsdp import _group, _patch

    (comm,) = comms.values()
    before = comm.live_slots
    model = _shard(build_model(1, layers=BLOCKS))
    h = tfsdp.enable(model, executor="native", slot_pool=K, slot_trim=False)  # slots stay allocated until dropped
    n_states = len(h.groups)
    _train(model, rank, 2)
    live_enabled = comm.live_slots - before
    in_native = sum(1 for g in h.groups if g.store is not None and _group.NATIVE_SLOTS.get(g.store._cdata) is g)
    ref = weakref.ref(model)
    state_refs = [weakref.ref(g) for g in h.groups]
    del model, h
    gc.collect()
    live_after_gc = comm.live_slots - before  # the finalizer ran in this collection
    for _ in range(2):  # GroupState <-> its comms: cyclic garbage once the handle went in the first collection
        gc.collect()
    res = {
        "n_states": n_states,
        "live_enabled": live_enabled,
        "in_native_slots": in_native,
        "model_alive": ref() is not None,
        "states_alive": sum(r() is not None for r in state_refs),
        "native_slots_left": len(_group.NATIVE_SLOTS),
        "live_after_gc": live_after_gc,
        "patched_after_gc": _patch.installed(),
    }
    res["freed_by_free_dropped"] = tfsdp.free_dropped()
    res["live_after_free_dropped"] = comm.live_slots - before
    res["patched_after_free_dropped"] = _patch.installed()
    return res


def _dropped_root_kept_block(comms, rank):
    """The model collected while one of its pooled groups' GroupState is still alive (held here directly; a
    submodule kept on its own keeps the root alive through FSDP2's state, so the finalizer does not even run
    then): free_dropped() must not free slots a live group still uses, and frees them once it goes too."""
    import nccl_tide.fsdp as tfsdp

    (comm,) = comms.values()
    before = comm.live_slots
    model = _shard(build_model(2, layers=BLOCKS))
    h = tfsdp.enable(model, executor="native", slot_pool=K, slot_trim=False)
    _train(model, rank, 1)
    enabled = comm.live_slots - before
    keep = next(g for g in h.groups if g.pool is not None and g.pool.shared)
    ref = __import__("weakref").ref(model)
    del model, h
    for _ in range(3):
        gc.collect()
    res = {"enabled": enabled, "model_alive": ref() is not None, "freed_while_kept": tfsdp.free_dropped(),
           "live_while_kept": comm.live_slots - before}
    del keep
    for _ in range(3):
        gc.collect()
    res["freed_after"] = tfsdp.free_dropped()
    res["live_after"] = comm.live_slots - before
    return res


def worker(rank, world, port):
    init_worker(rank, world, port)
    from sim_comm import use_sim_native

    comms = use_sim_native()
    res = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stock = _train(_shard(build_model(0, layers=BLOCKS)), rank, STEPS)
        # the default trimming: slot_trim=None resolves to on at world size 1; at world 2 it is asked for
        runs = {"default": _native(comms, rank, None if world == 1 else True), "all": _native(comms, rank, "all")}
        kept = _native(comms, rank, False)
        res["dropped"] = _dropped(comms, rank, world)
        res["dropped_kept_block"] = _dropped_root_kept_block(comms, rank)
    for mode, run in runs.items():
        res[mode] = {"stats": run["stats"], "sim": run["sim"], "vs_stock": _compare(stock, run),
                     "vs_kept": _compare(kept, run)}
    res["kept"] = {"stats": kept["stats"], "sim": kept["sim"]}
    res["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "TideFSDPWarning"]
    print(json.dumps(res))


# ------------------------------------------------------------------------------------------
# pytest side
# ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def w1():
    return run_script(SCRIPT, 1, [], timeout=240)


@pytest.fixture(scope="module")
def w2():
    return run_script(SCRIPT, 2, [], timeout=240)


def _pool_stats(st):
    (p,) = [p for p in st["slot_pools"] if p["shared"] and not p["solo"]]
    return p


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["default", "all"])
@pytest.mark.parametrize("world", [1, 2])
def test_trim_frees_idle_slots(world, mode, request):
    """Both settings free the pool's slots at the end of forward; only "all" frees slots at the end of backward."""
    every = mode == "all"  # slot_trim="all": both idle points, the root in a trimming slot of its own
    for rank, res in enumerate(request.getfixturevalue(f"w{world}")):
        st, sim = res[mode]["stats"], res[mode]["sim"]
        pool, top = _pool_stats(st), st["slot_pool"]
        kst = res["kept"]["stats"]
        assert top["trim"] is True and kst["slot_pool"]["trim"] is False, (top, kst["slot_pool"])
        want_at = ["end of forward", "end of backward"] if every else ["end of forward"]
        assert top["trim_at"] == pool["trim_at"] == want_at and kst["slot_pool"]["trim_at"] == [], (top, pool)
        assert top["pooled_groups"] == BLOCKS and top["own_slots"] == int(every), top
        assert top["dedicated_slots"] == int(not every), top
        assert kst["slot_pool"]["dedicated_slots"] == 1 and kst["slot_pool"]["own_slots"] == 0, kst["slot_pool"]
        cap, ded = pool["slot_capacity"], sim["dedicated_bytes"]
        full = ded + K * cap
        owns = [p for p in st["slot_pools"] if p["solo"]]
        assert len(owns) == int(every), owns
        # the learned idle points: end of forward (before the head/loss/backward start) holds only the root's slot
        # (FSDP2 keeps the root unsharded into backward) in both settings
        fwd, bwd = sim["probes"]["fwd_end"], sim["probes"]["bwd_end"]
        assert len(fwd) == len(bwd) == STEPS, sim["probes"]
        assert fwd[0] == bwd[0] == full, (fwd, bwd, ded, cap)  # step 0 learns
        assert fwd[1:] == [ded] * (STEPS - 1), (fwd, ded)
        if every:  # end of backward (before the optimizer step): nothing, stock FSDP2 has resharded the root too
            assert bwd[1:] == [0] * (STEPS - 1), (bwd, ded)
        else:  # the default does not trim there: the K slots backward regrew and the root's dedicated slot stay
            assert bwd == [full] * STEPS and bwd[-1] > 0, (bwd, full)
        for own in owns:
            assert own["slots"] == 1 and own["trim"] and own["slot_capacity"] == ded, own
            assert own["trims"] == STEPS - 1 and own["regrows"] == STEPS - 2 and own["trim_points"] == 1, own
        # where the slots come from: at world size 1 torch's cache (binder "torch"; trims and regrows are no
        # tideSlotFree / tideSlotAlloc, so no device synchronize and no driver allocation inside a step; the AGs
        # write into torch memory, RS stages there); at world 2 tideSlotAlloc (peers map them), one call per slot
        if world == 1:
            assert pool["binder"] == top["binder"] == "torch" and pool["torch_memory"], pool
            assert sim["step_slot_allocs"] == 0 and sim["step_slot_frees"] == 0, sim
            # every pooled AG (forward and backward) and with "all" the root's (its own slot is torch memory too)
            root = next(g for g in st["tide_groups"] if g["group"] == "<root>")
            assert sim["foreign_ag"] == STEPS * 2 * BLOCKS + (STEPS if every else 0), sim
            # Slot-Reuse of every pooled group's RS (and of the root's, "all", where its RS plan fits its slot)
            assert sim["foreign_staging"] == STEPS * BLOCKS + (root["rs_staging_in_slot"] if every else 0), sim
            # TIDE's own bytes: the root's dedicated slot only, at every point ("all": the root is torch memory too)
            assert set(sim["probes"]["fwd_end_tide"]) == set(sim["probes"]["bwd_end_tide"]) == {0 if every else ded}
            assert top["tide_resident_slot_bytes"] == (0 if every else ded), top
            assert set(sim["tide_resident_timeline"]) <= {0, ded}, sim
            assert sim["outside_torch_after"] == (0 if every else ded), sim  # torch slots: in torch's counters only
            # moves between the slots' holders and the groups' storages: at every bind and every unbind (every slot
            # is free again after the steps), and the bind and unbind of each slot's check at enable(); per pool (with
            # "all" the root's own pool is torch memory too: its moves are its own, not added to the shared pool's)
            for p in [pool] + owns:
                assert p["moves"] == 2 * p["hits"] + 2 * p["slots"], p
        else:
            assert pool["binder"] != "torch" and not pool["torch_memory"], pool
            own_trims = sum(o["trims"] for o in owns)
            assert sim["step_slot_frees"] == pool["trimmed"] + own_trims, (sim, pool)
            assert sim["step_slot_allocs"] == pool["regrows"] + sum(o["regrows"] for o in owns), (sim, pool)
            assert sim["foreign_ag"] == 0 and sim["foreign_staging"] == 0, sim
        # without trimming the K slots stay resident at both points
        kf, kb = res["kept"]["sim"]["probes"]["fwd_end"], res["kept"]["sim"]["probes"]["bwd_end"]
        assert set(kf) == set(kb) == {res["kept"]["sim"]["dedicated_bytes"] + K * cap}, (kf, kb)
        # accounting: never more pool slots resident than held at once (peak_held = K here), trims and
        # regrows exactly where the schedule has its idle points
        assert pool["peak_held"] == K and pool["peak_resident"] == K, pool
        assert all(0 <= r <= ded + pool["peak_held"] * cap for r in sim["resident_timeline"]), sim
        assert min(sim["resident_timeline"]) == (0 if every else ded), sim
        assert max(sim["resident_timeline"]) == full, sim
        if every:
            # steps 1..4: a trim at each end; regrows: 2 in step 1's backward, then 1 in each forward (block 0; the
            # next block reuses its slot) + 2 in each backward (the last block and its prefetch)
            assert pool["trims"] == 2 * (STEPS - 1) and pool["regrows"] == 3 * (STEPS - 1) - 1, pool
            assert pool["trim_points"] == 2, pool
        else:
            # steps 1..4: one trim at the end of forward (both slots), 2 regrows in backward (the last block and its
            # prefetch); the forward binds the slots backward left live: no regrow there
            assert pool["trims"] == STEPS - 1 and pool["trimmed"] == K * (STEPS - 1), pool
            assert pool["regrows"] == K * (STEPS - 1) and pool["trim_points"] == 1, pool
        assert pool["trim_blocked"] == 0, pool
        assert top["trims"] == pool["trims"] + sum(o["trims"] for o in owns), top
        assert top["peak_resident_slot_bytes"] == full, top
        assert sim["freed_held"] == [] and sim["freed_empty"] == 0 and sim["live_after_disable"] == 0, sim
        # no fallback, Slot-Reuse on every RS of every pooled group (the end-of-backward trim waits for the RS)
        assert pool["fallbacks"] == 0 and pool["bind_failures"] == 0 and st["total"]["fallbacks"] == 0, pool
        for g in st["tide_groups"]:
            assert g["ag_pool_fallbacks"] == 0 and g["rs_calls"] == STEPS, g
            if g["group"] == "<root>":  # its own slot ("all"): staging there when the RS plan fits the root's slot
                assert g["pool"] == ("own" if every else "dedicated"), g
                if every:
                    assert g["rs_staging_in_slot"] == (STEPS if g["slot_reuse_fits"] else 0), g
            else:
                assert g["rs_staging_in_slot"] == STEPS, g
        # numbers: bit-identical to the same pool without trimming and to stock (1 and 2 ranks)
        vs_kept = res[mode]["vs_kept"]
        assert vs_kept["losses_stock"] == vs_kept["losses_tide"], vs_kept
        assert vs_kept["grads_bitequal"] and vs_kept["params_bitequal"], vs_kept
        _bitexact(res[mode]["vs_stock"])
        assert not [w for w in res["warnings"] if "no free slot" in w], res["warnings"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2])
def test_dropped_model_slots_released(world, request):
    for rank, res in enumerate(request.getfixturevalue(f"w{world}")):
        d = res["dropped"]
        assert d["n_states"] == BLOCKS + 1 and d["in_native_slots"] == BLOCKS + 1, d
        assert d["live_enabled"] == K + 1, d  # slot_trim=False: the pool and the root's dedicated slot
        assert not d["model_alive"] and d["states_alive"] == 0 and d["native_slots_left"] == 0, d
        # Never freed inside garbage collection (it may run inside a CUDA graph capture or on another thread;
        # at world size > 1 the free is collective): held until the next free_dropped() (or enable()/disable()).
        assert d["patched_after_gc"] is True, d
        assert d["live_after_gc"] == d["live_enabled"] and d["freed_by_free_dropped"] >= 1, d
        assert d["live_after_free_dropped"] == 0 and d["patched_after_free_dropped"] is False, d
        k = res["dropped_kept_block"]
        assert not k["model_alive"], k  # the finalizer ran: the pools are queued
        assert k["enabled"] == K + 1 and k["freed_while_kept"] == 0 and k["live_while_kept"] == K + 1, k
        assert k["freed_after"] >= 1 and k["live_after"] == 0, k


if __name__ == "__main__" and len(sys.argv) >= 5 and sys.argv[1] == "worker":
    worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))

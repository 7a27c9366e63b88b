# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The native executor's slot pool (nccl_tide/fsdp/_slot_pool.py) on CPU, gloo, 2 and 4 ranks,
through the simulated tideComm (benchmarks/sim_comm.py, _SimComm in test_fsdp_training.py: slots torch cannot resize,
every slot poisoned with NaN before a TIDE-AG writes it, RS staging poisoned with NaN).

Each case trains the same model three times from the same seed: stock FSDP2, native with one
dedicated slot per group (slot_pool=0), native with a pool of K slots. The pooled run must be
bit-identical to the dedicated one (same collectives, same order: only where the bytes live
differs) at every world size, and to stock with the tolerances of test_fsdp_training.py
(bit-identical for 2 ranks). The stats and the simulated comm must show the pool at work:
every pooled AG either hit a slot or fell back, exactly K + dedicated distinct slots written,
peak slot bytes = K * largest pooled slot + dedicated slots (less than one slot per group),
the no-free-slot fallback where prefetching needs more than K slots (stock AG counted, warned).

Case string: name,k=K,layers=N,raf=<T|F per block>,root=<T|F|auto>,accum=A,fwd=<prefetch depth>

Run by hand: python tests/multirank/test_fsdp_slot_pool.py worker <rank> <world> <port> <cases>
"""

import os
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
from fsdp_llama import build_model, run_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402
from test_fsdp_parity import _StockCounter  # noqa: E402
from test_fsdp_training import _bitexact, _close4, _compare, _run_accum, _use_sim_native  # noqa: E402

pytest.importorskip("torch")

STEPS = 4
SCRIPT = Path(__file__).resolve()


# ------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------
def _build(opts):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    raf = opts["raf"]
    model = build_model(0, layers=len(raf))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer, r in zip(model.layers, raf):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=r == "T")
    root = {} if opts["root"] == "auto" else {"reshard_after_forward": opts["root"] == "T"}
    fully_shard(model, mp_policy=mp, **root)
    for i in [int(x) for x in opts.get("pin", "").split("+") if x]:
        # FSDP2 2.15's set_keep_unsharded_storage sets this on every FSDPParam of the module; older
        # FSDP2 ignores it (still frees), the pool must refuse the group all the same
        from nccl_tide.fsdp import _param_groups

        for pg in _param_groups(model.layers[i]._get_fsdp_state()):
            for fp in pg.fsdp_params:
                fp.keep_unsharded_storage = True
    depth = int(opts.get("fwd", 0))  # explicit forward prefetch: each block prefetches the next `depth`
    if depth:
        for i, layer in enumerate(model.layers):
            nxt = list(model.layers[i + 1 : i + 1 + depth])
            if nxt:
                layer.set_modules_to_forward_prefetch(nxt)
    return model


def _native(opts, rank, k, counter):
    import nccl_tide.fsdp as tfsdp
    from forced_binder import force_binder

    comms = _use_sim_native()
    force_binder(opts.get("bind"))  # None: the library's choice (alloc, emulated on CPU)
    model = _build(opts)
    counter.take()
    os.environ["NCCL_TIDE_FSDP_CAST_IN_PLACE"] = opts.get("cast", "1")  # read by enable()
    try:
        handle = tfsdp.enable(model, executor="native", slot_pool=k)
    finally:
        del os.environ["NCCL_TIDE_FSDP_CAST_IN_PLACE"]
    out = _run_accum(model, rank, STEPS, int(opts.get("accum", 1)))
    out["stats"] = handle.stats()
    out["stock_calls"] = counter.take()
    (comm,) = comms.values()
    sim = {
        "peak_bytes": comm.peak_bytes,
        "ag_slots": len(comm.ag_ptrs),
        "staging_used": comm.staging_used,
        "live_enabled": comm.live_slots,
        "ag_in_place": comm.ag_in_place,  # shards the AG found in their own slot position
        "ag_params": sum(g["ag_calls"] * g["n_params"] for g in out["stats"]["tide_groups"]),
    }
    force_binder(None)
    tfsdp.disable(model)
    sim.update(live_after_disable=comm.live_slots, freed_empty=comm.freed_empty)
    more = _run_accum(model, rank, 1, 1)  # stock FSDP2 again after disable()
    sim["finite_after_disable"] = all(abs(x) < 1e9 for x in more["losses"])
    out["sim"] = sim
    return out


def run_case(rank, case, counter):
    import nccl_tide.fsdp as tfsdp
    import nccl_tide.reference_executor as rex
    from nccl_tide.errors import InvalidArgumentError
    from nccl_tide.fsdp import _warn

    name, *kv = case.split(",")
    opts = dict(x.split("=") for x in kv)
    k = int(opts["k"])
    _warn.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stock = _run_accum(_build(opts), rank, STEPS, int(opts.get("accum", 1)))
        dedicated = _native(opts, rank, 0, counter)
        pooled = _native(opts, rank, k, counter)
    tfsdp.get_executor = rex.get_executor
    bad = {}
    for arg in (-1, 1.5, True):
        try:
            tfsdp.enable(_build(opts), executor="reference", slot_pool=arg)
            bad[str(arg)] = "accepted"
        except InvalidArgumentError as e:
            bad[str(arg)] = str(e)
    os.environ["NCCL_TIDE_FSDP_CAST_IN_PLACE"] = "yes"
    m = _build(opts)
    try:
        tfsdp.enable(m, executor="reference")
        bad_cast = "accepted"
    except InvalidArgumentError as e:
        bad_cast = str(e) + ("" if tfsdp.handle_of(m) is None else " (but a handle was left)")
    finally:
        del os.environ["NCCL_TIDE_FSDP_CAST_IN_PLACE"]
    return {
        "name": name,
        "opts": opts,
        "k": k,
        "vs_stock": _compare(stock, pooled),
        "vs_dedicated": _compare(dedicated, pooled),
        "dedicated": {"stats": dedicated["stats"], "sim": dedicated["sim"]},
        "pooled": {"stats": pooled["stats"], "sim": pooled["sim"], "stock_calls": pooled["stock_calls"]},
        "bad_args": bad,
        "bad_cast": bad_cast,
        "warnings": [str(w.message) for w in caught if w.category.__name__ == "TideFSDPWarning"],
    }


def worker(rank, world, port, cases):
    run_worker(rank, world, port, cases, run_case, _StockCounter())


# ------------------------------------------------------------------------------------------
# pytest side
# ------------------------------------------------------------------------------------------
CASES = {
    # 5 blocks reshard after forward, the root (default) stays unsharded: pool of 2, no fallback
    "p2": "p2,k=2,raf=TTTTT,root=auto",
    # a mix: the root reshards after forward too (pooled, the largest slot), 2 blocks do not
    # (dedicated); backward holds the root, a block and the prefetched block: 3 slots
    "p3mix": "p3mix,k=3,raf=TFTTFT,root=T",
    # gradient accumulation (2 microbatches), a dedicated block in the middle
    "p2accum": "p2accum,k=2,raf=TTFTT,root=auto,accum=2",
    # one slot: the backward prefetch finds it held by the block being differentiated
    "fb1": "fb1,k=1,raf=TTTT,root=auto",
    # forward prefetch of 2 blocks ahead needs 3 slots: some forward AGs fall back
    "fb2fwd": "fb2fwd,k=2,raf=TTTTT,root=auto,fwd=2",
    # the cast into a packed send buffer (NCCL_TIDE_FSDP_CAST_IN_PLACE=0) instead of into the slot
    "p2nocast": "p2nocast,k=2,raf=TTTTT,root=auto,cast=0",
    # the swap binder (UntypedStorage._swap_data_ptr_, torch >= 2.12) instead of the default alloc one
    "p2swap": "p2swap,k=2,raf=TTTTT,root=auto,bind=swap",
    # block 1 keeps its unsharded storage (set_keep_unsharded_storage): a dedicated slot, warned once
    "pin": "pin,k=2,raf=TTTTT,root=auto,pin=1",
}
EXPECT_FALLBACK = {"fb1", "fb2fwd"}


def _launch(world, names):
    ranks = run_script(SCRIPT, world, [";".join(CASES[n] for n in names)], timeout=280)
    return {res["name"]: [r["results"][i] for r in ranks] for i, res in enumerate(ranks[0]["results"])}


@pytest.fixture(scope="module")
def w2():
    return _launch(2, ["p2", "p3mix", "p2accum", "fb1", "p2swap", "pin", "p2nocast"])


@pytest.fixture(scope="module")
def w4():
    return _launch(4, ["p2", "p3mix", "fb2fwd"])


def _check(res, world):
    name, k, opts = res["name"], res["k"], res["opts"]
    from nccl_tide.fsdp._slot_binders import block_size

    raf, root = opts["raf"], opts["root"]
    pins = [int(x) for x in opts.get("pin", "").split("+") if x]
    n_pooled = raf.count("T") + (root == "T") - len(pins)
    n_dedicated = raf.count("F") + (root != "T") + len(pins)
    st, sim = res["pooled"]["stats"], res["pooled"]["sim"]
    ded_st, ded_sim = res["dedicated"]["stats"], res["dedicated"]["sim"]
    pool = st["slot_pool"]
    groups = {g["group"]: g for g in st["tide_groups"]}
    ded_groups = {g["group"]: g for g in ded_st["tide_groups"]}
    assert st["executor"] == "native" and not st["stock_groups"] and len(groups) == len(raf) + 1, st

    # which groups share the pool: exactly those FSDP2 reshards after forward
    pooled = [g for g in groups.values() if g.get("pool") != "dedicated"]
    assert pool["size"] == k and pool["requested"] == k, pool
    assert len(pooled) == n_pooled == pool["pooled_groups"] and pool["dedicated_slots"] == n_dedicated, pool
    assert groups["<root>"]["pool"] == ("dedicated" if root != "T" else pooled[0]["pool"]), groups["<root>"]
    assert ded_st["slot_pool"]["size"] == 0 and ded_st["slot_pool"]["dedicated_slots"] == len(groups), ded_st
    assert pool["binder"] == opts.get("bind", "alloc") and pool["bind_failures"] == 0, pool
    for i in pins:
        assert groups[f"layers.{i}"]["pool"] == "dedicated", groups
    pin_warned = [w for w in res["warnings"] if "set_keep_unsharded_storage" in w]
    assert len(pin_warned) == (1 if pins else 0), res["warnings"]
    # the pool never held more slots than it has, and every one of them at some moment
    assert pool["peak_held"] == k, pool

    # the pool was used: every pooled AG hit a slot or fell back (as many AGs as the dedicated run)
    assert pool["hits"] > 0 and pool["distinct_slots_used"] == k, pool
    for label, g in groups.items():
        assert g["ag_calls"] + g["ag_pool_fallbacks"] == ded_groups[label]["ag_calls"], (label, g)
        assert g["rs_calls"] == ded_groups[label]["rs_calls"] == STEPS, (label, g)
    assert sum(g["ag_calls"] for g in pooled) == pool["hits"], pool
    assert sim["ag_slots"] == k + n_dedicated, sim  # distinct slot addresses TIDE-AG wrote into
    assert ded_sim["ag_slots"] == len(groups), ded_sim

    # memory: K slots of the largest pooled group + the dedicated slots, less than one per group
    max_pooled = max(g["slot_bytes"] for g in pooled)
    dedicated_bytes = sum(g["slot_bytes"] for g in groups.values() if g.get("pool") == "dedicated")
    assert pool["slot_bytes"] == max_pooled, pool
    cap = pool["slot_capacity"]  # the binder's rounding (alloc, emulated on CPU: 512-byte blocks; swap: exact)
    assert cap == (block_size(max_pooled) if pool["binder"] == "alloc" else max_pooled), pool
    assert sim["peak_bytes"] == k * cap + dedicated_bytes == pool["resident_slot_bytes"], (sim, pool)
    assert ded_sim["peak_bytes"] == sum(g["slot_bytes"] for g in groups.values()), ded_sim
    assert sim["peak_bytes"] < ded_sim["peak_bytes"], (sim, ded_sim)
    assert sim["live_enabled"] == k + n_dedicated and sim["live_after_disable"] == 0, sim
    assert sim["freed_empty"] == 0 and sim["finite_after_disable"], sim

    # fallbacks: none where K slots cover the schedule; where they do not, stock AG for exactly
    # those calls (FSDP2's own foreach_all_gather ran once per fallback), warned once
    fell = sum(g["ag_pool_fallbacks"] for g in groups.values())
    assert pool["fallbacks"] == fell and st["total"]["fallbacks"] == fell, (pool, st["total"])
    assert res["pooled"]["stock_calls"]["foreach_all_gather"] == fell, res["pooled"]["stock_calls"]
    assert res["pooled"]["stock_calls"]["foreach_all_gather_copy_out"] == 0, res["pooled"]["stock_calls"]
    warned = [w for w in res["warnings"] if "no free slot" in w]
    if name in EXPECT_FALLBACK:
        assert fell > 0 and len(warned) == 1, (fell, res["warnings"])
    else:
        assert fell == 0 and not warned and all(g["fallbacks"] == {} for g in groups.values()), (groups, warned)
        # Slot-Reuse: the RS of a pooled group stages in a free pool slot (its vacated one) every
        # time; with accumulation the fp32 gradients' staging is twice the bf16 slot: own staging
        for g in pooled:
            assert g["rs_staging_in_slot"] == (STEPS if opts.get("accum", "1") == "1" else 0), g
    assert sim["staging_used"] == sum(g["rs_staging_in_slot"] for g in groups.values()), sim

    # numbers: pooled == dedicated bit for bit; vs stock as the other native tests
    assert res["vs_dedicated"]["losses_stock"] == res["vs_dedicated"]["losses_tide"], res["vs_dedicated"]
    assert res["vs_dedicated"]["grads_bitequal"] and res["vs_dedicated"]["params_bitequal"], res["vs_dedicated"]
    _bitexact(res["vs_stock"]) if world <= 2 else _close4(res["vs_stock"])
    assert all(v != "accepted" and "slot_pool" in v for v in res["bad_args"].values()), res["bad_args"]
    assert "NCCL_TIDE_FSDP_CAST_IN_PLACE" in res["bad_cast"] and "left" not in res["bad_cast"], res["bad_cast"]

    # mixed precision (bf16 from fp32 shards): every TIDE-AG's cast wrote the shards into their own slot
    # positions and the AG found them there (one in-place shard per parameter), unless switched off
    for run in ("pooled", "dedicated"):
        gs = res[run]["stats"]["tide_groups"]
        calls = sum(g["ag_calls"] for g in gs)
        in_place = sum(g["cast_in_place"] for g in gs)
        assert calls > 0 and in_place == (calls if opts.get("cast", "1") == "1" else 0), (run, calls, in_place)
        want = res[run]["sim"]["ag_params"] if in_place else 0  # one in-place shard per parameter and AG
        assert res[run]["sim"]["ag_in_place"] == want and (want > 0) == (in_place > 0), (run, res[run]["sim"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["p2", "p3mix", "p2accum", "fb1", "p2swap", "pin", "p2nocast"])
def test_slot_pool_2_ranks(case, w2):
    for res in w2[case]:
        _check(res, 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["p2", "p3mix", "fb2fwd"])
def test_slot_pool_4_ranks(case, w4):
    for res in w4[case]:
        _check(res, 4)


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])

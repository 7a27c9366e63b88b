# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp in the rest of the training loop (CPU, gloo, 1, 2 and 4 processes):
activation checkpointing, a state_dict save/load round trip, and shard world size 1.

Gradient accumulation without reduce and both reshard_after_forward modes are covered by
tests/multirank/test_fsdp_parity.py (cases accum, raf0, accum4); this file does not repeat them.

Each case compares with stock FSDP2 from the same seed in the same process group, with the
tolerances of test_fsdp_parity.py (see its docstring): bit-identical for 1 and 2 ranks (the
all-gather is a byte copy; for 2 ranks fp32 a + b == b + a, /2 is exact; for 1 rank TIDE-RS
is the exact bf16 -> fp32 conversion FSDP2's copy-in does); for 4 ranks step-0 gradients
within 2^-22 of the largest gradient, later steps at bf16 resolution of the update.

Run by hand: python tests/multirank/test_fsdp_training.py worker <rank> <world> <port> <cases>
"""

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # sim_comm.py: the simulated tideComm
from fsdp_llama import VOCAB, batch, build_model, run_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402
from test_fsdp_parity import _bits_equal, _maxdiff, _shard, _StockCounter  # noqa: E402

pytest.importorskip("torch")

STEPS = 5
SAVE_AFTER = 2  # state_dict case: steps before the save; the fresh model runs the rest
SCRIPT = Path(__file__).resolve()


# ------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------
def _shard_ckpt(model):
    """Every block in checkpoint_wrapper (activation checkpointing), then fully_shard as usual."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i in range(len(model.layers)):
        model.layers[i] = checkpoint_wrapper(model.layers[i])
        fully_shard(model.layers[i], mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mp_policy=mp, reshard_after_forward=True)
    return model


def _steps(model, opt, rank, first, last, out):
    import torch.nn.functional as F

    for step in range(first, last):
        x, y = batch(step, rank)
        loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        out["losses"].append(loss.item())
        out["grads"].append([p.grad.to_local().detach().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()


def _run_accum(model, rank, steps, accum):
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.01)
    out = {"losses": [], "grads": []}
    for step in range(steps):
        for micro in range(accum):
            model.set_requires_gradient_sync(micro == accum - 1)
            x, y = batch(step * accum + micro, rank)
            loss = F.cross_entropy(model(x).float().reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
        out["losses"].append(loss.item())
        out["grads"].append([p.grad.to_local().detach().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    out["params"] = [p.to_local().detach().clone() for p in model.parameters()]
    return out


def _run(model, rank, steps):
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.01)
    out = {"losses": [], "grads": []}
    _steps(model, opt, rank, 0, steps, out)
    out["params"] = [p.to_local().detach().clone() for p in model.parameters()]
    return out


def _run_with_reload(rank, executor):
    """TIDE: SAVE_AFTER steps, save model + optimizer state (DTensors), load both into a fresh
    TIDE-enabled model built from another seed, run the remaining steps."""
    import nccl_tide.fsdp as tfsdp
    import torch
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    first = _shard(build_model(0))
    h1 = tfsdp.enable(first, executor=executor)
    opt = torch.optim.AdamW(first.parameters(), lr=2e-2, weight_decay=0.01)
    out = {"losses": [], "grads": []}
    _steps(first, opt, rank, 0, SAVE_AFTER, out)
    msd = {k: v.detach().clone() for k, v in get_model_state_dict(first).items()}
    osd = get_optimizer_state_dict(first, opt)
    osd = torch.utils._pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, osd)
    stats_first = h1.stats()
    tfsdp.disable(first)
    del first, opt

    fresh = _shard(build_model(7))  # different initial values: the load must overwrite them all
    h2 = tfsdp.enable(fresh, executor=executor)
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=2e-2, weight_decay=0.01)
    set_model_state_dict(fresh, msd)
    set_optimizer_state_dict(fresh, opt2, osd)
    _steps(fresh, opt2, rank, SAVE_AFTER, STEPS, out)
    out["params"] = [p.to_local().detach().clone() for p in fresh.parameters()]
    # model.state_dict() of the TIDE model after training: sharded DTensors equal to the params
    sd = fresh.state_dict()
    out["state_dict_matches_params"] = all(
        torch.equal(sd[k].to_local(), p.to_local()) for k, p in fresh.named_parameters()
    )
    out["stats"] = [stats_first, h2.stats()]
    tfsdp.disable(fresh)
    return out


from sim_comm import SimComm as _SimComm  # noqa: E402, F401  (benchmarks/fsdp_step.py uses it too)
from sim_comm import use_sim_native as _use_sim_native  # noqa: E402


def _compare(stock, tide):
    return {
        "losses_stock": stock["losses"],
        "losses_tide": tide["losses"],
        "loss_maxdiff": max(abs(a - b) for a, b in zip(stock["losses"], tide["losses"])),
        "grad_maxdiff_step0": _maxdiff(stock["grads"][0], tide["grads"][0]),
        "grad_max": max(g.abs().max().item() for gs in stock["grads"] for g in gs if g.numel()),
        "grads_bitequal": all(_bits_equal(a, b) for a, b in zip(stock["grads"], tide["grads"])),
        "param_maxdiff": _maxdiff(stock["params"], tide["params"]),
        "params_bitequal": _bits_equal(stock["params"], tide["params"]),
    }


def run_case(rank, name, counter):
    import nccl_tide.fsdp as tfsdp

    executor = "reference"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if name == "ckpt":
            stock = _run(_shard_ckpt(build_model(0)), rank, STEPS)
            counter.take()
            model = _shard_ckpt(build_model(0))
            handle = tfsdp.enable(model, executor=executor)
            tide = _run(model, rank, STEPS)
            res = _compare(stock, tide) | {"stats": [handle.stats()]}
            tfsdp.disable(model)
        elif name == "statedict":
            stock = _run(_shard(build_model(0)), rank, STEPS)
            counter.take()
            tide = _run_with_reload(rank, executor)
            res = _compare(stock, tide) | {"stats": tide["stats"], "sd_ok": tide["state_dict_matches_params"]}
        elif name.startswith("native_sim"):
            opts = dict(kv.split("=") for kv in name.split(",")[1:])
            accum = int(opts.get("accum", "1"))
            raf = opts.get("raf", "1") == "1"
            stock_m = _shard(build_model(0), raf)
            stock = _run_accum(stock_m, rank, STEPS, accum)
            counter.take()
            comms = _use_sim_native()
            model = _shard(build_model(0), raf)
            handle = tfsdp.enable(model, executor="native")
            tide = _run_accum(model, rank, STEPS, accum)
            res = _compare(stock, tide) | {"stats": [handle.stats()]}
            (comm,) = comms.values()
            res["sim"] = {"live_slots_enabled": comm.live_slots, "staging_used": comm.staging_used}
            tfsdp.disable(model)
            res["sim"]["live_slots_after_disable"] = comm.live_slots
            more = _run_accum(model, rank, 1, 1)  # stock FSDP2 again after disable()
            res["sim"]["finite_after_disable"] = all(abs(x) < 1e9 for x in more["losses"])
            import nccl_tide.reference_executor as rex

            tfsdp.get_executor = rex.get_executor
        elif name == "world1":
            stock = _run(_shard(build_model(0)), rank, STEPS)
            counter.take()
            model = _shard(build_model(0))
            handle = tfsdp.enable(model, executor=executor)
            tide = _run(model, rank, STEPS)
            res = _compare(stock, tide) | {"stats": [handle.stats()]}
            tfsdp.disable(model)
        else:
            raise ValueError(name)
    res["name"] = name.split(",")[0]
    res["stock_calls_tide_run"] = counter.take()
    res["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "TideFSDPWarning"]
    return res


def worker(rank, world, port, cases):
    run_worker(rank, world, port, cases, run_case, _StockCounter())


# ------------------------------------------------------------------------------------------
# pytest side
# ------------------------------------------------------------------------------------------
def _launch(world, cases):
    ranks = run_script(SCRIPT, world, [";".join(cases)], timeout=240)
    assert not any(r["patched_at_exit"] for r in ranks)
    return {res["name"]: [r["results"][i] for r in ranks] for i, res in enumerate(ranks[0]["results"])}


@pytest.fixture(scope="module")
def w1():
    return _launch(1, ["world1", "native_sim"])


@pytest.fixture(scope="module")
def w2():
    return _launch(2, ["ckpt", "statedict", "native_sim", "native_sim_accum,accum=2,raf=0"])


@pytest.fixture(scope="module")
def w4():
    return _launch(4, ["ckpt", "statedict", "native_sim"])


def _tide_everywhere(stats, world, ag_per_step, steps):
    assert stats["executor"] == "reference" and len(stats["tide_groups"]) == 3 and not stats["stock_groups"], stats
    for g in stats["tide_groups"]:
        assert g["world_size"] == world and g["fallbacks"] == {}, g
        assert g["ag_calls"] == ag_per_step * steps and g["rs_calls"] == steps, g


def _bitexact(res):
    assert res["losses_stock"] == res["losses_tide"], res
    assert res["grads_bitequal"], res["grad_maxdiff_step0"]
    assert res["params_bitequal"], res["param_maxdiff"]


def _close4(res):
    assert res["losses_stock"][0] == res["losses_tide"][0], res
    assert res["grad_maxdiff_step0"] <= 2.0**-22 * max(1.0, res["grad_max"]), res
    assert res["loss_maxdiff"] <= 2e-3 and res["param_maxdiff"] <= 2e-2, res


@pytest.mark.timeout(300)
def test_world1_runs_tide_path(w1):
    """Shard world size 1 (FSDP2 itself skips the collectives): TIDE's world-1 wrappers run
    TIDE-AG and TIDE-RS, counted, no fallback, no FSDP2 AG/copy-out/copy-in; bit-identical."""
    (res,) = w1["world1"]
    _tide_everywhere(res["stats"][0], 1, 2, STEPS)
    _bitexact(res)
    assert set(res["stock_calls_tide_run"].values()) == {0}, res["stock_calls_tide_run"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_activation_checkpointing(world, request):
    """checkpoint_wrapper on every block: the recomputation in backward runs on the parameters
    TIDE gathered for backward; forward AG + backward AG per step, one RS."""
    for res in request.getfixturevalue(f"w{world}")["ckpt"]:
        _tide_everywhere(res["stats"][0], world, 2, STEPS)
        assert set(res["stock_calls_tide_run"].values()) == {0}, res["stock_calls_tide_run"]
        _bitexact(res) if world == 2 else _close4(res)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_state_dict_round_trip(world, request):
    """Train SAVE_AFTER steps with TIDE, save model and optimizer state (get_model_state_dict /
    get_optimizer_state_dict: DTensors), load into a fresh TIDE-enabled model built from another
    seed (set_model_state_dict / set_optimizer_state_dict), continue: equal to the uninterrupted
    stock run (hence to the uninterrupted TIDE run, test_fsdp_parity)."""
    for res in request.getfixturevalue(f"w{world}")["statedict"]:
        first, second = res["stats"]
        _tide_everywhere(first, world, 2, SAVE_AFTER)
        _tide_everywhere(second, world, 2, STEPS - SAVE_AFTER)
        assert res["sd_ok"], res
        _bitexact(res) if world == 2 else _close4(res)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "world,case", [(1, "native_sim"), (2, "native_sim"), (2, "native_sim_accum"), (4, "native_sim")]
)
def test_native_executor_glue_simulated(world, case, request):
    """The native executor's FSDP2 side on CPU with a simulated tideComm (_SimComm): slots that
    torch cannot resize (FSDP2's free_storage must never reach them), Slot-Reuse staging
    poisoned with NaN (the next AG must rewrite every parameter), the shard pointer table at
    world 1, per-step counts, slots freed by disable(). Bit-identical to stock (1 and 2 ranks;
    4 ranks: the tolerances of the module docstring)."""
    for res in request.getfixturevalue(f"w{world}")[case]:
        st = res["stats"][0]
        assert st["executor"] == "native" and st["provider"] == "sim" and not st["stock_groups"], st
        for g in st["tide_groups"]:
            assert g["fallbacks"] == {} and g["world_size"] == world, g
            # raf=1: forward + backward AG; accum=2 with raf=0: one forward AG per microbatch
            assert g["rs_calls"] == STEPS and g["ag_calls"] == 2 * STEPS, g
            # Slot-Reuse when the plan fits (FSDP2 reshards after backward in every case here). With
            # accumulation the syncing RS reduces FSDP2's fp32 accumulated gradients: its staging is twice
            # the bf16 slot, so the comm's own staging is used.
            if case.endswith("accum"):
                assert g["rs_staging_in_slot"] == 0, g
            elif g["slot_reuse_fits"]:
                assert g["rs_staging_in_slot"] == STEPS, g
        assert res["sim"]["staging_used"] == sum(g["rs_staging_in_slot"] for g in st["tide_groups"]), res
        # The default (slot_trim=None) trims where the shard world size is 1: there the 3 groups are pooled in torch
        # memory (binder "torch", no tideSlotAlloc: the comm holds no slot); elsewhere no trimming, 3 groups <= K = 3,
        # a dedicated slot each, all allocated while enabled (tests/multirank/test_fsdp_slot_trim.py covers trimming)
        trim = st["slot_pool"]["trim"]
        assert trim is (world == 1), st["slot_pool"]
        assert st["slot_pool"]["binder"] == ("torch" if trim else None), st["slot_pool"]
        assert st["slot_pool"]["pooled_groups"] == (3 if trim else 0), st["slot_pool"]
        assert res["sim"]["live_slots_enabled"] == (0 if trim else 3), res["sim"]
        assert res["sim"]["live_slots_after_disable"] == 0, res
        assert res["sim"]["finite_after_disable"], res
        _bitexact(res) if world <= 2 else _close4(res)


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])


@pytest.mark.timeout(300)
def test_gpu_native_test_rehearsed_on_cpu(tmp_path):
    """tests/gpu/test_fsdp_native.py's worker and assertions on CPU (gloo, world 1, the reference
    executor standing in for native): the GPU test's plumbing cannot first fail on the GPU."""
    sys.path.insert(0, str(SCRIPT.parents[1] / "gpu"))
    import test_fsdp_native as gpu_test

    rep = gpu_test.launch(tmp_path, "cpu")
    gpu_test.check(rep, gpu=False)
    assert rep["native_vs_reference"]["bitequal"] and rep["native_vs_stock"]["bitequal"], rep

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp on FSDP2 (CPU, gloo, 2 and 4 processes): TIDE vs stock from the same seed.

Each case trains a tiny Llama-style model (bf16 params, fp32 reduce) twice in the same
process group, stock FSDP2 then TIDE-enabled, and compares losses, sharded fp32 gradients
and parameters. What the tolerances rest on:
* the all-gather is a byte copy, so the unsharded bf16 parameters are identical; forward
  and backward run the same bf16 kernels on identical inputs, so the per-rank bf16
  gradients are identical too;
* the only difference is the order of the fp32 reduction: TIDE folds ((g0 + g1) + g2) + g3
  (tide.h), gloo's reduce-scatter uses its own order. For 2 ranks fp32 a + b == b + a and
  /2 is exact, so everything must be bit-identical. For 4 ranks the sums may differ by an
  ulp or so; such a difference can flip a bf16 rounding of a parameter in a later step,
  after which the two runs drift apart at bf16 resolution. Grads are compared at fp32
  rounding level in step 0 and at bf16 resolution of the update afterwards.

Run by hand: python tests/multirank/test_fsdp_parity.py worker <rank> <world> <port> <case>
"""

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
from fsdp_llama import VOCAB, batch, build_model, run_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402

pytest.importorskip("torch")

STEPS = 5
SCRIPT = Path(__file__).resolve()


# ------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------
def _shard(model, reshard_after_forward=True, reduce_dtype="fp32", shard1_layer=None):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard

    rd = {"fp32": torch.float32, "bf16": torch.bfloat16}[reduce_dtype]
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=rd)
    for i, layer in enumerate(model.layers):
        kw = {}
        if i == shard1_layer:  # an unsupported group: Shard(1) for its 2-D weights (dim 1 = 26 or 45)
            kw["shard_placement_fn"] = lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % 2 == 0 else Shard(0)
        fully_shard(layer, mp_policy=mp, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(model, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


def _train(model, rank, steps, accum=1, disable_at=None):
    import nccl_tide.fsdp as tfsdp
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.01)
    losses, grads = [], []
    for step in range(steps):
        if disable_at is not None and step == disable_at:
            tfsdp.disable(model)
        for micro in range(accum):
            model.set_requires_gradient_sync(micro == accum - 1)
            x, y = batch(step * accum + micro, rank)
            logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
            loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.to_local().detach().clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    params = [p.to_local().detach().clone() for p in model.parameters()]
    return losses, grads, params


def _maxdiff(a, b):

    return max(((x.double() - y.double()).abs().max().item() if x.numel() else 0.0) for x, y in zip(a, b))


def _bits_equal(a, b):
    import torch

    return all(torch.equal(x, y) for x, y in zip(a, b))


class _StockCounter:
    """Counts calls that reach FSDP2's own AG / copy-out / copy-in (installed before enable(),
    so TIDE's wrappers forward to these for stock groups and calls)."""

    def __init__(self):
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pgm

        self.counts = {"foreach_all_gather": 0, "foreach_all_gather_copy_out": 0, "foreach_reduce_scatter_copy_in": 0}
        # torch >= 2.15 calls foreach_all_gather_copy_out for every group and the copy itself
        # through the group's hook (TIDE's for TIDE groups): count stock's split copy there
        copy_out = (coll, "_copy_all_gather_outputs") if hasattr(coll, "_copy_all_gather_outputs") else None
        for mod, name, key in (
            (pgm, "foreach_all_gather", "foreach_all_gather"),
            copy_out + ("foreach_all_gather_copy_out",) if copy_out else (pgm, "foreach_all_gather_copy_out", None),
            (coll, "foreach_reduce_scatter_copy_in", "foreach_reduce_scatter_copy_in"),
        ):
            setattr(mod, name, self._wrap(key or name, getattr(mod, name)))

    def _wrap(self, name, fn):
        def wrapper(*a, **k):
            self.counts[name] += 1
            return fn(*a, **k)

        return wrapper

    def take(self):
        out, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return out


def _checking_executor(group):
    """A reference executor that re-checks every TIDE-RS and TIDE-AG of the real training run
    against the host executor (libnccl-tide.so) on every rank's inputs: bit for bit."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from nccl_tide import Layout, host_all_gather, host_reduce_scatter
    from nccl_tide.reference_executor import ReferenceExecutor

    def gather(t):
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t.contiguous(), group=group)
        return parts

    def host_layout(layout):
        return Layout(
            [p.numel for p in layout.params],
            layout.dtypes[0],
            layout.world_size,
            layout.ranks_per_node,
            0,
            row_numels=[p.row_numel for p in layout.params],
        )

    class Checking(ReferenceExecutor):
        checked = {"ag": 0, "rs": 0}

        def all_gather(self, layout, send, params):
            temp = super().all_gather(layout, send, params)
            sends = gather(send)
            with host_layout(layout) as hl:
                shards = [[s[p.send_offset // p.elem_size :][: p.shard_numel] for p in hl.params] for s in sends]
                ref = host_all_gather(hl, shards)[layout.rank]
            for r, t in zip(ref, params):
                got = t.clone().view(torch.int16).numpy().view(r.dtype)  # clone: .numpy() pins the storage
                assert np.array_equal(r, got), "AG != host executor"
            Checking.checked["ag"] += 1
            return temp

        def reduce_scatter(self, layout, grads, out, op="sum", scale=1.0, staging=None):
            temp = super().reduce_scatter(layout, grads, out, op, scale, staging)
            every = [gather(g.reshape(-1)) for g in grads]  # [param][rank]
            with host_layout(layout) as hl:
                ref = host_reduce_scatter(
                    hl, [[every[i][r] for i in range(len(grads))] for r in range(layout.world_size)], "fp32", op, scale
                )
            assert np.array_equal(ref[layout.rank], out.clone().numpy()), "RS != host executor"
            Checking.checked["rs"] += 1
            return temp

    return Checking(group)


def run_case(rank, case, counter):
    import nccl_tide.fsdp as tfsdp
    import torch
    import torch.distributed as dist
    from nccl_tide.fsdp import _adapter

    opts = dict(kv.split("=") for kv in case.split(",")[1:])
    name = case.split(",")[0]
    raf = opts.get("raf", "1") == "1"
    accum = int(opts.get("accum", "1"))
    rdt = opts.get("reduce", "fp32")
    shard1 = int(opts["shard1"]) if "shard1" in opts else None
    disable_at = int(opts["disable_at"]) if "disable_at" in opts else None
    tied = opts.get("tied", "0") == "1"
    steps = int(opts.get("steps", STEPS))

    stock = _shard(build_model(0, tied), raf, rdt, shard1)
    counter.take()
    s_losses, s_grads, s_params = _train(stock, rank, steps, accum)
    stock_counts = counter.take()

    model = _shard(build_model(0, tied), raf, rdt, shard1)
    saved = list(_adapter.ADAPTERS)
    if name == "unknown_version":
        _adapter.ADAPTERS[:] = [_adapter.Adapter("torch-0.0", {})]
        _adapter.select(refresh=True)
    checker = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            handle = tfsdp.enable(model, executor=opts.get("executor", "reference"))
        finally:
            _adapter.ADAPTERS[:] = saved
            _adapter.select(refresh=True)
        if opts.get("check") == "1":
            checker = _checking_executor(dist.group.WORLD)
            for g in handle.groups:
                g.executor = checker
        t_losses, t_grads, t_params = _train(model, rank, steps, accum, disable_at)
    tide_counts = counter.take()
    if handle.enabled:
        tfsdp.disable(model)
    return {
        "name": name,
        "case": case,
        "losses_stock": s_losses,
        "losses_tide": t_losses,
        "loss_maxdiff": max(abs(a - b) for a, b in zip(s_losses, t_losses)),
        "grad_maxdiff_step0": _maxdiff(s_grads[0], t_grads[0]),
        "grad_maxdiff": max(_maxdiff(a, b) for a, b in zip(s_grads, t_grads)),
        "grad_max": max(g.abs().max().item() for gs in s_grads for g in gs if g.numel()),
        "grads_bitequal": all(_bits_equal(a, b) for a, b in zip(s_grads, t_grads)),
        "param_maxdiff": _maxdiff(s_params, t_params),
        "params_bitequal": _bits_equal(s_params, t_params),
        "stats": handle.stats(),
        "stock_calls_stock_run": stock_counts,
        "stock_calls_tide_run": tide_counts,
        "checked": dict(checker.checked) if checker else None,
        "warnings": [str(w.message) for w in caught if w.category.__name__ == "TideFSDPWarning"],
        "enabled_after_train": handle.enabled,
        "torch_dtype_ok": str(torch.bfloat16),
    }


def worker(rank, world, port, cases):
    run_worker(rank, world, port, cases, run_case, _StockCounter())


# ------------------------------------------------------------------------------------------
# pytest side: one launch per world size runs every case (process start-up dominates)
# ------------------------------------------------------------------------------------------
W2_CASES = [
    "parity,check=1",  # reshard_after_forward=True; every AG/RS re-checked against the host executor
    "raf0,raf=0",  # reshard_after_forward=False
    "accum,accum=2",  # gradient accumulation without reduce (set_requires_gradient_sync(False))
    "shard1,shard1=0",  # layers.0 uses Shard(1): unsupported, stock FSDP2 with a warning
    "rsbf16,reduce=bf16",  # reduce_dtype=bf16: every RS falls back per call with a warning
    "disable,disable_at=3",  # disable() after 3 steps: stock FSDP2 again
    "unknown_version",  # private source hashes match no adapter: stock FSDP2, one warning
    "auto,executor=auto,tied=1",  # executor='auto' on CPU: reference + warning; tied embeddings
]
W4_CASES = ["parity4,check=1", "accum4,accum=2,raf=0"]


@pytest.fixture(scope="module")
def w2():
    ranks = run_script(SCRIPT, 2, [";".join(W2_CASES)], timeout=240)
    assert not any(r["patched_at_exit"] for r in ranks)  # every disable() removed the patches
    return {res["name"]: [r["results"][i] for r in ranks] for i, res in enumerate(ranks[0]["results"])}


@pytest.fixture(scope="module")
def w4():
    ranks = run_script(SCRIPT, 4, [";".join(W4_CASES)], timeout=240)
    return {res["name"]: [r["results"][i] for r in ranks] for i, res in enumerate(ranks[0]["results"])}


def _all_tide(res, world, groups=3):
    st = res["stats"]
    assert st["executor"] == "reference" and st["adapter"] in ("torch-2.11", "torch-2.12", "torch-2.13", "torch-2.14", "torch-2.15"), st
    assert len(st["tide_groups"]) == groups, st
    for g in st["tide_groups"]:
        assert g["world_size"] == world
        assert g["fallbacks"] == {}, g  # supported groups never fall back
        assert g["stock_bytes_avoided"] > 0


def _bitexact(res):
    assert res["losses_stock"] == res["losses_tide"], res
    assert res["grads_bitequal"], res["grad_maxdiff"]
    assert res["params_bitequal"], res["param_maxdiff"]


@pytest.mark.timeout(300)
def test_world2_parity_bitexact_and_patched_paths_used(w2):
    for res in w2["parity"]:
        _all_tide(res, 2)
        # 2 ranks: fp32 a + b == b + a and /2 is exact, so TIDE == stock bit for bit.
        _bitexact(res)
        for g in res["stats"]["tide_groups"]:
            assert g["ag_calls"] == 2 * STEPS, g  # forward + backward (resharded after forward)
            assert g["rs_calls"] == STEPS, g
            assert g["rs_staging_in_slot"] == STEPS, g  # Slot-Reuse: the slot is vacated after backward
        # FSDP2's own all-gather, copy-out and chunk_cat copy-in never ran with TIDE on
        assert set(res["stock_calls_tide_run"].values()) == {0}, res["stock_calls_tide_run"]
        assert min(res["stock_calls_stock_run"].values()) > 0, res["stock_calls_stock_run"]
        # every TIDE collective of the run was re-checked bit for bit against the host executor
        assert res["checked"] == {"ag": 3 * 2 * STEPS, "rs": 3 * STEPS}, res["checked"]


@pytest.mark.timeout(300)
def test_world2_reshard_after_forward_false(w2):
    for res in w2["raf0"]:
        _all_tide(res, 2)
        _bitexact(res)
        for g in res["stats"]["tide_groups"]:
            assert g["ag_calls"] == STEPS and g["rs_calls"] == STEPS, g  # no backward all-gather
        assert set(res["stock_calls_tide_run"].values()) == {0}


@pytest.mark.timeout(300)
def test_world2_gradient_accumulation(w2):
    for res in w2["accum"]:
        _all_tide(res, 2)
        _bitexact(res)
        for g in res["stats"]["tide_groups"]:
            assert g["rs_calls"] == STEPS, g  # one RS per step, none for the no-sync microbatch
            assert g["ag_calls"] == 2 * 2 * STEPS, g
        assert set(res["stock_calls_tide_run"].values()) == {0}


@pytest.mark.timeout(300)
def test_world2_unsupported_group_falls_back_with_warning(w2):
    for res in w2["shard1"]:
        st = res["stats"]
        assert [g["group"] for g in st["stock_groups"]] == ["layers.0"], st
        assert "Shard(1)" in st["stock_groups"][0]["reason"]
        assert sorted(g["group"] for g in st["tide_groups"]) == ["<root>", "layers.1"]
        assert any("keeping stock FSDP2 for layers.0" in w and "Shard(1)" in w for w in res["warnings"]), res
        _bitexact(res)
        # only layers.0 reached FSDP2's own AG/copy-out/copy-in: 2 AG per step, 1 RS per step
        assert res["stock_calls_tide_run"] == {
            "foreach_all_gather": 2 * STEPS,
            "foreach_all_gather_copy_out": 2 * STEPS,
            "foreach_reduce_scatter_copy_in": STEPS,
        }, res["stock_calls_tide_run"]


@pytest.mark.timeout(300)
def test_world2_reduce_dtype_bf16_falls_back_per_call(w2):
    for res in w2["rsbf16"]:
        st = res["stats"]
        assert len(st["tide_groups"]) == 3
        for g in st["tide_groups"]:
            assert g["rs_calls"] == 0 and g["ag_calls"] == 2 * STEPS, g
            (reason,) = g["fallbacks"]
            assert "reduce_dtype torch.bfloat16" in reason and g["fallbacks"][reason] == STEPS
        assert sum("stock FSDP2 reduce-scatter" in w for w in res["warnings"]) == 1, res["warnings"]
        _bitexact(res)


@pytest.mark.timeout(300)
def test_world2_disable_restores_stock(w2):
    for res in w2["disable"]:
        _bitexact(res)
        assert not res["stats"]["enabled"]
        for g in res["stats"]["tide_groups"]:
            assert g["ag_calls"] == 2 * 3 and g["rs_calls"] == 3, g  # 3 steps with TIDE, then stock
        calls = res["stock_calls_tide_run"]
        assert calls["foreach_all_gather"] == 3 * 2 * (STEPS - 3), calls
        assert calls["foreach_reduce_scatter_copy_in"] == 3 * (STEPS - 3), calls


@pytest.mark.timeout(300)
def test_world2_unknown_torch_source_keeps_stock(w2):
    for res in w2["unknown_version"]:
        st = res["stats"]
        assert st["tide_groups"] == [] and len(st["stock_groups"]) == 3 and st["adapter"] is None
        assert all("matches no supported release" in g["reason"] for g in st["stock_groups"])
        msgs = [w for w in res["warnings"] if "matches no supported release" in w]
        assert len(msgs) == 1 and "foreach_reduce" in msgs[0], res["warnings"]
        _bitexact(res)


@pytest.mark.timeout(300)
def test_world2_auto_executor_and_tied_embeddings(w2):
    for res in w2["auto"]:
        _all_tide(res, 2)
        _bitexact(res)
        # auto on gloo/CPU: the reference executor, with one warning saying why (not native)
        assert any("uses the reference executor" in w and "gloo" in w for w in res["warnings"]), res["warnings"]


@pytest.mark.timeout(300)
def test_world4_uneven_shards(w4):
    """4 ranks: dim-0 sizes 37, 26, 45 and 3 do not divide 4 (rank 3 holds only padding of
    each block's 3-row gate). Step 0 must agree to fp32 rounding of the sum order; later
    steps to bf16 resolution (module docstring). Observed: bit-identical (bf16 inputs summed
    in fp32 are exact in any order unless their exponents differ by more than ~16)."""
    for res in w4["parity4"]:
        _all_tide(res, 4)
        assert res["losses_stock"][0] == res["losses_tide"][0]
        assert res["grad_maxdiff_step0"] <= 2.0**-22 * max(1.0, res["grad_max"]), res
        assert res["loss_maxdiff"] <= 2e-3, res
        assert res["param_maxdiff"] <= 2e-2, res
        assert res["checked"] == {"ag": 3 * 2 * STEPS, "rs": 3 * STEPS}, res["checked"]
        for g in res["stats"]["tide_groups"]:
            assert g["rs_calls"] == STEPS and g["ag_calls"] == 2 * STEPS, g


@pytest.mark.timeout(300)
def test_world4_accumulation_without_reshard(w4):
    for res in w4["accum4"]:
        _all_tide(res, 4)
        assert res["grad_maxdiff_step0"] <= 2.0**-22 * max(1.0, res["grad_max"]), res
        assert res["param_maxdiff"] <= 2e-2, res
        for g in res["stats"]["tide_groups"]:
            assert g["rs_calls"] == STEPS and g["ag_calls"] == 2 * STEPS, g


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])

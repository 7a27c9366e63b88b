# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp.enable(module_filter=...) and fsdp_switch scope "dense" on FSDP2 (CPU, gloo, 2 processes).

The model is a tiny MoE-style Llama: per block attention, a dense router and an experts module (torchtitan's
GroupedExperts shape: 3-D weights [experts, out, in], 3 experts so that dim 0 does not divide 2), each experts
module fully_shard'ed by itself (on its own "edp" mesh where the case says so), then the block, then the root.
Each case trains stock FSDP2 and the filtered TIDE run from the same seed in the same process group, 4 steps,
and compares losses, sharded fp32 gradients and parameters bit for bit (2 ranks: test_fsdp_parity.py says why
bit identity is the expectation). Counting wrappers installed before enable() (test_fsdp_parity._StockCounter)
show which groups reached FSDP2's own all-gather / copy-in: exactly the excluded ones.

Case string: name,attr=<experts attribute>,edp=<0|1 experts on their own mesh>,sep=<0|1 experts fully_shard'ed>

Run by hand: python tests/multirank/test_fsdp_filter.py worker <rank> <world> <port> <cases>
"""

import logging
import os
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
from fsdp_llama import VOCAB, run_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402
from test_fsdp_parity import _StockCounter  # noqa: E402
from test_fsdp_training import _bitexact, _compare, _run_accum, _use_sim_native  # noqa: E402

pytest.importorskip("torch")

STEPS = 4
LAYERS = 3
DIM, HIDDEN, N_EXPERTS = 26, 45, 3
SCRIPT = Path(__file__).resolve()


# ------------------------------------------------------------------------------------------
# worker side
# ------------------------------------------------------------------------------------------
def build_moe(seed=0, attr="experts"):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(DIM).uniform_(0.5, 1.5))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.wqkv = nn.Linear(DIM, 3 * DIM, bias=False)
            self.wo = nn.Linear(DIM, DIM, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (y.view(b, t, 2, DIM // 2).transpose(1, 2) for y in self.wqkv(x).chunk(3, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(y.transpose(1, 2).reshape(b, t, DIM))

    class Experts(nn.Module):  # every token through every expert, weighted by the router's probabilities
        def __init__(self):
            super().__init__()
            self.w1 = nn.Parameter(torch.randn(N_EXPERTS, HIDDEN, DIM) * DIM**-0.5)
            self.w3 = nn.Parameter(torch.randn(N_EXPERTS, HIDDEN, DIM) * DIM**-0.5)
            self.w2 = nn.Parameter(torch.randn(N_EXPERTS, DIM, HIDDEN) * HIDDEN**-0.5)

        def forward(self, x, probs):
            h = F.silu(torch.einsum("btd,ehd->bteh", x, self.w1)) * torch.einsum("btd,ehd->bteh", x, self.w3)
            return (torch.einsum("bteh,edh->bted", h, self.w2) * probs.unsqueeze(-1)).sum(2)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Linear(DIM, N_EXPERTS, bias=False)
            setattr(self, attr, Experts())

        def forward(self, x):
            probs = F.softmax(self.router(x).float(), -1).type_as(x)
            return getattr(self, attr)(x, probs)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.attn = RMSNorm(), Attention()
            self.moe_norm, self.moe = RMSNorm(), MoE()

        def forward(self, x):
            x = x + self.attn(self.attn_norm(x))
            return x + self.moe(self.moe_norm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(VOCAB, DIM)
            self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = RMSNorm()
            self.out = nn.Linear(DIM, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.tok(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.out(self.norm(x))

    torch.manual_seed(seed)
    return Model()


_EDP = {}


def _shard(opts, seed=0):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    attr = opts.get("attr", "experts")
    model = build_moe(seed, attr)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = None
    if opts.get("edp", "0") == "1":  # the experts' own mesh (torchtitan: edp), created once per process
        if "mesh" not in _EDP:
            _EDP["mesh"] = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("edp",))
        mesh = _EDP["mesh"]
    for layer in model.layers:
        if opts.get("sep", "1") == "1":
            fully_shard(getattr(layer.moe, attr), mesh=mesh, mp_policy=mp)
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def _not_experts(name, module):
    return "experts" not in name.split(".")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.name, record.levelname, record.getMessage()))


def _comms_state(model):
    """Per FSDP param group: are the group's comms FSDP2's defaults (nothing of TIDE installed)?"""
    from nccl_tide.fsdp import _param_groups
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    out = {}
    for name, mod in model.named_modules():
        if isinstance(mod, FSDPModule):
            for pg in _param_groups(mod._get_fsdp_state()):
                ag, rs = type(pg._all_gather_comm), type(pg._reduce_scatter_comm)
                out[name or "<root>"] = ag is DefaultAllGather and rs is DefaultReduceScatter
    return out


def _tide_run(opts, rank, counter, enable):
    """Trains the TIDE run: `enable(model)` gives the handle. Returns the run, stats, FSDP2-call counts, the
    TideFSDPWarning messages and the nccl_tide.* log records."""
    import nccl_tide.fsdp as tfsdp

    model = _shard(opts)
    rec = _Records()
    log = logging.getLogger("nccl_tide")
    old_level = log.level
    log.addHandler(rec)
    log.setLevel(logging.INFO)
    counter.take()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            handle = enable(model)
            out = _run_accum(model, rank, STEPS, 1)
    finally:
        log.removeHandler(rec)
        log.setLevel(old_level)
    out["stock_calls"] = counter.take()
    out["stats"] = handle.stats()
    out["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "TideFSDPWarning"]
    out["log"] = rec.lines
    tfsdp.disable(model)
    out["comms_after_disable"] = _comms_state(model)
    return out


def _summary(stock, tide):
    return {
        "vs_stock": _compare(stock, tide),
        "stats": tide["stats"],
        "stock_calls": tide["stock_calls"],
        "stock_calls_stock_run": stock["stock_calls"],
        "warnings": tide["warnings"],
        "log": tide["log"],
        "comms_after_disable": tide["comms_after_disable"],
    }


def _stock(opts, rank, counter):
    counter.take()
    out = _run_accum(_shard(opts), rank, STEPS, 1)
    out["stock_calls"] = counter.take()
    return out


def case_filter(opts, rank, counter):
    """enable(module_filter=) on the reference executor: the filter sees every FSDP module once."""
    import nccl_tide.fsdp as tfsdp

    seen, model_ref = [], []

    def filt(name, module):
        seen.append((name, type(module).__name__, module is model_ref[0].get_submodule(name)))
        return _not_experts(name, module)

    def enable(model):
        model_ref.append(model)
        return tfsdp.enable(model, executor="reference", module_filter=filt)

    stock = _stock(opts, rank, counter)
    res = _summary(stock, _tide_run(opts, rank, counter, enable))
    res["seen"] = seen
    return res


def case_native(opts, rank, counter):
    """The native executor's glue over the simulated comm, slot_pool=2: the pool counts only included groups."""
    import nccl_tide.fsdp as tfsdp
    import nccl_tide.reference_executor as rex

    stock = _stock(opts, rank, counter)
    comms = _use_sim_native()
    try:
        tide = _tide_run(
            opts, rank, counter, lambda m: tfsdp.enable(m, executor="native", slot_pool=2, module_filter=_not_experts)
        )
    finally:
        tfsdp.get_executor = rex.get_executor
    res = _summary(stock, tide)
    res["sim"] = [
        {"peak_bytes": c.peak_bytes, "ag_slots": len(c.ag_ptrs), "staging_used": c.staging_used, "live": c.live_slots}
        for c in comms.values()
    ]
    return res


def case_switch(opts, rank, counter):
    """fsdp_switch.apply(model, "dense") end to end (experts found by mesh or name, or their owners)."""
    from nccl_tide import fsdp_switch

    stock = _stock(opts, rank, counter)
    tide = _tide_run(opts, rank, counter, lambda m: fsdp_switch.apply(m, "dense", env={}, executor="reference"))
    return _summary(stock, tide)


def case_errors(opts, rank, counter):
    """Bad filters: a typed error naming the module, and the model left exactly as stock FSDP2."""
    import nccl_tide.fsdp as tfsdp
    from nccl_tide.errors import InvalidArgumentError
    from nccl_tide.fsdp import _patch

    stock = _stock(opts, rank, counter)
    model = _shard(opts)
    calls = []

    def raising(name, module):
        calls.append(name)
        if name == "layers.1":
            raise KeyError("no rule for " + name)
        return True

    errors = {}
    for key, filt in (("not_callable", "experts"), ("raises", raising), ("returns_none", lambda n, m: None),
                      ("returns_int", lambda n, m: 1)):
        try:
            tfsdp.enable(model, executor="reference", module_filter=filt)
            errors[key] = {"accepted": True}
        except InvalidArgumentError as e:
            errors[key] = {"type": type(e).__name__, "msg": str(e), "cause": type(e.__cause__).__name__}
        errors[key].update(handle=tfsdp.handle_of(model) is not None, patched=_patch.installed(),
                           comms=_comms_state(model))
    counter.take()
    after = _run_accum(model, rank, STEPS, 1)  # the model is still stock FSDP2: same calls, same numbers
    after["stock_calls"] = counter.take()
    # enabling afterwards works (nothing was recorded by the failed calls); a filter that excludes everything
    # gives a handle with no TIDE group and installs no patch
    none = tfsdp.enable(model, executor="reference", module_filter=lambda n, m: False)
    none_stats, none_patched = none.stats(), _patch.installed()
    tfsdp.disable(model)
    # The kill switch governs enable() itself too: NCCL_TIDE_FSDP=0 keeps every group stock (the reason says so,
    # no patch), an unknown value is refused before anything changes.
    os.environ["NCCL_TIDE_FSDP"] = "0"
    try:
        killed = tfsdp.enable(model, executor="reference")
        kill = {"stats": killed.stats(), "reasons": sorted({s["reason"] for s in killed.stock}),
                "patched": _patch.installed()}
        tfsdp.disable(model)
        os.environ["NCCL_TIDE_FSDP"] = "yes"
        try:
            tfsdp.enable(model, executor="reference")
            kill["bad"] = "accepted"
        except InvalidArgumentError as e:
            kill["bad"] = str(e)
        kill["bad_handle"] = tfsdp.handle_of(model) is not None and tfsdp.handle_of(model).enabled
    finally:
        os.environ.pop("NCCL_TIDE_FSDP", None)
    return {
        "kill": kill,
        "errors": errors,
        "raising_calls": calls,
        "vs_stock": _compare(stock, after),
        "stock_calls": after["stock_calls"],
        "stock_calls_stock_run": stock["stock_calls"],
        "none_stats": none_stats,
        "none_patched": none_patched,
    }


CASE_FNS = {"filter": case_filter, "native": case_native, "switch": case_switch, "errors": case_errors}


def run_case(rank, case, counter):
    from nccl_tide.fsdp import _warn

    name, *kv = case.split(",")
    opts = dict(x.split("=") for x in kv)
    _warn.reset()
    res = CASE_FNS[name.split("_")[0]](opts, rank, counter)
    res.update(name=name, opts=opts)
    return res


def worker(rank, world, port, cases):
    run_worker(rank, world, port, cases, run_case, _StockCounter())


# ------------------------------------------------------------------------------------------
# pytest side: one 2-rank launch runs every case
# ------------------------------------------------------------------------------------------
CASES = [
    "filter,attr=experts",  # enable(module_filter=) excluding the experts modules (by name)
    "native,attr=experts,edp=1",  # the same filter, native executor glue over the simulated comm, slot pool
    "switch_mesh,attr=routed,edp=1",  # scope dense: experts not named "experts", found by their own mesh
    "switch_name,attr=experts",  # scope dense: experts on the root's mesh, found by name
    "switch_owner,attr=experts,sep=0",  # scope dense: experts not sharded on their own: their blocks stay stock
    "errors,attr=experts",
]
BLOCKS = [f"layers.{i}" for i in range(LAYERS)]


@pytest.fixture(scope="module")
def w2():
    ranks = run_script(SCRIPT, 2, [";".join(CASES)], timeout=280)
    assert not any(r["patched_at_exit"] for r in ranks)  # every disable() removed the patches
    return {res["name"]: [r["results"][i] for r in ranks] for i, res in enumerate(ranks[0]["results"])}


def _split(res, excluded, attr="experts"):
    """TIDE groups are exactly the included modules, stock groups the excluded ones (reason: the filter),
    TIDE ran every AG/RS of its groups, FSDP2's own collectives ran exactly for the excluded groups."""
    st = res["stats"]
    included = sorted({"<root>", *BLOCKS, *(f"{b}.moe.{attr}" for b in BLOCKS)} - set(excluded))
    assert sorted(g["group"] for g in st["tide_groups"]) == included, st
    assert sorted(g["group"] for g in st["stock_groups"]) == sorted(excluded), st
    for g in st["stock_groups"]:
        assert g["reason"] == f"module_filter excluded {g['group']}", g
    for g in st["tide_groups"]:
        # the root is not resharded after forward: one AG per step; the others two (forward, backward)
        assert g["ag_calls"] == (1 if g["group"] == "<root>" else 2) * STEPS, g
        assert g["rs_calls"] == STEPS and g["fallbacks"] == {} and g["stock_bytes_avoided"] > 0, g
    n = len(excluded)  # none of them is the root: two stock AGs per step each, one stock RS
    calls = res["stock_calls"]
    assert calls["foreach_all_gather"] == 2 * STEPS * n, calls
    assert calls["foreach_reduce_scatter_copy_in"] == STEPS * n, calls
    assert res["stock_calls_stock_run"]["foreach_all_gather"] == (2 * 2 * LAYERS + 1) * STEPS, res
    # an exclusion the caller asked for is an INFO line, not a warning (and nothing else warns here: the
    # executor is named, every included group is supported)
    assert res["warnings"] == [], res["warnings"]
    info = [m for name, level, m in res["log"] if level == "INFO" and name == "nccl_tide.fsdp"]
    assert any(m.startswith("module_filter: keeping stock FSDP2 for ") and f"({n} module(s))" in m for m in info), info
    assert all(res["comms_after_disable"].values()), res["comms_after_disable"]
    _bitexact(res["vs_stock"])


EXPERTS = [f"{b}.moe.experts" for b in BLOCKS]


@pytest.mark.timeout(300)
def test_filter_excludes_experts_reference(w2):
    for res in w2["filter"]:
        _split(res, EXPERTS)
        assert res["stats"]["executor"] == "reference"
        # called once per FSDP module, in named_modules order, with its qualified name ("" for the root)
        want = [("", "FSDPModel", True)]  # fully_shard swaps in a subclass
        for b in BLOCKS:
            want += [(b, "FSDPBlock", True), (f"{b}.moe.experts", "FSDPExperts", True)]
        assert [tuple(s) for s in res["seen"]] == want, res["seen"]


@pytest.mark.timeout(300)
def test_filter_native_slot_pool_counts_included_groups(w2):
    for res in w2["native"]:
        _split(res, EXPERTS)
        st = res["stats"]
        pool = st["slot_pool"]
        groups = {g["group"]: g for g in st["tide_groups"]}
        blocks = [groups[b] for b in BLOCKS]
        # the 3 blocks share the K = 2 pool, the root has a dedicated slot; the experts groups (larger than a
        # block: had they been counted, the pool's slots would be their size) are not in it
        assert st["executor"] == "native" and pool["size"] == 2, pool
        assert pool["pooled_groups"] == LAYERS and pool["dedicated_slots"] == 1, pool
        assert groups["<root>"]["pool"] == "dedicated" and all(g["pool"] != "dedicated" for g in blocks), groups
        assert pool["slot_bytes"] == max(g["slot_bytes"] for g in blocks), pool
        expert_elems = 3 * N_EXPERTS * HIDDEN * DIM  # bf16: 2 bytes each, before padding
        assert pool["slot_bytes"] < 2 * expert_elems, pool
        assert pool["resident_slot_bytes"] == 2 * pool["slot_capacity"] + groups["<root>"]["slot_bytes"], pool
        assert pool["fallbacks"] == 0 and pool["hits"] == sum(g["ag_calls"] for g in blocks), pool
        # one simulated tideComm (the dense process group); its slots: K pool slots + the root's
        (sim,) = res["sim"]
        assert sim["ag_slots"] == 3 and sim["live"] == 0, sim  # live: after disable()
        assert sim["peak_bytes"] == pool["resident_slot_bytes"], (sim, pool)
        assert all(g["rs_staging_in_slot"] == STEPS for g in blocks), blocks  # Slot-Reuse on every RS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case, attr", [("switch_mesh", "routed"), ("switch_name", "experts")])
def test_switch_dense_end_to_end(w2, case, attr):
    for res in w2[case]:
        _split(res, [f"{b}.moe.{attr}" for b in BLOCKS], attr)
        info = [m for name, level, m in res["log"] if level == "INFO" and name == "nccl_tide.fsdp"]
        assert any(m.startswith(f"scope dense: {LAYERS} FSDP module(s) keep stock FSDP2") for m in info), info


@pytest.mark.timeout(300)
def test_switch_dense_owner_of_unsharded_experts_stays_stock(w2):
    """Experts not fully_shard'ed by themselves live in their block's group: the blocks keep stock FSDP2 (the
    experts never go through TIDE), warned once; the root still runs TIDE."""
    for res in w2["switch_owner"]:
        st = res["stats"]
        assert [g["group"] for g in st["tide_groups"]] == ["<root>"], st
        assert sorted(g["group"] for g in st["stock_groups"]) == BLOCKS, st
        assert all(g["reason"] == f"module_filter excluded {g['group']}" for g in st["stock_groups"]), st
        owners = [w for w in res["warnings"] if "scope 'dense' keeps stock FSDP2" in w]
        assert len(owners) == LAYERS, res["warnings"]  # one per owner, naming it and the experts it holds
        for b, w in zip(BLOCKS, owners):
            assert f"stock FSDP2 for {b} too" in w and f"parameters of {b}.moe.experts," in w, w
        (root,) = st["tide_groups"]
        assert root["ag_calls"] == STEPS and root["rs_calls"] == STEPS, root
        calls = res["stock_calls"]
        assert calls["foreach_all_gather"] == 2 * STEPS * LAYERS, calls
        _bitexact(res["vs_stock"])


@pytest.mark.timeout(300)
def test_bad_filters_leave_stock_fsdp2(w2):
    for res in w2["errors"]:
        errs = res["errors"]
        for key, e in errs.items():
            assert e.get("type") == "InvalidArgumentError", (key, e)
            # nothing left behind: no handle, no patch, every group's comms FSDP2's own
            assert not e["handle"] and not e["patched"] and all(e["comms"].values()), (key, e)
        assert "module_filter='experts'" in errs["not_callable"]["msg"], errs
        assert "raised on FSDP module layers.1" in errs["raises"]["msg"] and "no rule for" in errs["raises"]["msg"]
        assert errs["raises"]["cause"] == "KeyError", errs
        # the filter was called in module order up to the module that raised, and not after it
        assert res["raising_calls"] == ["", "layers.0", "layers.0.moe.experts", "layers.1"], res["raising_calls"]
        assert "returned None" in errs["returns_none"]["msg"] and "<root>" in errs["returns_none"]["msg"], errs
        assert "returned 1 (int)" in errs["returns_int"]["msg"], errs
        # after the failed calls the model trains exactly as stock FSDP2: the same FSDP2 calls, the same bits
        assert res["stock_calls"] == res["stock_calls_stock_run"], res
        assert res["stock_calls"]["foreach_all_gather"] == (2 * 2 * LAYERS + 1) * STEPS, res
        _bitexact(res["vs_stock"])
        # a filter that excludes every module: a handle with every group stock and no patch installed
        assert res["none_stats"]["tide_groups"] == [] and len(res["none_stats"]["stock_groups"]) == 2 * LAYERS + 1
        assert not res["none_patched"]
        kill = res["kill"]
        assert kill["stats"]["tide_groups"] == [] and len(kill["stats"]["stock_groups"]) == 2 * LAYERS + 1, kill
        assert kill["reasons"] == ["NCCL_TIDE_FSDP=0 (stock FSDP2 for every group)"] and not kill["patched"], kill
        assert "NCCL_TIDE_FSDP='yes'" in kill["bad"] and not kill["bad_handle"], kill


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp_switch: torchtitan-style scope (all / dense / None) and the NCCL_TIDE_FSDP kill switch."""

import pytest
import torch.nn as nn
from nccl_tide import fsdp_switch as sw
from nccl_tide.errors import InvalidArgumentError, UnsupportedError


class FakeGroup:
    def __init__(self, mesh):
        self.mesh_info = type("MI", (), {"mesh": mesh})()


class Sharded(nn.Linear):
    """Stands in for an FSDP2 module: _get_fsdp_state() with one param group on `mesh`."""

    def __init__(self, mesh):
        super().__init__(4, 4)
        self._mesh = mesh

    def _get_fsdp_state(self):
        return type("S", (), {"_fsdp_param_groups": [FakeGroup(self._mesh)]})()


def moe_model(dp="dp", edp="edp", expert_name="experts"):
    root = nn.Module()
    root._get_fsdp_state = lambda: type("S", (), {"_fsdp_param_groups": [FakeGroup(dp)]})()
    root.layers = nn.ModuleList()
    for _ in range(2):
        block = nn.Module()
        block.attn = Sharded(dp)
        moe = nn.Module()
        setattr(moe, expert_name, Sharded(edp))
        block.moe = moe
        root.layers.append(block)
    return root


class Recorder:
    def __init__(self, with_filter=True):
        self.calls = []
        self.with_filter = with_filter

    def __call__(self, model, **kw):
        self.calls.append(kw)
        return "handle"


def enable_with_filter(rec):
    def enable(model, module_filter=None, **kw):
        return rec(model, module_filter=module_filter, **kw)

    return enable


@pytest.mark.parametrize(
    "scope, env, want",
    [
        ("all", {}, "all"),
        ("dense", {}, "dense"),
        ("ALL", {}, "all"),
        (None, {}, None),
        ("none", {}, None),
        ("all", {"NCCL_TIDE_FSDP": "0"}, None),
        ("dense", {"NCCL_TIDE_FSDP": "1"}, "dense"),
    ],
)
def test_resolve_scope(scope, env, want):
    assert sw.resolve_scope(scope, env) == want


@pytest.mark.parametrize("scope, env, words", [("experts", {}, "use 'all', 'dense' or None"),
                                               ("all", {"NCCL_TIDE_FSDP": "off"}, "NCCL_TIDE_FSDP='off'"),
                                               (3, {}, "scope 3")])
def test_bad_values_are_errors(scope, env, words):
    with pytest.raises(InvalidArgumentError, match=words.replace("(", r"\(")):
        sw.resolve_scope(scope, env)


def test_kill_switch_leaves_stock_fsdp2():
    rec = Recorder()
    assert sw.apply(moe_model(), "all", env={"NCCL_TIDE_FSDP": "0"}, enable_fn=rec) is None
    assert rec.calls == []


def test_all_enables_everything_with_the_kwargs():
    rec = Recorder()
    assert sw.apply(moe_model(), "all", env={}, enable_fn=rec, slot_pool=2) == "handle"
    assert rec.calls == [{"slot_pool": 2}]


def test_dense_filters_experts_by_mesh_and_name():
    model = moe_model(expert_name="ffn_experts")  # not named "experts": found by its own (edp) mesh
    rec = Recorder()
    assert sw.apply(model, "dense", env={}, enable_fn=enable_with_filter(rec)) == "handle"
    keep = rec.calls[0]["module_filter"]
    mods = dict(model.named_modules())
    assert keep("layers.0.attn", mods["layers.0.attn"]) and keep("layers.1.attn", mods["layers.1.attn"])
    assert not keep("layers.0.moe.ffn_experts", mods["layers.0.moe.ffn_experts"])
    # by name, even on the root's mesh
    assert not keep("layers.0.moe.experts", Sharded("dp"))


def test_dense_without_experts_is_all():
    model = moe_model(edp="dp", expert_name="ffn")  # one mesh, no expert names
    rec = Recorder()
    assert sw.apply(model, "dense", env={}, enable_fn=rec) == "handle" and rec.calls == [{}]


def test_dense_needs_a_module_filter_when_experts_exist():
    rec = Recorder()  # an enable() without module_filter
    with pytest.raises(UnsupportedError, match="takes no module_filter"):
        sw.apply(moe_model(), "dense", env={}, enable_fn=rec)
    assert rec.calls == []


class ShardedBlock(nn.Module):
    """An FSDP2-like block whose experts are a plain submodule (not fully_shard'ed by themselves)."""

    def __init__(self, mesh):
        super().__init__()
        self._mesh = mesh
        self.attn = nn.Linear(4, 4)
        self.moe = nn.Module()
        self.moe.experts = nn.Linear(4, 4)

    def _get_fsdp_state(self):
        return type("S", (), {"_fsdp_param_groups": [FakeGroup(self._mesh)]})()


def owner_model():
    root = moe_model()  # layers.0/1: attn and moe.experts sharded on their own (experts on edp)
    root.layers.append(ShardedBlock("dp"))  # layers.2: its experts' parameters are in its own group
    root.layers.append(ShardedBlock("dp"))
    del root.layers[3].moe.experts  # layers.3: no experts at all
    return root


def test_expert_owners_are_the_fsdp_modules_holding_expert_parameters():
    model = owner_model()
    assert sw.expert_owners(model, "dp") == {"layers.2": ["layers.2.moe.experts"]}
    keep = sw.dense_filter(model)
    mods = dict(model.named_modules())
    verdicts = {n: keep(n, m) for n, m in mods.items() if hasattr(m, "_get_fsdp_state")}
    assert verdicts == {"": True, "layers.0.attn": True, "layers.0.moe.experts": False, "layers.1.attn": True,
                        "layers.1.moe.experts": False, "layers.2": False, "layers.3": True}, verdicts


def test_dense_passes_owners_to_the_filter_and_warns_once_per_owner():
    from nccl_tide.fsdp import TideFSDPWarning, _warn

    _warn.reset()
    rec = Recorder()
    model = owner_model()
    with pytest.warns(TideFSDPWarning, match=r"keeps stock FSDP2 for layers\.2 too.*layers\.2\.moe\.experts"):
        assert sw.apply(model, "dense", env={}, enable_fn=enable_with_filter(rec), executor="reference") == "handle"
    (kw,) = rec.calls
    assert kw["executor"] == "reference"
    assert not kw["module_filter"]("layers.2", model.layers[2]) and kw["module_filter"]("layers.3", model.layers[3])


def test_dense_combines_a_user_module_filter():
    rec = Recorder()
    model = moe_model()
    mods = dict(model.named_modules())
    user_calls = []

    def user(name, module):
        user_calls.append(name)
        return name != "layers.1.attn"

    sw.apply(model, "dense", env={}, enable_fn=enable_with_filter(rec), module_filter=user)
    keep = rec.calls[0]["module_filter"]
    got = {n: keep(n, mods[n]) for n in ("", "layers.0.attn", "layers.1.attn", "layers.0.moe.experts")}
    assert got == {"": True, "layers.0.attn": True, "layers.1.attn": False, "layers.0.moe.experts": False}, got
    assert "layers.0.moe.experts" not in user_calls  # "dense" decides first: the user filter never sees experts
    with pytest.raises(InvalidArgumentError, match="module_filter=3"):
        sw.apply(model, "dense", env={}, enable_fn=enable_with_filter(rec), module_filter=3)


def test_default_enable_takes_a_module_filter():
    """The switch's own default: nccl_tide.fsdp.enable accepts module_filter, so 'dense' is never refused."""
    import inspect

    from nccl_tide.fsdp import enable

    assert inspect.signature(enable).parameters["module_filter"].default is None

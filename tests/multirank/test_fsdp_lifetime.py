# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Lifetime of TIDE-enabled FSDP2 models (+3.7 GiB of torch memory in the step benchmark).

Two leaks, each of which kept a whole model (its fp32 sharded parameters above all) alive:

* nccl_tide.fsdp: the handle registry (`_handles`, a WeakKeyDictionary model -> handle) held each
  handle, whose GroupStates held their FSDPParamGroup, which holds its modules: the value kept its
  own key alive, so an enabled model was never freed, disable() or not, gc.collect() or not (also
  through NATIVE_SLOTS while enabled). GroupState now holds the group weakly.
* benchmarks/fsdp_step.py: FSDP2 modules live in reference cycles, so dropping the last name of a
  model does not free it; variants measured in one process counted the earlier variants' models.
  VariantRun.close() collects them.

CPU, gloo, world sizes 1 and 2, the reference executor and the native executor over the simulated
tideComm (benchmarks/sim_comm.py). Each case drops a model in a fresh worker and checks weak
references to the model and to one sharded parameter's local tensor.

Run by hand: python tests/multirank/test_fsdp_lifetime.py worker <rank> <world> <port>
"""

import gc
import json
import sys
import warnings
import weakref
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # sim_comm.py: the simulated tideComm
from fsdp_llama import batch, build_model, init_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve()


def _shard(model):
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


def _local(p):
    """The sharded parameter's own local tensor (DTensor.to_local() would return a new view object)."""
    local = getattr(p, "_local_tensor", None)
    assert local is not None, f"not a DTensor: {type(p).__name__}"
    return local


def _train_and_drop(rank, executor, disable, slot_pool=None):
    """Trains 2 steps, optionally disables TIDE, drops every reference; returns weak references to the
    model and to its first sharded parameter's local tensor (and the TIDE group count)."""
    import torch

    import nccl_tide.fsdp as tfsdp

    model = _shard(build_model(0, layers=3))
    groups = 0
    if executor != "stock":
        kw = {} if slot_pool is None else {"slot_pool": slot_pool}
        groups = len(tfsdp.enable(model, executor=executor, **kw).groups)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(2):
        x, y = batch(step, rank)
        torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if executor != "stock" and disable:
        tfsdp.disable(model)
    p = next(model.parameters())
    refs = (weakref.ref(model), weakref.ref(_local(p)))
    del model, opt, p
    return refs, groups


def _bench_variant(variant):
    """benchmarks/fsdp_step.py's VariantRun on CPU: its close() must free the model without any help."""
    import fsdp_step
    from fsdp_model import LlamaConfig

    a = fsdp_step.parser().parse_args(["--seq", "8", "--tokens", "16", "--slot-pool", "2"])
    cfg = LlamaConfig(layers=4, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=97)
    v = fsdp_step.VariantRun(variant, cfg, a, 0, "cpu")
    assert not v.reason, v.reason
    st = v.tide_stats()
    v.step()
    v.step()
    p = next(v.model.parameters())
    refs = (weakref.ref(v.model), weakref.ref(_local(p)))
    del p
    v.close()
    return refs, (len(st["tide_groups"]), st["slot_pool"]["size"] if st["slot_pool"] else 0) if st else (0, 0)


def worker(rank, world, port):
    init_worker(rank, world, port)
    from sim_comm import use_sim_native

    use_sim_native()  # executor="native" over the simulated tideComm
    res = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for executor in ("stock", "reference", "native"):
            for disable in (True, False):
                if executor == "stock" and not disable:
                    continue
                refs, groups = _train_and_drop(rank, executor, disable, slot_pool=1 if executor == "native" else None)
                gc.collect()
                res[f"{executor},disable={disable}"] = {"alive": [r() is not None for r in refs], "groups": groups}
        if world == 1:
            for variant in ("stock", "tide", "tide-dedicated"):
                refs, (groups, pool) = _bench_variant(variant)
                # no gc.collect() here: close() must have done it
                res[f"bench:{variant}"] = {"alive": [r() is not None for r in refs], "groups": groups, "pool": pool}
    print(json.dumps(res))


@pytest.fixture(scope="module")
def w1():
    return run_script(SCRIPT, 1, [], timeout=240)


@pytest.fixture(scope="module")
def w2():
    return run_script(SCRIPT, 2, [], timeout=240)


@pytest.mark.parametrize("world", [1, 2])
def test_dropped_models_are_freed(world, request):
    per_rank = request.getfixturevalue(f"w{world}")
    for rank, res in enumerate(per_rank):
        for case, r in res.items():
            if case.startswith("bench:"):
                continue
            assert r["alive"] == [False, False], f"rank {rank} of {world}, {case}: model still alive {r}"
            if not case.startswith("stock"):
                assert r["groups"] == 4, f"{case}: TIDE did not take every group ({r})"
    assert sum(not k.startswith("bench:") for k in per_rank[0]) == 5  # stock; reference, native: disabled or not


def test_bench_variant_close_frees_model(w1):
    per_rank = w1
    res = per_rank[0]
    for variant in ("stock", "tide", "tide-dedicated"):
        r = res[f"bench:{variant}"]
        assert r["alive"] == [False, False], f"fsdp_step.VariantRun({variant!r}).close() left the model alive: {r}"
    assert res["bench:tide"]["groups"] == 5 and res["bench:tide"]["pool"] == 2, res["bench:tide"]
    assert res["bench:tide-dedicated"]["groups"] == 5 and res["bench:tide-dedicated"]["pool"] == 0


if __name__ == "__main__" and len(sys.argv) >= 5 and sys.argv[1] == "worker":
    worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))

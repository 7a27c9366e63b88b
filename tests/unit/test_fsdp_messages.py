# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp says what actually happens, and the way out that works:
* enable(model) after enable(model.blocks[k]) leaves blocks.k to the first handle, which runs it through TIDE: the
  warning says so (not "keeping stock FSDP2"), and the second handle lists it apart from its stock groups;
* under set_reshard_after_backward(False) the groups stay unsharded between steps: disable() is refused with
  "call reshard() on each of them first" (not "call it between steps", which is where the caller is), and enable()
  keeps them stock with one warning saying why and how to have TIDE take them; following either advice works.

One gloo process of world size 1 in a subprocess (one_process_group.py).

Run by hand: python tests/unit/test_fsdp_messages.py worker <store file> <seed>
"""

import pytest
from one_process_group import run_worker, serve_worker

pytest.importorskip("torch")


def _worker(seed: int) -> dict:
    import warnings

    import torch
    from torch.distributed.fsdp import FSDPModule, fully_shard

    import nccl_tide.fsdp as tf
    from nccl_tide.errors import InvalidUsageError

    g = torch.Generator().manual_seed(seed)
    n_blocks = int(torch.randint(2, 5, (1,), generator=g))
    width = int(torch.randint(2, 17, (1,), generator=g))
    k = int(torch.randint(0, n_blocks, (1,), generator=g))
    x = torch.randn(int(torch.randint(1, 9, (1,), generator=g)), width, generator=g)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(n_blocks))
            self.head = torch.nn.Linear(width, 3)

        def forward(self, t):
            for b in self.blocks:
                t = b(t)
            return self.head(t)

    def model():
        torch.manual_seed(seed)
        m = Net()
        for b in m.blocks:
            fully_shard(b)
        return fully_shard(m)

    def step(m):
        for p in m.parameters():
            p.grad = None
        m(x).sum().backward()

    def grads(m):
        return [p.grad.full_tensor().clone() for p in m.parameters()]

    def reshard_all(m):
        for mod in m.modules():
            if isinstance(mod, FSDPModule):
                mod.reshard()

    def caught(fn):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            result = fn()
        return result, [str(i.message) for i in w if issubclass(i.category, tf.TideFSDPWarning)]

    out = {"k": k, "n_blocks": n_blocks}
    stock = model()
    step(stock)
    want = grads(stock)

    # a block enabled first, then its root
    m = model()
    first = tf.enable(m.blocks[k])
    h, out["nested_warnings"] = caught(lambda: tf.enable(m))
    st = h.stats()
    out["nested_stock"], out["nested_other"] = st["stock_groups"], st.get("other_handle_groups")
    out["nested_tide"] = sorted(d["group"] for d in st["tide_groups"])
    step(m)
    out["nested_grads_equal"] = all(torch.equal(a, b) for a, b in zip(grads(m), want))
    out["first_ag_calls"] = first.stats()["tide_groups"][0]["ag_calls"]
    tf.disable(m)
    step(m)  # blocks.k is still the first handle's
    out["first_ag_calls_after_root_disable"] = first.stats()["tide_groups"][0]["ag_calls"]
    tf.disable(m.blocks[k])

    # the root enabled first, then a block
    m = model()
    tf.enable(m)
    inner, out["inner_warnings"] = caught(lambda: tf.enable(m.blocks[k]))
    out["inner_groups"] = (len(inner.groups), inner.stats()["stock_groups"], inner.stats().get("other_handle_groups"))
    tf.disable(m.blocks[k])
    tf.disable(m)

    # set_reshard_after_backward(False): disable() after a step
    m = model()
    h = tf.enable(m)
    m.set_reshard_after_backward(False)
    step(m)
    try:
        tf.disable(m)
        out["disable_unsharded"] = "accepted"
    except InvalidUsageError as e:
        out["disable_unsharded"] = str(e)
    out["enabled_after_refusal"] = h.enabled
    reshard_all(m)  # the advice
    tf.disable(m)
    out["disabled_after_reshard"] = not h.enabled

    # set_reshard_after_backward(False): enable() after a step
    m = model()
    m.set_reshard_after_backward(False)
    step(m)
    h, out["enable_unsharded_warnings"] = caught(lambda: tf.enable(m))
    out["enable_unsharded_groups"] = (len(h.groups), len(h.stock))
    tf.disable(m)  # the advice: disable(), reshard() each module, enable() again
    reshard_all(m)
    h = tf.enable(m)
    out["groups_after_advice"] = (len(h.groups), len(h.stock))
    step(m)
    reshard_all(m)  # the sharded parameters, which hold the gradients, are the module's again
    out["grads_after_advice_equal"] = all(torch.equal(a, b) for a, b in zip(grads(m), want))
    return out


@pytest.fixture(scope="module", params=[0, 1])
def got(request, tmp_path_factory):
    return run_worker(__file__, tmp_path_factory.mktemp("store"), request.param)


def test_a_group_of_an_earlier_handle_is_said_to_run_tide_there(got):
    k, n = got["k"], got["n_blocks"]
    block = f"blocks.{k}"
    assert not [w for w in got["nested_warnings"] if "keeping stock FSDP2" in w], got["nested_warnings"]
    said = [w for w in got["nested_warnings"] if f"{block} already runs TIDE" in w]
    assert len(said) == 1 and f"an earlier enable() on {block}" in said[0], got["nested_warnings"]
    assert "its disable() gives it back to stock FSDP2 (this handle's disable() does not)" in said[0]
    assert got["nested_stock"] == [] and got["nested_other"] == [{"group": block, "handle_of": block}]
    assert got["nested_tide"] == sorted(["<root>"] + [f"blocks.{i}" for i in range(n) if i != k])
    assert got["nested_grads_equal"]
    assert got["first_ag_calls"] >= 1
    assert got["first_ag_calls_after_root_disable"] > got["first_ag_calls"]  # still TIDE, through the first handle
    groups, stock, other = got["inner_groups"]
    assert [groups, stock, other] == [0, [], [{"group": "<root>", "handle_of": "an enclosing FSDPNet module"}]]
    assert [w for w in got["inner_warnings"] if "already runs TIDE through the handle of an earlier enable()" in w]


def test_disable_of_groups_kept_unsharded_names_reshard(got):
    msg = got["disable_unsharded"]
    assert "unsharded between steps (set_reshard_after_backward(False)" in msg, msg
    assert "call reshard() on each of them first (FSDPModule.reshard() does not recurse)" in msg, msg
    assert "call it between steps" not in msg and "nothing was changed" in msg
    assert got["enabled_after_refusal"] and got["disabled_after_reshard"]


def test_enable_of_groups_kept_unsharded_warns_why_and_what_to_do(got):
    n = got["n_blocks"]
    why = [w for w in got["enable_unsharded_warnings"] if "keeping stock FSDP2" in w]
    assert len(why) == 1, got["enable_unsharded_warnings"]
    assert "unsharded between steps (set_reshard_after_backward(False)" in why[0]
    assert "call disable() on this model, reshard() on each of these modules" in why[0]
    assert "call enable() between steps" not in why[0]
    assert got["enable_unsharded_groups"] == [0, n + 1]
    assert got["groups_after_advice"] == [n + 1, 0] and got["grads_after_advice_equal"]


if __name__ == "__main__":
    serve_worker(_worker)

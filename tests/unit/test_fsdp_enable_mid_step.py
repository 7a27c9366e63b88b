# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp.enable() between a forward and its backward is refused, the model left stock FSDP2: autograd saved
views of stock FSDP2's unsharded parameters, and TIDE's unsharding into its own slots would leave that backward
reading freed storage. After the backward, enable() takes the groups; after a forward without backward,
reset_iter_state() (the way out the refusal names) makes enable() legal again.

One gloo process of world size 1 in a subprocess (one_process_group.py).

Run by hand: python tests/unit/test_fsdp_enable_mid_step.py worker <store file> <seed>
"""

import pytest
from one_process_group import run_worker, serve_worker

pytest.importorskip("torch")


def _worker(seed: int) -> dict:
    import warnings

    import torch
    from torch.distributed.fsdp import fully_shard

    import nccl_tide.fsdp as tf
    from nccl_tide.errors import InvalidUsageError

    warnings.simplefilter("ignore")
    g = torch.Generator().manual_seed(seed)
    dims = [int(d) for d in torch.randint(2, 17, (4,), generator=g)]

    def model():
        torch.manual_seed(seed)
        m = torch.nn.Sequential(*[torch.nn.Linear(dims[i], dims[i + 1]) for i in range(3)])
        for block in m:
            fully_shard(block)
        return fully_shard(m)

    x = torch.randn(int(torch.randint(1, 9, (1,), generator=g)), dims[0], generator=g)
    out = {}

    stock = model()
    stock(x).sum().backward()
    want = [p.grad.full_tensor().clone() for p in stock.parameters()]

    m = model()
    m(x).sum().backward()
    for p in m.parameters():
        p.grad = None
    loss = m(x).sum()
    try:
        tf.enable(m)
        out["mid_step"] = "accepted"
    except InvalidUsageError as e:
        out["mid_step"] = str(e)
    out["handle_after_refusal"] = tf.handle_of(m) is not None
    loss.backward()  # stock FSDP2's backward, untouched by the refused call
    out["grads_equal"] = all(torch.equal(p.grad.full_tensor(), w) for p, w in zip(m.parameters(), want))
    out["groups_after_backward"] = len(tf.enable(m).groups)
    tf.disable(m)
    with torch.no_grad():
        m(x)
    try:
        tf.enable(m)
        out["after_no_grad"] = "accepted"
    except InvalidUsageError as e:
        out["after_no_grad"] = str(e)
    m.reset_iter_state()
    out["groups_after_reset"] = len(tf.enable(m).groups)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_enable_between_forward_and_backward_is_refused(tmp_path, seed):
    got = run_worker(__file__, tmp_path, seed)
    assert "ran forward and its backward has not run yet" in got["mid_step"], got
    assert "reset_iter_state()" in got["mid_step"] and "nothing was changed" in got["mid_step"]
    assert not got["handle_after_refusal"]
    assert got["grads_equal"]
    assert got["groups_after_backward"] == 3
    assert "ran forward" in got["after_no_grad"]
    assert got["groups_after_reset"] == 3


if __name__ == "__main__":
    serve_worker(_worker)

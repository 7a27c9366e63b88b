# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""nccl_tide.fsdp.enable(ranks_per_node=...) is validated like the other arguments: a value that is not an integer
>= 1 dividing every group's shard world size is refused at enable(), with the model left stock FSDP2. Before, 2 at
world 1, -1, 'x' and 1.5 were accepted, and every group fell back to stock at its first all-gather while stats()
still listed it under tide_groups.

CPU, gloo, world 1, reference executor. Run by hand:
python tests/multirank/test_fsdp_ranks_per_node.py worker 0 1 <port>
"""

import json
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fsdp_llama import batch, build_model, init_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve()
BAD = [2, -1, 0, "x", 1.5, True]


def worker(rank, world, port):
    init_worker(rank, world, port)
    import torch
    from torch.distributed.fsdp import fully_shard

    import nccl_tide.fsdp as tfsdp
    from nccl_tide import InvalidArgumentError

    def sharded():
        model = build_model(0, layers=2)
        for layer in model.layers:
            fully_shard(layer)
        return fully_shard(model)

    res = {}
    for bad in BAD:
        model = sharded()
        try:
            tfsdp.enable(model, executor="reference", ranks_per_node=bad)
            res[repr(bad)] = "accepted"
        except InvalidArgumentError as e:
            res[repr(bad)] = str(e) if tfsdp.handle_of(model) is None else "refused, but enabled"
    model = sharded()
    with warnings.catch_warnings():
        warnings.simplefilter("error", tfsdp.TideFSDPWarning)  # a fallback to stock warns
        handle = tfsdp.enable(model, executor="reference", ranks_per_node=1)
        x, y = batch(0, rank)
        torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).backward()
    st = handle.stats()
    res["valid"] = {"tide_groups": len(st["tide_groups"]), "stock": len(handle.stock)}
    print(json.dumps(res))


def test_invalid_ranks_per_node_is_refused_at_enable():
    (res,) = run_script(SCRIPT, 1, [], timeout=240)
    for bad in BAD:
        msg = res[repr(bad)]
        assert msg.startswith(f"ranks_per_node={bad!r}"), (bad, msg)
    assert "divide" in res["2"] and "shard world size 1" in res["2"], res["2"]
    assert res["valid"]["tide_groups"] >= 3 and res["valid"]["stock"] == 0, res["valid"]


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(*map(int, sys.argv[2:5]))

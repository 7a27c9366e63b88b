# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The reference executor (torch.distributed, gloo) against the host executor, and the
nccl_tide.fsdp API's error paths. 2 and 4 processes.

For random layouts (uneven dim-0 sizes, parameters with fewer rows than ranks), every
rank's TIDE-AG output must equal the host executor's byte for byte, and every rank's
TIDE-RS output bit for bit: sum / avg / premul, bf16 / fp16 / fp32 gradients, fp32 and
bf16 outputs, one node and 2 nodes of 2 (which changes the accumulation order), with and
without a caller-provided staging buffer. Outputs are poisoned (NaN) first.

Run by hand: python tests/multirank/test_fsdp_reference_executor.py worker <rank> <world> <port> <what>
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: fsdp_llama, multirank.harness
from fsdp_llama import init_worker  # noqa: E402
from multirank.harness import run_script  # noqa: E402

pytest.importorskip("torch")
SCRIPT = Path(__file__).resolve()


def _executor_checks(rank, world):
    import numpy as np
    import torch
    import torch.distributed as dist
    from nccl_tide import Layout, host_all_gather, host_reduce_scatter
    from nccl_tide.reference_executor import ReferenceExecutor, torch_dtype

    ex = ReferenceExecutor()
    rng = np.random.default_rng(1234)  # same layouts on every rank
    checked = 0
    for trial in range(6):
        n = int(rng.integers(1, 6))
        rows = [int(rng.integers(1, 3 * world + 2)) for _ in range(n)]
        rows[0] = min(rows[0], world - 1) or 1  # a parameter with fewer rows than ranks
        cols = [int(rng.choice([1, 3, 8])) for _ in range(n)]
        numels = [r * c for r, c in zip(rows, cols)]
        gname = ["bf16", "fp16", "fp32"][trial % 3]
        for rpn in sorted({world, max(1, world // 2)}):
            lay = Layout(numels, gname, world, rpn, rank, row_numels=cols)
            host = Layout(numels, gname, world, rpn, 0, row_numels=cols)
            gdt = torch_dtype(gname)
            gen = torch.Generator().manual_seed(trial * 100 + rank)
            # AG: shards of this rank -> every rank's params; compare with the host executor.
            shards = [torch.randn(p.shard_numel, generator=gen).to(gdt) for p in lay.params]
            send = ex.pack(lay, shards)
            params = [torch.full((p.shard_numel * world,), float("nan")).to(gdt) for p in lay.params]
            ex.all_gather(lay, send, params)
            every = [[torch.empty_like(s) for _ in range(world)] for s in shards]
            for i, s in enumerate(shards):
                dist.all_gather(every[i], s)
            ref = host_all_gather(host, [[every[i][r] for i in range(n)] for r in range(world)])[rank]
            for r_, t in zip(ref, params):
                assert np.array_equal(r_.view(np.uint8), t.view(torch.uint8).numpy()), "AG"
            # RS: full gradients of this rank (random, a few binades) -> packed output.
            grads = [
                (torch.randn(num, generator=gen) * 2.0 ** torch.randint(-4, 5, (num,), generator=gen)).to(gdt)
                for num in numels
            ]
            everyg = [[torch.empty_like(g) for _ in range(world)] for g in grads]
            for i, g in enumerate(grads):
                dist.all_gather(everyg[i], g)
            host_grads = [[everyg[i][r] for i in range(n)] for r in range(world)]
            for op, scale in (("sum", 1.0), ("avg", 1.0), ("premul", 0.37)):
                for oname in ("fp32", "bf16"):
                    odt = torch_dtype(oname)
                    for staged in (False, True):
                        out = torch.full((lay.rs_out_numel,), float("nan"), dtype=odt)
                        staging = torch.empty(ex.staging_numel(lay) + 5, dtype=gdt) if staged else None
                        ex.reduce_scatter(lay, grads, out, op=op, scale=scale, staging=staging)
                        want = host_reduce_scatter(host, host_grads, oname, op, scale)[rank]
                        got = out.view(torch.int16 if oname == "bf16" else torch.int32).numpy()
                        assert np.array_equal(want.view(got.dtype), got), (trial, rpn, op, oname, staged)
                        checked += 1
            lay.close()
            host.close()
    return checked


def _api_checks(rank, world):
    """enable() arguments and states: native on gloo/CPU raises saying why, bad names, twice."""
    import nccl_tide.fsdp as tfsdp
    import torch
    from nccl_tide.errors import InvalidArgumentError, InvalidUsageError, UnsupportedError
    from torch.distributed.fsdp import fully_shard

    out = {}
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    for m in model:
        fully_shard(m)
    fully_shard(model)
    try:
        tfsdp.enable(model, executor="native")
        out["native"] = "no error"
    except UnsupportedError as e:
        out["native"] = str(e)
    try:
        tfsdp.enable(model, executor="bogus")
        out["bogus"] = "no error"
    except InvalidArgumentError as e:
        out["bogus"] = str(e)
    h = tfsdp.enable(model, executor="reference")
    try:
        tfsdp.enable(model)
        out["twice"] = "no error"
    except InvalidUsageError as e:
        out["twice"] = str(e)
    out["groups"] = len(h.groups)
    out["patched_while_enabled"] = all(tfsdp._patch.patched_names().values())
    model(torch.randn(4, 5)).sum().backward()
    out["stats"] = h.stats()["total"]
    tfsdp.disable(model)
    out["patched_after_disable"] = any(tfsdp._patch.patched_names().values())
    model(torch.randn(4, 5)).sum().backward()  # stock again
    tfsdp.disable(model)  # no-op
    return out


def worker(rank, world, port, what):
    dist = init_worker(rank, world, port)
    res = {"rank": rank}
    if "executor" in what:
        res["checked"] = _executor_checks(rank, world)
    if "api" in what:
        res["api"] = _api_checks(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps(res))
    # The result is out; skip interpreter teardown, where torch's gloo threads occasionally abort the process
    # ("terminate called without an active exception") under CPU load, after the work under test is done.
    sys.stdout.flush()
    os._exit(0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 4])
def test_reference_executor_matches_host_executor(world):
    ranks = run_script(SCRIPT, world, ["executor,api" if world == 2 else "executor"], timeout=240)
    # 6 layouts x (1 or 2 node splits) x 3 ops x 2 output dtypes x (staging or not)
    n_splits = len({world, max(1, world // 2)})
    assert all(r["checked"] == 6 * n_splits * 3 * 2 * 2 for r in ranks), ranks
    if world == 2:
        for r in ranks:
            api = r["api"]
            assert "native" in api["native"] and "NCCL" in api["native"] and "reference" in api["native"], api
            assert "bogus" in api["bogus"], api
            assert "already enabled" in api["twice"], api
            assert api["groups"] == 2  # the two Linear groups; the root has no parameters of its own
            assert api["patched_while_enabled"] and not api["patched_after_disable"], api
            # forward and backward AG (resharded after forward) and one RS, for each of the 2 groups
            assert api["stats"]["ag_calls"] == 4 and api["stats"]["rs_calls"] == 2, api


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""benchmarks/host_python_cost.py on the CPU: the Python part of Comm.reduce_scatter / Comm.all_gather per call.

Two guards against a silent regression: structural (repeated calls on the same tensors run no per-tensor check and
build no ctypes table; new tensors of the same kind build a table but run no per-tensor check), and a generous time
bound relative to reading the tensors' data_ptr() in the same process (a ratio moves far less with the machine's load
than a time: best of several repeats of each, taking turns). The entry measured 1.2-3.2x that floor on a loaded
2-core machine, 25-35x before the fast tiers of nccl_tide._tensor_args."""

import torch

import host_python_cost as hpc
from nccl_tide import _tensor_args as TA

FLOOR_BOUND = 8.0  # Comm.reduce_scatter per call, in data_ptr() floors of its 64 gradients


def test_repeated_calls_check_no_tensor_one_by_one_and_build_no_table(native, rng):
    bench = hpc.Bench(params=int(rng.integers(40, 80)), numel=int(rng.integers(1, 5000)), world=int(rng.integers(2, 9)))
    try:
        with hpc.refusals_ignored(bench):
            bench.reduce_scatter()
            bench.all_gather()
            grads, shards = TA.grads_table(bench.layout), TA.shards_table(bench.layout)
            before = [(t.full_checks, t.tables_built) for t in (grads, shards)]
            for _ in range(20):
                bench.reduce_scatter()
                bench.all_gather()
            assert [(t.full_checks, t.tables_built) for t in (grads, shards)] == before
            bench.grads = [hpc.fake_cuda(torch.empty_like(g)) for g in bench.grads]  # new tensors, same kind
            bench.reduce_scatter()
            assert (grads.full_checks, grads.tables_built) == (before[0][0], before[0][1] + 1)
    finally:
        bench.close()


def test_python_cost_per_call_stays_within_a_few_data_ptr_floors(native):
    bench = hpc.Bench(params=64, numel=1 << 18, world=2)
    try:
        m = hpc.measure(bench, number=300, repeat=7)
    finally:
        bench.close()
    for key in ("reduce_scatter_us", "all_gather_us"):
        ratio = m[key] / m["data_ptr_floor_us"]
        assert ratio < FLOOR_BOUND, f"{key}: {m[key]:.1f} us per call, {ratio:.1f} data_ptr floors ({m})"

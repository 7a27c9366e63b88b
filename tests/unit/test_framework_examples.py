# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The framework examples (examples/frameworks) train at world size 2 on gloo: the stock jobs learn (finite losses
that fall), and torchtitan's job with nccl_tide.fsdp (the reference executor on gloo) matches stock bit for bit.
Each test skips where its framework is not installed (the CPU suite does not install them: ci/framework_wheels.sh).
The TIDE paths that need NCCL run in tests/multirank/test_frameworks.py on a GPU.

CUDA is hidden from the ranks, so these stay gloo runs on a machine with a GPU too.
"""

import math

import pytest
from framework_examples import missing, run

CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
STEPS = 6


def _skip_unless(framework):
    why = missing(framework)
    if why:
        pytest.skip(why)


def _assert_learns(losses):
    for rank, seq in losses.items():
        assert all(math.isfinite(x) for x in seq), (rank, seq)
        # random start: about ln(512) = 6.24; a few steps of a model that learns bring the last two well below
        assert (seq[-1] + seq[-2]) / 2 < seq[0] - 0.2, f"rank {rank} does not learn: {seq}"


@pytest.mark.slow  # DeepSpeed builds its CPU shared-memory op (a C++ extension, about 40 s) the first time
@pytest.mark.parametrize("zero", [3, 2])
def test_deepspeed_zero_trains_on_gloo(zero):
    _skip_unless("deepspeed")
    _, losses = run("deepspeed", ["--zero", zero, "--steps", STEPS], env=CPU_ONLY, timeout=240)
    _assert_learns(losses)


@pytest.fixture(scope="module")
def torchtitan_stock():
    _skip_unless("torchtitan")
    return run("torchtitan", ["--steps", STEPS], env=CPU_ONLY, timeout=180)[1]


@pytest.mark.slow
def test_torchtitan_fsdp2_trains_on_gloo(torchtitan_stock):
    _assert_learns(torchtitan_stock)


@pytest.mark.slow
def test_torchtitan_with_tide_reference_executor_matches_stock(torchtitan_stock):
    outs, tide = run("torchtitan", ["--steps", STEPS, "--tide", "fsdp"], env=CPU_ONLY, timeout=180)
    assert tide == torchtitan_stock, f"nccl_tide.fsdp (reference) changed the losses:\n{torchtitan_stock}\n{tide}"
    for o in outs:
        line = [x for x in o.stdout.splitlines() if x.startswith("TIDE_FSDP ")]
        assert len(line) == 1, o.stdout[-2000:]
        assert '"executor": "reference"' in line[0] and '"stock_groups": 0' in line[0], line[0]
        assert f'"rs_calls": {5 * STEPS}' in line[0], line[0]  # 5 FSDP groups: the embedding, 3 blocks, norm + output


def test_megatron_example_refuses_cpu_with_the_reason():
    _skip_unless("megatron")
    outs, losses = run("megatron", ["--steps", 2], env=CPU_ONLY, timeout=180, check=False)
    assert not losses
    for o in outs:
        assert o.returncode != 0 and "needs a CUDA device" in o.stdout, o.stdout[-2000:]


def test_interposer_switch_restarts_with_the_preload_then_refuses_gloo():
    """--tide interposer starts the example again with LD_PRELOAD and NCCL_TIDE_ENABLE=1 (before torch loads), then
    says that gloo cannot use it; the DeepSpeed example does this before importing DeepSpeed."""
    outs, losses = run("deepspeed", ["--steps", 1, "--tide", "interposer"], env=CPU_ONLY, timeout=120, check=False)
    assert not losses
    for o in outs:
        assert o.returncode != 0 and "--tide interposer needs CUDA and NCCL" in o.stdout, o.stdout[-2000:]
        assert "did not take effect" not in o.stdout, o.stdout[-2000:]

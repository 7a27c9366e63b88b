# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Rank -> GPU mapping and the several-ranks-per-GPU mode (no GPU needed)."""

import pytest

from nccl_tide import devices
from nccl_tide.errors import InvalidArgumentError, InvalidUsageError


def test_one_gpu_per_rank_by_default(monkeypatch):
    monkeypatch.delenv(devices.RANKS_PER_GPU_ENV, raising=False)
    assert [devices.local_device_index(r, 4, 8) for r in range(4)] == [0, 1, 2, 3]
    with pytest.raises(InvalidUsageError, match="NCCL_TIDE_RANKS_PER_GPU=2.*NCCL_HOSTID"):
        devices.local_device_index(0, 4, 2)


@pytest.mark.parametrize("world,gpus,k", [(2, 1, 2), (4, 1, 4), (4, 2, 2), (6, 4, 2), (8, 1, 8)])
def test_shared_gpus_round_robin(monkeypatch, world, gpus, k):
    monkeypatch.setenv(devices.RANKS_PER_GPU_ENV, str(k))
    got = [devices.local_device_index(r, world, gpus) for r in range(world)]
    assert got == [r % gpus for r in range(world)]
    per_gpu = [got.count(d) for d in range(gpus)]
    assert max(per_gpu) <= k and devices.ranks_share_gpus(world, gpus)


def test_explicit_value_beats_environment(monkeypatch):
    monkeypatch.setenv(devices.RANKS_PER_GPU_ENV, "1")
    assert devices.local_device_index(3, 4, 1, ranks_per_gpu_value=4) == 0
    with pytest.raises(InvalidUsageError, match="is 2"):
        devices.local_device_index(0, 4, 1, ranks_per_gpu_value=2)


@pytest.mark.parametrize("bad", ["0", "-1", "x", "1.5", " "])
def test_bad_environment_values(monkeypatch, bad):
    monkeypatch.setenv(devices.RANKS_PER_GPU_ENV, bad)
    if bad.strip():
        with pytest.raises(InvalidArgumentError, match="RANKS_PER_GPU"):
            devices.ranks_per_gpu()
    else:
        assert devices.ranks_per_gpu() == 1


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2", True])
def test_bad_explicit_values(bad):
    with pytest.raises(InvalidArgumentError):
        devices.ranks_per_gpu(bad)


def test_local_rank_out_of_range():
    with pytest.raises(InvalidArgumentError, match="LOCAL_RANK=4"):
        devices.local_device_index(4, 4, 4)


def test_nccl_duplicate_gpu_error_is_explained():
    e = RuntimeError("NCCL error in: ...\ninvalid usage ... Duplicate GPU detected : rank 1 and rank 0 both on CUDA "
                     "device 1b000")
    msg = devices.explain_nccl_init_error(e)
    assert msg is not None and "NCCL_HOSTID" in msg and "NCCL_MULTI_RANK_GPU_ENABLE" in msg
    assert devices.explain_nccl_init_error(RuntimeError("connection refused")) is None

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""One slot binder of a test's choice for every pool built from now on (nccl_tide/fsdp/_slot_binders.py: "alloc",
"swap" or "torch"), in place of the one the library picks (_pool_plan.make_binder), so that the tests and the
benchmarks' tests run each binder wherever torch has it. Shared by tests/ and benchmarks/tests."""

from typing import Optional

import torch
from nccl_tide.fsdp import _pool_plan
from nccl_tide.fsdp import _slot_binders as B

BINDERS = ("alloc", "swap", "torch")
LIBRARY_CHOICE = _pool_plan.make_binder


def _make_forced(name: str):
    def make_binder(device: torch.device, torch_memory: bool = False) -> tuple:
        if name == "torch":
            return B._TorchBinder(device), ""
        if name == "swap" and B.SWAP_SUPPORTED:
            return B._SwapBinder(), ""
        if name == "alloc" and device.type == "cuda" and B.MEMPOOL_SUPPORTED:
            return B._CudaAllocBinder(), ""
        if name == "alloc" and device.type != "cuda" and B.SWAP_SUPPORTED:  # the CPU emulation swaps storages
            return B._CpuAllocBinder(), ""
        return None, f"binder {name!r} (forced) does not work with torch {torch.__version__} on {device.type}"

    return make_binder


def force_binder(name: Optional[str]) -> None:
    """Pools built from now on use binder `name` ('alloc', 'swap' or 'torch'); None: the library's choice again."""
    if name is not None and name not in BINDERS:
        raise ValueError(f"binder {name!r}: use one of {BINDERS} or None")
    _pool_plan.make_binder = LIBRARY_CHOICE if name is None else _make_forced(name)

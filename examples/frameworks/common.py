# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""What the framework examples share: their arguments, the rank's device and process group, the TIDE switch, the
training data and the loss line.

Every example runs under torchrun (or any launcher that sets torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT). With CUDA it uses NCCL, one GPU per rank unless
NCCL_TIDE_RANKS_PER_GPU lets ranks share one (nccl_tide.devices); without CUDA, gloo on the CPU.

The TIDE switch, `--tide`:
* `off`: the framework as it ships (stock NCCL).
* `interposer`: libnccl-tide.so preloaded with NCCL_TIDE_ENABLE=1 (docs/usage.md). A preload must be in place
  before the process starts, so the example starts itself again (same pid, same arguments) with LD_PRELOAD and
  NCCL_TIDE_ENABLE=1 added when they are missing. NCCL only: gloo never calls NCCL.
* `fsdp` (FSDP2 examples only): nccl_tide.fsdp through nccl_tide.fsdp_switch, after the framework's fully_shard.

One line per step and rank, `LOSS rank=<r> step=<s> loss=<repr of the float>`: repr round-trips a float exactly,
so two runs can be compared bit for bit from their output (parse_losses).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

LOSS_LINE = re.compile(r"^LOSS rank=(\d+) step=(\d+) loss=(\S+)$")


def parse_args(description: str, tide_modes: tuple, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=5, help="training steps (one LOSS line per step and rank)")
    p.add_argument("--tide", choices=("off",) + tide_modes, default="off", help="stock, or TIDE's way in")
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def ensure_interposer() -> None:
    """Before torch is imported: make sure libnccl-tide.so is preloaded with NCCL_TIDE_ENABLE=1, else start this
    process again with both (os.execve keeps the pid, so torchrun's supervision is unaffected)."""
    import nccl_tide  # does not import torch

    lib = nccl_tide.library_path()
    preloaded = [p for p in os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":") if p]
    if lib in preloaded and os.environ.get("NCCL_TIDE_ENABLE") == "1":
        return
    if "TIDE_EXAMPLE_REEXEC" in os.environ:  # the loader dropped the preload: say so rather than loop
        raise SystemExit(f"--tide interposer: LD_PRELOAD={lib} did not take effect")
    env = dict(os.environ, LD_PRELOAD=":".join(preloaded + [lib]), NCCL_TIDE_ENABLE="1", TIDE_EXAMPLE_REEXEC="1")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def init_distributed(tide: str):
    """torch.distributed for this rank: NCCL on the rank's GPU (nccl_tide.devices) or gloo on the CPU.
    Returns (torch.distributed, device). Deterministic algorithms on, so that two runs can match bit for bit."""
    if tide == "interposer":
        ensure_interposer()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
    import torch
    import torch.distributed as dist

    torch.use_deterministic_algorithms(True, warn_only=True)
    if torch.cuda.is_available():
        from nccl_tide import devices

        # scaled_dot_product_attention through the math kernels (PyTorch documents the memory-efficient backward
        # as nondeterministic); a framework that picks its own attention backends keeps them
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        dist, device, _ = devices.init_nccl_process_group()
        return dist, device
    if tide == "interposer":
        raise SystemExit("--tide interposer needs CUDA and NCCL (gloo never calls NCCL)")
    dist.init_process_group("gloo")
    return dist, torch.device("cpu")


def batch(step: int, rank: int, batch_size: int, seq_len: int, vocab: int, device):
    """Next-token data of this rank and step: a different, reproducible batch on every rank. Each sequence
    counts up modulo the vocabulary from a random start with a random stride, so there is something to learn."""
    import torch

    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    stride = torch.randint(1, 4, (batch_size, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def report_loss(rank: int, step: int, loss: float) -> None:
    print(f"LOSS rank={rank} step={step} loss={float(loss)!r}", flush=True)


def parse_losses(text: str) -> dict:
    """{rank: [loss of step 0, 1, ...]} from an example's output."""
    out: dict = {}
    for line in text.splitlines():
        m = LOSS_LINE.match(line.strip())
        if m:
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = float(m.group(3))
    return {r: [steps[s] for s in sorted(steps)] for r, steps in out.items()}

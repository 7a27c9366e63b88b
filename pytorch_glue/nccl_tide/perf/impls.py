# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""What tide-perf can measure where: backend selection and, per implementation, why a row cannot run.

Pure Python (no torch, no GPU): the CPU tests exercise every decision here with the GPU check mocked.
"""

import os
from typing import Dict, List, Mapping, Optional

IMPLS = ("tide", "nccl", "fsdp2", "nccl-ce")  # --impl all
# Rows asked for by name only: a second reduce-scatter row beside `nccl`, for a comparison of reduce types.
NAMED_ONLY_IMPLS = ("nccl-dtype",)
BACKENDS = ("host", "loopback", "torchrun")

DESCRIPTIONS = {
    "tide": "TIDE all-gather / reduce-scatter (copy engines write each parameter's storage; fp32 RS output)",
    "nccl": "stock ncclAllGather / ncclReduceScatter on flat buffers through torch.distributed (RS in --out-type of "
    "grads cast to it beforehand: fp32 by default, as FSDP2 reduces)",
    "fsdp2": "the nccl call inside FSDP2's own copy ops: all_gather_copy_in + split_with_sizes_copy copy-out around "
    "the AG / chunk_cat copy-in (-d -> --out-type) before the RS",
    "nccl-ce": "NCCL's zero-CTA copy-engine AllGather on symmetric windows",
    "nccl-dtype": "stock ncclReduceScatter in -d's type (bf16 grads reduced in bf16: FSDP2 with reduce_dtype=bf16)",
}
NO_AG_DTYPE_ROW = "not run: nccl-dtype is a reduce-scatter row (an all-gather does not reduce: see the nccl row)"
TORCHRUN_NCCL = "real NCCL rows run on --backend torchrun (ranks may share a GPU there: --ranks-per-gpu)"

# What the loopback backend measures instead of NCCL: its virtual ranks live in one process, which holds no NCCL
# communicator between them.
LOOPBACK_STAND_INS = {
    ("nccl", "all_gather"): "stand-in: flat copy-engine all-gather (TIDE AG of one rank-major flat buffer); "
    "loopback has no NCCL communicator, " + TORCHRUN_NCCL,
    ("nccl", "reduce_scatter"): "stand-in: SM reduction of every rank's flat input (torch.sum over ranks, "
    "{out}); loopback has no NCCL communicator, " + TORCHRUN_NCCL,
    ("fsdp2", "all_gather"): "stand-in: flat copy-engine all-gather + FSDP2 copy-out ({copy_op}) per rank",
    ("fsdp2", "reduce_scatter"): "stand-in: FSDP2 copy-in ({copy_op}, {out}) per rank + SM reduction",
}

# The same, for a multi-node loopback layout (--ranks-per-node R < --ranks: N x R virtual nodes on one GPU). The AG
# stand-ins run over the same virtual nodes (TIDE's inter-node schedule on one flat buffer), which is not NCCL's
# multi-node algorithm; the RS stand-ins have no node structure at all, so they are not run (MULTI_NODE_RS_REASON).
LOOPBACK_STAND_INS_MULTI_NODE = {
    ("nccl", "all_gather"): "stand-in: flat copy-engine all-gather over the same virtual nodes (TIDE's inter-node "
    "schedule and node-local fan-out on one rank-major flat buffer); not NCCL's multi-node algorithm",
    ("fsdp2", "all_gather"): "stand-in: flat copy-engine all-gather over the same virtual nodes + FSDP2 copy-out "
    "({copy_op}) per rank; not NCCL's multi-node algorithm",
}
MULTI_NODE_RS_REASON = (
    "not run: the loopback reduce-scatter stand-in (an SM sum of every rank's input on one GPU) has no node "
    "structure, so with --ranks-per-node below --ranks it would only repeat the one-node figure; run without "
    "--ranks-per-node for it"
)


class BackendChoice(dict):
    """{'backend': name, 'why': how it was chosen}."""


def gpu_available() -> bool:
    """A CUDA device that torch can use. Device files are checked first so that a CPU machine never imports torch."""
    import glob

    if not (
        os.path.exists("/dev/nvidiactl")
        or glob.glob("/dev/nvidia[0-9]*")
        or os.path.exists("/proc/driver/nvidia/version")
    ):
        return False
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def choose_backend(requested: str, env: Optional[Mapping[str, str]] = None, gpu=None) -> BackendChoice:
    """auto: no GPU -> host; a GPU and WORLD_SIZE set (torchrun) -> torchrun; a GPU -> loopback.
    `gpu` is a bool or a callable returning one (default: gpu_available); it is only consulted for auto."""
    env = os.environ if env is None else env
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"unknown --backend {requested!r}; use auto, {', '.join(BACKENDS)}")
        return BackendChoice(backend=requested, why="--backend")
    has_gpu = gpu if gpu is not None else gpu_available
    has_gpu = has_gpu() if callable(has_gpu) else bool(has_gpu)
    if not has_gpu:
        return BackendChoice(backend="host", why="auto: no usable CUDA GPU")
    if env.get("WORLD_SIZE"):
        return BackendChoice(backend="torchrun", why=f"auto: CUDA GPU and WORLD_SIZE={env.get('WORLD_SIZE')}")
    return BackendChoice(backend="loopback", why="auto: CUDA GPU, no WORLD_SIZE (one process)")


def parse_impls(text: str) -> List[str]:
    """Comma list of implementations, in order, without duplicates; 'all' = IMPLS (NAMED_ONLY_IMPLS by name)."""
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if items == ["all"]:
        return list(IMPLS)
    out: List[str] = []
    for x in items:
        if x not in IMPLS + NAMED_ONLY_IMPLS:
            raise ValueError(
                f"unknown --impl {x!r}; choose from {', '.join(IMPLS + NAMED_ONLY_IMPLS)} (comma list) or all"
            )
        if x not in out:
            out.append(x)
    if not out:
        raise ValueError("--impl is empty")
    return out


def static_reason(backend: str, impl: str, collective: str, nodes: int = 1) -> Optional[str]:
    """Why `impl` cannot run with `backend` for `collective`, decided without a GPU; None if it may run (it can still
    fail at run time, and then its row says why). `nodes` > 1: a multi-node layout (loopback: virtual nodes)."""
    if impl == "nccl-ce" and collective == "reduce_scatter":
        return "not run: NCCL's copy-engine collectives include no reduce-scatter (a reduction needs SMs)"
    if impl == "nccl-dtype" and collective == "all_gather":
        return NO_AG_DTYPE_ROW
    if backend == "host":
        if impl == "tide":
            return None
        return "not run: host backend (ranks simulated on the CPU, no GPU, no NCCL); use --backend loopback or torchrun"
    if backend == "loopback" and impl == "nccl-ce":
        return (
            "not run: NCCL's CE AllGather needs NCCL communicators between processes with symmetric windows "
            "(--backend torchrun, NCCL >= 2.28); loopback has no NCCL communicator"
        )
    if backend == "loopback" and impl == "nccl-dtype":
        return "not run: loopback has no NCCL communicator and its stand-ins reduce in --out-type; " + TORCHRUN_NCCL
    if backend == "loopback" and nodes > 1 and collective == "reduce_scatter" and impl in ("nccl", "fsdp2"):
        return MULTI_NODE_RS_REASON
    return None


def loopback_stand_in(impl: str, collective: str, nodes: int = 1) -> Optional[str]:
    """What the loopback backend measures for `impl` (unformatted), or None (tide, or a row that is not run)."""
    if nodes > 1:
        return LOOPBACK_STAND_INS_MULTI_NODE.get((impl, collective))
    return LOOPBACK_STAND_INS.get((impl, collective))


def impl_table(backend: str, impls: List[str], collective: str, nodes: int = 1, **fmt) -> Dict[str, dict]:
    """JSON description of each requested impl: description, static reason, stand-in (loopback)."""
    out = {}
    for impl in impls:
        reason = static_reason(backend, impl, collective, nodes)
        stand_in = loopback_stand_in(impl, collective, nodes) if backend == "loopback" and not reason else None
        out[impl] = {
            "description": DESCRIPTIONS[impl],
            "not_run_reason": reason,
            "measured_as": stand_in.format(**fmt) if stand_in and fmt else stand_in,
        }
    return out

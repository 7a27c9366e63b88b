# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Which GPU a launched rank uses, and the "several ranks per GPU" mode.

By default rank `LOCAL_RANK` uses `cuda:LOCAL_RANK`, one GPU per rank, as torchrun jobs expect; with fewer GPUs than
local ranks that is an error that names the way out. Several ranks may share a GPU only when asked
(`ranks_per_gpu=k` or `NCCL_TIDE_RANKS_PER_GPU=k`, k >= 1): rank -> `cuda:(LOCAL_RANK % device_count)`.

NCCL must be told too, because it refuses two ranks of one host on one GPU ("Duplicate GPU detected"):
* any NCCL: give every rank its own NCCL host, `NCCL_HOSTID=<distinct per rank>` with `NCCL_SOCKET_IFNAME=lo
  NCCL_IB_DISABLE=1`; the ranks then talk through NCCL's network transport over loopback sockets;
* NCCL >= 2.30: `NCCL_MULTI_RANK_GPU_ENABLE=1` lets ranks of one host share a GPU (experimental in NCCL).
Timings of ranks that share a GPU are not a node's: they share its copy engines, SMs and memory bandwidth.
"""

import os
from typing import Any, Optional, Tuple

from .errors import InvalidArgumentError, InvalidUsageError

RANKS_PER_GPU_ENV = "NCCL_TIDE_RANKS_PER_GPU"

SHARED_GPU_CAVEAT = (
    "ranks share GPUs: correctness, protocol, host cost and memory are real; bandwidth and interference are not a "
    "node's (the ranks share one GPU's copy engines, SMs and memory)"
)

NCCL_SHARING_HINT = (
    "ranks that share a GPU need NCCL told so: NCCL_HOSTID=<distinct per rank> NCCL_SOCKET_IFNAME=lo "
    "NCCL_IB_DISABLE=1 (any NCCL), or NCCL_MULTI_RANK_GPU_ENABLE=1 (NCCL >= 2.30, ranks of one host)"
)


def ranks_per_gpu(value: Optional[int] = None) -> int:
    """The requested ranks per GPU: `value` if given, else NCCL_TIDE_RANKS_PER_GPU, else 1 (one GPU per rank)."""
    source = "ranks_per_gpu"
    if value is None:
        text = os.environ.get(RANKS_PER_GPU_ENV, "").strip()
        if not text:
            return 1
        source = RANKS_PER_GPU_ENV
        # ASCII digits only: int() would also take '1_6' (16), '+2' and other scripts' digits, which no shell script
        # or the library's own parameters mean by a count.
        if not (text.isascii() and text.isdigit()):
            raise InvalidArgumentError(f"{RANKS_PER_GPU_ENV}={text!r}: need a whole number >= 1 (digits 0-9 only)")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{source}={value!r}: need a whole number >= 1")
    return value


def local_device_index(
    local_rank: int, local_world: int, device_count: int, ranks_per_gpu_value: Optional[int] = None
) -> int:
    """The CUDA device index of local rank `local_rank` of `local_world` on a host with `device_count` GPUs."""
    k = ranks_per_gpu(ranks_per_gpu_value)
    if device_count < 1:
        raise InvalidUsageError("no CUDA device is visible to this process")
    if not 0 <= local_rank < local_world:
        raise InvalidArgumentError(f"LOCAL_RANK={local_rank} is outside 0..{local_world - 1}")
    if local_world > device_count * k:
        if k == 1:
            raise InvalidUsageError(
                f"{local_world} ranks on this host but {device_count} GPU(s): one GPU per rank by default; to let "
                f"ranks share GPUs, pass --ranks-per-gpu / set {RANKS_PER_GPU_ENV}="
                f"{-(-local_world // device_count)} ({NCCL_SHARING_HINT})"
            )
        raise InvalidUsageError(
            f"{local_world} ranks on this host need {-(-local_world // device_count)} ranks per GPU on {device_count} "
            f"GPU(s); {RANKS_PER_GPU_ENV}/--ranks-per-gpu is {k}"
        )
    return local_rank % device_count


def ranks_share_gpus(local_world: int, device_count: int) -> bool:
    """True when local ranks outnumber GPUs (what banners and JSON then say: SHARED_GPU_CAVEAT)."""
    return local_world > device_count


def from_environment(ranks_per_gpu_value: Optional[int] = None) -> Tuple[int, bool]:
    """(device index, ranks share GPUs) for this process from LOCAL_RANK / LOCAL_WORLD_SIZE (torchrun's variables)."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(local + 1)))
    count = torch.cuda.device_count()
    return local_device_index(local, local_world, count, ranks_per_gpu_value), ranks_share_gpus(local_world, count)


def explain_nccl_init_error(exc: BaseException, shared: bool = False) -> Optional[str]:
    """A clear message for NCCL's refusal of ranks sharing a GPU (NCCL's "Duplicate GPU detected"), else None.
    shared=True (this host's ranks share GPUs): any NCCL setup failure gets the hint, since torch does not always
    pass NCCL's own reason on."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "Duplicate GPU" in text or "duplicate GPU" in text:
        return f"NCCL refused ranks that share a GPU on one NCCL host ({first}): {NCCL_SHARING_HINT}"
    if shared:
        return f"NCCL could not set up ranks that share GPUs ({type(exc).__name__}: {first[:300]}): {NCCL_SHARING_HINT}"
    return None


def init_nccl_process_group(ranks_per_gpu_value: Optional[int] = None) -> Tuple[Any, Any, bool]:
    """torch.distributed's NCCL process group for a launched rank (torchrun's variables) on its device
    (from_environment), NCCL's communicator set up at once. Returns (torch.distributed, device, ranks share GPUs);
    NCCL's refusal of ranks sharing a GPU is raised as InvalidUsageError saying what to set."""
    import torch
    import torch.distributed as dist

    index, shared = from_environment(ranks_per_gpu_value)
    torch.cuda.set_device(index)
    device = torch.device("cuda", index)
    try:
        if not dist.is_initialized():
            try:
                dist.init_process_group("nccl", device_id=device)
            except TypeError:  # older torch without device_id
                dist.init_process_group("nccl")
        # torch creates NCCL's communicator lazily unless device_id took: one small collective makes NCCL say no
        # here, where the error can be explained, rather than in the first measured call
        dist.all_reduce(torch.zeros(1, device=device))
        torch.cuda.synchronize(device)
    except Exception as e:
        why = explain_nccl_init_error(e, shared)
        if why is None:
            raise
        if dist.is_initialized():  # the group came up but NCCL did not: leave nothing half set up behind
            try:
                dist.destroy_process_group()
            except Exception:
                pass
        raise InvalidUsageError(why) from e
    return dist, device, shared

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Host memory checks before allocations sized by the world: the host executor simulates every rank in this process,
so a large world times a large size can exceed the machine, and the kernel's out-of-memory killer would end the
process without a word. Refusing up front, with the figures, is the error the caller can act on.
"""

import os
from typing import Optional, Tuple

from .errors import TideOutOfMemoryError

GiB = 1 << 30
_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge page-rounded number


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2: no limit)


def _mem_available() -> Optional[int]:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> Optional[Tuple[int, str]]:
    """(bytes this process's memory cgroup can still grow by, its limit file), tightest over the cgroup and its
    ancestors; None without a limit."""
    try:
        with open("/proc/self/cgroup") as f:
            entries = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    candidates = []
    for _, controllers, path in entries:
        if controllers == "":  # cgroup v2
            root, limit_name, usage_name = "/sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # cgroup v1
            root, limit_name, usage_name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the cgroup itself, then its ancestors (limits nest)
            d = os.path.join(root, *parts[:depth])
            limit, usage = _read_int(os.path.join(d, limit_name)), _read_int(os.path.join(d, usage_name))
            if limit is not None and limit < _UNLIMITED and usage is not None:
                candidates.append((max(limit - usage, 0), os.path.join(d, limit_name)))
    return min(candidates) if candidates else None


def available_host_memory() -> Tuple[Optional[int], str]:
    """(bytes this process may still allocate, where that figure comes from); None if nothing says."""
    best: Tuple[Optional[int], str] = (None, "")
    avail = _mem_available()
    if avail is not None:
        best = (avail, "MemAvailable in /proc/meminfo")
    cg = _cgroup_headroom()
    if cg is not None and (best[0] is None or cg[0] < best[0]):
        best = (cg[0], f"the memory cgroup limit {cg[1]} less its usage")
    return best


def check_host_memory(bytes_needed: int, what: str) -> None:
    """Raises TideOutOfMemoryError, with both figures, when `what` needs more bytes than are available."""
    avail, source = available_host_memory()
    if avail is not None and bytes_needed > avail:
        raise TideOutOfMemoryError(
            f"{what} needs about {bytes_needed / GiB:.1f} GiB of host memory, but only {avail / GiB:.1f} GiB are "
            f"available ({source})"
        )


def host_collective_bytes(layout, kind: str, out_size: int = 0, results_copy: bool = False) -> int:
    """Bytes of every rank's buffers of one host collective on `layout` (host.py: all ranks in this process):
    all-gather, shards and unsharded parameters; reduce-scatter, gradients and packed outputs of out_size-byte
    elements. results_copy adds one more copy of the results (a reference to check them against)."""
    world, params = layout.world_size, layout.params
    if kind == "all_gather":
        inputs = world * sum(p.shard_numel * p.elem_size for p in params)
        outputs = world * inputs
        copy = inputs  # one unsharded copy of each parameter
    else:
        inputs = world * sum(p.numel * p.elem_size for p in params)
        outputs = copy = world * layout.rs_out_numel * out_size
    return inputs + outputs + (copy if results_copy else 0)

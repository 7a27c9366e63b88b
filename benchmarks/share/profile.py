# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The CUDA events of a side unit from torch.profiler, and its SM time summed and weighted by occupancy."""

import json
import math
import os
from typing import Dict, List

from .gpu import Gpu
from .method import occupancy_weighted_us


def is_gate_kernel(name: str) -> bool:
    """torch.cuda._sleep's kernel (ATen's spin_kernel), which gates units behind the host's enqueueing."""
    n = name.lower()
    return "sleep" in n or "spin_kernel" in n


def trace(g: Gpu, fn, iters=3) -> List[dict]:
    """The CUDA events of `iters` calls of fn (torch.profiler): dicts of cat ("kernel", "gpu_memcpy", "gpu_memset"),
    name, ts and dur (us), stream, ctas (kernels) and bytes (copies; 0 where the trace has none)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    t = g.torch
    t.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        t.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            data = json.load(f)
    out = []
    for e in data.get("traceEvents", []) if isinstance(data, dict) else data:
        cat = str(e.get("cat", "")).lower()
        if e.get("ph") != "X" or cat not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = e.get("args") or {}
        grid = args.get("grid") or [0]
        out.append({"cat": cat, "name": str(e.get("name", "?")), "ts": float(e.get("ts", 0.0)),
                    "dur": float(e.get("dur", 0.0)), "stream": args.get("stream"), "args": args,
                    "ctas": math.prod(int(x) for x in grid) if isinstance(grid, list) else 0,
                    "bytes": int(args.get("bytes", 0) or 0)})
    return out


def profile_unit(g: Gpu, fn, iters=3):
    """Kernels and copies of `iters` calls of fn: [(name, dur_us, ctas, args)], [(dur_us, on_sms)] of the copies and
    memsets (on_sms: a same-device copy or a memset, which run on SMs on the H200: perf/gpu.py runs_on_sms)."""
    from nccl_tide.perf.gpu import runs_on_sms

    kernels, mem = [], []
    for e in trace(g, fn, iters):
        if e["cat"] == "kernel":
            kernels.append((e["name"], e["dur"], e["ctas"], e["args"]))
        else:
            mem.append((e["dur"], runs_on_sms(e["cat"], e["name"])))
    return kernels, mem


def sm_summary(g: Gpu, kernels, mem, iters):
    ks = [k for k in kernels if not is_gate_kernel(k[0])]
    names: Dict[str, int] = {}
    for k in ks:
        names[k[0][:70]] = names.get(k[0][:70], 0) + 1
    return {
        "kernels_per_unit": len(ks) / iters,
        "kernel_us": sum(k[1] for k in ks) / iters,
        "sm_weighted_us": occupancy_weighted_us([(k[1], k[2]) for k in ks], g.n_sm) / iters,
        "max_ctas": max((k[2] for k in ks), default=0),
        "memcpy_per_unit": len(mem) / iters,
        "memcpy_us": sum(m[0] for m in mem) / iters,
        # copies the trace files as copies although they ran on SMs (their CTA count is not in the trace, so they
        # are not in sm_weighted_us; on one GPU the share's incoming copies are such copies, on a node they are
        # peer copies on copy engines: docs/architecture.md "Copies run on SMs on one GPU")
        "local_copy_us": sum(m[0] for m in mem if m[1]) / iters,
        "kernel_names": dict(sorted(names.items(), key=lambda kv: -kv[1])[:4]),
    }

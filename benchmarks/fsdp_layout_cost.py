# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Layout cost (one GPU): the per-layer copy-out and copy-in work stock FSDP2 does, at a simulated world size.

Per FSDP2 rank and decoder layer, stock FSDP2 does
* after the all-gather, a copy-out of the flat rank-major output into every parameter's unsharded storage
  (torch.ops.fsdp.split_with_sizes_copy, bf16);
* before the reduce-scatter, a copy-in of every bf16 gradient into one fp32 rank-major buffer, each parameter padded
  to a multiple of the world size in dim 0 (torch.ops.fsdp.chunk_cat; the cast to the fp32 reduce type included).
TIDE does neither (its copies land in the parameters' storage; its reduce reads the bf16 gradients directly), so its
column is 0 by construction, not by measurement. Measured anchor (H200, torch 2.11, W=8): 0.90 ms copy-out and
2.3-2.6 ms copy-in per Llama-3.1-70B layer.
"""

import statistics
from typing import List

ANCHOR = {"llama3-70b-layer": {"copy_out_ms": 0.90, "copy_in_ms": (2.3, 2.6), "device": "H200"}}


def _ops():
    from nccl_tide.perf.fsdp2_ops import chunk_cat_impl, copy_out_impl

    return copy_out_impl(), chunk_cat_impl()


def _time_ms(fn, iters: int, warmup: int = 3) -> dict:
    import torch

    from nccl_tide.perf.gpu import sleep

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        sleep()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in times)
    return {"median": statistics.median(ms), "min": ms[0], "max": ms[-1], "n": len(ms)}


def measure(model: str, world: int, iters: int = 20, sm_time: bool = True, device=None, params=None) -> dict:
    """One rank's copy-out and copy-in for one layer of `model` at world size `world` (checked for correctness).
    device: default the current CUDA device; params: [(name, shape)] instead of the named layout (tests)."""
    import torch

    from nccl_tide.models import model_params
    from nccl_tide.perf.gpu import sm_time as profile_sm

    (out_name, copy_out), (in_name, chunk_cat) = _ops()
    params = model_params(model) if params is None else params
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    shards = [-(-s[0] // world) * (s[1] if len(s) > 1 else 1) for _, s in params]  # dim-0 padded shard numel
    S = sum(shards)
    g = torch.Generator(device=dev).manual_seed(world)
    flat = torch.randn(world, S, dtype=torch.float32, device=dev, generator=g).to(torch.bfloat16)
    outs = [torch.empty(world, k, dtype=torch.bfloat16, device=dev) for k in shards]

    def do_copy_out():
        copy_out(flat, shards, outs)

    do_copy_out()
    torch.cuda.synchronize()
    off, wrong = 0, 0
    for k, o in zip(shards, outs):
        wrong += int(not torch.equal(o, flat[:, off : off + k]))
        off += k
    res = {
        "model": model,
        "world": world,
        "n_params": len(params),
        "numel": sum(s[0] * (s[1] if len(s) > 1 else 1) for _, s in params),
        "padded_numel": world * S,
        "copy_out_op": out_name,
        "copy_in_op": in_name,
    }
    res["copy_out_ms"] = _time_ms(do_copy_out, iters)
    res["copy_out_bytes"] = 2 * 2 * world * S  # bf16 read + write
    if sm_time:
        res["copy_out_sm_us"] = profile_sm(do_copy_out)["kernel_us"]
    flat = outs = None  # noqa: F841  (free before the copy-in buffers)
    grads = [torch.randn(tuple(s), dtype=torch.float32, device=dev, generator=g).to(torch.bfloat16) for _, s in params]
    rsin = torch.empty(world, S, dtype=torch.float32, device=dev)

    def do_copy_in():
        chunk_cat(grads, world, rsin)

    rsin.fill_(float("nan"))
    do_copy_in()
    torch.cuda.synchronize()
    off = 0
    for k, gr, (_, s) in zip(shards, grads, params):  # rank r's chunk of each parameter, zero padded, in fp32
        rows = s[0]
        per = -(-rows // world)
        row_numel = k // per if per else 1
        padded = torch.zeros(world * per * row_numel, dtype=torch.float32, device=dev)
        padded[: gr.numel()] = gr.reshape(-1).float()
        wrong += int(not torch.equal(rsin[:, off : off + k], padded.view(world, k)))
        off += k
    res["copy_in_ms"] = _time_ms(do_copy_in, iters)
    res["copy_in_bytes"] = 2 * res["numel"] + 4 * world * S  # bf16 read + fp32 write
    if sm_time:
        res["copy_in_sm_us"] = profile_sm(do_copy_in)["kernel_us"]
    res["wrong_params"] = wrong
    res["tide_ms"] = 0.0
    res["tide_note"] = "none: TIDE places gathered shards in the parameters' storage and reads bf16 grads directly"
    res["anchor"] = ANCHOR.get(model)
    grads = rsin = None  # noqa: F841
    torch.cuda.empty_cache()
    return res


def table(rows: List[dict]) -> str:
    head = ("layout", "W", "copy-out ms", "copy-in ms", "total ms", "SM us (out+in)", "TIDE ms", "wrong", "anchor")
    lines = []
    for r in rows:
        a = r.get("anchor")
        anchor = f"{a['copy_out_ms']} / {a['copy_in_ms'][0]}-{a['copy_in_ms'][1]} ms ({a['device']})" if a else "-"
        sm = (r.get("copy_out_sm_us") or 0) + (r.get("copy_in_sm_us") or 0) if "copy_out_sm_us" in r else None
        lines.append(
            (
                r["model"],
                str(r["world"]),
                f"{r['copy_out_ms']['median']:.3f}",
                f"{r['copy_in_ms']['median']:.3f}",
                f"{r['copy_out_ms']['median'] + r['copy_in_ms']['median']:.3f}",
                "-" if sm is None else f"{sm:.0f}",
                "0 (none)",
                str(r["wrong_params"]),
                anchor,
            )
        )
    w = [max(len(h), *(len(x[i]) for x in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = [
        "| " + " | ".join(h.ljust(w[i]) for i, h in enumerate(head)) + " |",
        "|" + "|".join("-" * (x + 2) for x in w) + "|",
    ]
    out += ["| " + " | ".join(x[i].ljust(w[i]) for i in range(len(head))) + " |" for x in lines]
    return "\n".join(out)

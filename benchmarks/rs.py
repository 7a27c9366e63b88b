# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Benchmarks: TIDE reduce-scatter on one H200 (loopback 8 virtual ranks).

(2a) phase-2 reduce kernel bandwidth, from torch.profiler kernel durations during a TIDE RS
     (bytes = bf16 staging read + fp32 output written, all 8 ranks), against the device-to-device
     copy bandwidth measured in the same run (torch copy_ of a 2 GiB buffer, read + written).
     Measured twice: the default pipelined plan (phase-1 CE copies may run beside the kernel) and
     a one-chunk plan (rs_chunk_bytes = whole output, so a rank's kernel follows its own copies).
(2b) TIDE RS end to end (bf16 grads -> fp32 shards, Llama-3.1-8B / 70B layer) against the FSDP2
     path on the same data: fp32 chunk_cat copy-in (torch.ops.fsdp.chunk_cat in FSDP2's
     foreach_reduce_scatter_copy_in) of each rank's grads, then an SM reduction standing in for
     NCCL's fp32 RS (one torch.sum over the 8 ranks' fp32 inputs). Time and (modelled) HBM bytes.
(3)  SM time per RS: sum of kernel durations (torch.profiler), TIDE vs that SM baseline.
Outputs are poisoned (NaN) first and checked: bit-exact against a left-to-right fp32 sum
(the tide.h accumulation order), and close to the SM baseline.
"""

import torch
from bench_common import (
    Ctx,
    make_layout,
    model_params,
    numels_rows,
    profile_gpu,
    rand,
    record_failure,
    row,
    standalone,
    time_ms,
)

METHOD = (
    "CUDA events per call after a ~1 ms sleep kernel, median of {iters} after 3 warm-ups; kernel "
    "durations from torch.profiler (ProfilerActivity.CUDA, chrome-trace cat=kernel); kernel GB/s = "
    "bytes / union of kernel intervals; random bf16 grads; buffers far exceed L2."
)


def chunk_cat_impl():
    """FSDP2's copy-in: torch.ops.fsdp.chunk_cat, else torch._chunk_cat, else padded casts + copy."""
    try:
        import torch.distributed.fsdp  # noqa: F401  (registers torch.ops.fsdp.*)
    except Exception:
        pass
    try:
        op = torch.ops.fsdp.chunk_cat
        return "torch.ops.fsdp.chunk_cat", lambda ts, n, out: op(ts, dim=0, num_chunks=n, out=out)
    except (AttributeError, RuntimeError):
        pass
    if hasattr(torch, "_chunk_cat"):
        return "torch._chunk_cat", lambda ts, n, out: torch._chunk_cat(ts, 0, n, out=out)

    def manual(ts, n, out):
        o = 0
        for t in ts:
            rows = t.shape[0]
            c = t.numel() // rows
            k = -(-rows // n) * c
            padded = torch.zeros(n * k, dtype=out.dtype, device=out.device)
            padded[: t.numel()] = t.reshape(-1)
            out[:, o : o + k] = padded.view(n, k)
            o += k

    return "padded fp32 casts + copy", manual


def copy_bandwidth(ctx, iters):
    nbytes = (8 << 20) if ctx.dry_run else (2 << 30)
    src = rand(ctx, (nbytes // 4,), torch.float32, seed=7)
    dst = torch.empty_like(src)
    t = time_ms(ctx, lambda: dst.copy_(src), iters)
    del src, dst
    ctx.free()
    return {"buffer_bytes": nbytes, "bytes_per_copy": 2 * nbytes, "ms": t, "GBps": 2 * nbytes / t["median"] / 1e6}


def rs_model(ctx, model, iters, notes):
    W = 8
    shapes = model_params(model)
    numels, rows = numels_rows(shapes)
    layouts = [make_layout(numels, W, r, rows, notes=notes) for r in range(W)]
    lay = layouts[0]
    M = lay.rs_out_numel
    P = W * M  # padded elements of one rank's gradients
    N = sum(numels)
    name, chunk_cat = chunk_cat_impl()
    res = {"model": model, "world": W, "virtual_ranks": W, "numel": N, "rs_out_numel": M, "copy_in_op": name,
           "rs_num_chunks": getattr(lay, "rs_num_chunks", None), "rs_staging_bytes": lay.rs_staging_bytes}
    world = ctx.loopback_world(W)
    try:
        grads = [[rand(ctx, s, torch.bfloat16, seed=1000 * r + i) for i, (_, s) in enumerate(shapes)] for r in range(W)]
        outs = [torch.empty(M, dtype=torch.float32, device=ctx.device) for _ in range(W)]
        streams = ctx.rank_streams(world)
        rsin = torch.empty(W, W * M, dtype=torch.float32, device=ctx.device)
        base_out = torch.empty(W, M, dtype=torch.float32, device=ctx.device)

        def tide_rs(lays=layouts, staging=None):
            ctx.fanout(streams)
            world.reduce_scatter(lays, grads, outs, op="sum", staging=staging, streams=streams)
            ctx.join(streams)

        def copy_in():
            for r in range(W):
                chunk_cat(grads[r], W, rsin[r].view(W, M))

        def reduce():
            torch.sum(rsin.view(W, W, M), dim=0, out=base_out)

        def baseline():
            copy_in()
            reduce()

        # Correctness: poison, run both, compare.
        for o in outs:
            o.fill_(float("nan"))
        base_out.fill_(float("nan"))
        tide_rs()
        ctx.world_sync(world)
        baseline()
        ctx.sync()
        res["check"] = _check(rsin, base_out, outs, W, M)

        res["tide_ms"] = time_ms(ctx, tide_rs, iters)
        res["baseline_ms"] = time_ms(ctx, baseline, iters)
        res["baseline_copy_in_ms"] = time_ms(ctx, copy_in, iters)
        res["baseline_reduce_ms"] = time_ms(ctx, reduce, iters)
        res["tide_profile"] = profile_gpu(ctx, tide_rs)
        res["baseline_profile"] = profile_gpu(ctx, baseline)

        # One-chunk plan: a rank's reduce kernel runs after all of its own phase-1 copies.
        try:
            one_chunk = max(4096, 4 * (-(-M // 8) * 8))  # the plan rounds chunk elements down to a multiple of 8
            lays1 = [make_layout(numels, W, r, rows, notes=notes, rs_chunk_bytes=one_chunk) for r in range(W)]
            res["one_chunk_num_chunks"] = getattr(lays1[0], "rs_num_chunks", None)
            staging = None  # the world's own staging (grown by the library to the layout's rs_staging_bytes)
            tide_rs(lays1, staging)
            ctx.world_sync(world)
            res["one_chunk_check"] = _check(rsin, base_out, outs, W, M, ref_only=True)
            res["one_chunk_profile"] = profile_gpu(ctx, lambda: tide_rs(lays1, staging))
            res["one_chunk_ms"] = time_ms(ctx, lambda: tide_rs(lays1, staging), iters)
        except Exception as e:
            import traceback

            print(f"[rs] one-chunk variant of {model} failed:\n{traceback.format_exc()}", flush=True)
            res["one_chunk_error"] = f"{type(e).__name__}: {e}"
        ctx.sync()
    finally:
        ctx.sync()
        world.close()
    # Modelled HBM bytes, all 8 ranks (N real grad elements, P padded, M output per rank).
    res["tide_bytes"] = W * (2 * N + 2 * P + 2 * P + 4 * M)  # CE read grads, write staging; kernel read, write
    res["baseline_bytes"] = W * (2 * N + 4 * P) + (4 * W * P + 4 * W * M)  # copy-in; SM reduction
    res["kernel_bytes"] = W * (2 * P + 4 * M)  # staging bf16 read + fp32 output written
    for key in ("tide_profile", "one_chunk_profile"):
        p = res.get(key)
        if p and p["kernel_busy_us"] > 0:
            p["kernel_GBps_busy"] = res["kernel_bytes"] / p["kernel_busy_us"] / 1e3
            p["kernel_GBps_sum"] = res["kernel_bytes"] / p["kernel_us"] / 1e3
    del grads, outs, rsin, base_out
    ctx.free()
    return res


def _check(rsin, base_out, outs, W, M, ref_only=False):
    """TIDE outputs vs the left-to-right fp32 sum (bit-exact) and vs the SM baseline (close)."""
    ref = rsin[0].view(W, M).clone()
    for s in range(1, W):
        ref.add_(rsin[s].view(W, M))  # ((x0 + x1) + x2) + ...: the tide.h order for one node
    out = {"nan_elements": 0, "bit_exact_ranks": 0, "max_abs_diff_vs_ref": 0.0}
    if not ref_only:
        out["max_abs_diff_vs_sm_baseline"] = 0.0
    for r in range(W):
        o = outs[r]
        out["nan_elements"] += int(torch.isnan(o).sum())
        out["bit_exact_ranks"] += int(torch.equal(o, ref[r]))
        out["max_abs_diff_vs_ref"] = max(out["max_abs_diff_vs_ref"], float((o - ref[r]).abs().max()))
        if not ref_only:
            d = float((o - base_out[r]).abs().max())
            out["max_abs_diff_vs_sm_baseline"] = max(out["max_abs_diff_vs_sm_baseline"], d)
    out["ok"] = out["nan_elements"] == 0 and out["max_abs_diff_vs_ref"] <= 1e-4
    del ref
    return out


def run(ctx):
    models = ["tiny-layer"] if ctx.dry_run else ["llama3-8b-layer", "llama3-70b-layer"]
    iters = 3 if ctx.dry_run else 20
    res = {"method": METHOD.format(iters=iters), "models": [], "notes": [], "errors": [], "summary": []}
    summary, errors = res["summary"], res["errors"]
    bw = None
    try:
        res["copy_bandwidth"] = cb = copy_bandwidth(ctx, iters)
        bw = cb["GBps"]
        summary.append(row("2a", "D2D copy bw (copy_ 2 GiB, r+w)", None, bw, None, "reference", None, "GB/s"))
    except Exception as e:
        record_failure("rs", errors, "copy bandwidth", e)
    for m in models:
        try:
            r = rs_model(ctx, m, iters, res["notes"])
            res["models"].append(r)
        except Exception as e:
            record_failure("rs", errors, f"rs {m}", e)
            ctx.free()
            continue
        for key, label in (("one_chunk_profile", "1 chunk"), ("tide_profile", "pipelined")):
            p = r.get(key)
            if p and "kernel_GBps_busy" in p:
                g = p["kernel_GBps_busy"]
                ok = (g / bw >= 0.90) if (bw and key == "one_chunk_profile") else None
                summary.append(row("2a", f"RS phase-2 kernel {m} ({label})", g, bw, g / bw if bw else None,
                                   ">=0.90x copy bw" if key == "one_chunk_profile" else "info", ok, "GB/s"))
        t, b = r["tide_ms"]["median"], r["baseline_ms"]["median"]
        summary.append(row("2b", f"RS loopback-8 e2e {m}", t, b, t / b if b else None,
                           "info (8-GPU target <=0.55x)", None, "ms"))
        summary.append(row("2b", f"RS HBM bytes (model) {m}", r["tide_bytes"] / 1e9, r["baseline_bytes"] / 1e9,
                           r["tide_bytes"] / r["baseline_bytes"], "info", None, "GB"))
        ts, bs = r["tide_profile"]["kernel_us"], r["baseline_profile"]["kernel_us"]
        ratio = bs / ts if ts else None
        summary.append(row(3, f"RS SM time per RS {m}", ts, bs, ratio, ">=15x lower",
                           None if ratio is None else ratio >= 15, "us"))
        tw, bw_ = r["tide_profile"].get("sm_weighted_us"), r["baseline_profile"].get("sm_weighted_us")
        if tw is not None and bw_ is not None:
            summary.append(row(3, f"RS SM-weighted time {m}", tw, bw_, bw_ / tw if tw else None,
                               "info (dur x min(1, CTAs/SMs))", None, "us"))
        c = r["check"]
        summary.append(row("2b", f"RS max|diff| vs L2R ref {m}", c["max_abs_diff_vs_ref"],
                           c["max_abs_diff_vs_sm_baseline"], None,
                           f"bit-exact {c['bit_exact_ranks']}/8, NaN {c['nan_elements']}", c["ok"]))
    return res


NAME = "rs"

if __name__ == "__main__":
    standalone(run, NAME)

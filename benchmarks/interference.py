# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Benchmark: how much side work slows a concurrent single-wave GEMM.

A bf16 GEMM (1024x4096 @ 4096x16384, ~0.17 ms alone on an H200) is timed alone and while side
work runs on other streams: TIDE AG and TIDE RS (loopback 8 virtual ranks, Llama-3.1-8B layer),
an SM copy (torch copy_ of a 1 GiB buffer) and an SM reduction (bf16 -> fp32 torch.sum over 8 rows).

Method: per run, a sleep kernel on a head stream gates the side streams so
that the CPU can enqueue everything first; the side streams run side op 1, then record events, then
K-1 more side ops (K chosen from the side op's own time so that they outlast 3x the GEMM time + 1 ms);
the GEMM stream waits on the events recorded after op 1, then records start, runs the GEMM, records
end. So the side streams are busy when the GEMM starts and stay busy past its end (checked: the
last side op must end after the GEMM in each run, reported as `covered`). Median of N runs with
min/max and IQR; slowdown = median_with / median_alone (alone measured before and after).
"""

import math

import torch
from bench_common import (
    Ctx,
    make_layout,
    model_params,
    numels_rows,
    rand,
    record_failure,
    row,
    standalone,
    stats,
    time_ms,
)

METHOD = __doc__.split("Method: ")[1].strip().replace("\n", " ")


class Gemm:
    def __init__(self, ctx):
        m, k, n = (64, 128, 256) if ctx.dry_run else (1024, 4096, 16384)
        self.shape = (m, k, n)
        self.a = rand(ctx, (m, k), torch.bfloat16, seed=1)
        self.b = rand(ctx, (k, n), torch.bfloat16, seed=2)
        self.c = torch.empty(m, n, dtype=torch.bfloat16, device=ctx.device)

    def __call__(self):
        torch.matmul(self.a, self.b, out=self.c)


def _probe_lib():
    """The hinted-copy probe (ce_copy_probe.cu), compiled with nvcc on first use; None where that cannot be done."""
    import ctypes
    import os
    import shutil
    import subprocess
    import tempfile

    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        return None
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ce_copy_probe.cu")
    so = os.path.join(tempfile.mkdtemp(prefix="tide_probe_"), "probe.so")
    subprocess.check_call([nvcc, "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-o", so, src])
    lib = ctypes.CDLL(so)
    lib.tide_probe_copy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                    ctypes.c_int, ctypes.c_int]
    lib.tide_probe_copy.restype = ctypes.c_int
    return lib


def side_ops(ctx, notes):
    """name -> (setup() -> (unit(), streams, cleanup())). Setups run lazily, one at a time.

    TIDE_BENCH_INTERFERENCE_RANKS (comma list, default "8") picks the loopback world sizes;
    TIDE_BENCH_INTERFERENCE_PROBE=1 adds raw copies issued exactly as the method measures them
    (hinted batch on 1 and on 8 streams, plain cudaMemcpyAsync on 1 stream), to tell the copy mechanism
    apart from TIDE's own issue pattern."""
    import os

    model = "tiny-layer" if ctx.dry_run else "llama3-8b-layer"
    shapes = model_params(model)
    numels, rows = numels_rows(shapes)
    world_sizes = [int(w) for w in os.environ.get("TIDE_BENCH_INTERFERENCE_RANKS", "8").split(",") if w]

    def tide(kind, W):
        def setup():
            world = ctx.loopback_world(W)
            layouts = [make_layout(numels, W, r, rows, notes=notes) for r in range(W)]
            lay = layouts[0]
            streams = ctx.rank_streams(world)
            if kind == "ag":
                slots = world.alloc_slot(lay.slot_bytes)
                send = [rand(ctx, (lay.send_bytes // 2,), torch.bfloat16, seed=50 + r).view(torch.uint8)
                        for r in range(W)]

                def unit():
                    world.all_gather(layouts, slots, sendbufs=send, streams=streams)
            else:
                grads = [[rand(ctx, s, torch.bfloat16, seed=100 * r + i) for i, (_, s) in enumerate(shapes)]
                         for r in range(W)]
                outs = [torch.empty(lay.rs_out_numel, dtype=torch.float32, device=ctx.device) for _ in range(W)]

                def unit():
                    world.reduce_scatter(layouts, grads, outs, op="sum", streams=streams)

            return unit, streams or [None], lambda: (ctx.sync(), world.close())

        return setup

    def sm_copy():
        side = ctx.stream()
        n = (4 << 20) if ctx.dry_run else (1 << 30)
        src = rand(ctx, (n // 4,), torch.float32, seed=3)
        dst = torch.empty_like(src)

        def unit():
            with ctx.use_stream(side):
                dst.copy_(src)

        return unit, [side], lambda: None

    def sm_reduce():
        side = ctx.stream()
        n = (1 << 18) if ctx.dry_run else (64 << 20)
        x = rand(ctx, (8, n), torch.bfloat16, seed=4)
        y = torch.empty(n, dtype=torch.float32, device=ctx.device)

        def unit():
            with ctx.use_stream(side):
                torch.sum(x, dim=0, dtype=torch.float32, out=y)

        return unit, [side], lambda: None

    def probe_copy(n_streams, hinted):
        def setup():
            lib = _probe_lib()
            if lib is None:
                raise RuntimeError("nvcc not found: the copy probe cannot be built here")
            streams = [ctx.stream() for _ in range(n_streams)]
            n = 1 << 30
            bufs = [(rand(ctx, (n // 4,), torch.float32, seed=7 + i), torch.empty(n // 4, device=ctx.device))
                    for i in range(n_streams)]

            def unit():
                for s, (src, dst) in zip(streams, bufs):
                    rc = lib.tide_probe_copy(dst.data_ptr(), src.data_ptr(), n, s.cuda_stream, int(hinted), 16)
                    if rc != 0:
                        raise RuntimeError(f"probe copy failed: cudaError {rc}")

            return unit, streams, lambda: None

        return setup

    ops = {}
    for W in world_sizes:
        ops[f"TIDE AG (loopback {W}, 8B layer)"] = (tide("ag", W), True)
        ops[f"TIDE RS (loopback {W}, 8B layer)"] = (tide("rs", W), True)
    ops["SM copy (copy_ 1 GiB)"] = (sm_copy, False)
    ops["SM reduction (bf16->fp32 sum, 1 GiB)"] = (sm_reduce, False)
    if os.environ.get("TIDE_BENCH_INTERFERENCE_PROBE") == "1" and not ctx.dry_run:
        ops["probe: hinted batch copy, 1 stream (1 GiB)"] = (probe_copy(1, True), False)
        ops["probe: hinted batch copy, 8 streams (8 x 1 GiB)"] = (probe_copy(8, True), False)
        ops["probe: cudaMemcpyAsync, 1 stream (1 GiB)"] = (probe_copy(1, False), False)
    return ops


def _wait(ctx, stream, event):
    if ctx.cuda:
        stream.wait_event(event)


def gemm_alone(ctx, gemm, gstream, runs):
    times = []
    for _ in range(runs):
        ctx.sync()
        ctx.sleep(gstream)
        a, b = ctx.event(), ctx.event()
        a.record(gstream)
        with ctx.use_stream(gstream):
            gemm()
        b.record(gstream)
        ctx.sync()
        times.append(a.elapsed_time(b))
    return times


def gemm_beside(ctx, gemm, gstream, head, unit, streams, k, runs):
    times, margins = [], []
    for _ in range(runs):
        ctx.sync()
        ctx.sleep(head)  # the CPU enqueues everything below while this runs
        if ctx.cuda:
            for s in streams:
                s.wait_stream(head)
        unit()
        first = []
        for s in streams:
            e = ctx.event()
            e.record(s)
            first.append(e)
        for _ in range(k - 1):
            unit()
        last = []
        for s in streams:
            e = ctx.event()
            e.record(s)
            last.append(e)
        for e in first:
            _wait(ctx, gstream, e)
        a, b = ctx.event(), ctx.event()
        a.record(gstream)
        with ctx.use_stream(gstream):
            gemm()
        b.record(gstream)
        ctx.sync()
        times.append(a.elapsed_time(b))
        margins.append(min(b.elapsed_time(e) for e in last))  # > 0: side work outlasted the GEMM
    return times, margins


def run(ctx):
    runs = 5 if ctx.dry_run else 31
    res = {"method": METHOD + f" N = {runs}.", "sides": [], "notes": [], "errors": [], "summary": []}
    summary = res["summary"]
    gemm = Gemm(ctx)
    gstream = ctx.stream()
    res["gemm_shape_mkn"] = gemm.shape
    with ctx.use_stream(gstream):  # cuBLAS workspace and heuristics per stream: warm up where it is timed
        for _ in range(5):
            gemm()
    ctx.sync()
    alone = gemm_alone(ctx, gemm, gstream, runs)
    res["alone_ms"] = alone_st = stats(alone)
    base = alone_st["median"]
    summary.append(row(4, "GEMM alone ({}x{}x{} bf16)".format(*gemm.shape), None, base, None,
                       f"IQR {alone_st['p25']:.4f}-{alone_st['p75']:.4f}", None, "ms"))
    for name, (setup, is_tide) in side_ops(ctx, res["notes"]).items():
        cleanup = None
        try:
            unit, streams, cleanup = setup()
            # GEMM and head streams distinct from every side stream (torch's stream pool wraps at 32).
            gs, head = ctx.streams_avoiding(2, streams)
            with ctx.use_stream(gs):
                for _ in range(3):
                    gemm()

            def once(unit=unit, streams=streams):
                ctx.fanout(streams)
                unit()
                ctx.join(streams)

            unit_st = time_ms(ctx, once, iters=5, warmup=2)
            k = 1 + max(2, math.ceil((3 * base + 1.0) / max(unit_st["median"], 1e-3)))
            k = min(k, 200)
            times, margins = gemm_beside(ctx, gemm, gs, head, unit, streams, k, runs)
            st = stats(times)
            d = {"side": name, "tide": is_tide, "side_op_ms": unit_st, "k_side_ops": k, "with_ms": st,
                 "slowdown": st["median"] / base, "slowdown_p25": st["p25"] / base, "slowdown_p75": st["p75"] / base,
                 "covered_runs": sum(m > 0 for m in margins), "runs": runs, "margin_ms": stats(margins)}
            res["sides"].append(d)
            summary.append(row(4, f"GEMM beside {name}", st["median"], base, d["slowdown"],
                               "<=1.05x" if is_tide else "info (SM side work)",
                               (d["slowdown"] <= 1.05) if is_tide else None, "ms"))
        except Exception as e:
            record_failure("interference", res["errors"], name, e)
        finally:
            try:
                if cleanup:
                    cleanup()
            except Exception as e:
                res["errors"].append({"what": f"{name} cleanup", "error": f"{type(e).__name__}: {e}"})
            ctx.free()
    after = stats(gemm_alone(ctx, gemm, gstream, runs))
    res["alone_after_ms"] = after
    summary.append(row(4, "GEMM alone again (drift check)", None, after["median"], after["median"] / base,
                       "~1.00x", None, "ms"))
    return res


NAME = "interference"

if __name__ == "__main__":
    standalone(run, NAME)

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""The reduce's two kernels side by side in one GPU run, every figure beside its baseline from the same process:
the register kernel ("loads", the library's) and the staged kernel ("staged": TMA bulk copies into a shared-memory
ring, plugin/cuda/reduce_staged.cu), both through the benchmark library (bench_lib, tideBenchReduce).

1. alone: GB/s per CTA of each kernel on G CTAs in one launch, G in --ctas (W bf16 inputs -> fp32, one
   --alone-numel-element output chunk, as sm_bandwidth.py), the output bit for bit against torch's left fold;
2. beside the arrivals: one rank's share (benchmarks/share: W = --ranks, --layout, pushes paced to --rate-link) with
   every reduce of the unit on G CTAs, its timeline timing each chunk's reduce: per chunk, reduce traffic / time /
   CTAs, and their median over the full chunks whose next chunk arrives while they reduce (all but the last). This
   is the figure plugin/cuda/reduce_kernel.h's kReduceCtaGBps holds (64.5-68.5 GB/s for the register kernel);
3. the share beside the single-wave GEMM at each --links rate: the NCCL-like persistent reduce of 32 CTAs spread
   over the same link time (the baseline), then the RS share with the register kernel on the library's grid, with
   the staged kernel on the same grid, and with the staged kernel on the grid the rule gives for its rate measured
   in 2. (the least of its medians at 4 CTAs and more; --staged-cta-gbps sets it instead): each side's SM time
   (occupancy-weighted), the baseline's SM time over it, the GEMM's slowdown and the share's end to end over the
   link floor, every output checked bit for bit.
Prints the per-CTA rates and one table of ratios; writes DIR/reduce_sweep.json. Exit status 1 if an output was not
bit-exact or a step failed; 2 for bad arguments or no GPU; 3 if a reduce did not end within 30 s (the figures
measured before it are written). About 3 minutes on an H100 with the defaults.

    NCCL_TIDE_LIBRARY_PATH=build/gpu/libnccl-tide.so PYTHONPATH=pytorch_glue python3 benchmarks/reduce_sweep.py \\
        --out DIR
"""

import argparse
import functools
import gc
import json
import math
import os
import statistics
import sys
import threading
import time
import traceback
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from share.cli import measure_side  # noqa: E402
from share.gpu import Gpu  # noqa: E402
from share.harness import Harness  # noqa: E402
from share.method import MIN_RUNS  # noqa: E402
from share.plan import parse_bytes  # noqa: E402
from share.sides import NcclLike, RsShare  # noqa: E402
from share.timeline import unit_timeline  # noqa: E402

KERNELS = ("loads", "staged")
BASELINE_CTAS = 32  # the NCCL-like persistent reduce the SM-time ratio is taken against
TARGETS = {"GBps_per_cta_beside": 100.0, "sm_ratio": {370.0: 6.0, 50.0: 50.0}, "gemm_slowdown": 1.03}


def int_list(text: str) -> List[int]:
    return [int(x) for x in text.split(",") if x]


def float_list(text: str) -> List[float]:
    return [float(x) for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/reduce_sweep.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="folder for reduce_sweep.json")
    p.add_argument("--ranks", type=int, default=8, help="W, the GPUs of the node (2..8)")
    p.add_argument("--layout", default="llama3-8b-layer")
    p.add_argument("--runs", type=int, default=MIN_RUNS, help=f"GEMM runs per median (default {MIN_RUNS})")
    p.add_argument("--links", type=float_list, default=[370.0, 50.0], help="link rates of step 3, GB/s")
    p.add_argument("--rate-link", type=float, default=370.0, help="link rate of step 2, GB/s")
    p.add_argument("--ctas", type=int_list, default=[1, 4, 8, 10], help="CTA counts of steps 1 and 2")
    p.add_argument("--alone-numel", type=parse_bytes, default=8 << 20, help="output elements of step 1's chunk")
    p.add_argument("--piece-bytes", type=parse_bytes, default=4 << 20, help="pacing granularity (default 4M)")
    p.add_argument("--rs-chunk-bytes", type=parse_bytes, default=0, help="layout RS chunk (0: the library's)")
    p.add_argument("--staged-cta-gbps", type=float, default=0.0,
                   help="the rate step 3 sizes the staged grid by (0: the one measured in step 2)")
    p.add_argument("--seed", type=int, default=1)
    return p


def validate(a) -> Optional[str]:
    if not 2 <= a.ranks <= 8:
        return f"--ranks must be 2..8, got {a.ranks}"
    if a.runs < 1:
        return f"--runs must be >= 1, got {a.runs}"
    if not a.links or not all(x > 0 and math.isfinite(x) for x in a.links + [a.rate_link]):
        return "--links and --rate-link must be positive rates (GB/s)"
    if not a.ctas or not all(1 <= c <= 1024 for c in a.ctas):
        return f"--ctas must be CTA counts of 1..1024, got {a.ctas}"
    if a.alone_numel < 8 or a.alone_numel % 8:
        return f"--alone-numel must be a positive multiple of 8, got {a.alone_numel}"
    if not (a.staged_cta_gbps >= 0 and math.isfinite(a.staged_cta_gbps)):
        return f"--staged-cta-gbps must be 0 or a rate, got {a.staged_cta_gbps}"
    return None


def chunk_rates(rows: Sequence[dict], chunk_bytes: Sequence[int], chunk_numels: Sequence[int],
                full_numel: int) -> List[float]:
    """GB/s per CTA of each full chunk's reduce whose next chunk arrives while it runs (all but the last), from a
    share timeline's rows (red_start_us, red_end_us, red_ctas) and each chunk's reduce traffic."""
    out = []
    for r, nbytes, numel in zip(rows[:-1], chunk_bytes, chunk_numels):
        dur_us = r.get("red_end_us", math.nan) - r.get("red_start_us", math.nan)
        ctas = r.get("red_ctas", 0)
        if numel == full_numel and dur_us > 0 and ctas > 0:
            out.append(nbytes / (dur_us * 1e3) / ctas)
    return out


def sizing_rate(beside: Sequence[dict], explicit: float) -> Optional[float]:
    """The staged kernel's per-CTA rate the rule sizes its grid by in step 3: `explicit` if set, else the least of
    its medians beside the arrivals at 4 CTAs or more (at fewer, a reduce sees less of its neighbours' traffic)."""
    if explicit > 0:
        return explicit
    got = [d["median_GBps_per_cta"] for d in beside if d["kernel"] == "staged" and d.get("median_GBps_per_cta")]
    wide = [d["median_GBps_per_cta"] for d in beside if d["kernel"] == "staged" and d.get("median_GBps_per_cta")
            and d["ctas"] >= 4]
    return min(wide or got) if got else None


class GpuHang(RuntimeError):
    """A kernel did not end: the GPU context is stuck, nothing more can run in this process."""


def synchronize_within(torch, seconds: float, what: str) -> None:
    """torch.cuda.synchronize(), but a kernel that never ends (a ring that waits forever) raises GpuHang after
    `seconds` instead of holding the run until its call's limit, so the figures so far can still be written."""
    waiter = threading.Thread(target=torch.cuda.synchronize, daemon=True)
    waiter.start()
    waiter.join(seconds)
    if waiter.is_alive():
        raise GpuHang(f"{what}: still running after {seconds:g} s")


def time_ms(torch, fn, stream, what: str, iters: int = 5) -> float:
    """ms per call of fn, enqueued on `stream` (CUDA events around `iters` calls after one warm-up, which must end
    within 30 s)."""
    fn()
    synchronize_within(torch, 30.0, what)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(stream)
    for _ in range(iters):
        fn()
    b.record(stream)
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def alone(g: Gpu, B, W: int, n: int, ctas: Sequence[int], seed: int) -> List[dict]:
    """Step 1: each kernel on G CTAs in one launch over one chunk, bit for bit against torch's left fold."""
    t = g.torch
    inp = g.rand(W * n, t.bfloat16, seed)
    out = t.empty(n, dtype=t.float32, device=g.dev)
    ref = inp[:n].float()
    for s in range(1, W):
        ref = ref + inp[s * n:(s + 1) * n].float()  # ((x0 + x1) + x2) + ...: tide.h's order
    traffic = n * (2 * W + 4)
    stream = g.stream()
    rows = []
    for kernel in KERNELS:
        for G in ctas:
            # bytes per CTA just above traffic / G: G CTAs, one launch
            args = B.reduce_args(inp.data_ptr(), n * 2, W, n, out.data_ptr(), max_ctas=G,
                                 cta_bytes=traffic // G + 8 * (2 * W + 4), kernel=kernel)
            shape = B.reduce_shape(args)
            out.fill_(float("nan"))
            ms = time_ms(t, functools.partial(B.reduce, args, stream.cuda_stream), stream, f"{kernel} on {G} CTAs")
            exact = bool(t.equal(out.view(t.int32), ref.view(t.int32)))
            rows.append({"kernel": kernel, "ctas": G, "shape": shape, "ms": ms, "GBps": traffic / ms / 1e6,
                         "GBps_per_cta": traffic / ms / 1e6 / shape["ctas"], "bit_exact": exact})
            print(f"[sweep] alone {kernel:6s} {G:3d} CTAs ({shape['kernel']}, {shape['launches']} launch): "
                  f"{rows[-1]['GBps_per_cta']:.1f} GB/s per CTA, exact {exact}", flush=True)
    del inp, out, ref
    return rows


def beside(g: Gpu, h: Harness, lay, a, shapes, pacer, kernel: str, G: int) -> dict:
    """Step 2: the share's reduces on G CTAs beside its paced arrivals; per-chunk rates from its timeline."""
    side = RsShare(g, lay, a.ranks, pacer, a.seed, shapes, max_ctas=G, kernel=kernel)
    try:
        check = side.check()
        unit, host_ms = h.unit_time(side)
        tl = unit_timeline(g, side, host_ms) or {"error": "no timeline"}
        d = {"kernel": kernel, "ctas": G, "check": check, "unit_ms": unit["median"],
             "e2e_over_floor": unit["median"] / (side.floor_s * 1e3), "shape_kernel": side.shapes[0]["kernel"]}
        if "rows" in tl:
            rates = chunk_rates(tl["rows"], [sh["bytes"] for sh in side.shapes], [p[2][1] for p in side.plans],
                                lay.rs_chunk_numel)
            d["GBps_per_cta_chunks"] = rates
            d["median_GBps_per_cta"] = statistics.median(rates) if rates else None
            d["timeline_rows"] = tl["rows"]
        else:
            d["error"] = tl.get("error")
        med = d.get("median_GBps_per_cta")
        print(f"[sweep] beside {kernel:6s} {G:3d} CTAs: "
              + (f"{med:.1f} GB/s per CTA (chunks {', '.join(f'{r:.1f}' for r in d['GBps_per_cta_chunks'])})"
                 if med else f"no rate ({d.get('error')})")
              + f", e2e/floor {d['e2e_over_floor']:.3f}, exact {check.get('ok')}", flush=True)
        return d
    finally:
        g.torch.cuda.synchronize()
        side.close()


def share_at(g: Gpu, h: Harness, lay, a, shapes, B, link: float, staged_rate: Optional[float]) -> List[dict]:
    """Step 3 at one link rate: the baseline and the RS share's variants beside the GEMM."""
    t = g.torch
    base = statistics.median(h.alone())
    pacer = B.Pacer(link, a.piece_bytes)
    variants = [("baseline", lambda: NcclLike(g, lay, a.ranks, BASELINE_CTAS, link, a.seed)),
                ("loads", lambda: RsShare(g, lay, a.ranks, pacer, a.seed, shapes, kernel="loads")),
                ("staged", lambda: RsShare(g, lay, a.ranks, pacer, a.seed, shapes, kernel="staged"))]
    if staged_rate:
        variants.append((f"staged@{staged_rate:.0f}", lambda: RsShare(g, lay, a.ranks, pacer, a.seed, shapes,
                                                                       kernel="staged", cta_gbps=staged_rate)))
    out = []
    try:
        for label, make in variants:
            side = make()
            try:
                d = {"link_gbps": link, "variant": label, "gemm_alone_ms": base}
                d.update(measure_side(g, h, side, base, True, False, "gemm-after-first"))
                if isinstance(side, RsShare):
                    d["paced_ctas"] = max(sh["ctas"] for sh in side.shapes[:-1]) if len(side.shapes) > 1 else None
                    d["drain_ctas"] = side.shapes[-1]["ctas"]
                    d["kernels"] = sorted({str(sh["kernel"]) for sh in side.shapes})
                out.append(d)
                print(f"[sweep] {link:g} GB/s {label}: SM {d['sm']['sm_weighted_us']:.1f} us, GEMM x{d['slowdown']:.3f}"
                      f", e2e/floor {d.get('e2e_over_floor', math.nan):.3f}, check {d['check'].get('ok')}", flush=True)
            finally:
                t.cuda.synchronize()
                side.close()
                del side
                gc.collect()
                t.cuda.empty_cache()
    finally:
        t.cuda.synchronize()
        pacer.close()
    return out


def ratio_rows(share: Sequence[dict]) -> List[dict]:
    """Per link rate: each variant against that link's baseline (SM-time ratio = baseline / variant)."""
    rows = []
    for link in sorted({d["link_gbps"] for d in share}, reverse=True):
        at = [d for d in share if d["link_gbps"] == link]
        base = next((d for d in at if d["variant"] == "baseline"), None)
        for d in at:
            sm = d["sm"]["sm_weighted_us"]
            ratio = base["sm"]["sm_weighted_us"] / sm if base and sm > 0 else None
            rows.append({"link_gbps": link, "variant": d["variant"], "paced_ctas": d.get("paced_ctas"),
                         "sm_weighted_us": sm, "sm_ratio": ratio, "slowdown": d["slowdown"],
                         "slowdown_iqr": (d["slowdown_p25"], d["slowdown_p75"]),
                         "e2e_over_floor": d.get("e2e_over_floor"), "ok": d["check"].get("ok")})
    return rows


def fmt(v, spec=".1f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def report(res: dict) -> List[str]:
    """The per-CTA rates (alone, beside the arrivals; staged / loads) and the table of ratios."""
    ctas = res["args"]["ctas"]
    lines = [f"# reduce sweep: {res.get('device')}, W={res['args']['ranks']} {res['args']['layout']}, "
             f"{res['date_utc']} UTC",
             f"| GB/s per CTA | {' | '.join(f'alone {c}' for c in ctas)} | "
             f"{' | '.join(f'beside {c}' for c in ctas)} |",
             "|---|" + "---|" * (2 * len(ctas))]
    per: Dict[str, Dict[str, Dict[int, Optional[float]]]] = {}
    for k in KERNELS:
        al = {d["ctas"]: d["GBps_per_cta"] for d in res["alone"] if d["kernel"] == k}
        bs = {d["ctas"]: d.get("median_GBps_per_cta") for d in res["beside"] if d["kernel"] == k}
        per[k] = {"alone": al, "beside": bs}
        lines.append(f"| {k} | {' | '.join(fmt(al.get(c)) for c in ctas)} | "
                     f"{' | '.join(fmt(bs.get(c)) for c in ctas)} |")

    def quotient(kind, c):
        x, y = per["staged"][kind].get(c), per["loads"][kind].get(c)
        return x / y if x and y else None

    lines.append(f"| staged / loads | {' | '.join(fmt(quotient('alone', c), '.2f') for c in ctas)} | "
                 f"{' | '.join(fmt(quotient('beside', c), '.2f') for c in ctas)} |")
    lines.append(f"# the staged grid in step 3 is sized for {fmt(res.get('staged_cta_gbps'))} GB/s per CTA "
                 f"(target beside the arrivals: >= {TARGETS['GBps_per_cta_beside']:g})")
    lines += ["| link GB/s | reduce | paced CTAs | SM us | SM time: NCCL-like 32 / this | target | GEMM x (IQR), "
              f"target <= {TARGETS['gemm_slowdown']:g} | e2e / floor | exact |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in res["ratios"]:
        target = TARGETS["sm_ratio"].get(r["link_gbps"])
        lines.append(f"| {r['link_gbps']:g} | {r['variant']} | {fmt(r['paced_ctas'], 'd')} | "
                     f"{fmt(r['sm_weighted_us'])} | {fmt(r['sm_ratio'], '.2f')} | "
                     f"{'-' if r['variant'] == 'baseline' or target is None else f'>= {target:g}'} | "
                     f"{r['slowdown']:.3f} ({r['slowdown_iqr'][0]:.3f}-{r['slowdown_iqr'][1]:.3f}) | "
                     f"{fmt(r['e2e_over_floor'], '.3f')} | {'yes' if r['ok'] else 'NO'} |")
    return lines


def run(a, res: dict) -> None:
    """Steps 1-3 into res (filled as they go: a GpuHang leaves what was measured before it)."""
    import bench_lib as B
    from nccl_tide import Layout
    from nccl_tide.models import model_params, numels_and_rows

    g = Gpu()
    t = g.torch
    shapes_named = model_params(a.layout)
    shapes = [tuple(s) for _, s in shapes_named]
    numels, rows = numels_and_rows(shapes_named)
    kw = {"rs_chunk_bytes": a.rs_chunk_bytes} if a.rs_chunk_bytes else {}
    lay = Layout(numels, "bf16", a.ranks, rank=0, row_numels=rows, **kw)
    res.update({"device": t.cuda.get_device_name(g.dev), "sms": g.n_sm, "torch": t.__version__,
                "rs_chunk_numel": lay.rs_chunk_numel, "rs_num_chunks": lay.rs_num_chunks})

    def step(name, fn, *args):
        try:
            return fn(*args)
        except GpuHang:
            raise
        except Exception as e:  # one step failing must not cost the others
            tb = traceback.format_exc()
            print(f"[sweep] {name} FAILED:\n{tb}", flush=True)
            res["errors"].append({"step": name, "error": f"{type(e).__name__}: {e}", "traceback": tb})
            return None

    res["alone"] = step("alone", alone, g, B, a.ranks, a.alone_numel, a.ctas, a.seed) or []
    h = Harness(g, a.runs)
    pacer = B.Pacer(a.rate_link, a.piece_bytes)
    try:
        for kernel in KERNELS:
            for G in a.ctas:
                d = step(f"beside {kernel} {G}", beside, g, h, lay, a, shapes, pacer, kernel, G)
                if d:
                    res["beside"].append(d)
    finally:
        t.cuda.synchronize()
        pacer.close()
    res["staged_cta_gbps"] = sizing_rate(res["beside"], a.staged_cta_gbps)
    for link in a.links:
        res["share"] += step(f"share {link:g}", share_at, g, h, lay, a, shapes, B, link, res["staged_cta_gbps"]) or []
    res["ratios"] = ratio_rows(res["share"])


def failures(res: dict) -> List[str]:
    bad = [f"alone {d['kernel']} {d['ctas']}" for d in res["alone"] if not d["bit_exact"]]
    bad += [f"beside {d['kernel']} {d['ctas']}" for d in res["beside"] if not d["check"].get("ok")]
    bad += [f"share {d['link_gbps']:g} {d['variant']}" for d in res["share"] if not d["check"].get("ok")]
    return bad + [e["step"] for e in res["errors"]]


def write(out: Optional[str], res: dict) -> None:
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "reduce_sweep.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    msg = validate(a)
    if msg:
        print(f"reduce_sweep: {msg}", file=sys.stderr)
        return 2
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # before CUDA initializes (the share's streams)
    import torch

    if not torch.cuda.is_available():
        print("reduce_sweep: needs a CUDA GPU", file=sys.stderr)
        return 2
    res = {"command": "python benchmarks/reduce_sweep.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "args": vars(a), "alone": [],
           "beside": [], "share": [], "ratios": [], "errors": []}
    try:
        run(a, res)
    except GpuHang as e:
        res["errors"].append({"step": "hang", "error": str(e)})
        print(f"reduce_sweep: {e}; writing what was measured and exiting", file=sys.stderr, flush=True)
        write(a.out, res)
        os._exit(3)  # the stuck context would hold an orderly exit too
    print("\n".join(report(res)), flush=True)
    write(a.out, res)
    bad = failures(res)
    if bad:
        print(f"reduce_sweep: not bit-exact or failed: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""python benchmarks/share [all_gather|reduce_scatter|both] [--ranks 8] [--layout llama3-8b-layer] [--link-gbps 370]
        [--piece-bytes 4M] [--runs 31] [--sides LIST] [--order gemm-after-first|side-first]
        [--incoming-source device|host] [--timeline 0|1] [-J FILE.json] [--plot FILE.png]

Runs the sides beside the GEMM, prints one line per side and the target rows, writes JSON and a plot."""

import argparse
import json
import math
import os
import sys
import time
from typing import List, Optional

import share

from .gpu import Gpu
from .harness import Harness
from .method import MIN_RUNS, ORDERS, beside_summary, side_ops_for, stats
from .plan import SOURCES, parse_bytes
from .profile import profile_unit, sm_summary
from .sides import DEFAULT_SIDES, SIDES, RsShare, known_side, make_side
from .timeline import unit_timeline


def validate(a) -> Optional[str]:
    """The first problem with the arguments, or None."""
    if not a.link_gbps > 0 or not math.isfinite(a.link_gbps):
        return f"--link-gbps must be a positive number (GB/s, 1e9 bytes/s), got {a.link_gbps}"
    if not 2 <= a.ranks <= 8:
        return f"--ranks must be 2..8 (the GPUs of one node), got {a.ranks}"
    if a.piece_bytes < 64 << 10 or a.piece_bytes > 1 << 30:
        return f"--piece-bytes must be 64K..1G, got {a.piece_bytes}"
    if a.runs < 1:
        return f"--runs must be >= 1 (the method asks for >= {MIN_RUNS}), got {a.runs}"
    bad = [s for s in a.sides if not known_side(s)]
    if bad:
        return f"unknown --sides {', '.join(bad)}; choose from {', '.join(SIDES)}, rs-share-drainN (N = 1..1024)"
    if a.incoming_source not in SOURCES:
        return f"--incoming-source must be one of {', '.join(SOURCES)}, got {a.incoming_source}"
    if a.order not in ORDERS:
        return f"--order must be one of {', '.join(ORDERS)}, got {a.order}"
    if a.collective not in ("all_gather", "reduce_scatter", "both"):
        return f"collective must be all_gather, reduce_scatter or both, got {a.collective}"
    return None


def parser() -> argparse.ArgumentParser:
    from nccl_tide.models import MODELS

    p = argparse.ArgumentParser(prog="python benchmarks/share", description=share.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("collective", nargs="?", default="both", help="all_gather, reduce_scatter or both (default)")
    p.add_argument("--ranks", type=int, default=8, help="W, the GPUs of the node (2..8)")
    p.add_argument("--layout", default="llama3-8b-layer", choices=sorted(MODELS))
    p.add_argument("--link-gbps", type=float, default=370.0, help="aggregate incoming link rate, GB/s (default 370)")
    p.add_argument("--piece-bytes", type=parse_bytes, default=4 << 20, help="pacing granularity (default 4M)")
    p.add_argument("--runs", type=int, default=MIN_RUNS, help=f"GEMM runs per median (default {MIN_RUNS})")
    p.add_argument("--sides", type=lambda s: [x for x in s.split(",") if x], default=list(DEFAULT_SIDES),
                   help="comma list of " + ",".join(SIDES))
    p.add_argument("--reduce-max-ctas", type=int, default=0, help="override the reduce rule's CTA cap (0: library's)")
    p.add_argument("--reduce-cta-bytes", type=parse_bytes, default=0, help="override the rule's bytes per CTA")
    p.add_argument("--rs-chunk-bytes", type=parse_bytes, default=0, help="layout RS chunk (0: the library's)")
    p.add_argument("--order", default=ORDERS[0], help="gemm-after-first (default): unit 1, the GEMM, the other units; "
                   "side-first: every unit, then the GEMM (the host can fall behind the GPU)")
    p.add_argument("--incoming-source", default=SOURCES[0],
                   help="device (default): incoming pushes copy from images in this GPU's HBM; host: from pinned "
                   "host memory (copy engines, at most the host link's rate)")
    p.add_argument("--timeline", type=int, default=1,
                   help="1 (default): print where one unit's time goes, per chunk (incoming, own, reduce, link gaps)")
    p.add_argument("--check", type=int, default=1, help="1: verify the share's outputs bit for bit")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-J", "--output_file", default=None)
    p.add_argument("--plot", default=None, help="PNG: GEMM slowdown against side-work HBM rate")
    return p


def wanted_sides(a) -> List[str]:
    keep = []
    for s in a.sides:
        kind = "ag" if s.startswith("ag") else "rs"
        if a.collective == "all_gather" and kind != "ag":
            continue
        if a.collective == "reduce_scatter" and kind != "rs":
            continue
        keep.append(s)
    return keep


def run(a) -> dict:
    import torch

    import bench_lib
    from nccl_tide import Layout
    from nccl_tide.models import model_params, numels_and_rows

    g = Gpu()
    shapes_named = model_params(a.layout)
    shapes = [tuple(s) for _, s in shapes_named]
    numels, rows = numels_and_rows(shapes_named)
    kw = {"rs_chunk_bytes": a.rs_chunk_bytes} if a.rs_chunk_bytes else {}
    lay = Layout(numels, "bf16", a.ranks, rank=0, row_numels=rows, **kw)
    res = {
        "command": "python benchmarks/share " + " ".join(sys.argv[1:]),
        "device": torch.cuda.get_device_name(g.dev), "sms": g.n_sm, "torch": torch.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "layout": a.layout, "ranks": a.ranks,
        "link_gbps": a.link_gbps, "piece_bytes": a.piece_bytes, "order": a.order,
        "incoming_source": a.incoming_source, "runs": a.runs, "runs_meet_method": a.runs >= MIN_RUNS,
        "rs_chunk_numel": lay.rs_chunk_numel, "rs_num_chunks": lay.rs_num_chunks, "rs_out_numel": lay.rs_out_numel,
        "slot_bytes": lay.slot_bytes, "method": share.__doc__.split("Measured, per side work, ")[1].split("\n\n")[0],
        "sides": [], "errors": [],
    }
    h = Harness(g, a.runs)
    res["gemm_shape"] = h.gemm_shape()
    alone = h.alone()
    res["gemm_alone_ms"] = stats(alone)
    base = res["gemm_alone_ms"]["median"]
    pacer = bench_lib.Pacer(a.link_gbps, a.piece_bytes)
    try:
        for name in wanted_sides(a):
            side = None
            try:
                side = make_side(name, g, a, lay, shapes, numels, rows, pacer)
                d = {"side": name}
                d.update(measure_side(g, h, side, base, a.check, a.timeline, a.order))
                res["sides"].append(d)
                print(side_line(d), flush=True)
            except Exception as e:  # one side failing must not cost the others
                import traceback

                tb = traceback.format_exc()
                print(f"[share] {name} FAILED:\n{tb}", flush=True)
                res["errors"].append({"side": name, "error": f"{type(e).__name__}: {e}", "traceback": tb})
            finally:
                torch.cuda.synchronize()
                if side is not None:
                    try:
                        side.close()
                    except Exception as e:
                        res["errors"].append({"side": name, "error": f"close: {e}"})
                del side
                import gc

                gc.collect()
                torch.cuda.empty_cache()
        res["pacer"] = pacer.stats()
    finally:
        torch.cuda.synchronize()
        pacer.close()
    res["gemm_alone_after_ms"] = stats(h.alone())
    res["summary"] = summarize(res)
    return res


def measure_side(g: Gpu, h: Harness, side, base: float, check: bool, timeline: bool, order: str) -> dict:
    """One side's figures: its output check, its unit alone (time, HBM rate, against the link floor), its SM time,
    its timeline (with `timeline`), and the GEMM beside it (base: the GEMM's median alone, ms)."""
    d = {"name": side.name, "tide": side.tide}
    if check:
        d["check"] = side.check()
    unit, host_ms = h.unit_time(side)
    d["unit_ms"], d["host_enqueue_ms"] = unit, host_ms
    um = unit["median"]
    d["hbm_bytes_per_unit"] = side.bytes
    d["hbm_GBps"] = side.bytes / (um * 1e6) if um > 0 else None
    if side.floor_s:
        d["link_floor_ms"] = side.floor_s * 1e3
        d["e2e_over_floor"] = um / (side.floor_s * 1e3)
    kernels, mem = profile_unit(g, side.unit, iters=3)
    d["sm"] = sm_summary(g, kernels, mem, 3)
    if isinstance(side, RsShare):
        d["reduce_shape"] = side.shapes[0]
        d["reduce_shapes"] = side.shapes
    if timeline:
        try:  # a diagnostic: its failure must not cost the side its measurement
            tl = unit_timeline(g, side, host_ms)
        except Exception as e:
            tl = {"error": f"{type(e).__name__}: {e}"}
        if tl is not None:
            d["timeline"] = tl
            print("\n".join(tl.get("lines") or [f"[timeline] {side.name}: {tl.get('error')}"]), flush=True)
    k = side_ops_for(um, base)
    d.update({"k_units": k, "order": order})
    d.update(beside_summary(h.beside(side, k, host_ms, order), base))
    return d


def side_line(d) -> str:
    sm = d.get("sm", {})
    fl = f" e2e/floor {d['e2e_over_floor']:.3f}" if d.get("e2e_over_floor") else ""
    return (f"[share] {d['name']}: GEMM x{d['slowdown']:.3f} (IQR {d['slowdown_p25']:.3f}-{d['slowdown_p75']:.3f}, "
            f"valid {d.get('valid_runs', d['covered_runs'])}/{d['margin_ms'].get('n', 0)}, "
            f"covered {d['covered_runs']}, "
            f"GEMM enqueued late {d.get('gemm_late_runs', 0)}), unit {d['unit_ms']['median']:.3f} ms{fl}, "
            f"HBM {d['hbm_GBps'] or 0:.0f} GB/s, SM-weighted {sm.get('sm_weighted_us', 0):.1f} us "
            f"(kernels {sm.get('kernel_us', 0):.1f} us, max {sm.get('max_ctas', 0)} CTAs; same-device copies on SMs "
            f"{sm.get('local_copy_us', 0):.1f} us), check {d.get('check')}")


def summarize(res) -> List[dict]:
    """Target rows: slowdowns, SM-time ratio against the 32-CTA baseline, RS e2e over the floor."""
    by = {d["side"]: d for d in res["sides"]}
    rows = []

    def add(metric, value, target, ok):
        rows.append({"metric": metric, "value": value, "target": target, "met": ok})

    if "ag-share" in by:
        v = by["ag-share"]["slowdown"]
        add("GEMM slowdown beside TIDE-AG share", v, "<= 1.03x", v <= 1.03)
    if "rs-share" in by:
        v = by["rs-share"]["slowdown"]
        add("GEMM slowdown beside TIDE-RS share", v, "<= 1.05x", v <= 1.05)
        e = by["rs-share"].get("e2e_over_floor")
        if e:
            add("RS share end to end / link floor", e, "<= 1.10x", e <= 1.10)
        if "nccl-like-32" in by:
            base32 = by["nccl-like-32"]["sm"]["sm_weighted_us"]
            mine = by["rs-share"]["sm"]["sm_weighted_us"]
            ratio = base32 / mine if mine else None
            add("RS SM time (occupancy-weighted): 32-CTA baseline / TIDE share", ratio, ">= 15x",
                ratio is not None and ratio >= 15)
    for s in ("nccl-like-16", "nccl-like-32", "ag-loopback", "rs-loopback", "ag-share-unpaced", "rs-share-unpaced"):
        if s in by:
            add(f"GEMM slowdown beside {by[s]['name']}", by[s]["slowdown"], "info", None)
    return rows


def plot(res: dict, path: str) -> None:
    """GEMM slowdown (median, IQR bars) against the side work's HBM traffic rate, one point per side, with the
    1.03x / 1.05x targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d in res.get("sides", []):
        if d.get("hbm_GBps") is None:
            continue
        x, y = d["hbm_GBps"], d["slowdown"]
        ax.errorbar([x], [y], yerr=[[y - d["slowdown_p25"]], [d["slowdown_p75"] - y]], fmt="o", capsize=3,
                    label=d["name"])
    ax.axhline(1.05, ls="--", c="gray", lw=0.8)
    ax.axhline(1.03, ls=":", c="gray", lw=0.8)
    ax.set_xlabel("side work HBM traffic (GB/s, modelled bytes / unit time alone)")
    ax.set_ylabel("single-wave GEMM slowdown (median, IQR)")
    ax.set_title(f"one rank's share, W={res.get('ranks')}, {res.get('layout')}, link {res.get('link_gbps')} GB/s")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    a = parser().parse_args(argv)
    msg = validate(a)
    if msg:
        print(f"share: {msg}", file=sys.stderr)
        return 2
    if a.runs < MIN_RUNS:
        print(f"# note: --runs {a.runs} is below the method's {MIN_RUNS}", flush=True)
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")
    import torch

    if not torch.cuda.is_available():
        print("share: needs a CUDA GPU (it runs one rank's share on this GPU)", file=sys.stderr)
        return 2
    res = run(a)
    print(f"# one rank's share: W={a.ranks} {a.layout}, link {a.link_gbps:g} GB/s, GEMM alone "
          f"{res['gemm_alone_ms']['median']:.4f} ms, GEMM {res['gemm_shape'].get('ctas')} CTAs on {res['sms']} SMs")
    for r in res["summary"]:
        v = r["value"]
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(f"#  {r['metric']:<66} {v if v is None else f'{v:.3f}':>8}  target {r['target']:<9} met {met}")
    if a.output_file:
        with open(a.output_file, "w") as f:
            json.dump(res, f, indent=1, default=str)
    if a.plot:
        try:
            plot(res, a.plot)
        except Exception as e:
            print(f"# plot failed: {type(e).__name__}: {e}")
    bad = [d for d in res["sides"] if d.get("check") and not d["check"].get("ok", True)]
    if bad:
        print(f"share: wrong results in {', '.join(d['side'] for d in bad)}", file=sys.stderr)
        return 1
    return 1 if res["errors"] else 0

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Micro-benchmark: one SM's achievable bandwidth, and the library's reduce per CTA.

Measured on this GPU, each with CUDA events over several launches of buffers far larger than L2:
* raw reads by one CTA (LDG.128; threads x independent 16-byte loads in flight per thread), the best shape's
  scaling over CTAs; a read+write copy; TMA bulk reads (cp.async.bulk into shared memory, stages x bytes);
* the library's own reduce kernel (tideBenchReduce: 8 bf16 inputs -> fp32, one 32 MiB-output chunk) on G CTAs in
  one launch, G = 1 .. SMs, and with the library's shape rule; the fold checked bit for bit against torch;
* bench-only variants of the reduce (sm_bandwidth.cu, namespace rv; the library's kernel is not changed), the same
  fold for op SUM (bf16 -> fp32, left fold in rank order, canonical NaN), differing only in how loads are kept in
  flight against the adds; each on the same buffers, G CTAs of one launch, G = 1, 4, 8, 16, 32, SMs (--quick: 1, 4,
  8, SMs), timed with the same events and traffic formula as the library's kernel, its fp32 output compared bit for
  bit (as int32) with the library kernel's. One table row each, with a bit-exact column; "sm_bandwidth.json" has
  them under "reduce_variants" (with registers and local bytes from cudaFuncGetAttributes):
    baseline512   the library's schedule for SUM only (512 threads, 16 words issued, then the folds): what dropping
                  the runtime op's premul / avg tests is worth, apart from the schedule;
    pipelined512  512 threads, two register sets of 8 sources x 1 vector: the next vector's 8 loads are issued before
                  the current vector is folded (8 to 16 loads in flight per thread, never 0);
    rolling512    512 threads, 2 vectors x 8 sources of slots, each slot refilled (the same source 2 x 512 vectors
                  on) as soon as the fold has consumed it: 15 to 16 loads in flight per thread at all times;
    threads1024   1024 threads, the library's schedule with U = 1 (8 words issued, then the fold): the same bytes in
                  flight per CTA, twice the warps;
    rolling1024   1024 threads, 8 slots refilled word by word as in rolling512: 7 to 8 loads in flight per thread
                  (double buffering by whole vectors, pipelined<1024>, spills at 64 registers and is not built);
    *_noalloc     the same four schedules with ld.global.nc.L1::no_allocate.L2::256B loads (inputs are read once:
                  no L1 allocation; 256-byte L2 fetches).
* references: torch copy_ (device-to-device, read + written) and torch.sum over the 8 inputs (the whole GPU).
From these: bytes/s per CTA, and the CTAs a reduce needs to keep up with a link of --link-gbps (reduce traffic per
incoming byte = (2W + 4) / (2 (W - 1)) for W bf16 inputs and an fp32 output): the grid-size rule's input. Exit
status 1 if the library's kernel or any variant is not bit-exact.

    python benchmarks/sm_bandwidth.py [--out DIR] [--link-gbps 370] [--quick]
"""

import argparse
import ctypes
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
try:
    import nccl_tide  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "pytorch_glue"))

import torch  # noqa: E402


def build_probe():
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    so = os.path.join(tempfile.mkdtemp(prefix="tide_smbw_"), "smbw.so")
    subprocess.check_call([nvcc, "-shared", "-Xcompiler", "-fPIC", "-arch=sm_90", "-O3", "-o", so,
                           str(REPO / "benchmarks" / "sm_bandwidth.cu")])
    lib = ctypes.CDLL(so)
    P, S, I, F = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_float)
    lib.smbw_read.argtypes = [P, S, I, I, I, I, P, F]
    lib.smbw_copy.argtypes = [P, P, S, I, I, I, I, F]
    lib.smbw_bulk.argtypes = [P, S, I, I, ctypes.c_uint, I, P, P, F]
    for f in (lib.smbw_read, lib.smbw_copy, lib.smbw_bulk):
        f.restype = I
    lib.smbw_reduce_count.argtypes = []
    lib.smbw_reduce_name.argtypes = [I]
    lib.smbw_reduce_name.restype = ctypes.c_char_p
    lib.smbw_reduce_threads.argtypes = [I]
    lib.smbw_reduce_attrs.argtypes = [I, ctypes.POINTER(I), ctypes.POINTER(I)]
    lib.smbw_reduce.argtypes = [I, P, S, I, ctypes.c_uint64, P, I, P]
    for f in (lib.smbw_reduce_count, lib.smbw_reduce_threads, lib.smbw_reduce_attrs, lib.smbw_reduce):
        f.restype = I
    return lib


REDUCE_VARIANT_MAX_SRC = 8  # rv::kMaxSrc in sm_bandwidth.cu


def _launch_variant(lib, vid, name, inp, W, n, vout, G, stream):
    rc = lib.smbw_reduce(vid, inp.data_ptr(), n * 2, W, n, vout.data_ptr(), G, stream)
    if rc != 0:
        raise RuntimeError(f"smbw_reduce({name}, ctas {G}): cudaError {rc}")


def reduce_variants(lib, G_list, sms, W, n, inp, stream, traffic, expect, expect_name, res):
    """Each variant of sm_bandwidth.cu on G CTAs (one launch) for G in G_list: the library kernel's buffers, events
    and traffic formula; its fp32 output compared bit for bit (int32 views) with `expect`."""
    rows = []
    if not 1 <= W <= REDUCE_VARIANT_MAX_SRC:
        res["errors"].append({"what": "reduce variants", "error": f"{W} inputs: the variants take 1..8"})
        print(f"[smbw] reduce variants SKIPPED: {W} inputs (they take 1..{REDUCE_VARIANT_MAX_SRC})", flush=True)
        return rows
    vout = torch.empty(n, dtype=torch.float32, device=inp.device)
    want = expect.view(torch.int32)
    for vid in range(lib.smbw_reduce_count()):
        name = lib.smbw_reduce_name(vid).decode()
        regs, local = ctypes.c_int(-1), ctypes.c_int(-1)
        rc = lib.smbw_reduce_attrs(vid, ctypes.byref(regs), ctypes.byref(local))
        row = {"variant": name, "threads": lib.smbw_reduce_threads(vid), "regs": regs.value if rc == 0 else None,
               "local_bytes": local.value if rc == 0 else None, "reference": expect_name, "runs": []}
        for G in G_list:
            try:
                vout.fill_(float("nan"))
                ms = events_ms(functools.partial(_launch_variant, lib, vid, name, inp, W, n, vout, G, stream))
                exact = bool(torch.equal(vout.view(torch.int32), want))
                d = {"ctas": G, "ms": ms, "GBps": traffic / ms / 1e6, "GBps_per_cta": traffic / ms / 1e6 / G,
                     "bit_exact": exact, "sm_weighted_us": ms * 1e3 * min(1.0, G / sms)}
            except Exception as e:
                res["errors"].append({"what": f"reduce variant {name} G={G}", "error": f"{type(e).__name__}: {e}"})
                print(f"[smbw] reduce variant {name} G={G} FAILED: {e}", flush=True)
                d = {"ctas": G, "error": f"{type(e).__name__}: {e}", "bit_exact": False}
            row["runs"].append(d)
        row["bit_exact"] = bool(row["runs"]) and all(d["bit_exact"] for d in row["runs"])
        rows.append(row)
    return rows


def print_reduce_table(G_list, W, library_runs, rows):
    """One row per kernel: GB/s per CTA at each G, and whether every output was bit-exact."""
    def cell(d):
        return f"{d['GBps_per_cta']:7.1f}" if d and "GBps_per_cta" in d else f"{'-':>7s}"
    head = "".join(f"{G:>7d}" for G in G_list)
    print(f"[smbw] reduce GB/s per CTA ({W} bf16 -> fp32, one 32 MiB-output chunk, G CTAs in one launch)", flush=True)
    print(f"[smbw] {'kernel':22s} {'thr':>4s} {'regs':>4s} {'lmem':>4s} |{head} | bit-exact", flush=True)
    lib_by_g = {d["max_ctas"]: d for d in library_runs}
    lib_ok = all(lib_by_g[G]["bit_exact"] for G in G_list if G in lib_by_g) and any(G in lib_by_g for G in G_list)
    lib_threads = next((lib_by_g[G]["shape"]["threads"] for G in G_list if G in lib_by_g), 0)
    print(f"[smbw] {'library reduceVecKernel':22s} {lib_threads:>4d} {'-':>4s} {'-':>4s} |"
          f"{''.join(cell(lib_by_g.get(G)) for G in G_list)} | {'yes' if lib_ok else 'NO'} (vs torch)", flush=True)
    for r in rows:
        by_g = {d["ctas"]: d for d in r["runs"]}
        regs = "-" if r["regs"] is None else str(r["regs"])
        lmem = "-" if r["local_bytes"] is None else str(r["local_bytes"])
        print(f"[smbw] {r['variant']:22s} {r['threads']:>4d} {regs:>4s} {lmem:>4s} |"
              f"{''.join(cell(by_g.get(G)) for G in G_list)} | {'yes' if r['bit_exact'] else 'NO'} "
              f"(vs {r['reference']})", flush=True)


def _call(fn, *args):
    ms = ctypes.c_float(0)
    rc = fn(*args, ctypes.byref(ms))
    if rc != 0:
        raise RuntimeError(f"{fn.__name__}: cudaError {rc}")
    return ms.value


def events_ms(fn, iters=5):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--link-gbps", type=float, default=370.0)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    a = ap.parse_args(argv)
    import bench_lib as B

    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = {"device": torch.cuda.get_device_name(dev), "sms": sms, "date_utc": time.strftime("%Y-%m-%d %H:%M:%S"),
           "read": [], "copy": [], "bulk": [], "reduce": [], "errors": []}
    GiB = 1 << 30
    src = torch.randint(-2**31, 2**31 - 1, (GiB // 4,), dtype=torch.int32, device=dev)
    sink = torch.zeros(4096, dtype=torch.int64, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)

    def one(kind, ctas, **kw):
        nbytes = min(GiB, (256 << 20) * ctas)  # >= 256 MiB per CTA up to the whole 1 GiB: far beyond L2
        try:
            if kind == "read":
                ms = _call(lib.smbw_read, src.data_ptr(), nbytes, ctas, kw["threads"], kw["depth"], 3, sink.data_ptr())
                step = kw["threads"] * kw["depth"]
                moved = nbytes // 16 // ctas // step * step * 16 * ctas
            elif kind == "copy":
                half = nbytes // 2
                ms = _call(lib.smbw_copy, dst.data_ptr(), src.data_ptr(), half, ctas, kw["threads"], kw["depth"], 3)
                step = kw["threads"] * kw["depth"]
                moved = 2 * (half // 16 // ctas // step * step * 16 * ctas)
            else:
                err.zero_()
                ms = _call(lib.smbw_bulk, src.data_ptr(), nbytes, ctas, kw["stages"], kw["stage_bytes"], 3,
                           sink.data_ptr(), err.data_ptr())
                if int(err.item()):
                    raise RuntimeError("a bulk stage did not complete within 1 s")
                moved = nbytes // ctas // kw["stage_bytes"] * kw["stage_bytes"] * ctas
            d = dict(kw, ctas=ctas, ms=ms, GBps=moved / ms / 1e6, GBps_per_cta=moved / ms / 1e6 / ctas)
            res[kind].append(d)
            print(f"[smbw] {kind:5s} ctas {ctas:4d} {kw}: {d['GBps']:8.1f} GB/s ({d['GBps_per_cta']:.1f} per CTA)",
                  flush=True)
            return d
        except Exception as e:
            res["errors"].append({"what": f"{kind} {ctas} {kw}", "error": f"{type(e).__name__}: {e}"})
            print(f"[smbw] {kind} {ctas} {kw} FAILED: {e}", flush=True)
            return None

    try:
        lib = build_probe()
    except Exception as e:
        lib = None
        res["errors"].append({"what": "build sm_bandwidth.cu", "error": f"{type(e).__name__}: {e}"})
        print(f"[smbw] probe build FAILED: {e}", flush=True)
    dst = torch.empty(GiB // 8, dtype=torch.int32, device=dev)  # copy: 512 MiB each way at most
    scale = [1, 2, 4, 8, 16, 33, 66, sms] if not a.quick else [1, 4, 16, sms]
    if lib is not None:
        shapes = [(t, d) for t in (256, 512, 1024) for d in (1, 4, 8, 16)]
        if a.quick:
            shapes = [(512, 4), (512, 16), (1024, 8)]
        best = None
        for t, d in shapes:
            r = one("read", 1, threads=t, depth=d)
            if r and (best is None or r["GBps"] > best["GBps"]):
                best = r
        if best:
            res["read_best_single_cta"] = best
            for c in scale[1:]:
                one("read", c, threads=best["threads"], depth=best["depth"])
        for c in (1, 4, sms):
            one("copy", c, threads=512, depth=8)
        bulk_shapes = [(2, 32 << 10), (4, 32 << 10), (4, 48 << 10), (6, 32 << 10)] if not a.quick else [(4, 32 << 10)]
        bb = None
        for st, sb in bulk_shapes:
            r = one("bulk", 1, stages=st, stage_bytes=sb)
            if r and (bb is None or r["GBps"] > bb["GBps"]):
                bb = r
        if bb:
            res["bulk_best_single_cta"] = bb
            for c in (4, 16, sms):
                one("bulk", c, stages=bb["stages"], stage_bytes=bb["stage_bytes"])
    del dst

    # The library's reduce kernel on G CTAs (one launch), and with its own rule.
    W = a.ranks
    n = 8 << 20  # one 32 MiB-output chunk (the default rsChunkBytes)
    g = torch.Generator(device=dev).manual_seed(5)
    inp = torch.randn(W * n, dtype=torch.bfloat16, device=dev, generator=g)
    out = torch.empty(n, dtype=torch.float32, device=dev)
    ref = inp[:n].float()
    for s in range(1, W):
        ref = ref + inp[s * n:(s + 1) * n].float()
    stream = torch.cuda.current_stream().cuda_stream
    traffic = n * (2 * W + 4)
    lib_out = None
    # G CTAs in one launch: bytes per CTA just above traffic / G; then the library's rule (G = 0) with its own bytes
    # per CTA (kReduceCtaBytes) and with 2, 4, 8 and 16 MiB per CTA (the launch split's cost).
    runs = [(G, traffic // G + 8 * (2 * W + 4)) for G in ([1, 2, 3, 4, 6, 8, 16, 32, sms] if not a.quick
                                                          else [1, 4, 8, sms])]
    runs += [(0, 0)] + [(0, mib << 20) for mib in (2, 4, 8, 16)]
    for G, cta_bytes in runs:
        args = B.reduce_args(inp.data_ptr(), n * 2, W, n, out.data_ptr(), max_ctas=G, cta_bytes=cta_bytes)
        try:
            shape = B.reduce_shape(args)
            out.fill_(float("nan"))
            ms = events_ms(lambda: B.reduce(args, stream))
            exact = bool(torch.equal(out, ref))
            if lib_out is None:
                lib_out = out.clone()  # the variants' reference: the library kernel's own output
            ctas = shape["ctas"]
            d = {"max_ctas": G, "rule": G == 0, "cta_bytes": cta_bytes, "shape": shape, "ms": ms,
                 "GBps": traffic / ms / 1e6,
                 "GBps_per_cta": traffic / ms / 1e6 / ctas, "bit_exact": exact,
                 "sm_weighted_us": ms * 1e3 * min(1.0, ctas / sms)}
            res["reduce"].append(d)
            label = f"G={G}" if G else ("rule" if not cta_bytes else f"rule@{cta_bytes >> 20}M")
            print(f"[smbw] reduce {label:>8} ({ctas} CTAs x {shape['launches']} launches): "
                  f"{d['GBps']:8.1f} GB/s, {d['GBps_per_cta']:.1f} per CTA, {ms * 1e3:.1f} us, exact {exact}",
                  flush=True)
        except Exception as e:
            res["errors"].append({"what": f"reduce G={G}", "error": f"{type(e).__name__}: {e}"})
            print(f"[smbw] reduce G={G} FAILED: {e}", flush=True)
    # The bench-only variants, side by side with the library's kernel at the same CTA counts.
    vgrid = [1, 4, 8, 16, 32, sms] if not a.quick else [1, 4, 8, sms]
    res["reduce_variants"] = []
    if lib is None:
        res["errors"].append({"what": "reduce variants", "error": "no probe library (see its build error)"})
    else:
        expect, expect_name = (lib_out, "library") if lib_out is not None else (ref, "torch")
        if lib_out is None:
            print("[smbw] the library's reduce did not run: variants compared with torch's fold instead", flush=True)
        res["reduce_variants"] = reduce_variants(lib, vgrid, sms, W, n, inp, stream, traffic, expect, expect_name,
                                                 res)
        print_reduce_table(vgrid, W, res["reduce"], res["reduce_variants"])
        lib1 = next((d for d in res["reduce"] if d["max_ctas"] == 1), None)
        fast = [(r, d) for r in res["reduce_variants"] if r["bit_exact"] for d in r["runs"]
                if d["ctas"] == 1 and "GBps_per_cta" in d]
        if fast:
            r, d = max(fast, key=lambda rd: rd[1]["GBps_per_cta"])
            res["reduce_variant_best_1cta"] = {
                "variant": r["variant"], "GBps_per_cta": d["GBps_per_cta"],
                "library_GBps_per_cta": lib1["GBps_per_cta"] if lib1 else None,
                "speedup": d["GBps_per_cta"] / lib1["GBps_per_cta"] if lib1 else None}
            print(f"[smbw] fastest bit-exact variant at 1 CTA: {r['variant']} {d['GBps_per_cta']:.1f} GB/s"
                  + (f" ({d['GBps_per_cta'] / lib1['GBps_per_cta']:.2f}x the library's {lib1['GBps_per_cta']:.1f})"
                     if lib1 else ""), flush=True)
    # References on the whole GPU.
    big = torch.empty(GiB // 4, dtype=torch.float32, device=dev)
    cms = events_ms(lambda: big.copy_(src.view(torch.float32)))
    res["torch_copy_GBps"] = 2 * GiB / cms / 1e6
    x = inp.view(W, n)
    sms_ms = events_ms(lambda: torch.sum(x, dim=0, dtype=torch.float32, out=out))
    res["torch_sum_GBps"] = traffic / sms_ms / 1e6
    print(f"[smbw] torch copy_ {res['torch_copy_GBps']:.0f} GB/s (r+w); torch.sum 8 bf16 -> fp32 "
          f"{res['torch_sum_GBps']:.0f} GB/s", flush=True)
    # What the rule needs: reduce traffic per incoming byte, times the link rate.
    need = a.link_gbps * (2 * W + 4) / (2 * (W - 1))
    one_cta = next((d for d in res["reduce"] if d["max_ctas"] == 1), None)
    if one_cta:
        res["rule"] = {"link_gbps": a.link_gbps, "reduce_GBps_needed": need,
                       "reduce_GBps_per_cta": one_cta["GBps_per_cta"],
                       "ctas_to_keep_up": math.ceil(need / one_cta["GBps_per_cta"])}
        print(f"[smbw] to keep up with {a.link_gbps:g} GB/s incoming: {need:.0f} GB/s of reduce traffic = "
              f"{res['rule']['ctas_to_keep_up']} CTAs at {one_cta['GBps_per_cta']:.1f} GB/s each", flush=True)
    bad = [d for d in res["reduce"] if not d["bit_exact"]]
    bad_variants = [r["variant"] for r in res["reduce_variants"] if not r["bit_exact"]]
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "sm_bandwidth.json"), "w") as f:
            json.dump(res, f, indent=1)
    if bad:
        print(f"[smbw] reduce NOT bit-exact for {[d['max_ctas'] for d in bad]}")
    if bad_variants:
        print(f"[smbw] reduce variants NOT bit-exact (or failed): {bad_variants}")
    return 1 if bad or bad_variants else 0


if __name__ == "__main__":
    sys.exit(main())

# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
"""Runs the one-GPU benchmarks (AG placement, RS, interference) and writes DIR/results.json and DIR/results.md.

    python benchmarks/run_all.py --out DIR            # on the GPU (ci/gpu.sh)
    python benchmarks/run_all.py --out DIR --dry-run  # CPU, tiny sizes: checks the code paths

Each benchmark runs inside its own try/except (a failure prints its traceback and the others
still run); results.json is rewritten after each one, so a crash leaves what was measured.
The compact summary table comes last on stdout; results.md is a Markdown snippet of the same table.
"""

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import Ctx, env_info, jsonable, row, selftest, table  # noqa: E402

BENCHES = ("ag_placement", "rs", "interference")


def _write(out, results):
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(jsonable(results), f, indent=1)


def markdown(results, summary, errors):
    e = results["env"]
    lines = [
        f"### One-GPU benchmarks, {e['date_utc']} UTC, commit {e.get('git_commit')}",
        "",
        f"Command: `{e['command']}`"
        + (" (dry run: CPU, tiny sizes; numbers are meaningless)" if results["dry_run"] else ""),
        "",
        f"Device: {e['device']}; torch {e['torch']}, CUDA {e['cuda_runtime']}, NCCL (torch) {e.get('nccl_torch')}, "
        f"nccl-tide {e.get('nccl_tide')} (library {e.get('nccl_tide_library')}), Python {e['python']}.",
        "",
        table(summary),
        "",
        "TIDE and baseline columns are measured in the same run; ratio = baseline/TIDE for speedups and SM "
        "time, TIDE/baseline for RS time, bytes and kernel bandwidth, with/alone for the GEMM slowdown.",
        "",
        "Method:",
        "",
    ]
    for name in BENCHES:
        r = results["benchmarks"].get(name, {})
        if r.get("method"):
            lines.append(f"* {name}: {r['method']}")
    sides = results["benchmarks"].get("interference", {}).get("sides", [])
    if sides:
        lines += ["", "| GEMM beside | median ms | IQR ms | min-max ms | slowdown | side op ms | K | covered |",
                  "|---|---|---|---|---|---|---|---|"]
        for d in sides:
            w = d["with_ms"]
            lines.append(f"| {d['side']} | {w['median']:.4f} | {w['p25']:.4f}-{w['p75']:.4f} | "
                         f"{w['min']:.4f}-{w['max']:.4f} | {d['slowdown']:.3f}x | {d['side_op_ms']['median']:.3f} | "
                         f"{d['k_side_ops']} | {d['covered_runs']}/{d['runs']} |")
    notes = sorted({n for r in results["benchmarks"].values() for n in r.get("notes", [])})
    if notes:
        lines += ["", "Notes:", ""] + [f"* {n}" for n in notes]
    if errors:
        lines += ["", "Failures:", ""] + [f"* {x['what']}: {x['error']}" for x in errors]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for results.json and results.md")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, CUDA-only parts replaced")
    ap.add_argument("--only", default="", help=f"comma list out of {','.join(BENCHES)}")
    ap.add_argument("--watchdog-s", type=float, default=480.0,
                    help="dump every thread's stack and exit after this many seconds (a hung collective)")
    a = ap.parse_args(argv)
    if a.watchdog_s > 0:
        faulthandler.dump_traceback_later(a.watchdog_s, exit=True)
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()
    ctx = Ctx(a.dry_run)
    if a.dry_run:
        selftest()
        print("# selftest (trace parsing, stats, reference layout): ok", flush=True)
    env = env_info(ctx)
    print("# env " + json.dumps(env), flush=True)
    results = {"env": env, "dry_run": a.dry_run, "benchmarks": {}}
    summary, errors = [], []
    only = [x for x in a.only.split(",") if x] or list(BENCHES)
    for name in BENCHES:
        if name not in only:
            continue
        t0 = time.time()
        print(f"# ---- {name} ----", flush=True)
        try:
            mod = __import__(name)
            r = mod.run(ctx)
        except Exception as e:
            tb = traceback.format_exc()
            print(f"[{name}] FAILED:\n{tb}", flush=True)
            r = {"error": f"{type(e).__name__}: {e}", "traceback": tb, "summary": []}
            errors.append({"what": name, "error": r["error"]})
        r["wall_s"] = time.time() - t0
        for x in r.get("errors", []):
            errors.append({"what": f"{name}: {x['what']}", "error": x["error"]})
        summary += r.get("summary", [])
        results["benchmarks"][name] = r
        print(f"# {name}: {r['wall_s']:.1f} s", flush=True)
        try:
            ctx.free()
        except Exception:
            pass
        _write(a.out, results)
    if errors:
        summary.append(row("!", f"failures: {len(errors)} (see above / results.json)", None, None, None, "0", False))
    results["summary"] = summary
    results["errors"] = errors
    results["wall_s"] = time.time() - t_start
    _write(a.out, results)
    faulthandler.cancel_dump_traceback_later()
    md = markdown(results, summary, errors)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    print(f"\n# ==== summary ({results['wall_s']:.0f} s; {env['device']}; torch {env['torch']}, CUDA "
          f"{env['cuda_runtime']}; full JSON {os.path.join(a.out, 'results.json')}) ====")
    for x in errors:
        print(f"# FAILED {x['what']}: {x['error']}")
    print(table(summary), flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

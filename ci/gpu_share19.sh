#!/usr/bin/env bash
# Session 19 (issue 16), one device call, < 4 min on one H200: one rank's share of an 8-GPU node beside the
# single-wave GEMM, Llama-8B and Llama-70B layers, W = 8, paced at 370 GB/s, old and new harness side by side:
#   old      --order side-first       --incoming-source device  (sessions 15-18: the GEMM after all K side units)
#   new      --order gemm-after-first --incoming-source device  (the GEMM after the first unit; the default)
#   new-host --order gemm-after-first --incoming-source host    (incoming pieces host-to-device: copy engines)
#   new-1m   the 70B AG share with 1 MiB pieces (hung in session 17: the pacer now learns of pieces as enqueued)
# Prints per side: GEMM slowdown (median over valid runs), valid / late-enqueued runs, SM-weighted time, end to end
# over the link floor, the reduce's CTAs. Writes $OUT/share19.tgz (every JSON, plot and log), $OUT/share19_summary.json
# and $OUT/share19_summary.txt. Builds build/gpu/libnccl-tide.so only if it is absent. Usage: bash ci/gpu_share19.sh
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on shared machines (DESIGN.md section 6); every child inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
O="${OUT:-$PWD/gpu-out}"; mkdir -p "$O"
W="$(mktemp -d)/share19"; mkdir -p "$W"
START=$(date +%s); DEADLINE=$((START + ${TIDE_GPU_DEADLINE_S:-230}))
left() { echo $((DEADLINE - $(date +%s))); }
run() {  # run NAME LIMIT CMD...: under min(LIMIT, time left), log in $W/NAME.log
  local name=$1 lim=$2 l rc; shift 2; l=$(left)
  if [ "$l" -lt 15 ]; then echo "=== $name SKIPPED ($l s left)"; return; fi
  [ "$l" -lt "$lim" ] && lim=$l
  local t0=$(date +%s); timeout -k 5 "$lim" "$@" > "$W/$name.log" 2>&1; rc=$?
  echo "=== $name rc $rc $(( $(date +%s) - t0 )) s"
  [ "$rc" -eq 0 ] || grep -vE "^TIDE/|NCCL TIDE" "$W/$name.log" | tail -8
}
LIB="$PWD/build/gpu/libnccl-tide.so"
if [ ! -f "$LIB" ]; then
  ( cmake -S . -B build/gpu -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release \
      > "$W/build.log" 2>&1 && cmake --build build/gpu -j "$(nproc)" >> "$W/build.log" 2>&1 ) \
    || { tail -30 "$W/build.log"; exit 1; }
  echo "=== built $(( $(date +%s) - START )) s"
fi
export NCCL_TIDE_LIBRARY_PATH="$LIB" PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; git rev-parse HEAD; git status --short; } \
  > "$W/env.txt" 2>&1
S="python3 benchmarks/share.py --out $W --layouts llama3-8b-layer,llama3-70b-layer --ranks 8 --link-gbps 370 --runs 31"
# SHARE19_RUNS picks the runs (default: old new new-host new-1m); rs-2m / rs-4m / rs-8m: the new harness's RS share
# with 2 / 4 / 8 MiB per reduce CTA (kReduceCtaBytes is 8 MiB since session 24, 2 MiB before: "new" uses the
# library's), the launch split's cost against the GEMM's slowdown.
want() { case " ${SHARE19_RUNS:-old new new-host new-1m} " in *" $1 "*) return 0;; esac; return 1; }
want old && run old 60 $S --tag old --order side-first --incoming-source device --sides ag-share,rs-share
want new && run new 75 $S --tag new --order gemm-after-first --incoming-source device \
  --sides ag-share,rs-share,ag-share-unpaced,rs-share-unpaced,nccl-like-32
want rs-2m && run rs-2m 50 $S --tag rs-2m --order gemm-after-first --incoming-source device --sides rs-share \
  --reduce-cta-bytes 2M
want rs-8m && run rs-8m 50 $S --tag rs-8m --order gemm-after-first --incoming-source device --sides rs-share \
  --reduce-cta-bytes 8M
want rs-4m && run rs-4m 50 $S --tag rs-4m --order gemm-after-first --incoming-source device --sides rs-share \
  --reduce-cta-bytes 4M
want new-host && run new-host 60 $S --tag new-host --order gemm-after-first --incoming-source host \
  --sides ag-share,rs-share
want new-1m && run new-1m 40 python3 benchmarks/share.py --out "$W" --layouts llama3-70b-layer --ranks 8 \
  --link-gbps 370 --runs 31 --tag new-1m --order gemm-after-first --sides ag-share --piece-bytes 1M
python3 - "$W" "$O" <<'PY'
import glob, json, os, sys
w, o = sys.argv[1:3]
rows, lines = [], []
hdr = (f"{'layer':<17} {'run':<9} {'side':<34} {'GEMM x':>7} {'valid':>6} {'late':>5} {'SM us':>7} "
       f"{'e2e/floor':>9} {'unit ms':>8} {'CTAs':>5}")
lines.append(hdr)
for f in sorted(glob.glob(os.path.join(w, "share_*.json"))):
    res = json.load(open(f))
    tag = os.path.basename(f)[len("share_" + res["layout"]) + 1:-len(".json")]
    for d in res["sides"]:
        sm = d.get("sm", {})
        r = {"layout": res["layout"], "run": tag, "side": d["name"], "slowdown": d["slowdown"],
             "slowdown_all": d.get("slowdown_all"), "valid_runs": d.get("valid_runs"), "runs": d["margin_ms"]["n"],
             "gemm_late_runs": d.get("gemm_late_runs"), "sm_weighted_us": sm.get("sm_weighted_us"),
             "e2e_over_floor": d.get("e2e_over_floor"), "unit_ms": d["unit_ms"]["median"],
             "reduce_ctas": (d.get("reduce_shape") or {}).get("ctas"), "gemm_alone_ms": res["gemm_alone_ms"]["median"],
             "check_ok": (d.get("check") or {}).get("ok")}
        rows.append(r)
        e2e = f"{r['e2e_over_floor']:.3f}" if r["e2e_over_floor"] else "-"
        lines.append(f"{r['layout']:<17} {tag:<9} {r['side'][:34]:<34} {r['slowdown']:>7.3f} "
                     f"{r['valid_runs']!s:>3}/{r['runs']:<2} {r['gemm_late_runs']!s:>5} {r['sm_weighted_us'] or 0:>7.1f} "
                     f"{e2e:>9} {r['unit_ms']:>8.3f} {r['reduce_ctas'] or '-':>5}")
    for e in res.get("errors", []):
        lines.append(f"{res['layout']:<17} {tag:<9} ERROR {e['side']}: {e['error']}")
text = "\n".join(lines)
print(text)
open(os.path.join(o, "share19_summary.txt"), "w").write(text + "\n")
json.dump(rows, open(os.path.join(o, "share19_summary.json"), "w"), indent=1)
PY
tar -czf "$O/share19.tgz" -C "$(dirname "$W")" share19
echo "=== done $(( $(date +%s) - START )) s; $O/share19.tgz"

#!/usr/bin/env bash
# Issue 16 on one H200, in one call of about 5-6 minutes: build the CUDA library, test the new reduce kernel and the
# bench entry points (bit-exact against the host executor), then the measurements: one SM's bandwidth and the
# library's reduce per CTA (benchmarks/sm_bandwidth.py), one rank's share of a W=8 node beside a single-wave GEMM
# for the Llama-3.1-8B layer (AG and RS, paced to 370 GB/s and unpaced, NCCL-like 16/32-CTA baselines, loopback-8
# upper bound; benchmarks/share.py), the 70B layer if time is left, then the executor regression files that run the
# new kernel (single node, virtual nodes, graph capture). Every step is bounded by `timeout` and by an overall
# deadline (TIDE_GPU_DEADLINE_S, default 345 s from the start): a step that would not fit is skipped and says so.
# Outputs (logs, JSON, PNG, summary.txt) go to $OUT (default ./gpu-out). Exit status: non-zero if the build, a
# test or a benchmark check failed. Usage: bash ci/gpu_rsquiet.sh
set -uo pipefail
cd "$(dirname "$0")/.."

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu-rsquiet}"
START=$(date +%s)
DEADLINE=$((START + ${TIDE_GPU_DEADLINE_S:-345}))
status=0
summary=()

left() { echo $((DEADLINE - $(date +%s))); }
# run NAME LIMIT MIN CMD...: runs CMD under min(LIMIT, time left) seconds if at least MIN are left; log in $OUT/NAME.log.
run() {
  local name=$1 limit=$2 min=$3
  shift 3
  local l
  l=$(left)
  if [ "$l" -lt "$min" ]; then
    summary+=("$name: SKIPPED (only ${l} s left of the deadline)")
    echo "=== $name: skipped, ${l} s left"
    return 0
  fi
  [ "$l" -lt "$limit" ] && limit=$l
  echo "=== $name (limit ${limit} s, t+$(( $(date +%s) - START )) s)"
  local t0
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  grep -vE "TIDE/.*(TRACE|INFO)" "$OUT/$name.log" | tail -n "${TAIL:-25}"
  local line
  line=$(grep -E "[0-9]+ (passed|failed|error|skipped)" "$OUT/$name.log" | tail -1)
  summary+=("$name: rc $rc, $(( $(date +%s) - t0 )) s${line:+: $line}")
  [ "$rc" -eq 0 ] || status=1
  return 0
}

echo "=== environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/env.txt"
nvcc --version | tail -2 | tee -a "$OUT/env.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
  2>&1 | tee -a "$OUT/env.txt"
git log --oneline -1 2>/dev/null | tee -a "$OUT/env.txt"

echo "=== build ($BUILD)"
if ! { timeout -k 5 240 cmake -S . -B "$BUILD" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
       timeout -k 5 240 cmake --build "$BUILD" -j >>"$OUT/build.log" 2>&1; }; then
  tail -40 "$OUT/build.log"
  echo "ci/gpu_rsquiet.sh: build FAILED"
  exit 1
fi
grep -q "CUDA data path ON" "$OUT/build.log" || { echo "ci/gpu_rsquiet.sh: CUDA data path not enabled"; exit 1; }
echo "build: $(( $(date +%s) - START )) s"
bash ci/check_exports.sh "$BUILD/libnccl-tide.so" || status=1
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
PYTEST=(python3 -m pytest -q -rs -p no:cacheprovider)

# 1. The kernel and the bench entry points (bit-exact vs the host executor; pacer; baseline).
run test_reduce_kernel_gpu 120 30 "${PYTEST[@]}" -o faulthandler_timeout=100 tests/gpu/test_reduce_kernel_gpu.py
# 2. Part 2's first measurement: one SM's bandwidth, the library's reduce per CTA, the CTAs a 370 GB/s link needs.
TAIL=40 run sm_bandwidth 75 30 python3 benchmarks/sm_bandwidth.py --out "$OUT" --link-gbps 370 --ranks 8
# 3. Part 1: one rank's share, W = 8, Llama-3.1-8B layer, every side (GEMM alone in the same run).
TAIL=30 run share_8b 120 45 python3 benchmarks/share.py --out "$OUT" --layouts llama3-8b-layer --ranks 8 \
  --link-gbps 370 --runs 31
# 4. Executors with the new kernel: single node, virtual nodes (prev / in-place / narrowing), graph capture.
run test_cuda_collectives 90 40 "${PYTEST[@]}" -o faulthandler_timeout=75 tests/gpu/test_cuda_collectives.py
run test_virtual_nodes 90 40 "${PYTEST[@]}" -o faulthandler_timeout=75 tests/gpu/test_virtual_nodes.py
run test_graph_capture 60 30 "${PYTEST[@]}" -o faulthandler_timeout=45 tests/gpu/test_graph_capture.py
# 5. The share mode's own test (4 ranks, every side, outputs checked).
run test_share_gpu 75 40 "${PYTEST[@]}" -o faulthandler_timeout=60 tests/gpu/test_share_gpu.py
# 6. If time is left: the 70B layer (no loopback sides: they would need 8 ranks' 70B gradients).
TAIL=20 run share_70b 90 50 python3 benchmarks/share.py --out "$OUT" --layouts llama3-70b-layer --ranks 8 \
  --link-gbps 370 --runs 31 --sides ag-share,ag-share-unpaced,rs-share,rs-share-unpaced,nccl-like-16,nccl-like-32

{
  echo "ci/gpu_rsquiet.sh: $(( $(date +%s) - START )) s, exit status $status"
  printf '%s\n' "${summary[@]}"
  for f in "$OUT"/share_*.json; do
    [ -f "$f" ] || continue
    python3 - "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"--- {r['layout']} W={r['ranks']} link {r['link_gbps']} GB/s: GEMM alone {r['gemm_alone_ms']['median']:.4f} ms "
      f"(after {r['gemm_alone_after_ms']['median']:.4f}); GEMM {r['gemm_shape'].get('ctas')} CTAs, "
      f"{r['gemm_shape'].get('kernel', '?')[:60]}; errors {len(r['errors'])}")
for d in r["sides"]:
    sm = d.get("sm", {})
    e = d.get("e2e_over_floor")
    print(f"  {d['name'][:44]:44s} x{d['slowdown']:.3f} [{d['slowdown_p25']:.3f}-{d['slowdown_p75']:.3f}] "
          f"cov {d['covered_runs']}/{d['with_ms']['n']} unit {d['unit_ms']['median']:.3f} ms"
          f"{'' if e is None else f' /floor {e:.3f}'} HBM {d['hbm_GBps'] or 0:.0f} GB/s "
          f"SMw {sm.get('sm_weighted_us', 0):.1f} us ok {d.get('check', {}).get('ok')}")
for s in r["summary"]:
    v = s["value"]
    print(f"  target: {s['metric'][:60]:60s} {'-' if v is None else f'{v:.3f}'} ({s['target']}, met {s['met']})")
PY
  done
  if [ -f "$OUT/sm_bandwidth.json" ]; then
    python3 - "$OUT/sm_bandwidth.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = r.get("read_best_single_cta") or {}
t = r.get("bulk_best_single_cta") or {}
print(f"--- one SM: LDG read {b.get('GBps', 0):.1f} GB/s ({b.get('threads')} thr x {b.get('depth')} in flight), "
      f"TMA bulk {t.get('GBps', 0):.1f} GB/s; torch copy {r.get('torch_copy_GBps', 0):.0f}, sum {r.get('torch_sum_GBps', 0):.0f}")
for d in r["reduce"]:
    print(f"  reduce {'rule' if d['rule'] else 'G=' + str(d['max_ctas']):>6}: {d['GBps']:.0f} GB/s, "
          f"{d['GBps_per_cta']:.1f}/CTA, {d['ms'] * 1e3:.0f} us, exact {d['bit_exact']}")
for v in r.get("reduce_variants", []):
    cells = " ".join(f"{d['ctas']}:{d['GBps_per_cta']:.1f}" if "GBps_per_cta" in d else f"{d['ctas']}:failed"
                     for d in v["runs"])
    print(f"  variant {v['variant']:22s} {v['threads']:4d} thr {v['regs']} regs {v['local_bytes']} lmem, "
          f"GB/s per CTA {cells}, exact {v['bit_exact']}")
print(f"  rule: {r.get('rule')}; best variant at 1 CTA: {r.get('reduce_variant_best_1cta')}; errors {r['errors']}")
PY
  fi
} 2>&1 | tee "$OUT/summary.txt"
exit $status

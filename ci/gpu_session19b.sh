#!/usr/bin/env bash
# Session 19, device call 2: build; the eager graph route beside compute with the fixed --interfere harness (every
# side call and the GEMM enqueued behind a hold: perf/gpu.py Gemm.slowdown), AG and RS, route off vs on, W = 8 and 2;
# then the tests/gpu files call 1 did not run, with the route on (the default). Under 10 minutes.
# Usage: bash ci/gpu_session19b.sh   (writes $OUT, default ./gpu-out; everything also in $OUT/all19b.tgz)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT="${OUT:-$PWD/gpu-out}"; export OUT; mkdir -p "$OUT/perf"
START=$(date +%s)
OUT="$OUT/build" TIDE_GPU_TESTS="" TIDE_GPU_BENCH="" bash ci/gpu_job.sh >"$OUT/job_build.log" 2>&1; tail -2 "$OUT/job_build.log"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
for coll in all_gather reduce_scatter; do
  for w in 8 2; do
    for route in 0 1; do
      f="$OUT/perf/${coll}_w${w}_route${route}"
      NCCL_TIDE_EAGER_GRAPHS=$route timeout -k 5 100 python3 -m nccl_tide.perf $coll --backend loopback --ranks $w \
        --impl tide -b 1M -e 16M -f 16 -d bf16 --interfere gemm --interfere-runs 21 --sm-time 1 -J "$f.json" >"$f.log" 2>&1
      echo "=== $coll W=$w route $route rc $? ($(( $(date +%s) - START )) s)"
      grep -vE "TIDE/|NCCL TIDE" "$f.log" | grep -E "^ +[0-9]" | cut -c1-60,120-
      python3 - "$f.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no json:", e); sys.exit()
for x in d.get("extras", {}).get("detail", []):
    i, p = x.get("interference", {}), x.get("profile", {})
    print("  size %9d gemm %.3fx covered %s/%s late %s k %s side_call_gpu_ms %s hold %.1f ms | kernel_us %.1f local_copy_us %.1f" % (
        x.get("size", 0), i.get("slowdown", 0), i.get("covered_runs"), i.get("runs"), i.get("late_runs"), i.get("side_calls"),
        i.get("side_call_gpu_ms"), i.get("hold_ms", 0), p.get("kernel_us", 0), p.get("local_copy_us", 0)))
PY
    done
  done
done
echo "=== test_perf_gpu interfere ($(( $(date +%s) - START )) s)"
timeout -k 5 120 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_perf_gpu.py -k interfere >"$OUT/perf/test_perf_interfere.log" 2>&1
echo "rc $?"; tail -3 "$OUT/perf/test_perf_interfere.log"
left=$(( 560 - ($(date +%s) - START) ))
OUT="$OUT/suite" TIDE_GPU_TESTS="${TIDE_GPU_TESTS-test_cuda_collectives:60 test_multiprocess:100 test_graph_capture_multiprocess:90 test_faults_multiprocess:80 test_interposer_gpu:80 test_share_gpu:60 test_fsdp_native:90 test_concurrency_gpu:60 test_cuda_properties:60 test_reduce_kernel_gpu:80 test_virtual_nodes:60 test_hardening_gpu:200}" \
  TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=$left bash ci/gpu_job.sh 2>&1 | grep -vE "TIDE/|NCCL TIDE" | tail -40
tar czf "$OUT/../all19b.tgz" -C "$OUT" perf suite/summary.txt $(cd "$OUT" && ls suite/*.log 2>/dev/null) 2>/dev/null
mv "$OUT/../all19b.tgz" "$OUT/all19b.tgz"

#!/usr/bin/env bash
# Session 18, device call 2: the eager graph route's cost beside compute (a single-wave GEMM beside loopback TIDE-AG,
# route off vs on, W = 2 and 8, in one run each), then tests/gpu files with the route on by default.
# Usage: bash ci/gpu_session18b.sh   (writes $OUT, default ./gpu-out)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1 CUDA_DEVICE_MAX_CONNECTIONS=32
OUT="${OUT:-$PWD/gpu-out}"; export OUT; mkdir -p "$OUT"
OUT="$OUT/build" TIDE_GPU_TESTS="" TIDE_GPU_BENCH="" bash ci/gpu_job.sh >"$OUT/job_build.log" 2>&1; tail -3 "$OUT/job_build.log"
nvcc -O2 -arch=sm_90 benchmarks/copy_engine_probe.cu -o /tmp/copy_engine_probe >"$OUT/probe_build.log" 2>&1 &&
  timeout -k 5 60 /tmp/copy_engine_probe >"$OUT/copy_engine_probe.log" 2>&1; echo "=== probe rc $?"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
for w in 8 2; do
  for route in 0 1; do
    echo "=== tide-perf AG W=$w route $route"
    NCCL_TIDE_EAGER_GRAPHS=$route timeout -k 5 90 python3 -m nccl_tide.perf all_gather --backend loopback --ranks $w \
      --impl tide -b 1M -e 16M -f 4 -d bf16 --interfere gemm --interfere-runs 21 --sm-time 1 \
      -J "$OUT/perf_ag_w${w}_route${route}.json" >"$OUT/perf_ag_w${w}_route${route}.log" 2>&1
    echo "rc $?"; grep -vE "TIDE/|NCCL TIDE" "$OUT/perf_ag_w${w}_route${route}.log" | grep -E "^ +[0-9]|#" | tail -8
  done
done
OUT="$OUT/suite" TIDE_GPU_TESTS="${TIDE_GPU_TESTS-test_perf_gpu:200 test_eager_graphs:110 test_pending_waits:40 test_faults:90 test_abort:60 test_graph_capture:60}" \
  TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=${TIDE_GPU_DEADLINE_S:-330} bash ci/gpu_job.sh

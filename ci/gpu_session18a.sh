#!/usr/bin/env bash
# Session 18, device call 1: which engine runs each copy form (benchmarks/copy_engine_probe.cu), test_perf_gpu's
# all-gather cases with the eager-graph route on (kernel names printed), then every tests/gpu file with the route off
# (the default) under ci/gpu_job.sh. Usage: bash ci/gpu_session18a.sh   (writes $OUT, default ./gpu-out)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH="/usr/local/cuda/bin:$PATH" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/gpu-out}"; export OUT; mkdir -p "$OUT"
nvcc -O2 -arch=sm_90 benchmarks/copy_engine_probe.cu -o /tmp/copy_engine_probe >"$OUT/probe_build.log" 2>&1 &&
  timeout 60 /tmp/copy_engine_probe >"$OUT/copy_engine_probe.log" 2>&1
cat "$OUT/copy_engine_probe.log" "$OUT/probe_build.log"
# build only (TIDE_GPU_TESTS empty), then the route-on perf cases
OUT="$OUT/build" TIDE_GPU_TESTS="" TIDE_GPU_BENCH="" bash ci/gpu_job.sh >"$OUT/job_build.log" 2>&1; tail -3 "$OUT/job_build.log"
export NCCL_TIDE_LIBRARY_PATH="$PWD/build/gpu/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
NCCL_TIDE_EAGER_GRAPHS=1 timeout -k 5 100 python3 -m pytest -q -rs -p no:cacheprovider tests/gpu/test_perf_gpu.py \
  -k "all_gather and not torchrun" >"$OUT/perf_route_on.log" 2>&1
echo "=== perf_route_on rc $?"; grep -E "passed|failed|kernel|Error|assert" "$OUT/perf_route_on.log" | head -30
OUT="$OUT/suite" TIDE_GPU_TESTS="${TIDE_GPU_TESTS-test_faults_multiprocess:80 test_share_gpu:60 test_multiprocess:100 test_graph_capture_multiprocess:90 test_perf_gpu:200 test_cuda_collectives:60 test_abort:60 test_faults:90}" TIDE_GPU_BENCH="" TIDE_GPU_DEADLINE_S=${TIDE_GPU_DEADLINE_S:-420} bash ci/gpu_job.sh

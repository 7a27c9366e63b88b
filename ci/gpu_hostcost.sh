#!/usr/bin/env bash
# Host-cost job (issue 15): builds build/gpu, runs benchmarks/host_cost_probe.cu (the floor: host cost of each CUDA
# call a collective issues) and benchmarks/host_issue.py (host us per rank per call and gpu us, loopback worlds).
# Outputs in $OUT (default ./gpu-out). Usage: ci/gpu_hostcost.sh [host_issue.py args]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu}"
if [ ! -f "$BUILD/libnccl-tide.so" ] || [ "${TIDE_GPU_REBUILD:-0}" = "1" ]; then
  echo "=== build ($(date +%T))"
  if ! { cmake -S . -B "$BUILD" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
           -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 && cmake --build "$BUILD" -j >>"$OUT/build.log" 2>&1; }; then
    tail -40 "$OUT/build.log"; echo "build FAILED"; exit 1
  fi
fi
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
echo "=== probe ($(date +%T))"
nvcc -O2 -arch=sm_90 benchmarks/host_cost_probe.cu -o "$BUILD/host_cost_probe" && timeout 120 "$BUILD/host_cost_probe" | tee "$OUT/host_cost_probe.txt"
echo "=== host_issue ($(date +%T))"
timeout 300 python3 benchmarks/host_issue.py --json "$OUT/host_issue.json" "$@" 2>&1 | grep -v TRACE | tee "$OUT/host_issue.txt"
echo "=== end ($(date +%T))"

#!/usr/bin/env bash
# Issue 17 on one H200 (torch 2.11+cu130 there): the FSDP2 slot pool on the GPU and the step benchmark's
# memory/time figures, stock vs TIDE. Under 4 minutes (build about 1-2 min if build/gpu is missing, the test
# about 20 s, the benchmark about 60-90 s). Usage, from the repo root:  bash ci/gpu_fsdp_pool.sh
# Writes $OUT (default ./gpu-out): build.log, test_fsdp_native.log, fsdp_step_pool.{log,json}.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast stays off on shared machines (DESIGN.md section 6); every child inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu}"
if [ ! -f "$BUILD/libnccl-tide.so" ] || [ "${TIDE_GPU_REBUILD:-0}" = "1" ]; then
  echo "=== build ($(date +%T))"
  if ! timeout -k 5 200 bash -c "cmake -S . -B '$BUILD' -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release >'$OUT/build.log' 2>&1 && cmake --build '$BUILD' -j >>'$OUT/build.log' 2>&1"; then
    tail -40 "$OUT/build.log"; echo "ci/gpu_fsdp_pool.sh: build FAILED"; exit 1
  fi
fi
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
status=0

echo "=== tests/gpu/test_fsdp_native.py ($(date +%T))"
timeout -k 5 150 python3 -m pytest -q -rs -s -p no:cacheprovider -o faulthandler_timeout=135 \
  tests/gpu/test_fsdp_native.py >"$OUT/test_fsdp_native.log" 2>&1 || status=1
grep -E "slot pool|passed|failed|Error|error" "$OUT/test_fsdp_native.log" | grep -vE "^TIDE/" | tail -20

echo "=== fsdp_step: stock vs tide (slot_pool=2) vs tide-dedicated, world size 1 ($(date +%T))"
timeout -k 5 200 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide,tide-dedicated \
  --slot-pool 2 --warmup 3 --steps 10 --profile-steps 2 --variant-timeout 60 -J "$OUT/fsdp_step_pool.json" \
  >"$OUT/fsdp_step_pool.log" 2>&1 || status=1
grep -vE "^TIDE/" "$OUT/fsdp_step_pool.log" | tail -15
echo "=== done ($(date +%T)), status $status"
exit $status

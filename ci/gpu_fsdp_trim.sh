#!/usr/bin/env bash
# Issue 17 on one H200: the trimming slot pool. The memory probe (stock vs tide, with trimming and without) and the
# step benchmark's time (tide trimmed vs untrimmed vs stock), world size 1, 4 Llama layers, slot_pool=2. At world
# size 1 "trimmed" is the torch-memory pool (binder "torch": trims and regrows are stream-ordered frees and
# allocations in torch's cache, no tideSlotFree / device synchronize); fsdp_step's stats line and the probe JSON's
# tide.slot_pool.binder name it. About 6 minutes plus the build (probe: about 1 minute per variant; --slot-trim on and off).
# Usage, from the repo root:  bash ci/gpu_fsdp_trim.sh   (TIDE_GPU_REBUILD=1 rebuilds build/gpu)
# Writes $OUT (default ./gpu-out): probe_trim_{on,off}.{json,log} (+ the children's logs),
# fsdp_step_trim_{on,off}.{json,log}.
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
  if ! timeout -k 5 200 bash -c "cmake -S . -B '$BUILD' -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_BUILD_TYPE=Release >'$OUT/build.log' 2>&1 && cmake --build '$BUILD' -j >>'$OUT/build.log' 2>&1"; then
    tail -40 "$OUT/build.log"; echo "ci/gpu_fsdp_trim.sh: build FAILED"; exit 1
  fi
fi
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue${PYTHONPATH:+:$PYTHONPATH}"
status=0
for trim in on off; do
  echo "=== fsdp_memory_probe stock,tide --slot-trim $trim ($(date +%T))"
  timeout -k 5 300 python3 benchmarks/fsdp_memory_probe.py --variants stock,tide --slot-pool 2 --slot-trim "$trim" \
    --timeout 140 --out "$OUT/probe_trim_$trim.json" >"$OUT/probe_trim_$trim.log" 2>&1 || status=1
  sed -n '1,6p' "$OUT/probe_trim_$trim.log"
done
echo "=== fsdp_step: stock vs tide trimmed vs tide untrimmed (slot_pool=2), world size 1 ($(date +%T))"
for trim in on off; do
  timeout -k 5 200 python3 -m nccl_tide.bench.fsdp_step --layers 4 --variants stock,tide --slot-pool 2 \
    --slot-trim "$trim" --warmup 3 --steps 10 --variant-timeout 60 -J "$OUT/fsdp_step_trim_$trim.json" \
    >"$OUT/fsdp_step_trim_$trim.log" 2>&1 || status=1
  grep -vE "^TIDE/" "$OUT/fsdp_step_trim_$trim.log" | tail -8
done
echo "=== done ($(date +%T)), status $status"
exit $status

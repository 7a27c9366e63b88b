#!/usr/bin/env bash
# Runs tests/gpu file by file, each under its own time limit, so one hang costs one file and not the whole device
# session; prints one summary line per file. Usage: ci/gpu_suite.sh FILE[:SECONDS] ... (default 150 s per file).
# Builds build/gpu first if it is missing. Logs go to $OUT (default ./gpu-out). Exit status: non-zero if any file
# failed or timed out.
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
  if ! { cmake -S . -B "$BUILD" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
           -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 && cmake --build "$BUILD" -j >>"$OUT/build.log" 2>&1; }; then
    tail -40 "$OUT/build.log"
    echo "ci/gpu_suite.sh: build FAILED"
    exit 1
  fi
fi
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

status=0
summary=()
for spec in "$@"; do
  file="${spec%%:*}"
  limit=150
  [ "$spec" != "$file" ] && limit="${spec##*:}"
  name=$(basename "$file" .py)
  echo "=== $file (limit ${limit} s, $(date +%T))"
  start=$(date +%s)
  # faulthandler dumps every thread's stack shortly before the limit, so a hang shows where it is.
  timeout -k 5 "$limit" python3 -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=$((limit - 15)) \
    "$file" >"$OUT/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT/$name.log" | grep -vE "NCCL TIDE TRACE"
  line=$(grep -E "[0-9]+ (passed|failed|error)" "$OUT/$name.log" | tail -1)
  summary+=("$name: rc $rc, $(( $(date +%s) - start )) s: ${line:-no pytest summary}")
  [ "$rc" -eq 0 ] || status=1
done
echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit $status

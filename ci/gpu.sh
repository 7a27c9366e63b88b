#!/usr/bin/env bash
# The GPU job (one H200; not part of CPU CI): build the CUDA library, run tests/gpu bit-exact against the host
# executor, compute-sanitizer memcheck + racecheck + synccheck on a small case, then the benchmarks if present.
# Logs go to $OUT (default: ./gpu-out). Exit status: non-zero if the build, the tests or a sanitizer failed.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast stays off on shared machines (DESIGN.md section 6): keep these set for every child process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
# Loopback worlds keep up to 16 streams busy with cross-stream flag waits: one hardware queue per stream.
export CUDA_DEVICE_MAX_CONNECTIONS=32

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu}"
ARCHS="${CMAKE_CUDA_ARCHITECTURES:-90}"
export PATH="/usr/local/cuda/bin:$PATH"
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "environment"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
nvcc --version | tail -2
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"

step "build (CMAKE_CUDA_ARCHITECTURES=$ARCHS)"
if ! { cmake -S . -B "$BUILD" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
         -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
       cmake --build "$BUILD" -j >>"$OUT/build.log" 2>&1; }; then
  tail -40 "$OUT/build.log"
  echo "ci/gpu.sh: build FAILED"
  exit 1
fi
grep -q "CUDA data path ON" "$OUT/build.log" || { echo "ci/gpu.sh: CUDA data path not enabled"; exit 1; }
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

step "smoke: tests/gpu/sanitizer_case.py without the sanitizer (a hang here stops the job early)"
timeout -k 5 "${TIDE_GPU_SMOKE_TIMEOUT:-120}" python3 tests/gpu/sanitizer_case.py 2>&1 | tee "$OUT/smoke.log"
rc=${PIPESTATUS[0]}
echo "smoke exit status: $rc"
if [ "$rc" -ne 0 ]; then
  echo "ci/gpu.sh: smoke FAILED; skipping the rest"
  exit 1
fi

step "tests/gpu"
timeout -k 10 "${TIDE_GPU_TEST_TIMEOUT:-900}" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu --junitxml="$OUT/gpu-tests.xml" \
  -o junit_family=xunit1 2>&1 | tee "$OUT/gpu-tests.log" | tail -60
rc=${PIPESTATUS[0]}
echo "tests/gpu exit status: $rc"
[ "$rc" -eq 0 ] || status=1

if [ "${TIDE_GPU_SKIP_PERF:-0}" != "1" ]; then
  step "tests/gpu/perf_smoke.py"
  timeout -k 10 "${TIDE_GPU_PERF_TIMEOUT:-300}" python3 tests/gpu/perf_smoke.py 2>&1 | tee "$OUT/perf-smoke.log"
  rc=${PIPESTATUS[0]}
  echo "perf_smoke exit status: $rc"
  [ "$rc" -eq 0 ] || status=1
fi

if [ "${TIDE_GPU_SKIP_SANITIZER:-0}" != "1" ]; then
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer --tool $tool (tests/gpu/sanitizer_case.py)"
    timeout -k 10 "${TIDE_GPU_SAN_TIMEOUT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 86 python3 tests/gpu/sanitizer_case.py \
      >"$OUT/sanitizer-$tool.log" 2>&1
    rc=$?
    tail -5 "$OUT/sanitizer-$tool.log"
    echo "compute-sanitizer $tool exit status: $rc"
    [ "$rc" -eq 0 ] || status=1
  done
fi

# Optional: a sanitizer over whole GPU test files (slow: use a few files), e.g.
#   TIDE_GPU_SAN_TESTS="tests/gpu/test_cuda_collectives.py tests/gpu/test_virtual_nodes.py" TIDE_GPU_SAN_TOOL=memcheck
if [ -n "${TIDE_GPU_SAN_TESTS:-}" ]; then
  tool="${TIDE_GPU_SAN_TOOL:-memcheck}"
  step "compute-sanitizer --tool $tool over: $TIDE_GPU_SAN_TESTS"
  # shellcheck disable=SC2086
  timeout -k 10 "${TIDE_GPU_SAN_SUITE_TIMEOUT:-600}" compute-sanitizer --tool "$tool" --error-exitcode 86 \
    python3 -m pytest -q -x -p no:cacheprovider $TIDE_GPU_SAN_TESTS >"$OUT/sanitizer-suite-$tool.log" 2>&1
  rc=$?
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/sanitizer-suite-$tool.log" | tail -5
  echo "compute-sanitizer $tool (suite) exit status: $rc"
  [ "$rc" -eq 0 ] || status=1
fi

if [ -f benchmarks/run_all.py ] && [ "${TIDE_GPU_SKIP_BENCH:-0}" != "1" ]; then
  step "benchmarks/run_all.py"
  timeout -k 10 "${TIDE_GPU_BENCH_TIMEOUT:-900}" python3 benchmarks/run_all.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -80
  rc=${PIPESTATUS[0]}
  echo "benchmarks exit status: $rc"
  [ "$rc" -eq 0 ] || status=1
fi

echo
echo "ci/gpu.sh: exit $status"
exit $status

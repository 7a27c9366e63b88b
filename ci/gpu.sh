#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# The GPU job: the one script to run on a machine with an NVIDIA GPU (not part of CPU CI).
#
#   bash ci/gpu.sh [part ...]        default: nccl build tests perf sanitizer bench, in that order
#
# Parts:
#   nccl       build a second NCCL (>= 2.30) for the tests that need one: TIDE_NCCL_BUILD=path/to/build.sh, a script
#              that takes an output folder and leaves OUT/lib/libnccl.so.2 there (e.g. NCCL 2.30.7 from its source
#              tarball, built for sm_90). The tests that ask for it (TIDE_TEST_NCCL_LIBRARY, set here) preload it
#              in their own processes; everything else keeps the process's NCCL. Skipped when TIDE_NCCL_BUILD is
#              unset.
#   build      the CUDA library into TIDE_GPU_BUILD (default build/gpu) for CMAKE_CUDA_ARCHITECTURES (default 90).
#   tests      every file of tests/gpu (one card) and tests/multirank (several processes), one pytest per file under
#              its own limit (TIDE_GPU_FILE_TIMEOUT, default 300 s), so a hang costs one file; TIDE_GPU_TESTS="FILE
#              ..." runs only those files.
#   perf       tests/gpu/perf_smoke.py and tide-perf's loopback rows (AG and RS, 8 virtual ranks, every
#              implementation) with JSON in $OUT.
#   sanitizer  compute-sanitizer memcheck, racecheck and synccheck on tests/gpu/sanitizer_case.py; with
#              TIDE_GPU_SAN_TESTS="FILE ..." also TIDE_GPU_SAN_TOOL (default memcheck) over those test files, child
#              processes included (TIDE_GPU_SAN_ARGS adds tool options, e.g. "--report-api-errors no" for tests
#              whose out-of-memory cases make CUDA calls fail on purpose).
#   bench      benchmarks/run_all.py --out $OUT (skipped with a message if the tree has no such entry).
#
# Every part runs under one deadline, TIDE_GPU_DEADLINE_S seconds from the start (default 540, so the job fits a
# 10-minute device call): a part or file that would start with less than 20 s left is skipped and says so. Logs go
# to $OUT (default ./gpu-out): one log per step, env.txt (card, driver, versions, commit) and summary.txt; with
# TIDE_GPU_LOG_ARCHIVE=1 the step logs are packed into logs.tar.gz instead (for runners that return few files).
# Exit status: non-zero if any step failed or was cut by its limit.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast stays off on shared machines: every child process inherits these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Loopback worlds keep up to 16 streams busy with cross-stream flag waits: one hardware queue per stream.
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu}"
case $BUILD in /*) ;; *) BUILD="$PWD/$BUILD" ;; esac
ARCHS="${CMAKE_CUDA_ARCHITECTURES:-90}"
END=$(( $(date +%s) + ${TIDE_GPU_DEADLINE_S:-540} ))
PARTS="${*:-nccl build tests perf sanitizer bench}"
status=0
summary=()

left() { echo $(( END - $(date +%s) )); }
note() { summary+=("$*"); echo "=== $*"; }

# step NAME LIMIT CMD...: CMD under min(LIMIT, time left), log in $OUT/NAME.log; skipped under 20 s left.
step() {
  local name=$1 limit=$2 l t0 rc line
  shift 2
  l=$(left)
  if [ "$l" -lt 20 ]; then note "$name: SKIPPED (deadline: $l s left)"; status=1; return 1; fi
  [ "$l" -lt "$limit" ] && limit=$l
  echo "=== $name (limit $limit s, $(date +%T))"
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  line=$(grep -vE "SUMMARY" "$OUT/$name.log" | grep -E "[0-9]+ (passed|failed|error)" | tail -1)
  note "$name: rc $rc, $(( $(date +%s) - t0 )) s${line:+: $line}"
  if [ "$rc" -ne 0 ]; then
    status=1
    grep -vE "NCCL TIDE (TRACE|INFO)" "$OUT/$name.log" | tail -25
  fi
  return "$rc"
}

part_nccl() {
  local script="${TIDE_NCCL_BUILD:-}" prefix="$PWD/build/nccl"
  if [ -z "$script" ]; then note "nccl: skipped (TIDE_NCCL_BUILD not set)"; return; fi
  [ -f "$script" ] || { note "nccl: FAILED (no $script)"; status=1; return; }
  step nccl 400 bash "$script" "$prefix" || return
  [ -f "$prefix/lib/libnccl.so.2" ] || { note "nccl: FAILED (no $prefix/lib/libnccl.so.2)"; status=1; return; }
  export TIDE_TEST_NCCL_LIBRARY="$prefix/lib/libnccl.so.2"
}

part_build() {
  step build 400 bash -c "cmake -S . -B '$BUILD' -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES='$ARCHS' \
    -DCMAKE_BUILD_TYPE=Release && cmake --build '$BUILD' -j" || return
  grep -q "CUDA data path ON" "$OUT/build.log" || { note "build: FAILED (CUDA data path not enabled)"; status=1; }
}

have_library() {
  [ -f "$BUILD/libnccl-tide.so" ] && return 0
  note "$1: skipped (no $BUILD/libnccl-tide.so: run the build part)"; status=1; return 1
}

part_tests() {
  have_library tests || return
  local files f lim
  files="${TIDE_GPU_TESTS:-$(ls tests/gpu/test_*.py tests/multirank/test_*.py 2>/dev/null)}"
  for f in $files; do
    lim=${TIDE_GPU_FILE_TIMEOUT:-300}
    [ "$(left)" -lt "$lim" ] && lim=$(left)
    # faulthandler dumps every thread's stack 15 s before the file's limit, so a hang shows where it is.
    step "$(basename "$(dirname "$f")")-$(basename "$f" .py)" "$lim" python3 -m pytest -v -rs -p no:cacheprovider \
      --durations=10 -o faulthandler_timeout=$(( lim > 30 ? lim - 15 : 15 )) "$f"
  done
}

part_perf() {
  have_library perf || return
  step perf_smoke 300 python3 tests/gpu/perf_smoke.py
  local op
  for op in all_gather reduce_scatter; do
    step "tide-perf-$op" 150 python3 -m nccl_tide.perf "$op" --backend loopback --ranks 8 -b 1M -e 64M -f 4 -n 10 \
      -d bf16 --impl all --interfere gemm -J "$OUT/tide-perf-$op.json"
  done
}

part_sanitizer() {
  have_library sanitizer || return
  local tool
  for tool in memcheck racecheck synccheck; do
    step "sanitizer-$tool" 300 compute-sanitizer --tool "$tool" --error-exitcode 86 python3 tests/gpu/sanitizer_case.py
  done
  if [ -n "${TIDE_GPU_SAN_TESTS:-}" ]; then
    tool="${TIDE_GPU_SAN_TOOL:-memcheck}"
    # shellcheck disable=SC2086
    step "sanitizer-$tool-tests" 600 compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 86 \
      ${TIDE_GPU_SAN_ARGS:-} \
      python3 -m pytest -q -x -p no:cacheprovider $TIDE_GPU_SAN_TESTS
  fi
}

part_bench() {
  have_library bench || return
  if [ ! -f benchmarks/run_all.py ]; then note "bench: skipped (no benchmarks/run_all.py in this tree)"; return; fi
  step bench 600 python3 benchmarks/run_all.py --out "$OUT"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl',
    torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
  git rev-parse HEAD; git status --short; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export NCCL_TIDE_LIBRARY_PATH="$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

for part in $PARTS; do
  case $part in
    nccl|build|tests|perf|sanitizer|bench) "part_$part" ;;
    *) note "$part: unknown part (nccl build tests perf sanitizer bench)"; status=1 ;;
  esac
done

echo
echo "=== summary ($(left) s left of the deadline)"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
if [ "${TIDE_GPU_LOG_ARCHIVE:-0}" = 1 ]; then
  (cd "$OUT" && logs=$(ls ./*.log 2>/dev/null) && [ -n "$logs" ] && tar -czf logs.tar.gz $logs && rm -f $logs)
fi
echo "ci/gpu.sh: exit $status"
exit $status

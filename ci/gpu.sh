#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# The GPU job: the one script to run on a machine with an NVIDIA GPU (not part of CPU CI). The whole suite fits one
# 10-minute call on one H100: the library and a second NCCL build side by side, then the single-card files and the
# multi-process files as two concurrent streams, then perf and sanitizer.
#
#   bash ci/gpu.sh [part ...]        default: nccl frameworks build tests perf sanitizer
#
# Parts:
#   nccl        build a second NCCL (>= 2.30) in the background for the tests that need one: TIDE_NCCL_BUILD=path/to/
#               build.sh, a script that takes an output folder and leaves OUT/lib/libnccl.so.2 there (e.g. NCCL 2.30.7
#               from its source tarball, built for sm_90). The tests that ask for it (TIDE_TEST_NCCL_LIBRARY, set once
#               the build is done) preload it in their own processes. Skipped when TIDE_NCCL_BUILD is unset.
#   frameworks  install DeepSpeed, Megatron-Core and torchtitan in the background from TIDE_FRAMEWORK_WHEELS=DIR
#               (ci/framework_wheels.sh download DIR) for tests/multirank/test_frameworks.py, which skips without them.
#   build       the CUDA library into TIDE_GPU_BUILD (default build/gpu) for CMAKE_CUDA_ARCHITECTURES (default 90).
#   tests       every file of tests/gpu (one card, one process) and, concurrently, the files of tests/multirank that
#               need a GPU (several processes; this stream waits for the nccl and frameworks parts first), then the
#               files that exhaust or measure the card's memory (ALONE) by themselves; one pytest per file under its
#               own limit (TIDE_GPU_FILE_TIMEOUT, default 240 s), so a hang costs one file. TIDE_GPU_TESTS="FILE ..."
#               runs only those files.
#   perf        tests/gpu/perf_smoke.py and tide-perf's loopback rows (AG and RS, 8 virtual ranks, every
#               implementation) with JSON in $OUT.
#   sanitizer   compute-sanitizer memcheck, racecheck and synccheck on tests/gpu/sanitizer_case.py; with
#               TIDE_GPU_SAN_TESTS="FILE ..." also TIDE_GPU_SAN_TOOL (default memcheck) over those test files, child
#               processes included (TIDE_GPU_SAN_ARGS adds tool options, e.g. "--report-api-errors no" for tests
#               whose out-of-memory cases make CUDA calls fail on purpose).
#   bench       benchmarks/run_all.py --out $OUT (not in the default list: it takes a call of its own).
#
# Every part runs under one deadline, TIDE_GPU_DEADLINE_S seconds from the start (default 540): a step that would
# start with less than 20 s left is skipped and says so. Logs go to $OUT (default ./gpu-out): one log per step,
# env.txt (card, driver, versions, commit) and summary.txt, one table (step, result, tests passed / failed / skipped,
# seconds); with TIDE_GPU_LOG_ARCHIVE=1 the step logs are packed into logs.tar.gz (for runners that return few
# files). Exit status: non-zero if any step failed, was skipped or was cut by its limit.
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
START=$(date +%s)
END=$(( START + ${TIDE_GPU_DEADLINE_S:-540} ))
PARTS="${*:-nccl frameworks build tests perf sanitizer}"
STEPS="$OUT/steps.tsv"  # one line per step: name, result, passed, failed, skipped, seconds (streams append)
: >"$STEPS"
BG_NCCL="" BG_FRAMEWORKS=""

left() { echo $(( END - $(date +%s) )); }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$STEPS"; }

# "N passed, M failed, K skipped, E errors" of a pytest log's last summary line, as "passed failed skipped".
counts() {
  local line p f s e
  line=$(grep -E "^=+ .*[0-9]+ (passed|failed|skipped|error)" "$1" | tail -1)
  p=$(grep -oE "[0-9]+ passed" <<<"$line" | grep -oE "[0-9]+")
  f=$(grep -oE "[0-9]+ failed" <<<"$line" | grep -oE "[0-9]+")
  s=$(grep -oE "[0-9]+ skipped" <<<"$line" | grep -oE "[0-9]+")
  e=$(grep -oE "[0-9]+ errors?" <<<"$line" | grep -oE "[0-9]+")
  echo "${p:-0} $(( ${f:-0} + ${e:-0} )) ${s:-0}"
}

# step NAME LIMIT CMD...: CMD under min(LIMIT, time left), log in $OUT/NAME.log; skipped under 20 s left.
step() {
  local name=$1 limit=$2 l t0 rc result
  shift 2
  l=$(left)
  if [ "$l" -lt 20 ]; then record "$name" "SKIPPED (deadline)" - - - 0; echo "=== $name: skipped, deadline"; return 1; fi
  [ "$l" -lt "$limit" ] && limit=$l
  echo "=== $name (limit $limit s, $(date +%T))"
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  case $rc in 0) result=ok ;; 124|137) result="TIMEOUT (${limit} s)" ;; *) result="FAILED (rc $rc)" ;; esac
  # shellcheck disable=SC2046
  record "$name" "$result" $(counts "$OUT/$name.log") $(( $(date +%s) - t0 ))
  echo "=== $name: $result, $(( $(date +%s) - t0 )) s"
  if [ "$rc" -ne 0 ]; then grep -vE "NCCL TIDE (TRACE|INFO)" "$OUT/$name.log" | tail -25; fi
  return "$rc"
}

part_nccl() {
  local script="${TIDE_NCCL_BUILD:-}" prefix="$PWD/build/nccl"
  if [ -z "$script" ]; then echo "=== nccl: skipped (TIDE_NCCL_BUILD not set)"; return; fi
  if [ ! -f "$script" ]; then record nccl "FAILED (no $script)" - - - 0; return; fi
  step nccl 400 bash "$script" "$prefix" &
  BG_NCCL=$!
}

part_frameworks() {
  local dir="${TIDE_FRAMEWORK_WHEELS:-}"
  if [ -z "$dir" ]; then echo "=== frameworks: skipped (TIDE_FRAMEWORK_WHEELS not set)"; return; fi
  step frameworks 300 bash ci/framework_wheels.sh install "$dir" &
  BG_FRAMEWORKS=$!
}

# The background parts the multi-process tests need; TIDE_TEST_NCCL_LIBRARY once the second NCCL is there.
await_background() {
  [ -n "$BG_NCCL" ] && wait "$BG_NCCL"
  [ -n "$BG_FRAMEWORKS" ] && wait "$BG_FRAMEWORKS"
  BG_NCCL="" BG_FRAMEWORKS=""
  [ -f "$PWD/build/nccl/lib/libnccl.so.2" ] && export TIDE_TEST_NCCL_LIBRARY="$PWD/build/nccl/lib/libnccl.so.2"
  return 0
}

part_build() {
  step build 400 bash -c "cmake -S . -B '$BUILD' -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES='$ARCHS' \
    -DCMAKE_BUILD_TYPE=Release && cmake --build '$BUILD' -j" || return
  grep -q "CUDA data path ON" "$OUT/build.log" || record build-check "FAILED (CUDA data path not enabled)" - - - 0
}

have_library() {
  [ -f "$BUILD/libnccl-tide.so" ] && return 0
  record "$1" "FAILED (no $BUILD/libnccl-tide.so: run the build part)" - - - 0; return 1
}

# run_files FILE...: one pytest per file, in order.
run_files() {
  local f lim
  for f in "$@"; do
    lim=${TIDE_GPU_FILE_TIMEOUT:-240}
    # faulthandler dumps every thread's stack 15 s before the file's limit, so a hang shows where it is.
    step "$(basename "$(dirname "$f")")-$(basename "$f" .py)" "$lim" python3 -m pytest -v -rs -p no:cacheprovider \
      --durations=10 -o faulthandler_timeout=$(( lim > 30 ? lim - 15 : 15 )) "$f"
  done
}

# Files that exhaust the card's memory on purpose, or measure its free memory: alone, after both streams.
ALONE="tests/gpu/test_faults.py"

part_tests() {
  have_library tests || return
  local files single=() multi=() alone=() f
  # tests/multirank files that need no GPU (gloo, CPU) run in the CPU job, not here.
  files="${TIDE_GPU_TESTS:-$(ls tests/gpu/test_*.py; grep -lE "mark\.gpu|torch_cuda|cuda_lib" tests/multirank/test_*.py)}"
  for f in $files; do
    case " $ALONE " in *" $f "*) alone+=("$f"); continue ;; esac
    case $f in tests/multirank/*) multi+=("$f") ;; *) single+=("$f") ;; esac
  done
  # The streams share the card: single-card files are one process each, multi-process files a few small ranks.
  run_files "${single[@]}" &
  local single_pid=$!
  await_background
  run_files "${multi[@]}"
  wait "$single_pid"
  run_files "${alone[@]}"
}

part_perf() {
  have_library perf || return
  step perf_smoke 240 python3 tests/gpu/perf_smoke.py
  local op
  for op in all_gather reduce_scatter; do
    step "tide-perf-$op" 120 python3 -m nccl_tide.perf "$op" --backend loopback --ranks 8 -b 1M -e 64M -f 4 -n 10 \
      -d bf16 --impl all --interfere gemm -J "$OUT/tide-perf-$op.json"
  done
}

part_sanitizer() {
  have_library sanitizer || return
  local tool
  for tool in memcheck racecheck synccheck; do
    step "sanitizer-$tool" 240 compute-sanitizer --tool "$tool" --error-exitcode 86 python3 tests/gpu/sanitizer_case.py
  done
  if [ -n "${TIDE_GPU_SAN_TESTS:-}" ]; then
    tool="${TIDE_GPU_SAN_TOOL:-memcheck}"
    # shellcheck disable=SC2086
    step "sanitizer-$tool-tests" 600 compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 86 \
      ${TIDE_GPU_SAN_ARGS:-} python3 -m pytest -q -x -p no:cacheprovider $TIDE_GPU_SAN_TESTS
  fi
}

part_bench() {
  have_library bench || return
  step bench 600 python3 benchmarks/run_all.py --out "$OUT"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl',
    torch.cuda.nccl.version() if torch.cuda.is_available() else None)"
  git rev-parse HEAD 2>/dev/null || echo "no git checkout"
  git status --short 2>/dev/null; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
export NCCL_TIDE_LIBRARY_PATH="$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

for part in $PARTS; do
  case $part in
    nccl|frameworks|build|tests|perf|sanitizer|bench) "part_$part" ;;
    *) record "$part" "FAILED (unknown part: nccl frameworks build tests perf sanitizer bench)" - - - 0 ;;
  esac
done
await_background

{ echo "# $(head -1 "$OUT/env.txt"); $(grep -m1 '^torch' "$OUT/env.txt"); commit $(git rev-parse --short HEAD 2>/dev/null)"
  printf '%-46s %-22s %6s %6s %7s %5s\n' step result passed failed skipped s
  sort "$STEPS" | while IFS=$'\t' read -r n r p f s t; do printf '%-46s %-22s %6s %6s %7s %5s\n' "$n" "$r" "$p" "$f" "$s" "$t"; done
  echo "# total $(( $(date +%s) - START )) s of the ${TIDE_GPU_DEADLINE_S:-540} s deadline"
} | tee "$OUT/summary.txt"
status=0
cut -f2 "$STEPS" | grep -qv "^ok$" && status=1
if [ "${TIDE_GPU_LOG_ARCHIVE:-0}" = 1 ]; then
  (cd "$OUT" && logs=$(ls ./*.log 2>/dev/null) && [ -n "$logs" ] && tar -czf logs.tar.gz $logs && rm -f $logs)
fi
echo "ci/gpu.sh: exit $status"
exit $status

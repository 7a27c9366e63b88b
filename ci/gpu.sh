#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# The GPU job: the one script to run on a machine with an NVIDIA GPU (not part of CPU CI). It runs the whole suite and
# is sized for one 9-minute call on one H100 with 16 CPU cores.
#
#   bash ci/gpu.sh [part ...]        default: nccl frameworks build tests perf sanitizer
#
# Parts:
#   nccl        build a second NCCL (>= 2.30) in the background for the tests that need one: TIDE_NCCL_BUILD=path/to/
#               build.sh, a script that takes an output folder and leaves OUT/lib/libnccl.so.2 there (e.g. NCCL 2.30.7
#               from its source tarball, built for sm_90). The test files that ask for it (TIDE_TEST_NCCL_LIBRARY, set
#               once the build is done) preload it in their own processes. Skipped when TIDE_NCCL_BUILD is unset.
#   frameworks  install DeepSpeed, Megatron-Core and torchtitan in the background from TIDE_FRAMEWORK_WHEELS=DIR
#               (ci/framework_wheels.sh download DIR) for tests/multirank/test_frameworks.py, which skips without them.
#   build       the CUDA library into TIDE_GPU_BUILD (default build/gpu) for CMAKE_CUDA_ARCHITECTURES (default 90), a
#               test build (-DTIDE_TEST_SWITCHES=ON: the tests flip the test-only switches, docs/env.md "Test builds").
#   tests       every file of tests/gpu (one card, one process) and the files of tests/multirank that need a GPU
#               (several processes); one pytest per file under its own limit (TIDE_GPU_FILE_TIMEOUT, default 240 s;
#               faulthandler dumps every thread 15 s before it), so a hang costs one file. TIDE_GPU_TESTS="FILE ..."
#               runs only those files.
#   perf        tests/gpu/perf_smoke.py and tide-perf's loopback rows (AG and RS, 8 virtual ranks, every
#               implementation, 1 MiB and 64 MiB: benchmarks/RESULTS.md's rows) with JSON in $OUT.
#   sanitizer   compute-sanitizer memcheck, racecheck and synccheck on tests/gpu/sanitizer_case.py; with
#               TIDE_GPU_SAN_TESTS="FILE ..." also TIDE_GPU_SAN_TOOL (default memcheck) over those test files, child
#               processes included (TIDE_GPU_SAN_ARGS adds tool options, e.g. "--report-api-errors no" for tests
#               whose out-of-memory cases make CUDA calls fail on purpose).
#   bench       benchmarks/run_all.py --out $OUT (not in the default list: it takes a call of its own).
#
# The parts run in phases, whatever order they are named in:
#   1. background  nccl and frameworks start, niced, so that the library build comes first on the CPU.
#   2. build       the library (the only phase that uses every core).
#   3. quiet       what measures speed, with nothing else on the GPU: perf, the test files of QUIET (they assert
#                  speed ratios), bench.
#   4. queue       TIDE_GPU_STREAMS workers (default 4: multi-process files run 2-4 ranks each, so 4 files at once keep
#                  16 cores busy without time-slicing the one GPU further) share one queue of the other test files and
#                  the sanitizer runs, longest first by ci/gpu_durations.tsv (expected seconds per step; a step not
#                  listed counts DEFAULT_S). A worker claims an entry by moving it (an atomic rename), so each runs
#                  once. A file that needs a background part (the second NCCL, the framework wheels) waits while that
#                  part runs: its worker takes other entries first, and waits only when nothing else is left.
#   5. alone       the files of ALONE, which exhaust or measure the card's memory, one after another, then the
#                  sanitizer over TIDE_GPU_SAN_TESTS.
#
# Every step runs under one deadline, TIDE_GPU_DEADLINE_S seconds from the start (default 540): a step that would
# start with less than 20 s left is skipped and says so. Logs go to $OUT (default ./gpu-out): one log per step,
# env.txt (card, driver, versions, commit), steps.tsv (step, result, tests passed / failed / skipped, seconds, start
# second), summary.txt (the same as one table) and gpu_durations.tsv (ci/gpu_durations.tsv with the seconds this run
# measured for the queued steps: copy it over the one in ci/ to keep the order current); with TIDE_GPU_LOG_ARCHIVE=1
# the step logs are packed into logs.tar.gz (for runners that return few files). Exit status: non-zero if any step
# failed, was skipped or was cut by its limit.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

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
WORKERS="${TIDE_GPU_STREAMS:-4}"
DURATIONS=ci/gpu_durations.tsv
DEFAULT_S=30
NCCL_PREFIX="$PWD/build/nccl"
NCCL_LIB="$NCCL_PREFIX/lib/libnccl.so.2"
STEPS="$OUT/steps.tsv"  # one line per step: name, result, passed, failed, skipped, seconds, start second
: >"$STEPS"
# The queue (pending/, claimed/), the list of queued step names, and one running-PART file per background part.
STATE=$(mktemp -d)
trap 'rm -rf "$STATE"' EXIT
mkdir "$STATE/pending" "$STATE/claimed"
: >"$STATE/queued"

# Files that assert speed ratios: in the quiet phase. Files that exhaust the card's memory on purpose, or measure
# its free memory: alone, after the queue.
QUIET="tests/gpu/test_perf_interference_gpu.py"
ALONE="tests/gpu/test_faults.py"

left() { echo $(( END - $(date +%s) )); }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$STEPS"; }
want() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

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
  t0=$(date +%s)
  l=$(left)
  if [ "$l" -lt 20 ]; then
    record "$name" "SKIPPED (deadline)" - - - 0 $(( t0 - START ))
    echo "=== $name: skipped, deadline"
    return 1
  fi
  [ "$l" -lt "$limit" ] && limit=$l
  echo "=== $name (limit $limit s, $(date +%T))"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  case $rc in 0) result=ok ;; 124|137) result="TIMEOUT (${limit} s)" ;; *) result="FAILED (rc $rc)" ;; esac
  # shellcheck disable=SC2046
  record "$name" "$result" $(counts "$OUT/$name.log") $(( $(date +%s) - t0 )) $(( t0 - START ))
  echo "=== $name: $result, $(( $(date +%s) - t0 )) s"
  if [ "$rc" -ne 0 ]; then grep -vE "NCCL TIDE (TRACE|INFO)" "$OUT/$name.log" | tail -25; fi
  return "$rc"
}

# background NAME LIMIT CMD...: step NAME in the background, niced; $STATE/running-NAME exists until it ends.
background() {
  touch "$STATE/running-$1"
  { step "$1" "$2" nice -n 10 "${@:3}"; rm -f "$STATE/running-$1"; } &
}

part_nccl() {
  local script="${TIDE_NCCL_BUILD:-}"
  if [ -z "$script" ]; then echo "=== nccl: skipped (TIDE_NCCL_BUILD not set)"; return; fi
  if [ ! -f "$script" ]; then record nccl "FAILED (no $script)" - - - 0 0; return; fi
  background nccl 400 bash "$script" "$NCCL_PREFIX"
}

part_frameworks() {
  local dir="${TIDE_FRAMEWORK_WHEELS:-}"
  if [ -z "$dir" ]; then echo "=== frameworks: skipped (TIDE_FRAMEWORK_WHEELS not set)"; return; fi
  background frameworks 300 bash ci/framework_wheels.sh install "$dir"
}

part_build() {
  step build 400 bash -c "cmake -S . -B '$BUILD' -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES='$ARCHS' \
    -DCMAKE_BUILD_TYPE=Release -DTIDE_TEST_SWITCHES=ON && cmake --build '$BUILD' -j" || return
  grep -q "CUDA data path ON" "$OUT/build.log" || record build-check "FAILED (CUDA data path not enabled)" - - - 0 0
}

have_library() {
  [ -f "$BUILD/libnccl-tide.so" ] && return 0
  record "$1" "FAILED (no $BUILD/libnccl-tide.so: run the build part)" - - - 0 0; return 1
}

step_name() { echo "$(basename "$(dirname "$1")")-$(basename "$1" .py)"; }

# run_file FILE: one pytest; the second NCCL in its environment once that build is done.
run_file() {
  local lim=${TIDE_GPU_FILE_TIMEOUT:-240} nccl=()
  [ -f "$NCCL_LIB" ] && [ ! -e "$STATE/running-nccl" ] && nccl=(env "TIDE_TEST_NCCL_LIBRARY=$NCCL_LIB")
  step "$(step_name "$1")" "$lim" "${nccl[@]}" python3 -m pytest -v -rs -p no:cacheprovider --durations=10 \
    -o faulthandler_timeout=$(( lim > 30 ? lim - 15 : 15 )) "$1"
}

sanitizer_case() {
  step "sanitizer-$1" 240 compute-sanitizer --tool "$1" --error-exitcode 86 python3 tests/gpu/sanitizer_case.py
}

# --- the queue ----------------------------------------------------------------------------------------------------
# An entry is a file in pending/ named by its place (longest first), holding "WHAT [PART ...]": a test file or
# sanitizer:TOOL, then the background parts it needs.

# The background parts a test file needs, from what it reads.
needs_of() {
  grep -q "TIDE_TEST_NCCL_LIBRARY\|needs_multi_rank_nccl" "$1" && echo nccl
  grep -q "framework_examples" "$1" && echo frameworks
}

expected_seconds() {
  local s
  s=$(awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$DURATIONS" 2>/dev/null)
  echo "${s:-$DEFAULT_S}"
}

# enqueue NAME WHAT [PART ...], then order_queue: pending/ numbered longest first.
enqueue() {
  echo "$1" >>"$STATE/queued"
  printf '%s\t%s\t%s\n' "$(expected_seconds "$1")" "$1" "${*:2}" >>"$STATE/entries"
}
order_queue() {
  local i=0 seconds name what
  [ -f "$STATE/entries" ] || return 0
  sort -t$'\t' -k1,1nr -k2,2 "$STATE/entries" | while IFS=$'\t' read -r seconds name what; do
    echo "$what" >"$STATE/pending/$(printf '%04d' "$i")"
    echo "queued: $name (expected $seconds s)"
    i=$(( i + 1 ))
  done
}

# Whether every named background part has ended (or the deadline is so near that the step will only say skipped).
parts_done() {
  local part
  [ "$(left)" -lt 20 ] && return 0
  for part in "$@"; do [ -e "$STATE/running-$part" ] && return 1; done
  return 0
}

# claim: moves the first pending entry whose parts are done to claimed/ and prints what it runs; fails if none.
claim() {
  local entry what needs
  for entry in "$STATE"/pending/*; do
    read -r what needs 2>/dev/null <"$entry" || continue  # another worker took it
    # shellcheck disable=SC2086
    parts_done $needs || continue
    mv "$entry" "$STATE/claimed/" 2>/dev/null && { echo "$what"; return 0; }
  done
  return 1
}

worker() {
  local what
  while :; do
    if what=$(claim); then
      case $what in sanitizer:*) sanitizer_case "${what#sanitizer:}" ;; *) run_file "$what" ;; esac
    elif [ -n "$(ls -A "$STATE/pending")" ]; then
      sleep 1  # what is left waits for a background part
    else
      return 0
    fi
  done
}

run_queue() {
  local i pids=()
  order_queue
  for (( i = 0; i < WORKERS; i++ )); do worker & pids+=($!); done
  [ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
}

# $OUT/gpu_durations.tsv: ci/gpu_durations.tsv with the seconds measured here for the queued steps that ran.
write_durations() {
  awk -F'\t' -v OFS='\t' '
    FILENAME == ARGV[1] { queued[$1] = 1; next }
    FILENAME == ARGV[2] { if (($1 in queued) && $2 !~ /^SKIPPED/) s[$1] = $6; next }
    /^#/ { print; next }
    NF >= 2 && !($1 in s) { s[$1] = $2 }
    END { fflush(); for (n in s) print n, s[n] | "sort"; close("sort") }
  ' "$STATE/queued" "$STEPS" "$DURATIONS" >"$OUT/gpu_durations.tsv"
}

# --- the job ------------------------------------------------------------------------------------------------------

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
    nccl|frameworks|build|tests|perf|sanitizer|bench) ;;
    *) record "$part" "FAILED (unknown part: nccl frameworks build tests perf sanitizer bench)" - - - 0 0 ;;
  esac
done

# 1. background, 2. build
want nccl && part_nccl
want frameworks && part_frameworks
want build && part_build

# The test files by phase.
quiet=() queued=() alone=()
if want tests && have_library tests; then
  # tests/multirank files that need no GPU (gloo, CPU) run in the CPU job, not here.
  for f in ${TIDE_GPU_TESTS:-$(ls tests/gpu/test_*.py; grep -lE "mark\.gpu|torch_cuda|cuda_lib" tests/multirank/test_*.py)}
  do
    case " $QUIET " in *" $f "*) quiet+=("$f"); continue ;; esac
    case " $ALONE " in *" $f "*) alone+=("$f"); continue ;; esac
    queued+=("$f")
  done
fi

# 3. quiet
if want perf && have_library perf; then
  step perf_smoke 240 python3 tests/gpu/perf_smoke.py
  for op in all_gather reduce_scatter; do
    step "tide-perf-$op" 120 python3 -m nccl_tide.perf "$op" --backend loopback --ranks 8 -b 1M -e 64M -f 64 -n 10 \
      -d bf16 --impl all --interfere gemm -J "$OUT/tide-perf-$op.json"
  done
fi
for f in "${quiet[@]}"; do run_file "$f"; done
if want bench && have_library bench; then step bench 600 python3 benchmarks/run_all.py --out "$OUT"; fi

# 4. queue
for f in "${queued[@]}"; do
  # shellcheck disable=SC2046
  enqueue "$(step_name "$f")" "$f" $(needs_of "$f")
done
if want sanitizer && have_library sanitizer; then
  for tool in memcheck racecheck synccheck; do enqueue "sanitizer-$tool" "sanitizer:$tool"; done
fi
run_queue

# 5. alone
for f in "${alone[@]}"; do run_file "$f"; done
if want sanitizer && [ -n "${TIDE_GPU_SAN_TESTS:-}" ] && have_library sanitizer; then
  tool="${TIDE_GPU_SAN_TOOL:-memcheck}"
  # shellcheck disable=SC2086
  step "sanitizer-$tool-tests" 600 compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 86 \
    ${TIDE_GPU_SAN_ARGS:-} python3 -m pytest -q -x -p no:cacheprovider $TIDE_GPU_SAN_TESTS
fi
wait  # the background parts

{ echo "# $(head -1 "$OUT/env.txt"); $(grep -m1 '^torch' "$OUT/env.txt"); commit $(git rev-parse --short HEAD 2>/dev/null)"
  printf '%-46s %-22s %6s %6s %7s %5s %5s\n' step result passed failed skipped s at
  sort "$STEPS" | while IFS=$'\t' read -r n r p f s t a; do
    printf '%-46s %-22s %6s %6s %7s %5s %5s\n' "$n" "$r" "$p" "$f" "$s" "$t" "$a"
  done
  echo "# total $(( $(date +%s) - START )) s of the ${TIDE_GPU_DEADLINE_S:-540} s deadline, $WORKERS workers;" \
    "s: seconds the step took, at: second of the job it started"
} | tee "$OUT/summary.txt"
[ -f "$DURATIONS" ] && write_durations
status=0
cut -f2 "$STEPS" | grep -qv "^ok$" && status=1
if [ "${TIDE_GPU_LOG_ARCHIVE:-0}" = 1 ]; then
  (cd "$OUT" && shopt -s nullglob && logs=(./*.log) && [ ${#logs[@]} -gt 0 ] && tar -czf logs.tar.gz "${logs[@]}" &&
    rm -f "${logs[@]}")
fi
echo "ci/gpu.sh: exit $status"
exit $status

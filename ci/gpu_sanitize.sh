#!/usr/bin/env bash
# compute-sanitizer over GPU test files: ci/gpu_sanitize.sh TOOL:FILE[:SECONDS][:-k EXPR] ...
# TOOL is memcheck, racecheck, synccheck or initcheck. Each entry runs one pytest under the tool (child processes
# included, --target-processes all) within its own time limit (default 200 s) and prints the test summary and the
# tool's summary line. Builds build/gpu first if missing (as ci/gpu_suite.sh). Logs: $OUT (default ./gpu-out).
# Exit status: non-zero if a run failed, timed out, or the tool reported errors or hazards. SAN_ARGS adds tool options
# (e.g. SAN_ARGS="--report-api-errors no" for tests whose out-of-memory cases make CUDA calls fail on purpose).
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu}"
if [ ! -f "$BUILD/libnccl-tide.so" ]; then
  bash ci/gpu_suite.sh >/dev/null || { echo "ci/gpu_sanitize.sh: build FAILED (see $OUT/build.log)"; exit 1; }
fi
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

status=0
summary=()
for spec in "$@"; do
  IFS=: read -r tool file limit kexpr <<<"$spec"
  limit="${limit:-200}"
  name="san_${tool}_$(basename "$file" .py)"
  args=(-q -p no:cacheprovider "$file")
  [ -n "${kexpr:-}" ] && args+=(-k "$kexpr")
  echo "=== $tool $file ${kexpr:+-k \"$kexpr\"} (limit ${limit} s, $(date +%T))"
  start=$(date +%s)
  timeout -k 5 "$limit" compute-sanitizer --tool "$tool" --target-processes all --print-limit 20 ${SAN_ARGS:-} \
    python3 -m pytest "${args[@]}" >"$OUT/$name.log" 2>&1
  rc=$?
  tests=$(grep -vE "SUMMARY" "$OUT/$name.log" | grep -E "[0-9]+ (passed|failed|error)" | tail -1)
  # One summary line per process the tool watched (workers of multi-process tests included).
  tool_lines=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$OUT/$name.log" | sort | uniq -c | tr '\n' ';')
  bad=$(grep -E "(ERROR|RACECHECK) SUMMARY" "$OUT/$name.log" | grep -vcE "SUMMARY: 0 (errors|hazards)")
  summary+=("$tool $(basename "$file")${kexpr:+ -k $kexpr}: rc $rc, $(( $(date +%s) - start )) s: ${tests:-no pytest summary}; ${tool_lines:-no tool summary}")
  if [ "$rc" -ne 0 ] || [ "$bad" -ne 0 ] || [ -z "$tool_lines" ]; then
    status=1
    grep -E "^=========" "$OUT/$name.log" | head -30
  fi
done
echo
echo "=== sanitizer summary"
printf '%s\n' "${summary[@]}"
exit $status

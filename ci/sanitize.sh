#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# ASan + UBSan job: the host core, host executor and C API built with -fsanitize=address,undefined
# (CUDA off: the CUDA runtime and ASan do not mix on a machine without a GPU), then
#   1. the C-API-level pytest files run against that library (NCCL_TIDE_LIBRARY_PATH), libasan preloaded into
#      python; leak detection off for the python process only (CPython keeps its allocations at exit by design);
#   2. tests/native/host_smoke.cc built with the same sanitizers and run WITH leak detection;
#   3. the fuzzer's regression seeds (tests/fuzz) against the same library.
# Any sanitizer report stops the process with a non-zero exit (halt_on_error), so this script fails.
# Usage: ci/sanitize.sh   (env: TIDE_SANITIZE_BUILD_DIR, default _build/sanitize)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

build="${TIDE_SANITIZE_BUILD_DIR:-_build/sanitize}"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "${build}" "${gen[@]}" -DTIDE_BUILD_CUDA=OFF -DTIDE_BUILD_NCCL=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTIDE_SANITIZE=address,undefined >/dev/null
cmake --build "${build}" -j "$(nproc)"
lib="$(cd "${build}" && pwd)/libnccl-tide.so"

libasan="$(gcc -print-file-name=libasan.so)"
if [[ ! -f "${libasan}" ]]; then
  echo "ci/sanitize.sh: libasan.so not found (gcc -print-file-name=libasan.so gave '${libasan}')" >&2
  exit 1
fi
# Reports go to stderr and stop the process at once; abort_on_error is off so the exit status is ASan's 1 (not a
# signal that a test harness might read as something else). UBSan checks are recoverable in GCC: halt_on_error makes
# the first report fatal.
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
asan_common="halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"

echo "== sanitize: host_smoke (ASan+UBSan, leak detection on)"
smoke="${build}/host_smoke"
g++ -std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -Iplugin/core tests/native/host_smoke.cc plugin/core/dtype.cc -L"${build}" -lnccl-tide \
  -Wl,-rpath,"$(cd "${build}" && pwd)" -o "${smoke}"
ASAN_OPTIONS="${asan_common}:detect_leaks=1" NCCL_TIDE_DEBUG=NONE "${smoke}" >"${build}/host_smoke.log" 2>&1 || {
  tail -n 60 "${build}/host_smoke.log" >&2
  echo "ci/sanitize.sh: host_smoke failed under ASan/UBSan" >&2
  exit 1
}
tail -n 1 "${build}/host_smoke.log"

echo "== sanitize: pytest (C-API-level tests) against ${lib}"
# Every file here reaches the library through ctypes (or tide-perf subprocesses, which inherit the environment).
# Not here: packaging/fresh-venv tests (they build their own non-sanitized library), tests/gpu, and the FSDP
# multi-process parity test (torch.distributed under an ASan-preloaded interpreter is slow and tests torch more than
# TIDE; its host-executor path is covered by test_fsdp_reference_executor.py).
tests=(tests/unit/test_layout.py tests/unit/test_schedule.py tests/unit/test_host_executor.py
       tests/unit/test_c_api_errors.py tests/unit/test_env_docs.py tests/unit/test_perf_cli.py
       tests/multirank/test_fsdp_reference_executor.py tests/unit/test_fuzz.py tests/unit/test_concurrency.py
       tests/unit/test_nccl_parent_health.py tests/unit/test_nccl_versions.py tests/unit/test_hardening.py)
NCCL_TIDE_LIBRARY_PATH="${lib}" LD_PRELOAD="${libasan}" ASAN_OPTIONS="${asan_common}:detect_leaks=0" \
  python -m pytest -q -p no:cacheprovider "${tests[@]}"

echo "ci/sanitize.sh: OK after $(( $(date +%s) - start )) s"

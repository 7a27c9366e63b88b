#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# Fuzz job: tests/fuzz/fuzz.py against the ASan+UBSan library (the build of ci/sanitize.sh, reused when
# present): the corpus in tests/fuzz/corpus, then random cases for TIDE_FUZZ_SECONDS (default 90). The seed is
# random per run and printed (TIDE_FUZZ_SEED=N reproduces a run); a failing case is printed and saved under
# TIDE_FUZZ_OUT (default _build/fuzz), so is the case that was running when a sanitizer stopped the process
# (current_case.json). Replay one: python tests/fuzz/fuzz.py --replay-only --corpus FILE.json
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

build="${TIDE_SANITIZE_BUILD_DIR:-_build/sanitize}"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S . -B "${build}" "${gen[@]}" -DTIDE_BUILD_CUDA=OFF -DTIDE_BUILD_NCCL=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTIDE_SANITIZE=address,undefined >/dev/null
cmake --build "${build}" -j "$(nproc)" >/dev/null
lib="$(cd "${build}" && pwd)/libnccl-tide.so"
out="${TIDE_FUZZ_OUT:-_build/fuzz}"

export TIDE_FUZZ_SECONDS="${TIDE_FUZZ_SECONDS:-90}"
export NCCL_TIDE_DEBUG=NONE  # every rejected case would log a WARN line
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:report_error_type=1"
status=0
NCCL_TIDE_LIBRARY_PATH="${lib}" LD_PRELOAD="$(gcc -print-file-name=libasan.so)" \
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=0:strict_string_checks=1" \
  python tests/fuzz/fuzz.py --out "${out}" || status=$?
if [[ ${status} -ne 0 ]]; then
  if [[ -f "${out}/current_case.json" ]]; then
    echo "ci/fuzz.sh: the process died on this case (${out}/current_case.json):" >&2
    cat "${out}/current_case.json" >&2
    echo >&2
  fi
  echo "ci/fuzz.sh: FAILED (exit ${status})" >&2
  exit 1
fi
echo "ci/fuzz.sh: OK after $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# valgrind memcheck job: tests/native/host_smoke.cc (layouts created, queried and destroyed over many shapes,
# host AG/RS, error paths, parameters, the multicast gate; destroyed/garbage handles, a destroy racing
# host all-gathers on three threads, misaligned buffers, canonical NaN results) against a non-sanitized host-only build. Fails on any
# memcheck error and on any definitely or indirectly lost block.
# Usage: ci/valgrind.sh   (env: TIDE_VALGRIND_BUILD_DIR, default _build/valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

if ! command -v valgrind >/dev/null; then
  echo "ci/valgrind.sh: valgrind is not installed (apt-get install valgrind)" >&2
  exit 1
fi
build="${TIDE_VALGRIND_BUILD_DIR:-_build/valgrind}"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
# RelWithDebInfo: optimized like the shipped library, with line numbers in the reports. libstdc++ is linked
# dynamically (TIDE_STATIC_LIBSTDCXX=OFF) so valgrind's suppressions for it apply.
cmake -S . -B "${build}" "${gen[@]}" -DTIDE_BUILD_CUDA=OFF -DTIDE_BUILD_NCCL=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTIDE_STATIC_LIBSTDCXX=OFF >/dev/null
cmake --build "${build}" -j "$(nproc)"
dir="$(cd "${build}" && pwd)"
g++ -std=c++17 -O1 -g -Iinclude -Iplugin/core tests/native/host_smoke.cc plugin/core/dtype.cc -L"${dir}" -lnccl-tide \
  -Wl,-rpath,"${dir}" -o "${dir}/host_smoke"

log="${dir}/valgrind.log"
if ! NCCL_TIDE_DEBUG=NONE valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \
  --errors-for-leak-kinds=definite,indirect --track-origins=yes --error-exitcode=1 --log-file="${log}" \
  "${dir}/host_smoke" >"${dir}/host_smoke.out" 2>&1; then
  cat "${log}" >&2
  tail -n 20 "${dir}/host_smoke.out" >&2
  echo "ci/valgrind.sh: memcheck found errors or leaks (or host_smoke failed)" >&2
  exit 1
fi
grep -E "ERROR SUMMARY|definitely lost|indirectly lost|in use at exit" "${log}" | sed 's/^==[0-9]*== /  /'
tail -n 1 "${dir}/host_smoke.out"
echo "ci/valgrind.sh: OK after $(( $(date +%s) - start )) s"

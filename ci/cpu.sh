#!/usr/bin/env bash
# Copyright The nccl-tide authors
# SPDX-License-Identifier: Apache-2.0
# The CPU CI job (.ci/run calls this), as a user without a CUDA compiler meets the project: no nvcc in reach, so the
# install is the host-only build. Runs the README's test command (one install, then the suite), then the README's
# main job from that same install; fails when pytest collects no tests (exit status 5), or when the install was not
# host-only after all.
set -uo pipefail
cd "$(dirname "$0")/.."

# CMake's check_language(CUDA) takes CUDACXX, else an nvcc on PATH, else $CUDA_PATH/bin; CMAKE_ARGS could name one
# too. A directory on PATH that holds nvcc (/usr/local/bin has a wrapper, /usr/local/cuda/bin the real one) is
# replaced by a copy of its links without the CUDA tools, so everything else there stays reachable.
unset CUDACXX CUDA_PATH CUDA_HOME CUDAToolkit_ROOT CMAKE_ARGS CUDAARCHS TIDE_BUILD_CUDA TIDE_CUDA
shadow="$(mktemp -d)"
trap 'rm -rf "${shadow}"' EXIT
path=""
n=0
IFS=: read -r -a dirs <<<"${PATH}"
for d in "${dirs[@]}"; do
  if [ -e "${d}/nvcc" ]; then
    n=$((n + 1))
    copy="${shadow}/bin${n}"
    mkdir -p "${copy}"
    for f in "${d}"/*; do
      case "$(basename "${f}")" in nvcc | nvlink | ptxas | cudafe++ | fatbinary | bin2c | __nvcc_device_query) ;;
        *) ln -s "${f}" "${copy}/" ;;
      esac
    done
    d="${copy}"
  fi
  path="${path:+${path}:}${d}"
done
export PATH="${path}"
if command -v nvcc >/dev/null; then
  echo "ci/cpu.sh: nvcc is still reachable at $(command -v nvcc)" >&2
  exit 1
fi
# A fresh CMake cache: one configured with CUDA would remember its nvcc.
export TIDE_BUILD_DIR="${shadow}/cmake"

start=$(date +%s)
# README test command (tests/unit/test_readme.py checks that the two stay identical):
pip install ".[test]" && python -m pytest -q -rs tests benchmarks/tests
rc=$?
echo "ci/cpu.sh: exit ${rc} after $(( $(date +%s) - start )) s"
if [ "${rc}" -eq 5 ]; then
  echo "ci/cpu.sh: pytest collected no tests: failing" >&2
  exit 1
fi
[ "${rc}" -eq 0 ] || exit "${rc}"

info="$(python -m nccl_tide)" || exit 1
echo "${info}"
if ! grep -q "^CUDA build: no" <<<"${info}"; then
  echo "ci/cpu.sh: the install without nvcc is not the host-only build" >&2
  exit 1
fi
# README main job, from the install above (tests/unit/test_readme.py checks it is the README's):
tide-perf all_gather --backend host --ranks 8 -b 1K -e 4M -f 4 -c 1

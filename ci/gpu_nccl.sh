#!/usr/bin/env bash
# The NCCL-binding GPU job (one H200, a few minutes of device time): build the CUDA library, then
#   1. tests/gpu/test_multiprocess.py: 2 and 4 processes sharing cuda:0 (CUDA IPC, gloo bootstrap), AG/RS bit-exact
#      against the host executor; a real NCCL communicator of size 1 through torch (tideCommCreate);
#   2. the existing tests/gpu loopback suite, quickly (regression check of the executors).
# Total under ~150 s on a warm machine. Logs go to $OUT (default ./gpu-out). Exit status non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."

# NVLink multicast stays off on shared machines (DESIGN.md section 6).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export NCCL_TIDE_DEBUG="${NCCL_TIDE_DEBUG:-INFO}"

OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
BUILD="${TIDE_GPU_BUILD:-build/gpu}"
export PATH="/usr/local/cuda/bin:$PATH"
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step "build"
if ! { timeout 300 cmake -S . -B "$BUILD" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DCMAKE_BUILD_TYPE=Release >"$OUT/build.log" 2>&1 &&
       timeout 300 cmake --build "$BUILD" -j >>"$OUT/build.log" 2>&1; }; then
  tail -40 "$OUT/build.log"
  echo "ci/gpu_nccl.sh: build FAILED"
  exit 1
fi
grep -E "CUDA data path|NCCL headers" "$OUT/build.log"
export NCCL_TIDE_LIBRARY_PATH="$PWD/$BUILD/libnccl-tide.so"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"

step "tests/gpu/test_multiprocess.py"
timeout -k 5 "${TIDE_MP_TEST_TIMEOUT:-150}" python3 -m pytest -q -rs -s -p no:cacheprovider \
  tests/gpu/test_multiprocess.py 2>&1 | tee "$OUT/multiprocess.log" | grep -vE "NCCL TIDE TRACE" | tail -60
rc=${PIPESTATUS[0]}
echo "test_multiprocess exit status: $rc"
[ "$rc" -eq 0 ] || status=1

step "tests/gpu (loopback regression, first failure stops)"
NCCL_TIDE_DEBUG=WARN timeout -k 5 "${TIDE_GPU_TEST_TIMEOUT:-120}" python3 -m pytest -q -x -rs -p no:cacheprovider \
  tests/gpu --ignore=tests/gpu/test_multiprocess.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -20
rc=${PIPESTATUS[0]}
echo "tests/gpu exit status: $rc"
[ "$rc" -eq 0 ] || status=1

echo "ci/gpu_nccl.sh: $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status

#!/usr/bin/env bash
# GPU check of issue 20's changes (one H200, ~4 min): the portable library (TIDE_GLIBC_COMPAT=2.28: glibc-2.28
# stand-ins, libgcc_s shared, shims for pthread_cond_clockwait/arc4random/__libc_single_threaded) built with CUDA and
# run through the GPU tests that use timed condition-variable waits (IPC provider, abort, multi-process), the
# interposer (log lines now "NCCL TIDE <LEVEL> <Component>:"), tide-perf's loopback rows (nccl-tests' column order)
# and the NCCL_DEBUG-governed logging with a real device ([0] in the lines).
# Usage: bash ci/gpu_ecosystem.sh   (writes logs to $OUT, default ./gpu-out-ecosystem; exit 1 on any failure)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 PYTHONUNBUFFERED=1
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$PWD/gpu-out-ecosystem}"
mkdir -p "$OUT"
BUILD=build/gpu-compat
echo "=== build with TIDE_GLIBC_COMPAT=2.28 ($(date +%T))"
if ! { timeout 400 cmake -S . -B "$BUILD" -G Ninja -DTIDE_BUILD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DCMAKE_BUILD_TYPE=Release -DTIDE_GLIBC_COMPAT=2.28 >"$OUT/build.log" 2>&1 &&
       timeout 400 cmake --build "$BUILD" -j >>"$OUT/build.log" 2>&1; }; then
  tail -40 "$OUT/build.log"; echo "ci/gpu_ecosystem.sh: build FAILED"; exit 1
fi
lib="$PWD/$BUILD/libnccl-tide.so"
objdump -T "$lib" | grep -o "GLIBC_[0-9.]*" | sort -uV | tr '\n' ' ' | tee "$OUT/glibc_versions.txt"; echo
export NCCL_TIDE_LIBRARY_PATH="$lib"
export PYTHONPATH="$PWD/pytorch_glue:$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"
status=0
run() {  # name limit command...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit} s, $(date +%T))"
  timeout -k 5 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 8 "$OUT/$name.log" | grep -vE "NCCL TIDE TRACE"
  echo "$name: rc $rc" | tee -a "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || status=1
}
run cuda_collectives 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_cuda_collectives.py
run multiprocess 120 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_multiprocess.py
run abort 60 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_abort.py
run interposer 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_interposer_gpu.py
run perf 90 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_perf_gpu.py -k "loopback and not interfere"
# Logging with a device: the loopback-create INFO line (component Cuda = NCCL subsystem COLL) carries [0].
run log_info 40 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL python3 -c "
import torch, nccl_tide
from nccl_tide.cuda import LoopbackWorld
w = LoopbackWorld(2, 0); w.close(); print('DONE')"
if ! grep -qE '^[^ ]+:[0-9]+:[0-9]+ \[0\] NCCL TIDE INFO Cuda: loopback world: 2 virtual ranks' "$OUT/log_info.log"; then
  echo "log_info: no '[0] NCCL TIDE INFO Cuda:' line"; status=1
fi
echo "=== summary"; cat "$OUT/summary.txt"
exit $status
